"""Critic (value) losses.

Formulas: ../docs/algorithms/value.md (from ALGORITHMS.md "Value loss", following verl
``core_algos.compute_value_loss``, itself from TRL's PPO trainer).

The loss returns the per-token matrix; the engine aggregates it with the run's
``loss_agg`` mode, so the ½ sits inside the per-token loss here (verl applies it after
aggregation, which is the same for every mode since each is linear in L).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from rlzoo.api import hookimpl, masked_mean

RLZOO_API_VERSION = "2"


@dataclass
class ClippedValueParams:
    """Parameters of ``clipped``.

    :ivar clip_range: ε_v, how far the new value may move from the rollout's value before
        the clipped branch takes over.
    """

    clip_range: float = 0.2

    def __post_init__(self) -> None:
        if not self.clip_range > 0:
            raise ValueError(f"clip_range must be > 0, got {self.clip_range}")


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    params: Optional[ClippedValueParams] = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped value loss, per token.

    V_clip = V_old + clip(V − V_old, −ε_v, ε_v);  L_v = ½·max((V − R)², (V_clip − R)²).

    :param values: ``(B, T)`` current critic values V (carry the gradient).
    :param old_values: ``(B, T)`` values of the rollout-time critic V_old (no gradient).
    :param returns: ``(B, T)`` targets R (no gradient).
    :param response_mask: ``(B, T)`` float in {0, 1}.
    :return: ``(loss, metrics)``: per-token loss ``(B, T)``, zero on padding; metrics
        ``vf_clipfrac`` (share of valid tokens where the clipped branch is strictly larger)
        and ``vpred_mean`` (masked mean of V), detached scalars.

    Padded entries of all three inputs are replaced by 0 with ``where`` before any
    arithmetic, so NaN/inf there reaches neither the loss nor the gradient.
    Source: PPO (arXiv:1707.06347) as implemented in verl core_algos.compute_value_loss
    (``clip_by_value``, ``torch.max``, clipfrac = masked_mean(gt(vf_losses2, vf_losses1))).
    """
    params = params or ClippedValueParams()
    valid = response_mask.bool()
    zeros = torch.zeros_like(values)
    v = torch.where(valid, values, zeros)
    v_old = torch.where(valid, old_values.detach(), zeros)
    ret = torch.where(valid, returns.detach(), zeros)
    eps = params.clip_range
    delta = v - v_old
    # inside the range V itself (not V_old + (V - V_old), which rounds differently)
    v_clipped = torch.where(delta.abs() <= eps, v, v_old + torch.clamp(delta, min=-eps, max=eps))
    loss_unclipped = (v - ret).square()
    loss_clipped = (v_clipped - ret).square()
    loss = 0.5 * torch.maximum(loss_unclipped, loss_clipped)
    clipped_larger = torch.gt(loss_clipped, loss_unclipped).float()
    metrics = {
        "vf_clipfrac": masked_mean(clipped_larger, response_mask).detach(),
        "vpred_mean": masked_mean(v.detach(), response_mask),
    }
    return loss, metrics


@hookimpl
def rlzoo_register_value_losses(register) -> None:
    register("clipped", clipped_value_loss, params=ClippedValueParams, paper="arXiv:1707.06347",
             description="PPO clipped value loss ½·max((V−R)², (V_clip−R)²)")
