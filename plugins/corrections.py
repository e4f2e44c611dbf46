"""Rollout corrections: reweight the per-token policy loss for the gap between μ, the
distribution the rollout backend sampled from (a bf16 copy, vLLM, a stale policy), and the
policy being trained.

Formulas: ../docs/algorithms/corrections.md. Notation, per sampled token of a ``(B, T)``
batch: ``x = old_logp − rollout_logp = log(π_old/μ)``, clamped to ±20, and ``r = exp(x)``.
Every correction returns ``(weights, metrics)``: detached ``(B, T)`` weights that multiply
the per-token policy loss (0 drops a token; it stays in the aggregation's denominator, as
in verl's IS weights, slime and NeMo-RL, unless the correction's ``mode`` is ``mask``:
then the engine removes it from the loss mask, as verl's rejection) and scalar metrics over
the valid tokens. Padding gets weight 0 and never influences a valid weight. Corrections
that read no current-policy ``logp`` are called once per step over the whole batch
(:mod:`rlzoo.learn.correcting`), so their full reductions (a batch normalisation) are over the
whole batch, every process's included; ``rollout_correction=[a, b]`` composes them.

Under ``trainer.old_logp=rollout`` (verl's bypass mode) π_old is μ, and the engine passes the
current policy's log-probs (detached) as ``old_logp`` in each update micro-batch instead, so
the same formulas compare π with μ (verl ``compute_policy_loss_bypass_mode``). The
corrections whose weights are importance ratios (not only 0/1) register with
``importance_weights=True``: the plan warns when they multiply a loss whose ratio already is π/μ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from rlzoo.api import LOG_RATIO_CLAMP, hookimpl, masked_mean, masked_sum
from rlzoo_plugins.loss_parts import Metrics

RLZOO_API_VERSION = "2"


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


MODES = ("weight", "mask")
"""How a rejecting correction drops a token: ``weight`` (weight 0; the token stays in the
aggregation's denominator, rlzoo's convention) or ``mask`` (the engine removes it from
``loss_mask``, so it leaves the denominators of every loss term over that mask, verl's
rejection). The engine reads a correction's ``mode`` parameter; see :mod:`rlzoo.learn.correcting`."""


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


def _normalize(weights: torch.Tensor, mask: torch.Tensor, per_sequence: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's ``rollout_is_batch_normalize``: divide by the mean weight over the valid tokens
    (token level) or over the non-empty sequences (sequence level; their weight is constant
    along the sequence). A full reduction: under the engine's batch statistics it is the mean
    over every process's batch. A mean ≤ 1e-8 leaves the weights as they are (factor 1)."""
    if per_sequence:
        non_empty = (mask.sum(-1) > 0).to(weights.dtype)
        mean = masked_mean(masked_mean(weights, mask, dim=-1), non_empty)
    else:
        mean = masked_mean(weights, mask)
    factor = torch.where(mean > 1e-8, mean, torch.ones_like(mean))
    return weights / factor, factor.detach()


def _cap_below_one(cap: float, ratio: str) -> list[str]:
    """A truncation cap below 1 cuts every weight of data the policy itself generated (ratio 1)."""
    if cap >= 1:
        return []
    return [f"cap={cap:g} < 1 cuts every weight at or above it, on-policy data's ratio of 1 included, so the "
            f"correction scales the loss down rather than truncating large {ratio} (verl's and the TIS paper's C is 2)"]


def _check_truncation(cap: float, clip_min: Optional[float]) -> None:
    """:raises ValueError: unless cap > 0 and clip_min is None or in [0, cap)."""
    if not cap > 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    if clip_min is not None and not 0 <= clip_min < cap:
        raise ValueError(f"need 0 <= clip_min < cap, got clip_min={clip_min}, cap={cap}")


@dataclass
class TISParams:
    """Parameters of ``tis``."""

    cap: float = 2.0
    """C: the weight min(π_old/μ, C); > 0 (verl's rollout_is_threshold, slime's --tis-clip, SkyRL)."""
    clip_min: Optional[float] = None
    """c: two-sided truncation max(c, min(π_old/μ, C)); in [0, cap); null: one-sided (verl's token TIS)."""
    normalize: bool = False
    """Divide the truncated weights by their mean over the batch's valid tokens (verl's rollout_is_batch_normalize)."""

    def __post_init__(self) -> None:
        _check_truncation(self.cap, self.clip_min)

    def warnings(self) -> list[str]:
        return _cap_below_one(self.cap, "π_old/μ")


def tis(old_logp: torch.Tensor, rollout_logp: torch.Tensor, response_mask: torch.Tensor,
        params: Optional[TISParams] = None) -> tuple[torch.Tensor, Metrics]:
    """Token-level truncated importance sampling: w = min(π_old/μ, C), optionally raised to
    at least c (two-sided) and divided by the batch's mean weight.

    Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
    training"; verl ``compute_rollout_correction_weights`` (rollout_is=token, with
    ``rollout_is_batch_normalize``); TRL ``token_truncate``. Tensors ``(B, T)``.

    :return: weights ``(B, T)``; metrics ``weight_mean`` (before normalising),
        ``dropped_frac`` (0), ``truncated_frac`` (share of valid tokens whose ratio
        exceeded C), with ``clip_min`` ``raised_frac`` (share below c), with ``normalize``
        ``norm_factor`` (the mean divided by).
    """
    params = params or TISParams()
    valid = response_mask.bool()
    ratio = torch.exp(_log_ratio(old_logp, rollout_logp, valid))
    truncated = ratio.clamp(min=params.clip_min, max=params.cap)
    weights = torch.where(valid, truncated, torch.zeros_like(ratio))
    mask = valid.to(weights.dtype)
    extra = {"truncated_frac": masked_mean((ratio > params.cap).to(mask.dtype), mask).detach()}
    if params.clip_min is not None:
        extra["raised_frac"] = masked_mean((ratio < params.clip_min).to(mask.dtype), mask).detach()
    metrics = _metrics(weights, torch.zeros_like(valid), mask, **extra)
    if params.normalize:
        weights, metrics["norm_factor"] = _normalize(weights, mask, per_sequence=False)
    return weights, metrics


@dataclass
class SeqTISParams:
    """Parameters of ``seq_tis``."""

    cap: float = 2.0
    """C: the sequence weight min(Π_t π_old/μ, C); > 0 (verl's rollout_is_threshold with rollout_is=sequence)."""
    clip_min: Optional[float] = None
    """c: two-sided truncation max(c, min(ρ, C)); in [0, cap); null: one-sided (verl)."""
    normalize: bool = False
    """Divide the weights by their mean over the batch's non-empty sequences (verl's rollout_is_batch_normalize)."""

    def __post_init__(self) -> None:
        _check_truncation(self.cap, self.clip_min)

    def warnings(self) -> list[str]:
        return _cap_below_one(self.cap, "Π_t π_old/μ")


def seq_tis(old_logp: torch.Tensor, rollout_logp: torch.Tensor, response_mask: torch.Tensor,
            params: Optional[SeqTISParams] = None) -> tuple[torch.Tensor, Metrics]:
    """Sequence-level truncated importance sampling: every token of sequence i gets
    w_i = min(exp(clamp(Σ_t x_t, ±20)), C) (optionally ≥ c, optionally batch-normalised).

    The log-ratios are summed unclamped and the sum is clamped to ±20 before the exp (verl
    ``compute_rollout_correction_weights`` with rollout_is=sequence; TRL
    ``sequence_truncate``, whose min is ``clip_min``). An empty sequence has weight 0 (no
    valid token). Tensors ``(B, T)``.

    :return: weights ``(B, T)``; metrics ``weight_mean`` (per valid token, before
        normalising), ``dropped_frac`` (0), ``truncated_seq_frac`` (share of non-empty
        sequences with ρ > C), ``raised_seq_frac`` (with ``clip_min``), ``norm_factor``
        (with ``normalize``).
    """
    params = params or SeqTISParams()
    valid = response_mask.bool()
    mask = valid.to(torch.float32)
    raw = torch.where(valid, (old_logp - rollout_logp).detach().float().clamp(-1e6, 1e6), torch.zeros_like(mask))
    log_rho = raw.sum(-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)                       # (B,)
    rho = torch.exp(log_rho)
    seq_weight = rho.clamp(min=params.clip_min, max=params.cap)
    weights = torch.where(valid, seq_weight.unsqueeze(-1).expand_as(mask), torch.zeros_like(mask))
    non_empty = (mask.sum(-1) > 0).to(torch.float32)
    extra = {"truncated_seq_frac": masked_mean((log_rho > math.log(params.cap)).float(), non_empty).detach()}
    if params.clip_min is not None:
        below = rho < params.clip_min
        extra["raised_seq_frac"] = masked_mean(below.float(), non_empty).detach()
    metrics = _metrics(weights, torch.zeros_like(valid), mask, **extra)
    if params.normalize:
        weights, metrics["norm_factor"] = _normalize(weights, mask, per_sequence=True)
    return weights, metrics


@dataclass
class IcePopParams:
    """Parameters of ``icepop``: the band [low, high] of π_old/μ a token must lie in."""

    low: float = 0.5
    """α: tokens with π_old/μ < α get weight 0; in (0, high)."""
    high: float = 5.0
    """β: tokens with π_old/μ > β get weight 0 (verl's IcePop presets: 0.5 / 5)."""
    mode: str = "weight"
    """``weight``: a token outside the band gets weight 0 and stays in the denominators; ``mask``: it leaves
    loss_mask."""

    def __post_init__(self) -> None:
        if not 0 < self.low < self.high:
            raise ValueError(f"need 0 < low < high, got low={self.low}, high={self.high}")
        _check_mode(self.mode)


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
    mode: str = "weight"
    """``weight``: a dropped sequence's tokens get weight 0 and stay in the denominators; ``mask``: they leave
    loss_mask (verl's rejection)."""

    def __post_init__(self) -> None:
        if self.aggregate not in SEQ_IS_DEFAULTS:
            raise ValueError(f"aggregate must be one of {', '.join(SEQ_IS_DEFAULTS)}, got {self.aggregate!r}")
        _check_mode(self.mode)
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


REJECTION_STATISTICS = ("k2", "k3")
REJECTION_LEVELS = ("token", "sum", "mean", "max")


@dataclass
class RejectionParams:
    """Parameters of ``rejection``."""

    estimator: str = "k3"
    """Per-token divergence: ``k2`` = x²/2, ``k3`` = exp(x) − 1 − x, x = log(π_old/μ) (verl's token_k2 /
    token_k3)."""
    level: str = "mean"
    """``token``: reject each token whose divergence exceeds the threshold; ``sum``, ``mean``, ``max``: reject
    every token of a sequence whose sum / mean / max over its tokens does (verl's seq_sum_*, seq_mean_*, seq_max_*)."""
    threshold: float = 0.01
    """Largest divergence kept; > 0 (verl's K3-RS presets: seq_mean_k3 with 0.01)."""
    mode: str = "weight"
    """``weight``: a rejected token gets weight 0 and stays in the denominators; ``mask``: it leaves loss_mask
    (verl)."""

    def __post_init__(self) -> None:
        if self.estimator not in REJECTION_STATISTICS:
            raise ValueError(f"estimator must be one of {', '.join(REJECTION_STATISTICS)}, got {self.estimator!r}")
        if self.level not in REJECTION_LEVELS:
            raise ValueError(f"level must be one of {', '.join(REJECTION_LEVELS)}, got {self.level!r}")
        if not self.threshold > 0:
            raise ValueError(f"threshold must be > 0, got {self.threshold}")
        _check_mode(self.mode)


def rejection(old_logp: torch.Tensor, rollout_logp: torch.Tensor, response_mask: torch.Tensor,
              params: Optional[RejectionParams] = None) -> tuple[torch.Tensor, Metrics]:
    """Divergence rejection (a hard trust region between μ and π_old): per token
    d_t = x²/2 (k2) or exp(x) − 1 − x (k3), x = log(π_old/μ) clamped to ±20; keep a token
    when d_t ≤ threshold (``token``), or keep a whole sequence when Σ_t d_t, mean_t d_t or
    max_t d_t ≤ threshold (``sum``, ``mean``, ``max``). Kept tokens get weight 1, rejected
    ones 0 (removed from the loss mask by the engine with ``mode=mask``).

    verl ``compute_rollout_rejection_mask`` (token_k2/k3, seq_sum_k2/k3, seq_mean_k2/k3,
    seq_max_k2/k3). An empty sequence's statistic is 0 (kept; it has no tokens). Tensors
    ``(B, T)``.

    :return: weights ``(B, T)`` in {0, 1}; metrics ``weight_mean``, ``dropped_frac``
        (share of valid tokens rejected), ``dropped_seq_frac`` (share of non-empty
        sequences with a rejected token), ``statistic_mean`` (the mean over valid tokens
        (token) or non-empty sequences of the statistic compared).
    """
    params = params or RejectionParams()
    valid = response_mask.bool()
    mask = valid.to(torch.float32)
    x = _log_ratio(old_logp, rollout_logp, valid).float()
    divergence = 0.5 * x * x if params.estimator == "k2" else torch.expm1(x) - x
    divergence = torch.where(valid, divergence, torch.zeros_like(divergence))
    non_empty = (mask.sum(-1) > 0).to(torch.float32)
    if params.level == "token":
        keep = divergence <= params.threshold
        statistic = masked_mean(divergence, mask)
    else:
        if params.level == "sum":
            per_sequence = divergence.sum(-1)
        elif params.level == "mean":
            per_sequence = masked_mean(divergence, mask, dim=-1)
        else:
            per_sequence = divergence.max(-1).values if divergence.shape[-1] else divergence.new_zeros(len(divergence))
        keep = (per_sequence <= params.threshold).unsqueeze(-1).expand_as(valid)
        statistic = masked_mean(per_sequence, non_empty)
    weights = (keep & valid).to(torch.float32)
    dropped = valid & ~keep
    return weights, _metrics(weights, dropped, mask, statistic_mean=statistic.detach(),
                             dropped_seq_frac=masked_mean(dropped.any(-1).float(), non_empty).detach())


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
    register("tis", tis, params=TISParams, importance_weights=True, paper="Yao et al. 2025 (TIS)",
             description="token-level truncated IS: w = min(π_old/μ, C)")
    register("seq_tis", seq_tis, params=SeqTISParams, importance_weights=True,
             paper="verl rollout_is=sequence; TRL sequence_truncate",
             description="sequence-level truncated IS: w = min(Π_t π_old/μ, C) on every token of the sequence")
    register("rejection", rejection, params=RejectionParams,
             paper="verl rollout_rs (token/seq_sum/seq_mean/seq_max k2, k3)",
             description="drop tokens / sequences whose k2 or k3 divergence between μ and π_old exceeds a threshold")
    register("icepop", icepop, params=IcePopParams, importance_weights=True,
             description="token-level masked IS: w = π_old/μ inside [α, β], else 0 (IcePop, Ring-1T)")
    register("seq_is_mask", seq_is_mask, params=SeqISMaskParams,
             description="drop sequences whose (geometric or product) ratio π_old/μ is outside [low, high]")
    register("opmask", opmask, params=OPMaskParams,
             description="drop a sequence with A < 0 and KL(μ‖π) > δ (DeepSeek-V3.2 off-policy masking)")
