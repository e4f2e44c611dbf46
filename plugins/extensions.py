"""Lifecycle extensions: batch filters, reward shaping and loss-mask modifiers.

Each is a small plugin class registered by name (kind ``extension``) and enabled per run
with ``extensions=[name, {name: other, param: value}]``; the engine registers an instance
with the run's plugin manager so its lifecycle hooks are called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from rlzoo.api import hookimpl, RolloutBatch

RLZOO_API_VERSION = "2"


def _constant_groups(batch: RolloutBatch) -> torch.Tensor:
    """``(B,)`` bool: the sequence's group has all-equal raw scores (zero advantage signal)."""
    groups, inverse = torch.unique(batch.group_ids, return_inverse=True)
    high = torch.full((len(groups),), -torch.inf).scatter_reduce(0, inverse, batch.scores, "amax")
    low = torch.full((len(groups),), torch.inf).scatter_reduce(0, inverse, batch.scores, "amin")
    return (high == low)[inverse]


@dataclass
class DynamicSamplingParams:
    max_rounds: int = 9
    """Extra generation rounds allowed per step to refill the batch (0: only filter). 9 is
    verl's DAPO recipe (``max_num_gen_batches=10`` generation batches in all)."""

    def __post_init__(self) -> None:
        if self.max_rounds < 0:
            raise ValueError(f"max_rounds must be >= 0, got {self.max_rounds}")


class DynamicSampling:
    """DAPO dynamic sampling (arXiv:2503.14476 §3.2): drop groups whose raw scores are all
    equal (they carry no group-relative signal) and refill with fresh groups, up to
    ``max_rounds`` extra rounds; the batch is cut to ``rollout.prompts_per_step`` groups
    (under torchrun each process filters and refills its own share).
    The paper keeps sampling until the batch is full; verl's recipe stops after 10
    generation batches with an error. rlzoo stops after ``max_rounds`` extra rounds and
    trains on the groups it has (logged, so a short batch is visible): a step's time stays
    bounded. Logs ``dynamic_sampling/kept_groups`` (non-constant groups of the first
    round), ``dynamic_sampling/rounds`` and ``dynamic_sampling/short_groups`` (groups
    missing at the end)."""

    def __init__(self, params: Optional[DynamicSamplingParams] = None) -> None:
        self.params = params or DynamicSamplingParams()

    @hookimpl
    def rlzoo_after_rollout(self, batch: RolloutBatch, ctx: Any) -> None:
        wanted = int(ctx.prompts)  # this process's share of rollout.prompts_per_step
        kept = batch.select((~_constant_groups(batch)).nonzero().flatten())
        first_kept = len(torch.unique(kept.group_ids))
        rounds = 0
        while len(torch.unique(kept.group_ids)) < wanted and rounds < self.params.max_rounds:
            rounds += 1
            fresh = ctx.resample(wanted)
            fresh = fresh.select((~_constant_groups(fresh)).nonzero().flatten())
            kept = RolloutBatch.concat([kept, fresh])
        group_order = torch.unique(kept.group_ids, sorted=False)
        keep_groups = set(group_order.tolist()[:wanted]) if len(group_order) > wanted else None
        if keep_groups is not None:
            rows = [i for i, g in enumerate(kept.group_ids.tolist()) if g in keep_groups]
            kept = kept.select(rows)
        ctx.counts["dynamic_sampling/kept_groups"] = float(first_kept)
        ctx.counts["dynamic_sampling/short_groups"] = float(max(0, wanted - len(torch.unique(kept.group_ids))))
        ctx.metrics["dynamic_sampling/rounds"] = float(rounds)
        if len(kept) > 0:  # every group constant even after refills: train on what we have
            batch.copy_from(kept)


@dataclass
class OverlongShapingParams:
    buffer_length: Optional[int] = None
    """L_cache in tokens: the last L_cache tokens before the limit ramp the penalty up;
    None: ``buffer_fraction`` of ``rollout.max_new_tokens``."""
    buffer_fraction: float = 0.2
    """L_cache as a share of L_max when ``buffer_length`` is None, rounded, at least 1
    token: DAPO's 4,096 of 20,480 tokens (§4.1) is 0.2."""
    penalty_factor: float = 1.0
    """Penalty at (and beyond) the length limit."""

    def __post_init__(self) -> None:
        if self.buffer_length is not None and self.buffer_length < 1:
            raise ValueError(f"buffer_length must be >= 1, got {self.buffer_length}")
        if not 0 < self.buffer_fraction <= 1:
            raise ValueError(f"buffer_fraction must be in (0, 1], got {self.buffer_fraction}")
        if self.penalty_factor < 0:
            raise ValueError(f"penalty_factor must be >= 0, got {self.penalty_factor}")

    def buffer(self, max_len: int) -> int:
        """L_cache for a budget of ``max_len`` tokens."""
        return self.buffer_length or max(1, round(self.buffer_fraction * max_len))


class OverlongShaping:
    """DAPO soft overlong punishment (arXiv:2503.14476 eq. 13, verl's DAPO reward manager):
    with L_max = ``rollout.max_new_tokens`` and L_cache the buffer,
    reward += min(0, −(|y| − (L_max − L_cache)) / L_cache) · penalty_factor."""

    def __init__(self, params: Optional[OverlongShapingParams] = None) -> None:
        self.params = params or OverlongShapingParams()

    @hookimpl
    def rlzoo_shape_rewards(self, batch: RolloutBatch, ctx: Any) -> None:
        max_len = int(ctx.cfg.rollout.max_new_tokens)
        buffer = self.params.buffer(max_len)
        exceed = batch.response_lengths - (max_len - buffer)
        penalty = torch.clamp(-exceed / buffer * self.params.penalty_factor, max=0.0)
        batch.rewards = batch.rewards + penalty.to(batch.rewards.dtype)
        ctx.metrics["overlong/penalty_mean"] = float(penalty.mean())


class OverlongFilter:
    """DAPO overlong filtering: truncated completions (no EOS within the budget) are kept
    out of the losses (``loss_mask`` zeroed); they still count in reward metrics."""

    def __init__(self, params: None = None) -> None:
        del params

    @hookimpl
    def rlzoo_before_update(self, batch: RolloutBatch, ctx: Any) -> None:
        batch.loss_mask = batch.loss_mask * (~batch.truncated).to(batch.loss_mask.dtype)[:, None]
        ctx.metrics["overlong/filtered_frac"] = float(batch.truncated.float().mean())


@dataclass
class EntropyTopTokensParams:
    top_ratio: float = 0.2
    """Share of valid tokens (highest rollout-policy entropy) kept in the losses."""

    def __post_init__(self) -> None:
        if not 0 < self.top_ratio <= 1:
            raise ValueError(f"top_ratio must be in (0, 1], got {self.top_ratio}")


class EntropyTopTokens:
    """Keep only the top-ρ entropy quantile of tokens in the losses ("Beyond the 80/20
    rule", arXiv:2506.01939): tokens whose rollout-policy entropy is below the batch's
    (1 − ρ) quantile over valid tokens get ``loss_mask`` 0."""

    def __init__(self, params: Optional[EntropyTopTokensParams] = None) -> None:
        self.params = params or EntropyTopTokensParams()

    @hookimpl
    def rlzoo_before_update(self, batch: RolloutBatch, ctx: Any) -> None:
        valid = batch.loss_mask.bool()
        if not bool(valid.any()):
            return
        threshold = torch.quantile(batch.old_entropy[valid].float(), 1.0 - self.params.top_ratio)
        keep = (batch.old_entropy >= threshold) & valid
        batch.loss_mask = keep.to(batch.loss_mask.dtype)
        ctx.metrics["entropy_top/kept_frac"] = float(keep.sum() / valid.sum())


@hookimpl
def rlzoo_register_extensions(register) -> None:
    register("dynamic_sampling", DynamicSampling, params=DynamicSamplingParams,
             needs=("groups",), description="drop all-equal-score groups and refill (DAPO)",
             paper="arXiv:2503.14476")
    register("overlong_shaping", OverlongShaping, params=OverlongShapingParams,
             description="soft length penalty near max_new_tokens (DAPO)", paper="arXiv:2503.14476")
    register("overlong_filter", OverlongFilter,
             description="mask truncated completions out of the loss (DAPO)", paper="arXiv:2503.14476")
    register("entropy_top_tokens", EntropyTopTokens, params=EntropyTopTokensParams,
             needs=("entropy",), description="train only on the top-rho entropy tokens",
             paper="arXiv:2506.01939")
