"""Tasks: where prompts and reference answers come from, and how a prompt becomes the model's text.
"""
