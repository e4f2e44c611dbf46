"""The pieces every policy loss of the zoo shares: the call convention and its helpers.

Formulas: ../docs/algorithms/policy_losses.md (from ALGORITHMS.md "Policy losses", following
verl ``verl/trainer/ppo/core_algos.py``). The losses live in three family modules:
``clip_losses`` (PPO's clipped surrogate and the losses that clip or gate the token ratio),
``sequence_losses`` (a ratio per sequence: GSPO, LUSPO, GMPO, VESPO) and
``reinforce_losses`` (−w·A·logp with a weight, penalty or mask in place of a clipped
surrogate: vanilla PG, CISPO, DRO, DPPO).

Every loss is called as ``fn(logp, old_logp, advantages, response_mask, params=...)``, all
``(B, T)``, and returns ``(loss, metrics)``:

- ``loss``: the per-token loss ``(B, T)``, exactly 0 on padding, *not* aggregated;
- ``metrics``: detached scalar tensors, masked means over the valid tokens: ``clipfrac``
  (share of valid tokens where clipping changed the loss), ``approx_kl`` (mean of
  ``old_logp − logp``) and loss-specific extras.

The gradient flows through ``logp`` only: ``old_logp`` and ``advantages`` are detached here
whatever the caller passes. Padded positions are replaced by 0 before any arithmetic, so
NaN/inf there can reach neither a valid output nor a gradient. Every importance ratio is
``importance_ratio(log_ratio) = exp(clamp(log_ratio, −20, 20))`` (ALGORITHMS.md; as verl's
``compute_policy_loss_vanilla``), for token ratios and for the sequence ratios of GSPO and
GMPO alike; outside the clamp range the gradient is 0 (the clamp is flat there), as in verl.
"""

from __future__ import annotations

from typing import Optional

import torch

from rlzoo.api import clamped_exp, masked_mean

Metrics = dict[str, "torch.Tensor"]  # a string: importing the plugin must not load torch (rlzoo list)

importance_ratio = clamped_exp
"""ρ = exp(clamp(log_ratio, −20, 20)): the one importance-ratio helper of the losses."""


def prepare(
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


def on_valid(loss: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``loss`` on valid tokens, exactly 0 on padding."""
    return torch.where(valid, loss, torch.zeros_like(loss))


def share(condition: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Detached share of valid tokens where ``condition`` holds (0 for an empty mask)."""
    return masked_mean(condition.to(mask.dtype), mask).detach()


def approx_kl(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Detached masked mean of ``old_logp − logp`` (verl's ``ppo_kl``)."""
    return masked_mean(old_logp - logp, mask).detach()


def clipped_surrogate(
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


def check_ppo_clip_range(clip_low: float, clip_high: float) -> None:
    if not 0 < clip_low < 1:
        raise ValueError(f"clip_low must be in (0, 1), got {clip_low}")
    if not clip_high > 0:
        raise ValueError(f"clip_high must be > 0, got {clip_high}")


def centred_covariance(advantages: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(A − mean A)·(logp − mean logp) per token, means over the valid tokens; detached.

    The token-level covariance term of Cui et al. 2025 (arXiv:2505.22617), as verl's
    ``compute_policy_loss_clip_cov`` / ``_kl_cov`` compute it (means over the whole
    (micro-)batch given to the loss).
    """
    adv, lp = advantages.detach(), logp.detach()
    return (adv - masked_mean(adv, mask)) * (lp - masked_mean(lp, mask))
