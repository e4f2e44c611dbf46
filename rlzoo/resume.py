"""Resuming a run: its saved config as the lowest layer, and what a resume may change.

``rlzoo train resume=RUN_DIR`` continues a run exactly. The run's ``config.yaml`` is the
base layer (no ``default.yaml``, no preset): the run keeps the config it started with,
and later layers may change only :data:`RESUMABLE_KEYS` (every other difference is refused,
all of them listed). The plugins the run was started with are loaded again from its
saved ``plugins`` list: **resuming someone else's run imports the plugin modules its
config names**, as starting it did.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rlzoo import config
from rlzoo.checkpoint import latest_checkpoint
from rlzoo.errors import ConfigError
from rlzoo.registry import Registry
from rlzoo.resolved import ResolvedConfig
from rlzoo.rundir import CONFIG_FILE, PLAN_FILE
from rlzoo.schema import ADDED_KEYS

RESUMABLE_KEYS = ("trainer.total_steps", "logging.", "checkpoint.every", "checkpoint.keep", "trainer.threads",
                  "trainer.micro_batch_size", "trainer.logprob_chunk_size", "trainer.logprob_keep_mb",
                  "distributed.timeout_s", "rm.steps", "rm.eval_every")
"""Config keys (a trailing dot: every key below it) that ``resume=`` may change: run
length, logging, checkpointing, and knobs of speed and memory that leave the math as it
is (micro-batching and chunking may change float rounding). Every other key keeps the
value the run was started with."""


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: data}


def resumable(key: str) -> bool:
    """True when ``resume=`` may change config key ``key`` (see :data:`RESUMABLE_KEYS`)."""
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in RESUMABLE_KEYS)


def resume_changes(saved: dict[str, Any], resolved: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """What a resume changes: dotted key -> ``(saved value, new value)``.

    :param saved: the run's ``config.yaml``.
    :param resolved: the resumed run's resolved config (plain containers).
    :raises ConfigError: a key outside :data:`RESUMABLE_KEYS` differs (every one listed).
    """
    old, new = _flat(saved), _flat(resolved)
    changes = {key: (old.get(key), new.get(key)) for key in sorted(old.keys() | new.keys())
               if key != "resume" and old.get(key) != new.get(key)}
    refused = [f"{key} ({a!r} -> {b!r})" for key, (a, b) in changes.items() if not resumable(key)]
    if refused:
        allowed = ", ".join(k + "*" if k.endswith(".") else k for k in RESUMABLE_KEYS)
        raise ConfigError(f"cannot change {', '.join(refused)}: a resumed run keeps its config except "
                          f"{allowed}; start a new run (another run_dir) to change the rest")
    return changes


def requested(overrides: list[str] | None, config_file: str | Path | None) -> str | None:
    """The ``resume=`` value of the file and CLI layers (the CLI wins), or ``None``."""
    file_layer, cli_layer = config.read_layers(overrides, config_file)
    resume = cli_layer.get("resume", file_layer.get("resume"))
    return str(resume) if resume else None


def saved_config(resume: str) -> dict[str, Any]:
    """The config a run was started with (its ``config.yaml``), checked to be resumable.

    :raises ConfigError: ``resume`` is not a run directory, or holds no checkpoint.
    """
    run_dir = Path(resume)
    if not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(f"resume={resume!r} is not a run directory (no {CONFIG_FILE})")
    if latest_checkpoint(run_dir) is None and not (run_dir / PLAN_FILE).is_file():
        raise ConfigError(f"resume={resume!r}: no checkpoint found in {run_dir / 'checkpoints'}")
    return config.read_yaml(run_dir / CONFIG_FILE, f"resume={resume}: run config")


def with_added_keys(saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` with every :data:`rlzoo.schema.ADDED_KEYS` key it lacks set to the value
    the run ran with (a run saved before the key existed)."""
    out = copy.deepcopy(saved)
    for key, value in ADDED_KEYS.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node, dict) else node
        if isinstance(node, dict) and leaf not in node:
            node[leaf] = value
    return out


def plugin_modules(overrides: list[str] | None, config_file: str | Path | None) -> list[str]:
    """The plugin modules to import before the registry is built: those of the file and CLI
    layers, over the run's saved ``plugins`` with ``resume=``."""
    resume = requested(overrides, config_file)
    base = None
    if resume and (Path(resume) / CONFIG_FILE).is_file():
        base = config.read_yaml(Path(resume) / CONFIG_FILE, f"resume={resume}: run config")
    return config.plugin_modules(overrides, config_file, base=base)


def load_run_config(registry: Registry, overrides: list[str] | None = None,
                    config_file: str | Path | None = None) -> ResolvedConfig:
    """The config a command runs with: :func:`rlzoo.config.load_config`, or with
    ``resume=RUN_DIR`` the run's saved config as the base layer, its changes checked
    (:func:`resume_changes`) and recorded in ``resume_changes``.

    :raises ConfigError: any bad input, or a change a resume may not make.
    """
    resume = requested(overrides, config_file)
    if not resume:
        return config.load_config(registry, overrides, config_file)
    saved = with_added_keys(saved_config(resume))
    base = {**copy.deepcopy(saved), "resume": resume}
    resolved = config.load_config(registry, overrides, config_file, base=base,
                                  base_label=f"run {Path(resume) / CONFIG_FILE}")
    try:
        resolved.resume_changes = resume_changes(saved, OmegaConf.to_container(resolved.cfg))  # type: ignore[arg-type]
    except ConfigError as exc:
        raise ConfigError(f"resume={resume} {exc}") from exc
    return resolved
