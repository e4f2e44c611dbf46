"""The run schema: every config key, its type and the checks on its value.

The values live in ``configs/default.yaml`` (written once); the dataclasses here give each
key its type, so OmegaConf refuses an unknown key or a wrongly typed value when a layer is
merged (:mod:`rlzoo.config`). :func:`check_values` then checks what types cannot say:
choices, ranges, finiteness, combinations of keys.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ValidationError

from rlzoo.errors import ConfigError, did_you_mean

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
    staleness: int = MISSING


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
    old_logp: str = MISSING


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
class RMConfig:
    data: Optional[str] = MISSING
    steps: int = MISSING
    batch_size: int = MISSING
    eval_fraction: float = MISSING
    eval_every: int = MISSING
    chat_template: Optional[bool] = MISSING
    task_pairs: int = MISSING


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
    rm: RMConfig = field(default_factory=RMConfig)

RENAMED_KEYS: dict[str, str] = {
    "trainer.ppo_epochs": "trainer.update_epochs",
    "trainer.mini_batches": "trainer.num_mini_batches",
    "kl.penalty": "kl.estimator",
}
"""Keys of rlzoo 0.1 -> their rlzoo 0.2 names (an old key is an error naming the new one)."""

ADDED_KEYS: dict[str, Any] = {
    "trainer.old_logp": "compute",
}
"""Keys added after a run may have been saved -> the value such a run ran with (a resumed run
whose ``config.yaml`` lacks one gets it, and that is no change)."""

CHOICES: dict[str, tuple[str, ...]] = {
    "model.arch": ("qwen2", "llama"),
    "model.dtype": ("float32", "bfloat16"),
    "rollout.dtype": (None, "float32", "bfloat16", "float16"),
    "kl.apply": ("loss", "reward"),
    "trainer.lr_schedule": ("constant", "linear", "cosine"),
    "trainer.device": ("cpu", "cuda", "auto"),
    "trainer.precision": ("fp32", "bf16"),
    "trainer.old_logp": ("compute", "rollout"),
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
    "checkpoint.keep", "distributed.timeout_s", "launcher.nproc", "rm.steps", "rm.batch_size", "rm.task_pairs",
)
NON_NEGATIVE: tuple[str, ...] = (
    "trainer.lr", "trainer.critic_lr", "trainer.weight_decay", "trainer.warmup_steps",
    "trainer.max_grad_norm", "trainer.entropy_coef", "trainer.threads", "trainer.logprob_keep_mb", "kl.coef",
    "logging.sample_every", "checkpoint.every", "rollout.staleness", "eval.every", "eval.size", "eval.n",
    "rm.eval_fraction", "rm.eval_every",
)


FLOAT32_MAX = 3.4028234663852886e38
"""Config numbers meet float32 tensors (a learning rate beyond it fails inside the optimizer)."""


def non_finite(data: Any, prefix: str = "") -> list[tuple[str, float]]:
    """``(dotted key, value)`` of every NaN, infinite or beyond-float32 float in a nested container."""
    if isinstance(data, dict):
        return [hit for key, value in data.items() for hit in non_finite(value, f"{prefix}{key}.")]
    if isinstance(data, (list, tuple)):
        return [hit for i, value in enumerate(data) for hit in non_finite(value, f"{prefix[:-1]}[{i}].")]
    if isinstance(data, float) and not (math.isfinite(data) and abs(data) <= FLOAT32_MAX):
        return [(prefix[:-1], data)]
    return []

def check_values(cfg: DictConfig) -> None:
    """Check what the schema's types cannot: choices, ranges, finiteness, combinations.

    :raises ConfigError: one line naming the key, its value and what is allowed.
    """
    bad = non_finite(OmegaConf.to_container(cfg))
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

def schema_keys(node: Any, prefix: str = "") -> list[str]:
    keys = []
    if isinstance(node, DictConfig):
        for key in node.keys():
            full = f"{prefix}{key}"
            keys.append(full)
            child = node._get_node(key)
            if isinstance(child, DictConfig):
                keys.extend(schema_keys(child, full + "."))
    return keys

def type_message(exc: ValidationError, where: str | None = None) -> str:
    key = where or exc.full_key or "?"
    text = str(exc).splitlines()[0]
    match = re.search(r"could not be converted to ([A-Za-z_]+)", text)
    value = re.search(r"Value '([^']*)'", text)
    if match and value:
        return f"invalid value for {key}: {value.group(1)!r} is not a valid {match.group(1).lower()}"
    return f"invalid value for {key}: {text}"
