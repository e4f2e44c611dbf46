"""Tasks: where prompts and reference answers come from, and how a prompt becomes the model's text.
"""

from rlzoo.compat import package_getattr

__getattr__ = package_getattr("rlzoo.tasks")  # its API 2.0 names, deprecated
