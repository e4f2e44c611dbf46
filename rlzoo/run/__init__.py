"""A run: its directory, checkpoints, resume, tracking, evaluation, the trainer that drives the steps.
"""
