"""The engine's whole input: the run plan, the bound components and the run's setup, built once.

:func:`engine_input` turns a planned config (:func:`rlzoo.plan.planner.load_config`) into a
:class:`RunInput`; the engine (the models, the rollout, the learner, the run: everything the
trainer, ``rlzoo sft`` and ``rlzoo rm`` build) reads that and never the config. What the plan
decides is in :attr:`RunInput.plan` (components the plan names are bound inside its
records); the components it does not name (the task, rewards, the advantage estimator, ...)
are in :attr:`RunInput.components`; :attr:`RunInput.setup` holds what places the run (seed,
directory) and the config as data (written as ``config.yaml``, shown to hooks as
``ctx.cfg``, re-planned by the asynchronous generator), whose keys the engine never reads
(``tests/test_plan.py`` checks every engine module).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from rlzoo.contract.checks import BoundComponent
from rlzoo.contract.loading import build_registry, make_plugin_manager
from rlzoo.contract.registry import Registry
from rlzoo.contract.tool_schema import Tool, registered_tools
from rlzoo.plan.hparams import effective_hparams
from rlzoo.plan.planner import PlannedConfig, load_config
from rlzoo.plan.records import RunPlan


@dataclass(frozen=True)
class Components:
    """The bound components of a run that the plan's records do not carry.

    :ivar task: the task (a factory: built once per run).
    :ivar advantage: the advantage estimator.
    :ivar policy_loss: the policy loss.
    :ivar value_loss: the value loss (called when the plan has a critic).
    :ivar rewards: ``(reward function, weight)`` in ``reward`` order; a scorer class is built
        once per run (:func:`rlzoo.contract.checks.build_rewards`).
    :ivar answer_format: the run's answer format, or ``None`` (the completion is the answer).
    :ivar answer_formats: every registered answer format (evaluation's lenient score).
    :ivar environment: the environment of multi-turn episodes (``env``), or ``None``.
    :ivar tools: every registered tool by name (an environment's ``tools`` input; empty
        without an environment).
    :ivar extensions: the enabled extensions, in ``extensions`` order.
    """

    task: BoundComponent
    advantage: BoundComponent
    policy_loss: BoundComponent
    value_loss: BoundComponent | None
    rewards: tuple[tuple[BoundComponent, float], ...]
    answer_format: BoundComponent | None = None
    answer_formats: tuple[BoundComponent, ...] = ()
    environment: BoundComponent | None = None
    tools: dict[str, Tool] = field(default_factory=dict)
    extensions: tuple[BoundComponent, ...] = ()


@dataclass(frozen=True)
class RunSetup:
    """What places a run and the config as data.

    :ivar seed: the run's seed (``seed``).
    :ivar run_dir: its directory (``resume``, else ``run_dir``, else ``runs/<run name>``).
    :ivar resume: the run continues the one in :attr:`run_dir` (``resume=``).
    :ivar config_yaml: the resolved config as ``config.yaml`` keeps it (``resume: null``): also
        what the asynchronous generator re-plans from (:func:`replan`).
    :ivar hook_config: the resolved config as lifecycle hooks see it (``ctx.cfg``).
    :ivar hparams: the effective hyperparameters (:func:`rlzoo.plan.hparams.effective_hparams`).
    :ivar resume_changes: with ``resume=``, dotted key -> ``(saved, new)`` for what the resume changes.
    """

    seed: int
    run_dir: Path
    resume: bool = False
    config_yaml: str = ""
    hook_config: DictConfig | None = None
    hparams: dict[str, Any] = field(default_factory=dict)
    resume_changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class RunInput:
    """The engine's whole input (see the module docstring).

    :ivar plan: every decision of the run, the components it names bound in its records.
    :ivar components: the other bound components.
    :ivar setup: the seed, the run directory and the config as data.
    """

    plan: RunPlan
    components: Components
    setup: RunSetup

    def with_plan(self, **changes: Any) -> "RunInput":
        """This input with the plan's fields ``changes`` replaced (a plan edited after it was
        decided, as tests do; the engine follows it as edited)."""
        return dataclasses.replace(self, plan=dataclasses.replace(self.plan, **changes))


def default_run_name(cfg: Any) -> str:
    """``<algo>-<task>-s<seed>-<timestamp>`` unless ``run_name`` is set."""
    if cfg.run_name:
        return str(cfg.run_name)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{cfg.algo or 'custom'}-{cfg.task.name}-s{cfg.seed}-{stamp}"


def run_path(cfg: Any) -> Path:
    """The directory ``cfg`` runs in: ``resume``, else ``run_dir``, else ``runs/<run name>``."""
    return Path(str(cfg.resume or cfg.run_dir or Path("runs") / default_run_name(cfg)))


def _bound(planned: PlannedConfig, path: str) -> BoundComponent | None:
    return planned.bound(path) if path in planned.components else None


def components_of(planned: PlannedConfig) -> Components:
    """The bound components of ``planned`` that the plan does not carry."""
    registry = planned.registry
    formats = tuple(c.bind(None) for c in registry.components("answer_format")) if registry is not None else ()
    environment = _bound(planned, "env")
    return Components(
        task=planned.bound("task"), advantage=planned.bound("advantage"), policy_loss=planned.bound("policy_loss"),
        value_loss=_bound(planned, "value_loss"),
        rewards=tuple((component.bind(params), float(weight)) for component, params, weight in planned.rewards),
        answer_format=_bound(planned, "answer_format"), answer_formats=formats, environment=environment,
        tools=registered_tools(registry) if environment is not None else {},
        extensions=tuple(component.bind(params) for component, params in planned.extensions))


def engine_input(planned: PlannedConfig) -> RunInput:
    """The :class:`RunInput` of a planned config: its plan, its bound components, its setup."""
    cfg = planned.cfg
    saved = OmegaConf.merge(cfg, {"resume": None})  # a run redone by resume= records the config it started with
    setup = RunSetup(seed=int(cfg.seed), run_dir=run_path(cfg), resume=bool(cfg.resume),
                     config_yaml=OmegaConf.to_yaml(saved), hook_config=cfg,
                     hparams=effective_hparams(cfg, planned.plan), resume_changes=dict(planned.resume_changes))
    return RunInput(plan=planned.plan, components=components_of(planned), setup=setup)


def load_run(registry: Registry, overrides: list[str] | None = None,
             config_file: str | Path | None = None) -> RunInput:
    """:func:`engine_input` of :func:`rlzoo.plan.planner.load_config` (tests and benchmarks)."""
    return engine_input(load_config(registry, overrides, config_file))


def replan(config_yaml: str, label: str = "trainer") -> RunInput:
    """The run input of a saved config (``config.yaml``'s text) in a fresh process: its
    plugins imported, its components chosen and its plan decided again (the asynchronous
    generator's start)."""
    base = yaml.safe_load(config_yaml)
    pm = make_plugin_manager(modules=base.get("plugins") or [])
    return engine_input(load_config(build_registry(pm), base=base, base_label=label))
