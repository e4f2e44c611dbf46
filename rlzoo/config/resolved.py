"""The resolved run config: the config layers merged and the components chosen.

It carries the validated config, the components it chose with their parameters and where
every value came from. :func:`rlzoo.plan.planner.load_config` decides the run plan from it
(a :class:`rlzoo.plan.planner.PlannedConfig`); the engine reads neither, but the plan and the
bound components (:class:`rlzoo.plan.run_input.RunInput`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlzoo.contract.checks import BoundComponent, build_rewards
from rlzoo.contract.registry import Component, Registry


@dataclass
class ResolvedConfig:
    """The validated run config and the components it chose.

    :ivar cfg: the full config (OmegaConf), component choices expanded to mappings with
        every parameter (defaults filled in).
    :ivar components: config path -> :class:`Component` for every choice that is set.
    :ivar params: config path -> the parameter dataclass instance of that choice.
    :ivar extensions: ``(component, params)`` for every enabled extension.
    :ivar sources: dotted key -> the layer that set its value (``defaults``,
        ``preset grpo``, ``--config run.yaml``, ``command line``, ...).
    :ivar resume_changes: with ``resume=``, dotted key -> ``(saved, new)`` for every key
        the resume changes (only :data:`rlzoo.run.resume.RESUMABLE_KEYS` may change).
    :ivar rewards: ``(component, params, weight)`` of every reward function, in ``reward``
        order (one, weight 1.0, unless ``reward`` is a list).
    :ivar registry: the registry the components were chosen from.
    :ivar corrections: ``(component, params)`` of every rollout correction, in
        ``rollout_correction`` order (empty for ``none``; one for a single choice).
    """

    cfg: DictConfig
    components: dict[str, Component]
    params: dict[str, Any]
    extensions: list[tuple[Component, Any]]
    sources: dict[str, str] = field(default_factory=dict)
    resume_changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    rewards: list[tuple[Component, Any, float]] = field(default_factory=list)
    registry: Registry | None = None
    corrections: list[tuple[Component, Any]] = field(default_factory=list)

    def to_yaml(self) -> str:
        return OmegaConf.to_yaml(self.cfg)

    def bound(self, path: str) -> BoundComponent:
        """The component chosen at ``path`` with its parameters bound, as the engine calls it."""
        return self.components[path].bind(self.params[path])

    def reward_functions(self, **setup: Any) -> list[tuple[Any, float]]:
        """``(bound reward function, weight)`` pairs, in ``reward`` order, scorer classes built
        from ``setup`` (:func:`rlzoo.contract.checks.build_rewards`: call this once per run)."""
        return build_rewards([(component.bind(params), weight) for component, params, weight in self.rewards], **setup)

    def build(self, path: str, **inputs: Any) -> Any:
        """Construct the component chosen at ``path`` (a task, a rollout backend, ...) from
        ``inputs`` (:meth:`rlzoo.contract.checks.BoundComponent.construct`)."""
        return self.bound(path).construct(**inputs)
