"""rlzoo: a plugin-based zoo of reinforcement-learning algorithms for language models.

Plugin authors import from :mod:`rlzoo.api`. Importing ``rlzoo`` loads no plugin and no
torch; the CLI and the engine build the registry
(:func:`rlzoo.contract.loading.build_registry`). The import paths of plugin API 2.0
(``from rlzoo import hookimpl``, ``rlzoo.masked``, ...) still work, with a deprecation
warning, until API 3 (:mod:`rlzoo.compat`).
"""

from typing import Any

from rlzoo import compat

__version__ = "0.2.0"
__all__ = ["__version__"]

compat.install()


def __getattr__(name: str) -> Any:
    """``from rlzoo import hookimpl`` / ``API_VERSION``: the API 2.0 spelling, deprecated."""
    if name in ("hookimpl", "API_VERSION"):
        return compat.deprecated_attribute("rlzoo", name)
    raise AttributeError(f"module 'rlzoo' has no attribute {name!r}")
