"""The resolved run config: what :func:`rlzoo.plan.planner.load_config` returns and the engine reads.

It carries the validated config, the components it chose with their parameters, where
every value came from, and the run plan decided from them (:mod:`rlzoo.plan.planner`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlzoo.contract.checks import BoundComponent
from rlzoo.core.errors import ConfigError
from rlzoo.contract.kinds import COMPONENT_FIELDS
from rlzoo.contract.registry import Component, Registry


@dataclass
class ResolvedConfig:
    """The validated run config, the components it chose and the run plan.

    :ivar cfg: the full config (OmegaConf), component choices expanded to mappings with
        every parameter (defaults filled in).
    :ivar components: config path -> :class:`Component` for every choice that is set.
    :ivar params: config path -> the parameter dataclass instance of that choice.
    :ivar extensions: ``(component, params)`` for every enabled extension.
    :ivar sources: dotted key -> the layer that set its value (``defaults``,
        ``preset grpo``, ``--config run.yaml``, ``command line``, ...).
    :ivar plan: the :class:`rlzoo.plan.planner.RunPlan` decided from all of the above (set by
        :func:`rlzoo.plan.planner.load_config`).
    :ivar resume_changes: with ``resume=``, dotted key -> ``(saved, new)`` for every key
        the resume changes (only :data:`rlzoo.run.resume.RESUMABLE_KEYS` may change).
    :ivar rewards: ``(component, params, weight)`` of every reward function, in ``reward``
        order (one, weight 1.0, unless ``reward`` is a list).
    :ivar registry: the registry the components were chosen from (binds a component the
        plan names by name, :meth:`bind_as`).
    :ivar corrections: ``(component, params)`` of every rollout correction, in
        ``rollout_correction`` order (empty for ``none``; one for a single choice).
    """

    cfg: DictConfig
    components: dict[str, Component]
    params: dict[str, Any]
    extensions: list[tuple[Component, Any]]
    sources: dict[str, str] = field(default_factory=dict)
    plan: Any = None
    resume_changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    rewards: list[tuple[Component, Any, float]] = field(default_factory=list)
    registry: Registry | None = None
    corrections: list[tuple[Component, Any]] = field(default_factory=list)

    def to_yaml(self) -> str:
        return OmegaConf.to_yaml(self.cfg)

    def bound(self, path: str) -> Any:
        """The component chosen at ``path`` with its parameters bound, as the engine calls it."""
        return self.components[path].bind(self.params[path])

    def bind_as(self, path: str, name: str) -> BoundComponent:
        """The component ``name`` of the kind chosen at ``path``, bound as the engine calls it:
        the configured choice with its parameters when ``name`` is that choice, otherwise the
        registered component of that name with its default parameters. The engine binds the
        components the run plan names through this, so the plan, not the config, decides.

        :raises ConfigError: no component of that kind is registered as ``name``.
        """
        chosen = self.components.get(path)
        if chosen is not None and name in (chosen.name, *chosen.aliases):
            return self.bound(path)
        if self.registry is None:
            raise ConfigError(f"{path}={name!r} is not the configured choice and no registry is at hand to bind it")
        return self.registry.get(COMPONENT_FIELDS[path], name).bind(None)

    def bind_correction(self, index: int, name: str) -> BoundComponent:
        """Rollout correction ``index`` of ``rollout_correction`` bound with its parameters
        when it is ``name``, else the registered correction ``name`` with its defaults (the
        engine binds the corrections the run plan lists through this).

        :raises ConfigError: no correction of that name is registered.
        """
        if 0 <= index < len(self.corrections):
            component, params = self.corrections[index]
            if name in (component.name, *component.aliases):
                return component.bind(params)
        if self.registry is None:
            raise ConfigError(f"rollout_correction {name!r} is not configured and no registry is at hand to bind it")
        return self.registry.get("rollout_correction", name).bind(None)

    def reward_functions(self, **setup: Any) -> list[tuple[Any, float]]:
        """``(bound reward function, weight)`` pairs, in ``reward`` order; a scorer class is
        built here from ``setup`` (``device``, ``tokenizer``: :attr:`rlzoo.contract.kinds.Kind.setup_inputs`),
        so call this once per run. A ``ValueError`` / ``OSError`` of a scorer's constructor
        is a config error naming it."""
        out = []
        for component, params, weight in self.rewards:
            try:
                out.append((component.bind(params).build(**setup), weight))
            except ConfigError as exc:
                raise ConfigError(f"reward {component.name!r}: {exc}") from exc
            except (ValueError, OSError) as exc:
                raise ConfigError(f"reward {component.name!r}: {exc}") from exc
        return out

    def build(self, path: str, name: str | None = None, **inputs: Any) -> Any:
        """Construct the component chosen at ``path`` (a task, a rollout backend, ...), or the
        one named ``name`` there (:meth:`bind_as`), from ``inputs``; a ``ValueError`` /
        ``OSError`` of its factory is a config error naming it."""
        bound = self.bound(path) if name is None else self.bind_as(path, name)
        try:
            return bound(**inputs)
        except ConfigError:
            raise
        except (ValueError, OSError) as exc:
            raise ConfigError(f"{path} {bound.name!r}: {exc}") from exc
