"""The pieces every advantage estimator of the zoo shares: the call convention and its helpers.

The estimators live in three family modules: ``group_baselines`` (a baseline from the other
responses to the same prompt: GRPO, Dr. GRPO, RLOO, OPO, pass@k, GPG, MaxRL, GDPO, the optimal
token baseline, REINFORCE++ with a group baseline), ``returns`` (per-token returns: GAE with a
critic, REINFORCE++, ReMax's greedy baseline) and ``distillation`` (a teacher's log-probs: OPD).

Formulas: ../docs/algorithms/advantages.md (from ALGORITHMS.md "Advantage estimators",
following verl ``core_algos.py`` ``compute_*_advantage*``; GRPO's ``scale`` follows TRL's
``scale_rewards``).

Every estimator names the inputs it uses (the engine passes them by name,
:data:`rlzoo.contract.hookspecs.INPUTS`):

- ``token_rewards`` ``(B, T)``: outcome reward on the last valid token (KL folded in);
- ``response_mask`` ``(B, T)`` in {0, 1};
- ``group_ids`` ``(B,)`` long: the prompt of each sequence, in any order, any values;
- ``values`` ``(B, T)``: critic values (naming it makes the run build a critic: ``gae``);
- ``baseline_scores`` ``(B,)``: greedy-completion scores (a greedy rollout: ``remax``);

and returns ``(advantages, returns)``, both ``(B, T)``, zero on padding, without gradient.

Shared conventions:

- the sequence score is ``s_i = Σ_t r[i,t]·M[i,t]`` (padding zeroed with ``where``, so
  NaN/inf there cannot leak);
- group statistics are vectorised with a one-hot ``(B, G)`` matrix of the group ids (no
  loop over groups or sequences) and computed in float64 on scores shifted by the group
  minimum, so all-equal scores give exactly 0;
- an empty response (all-zero mask row) is a member of its group with score 0, as in verl,
  and receives no advantage (it has no valid token);
- a group of size 1 has mean 0 (and std 1 where a std is used): its advantage is its raw
  score, as verl's reference loops do (``grpo_passk`` gives it 0; see there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlzoo.api import masked_sum


def check_unit_interval(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:  # also rejects NaN
        raise ValueError(f"{name} must be in [0, 1], got {value}")


def check_positive(name: str, value: float) -> None:
    if not value > 0.0:
        raise ValueError(f"{name} must be > 0, got {value}")


def sequence_scores(token_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """s_i = Σ_t r[i,t]·M[i,t]: ``(B, T)`` -> ``(B,)``; padding cannot leak (``where``)."""
    return masked_sum(token_rewards, response_mask, dim=-1)


@dataclass(frozen=True)
class Groups:
    """The group structure of a batch, for vectorised per-group statistics.

    :ivar inverse: ``(B,)`` long, the group of each sequence renumbered 0..G−1.
    :ivar onehot: ``(B, G)`` float64, ``onehot[i, g] = 1`` when sequence i is in group g.
    :ivar size: ``(B,)`` float64, the size of each sequence's group.
    """

    inverse: torch.Tensor
    onehot: torch.Tensor
    size: torch.Tensor

    @classmethod
    def of(cls, group_ids: torch.Tensor, device: torch.device) -> "Groups":
        ids = torch.as_tensor(group_ids, device=device).reshape(-1)
        _, inverse = torch.unique(ids, return_inverse=True)           # (B,) in 0..G-1
        n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
        onehot = (inverse[:, None] == torch.arange(n_groups, device=device)[None, :]).double()
        return cls(inverse=inverse, onehot=onehot, size=onehot.sum(0)[inverse])

    def total(self, x: torch.Tensor) -> torch.Tensor:
        """Σ_{j in g(i)} x_j for each i: ``(B,)`` float64 -> ``(B,)``."""
        return (self.onehot.T @ x)[self.inverse]

    def max(self, x: torch.Tensor) -> torch.Tensor:
        """max_{j in g(i)} x_j for each i: ``(B,)`` float64 -> ``(B,)`` (may be −inf)."""
        outside = torch.full_like(self.onehot, -torch.inf)
        return torch.where(self.onehot.bool(), x[:, None], outside).amax(0)[self.inverse]

    def min(self, x: torch.Tensor) -> torch.Tensor:
        """min_{j in g(i)} x_j for each i: ``(B,)`` float64 -> ``(B,)``."""
        return -self.max(-x)

    def centered(self, scores: torch.Tensor) -> torch.Tensor:
        """s_i − mean_g(s) in float64; a group of size 1 has mean 0 (keeps s_i).

        Shifted by the group minimum first, so all-equal scores give exactly 0.
        """
        shifted = scores - self.min(scores)
        centered = shifted - self.total(shifted) / self.size
        return torch.where(self.size > 1, centered, scores)

    def std(self, centered: torch.Tensor) -> torch.Tensor:
        """Unbiased std of the group of each sequence from its centered scores; 1 for size 1."""
        var = self.total(centered.square()) / (self.size - 1).clamp(min=1)
        return torch.where(self.size > 1, var.sqrt(), torch.ones_like(var))


def broadcast(per_sequence: torch.Tensor, response_mask: torch.Tensor,
               dtype: torch.dtype) -> torch.Tensor:
    """``(B,)`` -> ``(B, T)`` of ``dtype``: the value on every valid token, 0 on padding."""
    full = per_sequence.to(dtype)[:, None].expand(response_mask.shape)
    return torch.where(response_mask.bool(), full, torch.zeros_like(full))


def scores64(token_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return sequence_scores(token_rewards, response_mask).double()


def returns_to_go(token_rewards: torch.Tensor, response_mask: torch.Tensor,
                  gamma: float = 1.0) -> torch.Tensor:
    """G_t = r_t + γ·G_{t'} over the valid tokens, t' the next valid token; ``(B, T)``.

    Masked steps are skipped (their reward ignored), the running return carried across
    them undiscounted, exactly as ``gae`` carries values and advantages; 0 on padding.
    For right-padded responses this is verl's ``compute_reinforce_plus_plus_outcome_
    advantage`` loop; verl resets the running return at masked steps instead, which only
    differs for masked steps inside a response (multi-turn tool output).
    """
    valid = response_mask.bool()
    rewards = torch.where(valid, token_rewards, torch.zeros_like(token_rewards))
    running = torch.zeros_like(rewards[:, 0])
    out = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(valid[:, t], rewards[:, t] + gamma * running, running)
        out[:, t] = torch.where(valid[:, t], running, torch.zeros_like(running))
    return out
