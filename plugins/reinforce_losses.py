"""REINFORCE-style policy losses, −w·A·logp: on-policy (vanilla PG / GPG), a clipped
stop-gradient weight (CISPO), a quadratic log-ratio penalty (DRO), or a capped weight with a
probability trust region (DPPO), in place of PPO's clipped surrogate.

The call convention, shapes and metrics: :mod:`rlzoo_plugins.loss_parts`. Formulas:
../docs/algorithms/policy_losses.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from rlzoo.api import LOG_RATIO_CLAMP, hookimpl, masked_mean
from rlzoo_plugins.loss_parts import Metrics, approx_kl, importance_ratio, on_valid, prepare, share

RLZOO_API_VERSION = "2"


@dataclass
class CISPOParams:
    """Parameters of ``cispo``: the bounds of the (stop-gradient) IS weight."""

    clip_low: float = 1.0
    """ε_low: weight ≥ 1 − ε_low; in [0, 1]. 1.0 = no lower bound (MiniMax-M1)."""
    clip_high: float = 4.0
    """ε_high: weight ≤ 1 + ε_high; > 0. 4.0 caps it at 5 (ScaleRL's ε_max, TRL's recommendation)."""

    def __post_init__(self) -> None:
        if not 0 <= self.clip_low <= 1:
            raise ValueError(f"clip_low must be in [0, 1], got {self.clip_low}")
        if not self.clip_high > 0:
            raise ValueError(f"clip_high must be > 0, got {self.clip_high}")


def cispo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: Optional[CISPOParams] = None,
) -> tuple[torch.Tensor, Metrics]:
    """CISPO: L = −sg(clip(ρ, 1 − ε_low, 1 + ε_high))·A·logp.

    A REINFORCE loss weighted by the clipped importance weight under a stop-gradient, so
    every token keeps its gradient −w·A·∇logp (PPO would zero it once clipped). MiniMax-M1
    2025 (arXiv:2506.13585); verl ``compute_policy_loss_cispo``.

    :return: loss ``(B, T)``; metrics ``clipfrac`` (share of valid tokens whose weight was
        clipped: ρ outside [1 − ε_low, 1 + ε_high]) and ``approx_kl``.
    """
    params = params or CISPOParams()
    logp, old_logp, advantages, valid, mask = prepare(logp, old_logp, advantages, response_mask)
    ratio = importance_ratio(logp - old_logp).detach()
    low, high = 1 - params.clip_low, 1 + params.clip_high
    weight = ratio.clamp(low, high)
    loss = -weight * advantages * logp
    return on_valid(loss, valid), {
        "clipfrac": share((ratio < low) | (ratio > high), mask),
        "approx_kl": approx_kl(logp, old_logp, mask),
    }


def vanilla_pg(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, Metrics]:
    """On-policy REINFORCE: L = −A·logp; no ratio, no clip.

    GPG (arXiv:2504.02546); verl ``compute_policy_loss_gpg``. All tensors ``(B, T)``.

    :return: loss ``(B, T)``; metrics ``clipfrac`` (always 0) and ``approx_kl``.
    """
    logp, old_logp, advantages, valid, mask = prepare(logp, old_logp, advantages, response_mask)
    return on_valid(-advantages * logp, valid), {
        "clipfrac": torch.zeros((), dtype=mask.dtype, device=mask.device),
        "approx_kl": approx_kl(logp, old_logp, mask),
    }


@dataclass
class DROParams:
    """Parameters of ``dro``."""

    beta: float = 0.05
    """β: weight of the quadratic penalty ½β·(logp − old_logp)²; > 0. verl has no default (it
    refuses to run without one); 0.05 is the value of Tinker's documented example."""

    def __post_init__(self) -> None:
        if not self.beta > 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")


def dro(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: Optional[DROParams] = None,
) -> tuple[torch.Tensor, Metrics]:
    """DRO: L = −(A·logp − ½β·(logp − old_logp)²): REINFORCE with a quadratic penalty on
    the log-ratio in place of a clip (gradient −A·∇logp + β·(logp − old_logp)·∇logp).

    Direct Reward Optimisation, Richemond et al. 2024 (arXiv:2405.19107) and Kimi k1.5
    (arXiv:2501.12599), in the per-token form of Tinker's ``dro`` loss and verl
    ``compute_policy_loss_dro`` (same formula, unclamped log-ratio: the penalty is a
    polynomial, finite for any finite input). The papers pair it with a soft
    (τ·log-sum-exp) advantage; any advantage estimator can feed it here. Tensors ``(B, T)``.

    :return: loss ``(B, T)``; metrics ``clipfrac`` (always 0: nothing is clipped),
        ``penalty`` (masked mean of ½(logp − old_logp)², before β) and ``approx_kl``.
    """
    params = params or DROParams()
    logp, old_logp, advantages, valid, mask = prepare(logp, old_logp, advantages, response_mask)
    log_ratio = logp - old_logp
    half_square = 0.5 * log_ratio.square()
    loss = -(advantages * logp - params.beta * half_square)
    return on_valid(loss, valid), {
        "clipfrac": torch.zeros((), dtype=mask.dtype, device=mask.device),
        "penalty": masked_mean(half_square, mask).detach(),
        "approx_kl": approx_kl(logp, old_logp, mask),
    }


DPPO_DIVERGENCES = {"tv": 0.15, "kl": 0.05}
"""Divergence -> the default δ of verl's DPPO example (dppo_tv, dppo_kl)."""


@dataclass
class DPPOParams:
    """Parameters of ``dppo``."""

    divergence: str = "tv"
    """How the probability shift is measured: ``tv`` (π − π_anchor) or ``kl`` (the binary
    KL between the token's two probabilities)."""
    delta_low: Optional[float] = None
    """Threshold for tokens with A ≤ 0; None: 0.15 (tv) or 0.05 (kl), verl's example."""
    delta_high: Optional[float] = None
    """Threshold for tokens with A > 0; None: as ``delta_low``'s default."""
    cap: float = 10.0
    """The detached importance ratio π/π_anchor is capped at this (> 0)."""
    anchor: str = "rollout"
    """``rollout``: shifts against μ, the distribution the rollout sampled from (the
    paper, Stable-RL); ``old``: against π_old (verl)."""

    def __post_init__(self) -> None:
        if self.divergence not in DPPO_DIVERGENCES:
            raise ValueError(f"divergence must be one of {', '.join(DPPO_DIVERGENCES)}, got {self.divergence!r}")
        if self.anchor not in ("rollout", "old"):
            raise ValueError(f"anchor must be 'rollout' or 'old', got {self.anchor!r}")
        for name in ("delta_low", "delta_high"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if not self.cap > 0:
            raise ValueError(f"cap must be > 0, got {self.cap}")


def dppo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: Optional[DPPOParams] = None,
) -> tuple[torch.Tensor, Metrics]:
    """DPPO: REINFORCE with a capped importance weight, masking a token whose probability
    has already moved more than δ in its advantage's direction (a trust region on the
    probability, in place of PPO's ratio clip).

    p = exp(logp), q = exp(anchor logp) (μ or π_old); w = min(exp(min(logp − anchor, 20)),
    cap), detached; masked: A > 0 and shift > δ_high with p above q, or A ≤ 0 and shift >
    δ_low with p below q, where the shift is |p − q| (``tv``) or
    q·log(q/p) + (1 − q)·log((1 − q)/(1 − p)) (``kl``); L = −w·A·logp on unmasked tokens,
    0 on masked ones (which stay in the aggregation's denominator).
    arXiv:2602.04879; reference code sail-sg/Stable-RL ``dppo_binary_tv`` /
    ``dppo_binary_kl``; verl ``dppo_tv`` / ``dppo_kl`` (anchored at π_old). ``(B, T)``.

    :return: loss ``(B, T)``; metrics ``clipfrac`` (share of valid tokens masked),
        ``clipfrac_lower`` (masked with A ≤ 0), ``approx_kl``.
    """
    params = params or DPPOParams()
    logp, old_logp, advantages, valid, mask = prepare(logp, old_logp, advantages, response_mask)
    anchor = rollout_logp if params.anchor == "rollout" else old_logp
    anchor = torch.where(valid, anchor.detach(), torch.zeros_like(anchor))
    weight = torch.exp(torch.clamp(logp.detach() - anchor, max=LOG_RATIO_CLAMP)).clamp(max=params.cap)
    p, q = torch.exp(logp.detach()).clamp(max=1.0), torch.exp(anchor).clamp(max=1.0)   # probabilities
    default = DPPO_DIVERGENCES[params.divergence]
    low = params.delta_low if params.delta_low is not None else default
    high = params.delta_high if params.delta_high is not None else default
    if params.divergence == "tv":
        up, down = p - q > high, q - p > low
    else:
        eps = 1e-8
        shift = q * (torch.log(q + eps) - torch.log(p + eps)) + (1 - q) * torch.log((1 - q + eps) / (1 - p + eps))
        up, down = (shift > high) & (p > q), (shift > low) & (p < q)
    positive = advantages > 0
    masked = valid & ((positive & up) | (~positive & down))
    loss = torch.where(masked, torch.zeros_like(logp), -weight * advantages * logp)
    return on_valid(loss, valid), {
        "clipfrac": share(masked, mask),
        "clipfrac_lower": share(masked & ~positive, mask),
        "approx_kl": approx_kl(logp, old_logp, mask),
    }


@hookimpl
def rlzoo_register_policy_losses(register) -> None:
    register("vanilla_pg", vanilla_pg, aliases=("gpg",), ratio_free=True,
             description="on-policy REINFORCE: -A*logp", paper="arXiv:2504.02546")
    register("cispo", cispo, params=CISPOParams,
             description="REINFORCE weighted by the clipped, stop-gradient importance ratio",
             paper="arXiv:2506.13585")
    register("dro", dro, params=DROParams,
             description="REINFORCE with a quadratic log-ratio penalty ½β(logp − old_logp)² instead of a clip",
             paper="arXiv:2405.19107")
    register("dppo", dppo, params=DPPOParams,
             description="REINFORCE with a capped IS weight; mask tokens whose probability moved > δ with A",
             paper="arXiv:2602.04879")
