"""Resuming a run: its saved config as the lowest layer, and what a resume may change.

``rlzoo train resume=RUN_DIR`` continues a run exactly. The run's ``config.yaml`` is the
base layer (no ``default.yaml``, no preset): the run keeps the config it started with,
and later layers may change only :data:`RESUMABLE_KEYS` (every other difference is refused,
all of them listed). The plugins the run was started with are loaded again from its
saved ``plugins`` list: **resuming someone else's run imports the plugin modules its
config names, and so runs their code**, as starting it did. :func:`plugin_modules` first
checks what it can without them (a run directory with a checkpoint, no change to a key a
resume may not change, component choices apart), so a refused resume imports nothing.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rlzoo.config import layers as config
from rlzoo.config.choices import CHOICE_PATHS
from rlzoo.run.checkpoint import latest_checkpoint
from rlzoo.core.errors import ConfigError
from rlzoo.contract.registry import Registry
from rlzoo.config.resolved import ResolvedConfig
from rlzoo.plan.planner import load_config
from rlzoo.run.layout import CONFIG_FILE, PLAN_FILE
from rlzoo.config.keys import added_keys, resumable_keys

RESUMABLE_KEYS: tuple[str, ...] = resumable_keys()
"""Config keys (a trailing dot: every key below it) that ``resume=`` may change: run
length, logging, checkpointing, and knobs of speed and memory that leave the math as it
is (micro-batching and chunking may change float rounding). Every other key keeps the
value the run was started with. Derived from the key records' ``resumable``
(:mod:`rlzoo.config.keys`)."""


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: data}


def resumable(key: str) -> bool:
    """True when ``resume=`` may change config key ``key`` (see :data:`RESUMABLE_KEYS`)."""
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in resumable_keys())


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
        allowed = ", ".join(k + "*" if k.endswith(".") else k for k in resumable_keys())
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


def _same(old: Any, new: Any) -> bool:
    """``new`` (an override as YAML parsed it) could resolve to ``old`` (the saved value)."""
    if old == new or str(old) == str(new) or (isinstance(new, str) and "${" in new):
        return True
    if isinstance(old, bool) or isinstance(new, bool) or not isinstance(old, (int, float)):
        return False
    try:  # a number, or YAML 1.1's string for one (`lr: 2e-3`), which the schema converts
        return float(new) == float(old)
    except (TypeError, ValueError):
        return False


def check_before_plugins(resume: str, saved: dict[str, Any], overrides: list[str] | None,
                         config_file: str | Path | None) -> None:
    """Refuse, before any plugin module is imported, a resume that changes a key it may not.

    Compares each key the file and CLI layers set with the saved value, as written (a
    number as a number; a component choice given as a bare name against the saved
    choice's name). Component choices given as lists or mappings, and interpolations, are
    left to :func:`resume_changes`, which needs the registry (and so the plugins).

    :raises ConfigError: every key that differs, as :func:`resume_changes` words it.
    """
    refused = []
    for layer in config.read_layers(overrides, config_file):
        for key, new in _flat(layer).items():
            if key == "resume" or resumable(key):
                continue
            node: Any = saved
            for part in key.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            old = node
            if isinstance(old, dict) and "name" in old and isinstance(new, str):
                key, old = f"{key}.name", old["name"]  # a component chosen by name: compare the names
            component = key.split(".")[0] in {path.split(".")[0] for path in CHOICE_PATHS}
            if component and (isinstance(new, (list, dict)) or isinstance(old, (list, dict))):
                continue
            if not _same(old, new):
                refused.append(f"{key} ({old!r} -> {new!r})")
    if refused:
        allowed = ", ".join(k + "*" if k.endswith(".") else k for k in resumable_keys())
        raise ConfigError(f"resume={resume} cannot change {', '.join(refused)}: a resumed run keeps its config except "
                          f"{allowed}; start a new run (another run_dir) to change the rest (nothing was imported: "
                          "the run's plugins load only once a resume is accepted)")


def with_added_keys(saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` with every key it lacks that was added since (:func:`rlzoo.config.keys.added_keys`)
    set to the value the run ran with (a run saved before the key existed)."""
    out = copy.deepcopy(saved)
    for key, value in added_keys().items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node, dict) else node
        if isinstance(node, dict) and leaf not in node:
            node[leaf] = value
    return out


def plugin_modules(overrides: list[str] | None, config_file: str | Path | None) -> list[str]:
    """The plugin modules to import before the registry is built: those of the file and CLI
    layers, over the run's saved ``plugins`` with ``resume=``, which must first pass every
    check that needs no plugin (:func:`saved_config`, :func:`check_before_plugins`).

    :raises ConfigError: a resume refused before any plugin is imported.
    """
    resume = requested(overrides, config_file)
    base = None
    if resume:
        base = saved_config(resume)
        check_before_plugins(resume, with_added_keys(base), overrides, config_file)
    return config.plugin_modules(overrides, config_file, base=base)


def load_run_config(registry: Registry, overrides: list[str] | None = None,
                    config_file: str | Path | None = None, reward_model: bool = False) -> ResolvedConfig:
    """The config a command runs with: :func:`rlzoo.plan.planner.load_config`, or with
    ``resume=RUN_DIR`` the run's saved config as the base layer, its changes checked
    (:func:`resume_changes`) and recorded in ``resume_changes``. ``reward_model``: the
    config of an ``rlzoo rm`` run (no RL training checks: :func:`rlzoo.plan.planner.build_plan`).

    :raises ConfigError: any bad input, or a change a resume may not make.
    """
    resume = requested(overrides, config_file)
    if not resume:
        return load_config(registry, overrides, config_file, reward_model=reward_model)
    saved = with_added_keys(saved_config(resume))
    base = {**copy.deepcopy(saved), "resume": resume}
    resolved = load_config(registry, overrides, config_file, base=base,
                           base_label=f"run {Path(resume) / CONFIG_FILE}", reward_model=reward_model)
    try:
        resolved.resume_changes = resume_changes(saved, OmegaConf.to_container(resolved.cfg))  # type: ignore[arg-type]
    except ConfigError as exc:
        raise ConfigError(f"resume={resume} {exc}") from exc
    return resolved
