"""rlzoo-example: rank-based group advantages, PPO with a KL penalty, and a preset."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlzoo.api import hookimpl, masked_mean

RLZOO_API_VERSION = "2"


def rank_grpo(token_rewards: torch.Tensor, response_mask: torch.Tensor, group_ids: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantages from score ranks.

    s_i = Σ_t r·M; within the group of i (size n), rank_i counts the members with a lower
    score plus half of the others with an equal one; A_i = 2·rank_i/(n−1) − 1 (0 for a
    group of size 1), broadcast over the valid tokens. Shapes: ``(B, T)`` in and out.
    """
    with torch.no_grad():
        scores = (torch.where(response_mask.bool(), token_rewards, 0.0)).sum(-1)
        same = group_ids[:, None] == group_ids[None, :]                       # (B, B)
        lower = (scores[None, :] < scores[:, None]) & same
        ties = (scores[None, :] == scores[:, None]) & same
        ties.fill_diagonal_(False)
        rank = lower.sum(-1) + 0.5 * ties.sum(-1)
        size = same.sum(-1)
        advantage = torch.where(size > 1, 2 * rank / (size - 1).clamp(min=1) - 1, 0.0)
        advantages = advantage[:, None] * response_mask
    return advantages, advantages


@dataclass
class PPOPenaltyParams:
    beta: float = 0.1
    """Weight of the KL(π_old ‖ π_θ) penalty."""

    def __post_init__(self) -> None:
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")


def ppo_penalty(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                response_mask: torch.Tensor, params: PPOPenaltyParams | None = None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token −A·ρ + β·(ρ − 1 − log ρ), ρ = exp(clamp(logp − old_logp, −20, 20)).

    Shapes ``(B, T)``; metrics: ``clipfrac`` (0: nothing is clipped), ``approx_kl``.
    """
    params = params or PPOPenaltyParams()
    log_ratio = (logp - old_logp.detach()).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss = -advantages.detach() * ratio + params.beta * (ratio - 1 - log_ratio)
    loss = torch.where(response_mask.bool(), loss, torch.zeros_like(loss))
    metrics = {
        "clipfrac": torch.zeros(()),
        "approx_kl": masked_mean(-log_ratio.detach(), response_mask),
    }
    return loss, metrics


PRESET = {
    "advantage": "rank_grpo",
    "policy_loss": {"name": "ppo_penalty", "beta": 0.1},
    "loss_agg": "token-mean",
    "kl": {"coef": 0.0},
    # off-policy steps, so the penalty on KL(pi_old || pi) has something to act on
    "trainer": {"update_epochs": 2, "num_mini_batches": 2},
}


@hookimpl
def rlzoo_register_advantage_estimators(register) -> None:
    register("rank_grpo", rank_grpo, needs=("groups",),
             description="group-relative advantages from score ranks, in [-1, 1]")


@hookimpl
def rlzoo_register_policy_losses(register) -> None:
    register("ppo_penalty", ppo_penalty, params=PPOPenaltyParams,
             description="PPO with a k3 KL(old||new) penalty instead of clipping",
             paper="arXiv:1707.06347")


CARD = {
    "advantage": "rank-based group advantages (this package's rank_grpo)",
    "policy_loss": "PPO's KL-penalty surrogate, β = 0.1 (Schulman et al. 2017, arXiv:1707.06347 eq. 8)",
    "loss_agg": "mean over the batch's valid tokens",
    "kl": "no KL to the reference: the penalty is on KL(π_old ‖ π) instead",
    "trainer": {"source": "2 epochs × 2 mini-batches per rollout", "deviation": "PPO ran 3-10 epochs; 2 keep the "
                                                                                "example fast"},
}


@hookimpl
def rlzoo_register_algorithms(register) -> None:
    register("rank_ppo", PRESET, description="rank_grpo advantages + ppo_penalty (example plugin)", card=CARD)
