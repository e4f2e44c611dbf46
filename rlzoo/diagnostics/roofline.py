"""The roofline of a GRPO step: the least time this machine needs for the step's work.

Used by ``rlzoo doctor --plan`` (:mod:`rlzoo.diagnostics.preflight`: the estimated step time
per phase) and by ``benchmarks/compare_trl.py`` (the ``roofline s`` and ``vs roofline``
columns, and the phases of the smollm2 profile). Notation: ``G`` prompts per step, ``B = G × n`` sequences, ``P`` prompt
tokens (the mean over the prompt pool), ``T`` new tokens per sequence (the step's mean),
``S`` decode steps (the step's longest completion: the decode loop runs until it ends);
the model's hidden size ``d``, ``L`` layers, MLP width ``f``, query width
``q = heads × head_dim`` (``d`` unless the config says otherwise), key/value width
``k = kv_heads × head_dim``, vocabulary ``V``.

FLOPs (2 per multiply-add; only matmuls are counted):

- weights a token goes through: backbone ``W_b = L (2dq + 2dk + 3df)`` (q and o, k and v,
  gate, up and down), head ``W_h = dV`` (only where logits are needed: response tokens);
  attention ``4Lq`` per (query, key) pair (QKᵀ and AV);
- **prefill**: ``2 W_b G P`` (each prompt once for its group) + attention over ``G P (P+1)/2`` pairs;
- **decode**: ``2 (W_b + W_h) B T`` + attention over ``B T (P + (T+1)/2)`` pairs;
- **reference** (KL > 0) and **old pass** (when the plan has one): one forward,
  ``2 W_b B (P+T) + 2 W_h B T`` + attention over ``B (P+T)(P+T+1)/2`` pairs;
- **update**: forward + backward, 3 × the forward.

Bytes (what must cross the memory bus, at bandwidth ``BW``):

- **decode**: every weight once per decode step, ``S (W_b + W_h) e`` with ``e`` the bytes of
  the precision's element (4 float32, 2 bfloat16; the tied embedding is the head and counts
  once), plus the KV cache read at every step: ``Σ_{t=1..S} 2Lk (G P + B t) e`` (a group's
  prompt cache shared by its sequences);
- **optimizer**: AdamW reads parameter, gradient and both moments and writes parameter and
  moments, ``7 × 4 N`` bytes for ``N`` float32 master weights (the same in bf16 mixed
  precision, whose master weights stay float32).

The roofline of a phase is ``max(FLOPs / rate, bytes / BW)`` with ``rate`` the matmul rate of
the phase's shapes measured on this machine (:func:`matmul_rates`: ``M = B`` rows for decode,
``M = B (P+T)`` for the others, attention at the backbone's rate) and ``BW`` the memory
bandwidth measured with it (:func:`memory_bandwidth`); the step's roofline is the sum over
phases. Prefill, the passes and the update have no byte term (their weights are read a few
times per micro-batch of hundreds of tokens: FLOP-bound), the optimizer no FLOP term.
Decode is where the byte term matters: at ``B = 32`` rows each weight read does 64 FLOPs, far
below this CPU's ratio of matmul rate to bandwidth, so a FLOP-only limit (issue 16's) is out
of reach for any implementation of a memory-bound decode.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
ADAMW_BYTES_PER_PARAM = 7 * 4
"""AdamW over float32 master weights: reads parameter, gradient and both moments, writes parameter and moments."""


@dataclass(frozen=True)
class ModelShapes:
    """The shapes of a llama/qwen2-style decoder that set its FLOPs and bytes."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool = True
    head_dim: int | None = None  # None: hidden // heads

    @property
    def head_width(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def query_width(self) -> int:
        """``q = heads × head_dim``."""
        return self.heads * self.head_width

    @classmethod
    def from_config(cls, config: Any) -> "ModelShapes":
        """From a transformers config object, its ``config.json`` dict, or a model directory."""
        if isinstance(config, (str, Path)):
            config = json.loads((Path(config) / "config.json").read_text())
        get = config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default)
        heads, hidden = int(get("num_attention_heads")), int(get("hidden_size"))
        head_dim = int(get("head_dim") or hidden // heads)
        return cls(hidden=hidden, layers=int(get("num_hidden_layers")), heads=heads,
                   kv_heads=int(get("num_key_value_heads") or heads), intermediate=int(get("intermediate_size")),
                   vocab=int(get("vocab_size")), tied=bool(get("tie_word_embeddings", True)),
                   head_dim=None if head_dim == hidden // heads else head_dim)

    @property
    def kv_width(self) -> int:
        """``k = kv_heads × head_dim``."""
        return self.head_width * self.kv_heads

    @property
    def backbone_weights(self) -> int:
        """Weights of the layers' matmuls a token goes through (``W_b``)."""
        d, q, k, f = self.hidden, self.query_width, self.kv_width, self.intermediate
        return self.layers * (2 * d * q + 2 * d * k + 3 * d * f)

    @property
    def head_weights(self) -> int:
        """``W_h = d V``."""
        return self.hidden * self.vocab

    @property
    def parameters(self) -> int:
        """Trainable parameters (embedding, untied head, the layers' matmuls and norm weights)."""
        embedding = self.head_weights * (1 if self.tied else 2)
        return embedding + self.backbone_weights + (2 * self.layers + 1) * self.hidden


@dataclass(frozen=True)
class StepWork:
    """The token counts of one step (see the module docstring's notation)."""

    groups: int                 # G
    sequences: int              # B
    prompt_tokens: float        # P, mean
    new_tokens: float           # T, mean per sequence
    decode_steps: int           # S
    reference: bool = False     # a reference forward (KL > 0)
    old_pass: bool = False      # an old-log-prob forward


def step_flops(shapes: ModelShapes, work: StepWork) -> dict[str, dict[str, float]]:
    """Matmul FLOPs per phase and kind (``backbone``, ``head``, ``attention``)."""
    wb, wh = shapes.backbone_weights, shapes.head_weights
    G, B, P, T = work.groups, work.sequences, work.prompt_tokens, work.new_tokens
    pairs = 4 * shapes.layers * shapes.query_width                         # FLOPs per (query, key) pair
    forward = {"backbone": 2 * wb * B * (P + T), "head": 2 * wh * B * T,
               "attention": pairs * B * (P + T) * (P + T + 1) / 2}
    phases = {"prefill": {"backbone": 2 * wb * G * P, "head": 0.0, "attention": pairs * G * P * (P + 1) / 2},
              "decode": {"backbone": 2 * wb * B * T, "head": 2 * wh * B * T,
                         "attention": pairs * B * T * (P + (T + 1) / 2)}}
    if work.old_pass:
        phases["old"] = dict(forward)
    if work.reference:
        phases["reference"] = dict(forward)
    phases["update"] = {kind: 3 * flops for kind, flops in forward.items()}
    return phases


def step_bytes(shapes: ModelShapes, work: StepWork, element_bytes: int) -> dict[str, float]:
    """Bytes the decode and optimizer phases must move (the module docstring's formulas)."""
    S, G, B, P = work.decode_steps, work.groups, work.sequences, work.prompt_tokens
    weights = S * (shapes.backbone_weights + shapes.head_weights) * element_bytes
    cache = 2 * shapes.layers * shapes.kv_width * element_bytes * (S * G * P + B * S * (S + 1) / 2)
    return {"decode": weights + cache, "optimizer": ADAMW_BYTES_PER_PARAM * shapes.parameters}


def roofline(shapes: ModelShapes, work: StepWork, rates: dict[str, float], bandwidth: float,
             element_bytes: int) -> dict[str, float]:
    """Seconds per phase: ``max(FLOPs / rate, bytes / bandwidth)``; the step's roofline is
    the sum. ``rates``: one dtype's :func:`matmul_rates`; ``bandwidth`` in bytes/s."""
    seconds: dict[str, float] = {}
    for phase, kinds in step_flops(shapes, work).items():
        shape = "decode" if phase == "decode" else "update"
        seconds[phase] = (kinds["backbone"] / rates[f"{shape}/backbone"] + kinds["head"] / rates[f"{shape}/head"]
                          + kinds["attention"] / rates["update/backbone"])
    for phase, moved in step_bytes(shapes, work, element_bytes).items():
        seconds[phase] = max(seconds.get(phase, 0.0), moved / bandwidth)
    return seconds


# ----------------------------------------------------------------------------- measured rates

MAX_RATE_ROWS = 1024
"""Rows of the largest timed product: the measured rates are flat in M above a few hundred
rows (float32 61 and 53 GFLOP/s at M = 1024 and 4096, bfloat16 7.9 and 7.8, one AVX2 core),
while a full update-shaped bfloat16 head product (M ≈ 3,300) takes 24 s on a CPU without
bfloat16 instructions."""


def machine() -> str:
    """This machine as a benchmark footer names it: CPU model, ISA level torch dispatches
    to and cores, e.g. ``AMD EPYC (x86_64, AVX2, 2 cores)``. The ISA matters: on a CPU with
    AMX bfloat16 matmuls run ~10x faster than float32, without bfloat16 instructions ~7x
    slower, so bf16 rows measured on one say nothing about the other."""
    import os
    import platform

    import torch

    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        model = names[0] if names else model
    return f"{model} ({platform.machine()}, {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores)"


def matmul_rates(shapes: ModelShapes, work: StepWork, threads: int, repeats: int = 3,
                 dtypes: tuple[str, ...] = ("float32", "bfloat16"), max_rows: int = MAX_RATE_ROWS
                 ) -> dict[str, dict[str, float]]:
    """FLOP/s of a linear layer on this machine, now, for the step's shapes: per dtype
    (``float32``, ``bfloat16``), per phase (``decode``: M = B rows; ``update``: M = B (P+T),
    at most ``max_rows``) and kind (``backbone``: d × f, ``head``: d × V); best of
    ``repeats`` calls after one warm-up call. ``dtypes``: the dtypes to time.

    Timed as ``torch.nn.functional.linear`` with an (N, d) weight, the layout of every
    ``nn.Linear`` in the models: on CPUs without bfloat16 instructions ``a @ b`` with a
    (d, N) bfloat16 operand takes another kernel, 25x slower than the models' own."""
    import torch

    torch.set_num_threads(threads)
    d = shapes.hidden
    rows = {"decode": work.sequences, "update": round(work.sequences * (work.prompt_tokens + work.new_tokens))}
    rates: dict[str, dict[str, float]] = {}
    for dtype in (getattr(torch, name) for name in dtypes):
        for phase, m in rows.items():
            m = min(m, max_rows)
            for kind, n in (("backbone", shapes.intermediate), ("head", shapes.vocab)):
                best = linear_seconds(m, n, d, dtype, repeats)
                rates.setdefault(str(dtype).removeprefix("torch."), {})[f"{phase}/{kind}"] = 2 * m * d * n / best
    return rates


def linear_seconds(rows: int, out_features: int, in_features: int, dtype: Any = None, repeats: int = 3) -> float:
    """Best seconds of one ``torch.nn.functional.linear`` of a (``rows``, ``in_features``) input
    by an (``out_features``, ``in_features``) weight of ``dtype`` (default float32), random
    values, over ``repeats`` calls after one warm-up call."""
    import torch

    dtype = dtype or torch.float32
    a, weight = torch.randn(rows, in_features, dtype=dtype), torch.randn(out_features, in_features, dtype=dtype)
    torch.nn.functional.linear(a, weight)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.nn.functional.linear(a, weight)
        best = min(best, time.perf_counter() - start)
    return best


def memory_bandwidth(threads: int, megabytes: int = 256, repeats: int = 5) -> dict[str, float]:
    """Bytes/s of this machine's memory, now: ``read`` (a sum over a float32 array of
    ``megabytes``, far larger than the caches) and ``copy`` (into a second array, bytes read +
    written); best of ``repeats``. The roofline uses the larger: the best the bus gave."""
    import torch

    torch.set_num_threads(threads)
    source = torch.rand(megabytes * 2**20 // 4)
    target = torch.empty_like(source)
    size = source.numel() * 4
    best = {"read": float("inf"), "copy": float("inf")}
    for _ in range(repeats):
        start = time.perf_counter()
        source.sum()
        best["read"] = min(best["read"], time.perf_counter() - start)
        start = time.perf_counter()
        target.copy_(source)
        best["copy"] = min(best["copy"], time.perf_counter() - start)
    return {"read": size / best["read"], "copy": 2 * size / best["copy"]}
