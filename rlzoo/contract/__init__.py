"""The plugin contract: component kinds, hook specifications, the registry, the checks on every
component, and loading plugins from entry points.
"""

from rlzoo.compat import package_getattr

__getattr__ = package_getattr("rlzoo.contract")  # its API 2.0 names, deprecated
