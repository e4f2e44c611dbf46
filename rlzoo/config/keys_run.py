"""The config keys of a run's identity, its task, its model and its rollout (records:
:mod:`rlzoo.config.key_record`; the whole table: :mod:`rlzoo.config.keys`)."""

from __future__ import annotations

from typing import Any, Optional

from rlzoo.config.key_record import Key, Section
from rlzoo.core.errors import ConfigError

SEED_MAX = 2**32 - 1
"""The largest seed: NumPy's ``np.random.seed`` takes ``0 <= seed < 2**32`` (torch takes more)."""

RUN_NAME_REFUSED = ("/", "\\")
"""Characters a ``run_name`` may not hold: it names one directory under ``runs/``."""

FLOAT16_TRAINING = (
    "model.dtype=float16 is not supported: AdamW on float16 weights without master weights or loss scaling "
    "turns most of them into NaN in the first update (its second moment underflows to 0 and eps=1e-8 is 0 in "
    "float16: measured 85% NaN weights after one step); use model.dtype=bfloat16, or float32 with "
    "rollout.dtype=float16 to generate in float16")
"""Why ``model.dtype=float16`` is refused (``rollout.dtype=float16``, a generation copy, is fine)."""

LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
"""The linear layers of a llama / qwen2-style model."""


def _seed(seed: int) -> None:
    """in `[0, 2**32 - 1]` (NumPy's seed range)"""
    if not 0 <= seed <= SEED_MAX:
        raise ConfigError(f"invalid value for seed: {seed}; must be in [0, 2**32 - 1] = [0, {SEED_MAX}] "
                          "(NumPy's seed range)")


def _run_name(name: Optional[str]) -> None:
    """one directory name: no `/`, `\\`, `.` or `..`"""
    if name is not None and (any(c in name for c in RUN_NAME_REFUSED) or name in (".", "..")):
        raise ConfigError(f"invalid value for run_name: {name!r}; a run name is one directory name under runs/ "
                          "(no '/', '\\', '.' or '..'): to place a run elsewhere set run_dir=PATH")


def _model_dtype(dtype: str) -> None:
    """not float16"""
    if dtype == "float16":
        raise ConfigError(FLOAT16_TRAINING)


def _lora_modules(modules: Any) -> None:
    """a non-empty list of layer names"""
    names = list(modules)
    if not names or any(not str(name).strip() for name in names):
        raise ConfigError(f"invalid value for model.lora.target_modules: {names!r}; list the names of the "
                          "linear layers to adapt, e.g. [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                          "down_proj]")


RUN = Section(None, (
    Key("algo", Optional[str], "grpo", "preset applied over these defaults (configs/algo/grpo.yaml)",
        "a preset is its paper's recipe, each knob with its source: [presets](algorithms/presets.md), "
        "`rlzoo explain algo=NAME`", explain=True),
    Key("seed", int, 0, "seeds torch, Python and the prompt sampler; CPU runs are bit-reproducible",
        check=_seed, explain=True),
    Key("run_name", Optional[str], None, "default: `<algo>-<task>-s<seed>-<timestamp>`",
        "`run_dir=` places a run elsewhere", check=_run_name, not_explained="names the run's directory"),
    Key("run_dir", Optional[str], None, "default: `runs/<run_name>`",
        "a directory holding another run is refused unless `rlzoo train --overwrite` "
        "([failure and recovery](training.md#a-run-directory-belongs-to-one-run))",
        not_explained="where the run writes"),
    Key("resume", Optional[str], None, "path of a run directory to continue",
        "its `config.yaml` becomes the base layer, its `plugins` load again, and only "
        "[some keys](training.md#what-a-resume-may-change) may differ",
        not_explained="continues a run exactly: what it computes is the saved config's (whose knobs explain lists)"),
    Key("plugins", list[str], [], "extra plugin modules to import, e.g. [my_pkg.my_plugin]",
        "module names (`[my_reward]`, `[my_pkg.plugin]`: importable from the current directory or an installed "
        "package) or `.py` file paths (`[my_reward.py]`, `[lib/rewards.py]`, relative to the current directory)",
        explain=True),
    Key("extensions", list[Any], [], "lifecycle extensions to enable, e.g. [dynamic_sampling]",
        "each a name or a mapping with `name` and parameters",
        explain=True),
))

TASK = Section(None, (
    Key("task", Any, {"name": "sort_digits", "num_digits": 4},
        "the prompts and reference answers (rlzoo list --kind task; docs/training.md says why this one)",
        "every task also takes `instruction`: a template around its prompt (`{question}`, `{format}`; null: the "
        "prompt unchanged), recorded with the task's parameters "
        "([tasks.md](tasks.md#instructions-system-prompts-and-answer-formats))", explain=True),
    Key("reward", Any, None,
        "null: the task's own reward function; [a, {name: b, weight: 0.5}]: several",
        "trained on their weighted sum ([tasks.md](tasks.md#rewards-one-or-several))", explain=True),
    Key("answer_format", Any, "plain",
        "where a completion's answer is: plain (all of it), answer_tag, boxed, last_number, exact_line",
        "for rewards that read `answers`, the `{format}` hint and `eval/strict_accuracy` "
        "([tasks.md](tasks.md#instructions-system-prompts-and-answer-formats))", old="plain"),
), explain=True)

MODEL = Section("model", (
    Key("path", Optional[str], None, "a local Hugging Face model directory; null builds the embedded tiny model"),
    Key("arch", str, "qwen2", "architecture of the embedded model", choices=("qwen2", "llama")),
    Key("hidden_size", int, 64, "embedded model: width of the residual stream", range="> 0"),
    Key("intermediate_size", int, 256, "embedded model: width of the MLP", range="> 0"),
    Key("num_layers", int, 2, "embedded model: transformer blocks", range="> 0"),
    Key("num_heads", int, 4, "embedded model: attention heads", range="> 0"),
    Key("num_kv_heads", int, 2, "embedded model: key/value heads (grouped-query attention)", range="> 0"),
    Key("dtype", str, "float32", "the weights' dtype (float16 is refused: rollout.dtype=float16 generates in it)",
        "AdamW on float16 weights turns most of them NaN in one step", choices=("float32", "bfloat16"),
        check=_model_dtype),
    Key("gradient_checkpointing", bool, False, "recompute activations in backward (memory for time)",
        explain=False, not_explained="recomputes the same activations in backward: memory for time"),
    Key("chat_template", Optional[bool], None,
        "null: prompts become a user turn when the tokenizer has a chat template; true | false",
        "`true` is an error for a tokenizer without one"),
    Key("system_prompt", Optional[str], None,
        "a system turn before every prompt (in the chat template; plain text without one)",
        "without a chat template, the system prompt and the prompt joined by a blank line; training, evaluation "
        "and `rlzoo sft` alike", old=None),
    Section("lora", (
        Key("rank", int, 0, "0: train every weight; r > 0: train rank-r adapters on frozen base weights",
            "through peft (`pip install -e \".[lora]\"`; refused at config time without peft, and above the model's "
            "`hidden_size` or, when the model is built, above every adapted layer's width: a layer's update has rank "
            "at most min(inputs, outputs)). The KL reference is then the policy with its adapters disabled, not a "
            "second copy; checkpoints hold the adapters; "
            "`rlzoo export RUN_DIR OUT` merges them ([training.md](training.md#lora))", range=">= 0", old=0),
        Key("alpha", float, 16.0, "the adapters' product is scaled by alpha / rank", range="> 0",
            why="the adapters' product is scaled by alpha / rank", old=16.0),
        Key("dropout", float, 0.0, "dropout on the adapters' input while training", range="[0, 1)", old=0.0,
            detail="> 0: the update's log-probs are a thinned policy's (the plan warns; the model's own dropout is "
                   "always off)"),
        Key("target_modules", list[str], LORA_MODULES, "the linear layers that get adapters (llama/qwen2-style names)",
            "a name that matches no layer, or one of the embeddings, is refused with the model's linear-layer names",
            check=_lora_modules, old=LORA_MODULES),
    ), doc="LoRA adapters through peft (pip install 'rlzoo[lora]'); see docs/training.md, \"LoRA\""),
), explain=True)

ROLLOUT = Section("rollout", (
    Key("prompts_per_step", int, 16, "prompts (groups) per step", range="> 0"),
    Key("n", int, 8, "completions per prompt (a group)", range="> 0"),
    Key("max_new_tokens", int, 7, "response budget in tokens", "also T_max of `seq-mean-token-sum-norm`",
        range="> 0"),
    Key("temperature", float, 1.0, "log-probs for training are taken under logits / temperature too",
        "old, new, reference and entropy alike, as verl and TRL do", range="> 0"),
    Key("top_p", float, 1.0, "nucleus sampling: the smallest set of tokens holding this much probability",
        range="(0, 1]"),
    Key("backend", Any, "hf", "rollout backend (rlzoo list --kind rollout)",
        "`hf`: transformers with a KV cache; `vllm`: a vLLM engine in its own process "
        "([training.md](training.md#rollout-engines))"),
    Key("dtype", Optional[str], None,
        "null: generate with the policy itself; float32 | bfloat16 | float16: a copy in that dtype",
        "the copy is synced after each update (a vLLM-style bf16 rollout beside the trainer)",
        choices=(None, "float32", "bfloat16", "float16")),
    Key("record", bool, False, "true: store each step's batch in rollouts/ (for rlzoo ab)"),
    Key("staleness", int, 0, "k > 0: step t trains on rollouts of the policy of step t-k (off-policy study)",
        "from a queue that checkpoints and resumes exactly "
        "([training.md](training.md#off-policy-data-bounded-staleness))", range=">= 0", old=0),
    Key("mode", str, "sync",
        "async: a separate process generates and scores while the trainer updates (not bit-reproducible)",
        "with its own copy of the policy ([training.md](training.md#asynchronous-rollout))",
        choices=("sync", "async"), old="sync"),
    Key("weight_sync_every", int, 1, "async: the generator receives the newest weights after every N-th step",
        range="> 0", old=1),
    Key("max_staleness", int, 2, "async: the bound on a batch's age in policy versions when a step trains on it",
        "with `stale_batches=drop`, at least `weight_sync_every − 1`", range=">= 0", old=2),
    Key("stale_batches", str, "drop",
        "async: a batch beyond max_staleness is dropped, or kept (keep) for rollout_correction to weight",
        choices=("drop", "keep"), old="drop"),
    Key("queue_size", int, 1, "async: scored batches that may wait for the trainer", range="> 0", old=1),
    Key("generator_timeout_s", float, 1800.0,
        "async: the run fails when the generator, alive, sends no batch for this many seconds",
        "a hung generator (a deadlocked reward function, a stuck tool) would otherwise hold the "
        "trainer forever; the newest checkpoint stays resumable. Raise it for rollouts slower than that",
        range="> 0", old=1800.0),
    Key("max_turns", int, 4, "with env: policy turns per episode at most (max_new_tokens bounds the whole episode)",
        range="> 0", old=4),
    Key("max_turn_tokens", int, 16, "with env: tokens per policy turn at most", range="> 0", old=16),
), explain=True)
