"""Layered, validated run configuration.

Layers, lowest first: ``configs/default.yaml`` < the algorithm preset chosen by ``algo``
< a user file (``--config run.yaml``) < CLI dot-list overrides (``trainer.lr=1e-3``).

The run schema below gives every key its type (the values live in ``default.yaml``);
each component choice (``advantage``, ``policy_loss``, ...) is a name or a mapping with
``name`` plus that component's parameters, validated against the parameter dataclass the
component registered. Everything is checked here, before any model is built.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    OmegaConfBaseException,
    ValidationError,
)

from rlzoo.errors import ConfigError, did_you_mean
from rlzoo.registry import Component, Registry

# ------------------------------------------------------------------------- run schema


@dataclass
class ModelConfig:
    path: Optional[str] = MISSING
    arch: str = MISSING
    hidden_size: int = MISSING
    intermediate_size: int = MISSING
    num_layers: int = MISSING
    num_heads: int = MISSING
    num_kv_heads: int = MISSING
    dtype: str = MISSING
    gradient_checkpointing: bool = MISSING
    chat_template: Optional[bool] = MISSING


@dataclass
class RolloutConfig:
    prompts_per_step: int = MISSING
    n: int = MISSING
    max_new_tokens: int = MISSING
    temperature: float = MISSING
    top_p: float = MISSING
    dtype: Optional[str] = MISSING
    record: bool = MISSING
    backend: Any = MISSING


@dataclass
class KLConfig:
    coef: float = MISSING
    estimator: Any = MISSING
    apply: str = MISSING
    controller: Any = MISSING


@dataclass
class TeacherConfig:
    path: Optional[str] = MISSING


@dataclass
class TrainerConfig:
    total_steps: int = MISSING
    lr: float = MISSING
    critic_lr: float = MISSING
    weight_decay: float = MISSING
    betas: list[float] = MISSING
    lr_schedule: str = MISSING
    warmup_steps: int = MISSING
    update_epochs: int = MISSING
    num_mini_batches: int = MISSING
    micro_batch_size: int = MISSING
    max_grad_norm: float = MISSING
    entropy_coef: float = MISSING
    logprob_chunk_size: int = MISSING
    logprob_keep_mb: float = MISSING
    device: str = MISSING
    threads: int = MISSING
    precision: str = MISSING


@dataclass
class LoggingConfig:
    log_every: int = MISSING
    sample_every: int = MISSING
    progress: bool = MISSING


@dataclass
class EvalConfig:
    every: int = MISSING
    size: int = MISSING
    n: int = MISSING
    threshold: float = MISSING
    holdout: float = MISSING


@dataclass
class CheckpointConfig:
    every: int = MISSING
    keep: int = MISSING


@dataclass
class DistributedConfig:
    strategy: str = MISSING
    backend: str = MISSING
    timeout_s: float = MISSING


@dataclass
class LauncherConfig:
    nproc: int = MISSING


@dataclass
class RunConfig:
    algo: Optional[str] = MISSING
    seed: int = MISSING
    run_name: Optional[str] = MISSING
    run_dir: Optional[str] = MISSING
    resume: Optional[str] = MISSING
    plugins: list[str] = MISSING
    extensions: list[Any] = MISSING
    task: Any = MISSING
    reward: Any = MISSING
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    rollout_correction: Any = MISSING
    advantage: Any = MISSING
    policy_loss: Any = MISSING
    loss_agg: Any = MISSING
    value_loss: Any = MISSING
    kl: KLConfig = field(default_factory=KLConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)


COMPONENT_FIELDS: dict[str, str] = {
    "task": "task",
    "reward": "reward",
    "advantage": "advantage",
    "policy_loss": "policy_loss",
    "loss_agg": "loss_agg",
    "value_loss": "value_loss",
    "kl.estimator": "kl_estimator",
    "kl.controller": "kl_controller",
    "rollout.backend": "rollout",
    "rollout_correction": "rollout_correction",
}
"""Config path -> component kind, for every single-component choice."""

LIST_FIELDS: tuple[str, ...] = ("reward",)
"""Component paths that also take a list of choices (``reward=[{name: a, weight: 1.0}, ...]``)."""

PRESET_REFUSED_KEYS: tuple[str, ...] = ("algo", "plugins", "seed", "run_name", "run_dir", "resume")
"""Top-level keys an algorithm preset may not set: they choose the preset, are read before
presets (``plugins``), or name and place a run rather than describe an algorithm."""

RENAMED_KEYS: dict[str, str] = {
    "trainer.ppo_epochs": "trainer.update_epochs",
    "trainer.mini_batches": "trainer.num_mini_batches",
    "kl.penalty": "kl.estimator",
}
"""Keys of rlzoo 0.1 -> their rlzoo 0.2 names (an old key is an error naming the new one)."""

CHOICES: dict[str, tuple[str, ...]] = {
    "model.arch": ("qwen2", "llama"),
    "model.dtype": ("float32", "bfloat16"),
    "rollout.dtype": (None, "float32", "bfloat16", "float16"),
    "kl.apply": ("loss", "reward"),
    "trainer.lr_schedule": ("constant", "linear", "cosine"),
    "trainer.device": ("cpu", "cuda", "auto"),
    "trainer.precision": ("fp32", "bf16"),
    "distributed.strategy": ("ddp", "fsdp"),
    "distributed.backend": ("auto", "gloo", "nccl"),
}

FLOAT16_TRAINING = (
    "model.dtype=float16 is not supported: AdamW on float16 weights without master weights or loss scaling "
    "turns most of them into NaN in the first update (its second moment underflows to 0 and eps=1e-8 is 0 in "
    "float16: measured 85% NaN weights after one step); use model.dtype=bfloat16, or float32 with "
    "rollout.dtype=float16 to generate in float16")
"""Why ``model.dtype=float16`` is refused (``rollout.dtype=float16``, a generation copy, is fine)."""

POSITIVE: tuple[str, ...] = (
    "rollout.prompts_per_step", "rollout.n", "rollout.max_new_tokens", "rollout.temperature",
    "trainer.total_steps", "trainer.update_epochs", "trainer.num_mini_batches", "trainer.micro_batch_size",
    "trainer.logprob_chunk_size", "model.hidden_size", "model.intermediate_size",
    "model.num_layers", "model.num_heads", "model.num_kv_heads", "logging.log_every",
    "checkpoint.keep", "distributed.timeout_s", "launcher.nproc",
)
NON_NEGATIVE: tuple[str, ...] = (
    "trainer.lr", "trainer.critic_lr", "trainer.weight_decay", "trainer.warmup_steps",
    "trainer.max_grad_norm", "trainer.entropy_coef", "trainer.threads", "trainer.logprob_keep_mb", "kl.coef",
    "logging.sample_every", "checkpoint.every", "eval.every", "eval.size", "eval.n",
)

# ------------------------------------------------------------------------- loading


def default_config_path() -> Path:
    """Path of the shipped ``default.yaml``."""
    return Path(str(resources.files("rlzoo_configs").joinpath("default.yaml")))


def _read_yaml(path: str | Path, what: str) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} {str(path)!r} does not exist or is not a file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {str(path)!r} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{what} {str(path)!r} must hold a mapping of config keys, got {type(data).__name__}"
        )
    return data


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """Turn CLI ``key=value`` items into a nested dict (values parsed as YAML)."""
    bad = [item for item in overrides if "=" not in item or item.startswith("=")]
    if bad:
        raise ConfigError(
            f"override {bad[0]!r} is not of the form key=value (e.g. trainer.lr=1e-3)"
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


def plugin_modules(overrides: list[str] | None, config_file: str | Path | None) -> list[str]:
    """The ``plugins`` list (modules to import as plugins) of the file and CLI layers.

    Read before the registry is built, because those modules may register the very
    components the rest of the config names. With ``resume=RUN_DIR``, the run's saved
    ``config.yaml`` is the lowest layer: a resumed run loads the plugins it started with.
    """
    modules: Any = []
    layers = [_read_yaml(config_file, "config file") if config_file is not None else {},
              parse_overrides(overrides or [])]
    resume = layers[1].get("resume", layers[0].get("resume"))
    if resume and (Path(str(resume)) / "config.yaml").is_file():
        layers.insert(0, _read_yaml(Path(str(resume)) / "config.yaml", f"resume={resume}: run config"))
    for layer in layers:
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


def _set_path(data: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


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
    :ivar plan: the :class:`rlzoo.plan.RunPlan` decided from all of the above.
    :ivar resume_changes: with ``resume=``, dotted key -> ``(saved, new)`` for every key
        the resume changes (only :data:`rlzoo.rundir.RESUMABLE_KEYS` may change).
    :ivar rewards: ``(component, params, weight)`` of every reward function, in ``reward``
        order (one, weight 1.0, unless ``reward`` is a list).
    """

    cfg: DictConfig
    components: dict[str, Component]
    params: dict[str, Any]
    extensions: list[tuple[Component, Any]]
    sources: dict[str, str] = field(default_factory=dict)
    plan: Any = None
    resume_changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    rewards: list[tuple[Component, Any, float]] = field(default_factory=list)

    def to_yaml(self) -> str:
        return OmegaConf.to_yaml(self.cfg)

    def bound(self, path: str) -> Any:
        """The component chosen at ``path`` with its parameters bound, as the engine calls it."""
        return self.components[path].bind(self.params[path])

    def reward_functions(self) -> list[tuple[Any, float]]:
        """``(bound reward function, weight)`` pairs, in ``reward`` order."""
        return [(component.bind(params), weight) for component, params, weight in self.rewards]

    def build(self, path: str, **inputs: Any) -> Any:
        """Construct the component chosen at ``path`` (a task, a rollout backend, ...) from
        ``inputs``; a ``ValueError`` / ``OSError`` of its factory is a config error naming it."""
        try:
            return self.bound(path)(**inputs)
        except ConfigError:
            raise
        except (ValueError, OSError) as exc:
            raise ConfigError(f"{path} {self.components[path].name!r}: {exc}") from exc


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


def load_config(
    registry: Registry,
    overrides: list[str] | None = None,
    config_file: str | Path | None = None,
    base: dict[str, Any] | None = None,
) -> ResolvedConfig:
    """Merge and validate the layers, decide the run plan; raise :class:`ConfigError` on
    any bad input or inconsistent combination, before anything is built or written.

    :param registry: the component registry (presets and component parameters).
    :param overrides: CLI ``key=value`` items.
    :param config_file: the user's YAML file.
    :param base: replaces ``default.yaml`` (and the preset) as the lowest layer. With
        ``resume=RUN_DIR`` the run's saved ``config.yaml`` is that base, so a resumed run
        keeps its config; later layers may still override keys (e.g. total_steps).
    """
    from rlzoo.plan import build_plan

    file_layer = _read_yaml(config_file, "config file") if config_file is not None else {}
    cli_layer = parse_overrides(overrides or [])
    resume = cli_layer.get("resume", file_layer.get("resume"))
    base_label = "base"
    saved: dict[str, Any] | None = None
    if base is None and resume:
        from rlzoo.checkpoint import latest_checkpoint

        run_dir = Path(str(resume))
        if not (run_dir / "config.yaml").is_file():
            raise ConfigError(f"resume={resume!r} is not a run directory (no config.yaml)")
        if latest_checkpoint(run_dir) is None and not (run_dir / "plan.txt").is_file():
            raise ConfigError(f"resume={resume!r}: no checkpoint found in {run_dir / 'checkpoints'}")
        base = _read_yaml(run_dir / "config.yaml", f"resume={resume}: run config")
        saved = _deep_copy(base)
        base["resume"] = str(resume)
        base_label = f"run {run_dir / 'config.yaml'}"
    defaults = base if base is not None else _read_yaml(default_config_path(), "default config")

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
    labelled = [(label, _deep_copy(layer)) for label, layer in labelled]
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
    _check_values(cfg)

    if specs["reward"] is None and "reward" not in lists and specs["task"] is not None:
        task = _resolve_component(registry, "task", "task", specs["task"])[0]
        if task.meta.get("reward") is None:
            raise ConfigError(f"task {task.name!r} names no default reward: set reward=NAME "
                              f"(registered: {', '.join(registry.names('reward'))})")
        specs["reward"] = {"name": task.meta["reward"]}
        sources["reward.name"] = f"task {task.name}'s default reward"
    components: dict[str, Component] = {}
    params: dict[str, Any] = {}
    rewards = _resolve_rewards(registry, lists["reward"]) if "reward" in lists else []
    if rewards:
        OmegaConf.update(cfg, "reward", [{**_expand(c, p), "weight": w} for c, p, w in rewards], force_add=True)
    elif specs["reward"] is not None and "weight" in specs["reward"]:
        raise ConfigError(f"reward.weight={specs['reward']['weight']!r}: a weight belongs to one of several "
                          f"reward functions; write reward=[{{name: a, weight: 1.0}}, {{name: b, weight: 0.5}}]")
    for path, kind in COMPONENT_FIELDS.items():
        spec = specs[path]
        if spec is None:
            continue
        try:
            component, instance, expanded = _resolve_component(registry, kind, path, spec)
        except ConfigError as exc:
            setters = {v for k, v in sources.items() if k.startswith(path + ".")}
            from_preset = any(v.startswith("preset ") for v in setters) and not setters & {
                f"--config {config_file}", "command line"}
            raise ConfigError(f"{preset_label}: {exc}" if from_preset and preset_label else str(exc)) from exc
        components[path] = component
        params[path] = instance
        OmegaConf.update(cfg, path, expanded, force_add=True)
        for key in expanded:
            sources.setdefault(f"{path}.{key}", f"default of {kind} {component.name}")
    extensions = []
    expanded_exts = []
    for i, raw in enumerate(ext_specs):
        spec = _as_spec(raw, f"extensions[{i}]")
        if spec is None:
            continue
        component, instance, expanded = _resolve_component(
            registry, "extension", f"extensions[{i}]", spec
        )
        extensions.append((component, instance))
        expanded_exts.append(expanded)
    OmegaConf.update(cfg, "extensions", expanded_exts, force_add=True)
    for required in ("task", "advantage", "policy_loss", "loss_agg", "rollout.backend"):
        if required not in components:
            raise ConfigError(f"'{required}' must name a component; got null")
    changes: dict[str, tuple[Any, Any]] = {}
    if saved is not None:
        from rlzoo.rundir import resume_changes

        try:
            changes = resume_changes(saved, OmegaConf.to_container(cfg))  # type: ignore[arg-type]
        except ConfigError as exc:
            raise ConfigError(f"resume={resume} {exc}") from exc
    if not rewards and "reward" in components:
        rewards = [(components["reward"], params["reward"], 1.0)]
    resolved = ResolvedConfig(cfg=cfg, components=components, params=params, extensions=extensions,
                              sources=sources, resume_changes=changes, rewards=rewards)
    resolved.plan = build_plan(resolved)
    return resolved


def _deep_copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data


def _preset_mapping(preset: Component) -> dict[str, Any]:
    from rlzoo.presets import load_preset

    return load_preset(preset).config


def _schema_keys(node: Any, prefix: str = "") -> list[str]:
    keys = []
    if isinstance(node, DictConfig):
        for key in node.keys():
            full = f"{prefix}{key}"
            keys.append(full)
            child = node._get_node(key)
            if isinstance(child, DictConfig):
                keys.extend(_schema_keys(child, full + "."))
    return keys


def _merge_checked(cfg: DictConfig, layer: dict[str, Any]) -> DictConfig:
    try:
        return OmegaConf.merge(cfg, layer)  # type: ignore[return-value]
    except (ConfigKeyError, ConfigAttributeError) as exc:
        key = exc.full_key or getattr(exc, "key", "") or ""
        known = _schema_keys(cfg)
        hint = did_you_mean(key, known)
        if not hint:
            leaf = str(key).split(".")[-1]
            close = [k for k in known if k.split(".")[-1] == leaf]
            hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"unknown config key {key!r}.{hint}") from exc
    except ValidationError as exc:
        raise ConfigError(_type_message(exc)) from exc
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid config: {exc}") from exc


def _type_message(exc: ValidationError, where: str | None = None) -> str:
    key = where or exc.full_key or "?"
    text = str(exc).splitlines()[0]
    match = re.search(r"could not be converted to ([A-Za-z_]+)", text)
    value = re.search(r"Value '([^']*)'", text)
    if match and value:
        return f"invalid value for {key}: {value.group(1)!r} is not a valid {match.group(1).lower()}"
    return f"invalid value for {key}: {text}"


FLOAT32_MAX = 3.4028234663852886e38
"""Config numbers meet float32 tensors (a learning rate beyond it fails inside the optimizer)."""


def _non_finite(data: Any, prefix: str = "") -> list[tuple[str, float]]:
    """``(dotted key, value)`` of every NaN, infinite or beyond-float32 float in a nested container."""
    if isinstance(data, dict):
        return [hit for key, value in data.items() for hit in _non_finite(value, f"{prefix}{key}.")]
    if isinstance(data, (list, tuple)):
        return [hit for i, value in enumerate(data) for hit in _non_finite(value, f"{prefix[:-1]}[{i}].")]
    if isinstance(data, float) and not (math.isfinite(data) and abs(data) <= FLOAT32_MAX):
        return [(prefix[:-1], data)]
    return []


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


def _check_values(cfg: DictConfig) -> None:
    bad = _non_finite(OmegaConf.to_container(cfg))
    if bad:
        key, value = bad[0]
        raise ConfigError(f"invalid value for {key}: {value}; config values must be finite numbers within "
                          "float32's range (|x| <= 3.4e38)")
    if cfg.model.dtype == "float16":
        raise ConfigError(FLOAT16_TRAINING)
    if cfg.trainer.precision == "bf16" and cfg.model.dtype != "float32":
        raise ConfigError(f"trainer.precision=bf16 computes in bfloat16 over float32 master weights, but "
                          f"model.dtype={cfg.model.dtype} holds the weights themselves in that dtype: set "
                          "model.dtype=float32 (mixed precision) or trainer.precision=fp32 (bfloat16 weights)")
    for path, choices in CHOICES.items():
        value = OmegaConf.select(cfg, path)
        if value not in choices:
            raise ConfigError(
                f"invalid value for {path}: {value!r}; choose one of {', '.join(map(str, choices))}."
                f"{did_you_mean(str(value), [str(c) for c in choices])}"
            )
    for path in POSITIVE:
        value = OmegaConf.select(cfg, path)
        if value is None or value <= 0:
            raise ConfigError(f"invalid value for {path}: {value!r}; must be > 0")
    for path in NON_NEGATIVE:
        value = OmegaConf.select(cfg, path)
        if value is None or value < 0:
            raise ConfigError(f"invalid value for {path}: {value!r}; must be >= 0")
    if not 0 < cfg.rollout.top_p <= 1:
        raise ConfigError(f"invalid value for rollout.top_p: {cfg.rollout.top_p!r}; must be in (0, 1]")
    if not 0 <= cfg.eval.holdout < 1:
        raise ConfigError(f"invalid value for eval.holdout: {cfg.eval.holdout!r}; must be in [0, 1) (the share of "
                          "each task's prompts held out of training for evaluation)")
    if len(cfg.trainer.betas) != 2:
        raise ConfigError(f"invalid value for trainer.betas: {list(cfg.trainer.betas)}; need 2 numbers")


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
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ConfigError(f"reward[{i}].weight must be a finite number, got {weight!r}")
        component, instance, _ = _resolve_component(registry, "reward", f"reward[{i}]", spec)
        out.append((component, instance, float(weight)))
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


def _expand(component: Component, instance: Any) -> dict[str, Any]:
    """A component choice with every parameter, as it is recorded in the config."""
    expanded: dict[str, Any] = {"name": component.name}
    if instance is not None:
        expanded.update(_params_container(instance))
    return expanded


def _resolve_component(
    registry: Registry, kind: str, where: str, spec: dict[str, Any]
) -> tuple[Component, Any, dict[str, Any]]:
    if "name" not in spec or spec["name"] is None:
        raise ConfigError(f"{where} needs a 'name'; registered: {', '.join(registry.names(kind))}")
    try:
        component = registry.get(kind, spec["name"])
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    given = {k: v for k, v in spec.items() if k != "name"}
    instance = build_params(component, given, where)
    return component, instance, _expand(component, instance)


def _params_container(instance: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        if isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def build_params(component: Component, given: dict[str, Any], where: str | None = None) -> Any:
    """Validate ``given`` against the component's parameter dataclass and instantiate it.

    :raises ConfigError: unknown parameter (did-you-mean), wrong type, or a value the
        dataclass' ``__post_init__`` rejects; the message names the parameter.
    """
    where = where or component.kind
    label = f"{where} {component.name!r}"
    if component.params is None:
        if given:
            raise ConfigError(f"{label} takes no parameters; got {', '.join(sorted(given))}")
        return None
    names = [f.name for f in dataclasses.fields(component.params)]
    for key in given:
        if key not in names:
            hint = (" (YAML reads `{a:b}` as one key: write `{a: b}`, with a space after the colon)"
                    if ":" in str(key) else did_you_mean(key, names))
            raise ConfigError(
                f"unknown parameter {key!r} for {label}; parameters: "
                f"{', '.join(names) or '(none)'}.{hint}"
            )
    bad = _non_finite(given)
    if bad:
        raise ConfigError(f"invalid parameter for {label}: {bad[0][0]}={bad[0][1]}; parameters must be "
                          "finite numbers within float32's range (|x| <= 3.4e38)")
    try:
        node = OmegaConf.merge(OmegaConf.structured(component.params), given)
        return OmegaConf.to_object(node)
    except ValidationError as exc:
        key = f"{where}.{exc.key}" if exc.key is not None else where
        raise ConfigError(_type_message(exc, key)) from exc
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid parameter for {label}: {exc}") from exc
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid parameters for {label}: {exc}") from exc


_RANGE_PATTERNS = (
    re.compile(r"\bin\s+([\[(][^\])]*[\])])"),                                # "in (0, 1)", "in [0, 1]"
    # "; > 0", "must be > 1": a bound that ends the clause (not "A < 0 the ...", "> 1 + c")
    re.compile(r"(?:^|;\s*|must be\s+)((?:>=|<=|>|<|≥|≤)\s*-?\d+(?:\.\d+)?(?:e-?\d+)?)(?=\.?(?:$|[;,)]|\s\())"),
    re.compile(r"\((\d+)\.\.(\d+)\)"),                                        # "(1..30)"
)


def _field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass (the string right after each field)."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, following in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant) and \
                isinstance(following.value.value, str):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def describe_params(component: Component) -> list[dict[str, Any]]:
    """The component's parameters for tools and people (``rlzoo list --json``): ``name``,
    ``type``, ``default``, ``doc`` (the field's docstring) and ``range`` (a field's
    ``metadata["range"]``, else the interval its docstring states, e.g. ``(0, 1)``,
    ``> 0``; ``None`` when it states none)."""
    import typing

    if component.params is None:
        return []
    try:
        hints = typing.get_type_hints(component.params)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: fall back to its text
        hints = {}
    docs = _field_docs(component.params)
    out = []
    for f in dataclasses.fields(component.params):
        hint = hints.get(f.name, f.type)
        type_name = hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        if isinstance(default, tuple):
            default = list(default)
        if not isinstance(default, (str, int, float, bool, list, dict, type(None))):
            default = repr(default)
        doc = docs.get(f.name)
        span = f.metadata.get("range")
        for pattern in _RANGE_PATTERNS if span is None and doc else ():
            match = pattern.search(doc)
            if match:
                span = f"[{match.group(1)}, {match.group(2)}]" if pattern.groups == 2 else match.group(1)
                break
        out.append({"name": f.name, "type": type_name, "default": default, "doc": doc, "range": span})
    return out
