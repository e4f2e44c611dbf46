"""Policy losses that clip or gate the token ratio ρ = π/π_old: PPO's clipped surrogate and
its variants (dual clip, SAPO's soft gate, Clip-Cov and KL-Cov against entropy collapse).

The call convention, shapes and metrics: :mod:`rlzoo_plugins.loss_parts`. Formulas:
../docs/algorithms/policy_losses.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from rlzoo.api import hookimpl, masked_mean
from rlzoo_plugins.loss_parts import (Metrics, approx_kl, centred_covariance, check_ppo_clip_range, clipped_surrogate,
                                      importance_ratio, on_valid, prepare, share)

RLZOO_API_VERSION = "2"


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
        check_ppo_clip_range(self.clip_low, self.clip_high)
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
    logp, old_logp, advantages, valid, mask = prepare(logp, old_logp, advantages, response_mask)
    ratio = importance_ratio(logp - old_logp)
    loss, clipped = clipped_surrogate(ratio, advantages, params.clip_low, params.clip_high,
                                       params.delta)
    metrics = {"clipfrac": share(clipped, mask), "approx_kl": approx_kl(logp, old_logp, mask)}
    if params.delta is not None:
        metrics["clipfrac_delta"] = share((advantages < 0) & (ratio > params.delta), mask)
    return on_valid(loss, valid), metrics


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
        check_ppo_clip_range(self.clip_low, self.clip_high)
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
    logp, old_logp, advantages, valid, mask = prepare(logp, old_logp, advantages, response_mask)
    ratio = importance_ratio(logp - old_logp)
    ppo_loss, clipped = clipped_surrogate(ratio, advantages, params.clip_low, params.clip_high)
    lower_bound = -params.clip_ratio_c * advantages
    negative = advantages < 0
    loss = torch.where(negative, torch.minimum(ppo_loss, lower_bound), ppo_loss)
    return on_valid(loss, valid), {
        "clipfrac": share(clipped, mask),
        "clipfrac_lower": share(negative & (ppo_loss > lower_bound), mask),
        "approx_kl": approx_kl(logp, old_logp, mask),
    }


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
    logp, old_logp, advantages, valid, mask = prepare(logp, old_logp, advantages, response_mask)
    ratio = importance_ratio(logp - old_logp)
    tau = torch.where(advantages > 0, torch.full_like(ratio, params.tau_pos),
                      torch.full_like(ratio, params.tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1))
    loss = -advantages * (4 / tau) * gate
    gate = gate.detach()
    return on_valid(loss, valid), {
        "clipfrac": torch.zeros((), dtype=mask.dtype, device=mask.device),
        "gate_weight": masked_mean(4 * gate * (1 - gate), mask).detach(),
        "approx_kl": approx_kl(logp, old_logp, mask),
    }


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
        check_ppo_clip_range(self.clip_low, self.clip_high)
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
    logp, old_logp, advantages, valid, mask = prepare(logp, old_logp, advantages, response_mask)
    ratio = importance_ratio(logp - old_logp)
    loss, clipped = clipped_surrogate(ratio, advantages, params.clip_low, params.clip_high)
    cov = centred_covariance(advantages, logp, mask)
    candidates = valid & ~clipped & (cov > params.clip_cov_lb) & (cov < params.clip_cov_ub)
    candidate_index = candidates.flatten().nonzero().squeeze(-1)                  # row-major
    n_cut = max(int(params.clip_ratio * int(valid.sum())), 1)
    cut = torch.zeros(loss.numel(), dtype=torch.bool, device=loss.device)
    if candidate_index.numel() > 0:
        order = torch.randperm(candidate_index.numel())[:n_cut].to(candidate_index.device)
        cut[candidate_index[order]] = True
    cut = cut.view_as(loss)
    loss = torch.where(cut, torch.zeros_like(loss), loss)
    return on_valid(loss, valid), {
        "clipfrac": share(clipped, mask),
        "cov_detached_frac": share(cut, mask),
        "approx_kl": approx_kl(logp, old_logp, mask),
    }


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
    logp, old_logp, advantages, valid, mask = prepare(logp, old_logp, advantages, response_mask)
    log_ratio = logp - old_logp
    loss = -advantages * importance_ratio(log_ratio)
    flat_valid = valid.flatten()
    n_valid = int(flat_valid.sum())
    penalised = torch.zeros_like(flat_valid)
    if n_valid > 0:
        k = max(int(params.kl_cov_ratio * n_valid), 1)
        cov = centred_covariance(advantages, logp, mask).flatten()
        cov = torch.where(flat_valid, cov, torch.full_like(cov, -torch.inf))
        penalised[torch.topk(cov, k).indices] = True
    penalised = penalised.view_as(loss)
    loss = torch.where(penalised, loss + params.ppo_kl_coef * log_ratio.abs(), loss)
    return on_valid(loss, valid), {
        "clipfrac": share(penalised, mask),
        "approx_kl": approx_kl(logp, old_logp, mask),
    }


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
    register("sapo", sapo, params=SAPOParams,
             description="soft sigmoid gate on the ratio instead of a hard clip",
             paper="arXiv:2511.20347")
    register("clip_cov", clip_cov, params=ClipCovParams,
             description="PPO clip, plus cut the gradient of a few high-covariance tokens",
             paper="arXiv:2505.22617")
    register("kl_cov", kl_cov, params=KLCovParams,
             description="KL-penalise the highest-covariance tokens (entropy collapse)",
             paper="arXiv:2505.22617")
