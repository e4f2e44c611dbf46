"""The run plan: what a run is, decided once from the resolved config, before any model is built.
"""

from rlzoo.compat import package_getattr

__getattr__ = package_getattr("rlzoo.plan")  # its API 2.0 names, deprecated
