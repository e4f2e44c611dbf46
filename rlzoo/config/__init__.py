"""Configuration: the run schema, config layers, presets, component parameters; the resolved config.
"""

from rlzoo.compat import package_getattr

__getattr__ = package_getattr("rlzoo.config")  # its API 2.0 names, deprecated
