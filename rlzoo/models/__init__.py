"""Models: building and loading them, their heads, log-probs, the KV-cache decode loop, the load-time
check, LoRA and reward models.
"""

from rlzoo.compat import package_getattr

__getattr__ = package_getattr("rlzoo.models")  # its API 2.0 names, deprecated
