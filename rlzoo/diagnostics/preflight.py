"""Pre-flight: a run's peak memory and step time, estimated from its plan and its model's
config before any of its models is built (``rlzoo doctor --plan``, ``rlzoo config --plan``).

**Memory** (bytes; ``N`` the policy's parameters, ``N_t`` the trained ones: all, or LoRA's
adapters; ``e`` the bytes of ``model.dtype``'s element): the process's resident memory with
the run's libraries imported (measured in this process), then the policy's weights ``N e``,
gradients ``N_t e``, AdamW's two moments ``2 N_t e`` and one moment-sized scratch tensor of its
step; a reference copy ``N e`` (full fine-tuning with KL; LoRA's reference is the same model
with its adapters off); a critic (its own weights, gradients and moments, ``4 N e``); a
rollout copy in ``rollout.dtype``; the KV cache of one rollout ``2 L k B (P_max + T) e_r``
(evaluation generates at most as many sequences at a time); and the larger of the update's
activations and the rollout's sampling buffers. Activations kept for backward, per token of
a micro-batch of ``m`` sequences of ``P_max + T`` tokens and per layer:
``(4d + 5q + 4f) e_a`` (the two norms' inputs and outputs; q, k and v after the GQA repeat,
the attention output and the output projection's input; gate, up, their product and the
activation), ``d e_a`` with gradient checkpointing plus one layer's full set; plus the
log-prob head's kept log-softmax (``trainer.logprob_keep_mb`` at most) and one chunk's
logits. ``e_a`` is 2 under ``trainer.precision=bf16`` autocast, else ``e``.

**Time**: per phase of one step, the cost of the model's layers measured now on a stand-in of
its widths at the run's shapes, plus the roofline of its vocabulary head and embedding
(:mod:`rlzoo.diagnostics.steptime`). Responses are assumed to use the whole
``rollout.max_new_tokens`` budget (an upper bound where they stop earlier); scoring and
bookkeeping outside the model are not counted.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from rlzoo.diagnostics.roofline import DTYPE_BYTES, ModelShapes, StepWork, machine, matmul_rates, memory_bandwidth
from rlzoo.diagnostics.steptime import measure, step_seconds
from rlzoo.core.errors import ConfigError
from rlzoo.models.build import build_char_tokenizer
from rlzoo.models.model_files import GGUF_SUFFIX, check_gguf_path, check_model_dir, load_tokenizer, unreadable_model
from rlzoo.plan.records import RunPlan
from rlzoo.tasks.prompts import PromptFormat
from rlzoo.config.resolved import ResolvedConfig
from rlzoo.tasks.task import Holdout

MIB = 2**20
RATE_ROWS = 256
"""Rows of the largest matmul timed for the head's rate (the rate is flat above a few hundred)."""
PROMPT_SAMPLE = 64
"""Training prompts tokenised for the prompt length (mean and longest)."""
LORA_SHAPES = {"q_proj": ("d", "q"), "k_proj": ("d", "k"), "v_proj": ("d", "k"), "o_proj": ("q", "d"),
               "gate_proj": ("d", "f"), "up_proj": ("d", "f"), "down_proj": ("f", "d")}
"""(in, out) width of each llama/qwen2-style linear layer LoRA may adapt."""


@dataclass(frozen=True)
class MemoryPart:
    """One term of the peak: ``name``, its ``bytes`` and how they were counted."""

    name: str
    bytes: float
    how: str


@dataclass
class Estimate:
    """A run's estimated cost (see the module docstring).

    :ivar parts: the terms of the peak resident memory (bytes), the measured baseline first.
    :ivar available: bytes free on the machine now (``MemAvailable``; the GPU's free memory
        for a CUDA run, whose device terms are then compared with it).
    :ivar device: ``cpu`` or ``cuda``.
    :ivar seconds: estimated seconds per phase of one step.
    :ivar notes: what the estimate rests on (machine, rates, shapes).
    """

    parts: list[MemoryPart]
    available: float
    device: str
    seconds: dict[str, float]
    notes: list[str] = field(default_factory=list)

    @property
    def peak(self) -> float:
        """Estimated peak bytes: the sum of :attr:`parts`."""
        return sum(part.bytes for part in self.parts)

    @property
    def fits(self) -> bool:
        """Whether :attr:`peak` fits in :attr:`available`."""
        return self.peak <= self.available

    def lines(self) -> list[str]:
        """The estimate as ``rlzoo doctor --plan`` and ``rlzoo config --plan`` print it."""
        where = "this machine's available memory" if self.device == "cpu" else "the GPU's free memory"
        verdict = "fits" if self.fits else "DOES NOT FIT"
        lines = [f"pre-flight estimate ({self.device}): peak memory {self.peak / MIB:,.0f} MiB, {verdict} in {where} "
                 f"({self.available / MIB:,.0f} MiB)"]
        lines += [f"  {part.name}: {part.bytes / MIB:,.1f} MiB ({part.how})" for part in self.parts]
        if self.seconds:
            total = sum(self.seconds.values())
            phases = " + ".join(f"{name} {s:.3g}" for name, s in self.seconds.items())
            lines.append(f"  step time: {total:.3g} s = {phases}")
        else:
            lines.append("  step time: not estimated (a run that does not fit is not timed: nothing of its size "
                         "is built)")
        lines += [f"  {note}" for note in self.notes]
        return lines


def load_model_config(path: str | Path) -> tuple[Any, PreTrainedTokenizerBase]:
    """The transformers config and the tokenizer of a local model directory or ``.gguf`` file,
    without its weights, checked as :func:`rlzoo.models.build.load_pretrained` checks them (the same errors), and
    never from the network.

    :raises ConfigError: see :func:`rlzoo.models.build.load_pretrained` and
        :func:`rlzoo.models.build.check_gguf_path`.
    """
    path = Path(path)
    if path.suffix.lower() == GGUF_SUFFIX:
        check_gguf_path(path)
        with unreadable_model(path):
            config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
        return config, tokenizer
    check_model_dir(path)
    with unreadable_model(path):
        return AutoConfig.from_pretrained(str(path), local_files_only=True), load_tokenizer(path)


def model_shapes(resolved: ResolvedConfig, task: Any) -> tuple[ModelShapes, Any, Any]:
    """``(shapes, tokenizer, model config or None)`` of the policy: the embedded tiny model's
    from ``model.*`` and the task's alphabet, a model directory's from its ``config.json``, a
    GGUF file's from its metadata; no weights are loaded."""
    cfg = resolved.cfg
    path = cfg.model.path
    if not path:
        tokenizer = build_char_tokenizer(task.alphabet or "")
        m = cfg.model
        shapes = ModelShapes(hidden=int(m.hidden_size), layers=int(m.num_layers), heads=int(m.num_heads),
                             kv_heads=int(m.num_kv_heads), intermediate=int(m.intermediate_size), vocab=len(tokenizer))
        return shapes, tokenizer, None
    config, tokenizer = load_model_config(path)
    return ModelShapes.from_config(config), tokenizer, config


def prompt_lengths(resolved: ResolvedConfig, task: Any, tokenizer: Any) -> tuple[float, int]:
    """``(mean, longest)`` token count of :data:`PROMPT_SAMPLE` rendered training prompts."""
    examples = task.sample_train(PROMPT_SAMPLE, random.Random(0), Holdout(float(resolved.cfg.eval.holdout)))
    ids = PromptFormat.of(resolved.plan.prompt).encode(examples, tokenizer)
    lengths = [len(i) for i in ids] or [1]
    return sum(lengths) / len(lengths), max(lengths)


def lora_parameters(shapes: ModelShapes, plan: RunPlan) -> int:
    """Parameters of the run's LoRA adapters: ``r (in + out)`` per adapted layer (0 without LoRA)."""
    if plan.lora is None:
        return 0
    width = {"d": shapes.hidden, "q": shapes.query_width, "k": shapes.kv_width, "f": shapes.intermediate}
    per_layer = sum(width[LORA_SHAPES[name][0]] + width[LORA_SHAPES[name][1]]
                    for name in plan.lora.target_modules if name in LORA_SHAPES)
    return plan.lora.rank * per_layer * shapes.layers


def baseline_rss(lora: bool) -> float:
    """Resident bytes of this process now, after importing what a run imports (torch,
    transformers' models, TensorBoard's writer; peft for LoRA)."""
    from torch.utils.tensorboard import SummaryWriter  # noqa: F401

    if lora:
        import peft  # noqa: F401
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return float(line.split()[1]) * 1024
    import resource

    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _memory(device: str, free: bool) -> float:
    """Bytes free now (``free``) or in all: the GPU's for ``cuda``, else ``MemAvailable`` /
    ``MemTotal`` of /proc/meminfo (the physical memory when that file does not exist)."""
    if device == "cuda":
        return float(torch.cuda.mem_get_info()[0 if free else 1])
    meminfo, field = Path("/proc/meminfo"), "MemAvailable:" if free else "MemTotal:"
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith(field):
                return float(line.split()[1]) * 1024
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def available_memory(device: str) -> float:
    """Bytes free now on ``device`` (:func:`_memory`)."""
    return _memory(device, free=True)


def total_memory(device: str) -> float:
    """Bytes ``device`` has in all (:func:`_memory`)."""
    return _memory(device, free=False)


def memory_parts(resolved: ResolvedConfig, shapes: ModelShapes, prompt_max: int, baseline: float,
                 new_tokens: int | None = None) -> list[MemoryPart]:
    """The terms of the peak (module docstring), baseline first; ``new_tokens``: a response
    budget in place of the run's ``rollout.max_new_tokens``."""
    cfg, plan = resolved.cfg, resolved.plan
    new = plan.rollout.max_new_tokens if new_tokens is None else new_tokens
    e = DTYPE_BYTES[str(cfg.model.dtype)]
    n = shapes.parameters
    trained = lora_parameters(shapes, plan) or n
    parts = [MemoryPart("baseline", baseline, "this process with the run's libraries imported, measured"),
             MemoryPart("policy weights", n * e, f"{n:,} parameters x {e} bytes")]
    kind = "LoRA adapters" if plan.lora is not None else "all weights"
    parts += [MemoryPart("gradients", trained * e, f"{trained:,} trained parameters: {kind}"),
              MemoryPart("optimizer", 3 * trained * e, "AdamW's two moments and one moment-sized scratch tensor")]
    if "reference" in plan.models and plan.lora is None:
        parts.append(MemoryPart("reference", n * e, "a frozen copy of the policy"))
    if "critic" in plan.models:
        critic = n - (0 if shapes.tied else shapes.head_weights) + shapes.hidden
        parts.append(MemoryPart("critic", 4 * critic * e, "its weights, gradients and AdamW moments"))
    rollout_e = DTYPE_BYTES.get(str(plan.rollout.dtype), e)
    if "rollout" in plan.models:
        parts.append(MemoryPart("rollout copy", n * rollout_e, f"the policy in {plan.rollout.dtype}"))
    sequences, tokens = plan.update.sequences_per_process, prompt_max + new
    kv = 2 * shapes.layers * shapes.kv_width * sequences * tokens * rollout_e
    parts.append(MemoryPart("KV cache", kv, f"{sequences} sequences x {tokens} tokens"))
    sampling = 3 * sequences * shapes.vocab * 4
    parts.append(MemoryPart("activations", max(activation_bytes(resolved, shapes, prompt_max, new), sampling),
                            f"the update's, micro-batches of {micro_batch(plan, prompt_max, new)} sequences x "
                            f"{tokens} tokens{_budget_note(plan)}"))
    return parts


def micro_batch(plan: RunPlan, prompt_max: int, new_tokens: int | None = None) -> int:
    """Sequences of ``prompt_max + rollout.max_new_tokens`` (or ``new_tokens``) tokens per
    forward/backward of the update: ``trainer.micro_batch_size``, or as many as
    ``trainer.micro_batch_tokens`` holds; at most a mini-batch, at least one."""
    per_mini = max(1, plan.update.sequences_per_process // plan.update.mini_batches)
    budget = plan.update.micro_batch_tokens
    new = plan.rollout.max_new_tokens if new_tokens is None else new_tokens
    size = plan.update.micro_batch_size if budget is None else budget // (prompt_max + new)
    return max(1, min(size, per_mini))


def _budget_note(plan: RunPlan) -> str:
    """What the micro-batch's size comes from, when a token budget sets it."""
    budget = plan.update.micro_batch_tokens
    return "" if budget is None else f" (trainer.micro_batch_tokens={budget}: as many as it holds)"


def activation_bytes(resolved: ResolvedConfig, shapes: ModelShapes, prompt_max: int,
                     new_tokens: int | None = None) -> float:
    """Bytes the update keeps for backward in one micro-batch (module docstring), plus the
    attention mask transformers builds over a packed micro-batch (one byte per pair of its
    positions) unless ``trainer.padding_free=false``; ``new_tokens`` in place of
    ``rollout.max_new_tokens``."""
    cfg, plan = resolved.cfg, resolved.plan
    e = 2 if plan.precision == "bf16" else DTYPE_BYTES[str(cfg.model.dtype)]
    new = plan.rollout.max_new_tokens if new_tokens is None else new_tokens
    m = micro_batch(plan, prompt_max, new)
    tokens = m * (prompt_max + new)
    d, q, f = shapes.hidden, shapes.query_width, shapes.intermediate
    layer = tokens * (4 * d + 5 * q + 4 * f) * e
    kept = tokens * d * e * shapes.layers + layer if cfg.model.gradient_checkpointing else layer * shapes.layers
    head = min(m * new * shapes.vocab * 4, float(cfg.trainer.logprob_keep_mb) * MIB)
    chunk = min(m * new, int(cfg.trainer.logprob_chunk_size)) * shapes.vocab * 4 * 2
    mask = tokens**2 if plan.compute.padding_free is not False else 0
    return kept + head + chunk + mask


@dataclass(frozen=True)
class Sizing:
    """What the memory estimate rests on: the policy's shapes, tokenizer and transformers config
    (``None`` for the embedded model), the rendered prompts' mean and longest length in tokens,
    the measured baseline (bytes) and the device the run computes on."""

    shapes: ModelShapes
    tokenizer: Any
    config: Any
    prompt_mean: float
    prompt_max: int
    baseline: float
    device: str


def sizing(resolved: ResolvedConfig) -> Sizing:
    """The :class:`Sizing` of ``resolved``'s run: builds its task and tokenizer, reads its model's
    config (never its weights, never from the network).

    :raises ConfigError: ``model.path`` is not a model (the line ``rlzoo train`` gives).
    """
    task = resolved.build("task")
    shapes, tokenizer, config = model_shapes(resolved, task)
    prompt_mean, prompt_max = prompt_lengths(resolved, task, tokenizer)
    device = str(resolved.cfg.trainer.device)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return Sizing(shapes, tokenizer, config, prompt_mean, prompt_max, baseline_rss(resolved.plan.lora is not None),
                  device)


def device_parts(resolved: ResolvedConfig, size: Sizing, new_tokens: int | None = None) -> list[MemoryPart]:
    """:func:`memory_parts` of the memory the run's device holds (a CUDA run's host keeps the
    process: its baseline is left out)."""
    parts = memory_parts(resolved, size.shapes, size.prompt_max, size.baseline, new_tokens)
    return parts[1:] if size.device == "cuda" else parts


def largest_budget(resolved: ResolvedConfig, size: Sizing, capacity: float) -> int | None:
    """The largest ``rollout.max_new_tokens`` (at most the run's) whose estimated peak fits in
    ``capacity`` bytes, or ``None`` when not even one token does (arithmetic only: a bisection
    over :func:`device_parts`, which grows with the budget)."""
    def fits(new: int) -> bool:
        return sum(part.bytes for part in device_parts(resolved, size, new)) <= capacity

    low, high = 1, int(resolved.plan.rollout.max_new_tokens)
    if not fits(low):
        return None
    while low < high:  # fits(low) holds
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def what_fits(resolved: ResolvedConfig, size: Sizing, capacity: float) -> str:
    """What to change so that the run fits in ``capacity`` bytes: the largest response budget
    that does, or (when none does) the term that outgrows it."""
    budget = largest_budget(resolved, size, capacity)
    if budget is not None:
        return f"rollout.max_new_tokens={budget} is the largest response budget that fits"
    largest = max(device_parts(resolved, size, 1), key=lambda part: part.bytes)
    return (f"no response budget fits: with one token the {largest.name} alone takes {largest.bytes / MIB:,.0f} MiB "
            f"({largest.how})")


def check_fits(resolved: ResolvedConfig) -> None:
    """Refuse a run that cannot fit this machine at all: its estimated peak (:func:`memory_parts`)
    above the device's whole memory (:func:`total_memory`), before anything is built or written.

    :raises ConfigError: naming the estimate, the memory and what fits (:func:`what_fits`).
    """
    size = sizing(resolved)
    total = total_memory(size.device)
    peak = sum(part.bytes for part in device_parts(resolved, size))
    if peak <= total:
        return
    where = "this machine's memory" if size.device == "cpu" else "the GPU's memory"
    raise ConfigError(f"this run's estimated peak memory, {peak / MIB:,.0f} MiB, exceeds {where} ({total / MIB:,.0f} "
                      f"MiB in all; rlzoo doctor --plan shows the terms): {what_fits(resolved, size, total)}")


def estimate(resolved: ResolvedConfig) -> Estimate:
    """The pre-flight :class:`Estimate` of ``resolved``'s run: builds its task and tokenizer,
    reads its model's config, measures this machine's rates; builds none of its models. A run
    that does not fit is not timed (nothing of its size is built): its notes say what fits."""
    cfg, plan = resolved.cfg, resolved.plan
    size = sizing(resolved)
    shapes, config, prompt_mean, prompt_max, device = (size.shapes, size.config, size.prompt_mean, size.prompt_max,
                                                       size.device)
    parts = device_parts(resolved, size)
    available = available_memory(device)
    new = plan.rollout.max_new_tokens
    notes = [f"model: {shapes.parameters:,} parameters, {shapes.layers} layers, hidden {shapes.hidden}, vocabulary "
             f"{shapes.vocab}; prompts {prompt_mean:.1f} tokens on average, {prompt_max} at most; responses of "
             f"{new} tokens"]
    if sum(part.bytes for part in parts) > available:
        notes.append(what_fits(resolved, size, available))
        return Estimate(parts=parts, available=available, device=device, seconds={}, notes=notes)
    work = StepWork(groups=plan.rollout.prompts_per_process, sequences=plan.update.sequences_per_process,
                    prompt_tokens=prompt_mean, new_tokens=new, decode_steps=new,
                    reference=plan.runs("ref_logp"), old_pass=plan.runs("old_logp"))
    threads = int(cfg.trainer.threads) or torch.get_num_threads()
    dtype = "bfloat16" if plan.precision == "bf16" or str(cfg.model.dtype) == "bfloat16" else "float32"
    rates = matmul_rates(shapes, work, threads, repeats=2, dtypes=(dtype,), max_rows=RATE_ROWS)[dtype]
    bandwidth = max(memory_bandwidth(threads, megabytes=64, repeats=3).values())
    micro = micro_batch(plan, prompt_max)
    costs = measure(config, shapes, str(cfg.model.arch), plan, str(cfg.model.dtype), prompt_max, micro, threads)
    seconds = step_seconds(plan, shapes, costs, rates, bandwidth, micro)
    notes.append(f"rates measured now on {machine()}, {threads} thread(s): matmul {dtype} "
                 f"{rates['update/head'] / 1e9:.0f} GFLOP/s (vocabulary head), memory {bandwidth / 1e9:.1f} GB/s; one "
                 f"layer of this model here: decode step {costs.decode_layer * 1e3:.2g} ms, training micro-batch "
                 f"{costs.train_layer * 1e3:.3g} ms (a stand-in of its widths{costs.scaled})")
    return Estimate(parts=parts, available=available, device=device, seconds=seconds, notes=notes)
