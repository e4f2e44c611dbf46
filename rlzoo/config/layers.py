"""Layered run configuration: the layers merged, the components chosen.

Layers, lowest first: ``configs/default.yaml`` < the algorithm preset chosen by ``algo``
< a user file (``--config run.yaml``) < CLI dot-list overrides (``trainer.lr=1e-3``).
:func:`resolve_config` merges them against the run schema (:mod:`rlzoo.config.schema`: every
key's type and value checks) and resolves each component choice (a name, or a mapping with
``name`` plus that component's parameters, validated by :mod:`rlzoo.config.params`); the run
plan is decided from the result (:func:`rlzoo.plan.planner.load_config`). Everything is
checked before any model is built.
Resuming a run (``resume=RUN_DIR``: its saved config as the lowest layer) is
:mod:`rlzoo.run.resume`'s job.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    OmegaConfBaseException,
    ValidationError,
)

from rlzoo.config.choices import CHOICE_PATHS, choose_components, take_choices, task_default_reward
from rlzoo.config.keys import renamed_keys, run_schema
from rlzoo.config.preset_cards import load_preset
from rlzoo.config.resolved import ResolvedConfig
from rlzoo.config.schema import check_values, schema_keys, type_message
from rlzoo.config.yamlfile import read_yaml
from rlzoo.contract.kinds import COMPONENT_FIELDS
from rlzoo.contract.registry import Registry
from rlzoo.core.errors import ConfigError, did_you_mean

__all__ = ["PRESET_REFUSED_KEYS", "Layers", "check_merged", "default_config_path", "labelled_layers",
           "merge_into_schema", "parse_overrides", "plugin_modules", "preset_of", "read_layers", "resolve_config"]

PRESET_REFUSED_KEYS: tuple[str, ...] = ("algo", "plugins", "seed", "run_name", "run_dir", "resume")
"""Top-level keys an algorithm preset may not set: they choose the preset, are read before
presets (``plugins``), or name and place a run rather than describe an algorithm."""


# ------------------------------------------------------------------------- loading


def default_config_path() -> Path:
    """Path of the shipped ``default.yaml``."""
    return Path(str(resources.files("rlzoo_configs").joinpath("default.yaml")))


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """Turn CLI ``key=value`` items into a nested dict (values parsed as YAML)."""
    bad = [item for item in overrides if "=" not in item or item.startswith("=")]
    if bad:
        raise ConfigError(
            f"override {bad[0]!r} is not of the form key=value (e.g. trainer.lr=1e-3); the shell splits a "
            "value at spaces, so quote one with braces or spaces: 'policy_loss={name: dual_clip, clip_ratio_c: 3.0}'"
        )
    result: dict[str, Any] = {}
    for item in overrides:
        try:
            parsed = OmegaConf.to_container(OmegaConf.from_dotlist([item]))
        except (OmegaConfBaseException, yaml.YAMLError) as exc:
            first = " ".join(str(exc).split("\n")[0].split())
            raise ConfigError(f"cannot parse override {item!r}: {first}") from exc
        key = item.split("=", 1)[0]
        _, value = _get_path(parsed, key)
        node = result
        parts = key.split(".")
        for part in parts[:-1]:
            if isinstance(node.get(part), str):
                node[part] = {"name": node[part]}  # `x=name x.param=v`: keep the name
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} sets a key below a non-mapping value")
        node[parts[-1]] = value
    return result


def read_layers(overrides: list[str] | None, config_file: str | Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``--config`` file layer and the command-line layer, as nested dicts.

    :raises ConfigError: an unreadable file or a malformed override.
    """
    file_layer = read_yaml(config_file, "config file") if config_file is not None else {}
    return file_layer, parse_overrides(overrides or [])


def plugin_modules(overrides: list[str] | None, config_file: str | Path | None,
                   base: dict[str, Any] | None = None) -> list[str]:
    """The ``plugins`` list (modules to import as plugins) of the ``base``, file and CLI layers.

    Read before the registry is built, because those modules may register the very
    components the rest of the config names (:func:`rlzoo.run.resume.plugin_modules` passes a
    resumed run's saved config as ``base``).
    """
    modules: Any = []
    for layer in (base or {}, *read_layers(overrides, config_file)):
        if "plugins" in layer:
            modules = layer["plugins"]
    if isinstance(modules, str):
        modules = [modules]
    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        raise ConfigError(f"plugins must be a list of module names, got {modules!r}")
    return modules


def _get_path(data: dict[str, Any], path: str) -> tuple[bool, Any]:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _flat_keys(data: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the leaves of a nested dict (a list counts as one leaf)."""
    if not isinstance(data, dict):
        return [prefix[:-1]] if prefix else []
    keys: list[str] = []
    for key, value in data.items():
        keys.extend(_flat_keys(value, f"{prefix}{key}."))
    return keys


def _check_renamed(label: str, layer: dict[str, Any]) -> None:
    for old, new in renamed_keys().items():
        if _get_path(layer, old)[0]:
            raise ConfigError(f"config key {old!r} ({label}) was renamed to {new!r} in rlzoo 0.2; use {new}")


@dataclass(frozen=True)
class Layers:
    """The config layers of one load, lowest first.

    :ivar labelled: ``(label, layer)``: defaults (or the base), the preset, the file, the command line.
    :ivar preset_label: how errors name the algorithm preset, or ``None`` without one.
    :ivar user_labels: the labels of the user's own layers (the file, the command line).
    """

    labelled: list[tuple[str, dict[str, Any]]]
    preset_label: str | None
    user_labels: set[str]


def resolve_config(
    registry: Registry,
    overrides: list[str] | None = None,
    config_file: str | Path | None = None,
    base: dict[str, Any] | None = None,
    base_label: str = "base",
) -> ResolvedConfig:
    """Merge and validate the layers and choose the components; raise :class:`ConfigError`
    on any bad input, before anything is built or written. The run plan is decided from the
    result (:func:`rlzoo.plan.planner.load_config` does both).

    :param registry: the component registry (presets and component parameters).
    :param overrides: CLI ``key=value`` items.
    :param config_file: the user's YAML file.
    :param base: replaces ``default.yaml`` (and the preset) as the lowest layer: a recorded
        run's config (``rlzoo ab``), or a resumed run's (:func:`rlzoo.run.resume.load_run_config`,
        which is how ``resume=RUN_DIR`` is loaded); later layers may still override keys.
    :param base_label: how ``sources`` names the base layer.
    """
    layers = labelled_layers(registry, overrides, config_file, base, base_label)
    choices = take_choices(layers.labelled)
    cfg = merge_into_schema(layers, choices.sources)
    check_merged(cfg)
    task_default_reward(registry, choices)
    chosen = choose_components(registry, choices, cfg, layers.preset_label, layers.user_labels)
    return ResolvedConfig(cfg=cfg, components=chosen.components, params=chosen.params,
                          extensions=[(c, p) for c, p, _ in chosen.items("extensions")], sources=choices.sources,
                          rewards=[(c, p, w) for c, p, w in chosen.items("reward")], registry=registry,
                          corrections=[(c, p) for c, p, _ in chosen.items("rollout_correction")])


def labelled_layers(registry: Registry, overrides: list[str] | None, config_file: str | Path | None,
                    base: dict[str, Any] | None, base_label: str) -> Layers:
    """Read the layers (the defaults or ``base``, the preset ``algo`` names, the file, the
    command line), each a private copy, and refuse renamed keys.

    :raises ConfigError: an unreadable layer, ``resume=`` without its base, an unknown
        preset or one that sets a key presets may not, a key renamed since rlzoo 0.1.
    """
    file_layer, cli_layer = read_layers(overrides, config_file)
    resume = cli_layer.get("resume", file_layer.get("resume"))
    if base is None and resume:
        raise ConfigError(f"resume={resume!r} continues a run from its saved config: load it with "
                          "rlzoo.run.resume.load_run_config (what `rlzoo train resume=...` does)")
    defaults = base if base is not None else read_yaml(default_config_path(), "default config")
    algo = defaults.get("algo")
    for layer in (file_layer, cli_layer):
        if "algo" in layer:
            algo = layer["algo"]
    preset_layer, preset_label = preset_of(registry, algo) if algo is not None and base is None else ({}, None)
    labelled = [("defaults" if base is None else base_label, defaults), (f"preset {algo}", preset_layer),
                (f"--config {config_file}", file_layer), ("command line", cli_layer)]
    labelled = [(label, copy.deepcopy(layer)) for label, layer in labelled]
    for label, layer in labelled:
        _check_renamed(label, layer)
    return Layers(labelled, preset_label, {f"--config {config_file}", "command line"})


def preset_of(registry: Registry, algo: Any) -> tuple[dict[str, Any], str]:
    """The config keys the preset ``algo`` sets, and how errors name it.

    :raises ConfigError: an unknown preset, or one setting :data:`PRESET_REFUSED_KEYS`.
    """
    preset = registry.get("algorithm", str(algo))
    layer = load_preset(preset).config
    label = f"algorithm preset {preset.name!r} (package {preset.package or '?'})"
    refused = sorted(set(layer) & set(PRESET_REFUSED_KEYS))
    if refused:
        raise ConfigError(f"{label} sets {', '.join(refused)}: a preset holds a recipe (components, "
                          f"their parameters, rollout / trainer / kl / eval / model keys), not "
                          f"{', '.join(PRESET_REFUSED_KEYS)}")
    return layer, label


def merge_into_schema(layers: Layers, sources: dict[str, str]) -> DictConfig:
    """Merge the layers (their component choices already taken out) into the run schema,
    lowest first, recording in ``sources`` the layer that set each plain key last.

    :raises ConfigError: an unknown key (did-you-mean) or a wrongly typed value; inside the
        preset, naming it.
    """
    for label, layer in layers.labelled:
        for key in _flat_keys(layer):
            sources[key] = label
    schema = OmegaConf.structured(run_schema())
    for path in CHOICE_PATHS:  # a choice's value is the choices' business, not the schema's
        OmegaConf.update(schema, path, None if path in COMPONENT_FIELDS else [], force_add=True)
    OmegaConf.set_struct(schema, True)
    cfg = schema
    for label, layer in layers.labelled:
        try:
            cfg = _merge_checked(cfg, layer)
        except ConfigError as exc:
            raise ConfigError(f"{layers.preset_label}: {exc}" if label.startswith("preset ") else str(exc)) from exc
    return cfg


def check_merged(cfg: DictConfig) -> None:
    """Resolve every interpolation in place, then refuse a key without a value and any value
    outside its record (:func:`rlzoo.config.schema.check_values`).

    :raises ConfigError: the first problem, one line.
    """
    _resolve_interpolations(cfg)
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"config keys without a value: {', '.join(missing)}")
    check_values(cfg)


def _merge_checked(cfg: DictConfig, layer: dict[str, Any]) -> DictConfig:
    try:
        return OmegaConf.merge(cfg, layer)  # type: ignore[return-value]
    except (ConfigKeyError, ConfigAttributeError) as exc:
        key = exc.full_key or getattr(exc, "key", "") or ""
        known = schema_keys(cfg)
        hint = did_you_mean(key, known)
        if not hint:
            leaf = str(key).split(".")[-1]
            close = [k for k in known if k.split(".")[-1] == leaf]
            hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"unknown config key {key!r}.{hint}") from exc
    except ValidationError as exc:
        raise ConfigError(type_message(exc)) from exc
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid config: {exc}") from exc


def _resolve_interpolations(cfg: DictConfig) -> None:
    """Replace every ``${...}`` by its value, in place: what the run records (``config.yaml``,
    hparams) is what it ran with, and resuming never re-reads an environment variable.

    :raises ConfigError: an interpolation cannot be resolved (the key named).
    """
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"cannot resolve {exc.full_key or 'an interpolation'}: {message} (OmegaConf's "
                          "resolvers: oc.env, oc.select, oc.decode, oc.create, oc.dict.keys, oc.dict.values; "
                          "${a.b} refers to another key)") from exc
