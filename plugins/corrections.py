"""Rollout corrections: reweight the per-token policy loss for the gap between μ, the
distribution the rollout backend sampled from (a bf16 copy, vLLM, a stale policy), and the
policy being trained.

Formulas: ../docs/algorithms/corrections.md. Notation, per sampled token of a ``(B, T)``
batch: ``x = old_logp − rollout_logp = log(π_old/μ)``, clamped to ±20, and ``r = exp(x)``.
Every correction returns ``(weights, metrics)``: detached ``(B, T)`` weights that multiply
the per-token policy loss (0 drops a token; it stays in the aggregation's denominator, as
in verl's IS weights, slime and NeMo-RL) and scalar metrics over the valid tokens. Padding
gets weight 0 and never influences a valid weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from rlzoo import hookimpl
from rlzoo.masked import masked_mean, masked_sum

RLZOO_API_VERSION = "2"

LOG_RATIO_CLAMP = 20.0

Metrics = dict[str, torch.Tensor]


def _log_ratio(old_logp: torch.Tensor, rollout_logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """x = log(π_old/μ) per token, clamped to ±20, 0 on padding; detached."""
    x = (old_logp - rollout_logp).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.where(valid, x, torch.zeros_like(x))


def _metrics(weights: torch.Tensor, dropped: torch.Tensor, mask: torch.Tensor, **extra: torch.Tensor) -> Metrics:
    return {"weight_mean": masked_mean(weights, mask).detach(),
            "dropped_frac": masked_mean(dropped.to(mask.dtype), mask).detach(), **extra}


def none(response_mask: torch.Tensor) -> tuple[torch.Tensor, Metrics]:
    """No correction: weight 1 on every valid token."""
    return response_mask.detach().to(torch.float32).clone(), {}


@dataclass
class TISParams:
    """Parameters of ``tis``."""

    cap: float = 2.0
    """C: the weight min(π_old/μ, C); > 0 (verl's rollout_is_threshold, slime's --tis-clip, SkyRL)."""

    def __post_init__(self) -> None:
        if not self.cap > 0:
            raise ValueError(f"cap must be > 0, got {self.cap}")


def tis(old_logp: torch.Tensor, rollout_logp: torch.Tensor, response_mask: torch.Tensor,
        params: Optional[TISParams] = None) -> tuple[torch.Tensor, Metrics]:
    """Token-level truncated importance sampling: w = min(π_old/μ, C).

    Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
    training"; verl ``compute_rollout_correction_weights`` (rollout_is=token). Tensors
    ``(B, T)``.

    :return: weights ``(B, T)``; metrics ``weight_mean``, ``dropped_frac`` (0), and
        ``truncated_frac`` (share of valid tokens whose ratio exceeded C).
    """
    params = params or TISParams()
    valid = response_mask.bool()
    ratio = torch.exp(_log_ratio(old_logp, rollout_logp, valid))
    weights = torch.where(valid, ratio.clamp(max=params.cap), torch.zeros_like(ratio))
    mask = valid.to(weights.dtype)
    return weights, _metrics(weights, torch.zeros_like(valid), mask,
                             truncated_frac=masked_mean((ratio > params.cap).to(mask.dtype), mask).detach())


@dataclass
class IcePopParams:
    """Parameters of ``icepop``: the band [low, high] of π_old/μ a token must lie in."""

    low: float = 0.5
    """α: tokens with π_old/μ < α get weight 0; in (0, high)."""
    high: float = 5.0
    """β: tokens with π_old/μ > β get weight 0 (verl's IcePop presets: 0.5 / 5)."""

    def __post_init__(self) -> None:
        if not 0 < self.low < self.high:
            raise ValueError(f"need 0 < low < high, got low={self.low}, high={self.high}")


def icepop(old_logp: torch.Tensor, rollout_logp: torch.Tensor, response_mask: torch.Tensor,
           params: Optional[IcePopParams] = None) -> tuple[torch.Tensor, Metrics]:
    """Token-level masked importance sampling: w = π_old/μ inside [α, β], 0 outside.

    IcePop (Ring-1T); verl ``rollout_is_threshold="lower_upper"``, slime
    ``icepop_function``, NeMo-RL ``"icepop"``. Tensors ``(B, T)``.

    :return: weights ``(B, T)``; metrics ``weight_mean``, ``dropped_frac`` (share of valid
        tokens outside the band).
    """
    params = params or IcePopParams()
    valid = response_mask.bool()
    ratio = torch.exp(_log_ratio(old_logp, rollout_logp, valid))
    inside = (ratio >= params.low) & (ratio <= params.high)
    weights = torch.where(valid & inside, ratio, torch.zeros_like(ratio))
    return weights, _metrics(weights, valid & ~inside, valid.to(weights.dtype))


SEQ_IS_DEFAULTS = {"geometric": (0.999, 1.001), "product": (0.5, 2.0)}
"""Aggregate -> default [low, high]: verl's geometric rejection presets (and NeMo-RL's
0.999–1.002, SkyRL's 0.99–1.01); SkyRL's product mask and verl's seq_sum_k1 "0.5_2.0"."""


@dataclass
class SeqISMaskParams:
    """Parameters of ``seq_is_mask``."""

    aggregate: str = "geometric"
    """``geometric``: the sequence ratio is exp(mean_t log(π_old/μ)) (verl, SkyRL, NeMo-RL);
    ``product``: exp(Σ_t log(π_old/μ)) (TRL)."""
    low: Optional[float] = None
    """Sequences whose ratio is below this are dropped; None: 0.999 (geometric) / 0.5 (product)."""
    high: Optional[float] = None
    """Sequences whose ratio is above this are dropped; None: 1.001 (geometric) / 2.0 (product)."""

    def __post_init__(self) -> None:
        if self.aggregate not in SEQ_IS_DEFAULTS:
            raise ValueError(f"aggregate must be one of {', '.join(SEQ_IS_DEFAULTS)}, got {self.aggregate!r}")
        low, high = self.bounds()
        if not 0 < low < high:
            raise ValueError(f"need 0 < low < high, got low={low}, high={high}")

    def bounds(self) -> tuple[float, float]:
        low, high = SEQ_IS_DEFAULTS[self.aggregate]
        return (self.low if self.low is not None else low, self.high if self.high is not None else high)


def seq_is_mask(old_logp: torch.Tensor, rollout_logp: torch.Tensor, response_mask: torch.Tensor,
                params: Optional[SeqISMaskParams] = None) -> tuple[torch.Tensor, Metrics]:
    """Sequence-level rejection: drop (weight 0) every token of a sequence whose ratio
    ρ_i = exp(mean_t x) (geometric) or exp(Σ_t x) (product) lies outside [low, high];
    weight 1 elsewhere. Computed in log space: log(low) ≤ log ρ_i ≤ log(high).

    verl ``compute_rollout_rejection_mask`` (seq_mean_k1 / seq_sum_k1; note verl bounds the
    reciprocal ratio μ/π_old, which differs only for bounds that are not reciprocal-
    symmetric), SkyRL ``compute_sequence_mask``, NeMo-RL ``seq-mask-tis``, TRL
    ``sequence_mask`` (which keeps the ratio as the weight). Tensors ``(B, T)``.

    :return: weights ``(B, T)``; metrics ``weight_mean``, ``dropped_frac`` (share of valid
        tokens dropped), ``dropped_seq_frac`` (share of non-empty sequences dropped).
    """
    params = params or SeqISMaskParams()
    valid = response_mask.bool()
    mask = valid.to(torch.float32)
    x = _log_ratio(old_logp, rollout_logp, valid)
    log_ratio = masked_mean(x, mask, dim=-1) if params.aggregate == "geometric" else masked_sum(x, mask, dim=-1)
    low, high = params.bounds()
    keep = (log_ratio >= math.log(low)) & (log_ratio <= math.log(high))                    # (B,)
    weights = (keep.unsqueeze(-1) & valid).to(torch.float32)
    non_empty = (mask.sum(-1) > 0).to(torch.float32)
    return weights, _metrics(weights, valid & ~keep.unsqueeze(-1), mask,
                             dropped_seq_frac=masked_mean((~keep).to(torch.float32), non_empty).detach())


@dataclass
class OPMaskParams:
    """Parameters of ``opmask``."""

    delta: float = 1e-4
    """δ: a negative-advantage sequence whose mean log(μ/π) exceeds it is dropped; > 0
    (slime's --opsm-delta default; the DeepSeek-V3.2 report gives no value, TRL's docs
    suggest starting at 0.5)."""

    def __post_init__(self) -> None:
        if not self.delta > 0:
            raise ValueError(f"delta must be > 0, got {self.delta}")


def opmask(logp: torch.Tensor, rollout_logp: torch.Tensor, advantages: torch.Tensor,
           response_mask: torch.Tensor, params: Optional[OPMaskParams] = None) -> tuple[torch.Tensor, Metrics]:
    """Off-policy sequence masking (DeepSeek-V3.2): drop a sequence when its advantage is
    negative and KL(μ‖π) > δ, estimated as the mean over its tokens of
    log μ − log π (k1, π the policy being trained, detached).

    The report's rule as TRL ``get_off_policy_mask`` and slime ``compute_opsm_mask``
    implement it, against the rollout's μ. Tensors ``(B, T)``.

    :return: weights ``(B, T)`` (0 or 1); metrics ``weight_mean``, ``dropped_frac``,
        ``dropped_seq_frac``.
    """
    params = params or OPMaskParams()
    valid = response_mask.bool()
    mask = valid.to(torch.float32)
    kl = masked_mean(torch.where(valid, (rollout_logp - logp).detach(), torch.zeros_like(logp)), mask, dim=-1)
    negative = masked_mean(torch.where(valid, advantages.detach(), torch.zeros_like(advantages)), mask, dim=-1) < 0
    drop = negative & (kl > params.delta)                                                   # (B,)
    weights = (valid & ~drop.unsqueeze(-1)).to(torch.float32)
    non_empty = (mask.sum(-1) > 0).to(torch.float32)
    return weights, _metrics(weights, valid & drop.unsqueeze(-1), mask,
                             dropped_seq_frac=masked_mean(drop.to(torch.float32), non_empty).detach())


@hookimpl
def rlzoo_register_rollout_corrections(register) -> None:
    register("none", none, description="no correction (weight 1)")
    register("tis", tis, params=TISParams, paper="Yao et al. 2025 (TIS)",
             description="token-level truncated IS: w = min(π_old/μ, C)")
    register("icepop", icepop, params=IcePopParams,
             description="token-level masked IS: w = π_old/μ inside [α, β], else 0 (IcePop, Ring-1T)")
    register("seq_is_mask", seq_is_mask, params=SeqISMaskParams,
             description="drop sequences whose (geometric or product) ratio π_old/μ is outside [low, high]")
    register("opmask", opmask, params=OPMaskParams,
             description="drop a sequence with A < 0 and KL(μ‖π) > δ (DeepSeek-V3.2 off-policy masking)")
