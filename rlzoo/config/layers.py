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
from rlzoo.config.keys import key_records, renamed_keys, run_schema
from rlzoo.config.preset_cards import Preset, card_problems, load_preset, preset_label, read_preset
from rlzoo.config.resolved import ResolvedConfig
from rlzoo.config.schema import check_booleans, check_values, schema_keys, type_message
from rlzoo.config.yamlfile import read_yaml
from rlzoo.contract.kinds import COMPONENT_FIELDS
from rlzoo.contract.registry import Registry
from rlzoo.core.errors import ConfigError, did_you_mean

__all__ = ["PRESET_REFUSED_KEYS", "Layers", "check_merged", "default_config_path", "labelled_layers",
           "merge_into_schema", "parse_overrides", "plugin_modules", "preset_error", "preset_of", "preset_problems",
           "read_layers", "resolve_config", "resolve_layers"]

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
    :ivar preset: the name of the preset the layers hold, or ``None``.
    """

    labelled: list[tuple[str, dict[str, Any]]]
    preset_label: str | None
    user_labels: set[str]
    preset: str | None = None


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
    try:
        return resolve_layers(registry, layers)
    except ConfigError as exc:
        raise preset_error(registry, layers.preset, exc) from exc


def resolve_layers(registry: Registry, layers: Layers) -> ResolvedConfig:
    """Merge ``layers`` and choose the components (:func:`resolve_config` without reading the layers).

    :raises ConfigError: the first problem, one line.
    """
    for _, layer in layers.labelled:
        check_sections(registry, layer)
    choices = take_choices(layers.labelled)
    cfg = merge_into_schema(layers, choices.sources)
    check_merged(cfg)
    task_default_reward(registry, choices)
    chosen = choose_components(registry, choices, cfg, layers.preset_label, layers.user_labels)
    return ResolvedConfig(cfg=cfg, components=chosen.components, params=chosen.params,
                          extensions=[(c, p) for c, p, _ in chosen.items("extensions")], sources=choices.sources,
                          rewards=[(c, p, w) for c, p, w in chosen.items("reward")], registry=registry,
                          corrections=[(c, p) for c, p, _ in chosen.items("rollout_correction")])


def check_sections(registry: Registry, layer: dict[str, Any]) -> None:
    """Refuse a section of keys given one value (``rollout=vllm``, ``model=/path``), naming
    the key the value probably belongs to: a component field of the section that has a
    component of that name (``rollout.backend=vllm``), a key whose choices hold it, or the
    section's ``path``; else a few of the section's keys.

    :raises ConfigError: one line.
    """
    records = key_records()
    for section, value in layer.items():
        keys = [path for path in [*records, *COMPONENT_FIELDS] if path.startswith(f"{section}.")]
        if not keys or isinstance(value, dict):
            continue
        fits = [path for path, kind in COMPONENT_FIELDS.items() if path in keys and isinstance(value, str)
                and value in registry.names(kind)]
        fits += [path for path in keys if path in records and value in records[path].choices]
        fits += [path for path in keys if path.endswith(".path") and isinstance(value, str)]
        hint = (f"did you mean {fits[0]}={value}?" if fits else
                f"set its keys, e.g. {', '.join(f'{k}=...' for k in keys[:4])}")
        raise ConfigError(f"{section}={value!r}: {section} is a section of keys, not a value; {hint}")


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
    try:
        preset_layer, preset_label = preset_of(registry, algo) if algo is not None and base is None else ({}, None)
    except ConfigError as exc:
        raise preset_error(registry, str(algo), exc) from exc
    labelled = [("defaults" if base is None else base_label, defaults), (f"preset {algo}", preset_layer),
                (f"--config {config_file}", file_layer), ("command line", cli_layer)]
    labelled = [(label, copy.deepcopy(layer)) for label, layer in labelled]
    for label, layer in labelled:
        _check_renamed(label, layer)
    return Layers(labelled, preset_label, {f"--config {config_file}", "command line"},
                  str(algo) if preset_label is not None else None)


def preset_of(registry: Registry, algo: Any) -> tuple[dict[str, Any], str]:
    """The config keys the preset ``algo`` sets, and how errors name it.

    :raises ConfigError: an unknown preset, or one setting :data:`PRESET_REFUSED_KEYS`.
    """
    preset = registry.get("algorithm", str(algo))
    layer = load_preset(preset).config
    label = preset_label(preset)
    refused = sorted(set(layer) & set(PRESET_REFUSED_KEYS))
    if refused:
        raise ConfigError(f"{label} {_refused(refused)}")
    return layer, label


def _refused(keys: list[str]) -> str:
    return (f"sets {', '.join(keys)}: a preset holds a recipe (components, their parameters, rollout / trainer / "
            f"kl / eval / model keys), not {', '.join(PRESET_REFUSED_KEYS)}")


def preset_problems(registry: Registry, name: str) -> list[str]:
    """Every problem of the preset ``name`` over the defaults, one line each (``[]``: it
    resolves): malformed card entries, card entries for keys it does not set, keys a preset
    may not set, then each key it sets that fails (an unknown key, component or parameter,
    a bad value), then what its keys fail together (a rule that reads several keys).

    Each key is first resolved alone over the defaults; one that fails alone is resolved
    again beside every key that passed, so a key that needs another one of the preset is
    not blamed. The run plan's checks are not run (:func:`rlzoo.plan.planner.load_config`).

    :raises UnknownComponentError: no preset ``name``.
    """
    component = registry.get("algorithm", name)
    label = preset_label(component)
    try:
        config, raw_card, _, _ = read_preset(component, label)
    except ConfigError as exc:
        return [str(exc).removeprefix(label).lstrip(": ")]
    card, problems = card_problems(raw_card)
    preset = Preset(component.name, config, card)
    keys = preset.set_keys()
    problems += preset.stale_card_entries()
    refused = sorted(set(config) & set(PRESET_REFUSED_KEYS))
    if refused:
        problems.append(_refused(refused))
    defaults = read_yaml(default_config_path(), "default config")

    def error(layer: dict[str, Any]) -> str | None:
        return _error_over_defaults(registry, name, layer, defaults)

    pieces = [_only(config, key) for key in keys if key.split(".")[0] not in PRESET_REFUSED_KEYS]
    alone = [(piece, error(piece)) for piece in pieces]
    passed: dict[str, Any] = {}
    for piece, failed in alone:
        if failed is None:
            passed = _merged(passed, piece)
    together = error(passed)  # the keys that pass alone may still fail together
    context = passed if together is None else {}
    for piece, failed in alone:
        if failed is not None:
            failed = error(_merged(context, piece)) if context else failed
            if failed is None:
                context = _merged(context, piece)
            else:
                problems.append(failed)
    if together is not None:
        problems.append(together)
    return problems


def preset_error(registry: Registry, name: str | None, exc: ConfigError) -> ConfigError:
    """``exc``, or, when it is a problem of the preset ``name`` and the preset has several,
    one error listing them all (a line each: :func:`preset_problems`)."""
    if name is None or ("algorithm", name) not in registry:
        return exc
    component = registry.get("algorithm", name)
    label = preset_label(component)
    if not str(exc).startswith(label):  # a value check or a rule: the preset's when the preset alone fails
        try:
            config = read_preset(component, label)[0]
        except ConfigError:
            return exc
        if _error_over_defaults(registry, name, config, read_yaml(default_config_path(), "default config")) is None:
            return exc
    problems = preset_problems(registry, name)
    if len(problems) < 2 or not (str(exc).startswith(label) or str(exc) in problems):
        return exc
    error = ConfigError(f"{label} has {len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems))
    error.problems = problems  # type: ignore[attr-defined]  # the lines, for the plugin kit's check_preset
    return error


def _error_over_defaults(registry: Registry, name: str, layer: dict[str, Any], defaults: dict[str, Any]) -> str | None:
    """The error of ``layer`` as the preset ``name``'s layer over ``defaults`` (without the
    preset's name in front), or ``None`` when it resolves."""
    label = preset_label(registry.get("algorithm", name))
    layers = Layers([("defaults", copy.deepcopy(defaults)), (f"preset {name}", copy.deepcopy(layer))], label, set(),
                    name)
    try:
        resolve_layers(registry, layers)
    except ConfigError as exc:
        return str(exc).removeprefix(label + ": ")
    return None


def _only(config: dict[str, Any], key: str) -> dict[str, Any]:
    """The nested mapping holding only the dotted ``key`` of ``config``."""
    parts = key.split(".")
    node: Any = config
    for part in parts:
        node = node[part]
    for part in reversed(parts):
        node = {part: node}
    return node


def _merged(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """``a`` and ``b`` merged (mappings recursively; ``b`` wins a leaf)."""
    out = dict(a)
    for key, value in b.items():
        out[key] = _merged(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
    return out


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
    types = {path: key.type for path, key in key_records().items()}
    for label, layer in layers.labelled:
        try:
            check_booleans(layer, types, "value for")
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
