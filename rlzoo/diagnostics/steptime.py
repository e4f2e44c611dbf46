"""The pre-flight step time: per phase, what the model's layers cost on this machine, now,
plus the roofline of what a stand-in does not have (the vocabulary head, the optimizer
state of the embedding).

The layers are timed on a stand-in: a randomly initialised model of the policy's
architecture with its widths (hidden, heads, key/value heads, MLP) but a 64-token
vocabulary, with one and with two layers, at the run's own shapes: a rollout of its prompts
x ``rollout.n`` completions through rlzoo's decode loop, a no-grad forward and a training
forward + backward of one micro-batch through rlzoo's log-prob head, and an AdamW step.
The two-layer time less the one-layer time is the cost of a layer; the rest is the cost of
a call (embedding, head, Python). Timing the real widths catches what a FLOP count misses on
small models: elementwise work, memory traffic and dispatch.

The vocabulary head and the embedding's optimizer state are what the stand-in lacks; they
come from :mod:`rlzoo.diagnostics.roofline`: the head's matmul FLOPs at the measured matmul
rate, its weights streamed once per decode step and its log-softmax read and written a few
times per pass at the measured bandwidth, AdamW's bytes for the embedding.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlzoo.diagnostics.roofline import ADAMW_BYTES_PER_PARAM, DTYPE_BYTES, ModelShapes
from rlzoo.models.logprobs import ResponseForward
from rlzoo.core.dtypes import DTYPES
from rlzoo.plan.records import RunPlan
from rlzoo.models.decode import generate

STAND_IN_VOCAB = 64
DECODE_STEPS = (2, 10)
"""Decode lengths timed: their difference gives the cost of a decode step, the rest that of the prefill."""
SOFTMAX_PASSES = 4
"""Reads and writes of a (tokens, vocabulary) float32 array per head pass (logits, log-softmax,
the gathered log-probs and entropy); backward doubles them."""


@dataclass(frozen=True)
class LayerCosts:
    """Seconds on the stand-in: a rollout's prefill (per call, per layer) and decode step (per
    call, per layer); a no-grad forward of a micro-batch; a training forward + backward of one;
    an AdamW step."""

    prefill_call: float
    prefill_layer: float
    decode_call: float
    decode_layer: float
    forward_call: float
    forward_layer: float
    train_call: float
    train_layer: float
    adam_call: float
    adam_layer: float
    scaled: str = ""
    """How the timed shapes were cut down (empty: the run's own shapes), for the notes."""


def stand_in(config: Any, shapes: ModelShapes, arch: str, layers: int) -> Any:
    """A random model of the policy's architecture and widths with ``layers`` layers and a
    :data:`STAND_IN_VOCAB`-token vocabulary (``config``: the policy's transformers config, or
    ``None`` for the embedded ``arch``)."""
    if config is None:
        classes = (Qwen2Config, Qwen2ForCausalLM) if arch == "qwen2" else (LlamaConfig, LlamaForCausalLM)
        return classes[1](classes[0](hidden_size=shapes.hidden, intermediate_size=shapes.intermediate,
                                     num_hidden_layers=layers, num_attention_heads=shapes.heads,
                                     num_key_value_heads=shapes.kv_heads, vocab_size=STAND_IN_VOCAB,
                                     max_position_embeddings=4096, tie_word_embeddings=True))
    values = config.to_dict()
    per_layer = {key: value[:layers] for key, value in values.items()  # e.g. qwen2's layer_types
                 if isinstance(value, list) and len(value) == config.num_hidden_layers}
    values = {**values, **per_layer, "num_hidden_layers": layers, "vocab_size": STAND_IN_VOCAB}
    for key in ("quantization_config", "bos_token_id", "eos_token_id", "pad_token_id"):
        values.pop(key, None)
    return AutoModelForCausalLM.from_config(type(config).from_dict(values))


def _best(call: Any, repeats: int = 3) -> float:
    """The fastest of ``repeats`` timed calls of ``call`` after one warm-up call (seconds)."""
    call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


@dataclass(frozen=True)
class TimedShapes:
    """The shapes a stand-in is timed at: the run's, cut to at most :data:`MAX_DECODE_ROWS`
    sequences per rollout and :data:`MAX_TRAIN_TOKENS` tokens per micro-batch (the times are
    then scaled up by the share cut: linear in sequences and tokens), so that timing takes
    seconds whatever the run's size.

    :ivar groups: prompts per rollout; :ivar n: completions per prompt; :ivar micro: sequences
        per micro-batch; :ivar new: response tokens of a micro-batch's sequences;
    :ivar decode_scale: / :ivar train_scale: the run's work over the timed work.
    """

    groups: int
    n: int
    micro: int
    new: int
    decode_scale: float
    train_scale: float

    @classmethod
    def of(cls, plan: RunPlan, prompt: int, micro: int) -> "TimedShapes":
        groups, n, new = plan.rollout.prompts_per_process, plan.rollout.n, plan.rollout.max_new_tokens
        timed_n = min(n, MAX_DECODE_ROWS)
        timed_groups = max(1, min(groups, MAX_DECODE_ROWS // timed_n))
        timed_new = max(1, min(new, MAX_TRAIN_TOKENS // 2))
        timed_micro = max(1, min(micro, MAX_TRAIN_TOKENS // (prompt + timed_new)))
        return cls(timed_groups, timed_n, timed_micro, timed_new, groups * n / (timed_groups * timed_n),
                   micro * (prompt + new) / (timed_micro * (prompt + timed_new)))


MAX_DECODE_ROWS = 512
"""The most sequences a stand-in's rollout is timed with (:class:`TimedShapes`)."""
MAX_TRAIN_TOKENS = 16384
"""The most tokens a stand-in's micro-batch is timed with (:class:`TimedShapes`)."""


def _time_layers(model: Any, plan: RunPlan, dtype: str, prompt: int, timed: TimedShapes) -> list[float]:
    """Prefill, decode step, forward, training step and AdamW step of one stand-in (seconds)."""
    new, groups, micro = timed.new, timed.groups, timed.micro
    model = model.to(DTYPES[dtype])
    ids = torch.randint(4, STAND_IN_VOCAB, (groups, prompt))
    mask = torch.ones_like(ids)
    sampler = model if plan.rollout.dtype == dtype else model.to(DTYPES[plan.rollout.dtype])
    sampler.eval()

    def sample(steps: int) -> float:
        return _best(lambda: generate(sampler, ids, mask, max_new_tokens=steps, eos_id=-1, pad_id=0,
                                      num_samples=timed.n))

    short, long = (sample(steps) for steps in DECODE_STEPS)
    step = (long - short) / (DECODE_STEPS[1] - DECODE_STEPS[0])
    if step <= 0:  # below the timer's resolution: no prefill, the whole short rollout counts as decode
        step = short / DECODE_STEPS[0]
    prefill = max(0.0, short - DECODE_STEPS[0] * step)
    model = model.to(DTYPES[dtype])
    batch = torch.randint(4, STAND_IN_VOCAB, (micro, prompt))
    response = torch.randint(4, STAND_IN_VOCAB, (micro, new))
    response_mask = torch.ones_like(response, dtype=torch.float)
    forward = ResponseForward(model)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if plan.precision == "bf16" else \
        contextlib.nullcontext
    model.eval()
    with torch.no_grad(), autocast():
        plain = _best(lambda: forward(batch, torch.ones_like(batch), response, response_mask))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-9)

    def train() -> None:
        with autocast():
            out = forward(batch, torch.ones_like(batch), response, response_mask, with_entropy=True)
        out[0].sum().backward()

    return [prefill, step, plain, _best(train), _best(optimizer.step)]


def measure(config: Any, shapes: ModelShapes, arch: str, plan: RunPlan, dtype: str, prompt: int, micro: int,
            threads: int) -> LayerCosts:
    """:class:`LayerCosts` of the run's shapes on stand-ins of one and two layers
    (``prompt``: the padded prompt width; ``micro``: sequences per micro-batch)."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    timed = TimedShapes.of(plan, prompt, micro)
    one, two = (_time_layers(stand_in(config, shapes, arch, layers), plan, dtype, prompt, timed) for layers in (1, 2))
    # a second layer timed no slower than one (noise): half of the one-layer time each, never 0
    layer = [b - a if b > a else a / 2 for a, b in zip(one, two)]
    call = [max(a - per, 0.0) for a, per in zip(one, layer)]
    scale = [timed.decode_scale] * 2 + [timed.train_scale] * 2 + [1.0]
    costs = [value * factor for pair, factor in zip(zip(call, layer), scale) for value in pair]
    cut = []
    if timed.decode_scale > 1:
        cut.append(f"rollout timed with {timed.groups * timed.n} sequences")
    if timed.train_scale > 1:
        cut.append(f"micro-batch timed with {timed.micro} x {prompt + timed.new} tokens")
    return LayerCosts(*costs, scaled=f"; {', '.join(cut)}, scaled up" if cut else "")


def step_seconds(plan: RunPlan, shapes: ModelShapes, costs: LayerCosts, rates: dict[str, float],
                 bandwidth: float, micro: int | None = None) -> dict[str, float]:
    """Estimated seconds per phase of one step: ``costs`` for the plan's calls, plus the
    vocabulary head and the embedding's optimizer bytes at ``rates`` (one dtype's
    :func:`rlzoo.diagnostics.roofline.matmul_rates`) and ``bandwidth`` (bytes/s). ``micro``:
    sequences per micro-batch, the size ``costs`` were timed at (default
    ``trainer.micro_batch_size``; :func:`rlzoo.diagnostics.preflight.micro_batch`)."""
    u, L = plan.update, shapes.layers
    sequences, new = u.sequences_per_process, plan.rollout.max_new_tokens
    head_flops = 2 * shapes.head_weights * sequences * new                     # logits of every response token
    softmax = SOFTMAX_PASSES * sequences * new * shapes.vocab * 4 / bandwidth  # bytes of one pass over them
    head = head_flops / rates["update/head"] + softmax
    decode_head = max(2 * shapes.head_weights * sequences / rates["decode/head"],
                      shapes.head_weights * DTYPE_BYTES.get(plan.rollout.dtype, 2) / bandwidth)
    micro = micro or u.micro_batch_size                                         # sequences per micro-batch
    passes = -(-sequences // max(1, micro))
    forward = passes * (costs.forward_call + L * costs.forward_layer) + head
    per_mini = max(1, sequences // u.mini_batches)
    micro_steps = u.mini_batches * -(-per_mini // max(1, micro))
    update = u.epochs * (micro_steps * (costs.train_call + L * costs.train_layer) + 3 * head)
    embedding = shapes.head_weights * (1 if shapes.tied else 2)
    optimizer = u.optimizer_steps * (costs.adam_call + L * costs.adam_layer)
    if plan.lora is None:
        optimizer += u.optimizer_steps * ADAMW_BYTES_PER_PARAM * embedding / bandwidth
    seconds = {"rollout": costs.prefill_call + L * costs.prefill_layer
               + new * (costs.decode_call + L * costs.decode_layer + decode_head)}
    if "greedy" in plan.passes:
        seconds["greedy rollout"] = seconds["rollout"] / max(1, plan.rollout.n)
    for name in ("old_logp", "ref_logp", "teacher_logp"):
        if plan.runs(name):
            seconds[name.replace("_logp", " log-probs")] = forward
    seconds["update"] = update
    seconds["optimizer"] = optimizer
    if "critic" in plan.models:  # a values pass and its own update, costed as the policy's
        seconds["critic"] = forward - head + update - u.epochs * 3 * head + optimizer
    return seconds
