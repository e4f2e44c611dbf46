"""The run's effective hyperparameters, as TensorBoard and ``rlzoo compare`` see them.

Every config key that says what the run trains (not where it lives or how it logs).

Decided once with the plan (:class:`rlzoo.plan.run_input.RunSetup`'s ``hparams``), since a
knob that cannot act under the plan is written as ``off`` (KL knobs of a run without KL do
not show as differing).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlzoo.contract.kinds import COMPONENT_FIELDS
from rlzoo.plan.records import RunPlan

NOT_HPARAMS = ("run_name", "run_dir", "resume", "logging.", "checkpoint.")
"""Config keys (a trailing dot: every key under it) that name or place a run, or say how it
is logged and saved, rather than what it trains: not hyperparameters."""


def matches(key: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``key`` is one of ``patterns`` or lies under one that ends with a dot."""
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in patterns)


OFF = "off"
"""The hparams value of a knob that cannot act under the run's plan."""


def flatten_config(cfg: DictConfig | dict[str, Any]) -> dict[str, Any]:
    """Config as ``{"a.b": scalar}``; lists and None become strings (TensorBoard hparams)."""
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        elif isinstance(node, (bool, int, float, str)):
            out[prefix[:-1]] = node
        else:
            out[prefix[:-1]] = str(node)

    walk(OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg, "")
    return out


def inert_prefixes(plan: RunPlan) -> tuple[str, ...]:
    """Config key prefixes whose values cannot act under ``plan``: the KL knobs when KL is
    off (``kl.coef`` itself stays), the critic's when there is no critic."""
    prefixes: list[str] = []
    if plan.kl is None:
        prefixes += ["kl.estimator", "kl.apply", "kl.controller", "kl.target"]
    if "critic" not in plan.models:
        prefixes += ["value_loss", "trainer.critic_lr"]
    return tuple(prefixes)


def effective_hparams(cfg: DictConfig, plan: RunPlan) -> dict[str, Any]:
    """The run's hyperparameters as TensorBoard and ``rlzoo compare`` see them: every config
    key but :data:`NOT_HPARAMS`; keys under :func:`inert_prefixes` collapse into one
    entry each, ``off``: ``<path>.name`` for a component choice (``kl.estimator.name``),
    the key itself otherwise (``kl.apply``)."""
    inert = inert_prefixes(plan)
    out: dict[str, Any] = {}
    flat = flatten_config(cfg)
    if isinstance(cfg.reward, ListConfig):  # several reward functions: one column each, and their sum
        del flat["reward"]
        flat["reward.name"] = " + ".join(f"{item.weight:g}·{item.name}" for item in cfg.reward)
        flat.update({f"reward.{item.name}.{key}": value for item in cfg.reward for key, value in
                     flatten_config(item).items() if key != "name"})
    for key, value in flat.items():
        if matches(key, NOT_HPARAMS):
            continue
        prefix = next((p for p in inert if key == p or key.startswith(p + ".")), None)
        if prefix is not None:  # a component choice keeps its column: <path>.name = off
            out[f"{prefix}.name" if prefix in COMPONENT_FIELDS else prefix] = OFF
        else:
            out[key] = value
    return out
