"""Policy losses: per-token surrogate losses; the engine aggregates them with ``loss_agg``.

Formulas: ../docs/algorithms/policy_losses.md (from ALGORITHMS.md "Policy losses", following
verl ``verl/trainer/ppo/core_algos.py``: ``compute_policy_loss_vanilla``, ``_gspo``,
``_gpg``, ``_clip_cov``, ``_kl_cov``, ``_geo_mean``, ``_sapo``, ``_cispo``, ``_dro``).

Every loss is called as ``fn(logp, old_logp, advantages, response_mask, params=...)``, all
``(B, T)``, and returns ``(loss, metrics)``:

- ``loss``: the per-token loss ``(B, T)``, exactly 0 on padding, *not* aggregated;
- ``metrics``: detached scalar tensors, masked means over the valid tokens: ``clipfrac``
  (share of valid tokens where clipping changed the loss), ``approx_kl`` (mean of
  ``old_logp − logp``) and loss-specific extras.

The gradient flows through ``logp`` only: ``old_logp`` and ``advantages`` are detached here
whatever the caller passes. Padded positions are replaced by 0 before any arithmetic, so
NaN/inf there can reach neither a valid output nor a gradient. Every importance ratio is
``_ratio(log_ratio) = exp(clamp(log_ratio, −20, 20))`` (ALGORITHMS.md; as verl's
``compute_policy_loss_vanilla``), for token ratios and for the sequence ratios of GSPO and
GMPO alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from rlzoo.api import hookimpl, masked_mean, masked_sum

RLZOO_API_VERSION = "2"

LOG_RATIO_CLAMP = 20.0
"""|log ρ| is clamped to this before exp: ρ ∈ [e^−20, e^20], finite in float32 and bf16."""

Metrics = dict[str, torch.Tensor]


# ---------------------------------------------------------------------------- shared pieces


def _ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """ρ = exp(clamp(log_ratio, −20, 20)): the one importance-ratio helper of this module.

    Outside the clamp range the gradient is 0 (the clamp is flat there), as in verl.
    """
    return torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def _prepare(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logp, old_logp, advantages, valid, mask) with padding zeroed and the inputs detached.

    ``logp`` keeps its gradient at valid positions (``where`` sends 0 to padding);
    ``old_logp`` and ``advantages`` are detached. ``valid`` is the boolean mask, ``mask``
    the same as a float tensor of ``logp``'s dtype for the masked reductions.
    """
    valid = response_mask.bool()
    logp = torch.where(valid, logp, torch.zeros_like(logp))
    old_logp = torch.where(valid, old_logp.detach(), torch.zeros_like(old_logp))
    advantages = torch.where(valid, advantages.detach(), torch.zeros_like(advantages))
    return logp, old_logp, advantages, valid, valid.to(logp.dtype)


def _on_valid(loss: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``loss`` on valid tokens, exactly 0 on padding."""
    return torch.where(valid, loss, torch.zeros_like(loss))


def _share(condition: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Detached share of valid tokens where ``condition`` holds (0 for an empty mask)."""
    return masked_mean(condition.to(mask.dtype), mask).detach()


def _approx_kl(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Detached masked mean of ``old_logp − logp`` (verl's ``ppo_kl``)."""
    return masked_mean(old_logp - logp, mask).detach()


def _clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    delta: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO surrogate max(−A·ρ', −A·clip(ρ, 1 − ε_low, 1 + ε_high)) and where the clip won.

    ρ' = ρ, or min(ρ, δ) where A < 0 when ``delta`` is given (INTELLECT-2). "Won" is
    verl's ``pg_losses2 > pg_losses1``: the clipped term is strictly larger, so the loss
    differs from the unclipped one (and its gradient through ρ is 0).
    """
    unclipped_ratio = ratio
    if delta is not None:
        unclipped_ratio = torch.where(advantages < 0, ratio.clamp(max=delta), ratio)
    unclipped = -advantages * unclipped_ratio
    clipped = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def _check_ppo_clip_range(clip_low: float, clip_high: float) -> None:
    if not 0 < clip_low < 1:
        raise ValueError(f"clip_low must be in (0, 1), got {clip_low}")
    if not clip_high > 0:
        raise ValueError(f"clip_high must be > 0, got {clip_high}")


def _centred_covariance(advantages: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(A − mean A)·(logp − mean logp) per token, means over the valid tokens; detached.

    The token-level covariance term of Cui et al. 2025 (arXiv:2505.22617), as verl's
    ``compute_policy_loss_clip_cov`` / ``_kl_cov`` compute it (means over the whole
    (micro-)batch given to the loss).
    """
    adv, lp = advantages.detach(), logp.detach()
    return (adv - masked_mean(adv, mask)) * (lp - masked_mean(lp, mask))


# ---------------------------------------------------------------------------- ppo_clip


@dataclass
class PPOClipParams:
    """Parameters of ``ppo_clip``."""

    clip_low: float = 0.2
    """ε_low: ρ is clipped below at 1 − ε_low; in (0, 1)."""
    clip_high: float = 0.2
    """ε_high: ρ is clipped above at 1 + ε_high; > 0 (ε_high > ε_low is DAPO's clip-higher)."""
    delta: Optional[float] = None
    """INTELLECT-2 two-sided clip: for A < 0 the unclipped ratio is capped at δ; > 1 + clip_high."""

    def __post_init__(self) -> None:
        _check_ppo_clip_range(self.clip_low, self.clip_high)
        if self.delta is not None and not self.delta > 1 + self.clip_high:
            raise ValueError(f"delta must be > 1 + clip_high = {1 + self.clip_high}, got {self.delta}")


def ppo_clip(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: Optional[PPOClipParams] = None,
) -> tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate: L = max(−A·ρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high)).

    With ``delta`` (INTELLECT-2, arXiv:2505.07291, as TRL's ``GRPOConfig.delta``): the
    unclipped term uses min(ρ, δ), which for A < 0 caps the loss at −A·δ (for A > 0 it
    changes nothing because δ > 1 + ε_high). Schulman et al. 2017 (arXiv:1707.06347);
    clip-higher: DAPO (arXiv:2503.14476); verl ``compute_policy_loss_vanilla``.

    :param logp: ``(B, T)`` log-probs of the sampled tokens under the trained policy.
    :param old_logp: ``(B, T)`` log-probs under the rollout policy (no gradient).
    :param advantages: ``(B, T)`` advantages (no gradient).
    :param response_mask: ``(B, T)``, 1 on valid tokens.
    :return: loss ``(B, T)``; metrics ``clipfrac``, ``approx_kl`` and, with ``delta``,
        ``clipfrac_delta`` (share of valid tokens where the δ cap was active).
    """
    params = params or PPOClipParams()
    logp, old_logp, advantages, valid, mask = _prepare(logp, old_logp, advantages, response_mask)
    ratio = _ratio(logp - old_logp)
    loss, clipped = _clipped_surrogate(ratio, advantages, params.clip_low, params.clip_high,
                                       params.delta)
    metrics = {"clipfrac": _share(clipped, mask), "approx_kl": _approx_kl(logp, old_logp, mask)}
    if params.delta is not None:
        metrics["clipfrac_delta"] = _share((advantages < 0) & (ratio > params.delta), mask)
    return _on_valid(loss, valid), metrics


# ---------------------------------------------------------------------------- dual_clip


@dataclass
class DualClipParams:
    """Parameters of ``dual_clip``."""

    clip_low: float = 0.2
    """ε_low; in (0, 1)."""
    clip_high: float = 0.2
    """ε_high; > 0."""
    clip_ratio_c: float = 3.0
    """c: for A < 0 the loss is at most −c·A; must be > 1."""

    def __post_init__(self) -> None:
        _check_ppo_clip_range(self.clip_low, self.clip_high)
        if not self.clip_ratio_c > 1:
            raise ValueError(f"clip_ratio_c must be > 1, got {self.clip_ratio_c}")


def dual_clip(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: Optional[DualClipParams] = None,
) -> tuple[torch.Tensor, Metrics]:
    """Dual-clip PPO: L = min(ppo_clip, −c·A) for A < 0; L = ppo_clip for A ≥ 0.

    Ye et al. 2019 (arXiv:1912.09729); verl ``compute_policy_loss_vanilla`` with
    ``clip_ratio_c``. All tensors ``(B, T)``.

    :return: loss ``(B, T)``; metrics ``clipfrac`` (the ε clip), ``clipfrac_lower`` (share
        of valid tokens with A < 0 where the −c·A bound was active, verl's
        ``pg_clipfrac_lower``) and ``approx_kl``.
    """
    params = params or DualClipParams()
    logp, old_logp, advantages, valid, mask = _prepare(logp, old_logp, advantages, response_mask)
    ratio = _ratio(logp - old_logp)
    ppo_loss, clipped = _clipped_surrogate(ratio, advantages, params.clip_low, params.clip_high)
    lower_bound = -params.clip_ratio_c * advantages
    negative = advantages < 0
    loss = torch.where(negative, torch.minimum(ppo_loss, lower_bound), ppo_loss)
    return _on_valid(loss, valid), {
        "clipfrac": _share(clipped, mask),
        "clipfrac_lower": _share(negative & (ppo_loss > lower_bound), mask),
        "approx_kl": _approx_kl(logp, old_logp, mask),
    }


# ---------------------------------------------------------------------------- gspo


@dataclass
class GSPOParams:
    """Parameters of ``gspo`` (the paper's clip ranges are tiny: sequence ratios stay near 1)."""

    clip_low: float = 3e-4
    """ε_low on the sequence ratio; in (0, 1)."""
    clip_high: float = 4e-4
    """ε_high on the sequence ratio; > 0."""

    def __post_init__(self) -> None:
        _check_ppo_clip_range(self.clip_low, self.clip_high)


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
    logp, old_logp, advantages, valid, mask = _prepare(logp, old_logp, advantages, response_mask)
    seq_log_ratio = masked_mean(logp - old_logp, mask, dim=-1)                  # (B,)
    token_log_ratio = logp - logp.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = _ratio(token_log_ratio)
    loss, clipped = _clipped_surrogate(ratio, advantages, params.clip_low, params.clip_high)
    return _on_valid(loss, valid), {
        "clipfrac": _share(clipped, mask),
        "approx_kl": _approx_kl(logp, old_logp, mask),
    }


# ---------------------------------------------------------------------------- cispo


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
    logp, old_logp, advantages, valid, mask = _prepare(logp, old_logp, advantages, response_mask)
    ratio = _ratio(logp - old_logp).detach()
    low, high = 1 - params.clip_low, 1 + params.clip_high
    weight = ratio.clamp(low, high)
    loss = -weight * advantages * logp
    return _on_valid(loss, valid), {
        "clipfrac": _share((ratio < low) | (ratio > high), mask),
        "approx_kl": _approx_kl(logp, old_logp, mask),
    }


# ---------------------------------------------------------------------------- vanilla_pg


def vanilla_pg(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, Metrics]:
    """On-policy REINFORCE: L = −A·logp; no ratio, no clip.

    GPG (arXiv:2504.02546); verl ``compute_policy_loss_gpg``. All tensors ``(B, T)``.

    :return: loss ``(B, T)``; metrics ``clipfrac`` (always 0) and ``approx_kl``.
    """
    logp, old_logp, advantages, valid, mask = _prepare(logp, old_logp, advantages, response_mask)
    return _on_valid(-advantages * logp, valid), {
        "clipfrac": torch.zeros((), dtype=mask.dtype, device=mask.device),
        "approx_kl": _approx_kl(logp, old_logp, mask),
    }


# ---------------------------------------------------------------------------- dro


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
    logp, old_logp, advantages, valid, mask = _prepare(logp, old_logp, advantages, response_mask)
    log_ratio = logp - old_logp
    half_square = 0.5 * log_ratio.square()
    loss = -(advantages * logp - params.beta * half_square)
    return _on_valid(loss, valid), {
        "clipfrac": torch.zeros((), dtype=mask.dtype, device=mask.device),
        "penalty": masked_mean(half_square, mask).detach(),
        "approx_kl": _approx_kl(logp, old_logp, mask),
    }


# ---------------------------------------------------------------------------- geo_mean


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
    logp, old_logp, advantages, valid, mask = _prepare(logp, old_logp, advantages, response_mask)
    kept, kept_mask = valid, mask
    if correction_weights is not None:
        weights = correction_weights.detach().to(logp.dtype)
        kept = valid & (weights > 0)
        kept_mask = kept.to(logp.dtype)
    log_ratio = logp - old_logp
    sign = torch.sign(advantages)
    bounded = log_ratio.clamp(-params.clip_low, params.clip_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * bounded)
    seq_ratio = _ratio(masked_mean(pessimistic, kept_mask, dim=-1))              # (B,)
    seq_advantage = masked_mean(advantages, kept_mask, dim=-1)                    # (B,)
    per_sequence = -seq_advantage * seq_ratio
    if correction_weights is not None:
        log_weights = torch.where(kept, weights, torch.ones_like(weights)).log()
        per_sequence = per_sequence * torch.exp(masked_mean(log_weights, kept_mask, dim=-1))
    loss = per_sequence.unsqueeze(-1).expand_as(log_ratio)
    clipped = ((advantages > 0) & (log_ratio > params.clip_high)) | (
        (advantages < 0) & (log_ratio < -params.clip_low))
    return _on_valid(loss, valid), {
        "clipfrac": _share(clipped, mask),
        "approx_kl": _approx_kl(logp, old_logp, mask),
    }


# ---------------------------------------------------------------------------- sapo


@dataclass
class SAPOParams:
    """Parameters of ``sapo``: temperatures of the soft gate."""

    tau_pos: float = 1.0
    """τ for tokens with A > 0; > 0."""
    tau_neg: float = 1.05
    """τ for tokens with A ≤ 0; > 0 (larger: the gate closes faster for negative tokens)."""

    def __post_init__(self) -> None:
        if not self.tau_pos > 0:
            raise ValueError(f"tau_pos must be > 0, got {self.tau_pos}")
        if not self.tau_neg > 0:
            raise ValueError(f"tau_neg must be > 0, got {self.tau_neg}")


def sapo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: Optional[SAPOParams] = None,
) -> tuple[torch.Tensor, Metrics]:
    """SAPO: a soft gate instead of a hard clip: L = −A·(4/τ)·sigmoid(τ·(ρ − 1)).

    τ = τ_pos where A > 0, τ_neg elsewhere. The gradient wrt ρ is −A·w with
    w = 4σ(1 − σ): w = 1 at ρ = 1 (the plain policy gradient there), decaying smoothly as ρ
    moves away. SAPO (arXiv:2511.20347); the gate as verl ``compute_policy_loss_sapo`` and
    TRL ``get_sapo_token_loss``. Tensors ``(B, T)``.

    :return: loss ``(B, T)``; metrics ``clipfrac`` (always 0: nothing is clipped),
        ``gate_weight`` (masked mean of w: 1 undamped, → 0 fully damped) and ``approx_kl``.
    """
    params = params or SAPOParams()
    logp, old_logp, advantages, valid, mask = _prepare(logp, old_logp, advantages, response_mask)
    ratio = _ratio(logp - old_logp)
    tau = torch.where(advantages > 0, torch.full_like(ratio, params.tau_pos),
                      torch.full_like(ratio, params.tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1))
    loss = -advantages * (4 / tau) * gate
    gate = gate.detach()
    return _on_valid(loss, valid), {
        "clipfrac": torch.zeros((), dtype=mask.dtype, device=mask.device),
        "gate_weight": masked_mean(4 * gate * (1 - gate), mask).detach(),
        "approx_kl": _approx_kl(logp, old_logp, mask),
    }


# ---------------------------------------------------------------------------- clip_cov


@dataclass
class ClipCovParams:
    """Parameters of ``clip_cov`` (names as verl's ``policy_loss`` config)."""

    clip_low: float = 0.2
    """ε_low of the PPO clip; in (0, 1)."""
    clip_high: float = 0.2
    """ε_high of the PPO clip; > 0."""
    clip_ratio: float = 2e-4
    """Share of valid tokens (⌊share·N⌋, at least 1) whose gradient is cut; in (0, 1]."""
    clip_cov_lb: float = 1.0
    """Only tokens with covariance strictly between lb and ub are candidates."""
    clip_cov_ub: float = 5.0
    """Upper covariance bound; > clip_cov_lb."""

    def __post_init__(self) -> None:
        _check_ppo_clip_range(self.clip_low, self.clip_high)
        if not 0 < self.clip_ratio <= 1:
            raise ValueError(f"clip_ratio must be in (0, 1], got {self.clip_ratio}")
        if not self.clip_cov_ub > self.clip_cov_lb:
            raise ValueError(
                f"clip_cov_ub must be > clip_cov_lb = {self.clip_cov_lb}, got {self.clip_cov_ub}")


def clip_cov(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: Optional[ClipCovParams] = None,
) -> tuple[torch.Tensor, Metrics]:
    """Clip-Cov: PPO-clip, with the loss (and gradient) of a few high-covariance tokens cut.

    cov_t = (A_t − mean A)·(logp_t − mean logp) (means over the valid tokens). Candidates:
    valid tokens not already PPO-clipped with clip_cov_lb < cov_t < clip_cov_ub. Of them,
    k = min(max(⌊clip_ratio·N_valid⌋, 1), N_candidates) are picked at random and their
    loss is multiplied by 0. Cui et al. 2025 (arXiv:2505.22617); verl
    ``compute_policy_loss_clip_cov``, step for step.

    The pick is deterministic given torch's global RNG: the candidates are listed in
    row-major order and the first k of ``torch.randperm(N_candidates)`` (drawn on the CPU
    generator, as verl does) are taken, so a seeded run (the trainer calls
    ``torch.manual_seed(seed)``) repeats exactly, on CPU and GPU alike. One draw is
    consumed per call that has candidates. Tensors ``(B, T)``.

    :return: loss ``(B, T)``; metrics ``clipfrac`` (the PPO clip), ``cov_detached_frac``
        (share of valid tokens cut by the covariance rule, verl's ``pg_clipfrac`` for this
        loss) and ``approx_kl``.
    """
    params = params or ClipCovParams()
    logp, old_logp, advantages, valid, mask = _prepare(logp, old_logp, advantages, response_mask)
    ratio = _ratio(logp - old_logp)
    loss, clipped = _clipped_surrogate(ratio, advantages, params.clip_low, params.clip_high)
    cov = _centred_covariance(advantages, logp, mask)
    candidates = valid & ~clipped & (cov > params.clip_cov_lb) & (cov < params.clip_cov_ub)
    candidate_index = candidates.flatten().nonzero().squeeze(-1)                  # row-major
    n_cut = max(int(params.clip_ratio * int(valid.sum())), 1)
    cut = torch.zeros(loss.numel(), dtype=torch.bool, device=loss.device)
    if candidate_index.numel() > 0:
        order = torch.randperm(candidate_index.numel())[:n_cut].to(candidate_index.device)
        cut[candidate_index[order]] = True
    cut = cut.view_as(loss)
    loss = torch.where(cut, torch.zeros_like(loss), loss)
    return _on_valid(loss, valid), {
        "clipfrac": _share(clipped, mask),
        "cov_detached_frac": _share(cut, mask),
        "approx_kl": _approx_kl(logp, old_logp, mask),
    }


# ---------------------------------------------------------------------------- kl_cov


@dataclass
class KLCovParams:
    """Parameters of ``kl_cov`` (names as verl's ``policy_loss`` config)."""

    kl_cov_ratio: float = 2e-4
    """Share of valid tokens (⌊share·N⌋, at least 1), those with the largest covariance, penalised; in (0, 1]."""
    ppo_kl_coef: float = 0.1
    """Weight of the |logp − old_logp| penalty on those tokens; ≥ 0. verl's config default
    (``policy_loss.ppo_kl_coef: 0.1``; the 1.0 inside ``compute_policy_loss_kl_cov`` is only its
    fallback for a missing key)."""

    def __post_init__(self) -> None:
        if not 0 < self.kl_cov_ratio <= 1:
            raise ValueError(f"kl_cov_ratio must be in (0, 1], got {self.kl_cov_ratio}")
        if not self.ppo_kl_coef >= 0:
            raise ValueError(f"ppo_kl_coef must be >= 0, got {self.ppo_kl_coef}")


def kl_cov(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: Optional[KLCovParams] = None,
) -> tuple[torch.Tensor, Metrics]:
    """KL-Cov: unclipped surrogate −A·ρ, plus ppo_kl_coef·|logp − old_logp| on the
    k = max(⌊kl_cov_ratio·N_valid⌋, 1) valid tokens with the largest centred covariance
    (A_t − mean A)·(logp_t − mean logp).

    Cui et al. 2025 (arXiv:2505.22617); verl ``compute_policy_loss_kl_cov`` (``topk`` over
    the valid tokens). Deterministic. Tensors ``(B, T)``.

    :return: loss ``(B, T)``; metrics ``clipfrac`` (share of valid tokens penalised: KL-Cov's
        counterpart of clipping; verl logs 0) and ``approx_kl``.
    """
    params = params or KLCovParams()
    logp, old_logp, advantages, valid, mask = _prepare(logp, old_logp, advantages, response_mask)
    log_ratio = logp - old_logp
    loss = -advantages * _ratio(log_ratio)
    flat_valid = valid.flatten()
    n_valid = int(flat_valid.sum())
    penalised = torch.zeros_like(flat_valid)
    if n_valid > 0:
        k = max(int(params.kl_cov_ratio * n_valid), 1)
        cov = _centred_covariance(advantages, logp, mask).flatten()
        cov = torch.where(flat_valid, cov, torch.full_like(cov, -torch.inf))
        penalised[torch.topk(cov, k).indices] = True
    penalised = penalised.view_as(loss)
    loss = torch.where(penalised, loss + params.ppo_kl_coef * log_ratio.abs(), loss)
    return _on_valid(loss, valid), {
        "clipfrac": _share(penalised, mask),
        "approx_kl": _approx_kl(logp, old_logp, mask),
    }


# ---------------------------------------------------------------------------- luspo


@dataclass
class LUSPOParams(GSPOParams):
    """Parameters of ``luspo``: GSPO's, with the clip ranges of the LUSPO paper's runs."""

    clip_low: float = 2e-3
    """ε_low on the sequence ratio; in (0, 1) (LUSPO §5.1 via TRL's reproduction config)."""
    clip_high: float = 2.5e-3
    """ε_high on the sequence ratio; > 0."""


# luspo is gspo's per-token loss (the function above) aggregated with seq-mean-token-sum:
# (1/B)·Σ_i Σ_t L_i = (1/B)·Σ_i |y_i|·L_i, the GSPO objective times each response's length.


# ---------------------------------------------------------------------------- vespo


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
    logp, old_logp, advantages, valid, mask = _prepare(logp, old_logp, advantages, response_mask)
    token_log_ratio = (logp - old_logp).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    log_w = masked_sum(token_log_ratio, mask, dim=-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)   # (B,)
    positive = masked_mean(advantages, mask, dim=-1) >= 0                                     # (B,)
    k = torch.where(positive, torch.full_like(log_w, params.k_pos), torch.full_like(log_w, params.k_neg))
    lam = torch.where(positive, torch.full_like(log_w, params.lam_pos), torch.full_like(log_w, params.lam_neg))
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))                                  # (B,)
    loss = -phi.unsqueeze(-1) * advantages * logp
    non_empty = (mask.sum(-1) > 0).to(mask.dtype)
    return _on_valid(loss, valid), {
        "clipfrac": torch.zeros((), dtype=mask.dtype, device=mask.device),
        "weight_mean": masked_mean(phi, non_empty).detach(),
        "approx_kl": _approx_kl(logp, old_logp, mask),
    }


# ---------------------------------------------------------------------------- dppo

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
    logp, old_logp, advantages, valid, mask = _prepare(logp, old_logp, advantages, response_mask)
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
    return _on_valid(loss, valid), {
        "clipfrac": _share(masked, mask),
        "clipfrac_lower": _share(masked & ~positive, mask),
        "approx_kl": _approx_kl(logp, old_logp, mask),
    }


# ---------------------------------------------------------------------------- registration


@hookimpl
def rlzoo_register_policy_losses(register) -> None:
    register("ppo_clip", ppo_clip, params=PPOClipParams, aliases=("ppo",),
             retired_aliases={"vanilla": "verl's name for ppo_clip, too easily read as vanilla_pg "
                                         "(REINFORCE); retired in rlzoo 0.2"},
             description="PPO clipped surrogate (clip-higher via clip_high, INTELLECT-2 delta)",
             paper="arXiv:1707.06347")
    register("dual_clip", dual_clip, params=DualClipParams,
             description="PPO with the loss of negative advantages bounded by -c*A",
             paper="arXiv:1912.09729")
    register("gspo", gspo, params=GSPOParams, loss_agg="seq-mean-token-mean",
             description="sequence-level (length-normalised) importance ratio and clipping",
             paper="arXiv:2507.18071")
    register("luspo", gspo, params=LUSPOParams, loss_agg="seq-mean-token-sum",
             description="GSPO's loss times each response's length (length-unbiased sequence ratio)",
             paper="arXiv:2602.05261")
    register("vespo", vespo, params=VESPOParams,
             description="REINFORCE weighted by w^k·e^{λ(1−w)} of the sequence ratio (smooth, no clip)",
             paper="arXiv:2602.10693")
    register("dppo", dppo, params=DPPOParams,
             description="REINFORCE with a capped IS weight; mask tokens whose probability moved > δ with A",
             paper="arXiv:2602.04879")
    register("cispo", cispo, params=CISPOParams,
             description="REINFORCE weighted by the clipped, stop-gradient importance ratio",
             paper="arXiv:2506.13585")
    register("vanilla_pg", vanilla_pg, aliases=("gpg",), ratio_free=True,
             description="on-policy REINFORCE: -A*logp", paper="arXiv:2504.02546")
    register("dro", dro, params=DROParams,
             description="REINFORCE with a quadratic log-ratio penalty ½β(logp − old_logp)² instead of a clip",
             paper="arXiv:2405.19107")
    register("geo_mean", geo_mean, params=GeoMeanParams, aliases=("gmpo",),
             loss_agg="seq-mean-token-mean",
             description="GMPO: geometric mean of token ratios, sign-aware log-space clip",
             paper="arXiv:2507.20673")
    register("sapo", sapo, params=SAPOParams,
             description="soft sigmoid gate on the ratio instead of a hard clip",
             paper="arXiv:2511.20347")
    register("clip_cov", clip_cov, params=ClipCovParams,
             description="PPO clip, plus cut the gradient of a few high-covariance tokens",
             paper="arXiv:2505.22617")
    register("kl_cov", kl_cov, params=KLCovParams,
             description="KL-penalise the highest-covariance tokens (entropy collapse)",
             paper="arXiv:2505.22617")
