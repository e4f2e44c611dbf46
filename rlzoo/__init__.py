"""rlzoo: a plugin-based zoo of reinforcement-learning algorithms for language models.

Importing ``rlzoo`` loads no plugin; the CLI and the engine build the registry with
:func:`rlzoo.contract.loading.build_registry`.
"""

from rlzoo.contract.hookspecs import API_VERSION, hookimpl

__version__ = "0.2.0"
__all__ = ["API_VERSION", "hookimpl", "__version__"]
