"""The import paths of plugin API 2.0, kept working until API 3 with a deprecation warning.

rlzoo 0.2 kept its 66 modules side by side (``rlzoo.masked``, ``rlzoo.tasks``,
``rlzoo.rollout``, ...) and plugin packages imported from wherever a name lived. Since API
2.1 the modules sit in layer folders and plugins import from :mod:`rlzoo.api` only. An old
path still gives the same object, with a :class:`DeprecationWarning` that names where to
import it from now (``rlzoo.api`` for a public name), so a third-party package keeps working
for one API version while its author moves.

Two mechanisms, one table (:data:`OLD_MODULES`): an old module whose name is free is served
by :class:`OldPathFinder` (installed on ``sys.meta_path`` by ``import rlzoo``); an old module
whose name is now a folder (``rlzoo.tasks``, ``rlzoo.models``, ...) answers through that
package's ``__getattr__`` (:func:`package_getattr`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any, Callable

from rlzoo.api import HOME

REMOVED_IN = "3"
"""The plugin API major version that drops the old paths."""

OLD_MODULES: dict[str, tuple[str, ...]] = {
    "rlzoo": ("rlzoo.contract.hookspecs",),  # from rlzoo import hookimpl, API_VERSION
    "rlzoo.errors": ("rlzoo.core.errors",), "rlzoo.masked": ("rlzoo.core.masked",),
    "rlzoo.distributed": ("rlzoo.core.distributed",), "rlzoo.batch": ("rlzoo.core.batch",),
    "rlzoo.rng": ("rlzoo.core.rng",), "rlzoo.processes": ("rlzoo.core.processes",),
    "rlzoo.stopping": ("rlzoo.core.stopping",),
    "rlzoo.kinds": ("rlzoo.contract.kinds",), "rlzoo.contract": ("rlzoo.contract.checks",),
    "rlzoo.registry": ("rlzoo.contract.registry",), "rlzoo.hookspecs": ("rlzoo.contract.hookspecs",),
    "rlzoo.plugins": ("rlzoo.contract.loading",),
    "rlzoo.schema": ("rlzoo.config.schema",), "rlzoo.params": ("rlzoo.config.params",),
    "rlzoo.introspect": ("rlzoo.config.introspect",), "rlzoo.presets": ("rlzoo.config.preset_cards",),
    "rlzoo.resolved": ("rlzoo.config.resolved",), "rlzoo.yamlfile": ("rlzoo.config.yamlfile",),
    "rlzoo.config": ("rlzoo.config.layers", "rlzoo.plan.planner", "rlzoo.config.params", "rlzoo.config.yamlfile"),
    "rlzoo.plan": ("rlzoo.plan.planner",),
    "rlzoo.planrecords": ("rlzoo.plan.records", "rlzoo.plan.learning", "rlzoo.plan.settings"),
    "rlzoo.episodeplan": ("rlzoo.plan.episode_rules",),
    "rlzoo.tasks": ("rlzoo.tasks.task",), "rlzoo.prompts": ("rlzoo.tasks.prompts",),
    "rlzoo.environments": ("rlzoo.agents.environment",), "rlzoo.episodes": ("rlzoo.agents.episodes",),
    "rlzoo.tools": ("rlzoo.agents.tool_calls", "rlzoo.contract.tool_schema"),
    "rlzoo.sandbox": ("rlzoo.agents.sandbox",),
    "rlzoo.head": ("rlzoo.models.head",), "rlzoo.logprobs": ("rlzoo.models.logprobs",),
    "rlzoo.model_check": ("rlzoo.models.model_check",), "rlzoo.models": ("rlzoo.models.build",),
    "rlzoo.lora": ("rlzoo.models.lora",), "rlzoo.rewardmodel": ("rlzoo.models.reward_model", "rlzoo.tasks.prompts"),
    "rlzoo.rollout": ("rlzoo.models.decode", "rlzoo.core.batch", "rlzoo.core.tokens"),
    "rlzoo.sampler": ("rlzoo.rollout.sampler",), "rlzoo.scoring": ("rlzoo.rollout.scoring",),
    "rlzoo.rollout_queue": ("rlzoo.rollout.staleness",), "rlzoo.async_rollout": ("rlzoo.run.async_generator",),
    "rlzoo.learner": ("rlzoo.learn.learner", "rlzoo.core.ratios"),
    "rlzoo.correcting": ("rlzoo.learn.correcting", "rlzoo.core.ratios"),
    "rlzoo.rundir": ("rlzoo.run.rundir", "rlzoo.plan.run_input"), "rlzoo.checkpoint": ("rlzoo.run.checkpoint",),
    "rlzoo.resume": ("rlzoo.run.resume",), "rlzoo.tracking": ("rlzoo.run.tracking", "rlzoo.plan.hparams"),
    "rlzoo.context": ("rlzoo.run.context",), "rlzoo.evaluation": ("rlzoo.run.evaluation",),
    "rlzoo.trainer": ("rlzoo.run.trainer",), "rlzoo.recording": ("rlzoo.run.recording",),
    "rlzoo.events": ("rlzoo.core.events",),
    "rlzoo.cli": ("rlzoo.commands.cli",), "rlzoo.ab": ("rlzoo.commands.ab",),
    "rlzoo.compare": ("rlzoo.commands.compare",), "rlzoo.explain": ("rlzoo.commands.explain",),
    "rlzoo.export": ("rlzoo.commands.export",), "rlzoo.sweep": ("rlzoo.commands.sweep",),
    "rlzoo.sft": ("rlzoo.run.sft_trainer",),
    "rlzoo.rm": ("rlzoo.run.rm_trainer", "rlzoo.tasks.pairs", "rlzoo.learn.bradley_terry"),
    "rlzoo.golden": ("rlzoo.commands.golden",), "rlzoo.launcher": ("rlzoo.commands.launcher",),
    "rlzoo.tool_checks": ("rlzoo.testing.tool_checks",), "rlzoo.env_checks": ("rlzoo.testing.env_checks",),
    "rlzoo.testing": ("rlzoo.testing.component_checks", "rlzoo.testing.tool_checks", "rlzoo.testing.env_checks"),
}
"""Old module (API 2.0) -> the modules its names live in now, searched in order."""


def deprecated_attribute(old: str, name: str, stacklevel: int = 3) -> Any:
    """``name`` as the old module ``old`` provided it, with a :class:`DeprecationWarning`
    naming the new place (``rlzoo.api`` for a public name).

    :raises AttributeError: ``old`` never had ``name`` (the new modules lack it too).
    """
    homes = OLD_MODULES[old]
    if HOME.get(name) in homes:
        homes, where = (HOME[name],), "rlzoo.api"
    else:
        where = ""
    for new in homes:
        module = importlib.import_module(new)
        if hasattr(module, name):
            warnings.warn(f"{old}.{name} is an import path of plugin API 2.0, removed in API {REMOVED_IN}: "
                          f"import {name} from {where or new}", DeprecationWarning, stacklevel=stacklevel)
            return getattr(module, name)
    raise AttributeError(f"module {old!r} has no attribute {name!r} (it moved: see rlzoo.api)")


def package_getattr(old: str) -> Callable[[str], Any]:
    """The ``__getattr__`` of a package whose name was an API 2.0 module (``rlzoo.tasks``)."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return deprecated_attribute(old, name)

    return __getattr__


class _OldModule(types.ModuleType):
    """An API 2.0 module that no longer exists: each attribute resolves to its new home."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return deprecated_attribute(self.__name__, name)


class OldPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``import rlzoo.masked`` and the like (an old module whose name is free)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in OLD_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _OldModule(spec.name, f"API 2.0 path of {', '.join(OLD_MODULES[spec.name])} (deprecated)")

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install() -> None:
    """Put :class:`OldPathFinder` last on ``sys.meta_path`` (once): real modules win."""
    if not any(isinstance(finder, OldPathFinder) for finder in sys.meta_path):
        sys.meta_path.append(OldPathFinder())
