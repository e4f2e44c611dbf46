"""Policy losses with a ratio per sequence: GSPO (length-normalised), LUSPO (GSPO times the
length), GMPO (geometric mean of the token ratios) and VESPO (a smooth weight of the
product ratio).

The call convention, shapes and metrics: :mod:`rlzoo_plugins.loss_parts`. Formulas:
../docs/algorithms/policy_losses.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from rlzoo.api import LOG_RATIO_CLAMP, hookimpl, masked_mean, masked_sum
from rlzoo_plugins.loss_parts import (Metrics, approx_kl, check_ppo_clip_range, clipped_surrogate, importance_ratio,
                                      on_valid, prepare, share)

RLZOO_API_VERSION = "2"


@dataclass
class GSPOParams:
    """Parameters of ``gspo`` (the paper's clip ranges are tiny: sequence ratios stay near 1)."""

    clip_low: float = 3e-4
    """ε_low on the sequence ratio; in (0, 1)."""
    clip_high: float = 4e-4
    """ε_high on the sequence ratio; > 0."""

    def __post_init__(self) -> None:
        check_ppo_clip_range(self.clip_low, self.clip_high)


def gspo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: Optional[GSPOParams] = None,
) -> tuple[torch.Tensor, Metrics]:
    """GSPO: PPO clipping of the length-normalised sequence ratio.

    log s_i = masked mean over t of (logp − old_logp); per token
    s_{i,t} = exp(sg(log s_i) + logp_t − sg(logp_t)): its value is s_i, its gradient
    s_i·∇logp_t; L = max(−A·s_{i,t}, −A·clip(s_{i,t}, 1 − ε_low, 1 + ε_high)).
    Zheng et al. 2025 (arXiv:2507.18071); verl ``compute_policy_loss_gspo`` (same
    ordering ``logp − sg(logp) + sg(log s_i)``; verl caps the exponent at 10 above, rlzoo
    clamps it to ±20 with ``_ratio`` like every other ratio). Registered with
    ``loss_agg="seq-mean-token-mean"``. All tensors ``(B, T)``.
    """
    params = params or GSPOParams()
    logp, old_logp, advantages, valid, mask = prepare(logp, old_logp, advantages, response_mask)
    seq_log_ratio = masked_mean(logp - old_logp, mask, dim=-1)                  # (B,)
    token_log_ratio = logp - logp.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = importance_ratio(token_log_ratio)
    loss, clipped = clipped_surrogate(ratio, advantages, params.clip_low, params.clip_high)
    return on_valid(loss, valid), {
        "clipfrac": share(clipped, mask),
        "approx_kl": approx_kl(logp, old_logp, mask),
    }


@dataclass
class GeoMeanParams:
    """Parameters of ``geo_mean`` (GMPO): clip bounds in log space."""

    clip_low: float = 0.4
    """The token log-ratio is clipped below at −clip_low (for A < 0); > 0."""
    clip_high: float = 0.4
    """The token log-ratio is clipped above at +clip_high (for A > 0); > 0."""

    def __post_init__(self) -> None:
        if not self.clip_low > 0:
            raise ValueError(f"clip_low must be > 0 (a log-ratio bound), got {self.clip_low}")
        if not self.clip_high > 0:
            raise ValueError(f"clip_high must be > 0 (a log-ratio bound), got {self.clip_high}")


def geo_mean(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    correction_weights: Optional[torch.Tensor] = None,
    params: Optional[GeoMeanParams] = None,
) -> tuple[torch.Tensor, Metrics]:
    """GMPO: maximise the geometric mean of the token ratios, clipped in log space.

    r_t = logp − old_logp; r̃_t = sign(A_t)·min(sign(A_t)·r_t, sign(A_t)·clip(r_t, −ε_low,
    ε_high)); ratio_i = exp(masked mean_t r̃_t); Ā_i = masked mean_t A_t;
    L_i = −Ā_i·ratio_i, written on every valid token of sequence i so that
    ``seq-mean-token-mean`` gives the mean of L_i over the non-empty sequences.
    Zhao et al. 2025 (arXiv:2507.20673); verl ``compute_policy_loss_geo_mean``.
    Registered with ``loss_agg="seq-mean-token-mean"``. Tensors ``(B, T)``.

    With ``correction_weights`` w (the rollout correction's detached per-token weights;
    the engine passes them to this loss instead of multiplying its per-token loss, which
    would give the sequence the arithmetic mean of its weights): tokens with w = 0 leave
    the sequence (its means over t run over the tokens with w > 0, so a dropped token gets
    no gradient), and L_i is multiplied by the geometric mean of the kept tokens' weights,
    exp(mean_t log w_t) — verl's ``seq_is_weights`` when every weight is > 0. A sequence
    with no kept token has L_i = 0.

    :return: loss ``(B, T)``; metrics ``clipfrac`` (share of valid tokens whose log-ratio
        was replaced by its bound: A > 0 and r > ε_high, or A < 0 and r < −ε_low) and
        ``approx_kl``.
    """
    params = params or GeoMeanParams()
    logp, old_logp, advantages, valid, mask = prepare(logp, old_logp, advantages, response_mask)
    kept, kept_mask = valid, mask
    if correction_weights is not None:
        weights = correction_weights.detach().to(logp.dtype)
        kept = valid & (weights > 0)
        kept_mask = kept.to(logp.dtype)
    log_ratio = logp - old_logp
    sign = torch.sign(advantages)
    bounded = log_ratio.clamp(-params.clip_low, params.clip_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * bounded)
    seq_ratio = importance_ratio(masked_mean(pessimistic, kept_mask, dim=-1))              # (B,)
    seq_advantage = masked_mean(advantages, kept_mask, dim=-1)                    # (B,)
    per_sequence = -seq_advantage * seq_ratio
    if correction_weights is not None:
        log_weights = torch.where(kept, weights, torch.ones_like(weights)).log()
        per_sequence = per_sequence * torch.exp(masked_mean(log_weights, kept_mask, dim=-1))
    loss = per_sequence.unsqueeze(-1).expand_as(log_ratio)
    clipped = ((advantages > 0) & (log_ratio > params.clip_high)) | (
        (advantages < 0) & (log_ratio < -params.clip_low))
    return on_valid(loss, valid), {
        "clipfrac": share(clipped, mask),
        "approx_kl": approx_kl(logp, old_logp, mask),
    }


@dataclass
class LUSPOParams(GSPOParams):
    """Parameters of ``luspo``: GSPO's, with the clip ranges of the LUSPO paper's runs."""

    clip_low: float = 2e-3
    """ε_low on the sequence ratio; in (0, 1) (LUSPO §5.1 via TRL's reproduction config)."""
    clip_high: float = 2.5e-3
    """ε_high on the sequence ratio; > 0."""


@dataclass
class VESPOParams:
    """Parameters of ``vespo``: the shape of the weight φ(w) = w^k·e^{λ(1 − w)} per sign of A."""

    k_pos: float = 2.0
    """k for sequences with A ≥ 0; ≥ 0."""
    lam_pos: float = 3.0
    """λ for sequences with A ≥ 0; > 0."""
    k_neg: float = 3.0
    """k for sequences with A < 0; ≥ 0."""
    lam_neg: float = 2.0
    """λ for sequences with A < 0; > 0."""

    def __post_init__(self) -> None:
        for name in ("k_pos", "k_neg"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("lam_pos", "lam_neg"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


def vespo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: Optional[VESPOParams] = None,
) -> tuple[torch.Tensor, Metrics]:
    """VESPO: REINFORCE weighted by a smooth, sequence-level function of the product ratio.

    log w_i = Σ_t clamp(logp − old_logp, ±20) (the product ratio of sequence i, clamped to
    ±20 again), φ_i = sg(w_i^k·e^{λ(1 − w_i)}) = sg(exp(λ + k·log w_i − λ·w_i)) with
    (k, λ) = (k_pos, λ_pos) if the sequence's advantage Ā_i ≥ 0 else (k_neg, λ_neg);
    L_t = −φ_i·A_t·logp_t. φ(1) = 1: on-policy it is REINFORCE; it fades smoothly as the
    sequence drifts off-policy in either direction. arXiv:2602.10693; official code
    ``recipe/vespo/code/core_algos.py::compute_policy_loss_vespo`` (defaults as its
    scripts). Tensors ``(B, T)``.

    :return: loss ``(B, T)``; metrics ``clipfrac`` (0: nothing is clipped), ``weight_mean``
        (mean φ over the batch's non-empty sequences), ``approx_kl``.
    """
    params = params or VESPOParams()
    logp, old_logp, advantages, valid, mask = prepare(logp, old_logp, advantages, response_mask)
    token_log_ratio = (logp - old_logp).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    log_w = masked_sum(token_log_ratio, mask, dim=-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)   # (B,)
    positive = masked_mean(advantages, mask, dim=-1) >= 0                                     # (B,)
    k = torch.where(positive, torch.full_like(log_w, params.k_pos), torch.full_like(log_w, params.k_neg))
    lam = torch.where(positive, torch.full_like(log_w, params.lam_pos), torch.full_like(log_w, params.lam_neg))
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))                                  # (B,)
    loss = -phi.unsqueeze(-1) * advantages * logp
    non_empty = (mask.sum(-1) > 0).to(mask.dtype)
    return on_valid(loss, valid), {
        "clipfrac": torch.zeros((), dtype=mask.dtype, device=mask.device),
        "weight_mean": masked_mean(phi, non_empty).detach(),
        "approx_kl": approx_kl(logp, old_logp, mask),
    }


@hookimpl
def rlzoo_register_policy_losses(register) -> None:
    register("gspo", gspo, params=GSPOParams, loss_agg="seq-mean-token-mean",
             description="sequence-level (length-normalised) importance ratio and clipping",
             paper="arXiv:2507.18071")
    register("luspo", gspo, params=LUSPOParams, loss_agg="seq-mean-token-sum",
             description="GSPO's loss times each response's length (length-unbiased sequence ratio)",
             paper="arXiv:2602.05261")
    register("vespo", vespo, params=VESPOParams,
             description="REINFORCE weighted by w^k·e^{λ(1−w)} of the sequence ratio (smooth, no clip)",
             paper="arXiv:2602.10693")
    register("geo_mean", geo_mean, params=GeoMeanParams, aliases=("gmpo",),
             loss_agg="seq-mean-token-mean",
             description="GMPO: geometric mean of token ratios, sign-aware log-space clip",
             paper="arXiv:2507.20673")
