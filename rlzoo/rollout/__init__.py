"""Rollout: prompts to scored completions (the sampler), staleness.
"""

from rlzoo.compat import package_getattr

__getattr__ = package_getattr("rlzoo.rollout")  # its API 2.0 names, deprecated
