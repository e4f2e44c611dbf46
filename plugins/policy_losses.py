"""Policy losses: per-token surrogate losses, aggregated by the engine with ``loss_agg``.

Every loss takes ``(logp, old_logp, advantages, response_mask)``, all ``(B, T)``, with the
gradient flowing through ``logp`` only, and returns the per-token loss ``(B, T)`` (zero on
padding) and detached scalar metrics: ``clipfrac`` (share of valid tokens where clipping
changed the loss), ``approx_kl`` (masked mean of old_logp − logp) and loss-specific ones.
The ratio is ρ = exp(logp − old_logp) with the log-ratio clamped to [−20, 20]
(ALGORITHMS.md). Formulas follow ALGORITHMS.md and verl's ``core_algos.py``
(``compute_policy_loss_vanilla``, ``_gspo``, ``_geo_mean``, ``_clip_cov``, ``_kl_cov``);
docs/algorithms/policy_losses.md gives each with its paper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from rlzoo import hookimpl
from rlzoo.masked import masked_mean, masked_sum

RLZOO_API_VERSION = "1"
LOG_RATIO_CLAMP = 20.0

Metrics = dict[str, torch.Tensor]


def _log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """logp − old_logp clamped to [−20, 20]; 0 on padding (so garbage there cannot leak)."""
    diff = (logp - old_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.where(mask.bool(), diff, torch.zeros_like(diff))


def _valid(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), loss, torch.zeros_like(loss))


def _share(condition: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_mean(condition.float(), mask).detach()


def _approx_kl(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_mean(-log_ratio, mask).detach()


def _check_clip(params: object) -> None:
    low, high = params.clip_low, params.clip_high  # type: ignore[attr-defined]
    if not 0 < low <= 1:
        raise ValueError(f"clip_low must be in (0, 1], got {low}")
    if high <= 0:
        raise ValueError(f"clip_high must be > 0, got {high}")


def _clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float,
                       clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(max(−A·ρ, −A·clip(ρ)), clipped) — the PPO surrogate and where the clip won."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


# ------------------------------------------------------------------------------ ppo_clip


@dataclass
class PPOClipParams:
    clip_low: float = 0.2
    """ε_low: the ratio is clipped below at 1 − ε_low, in (0, 1]."""
    clip_high: float = 0.2
    """ε_high: clipped above at 1 + ε_high (> ε_low is DAPO's clip-higher)."""
    delta: Optional[float] = None
    """INTELLECT-2 two-sided clip: for A < 0 the ratio is also capped at δ (> 1 + ε_high)."""

    def __post_init__(self) -> None:
        _check_clip(self)
        if self.delta is not None and self.delta <= 1 + self.clip_high:
            raise ValueError(f"delta must be > 1 + clip_high = {1 + self.clip_high}, got {self.delta}")


def ppo_clip(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
             response_mask: torch.Tensor, params: Optional[PPOClipParams] = None
             ) -> tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate: L = max(−A·ρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high)).

    With ``delta``: for A < 0 the unclipped term uses min(ρ, δ), bounding the loss of a
    token whose ratio explodes (INTELLECT-2, arXiv:2505.07291). Shapes ``(B, T)``.
    Schulman et al. 2017 (arXiv:1707.06347); verl ``compute_policy_loss_vanilla``.
    """
    params = params or PPOClipParams()
    advantages = advantages.detach()
    log_ratio = _log_ratio(logp, old_logp, response_mask)
    ratio = torch.exp(log_ratio)
    if params.delta is not None:
        ratio = torch.where(advantages < 0, ratio.clamp(max=params.delta), ratio)
    loss, clipped = _clipped_surrogate(ratio, advantages, params.clip_low, params.clip_high)
    return _valid(loss, response_mask), {
        "clipfrac": _share(clipped, response_mask),
        "approx_kl": _approx_kl(log_ratio, response_mask),
    }


# ------------------------------------------------------------------------------ dual_clip


@dataclass
class DualClipParams:
    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_ratio_c: float = 3.0
    """c: for A < 0 the loss is at most −c·A; must be > 1."""

    def __post_init__(self) -> None:
        _check_clip(self)
        if self.clip_ratio_c <= 1:
            raise ValueError(f"clip_ratio_c must be > 1, got {self.clip_ratio_c}")


def dual_clip(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
              response_mask: torch.Tensor, params: Optional[DualClipParams] = None
              ) -> tuple[torch.Tensor, Metrics]:
    """Dual-clip PPO: for A < 0, min(ppo_clip, −c·A); for A ≥ 0, ppo_clip.

    Ye et al. 2019 (arXiv:1912.09729); verl ``compute_policy_loss_vanilla`` with
    ``clip_ratio_c``. Metric ``clipfrac_lower``: share of valid tokens where the −c·A
    bound was active. Shapes ``(B, T)``.
    """
    params = params or DualClipParams()
    advantages = advantages.detach()
    log_ratio = _log_ratio(logp, old_logp, response_mask)
    ratio = torch.exp(log_ratio)
    clip_loss, clipped = _clipped_surrogate(ratio, advantages, params.clip_low, params.clip_high)
    lower_bound = -advantages * params.clip_ratio_c
    lower_active = (clip_loss > lower_bound) & (advantages < 0)
    loss = torch.where(advantages < 0, torch.minimum(clip_loss, lower_bound), clip_loss)
    return _valid(loss, response_mask), {
        "clipfrac": _share(clipped, response_mask),
        "clipfrac_lower": _share(lower_active, response_mask),
        "approx_kl": _approx_kl(log_ratio, response_mask),
    }


# ------------------------------------------------------------------------------ gspo


@dataclass
class GSPOParams:
    clip_low: float = 3e-4
    clip_high: float = 4e-4

    def __post_init__(self) -> None:
        _check_clip(self)


def gspo(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
         response_mask: torch.Tensor, params: Optional[GSPOParams] = None
         ) -> tuple[torch.Tensor, Metrics]:
    """GSPO: PPO clipping of the sequence ratio s_i = exp(mean_t(logp − old_logp)).

    The per-token ratio is s_{i,t} = exp(sg(log s_i) + logp_t − sg(logp_t)): its value is
    the sequence ratio and its gradient flows through each token. The exponent is capped
    at 10 as in verl ``compute_policy_loss_gspo``. Zheng et al. 2025 (arXiv:2507.18071).
    Registered with ``loss_agg="seq-mean-token-mean"``. Shapes ``(B, T)``.
    """
    params = params or GSPOParams()
    advantages = advantages.detach()
    log_ratio = _log_ratio(logp, old_logp, response_mask)
    lengths = response_mask.sum(-1, keepdim=True).clamp(min=1)
    seq_log_ratio = masked_sum(log_ratio, response_mask, dim=-1).unsqueeze(-1) / lengths
    safe_logp = torch.where(response_mask.bool(), logp, torch.zeros_like(logp))
    token_log_ratio = (seq_log_ratio.detach() + safe_logp - safe_logp.detach()).clamp(max=10.0)
    ratio = torch.exp(token_log_ratio)
    loss, clipped = _clipped_surrogate(ratio, advantages, params.clip_low, params.clip_high)
    return _valid(loss, response_mask), {
        "clipfrac": _share(clipped, response_mask),
        "approx_kl": _approx_kl(log_ratio, response_mask),
    }


# ------------------------------------------------------------------------------ cispo


@dataclass
class CISPOParams:
    clip_low: float = 1.0
    """ε_low; 1.0 means no lower bound on the IS weight (as MiniMax-M1)."""
    clip_high: float = 0.28
    """ε_high: the IS weight is capped at 1 + ε_high."""

    def __post_init__(self) -> None:
        _check_clip(self)


def cispo(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
          response_mask: torch.Tensor, params: Optional[CISPOParams] = None
          ) -> tuple[torch.Tensor, Metrics]:
    """CISPO: L = −sg(clip(ρ, 1 − ε_low, 1 + ε_high))·A·logp.

    Every token keeps a gradient (REINFORCE through logp), weighted by the clipped,
    stop-gradient importance ratio. MiniMax-M1 2025 (arXiv:2506.13585). Shapes ``(B, T)``.
    """
    params = params or CISPOParams()
    advantages = advantages.detach()
    log_ratio = _log_ratio(logp, old_logp, response_mask)
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(1 - params.clip_low, 1 + params.clip_high).detach()
    safe_logp = torch.where(response_mask.bool(), logp, torch.zeros_like(logp))
    loss = -weight * advantages * safe_logp
    clipped = (ratio > 1 + params.clip_high) | (ratio < 1 - params.clip_low)
    return _valid(loss, response_mask), {
        "clipfrac": _share(clipped, response_mask),
        "approx_kl": _approx_kl(log_ratio, response_mask),
    }


# ------------------------------------------------------------------------------ vanilla_pg


def vanilla_pg(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
               response_mask: torch.Tensor) -> tuple[torch.Tensor, Metrics]:
    """On-policy REINFORCE: L = −A·logp (GPG, arXiv:2504.02546). No ratio, no clip."""
    log_ratio = _log_ratio(logp, old_logp, response_mask)
    safe_logp = torch.where(response_mask.bool(), logp, torch.zeros_like(logp))
    loss = -advantages.detach() * safe_logp
    return _valid(loss, response_mask), {
        "clipfrac": torch.zeros((), device=logp.device),
        "approx_kl": _approx_kl(log_ratio, response_mask),
    }


# ------------------------------------------------------------------------------ geo_mean


@dataclass
class GeoMeanParams:
    clip_low: float = 0.4
    """Log-space clip: the log-ratio is clipped below at −clip_low."""
    clip_high: float = 0.4
    """Log-space clip: the log-ratio is clipped above at +clip_high."""

    def __post_init__(self) -> None:
        if self.clip_low <= 0 or self.clip_high <= 0:
            raise ValueError(f"clip_low and clip_high must be > 0, got {self.clip_low}, {self.clip_high}")


def geo_mean(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
             response_mask: torch.Tensor, params: Optional[GeoMeanParams] = None
             ) -> tuple[torch.Tensor, Metrics]:
    """GMPO: maximise the geometric mean of token ratios, clipped in log space by sign(A).

    r_t = logp − old_logp; r̃_t = sign(A)·min(sign(A)·r_t, sign(A)·clip(r_t, −ε_low, ε_high));
    ratio_i = exp(mean_t r̃_t); Ā_i = mean_t A; L_i = −Ā_i·ratio_i, written on every valid
    token of sequence i (so ``seq-mean-token-mean`` gives the mean over sequences).
    Zhao et al. 2025 (arXiv:2507.20673); verl ``compute_policy_loss_geo_mean``.
    Registered with ``loss_agg="seq-mean-token-mean"``. Shapes ``(B, T)``.
    """
    params = params or GeoMeanParams()
    advantages = advantages.detach()
    log_ratio = _log_ratio(logp, old_logp, response_mask)
    sign = torch.sign(advantages)
    clamped = log_ratio.clamp(-params.clip_low, params.clip_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    lengths = response_mask.sum(-1).clamp(min=1)
    seq_ratio = torch.exp(masked_sum(pessimistic, response_mask, dim=-1) / lengths)
    seq_advantage = masked_sum(advantages, response_mask, dim=-1) / lengths
    per_sequence = -seq_advantage * seq_ratio
    loss = per_sequence[:, None].expand_as(logp)
    return _valid(loss, response_mask), {
        "clipfrac": _share(pessimistic != log_ratio, response_mask),
        "approx_kl": _approx_kl(log_ratio, response_mask),
    }


# ------------------------------------------------------------------------------ sapo


@dataclass
class SAPOParams:
    tau_pos: float = 1.0
    """Gate temperature for A > 0."""
    tau_neg: float = 1.05
    """Gate temperature for A ≤ 0."""

    def __post_init__(self) -> None:
        if self.tau_pos <= 0 or self.tau_neg <= 0:
            raise ValueError(f"tau_pos and tau_neg must be > 0, got {self.tau_pos}, {self.tau_neg}")


def sapo(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
         response_mask: torch.Tensor, params: Optional[SAPOParams] = None
         ) -> tuple[torch.Tensor, Metrics]:
    """SAPO: a soft gate instead of a clip: L = −A·(4/τ)·sigmoid(τ·(ρ − 1)), τ by sign(A).

    At ρ = 1 the gradient equals the policy gradient (4σ(0)(1 − σ(0)) = 1); it decays
    smoothly as ρ leaves 1. arXiv:2511.20347 (formula as in ALGORITHMS.md). Metric
    ``clipfrac``: share of valid tokens whose gate weight 4σ(1 − σ) fell below 0.5, i.e.
    whose gradient was damped by more than half. Shapes ``(B, T)``.
    """
    params = params or SAPOParams()
    advantages = advantages.detach()
    log_ratio = _log_ratio(logp, old_logp, response_mask)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, torch.full_like(ratio, params.tau_pos),
                      torch.full_like(ratio, params.tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1))
    loss = -advantages * (4 / tau) * gate
    weight = 4 * gate * (1 - gate)
    return _valid(loss, response_mask), {
        "clipfrac": _share(weight.detach() < 0.5, response_mask),
        "approx_kl": _approx_kl(log_ratio, response_mask),
    }


# ------------------------------------------------------------------------------ clip_cov / kl_cov


def _centred_covariance(advantages: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(A − mean A)·(logp − mean logp) per token, means over the valid tokens; detached."""
    adv = advantages.detach()
    lp = logp.detach()
    return (adv - masked_mean(adv, mask)) * (lp - masked_mean(lp, mask))


@dataclass
class ClipCovParams:
    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_ratio: float = 2e-4
    """Share of valid tokens (at least one) whose gradient is detached."""
    clip_cov_lb: float = 1.0
    """Only tokens with covariance in (lb, ub) are candidates."""
    clip_cov_ub: float = 5.0

    def __post_init__(self) -> None:
        _check_clip(self)
        if not 0 < self.clip_ratio <= 1:
            raise ValueError(f"clip_ratio must be in (0, 1], got {self.clip_ratio}")
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise ValueError(f"clip_cov_lb must be < clip_cov_ub, got {self.clip_cov_lb} >= {self.clip_cov_ub}")


def clip_cov(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
             response_mask: torch.Tensor, params: Optional[ClipCovParams] = None
             ) -> tuple[torch.Tensor, Metrics]:
    """Clip-Cov: PPO-clip, then detach (zero the loss of) a random ``clip_ratio`` share of
    the valid, not-already-clipped tokens whose centred covariance of logp and A lies in
    (clip_cov_lb, clip_cov_ub). Cui et al. 2025 (arXiv:2505.22617); verl
    ``compute_policy_loss_clip_cov``. The random pick uses torch's global RNG (seeded by
    the trainer, so runs are reproducible). Shapes ``(B, T)``.
    """
    params = params or ClipCovParams()
    advantages = advantages.detach()
    log_ratio = _log_ratio(logp, old_logp, response_mask)
    ratio = torch.exp(log_ratio)
    loss, clipped = _clipped_surrogate(ratio, advantages, params.clip_low, params.clip_high)
    valid = response_mask.bool()
    cov = _centred_covariance(advantages, logp, response_mask)
    candidates = (valid & ~clipped & (cov > params.clip_cov_lb) & (cov < params.clip_cov_ub)).flatten()
    n_detach = max(int(params.clip_ratio * float(response_mask.sum())), 1)
    index = candidates.nonzero().flatten()
    chosen = index[torch.randperm(len(index), device=index.device)[:n_detach]]
    keep = torch.ones(loss.numel(), dtype=loss.dtype, device=loss.device)
    keep[chosen] = 0.0
    keep = keep.view_as(loss)
    return _valid(loss * keep, response_mask), {
        "clipfrac": _share(clipped, response_mask),
        "cov_detached_frac": _share(keep == 0, response_mask),
        "approx_kl": _approx_kl(log_ratio, response_mask),
    }


@dataclass
class KLCovParams:
    kl_cov_ratio: float = 2e-4
    """Share of valid tokens (at least one), those with the largest covariance, penalised."""
    ppo_kl_coef: float = 1.0
    """Weight of the |logp − old_logp| penalty on those tokens."""

    def __post_init__(self) -> None:
        if not 0 < self.kl_cov_ratio <= 1:
            raise ValueError(f"kl_cov_ratio must be in (0, 1], got {self.kl_cov_ratio}")
        if self.ppo_kl_coef < 0:
            raise ValueError(f"ppo_kl_coef must be >= 0, got {self.ppo_kl_coef}")


def kl_cov(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
           response_mask: torch.Tensor, params: Optional[KLCovParams] = None
           ) -> tuple[torch.Tensor, Metrics]:
    """KL-Cov: unclipped surrogate −A·ρ, plus ppo_kl_coef·|logp − old_logp| on the top
    ``kl_cov_ratio`` share of valid tokens by centred covariance of logp and A.
    Cui et al. 2025 (arXiv:2505.22617); verl ``compute_policy_loss_kl_cov``.
    Shapes ``(B, T)``.
    """
    params = params or KLCovParams()
    advantages = advantages.detach()
    log_ratio = _log_ratio(logp, old_logp, response_mask)
    ratio = torch.exp(log_ratio)
    loss = -advantages * ratio
    valid = response_mask.bool().flatten()
    cov = _centred_covariance(advantages, logp, response_mask).flatten()
    n_valid = int(valid.sum())
    penalised = torch.zeros_like(valid)
    if n_valid:
        k = max(1, int(n_valid * params.kl_cov_ratio))
        masked_cov = torch.where(valid, cov, torch.full_like(cov, -torch.inf))
        penalised[torch.topk(masked_cov, k).indices] = True
    penalised = penalised.view_as(loss)
    loss = torch.where(penalised, loss + params.ppo_kl_coef * log_ratio.abs(), loss)
    return _valid(loss, response_mask), {
        "clipfrac": _share(penalised, response_mask),
        "approx_kl": _approx_kl(log_ratio, response_mask),
    }


@hookimpl
def rlzoo_register_policy_losses(register) -> None:
    register("ppo_clip", ppo_clip, params=PPOClipParams, aliases=("vanilla", "ppo"),
             description="PPO clipped surrogate (clip-higher via clip_high, INTELLECT-2 delta)",
             paper="arXiv:1707.06347")
    register("dual_clip", dual_clip, params=DualClipParams,
             description="PPO with a lower bound -c*A for negative advantages", paper="arXiv:1912.09729")
    register("gspo", gspo, params=GSPOParams, loss_agg="seq-mean-token-mean",
             description="sequence-level importance ratio and clipping", paper="arXiv:2507.18071")
    register("cispo", cispo, params=CISPOParams,
             description="clipped stop-gradient IS weight on a REINFORCE loss", paper="arXiv:2506.13585")
    register("vanilla_pg", vanilla_pg, description="on-policy REINFORCE: -A*logp",
             paper="arXiv:2504.02546")
    register("geo_mean", geo_mean, params=GeoMeanParams, loss_agg="seq-mean-token-mean",
             description="GMPO: geometric mean of token ratios, log-space clip", paper="arXiv:2507.20673")
    register("sapo", sapo, params=SAPOParams, description="soft sigmoid gate instead of a hard clip",
             paper="arXiv:2511.20347")
    register("clip_cov", clip_cov, params=ClipCovParams,
             description="detach a few high-covariance tokens (entropy collapse)", paper="arXiv:2505.22617")
    register("kl_cov", kl_cov, params=KLCovParams,
             description="KL-penalise the highest-covariance tokens (entropy collapse)",
             paper="arXiv:2505.22617")
