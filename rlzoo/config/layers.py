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
import math
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

from rlzoo.core.errors import ConfigError, did_you_mean
from rlzoo.config.yamlfile import read_yaml
from rlzoo.contract.kinds import COMPONENT_FIELDS, LIST_FIELDS
from rlzoo.config.params import expand, resolve_component
from rlzoo.config.preset_cards import load_preset
from rlzoo.contract.registry import Component, Registry
from rlzoo.config.resolved import ResolvedConfig
from rlzoo.config.schema import (FLOAT32_MAX, RENAMED_KEYS, TASK_KEYS, RunConfig, check_instruction, check_values,
                          schema_keys, type_message)

__all__ = ["PRESET_REFUSED_KEYS", "default_config_path", "parse_overrides", "plugin_modules", "read_layers",
           "resolve_config"]

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


def _pop_path(data: dict[str, Any], path: str) -> tuple[bool, Any]:
    parts = path.split(".")
    node: Any = data
    for part in parts[:-1]:
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    if not isinstance(node, dict) or parts[-1] not in node:
        return False, None
    return True, node.pop(parts[-1])


def _as_spec(value: Any, where: str) -> dict[str, Any] | None:
    """A component choice as a mapping ``{name: ..., **params}`` (``None`` stays ``None``)."""
    if value is None:
        return None
    if isinstance(value, str):
        return {"name": value}
    if isinstance(value, dict):
        return dict(value)
    raise ConfigError(
        f"{where} must be a component name or a mapping with 'name', got {value!r}"
    )


def _merge_spec(current: dict[str, Any] | None, layer: dict[str, Any] | None) -> dict[str, Any] | None:
    """A later layer naming another component replaces the choice and its parameters;
    a mapping without ``name`` (or with the same name) updates the parameters."""
    if layer is None:
        return None
    if current is None or ("name" in layer and layer["name"] != current.get("name")):
        return dict(layer)
    merged = dict(current)
    merged.update(layer)
    return merged


def _flat_keys(data: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the leaves of a nested dict (a list counts as one leaf)."""
    if not isinstance(data, dict):
        return [prefix[:-1]] if prefix else []
    keys: list[str] = []
    for key, value in data.items():
        keys.extend(_flat_keys(value, f"{prefix}{key}."))
    return keys


def _check_renamed(label: str, layer: dict[str, Any]) -> None:
    for old, new in RENAMED_KEYS.items():
        if _get_path(layer, old)[0]:
            raise ConfigError(f"config key {old!r} ({label}) was renamed to {new!r} in rlzoo 0.2; use {new}")


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
    preset_layer: dict[str, Any] = {}
    preset_label = None
    if algo is not None and base is None:
        preset = registry.get("algorithm", str(algo))
        preset_layer = _preset_mapping(preset)
        preset_label = f"algorithm preset {preset.name!r} (package {preset.package or '?'})"
        refused = sorted(set(preset_layer) & set(PRESET_REFUSED_KEYS))
        if refused:
            raise ConfigError(f"{preset_label} sets {', '.join(refused)}: a preset holds a recipe (components, "
                              f"their parameters, rollout / trainer / kl / eval / model keys), not "
                              f"{', '.join(PRESET_REFUSED_KEYS)}")
    labelled = [("defaults" if base is None else base_label, defaults), (f"preset {algo}", preset_layer),
                (f"--config {config_file}", file_layer), ("command line", cli_layer)]
    labelled = [(label, copy.deepcopy(layer)) for label, layer in labelled]
    for label, layer in labelled:
        _check_renamed(label, layer)

    sources: dict[str, str] = {}
    specs: dict[str, dict[str, Any] | None] = {}
    lists: dict[str, list[Any]] = {}
    for path in COMPONENT_FIELDS:
        spec: dict[str, Any] | None = None
        for label, layer in labelled:
            present, value = _pop_path(layer, path)
            if present and isinstance(value, list) and path in LIST_FIELDS:
                spec, lists[path] = None, value
                sources = {k: v for k, v in sources.items() if not k.startswith(path + ".")}
                sources[path] = label
            elif present:
                lists.pop(path, None)
                layer_spec = _as_spec(value, path)
                if spec is None or layer_spec is None or layer_spec.get("name", spec.get("name")) != spec.get("name"):
                    sources = {k: v for k, v in sources.items() if not k.startswith(path + ".")}
                spec = _merge_spec(spec, layer_spec)
                for key in (layer_spec or {"name": None}):
                    sources[f"{path}.{key}"] = label
        specs[path] = spec
    task_extras: dict[str, Any] = {}
    if specs["task"] is not None:  # every task's own keys (task.instruction), not its factory's parameters
        task_extras = {key: specs["task"].pop(key, None) for key in TASK_KEYS}
        check_instruction(task_extras["instruction"])
    ext_specs: list[Any] = []
    for label, layer in labelled:
        present, value = _pop_path(layer, "extensions")
        if present:
            ext_specs = list(value or [])
            sources["extensions"] = label
    for label, layer in labelled:
        for key in _flat_keys(layer):
            sources[key] = label

    schema = OmegaConf.structured(RunConfig)
    for path in COMPONENT_FIELDS:
        OmegaConf.update(schema, path, None, force_add=True)
    OmegaConf.update(schema, "extensions", [], force_add=True)
    OmegaConf.set_struct(schema, True)
    cfg = schema
    for label, layer in labelled:
        try:
            cfg = _merge_checked(cfg, layer)
        except ConfigError as exc:
            raise ConfigError(f"{preset_label}: {exc}" if label.startswith("preset ") else str(exc)) from exc
    _resolve_interpolations(cfg)
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"config keys without a value: {', '.join(missing)}")
    check_values(cfg)

    if specs["reward"] is None and "reward" not in lists and specs["task"] is not None:
        task = resolve_component(registry, "task", "task", specs["task"])[0]
        if task.meta.get("reward") is None:
            raise ConfigError(f"task {task.name!r} names no default reward: set reward=NAME "
                              f"(registered: {', '.join(registry.names('reward'))})")
        specs["reward"] = {"name": task.meta["reward"]}
        sources["reward.name"] = f"task {task.name}'s default reward"
    components: dict[str, Component] = {}
    params: dict[str, Any] = {}
    rewards = _resolve_rewards(registry, lists["reward"]) if "reward" in lists else []
    if rewards:
        OmegaConf.update(cfg, "reward", [{**expand(c, p), "weight": w} for c, p, w in rewards], force_add=True)
    elif specs["reward"] is not None and "weight" in specs["reward"]:
        raise ConfigError(f"reward.weight={specs['reward']['weight']!r}: a weight belongs to one of several "
                          f"reward functions; write reward=[{{name: a, weight: 1.0}}, {{name: b, weight: 0.5}}]")
    for path, kind in COMPONENT_FIELDS.items():
        spec = specs[path]
        if spec is None:
            continue
        try:
            component, instance, expanded = resolve_component(registry, kind, path, spec)
        except ConfigError as exc:
            setters = {v for k, v in sources.items() if k.startswith(path + ".")}
            from_preset = any(v.startswith("preset ") for v in setters) and not setters & {
                f"--config {config_file}", "command line"}
            raise ConfigError(f"{preset_label}: {exc}" if from_preset and preset_label else str(exc)) from exc
        components[path] = component
        params[path] = instance
        if path == "task":
            expanded = {**expanded, **task_extras}
        OmegaConf.update(cfg, path, expanded, force_add=True)
        for key in expanded:
            sources.setdefault(f"{path}.{key}", f"default of {kind} {component.name}")
    extensions = []
    expanded_exts = []
    for i, raw in enumerate(ext_specs):
        spec = _as_spec(raw, f"extensions[{i}]")
        if spec is None:
            continue
        component, instance, expanded = resolve_component(
            registry, "extension", f"extensions[{i}]", spec
        )
        extensions.append((component, instance))
        expanded_exts.append(expanded)
    OmegaConf.update(cfg, "extensions", expanded_exts, force_add=True)
    for required in ("task", "advantage", "policy_loss", "loss_agg", "rollout.backend"):
        if required not in components:
            raise ConfigError(f"'{required}' must name a component; got null")
    if not rewards and "reward" in components:
        rewards = [(components["reward"], params["reward"], 1.0)]
    if "rollout_correction" in lists:
        corrections = _resolve_corrections(registry, lists["rollout_correction"], sources)
        OmegaConf.update(cfg, "rollout_correction", [expand(c, p) for c, p in corrections], force_add=True)
    elif "rollout_correction" in components and components["rollout_correction"].name != "none":
        corrections = [(components["rollout_correction"], params["rollout_correction"])]
    else:
        corrections = []
    return ResolvedConfig(cfg=cfg, components=components, params=params, extensions=extensions,
                          sources=sources, rewards=rewards, registry=registry, corrections=corrections)


def _preset_mapping(preset: Component) -> dict[str, Any]:
    return load_preset(preset).config


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


def _resolve_corrections(registry: Registry, items: list[Any], sources: dict[str, str]) -> list[tuple[Component, Any]]:
    """``rollout_correction=[a, {name: b, **params}, ...]`` as ``(component, params)`` in
    order (``[]``: no correction); records each parameter's source as
    ``rollout_correction[i].<key>`` (the list's layer, or the component's default).

    :raises ConfigError: a bad item, ``none`` beside other corrections, or a correction
        named twice (its metrics are logged under its name).
    """
    label = sources.get("rollout_correction", "?")
    out: list[tuple[Component, Any]] = []
    for i, raw in enumerate(items):
        spec = _as_spec(raw, f"rollout_correction[{i}]")
        if spec is None:
            raise ConfigError(f"rollout_correction[{i}] is null; every item names a correction")
        component, instance, expanded = resolve_component(registry, "rollout_correction",
                                                          f"rollout_correction[{i}]", spec)
        for key in expanded:
            sources[f"rollout_correction[{i}].{key}"] = (label if key in spec
                                                         else f"default of rollout_correction {component.name}")
        out.append((component, instance))
    names = [c.name for c, _ in out]
    if "none" in names and len(names) > 1:
        raise ConfigError(f"rollout_correction={names}: none is no correction; list only the corrections to apply "
                          "(or write rollout_correction=none)")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"rollout_correction names {', '.join(twice)} more than once; each correction's metrics "
                          f"are logged as rollout_correction/<name>/..., so list each once")
    return [(c, p) for c, p in out if c.name != "none"]


def _resolve_rewards(registry: Registry, items: list[Any]) -> list[tuple[Component, Any, float]]:
    """``reward=[a, {name: b, weight: 0.5, **params}, ...]`` as ``(component, params, weight)``
    (weight 1.0 unless given).

    :raises ConfigError: an empty list, a bad item or weight, or a function named twice.
    """
    if not items:
        raise ConfigError(f"reward=[] names no reward function; registered: {', '.join(registry.names('reward'))}")
    out: list[tuple[Component, Any, float]] = []
    for i, raw in enumerate(items):
        spec = _as_spec(raw, f"reward[{i}]")
        if spec is None:
            raise ConfigError(f"reward[{i}] is null; every item names a reward function")
        weight = spec.pop("weight", 1.0)
        if (isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight)
                or abs(weight) > FLOAT32_MAX):
            raise ConfigError(f"reward[{i}].weight must be a finite number within float32's range "
                              f"(|x| <= 3.4e38), got {weight!r}")
        component, instance, _ = resolve_component(registry, "reward", f"reward[{i}]", spec)
        out.append((component, instance, float(weight)))
    if all(w == 0 for _, _, w in out):
        raise ConfigError(f"every reward weight is 0 (reward={[c.name for c, _, _ in out]}): the run would train on "
                          "a constant reward of 0; give at least one function a non-zero weight")
    names = [c.name for c, _, _ in out]
    taken = sorted(set(names) & {"mean", "std", "max", "shaped_mean"})
    if taken:
        raise ConfigError(f"reward function {taken[0]!r} would be logged as reward/{taken[0]}, which rlzoo writes "
                          "itself: register it under another name")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"reward names {', '.join(twice)} more than once; each reward function is logged as "
                          f"reward/<name>, so list each once (register a second function for other parameters)")
    return out
