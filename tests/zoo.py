"""The standard zoo as the registry sees it, so per-family, docs and end-to-end tests cover
a newly registered component without anyone editing a list."""

from __future__ import annotations

from rlzoo.plugins import build_registry, make_plugin_manager

PM = make_plugin_manager()
REGISTRY = build_registry(PM)


def builtin_names(kind: str) -> tuple[str, ...]:
    """Names of the components of ``kind`` that rlzoo itself registers, in registration order."""
    return tuple(c.name for c in REGISTRY.components(kind) if c.package == "rlzoo")
