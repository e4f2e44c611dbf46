"""Advantage estimators over per-token returns: GAE with a critic (PPO), REINFORCE++
(whitened returns-to-go) and ReMax (returns minus the greedy completion's score).

The call convention, shapes and shared conventions: :mod:`rlzoo_plugins.advantage_parts`.
Formulas: ../docs/algorithms/advantages.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from rlzoo.api import hookimpl, masked_whiten, no_grad
from rlzoo_plugins.advantage_parts import broadcast, check_unit_interval, returns_to_go

RLZOO_API_VERSION = "2"


@dataclass
class GAEParams:
    """Parameters of ``gae``.

    :ivar gamma: discount γ in [0, 1].
    :ivar lam: GAE λ in [0, 1] (λ=1: Monte-Carlo returns minus values; λ=0: one-step TD).
    :ivar whiten: whiten the advantages over the valid tokens of the batch (verl always does).
    """

    gamma: float = 1.0
    lam: float = 1.0
    whiten: bool = True

    def __post_init__(self) -> None:
        check_unit_interval("gamma", self.gamma)
        check_unit_interval("lam", self.lam)


@dataclass
class ReinforcePPParams:
    """Parameters of ``reinforce_pp``.

    :ivar gamma: discount γ in [0, 1] of the returns-to-go.
    """

    gamma: float = 1.0

    def __post_init__(self) -> None:
        check_unit_interval("gamma", self.gamma)


@no_grad
def gae(token_rewards: torch.Tensor, response_mask: torch.Tensor, values: Optional[torch.Tensor],
        params: Optional[GAEParams] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2015, arXiv:1506.02438; PPO).

    δ_t = r_t + γ·V_{t'} − V_t,  A_t = δ_t + γλ·A_{t'}, with t' the next *valid* token
    (V and A beyond the last valid token are 0); masked steps inside a response are
    skipped, the next value and advantage carried across them. returns = A + V (before
    whitening); then A is whitened over the valid tokens of the batch when ``whiten``.

    Follows verl ``compute_gae_advantage_return`` (the version that skips observation
    tokens), with ``torch.where`` instead of products with the mask so that NaN/inf in
    padded rewards or values cannot leak. Shapes: ``(B, T)`` in and out.

    :raises ValueError: ``values`` is ``None`` (gae needs the critic).
    """
    params = params or GAEParams()
    if values is None:
        raise ValueError("advantage 'gae' needs critic values (values=None was given)")
    valid = response_mask.bool()
    zeros = torch.zeros_like(token_rewards)
    rewards = torch.where(valid, token_rewards, zeros)
    values = torch.where(valid, values.to(token_rewards.dtype), zeros)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(rewards[:, 0])
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + params.gamma * next_value - values[:, t]
        advantage_t = delta + params.gamma * params.lam * next_advantage
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        next_advantage = torch.where(valid[:, t], advantage_t, next_advantage)
        advantages[:, t] = torch.where(valid[:, t], advantage_t, torch.zeros_like(advantage_t))
    returns = torch.where(valid, advantages + values, zeros)
    if params.whiten:
        advantages = masked_whiten(advantages, response_mask)
    return advantages, returns


@no_grad
def reinforce_pp(token_rewards: torch.Tensor, response_mask: torch.Tensor,
                 params: Optional[ReinforcePPParams] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): whitened returns-to-go.

    G_t = Σ_{k≥t} γ^{k−t} r_k over the valid tokens (see :func:`returns_to_go`), then
    A = whiten(G) over the valid tokens of the batch; returns = G (before whitening).
    verl ``compute_reinforce_plus_plus_outcome_advantage``. Shapes: ``(B, T)`` in and out.
    """
    params = params or ReinforcePPParams()
    returns = returns_to_go(token_rewards, response_mask, params.gamma)
    return masked_whiten(returns, response_mask), returns


@no_grad
def remax(token_rewards: torch.Tensor, response_mask: torch.Tensor,
          baseline_scores: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, arXiv:2310.10505): A_t = G_t − b_i.

    G_t the undiscounted returns-to-go over the valid tokens, b_i = ``baseline_scores[i]``
    the score of the greedy completion of the same prompt; returns = G. verl
    ``compute_remax_outcome_advantage``. Shapes: ``(B, T)`` in and out, ``baseline_scores``
    ``(B,)``.

    :raises ValueError: ``baseline_scores`` is ``None`` (remax needs greedy rollouts).
    """
    if baseline_scores is None:
        raise ValueError("advantage 'remax' needs baseline_scores, the scores of greedy "
                         "completions (needs=('greedy',)); got None")
    returns = returns_to_go(token_rewards, response_mask, 1.0)
    baseline = torch.as_tensor(baseline_scores, device=returns.device).reshape(-1)
    baseline = broadcast(baseline, response_mask, returns.dtype)
    advantages = torch.where(response_mask.bool(), returns - baseline, torch.zeros_like(returns))
    return advantages, returns


@hookimpl
def rlzoo_register_advantage_estimators(register) -> None:
    register("gae", gae, params=GAEParams, paper="arXiv:1506.02438",
             description="generalised advantage estimation with a critic, whitened (PPO)")
    register("reinforce_pp", reinforce_pp, params=ReinforcePPParams,
             aliases=("reinforce_plus_plus",), paper="arXiv:2501.03262",
             description="returns-to-go whitened over the batch (REINFORCE++)")
    register("remax", remax, paper="arXiv:2310.10505",
             description="returns-to-go minus the greedy completion's score (ReMax)")
