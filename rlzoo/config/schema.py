"""The run schema: every config key, its type and the checks on its value.

The values live in ``configs/default.yaml`` (written once); the dataclasses here give each
key its type, so OmegaConf refuses an unknown key or a wrongly typed value when a layer is
merged (:mod:`rlzoo.config.layers`). :func:`check_values` then checks what types cannot say:
choices, ranges, finiteness, combinations of keys.
"""

from __future__ import annotations

import math
import re
import string
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ValidationError

from rlzoo.core.errors import ConfigError, did_you_mean

@dataclass
class LoraConfig:
    rank: int = MISSING
    alpha: float = MISSING
    dropout: float = MISSING
    target_modules: list[str] = MISSING


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
    lora: LoraConfig = field(default_factory=LoraConfig)
    system_prompt: Optional[str] = MISSING


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
    mode: str = MISSING
    weight_sync_every: int = MISSING
    max_staleness: int = MISSING
    stale_batches: str = MISSING
    queue_size: int = MISSING
    max_turns: int = MISSING
    max_turn_tokens: int = MISSING


@dataclass
class KLConfig:
    coef: float = MISSING
    estimator: Any = MISSING
    apply: str = MISSING
    controller: Any = MISSING
    target: str = MISSING


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
    max_grad_norm: Optional[float] = MISSING
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
    at_start: bool = MISSING


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
    answer_format: Any = MISSING
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    rollout_correction: Any = MISSING
    env: Any = MISSING
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

INSTRUCTION_FIELDS = ("question", "format")
"""The fields an instruction template may use."""


def check_instruction(instruction: Any) -> None:
    """``task.instruction`` is null or a template using ``{question}`` and only :data:`INSTRUCTION_FIELDS`.

    :raises ConfigError: naming the bad value and the fields.
    """
    if instruction is None:
        return
    if not isinstance(instruction, str):
        raise ConfigError(f"invalid value for task.instruction: {instruction!r}; a template string such as "
                          "'Solve: {question} {format}'")
    try:
        used = {name for _, name, _, _ in string.Formatter().parse(instruction) if name is not None}
    except ValueError as exc:
        raise ConfigError(f"invalid task.instruction {instruction!r}: {exc} (write a literal brace as {{{{ or }}}})") \
            from exc
    unknown = sorted(used - set(INSTRUCTION_FIELDS))
    if unknown or "question" not in used:
        what = f"unknown field {{{unknown[0]}}}" if unknown else "no {question}"
        raise ConfigError(f"invalid task.instruction {instruction!r}: {what}; the template's fields are "
                          f"{', '.join('{' + f + '}' for f in INSTRUCTION_FIELDS)} and {{question}} is required")


TASK_KEYS: tuple[str, ...] = ("instruction",)
"""Keys of the ``task`` mapping that every task takes besides its own parameters
(:mod:`rlzoo.tasks.prompts`): recorded with the task's parameters, never passed to its factory."""


RENAMED_KEYS: dict[str, str] = {
    "trainer.ppo_epochs": "trainer.update_epochs",
    "trainer.mini_batches": "trainer.num_mini_batches",
    "kl.penalty": "kl.estimator",
}
"""Keys of rlzoo 0.1 -> their rlzoo 0.2 names (an old key is an error naming the new one)."""

ADDED_KEYS: dict[str, Any] = {
    "trainer.old_logp": "compute",
    "model.lora.rank": 0,
    "model.lora.alpha": 16.0,
    "model.lora.dropout": 0.0,
    "model.lora.target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "rollout.staleness": 0, "model.system_prompt": None, "eval.at_start": False, "answer_format": "plain",
    "rm.data": None, "rm.steps": 200, "rm.batch_size": 32, "rm.eval_fraction": 0.1, "rm.eval_every": 50,
    "rm.chat_template": None, "rm.task_pairs": 2000, "kl.target": "reference",
    "rollout.mode": "sync", "rollout.weight_sync_every": 1, "rollout.max_staleness": 2,
    "rollout.stale_batches": "drop", "rollout.queue_size": 1,
    "env": None, "rollout.max_turns": 4, "rollout.max_turn_tokens": 16,
}
"""Keys added after a run may have been saved -> the value such a run ran with (a resumed run
whose ``config.yaml`` lacks one gets it, and that is no change)."""

CHOICES: dict[str, tuple[str, ...]] = {
    "model.arch": ("qwen2", "llama"),
    "model.dtype": ("float32", "bfloat16"),
    "rollout.dtype": (None, "float32", "bfloat16", "float16"),
    "kl.apply": ("loss", "reward"),
    "kl.target": ("reference", "teacher"),
    "trainer.lr_schedule": ("constant", "linear", "cosine"),
    "trainer.device": ("cpu", "cuda", "auto"),
    "trainer.precision": ("fp32", "bf16"),
    "trainer.old_logp": ("compute", "rollout"),
    "rollout.mode": ("sync", "async"),
    "rollout.stale_batches": ("drop", "keep"),
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
    "rollout.weight_sync_every", "rollout.queue_size",
    "rollout.max_turns", "rollout.max_turn_tokens",
)
NON_NEGATIVE: tuple[str, ...] = (
    "trainer.lr", "trainer.critic_lr", "trainer.weight_decay", "trainer.warmup_steps",
    "trainer.entropy_coef", "trainer.threads", "trainer.logprob_keep_mb", "kl.coef",
    "logging.sample_every", "checkpoint.every", "rollout.staleness", "eval.every", "eval.size", "eval.n",
    "rm.eval_every", "rollout.max_staleness",
    "model.lora.rank",
)


FLOAT32_MAX = 3.4028234663852886e38
"""Config numbers meet float32 tensors (a learning rate beyond it fails inside the optimizer)."""

INT64_MAX = 2**63 - 1
"""Config integers meet int64 tensors and counters (Python's own ints have no bound)."""

SEED_MAX = 2**32 - 1
"""The largest seed: NumPy's ``np.random.seed`` takes ``0 <= seed < 2**32`` (torch takes more)."""

RUN_NAME_REFUSED = ("/", "\\")
"""Characters a ``run_name`` may not hold: it names one directory under ``runs/``."""


def non_finite(data: Any, prefix: str = "") -> list[tuple[str, float]]:
    """``(dotted key, value)`` of every NaN, infinite or beyond-float32 float in a nested container."""
    if isinstance(data, dict):
        return [hit for key, value in data.items() for hit in non_finite(value, f"{prefix}{key}.")]
    if isinstance(data, (list, tuple)):
        return [hit for i, value in enumerate(data) for hit in non_finite(value, f"{prefix[:-1]}[{i}].")]
    if isinstance(data, float) and not (math.isfinite(data) and abs(data) <= FLOAT32_MAX):
        return [(prefix[:-1], data)]
    return []

def huge_ints(data: Any, prefix: str = "") -> list[tuple[str, int]]:
    """``(dotted key, value)`` of every integer beyond int64 in a nested container."""
    if isinstance(data, dict):
        return [hit for key, value in data.items() for hit in huge_ints(value, f"{prefix}{key}.")]
    if isinstance(data, (list, tuple)):
        return [hit for i, value in enumerate(data) for hit in huge_ints(value, f"{prefix[:-1]}[{i}].")]
    if isinstance(data, int) and not isinstance(data, bool) and abs(data) > INT64_MAX:
        return [(prefix[:-1], data)]
    return []


def check_numbers(data: Any, label: str, sep: str = ": ") -> None:
    """Refuse a NaN, an infinity, a float beyond float32 or an integer beyond int64 in ``data``.

    :param label: how the message introduces the key (``"value for"``, ``"parameter for policy_loss 'x':"``).
    :param sep: between the key and its value (``"="`` for a component parameter).
    :raises ConfigError: one line naming the key and the value.
    """
    bad = non_finite(data)
    if bad:
        raise ConfigError(f"invalid {label} {bad[0][0]}{sep}{bad[0][1]}; config values must be finite numbers within "
                          "float32's range (|x| <= 3.4e38)")
    big = huge_ints(data)
    if big:
        raise ConfigError(f"invalid {label} {big[0][0]}{sep}{big[0][1]}; config integers must fit in int64 "
                          f"(|n| <= {INT64_MAX})")


def check_values(cfg: DictConfig) -> None:
    """Check what the schema's types cannot: choices, ranges, finiteness, combinations.

    :raises ConfigError: one line naming the key, its value and what is allowed.
    """
    check_numbers(OmegaConf.to_container(cfg), "value for")
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
    if not 0 <= cfg.rm.eval_fraction < 1:
        raise ConfigError(f"invalid value for rm.eval_fraction: {cfg.rm.eval_fraction!r}; must be in [0, 1) (the share "
                          "of rlzoo rm's preference pairs held out of training for evaluation)")
    _check_lora(cfg.model.lora)
    if len(cfg.trainer.betas) != 2 or not all(0 <= b < 1 for b in cfg.trainer.betas):
        raise ConfigError(f"invalid value for trainer.betas: {list(cfg.trainer.betas)}; need 2 numbers in [0, 1) "
                          "(AdamW's decay rates of its moment estimates, e.g. trainer.betas=[0.9,0.999])")
    if not 0 <= cfg.seed <= SEED_MAX:
        raise ConfigError(f"invalid value for seed: {cfg.seed}; must be in [0, 2**32 - 1] = [0, {SEED_MAX}] "
                          "(NumPy's seed range)")
    if cfg.trainer.max_grad_norm is not None and cfg.trainer.max_grad_norm <= 0:
        raise ConfigError(f"invalid value for trainer.max_grad_norm: {cfg.trainer.max_grad_norm!r}; must be > 0 "
                          "(clipping to a norm of 0 zeroes every gradient: the run would learn nothing); "
                          "trainer.max_grad_norm=null turns clipping off")
    name = cfg.run_name
    if name is not None and (any(c in name for c in RUN_NAME_REFUSED) or name in (".", "..")):
        raise ConfigError(f"invalid value for run_name: {name!r}; a run name is one directory name under runs/ "
                          "(no '/', '\\', '.' or '..'): to place a run elsewhere set run_dir=PATH")

def _check_lora(lora: DictConfig) -> None:
    """The values of ``model.lora`` (checked whatever its rank: a config stays valid when the
    rank is raised later)."""
    if not lora.alpha > 0:
        raise ConfigError(f"invalid value for model.lora.alpha: {lora.alpha!r}; must be > 0 (the adapters' "
                          "product is scaled by alpha / rank)")
    if not 0 <= lora.dropout < 1:
        raise ConfigError(f"invalid value for model.lora.dropout: {lora.dropout!r}; must be in [0, 1)")
    names = list(lora.target_modules)
    if not names or any(not str(name).strip() for name in names):
        raise ConfigError(f"invalid value for model.lora.target_modules: {names!r}; list the names of the "
                          "linear layers to adapt, e.g. [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                          "down_proj]")


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
