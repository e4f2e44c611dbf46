"""Advantage estimators whose baseline comes from the other responses to the same prompt:
GRPO (and its scale options), Dr. GRPO, RLOO, REINFORCE++ with a group baseline, OPO,
pass@k training, GPG, MaxRL, GDPO and the optimal token baseline.

The call convention, shapes and shared conventions: :mod:`rlzoo_plugins.advantage_parts`.
Formulas: ../docs/algorithms/advantages.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from rlzoo.api import TrainingError, batch_sum, hookimpl, masked_mean, masked_var, masked_whiten, no_grad
from rlzoo_plugins.advantage_parts import Groups, broadcast, check_positive, returns_to_go, scores64

RLZOO_API_VERSION = "2"


GRPO_SCALES = ("group", "batch", "none")


@dataclass
class GRPOParams:
    """Parameters of ``grpo``.

    :ivar epsilon: added to the std before dividing (> 0).
    :ivar scale: ``"group"`` divide by the group's unbiased std (original GRPO);
        ``"batch"`` divide by the unbiased std of all scores of the batch (mean still per
        group); ``"none"`` no division (= ``dr_grpo``). TRL's ``scale_rewards``.
    """

    epsilon: float = 1e-6
    scale: str = "group"

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)
        if self.scale not in GRPO_SCALES:
            choices = ", ".join(repr(choice) for choice in GRPO_SCALES)
            raise ValueError(f"scale must be one of {choices}, got {self.scale!r}")


@dataclass
class GRPOPassKParams:
    """Parameters of ``grpo_passk``.

    :ivar epsilon: added to the group std before dividing (> 0).
    :ivar norm_by_std: divide r_max − r_second by the group's unbiased std + ε (verl's
        ``norm_adv_by_std_in_grpo``).
    """

    epsilon: float = 1e-6
    norm_by_std: bool = True

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)


@no_grad
def grpo(token_rewards: torch.Tensor, response_mask: torch.Tensor, group_ids: torch.Tensor,
         params: Optional[GRPOParams] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantages (Shao et al. 2024, arXiv:2402.03300, §4.1.2).

    A_i = (s_i − mean_g(s)) / (std_g(s) + ε), broadcast over the valid tokens; std is the
    unbiased sample std; returns = advantages. ``scale`` as TRL's ``scale_rewards``:
    ``"batch"`` divides by the unbiased std of all B scores instead (0 when B < 2),
    ``"none"`` does not divide. A group of size 1 has mean 0 and std 1 whatever ``scale``
    is, so its advantage is its raw score s/(1 + ε) (s with ``"none"``), as verl's.
    Follows verl ``compute_grpo_outcome_advantage`` and TRL ``GRPOTrainer``
    (``scale_rewards``). Shapes: ``(B, T)`` in and out.
    """
    params = params or GRPOParams()
    scores = scores64(token_rewards, response_mask)
    groups = Groups.of(group_ids, scores.device)
    centered = groups.centered(scores)
    if params.scale == "none":
        advantage = centered
    else:
        if params.scale == "group":
            std = groups.std(centered)
        else:  # "batch": unbiased std of all B scores (0 when B < 2), as TRL
            batch_std = masked_var(scores, torch.ones_like(scores)).sqrt()
            std = torch.where(groups.size > 1, batch_std, torch.ones_like(scores))
        advantage = centered / (std + params.epsilon)
    advantages = broadcast(advantage, response_mask, token_rewards.dtype)
    return advantages, advantages


@no_grad
def dr_grpo(token_rewards: torch.Tensor, response_mask: torch.Tensor, group_ids: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr. GRPO advantages (Liu et al. 2025, arXiv:2503.20783): A_i = s_i − mean_g(s).

    No std division; broadcast over valid tokens; returns = advantages. A group of size 1
    has mean 0. verl: ``compute_grpo_outcome_advantage(norm_adv_by_std_in_grpo=False)``.
    Shapes: ``(B, T)`` in and out.
    """
    scores = scores64(token_rewards, response_mask)
    centered = Groups.of(group_ids, scores.device).centered(scores)
    advantages = broadcast(centered, response_mask, token_rewards.dtype)
    return advantages, advantages


@no_grad
def rloo(token_rewards: torch.Tensor, response_mask: torch.Tensor, group_ids: torch.Tensor
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, arXiv:2402.14740).

    A_i = s_i − (1/(n−1))·Σ_{j≠i in g} s_j = n/(n−1)·(s_i − mean_g(s)); a group of
    size 1 keeps its raw score. Broadcast over valid tokens; returns = advantages. verl
    ``compute_rloo_outcome_advantage``. Shapes: ``(B, T)`` in and out.
    """
    scores = scores64(token_rewards, response_mask)
    groups = Groups.of(group_ids, scores.device)
    centered = groups.centered(scores)
    n = groups.size
    advantage = torch.where(n > 1, centered * n / (n - 1).clamp(min=1), scores)
    advantages = broadcast(advantage, response_mask, token_rewards.dtype)
    return advantages, advantages


@no_grad
def reinforce_pp_baseline(token_rewards: torch.Tensor, response_mask: torch.Tensor,
                          group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline (Hu 2025, arXiv:2501.03262).

    A = whiten(s_i − mean_g(s) broadcast over valid tokens) over the valid tokens of the
    batch (a group of size 1 has mean 0); returns = advantages. verl
    ``compute_reinforce_plus_plus_baseline_outcome_advantage``. Shapes: ``(B, T)``.
    """
    scores = scores64(token_rewards, response_mask)
    centered = Groups.of(group_ids, scores.device).centered(scores)
    centered = broadcast(centered, response_mask, token_rewards.dtype)
    advantages = masked_whiten(centered, response_mask)
    return advantages, advantages


@no_grad
def opo(token_rewards: torch.Tensor, response_mask: torch.Tensor, group_ids: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """On-policy RL with the optimal (length-weighted) baseline (Hao et al. 2025,
    arXiv:2505.23585).

    b_g = Σ_{j in g} |o_j|·s_j / Σ_{j in g} |o_j| with |o_j| the number of valid tokens;
    A_i = s_i − b_g(i), broadcast over valid tokens; returns = advantages. A group of size
    1 (or whose responses are all empty) has b = 0, as verl
    ``compute_opo_outcome_advantage``. Shapes: ``(B, T)`` in and out.
    """
    scores = scores64(token_rewards, response_mask)
    groups = Groups.of(group_ids, scores.device)
    lengths = response_mask.sum(-1).double()
    weight = groups.total(lengths)
    # shifted by the group minimum so that all-equal scores give exactly 0
    shift = groups.min(scores)
    baseline = shift + groups.total(lengths * (scores - shift)) / weight.clamp(min=1)
    use_baseline = (groups.size > 1) & (weight > 0)
    advantage = torch.where(use_baseline, scores - baseline, scores)
    advantages = broadcast(advantage, response_mask, token_rewards.dtype)
    return advantages, advantages


@no_grad
def grpo_passk(token_rewards: torch.Tensor, response_mask: torch.Tensor, group_ids: torch.Tensor,
               params: Optional[GRPOPassKParams] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k-style GRPO (arXiv:2503.19595): only the best response of each group learns.

    For each group: the best response (the first index among equal maxima) gets
    A = r_max − r_second (÷ (unbiased group std + ε) when ``norm_by_std``); every other
    response gets 0. Broadcast over valid tokens; returns = advantages. verl
    ``compute_grpo_passk_outcome_advantage`` raises for a group of size 1; here such a
    group gets advantage 0 (there is no second response to compare with).
    Shapes: ``(B, T)`` in and out.
    """
    params = params or GRPOPassKParams()
    scores = scores64(token_rewards, response_mask)
    groups = Groups.of(group_ids, scores.device)
    batch = scores.numel()
    index = torch.arange(batch, device=scores.device, dtype=torch.float64)
    best_score = groups.max(scores)
    # first index among the group's maxima: min over members of (index if at max else B)
    best_index = groups.min(torch.where(scores == best_score, index, torch.full_like(index, batch)))
    is_best = index == best_index
    second = groups.max(torch.where(is_best, torch.full_like(scores, -torch.inf), scores))
    gap = torch.where(groups.size > 1, best_score - second, torch.zeros_like(scores))
    if params.norm_by_std:
        gap = gap / (groups.std(groups.centered(scores)) + params.epsilon)
    advantage = torch.where(is_best & (groups.size > 1), gap, torch.zeros_like(gap))
    advantages = broadcast(advantage, response_mask, token_rewards.dtype)
    return advantages, advantages


@no_grad
def gpg(token_rewards: torch.Tensor, response_mask: torch.Tensor, group_ids: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Group Policy Gradient advantages (Chu et al. 2025, arXiv:2504.02546).

    A_i = α·(s_i − mean_g(s)) with α = B / #{i: s_i ≠ 0} (α = 1 when every score is 0),
    F_norm = 1; a group of size 1 has mean 0. Broadcast over valid tokens; returns =
    advantages. Follows verl ``compute_gpg_outcome_advantage`` (``count_nonzero(scores)``);
    the paper's α = B/(B − M) counts instead the M samples whose advantage is 0 (groups
    with all-equal rewards). Shapes: ``(B, T)`` in and out.
    """
    scores = scores64(token_rewards, response_mask)
    nonzero = batch_sum(torch.count_nonzero(scores))
    total = batch_sum(torch.tensor(scores.numel(), device=scores.device))
    alpha = torch.where(nonzero > 0, total.double() / nonzero.clamp(min=1).double(),
                        torch.ones((), dtype=torch.float64, device=scores.device))
    centered = Groups.of(group_ids, scores.device).centered(scores)
    advantages = broadcast(alpha * centered, response_mask, token_rewards.dtype)
    return advantages, advantages


@dataclass
class MaxRLParams:
    """Parameters of ``maxrl``.

    :ivar epsilon: added to the group mean before dividing (> 0), as the official code.
    """

    epsilon: float = 1e-6

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)


@no_grad
def maxrl(token_rewards: torch.Tensor, response_mask: torch.Tensor, group_ids: torch.Tensor,
          params: Optional[MaxRLParams] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """MaxRL (arXiv:2602.02710): A_i = (s_i − mean_g(s)) / (mean_g(s) + ε), broadcast over
    the valid tokens; a group whose mean is 0 (no success) gets 0, as the paper drops it; a
    group of size 1 keeps its raw score (mean 0, no division: the official code would divide
    by ε there). Rewards are success rates: a negative group mean is an error, because the
    division would flip the advantage's sign. Official code tajwarfahim/maxrl
    ``compute_maxrl_outcome_advantage``. Shapes: ``(B, T)`` in and out.

    :raises TrainingError: a group's mean score is negative.
    """
    params = params or MaxRLParams()
    scores = scores64(token_rewards, response_mask)
    groups = Groups.of(group_ids, scores.device)
    mean = groups.total(scores) / groups.size
    negative = (groups.size > 1) & (mean < 0)
    if bool(negative.any()):
        i = int(negative.nonzero()[0])
        raise TrainingError(f"advantage 'maxrl' needs non-negative rewards (success rates): group "
                            f"{int(torch.as_tensor(group_ids).reshape(-1)[i])} has mean score {float(mean[i]):.4g}")
    centered = groups.centered(scores)
    ratio = centered / (mean + params.epsilon)
    advantage = torch.where(groups.size > 1, torch.where(mean > 0, ratio, torch.zeros_like(ratio)), scores)
    advantages = broadcast(advantage, response_mask, token_rewards.dtype)
    return advantages, advantages


@dataclass
class GDPOParams:
    """Parameters of ``gdpo``.

    :ivar epsilon: added to each std before dividing (> 0); the reference code's 1e-4.
    :ivar whiten: whiten the weighted sum over the batch (the paper's step 3, always on in
        the reference code; off for an ablation).
    """

    epsilon: float = 1e-4
    whiten: bool = True

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)


@no_grad
def gdpo(reward_scores: Optional[torch.Tensor], reward_weights: torch.Tensor, response_mask: torch.Tensor,
         group_ids: torch.Tensor, params: Optional[GDPOParams] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO (Liu et al. 2026, arXiv:2601.05242): each reward function normalised within its
    group, the weighted sum whitened over the batch.

    A_k,i = (r_k,i − mean_g(r_k)) / (std_g(r_k) + ε) for each reward function k (unbiased
    std; a group of size 1 has mean 0 and std 1, as ``grpo``); S_i = Σ_k w_k·A_k,i;
    A_i = (S_i − mean_B(S)) / (std_B(S) + ε) over all B sequences of the batch (all ranks;
    unbiased; skipped with ``whiten=false``), broadcast over the valid tokens; returns =
    advantages. Reference: NVlabs/GDPO ``trl-GDPO`` ``_generate_and_score_completions``
    (ε = 1e-4 in both divisions). It reads the raw scores, so the plan refuses KL in the
    reward and reward shaping with it. Shapes: ``reward_scores`` ``(B, K)``,
    ``reward_weights`` ``(K,)``, masks ``(B, T)``; out ``(B, T)``.

    :raises TrainingError: the batch carries no ``reward_scores`` (built without the sampler).
    """
    params = params or GDPOParams()
    if reward_scores is None:
        raise TrainingError("advantage 'gdpo' needs the batch's reward_scores (each reward function's scores), "
                            "which this batch lacks: build batches with ctx.resample / the sampler")
    scores = reward_scores.double()
    groups = Groups.of(group_ids, scores.device)
    normalised = []
    for k in range(scores.shape[1]):
        centered = groups.centered(scores[:, k])
        normalised.append(centered / (groups.std(centered) + params.epsilon))
    total = torch.stack(normalised, dim=1) @ reward_weights.double()
    if params.whiten:
        every = torch.ones_like(total)
        total = (total - masked_mean(total, every)) / (masked_var(total, every).sqrt() + params.epsilon)
    advantages = broadcast(total, response_mask, response_mask.dtype)
    return advantages, advantages


OTB_ALIGNMENTS = ("position", "mask")


@dataclass
class OTBParams:
    """Parameters of ``optimal_token_baseline``.

    :ivar align: which tokens of a group share a baseline: ``position`` (the same position t
        of every response: verl's ``optimal_token_baseline``) or ``mask`` (the same index
        among each response's masked-in tokens, empty responses outside every group: verl's
        multi-turn ``tir_optimal_token_baseline``). Identical for right-padded responses
        whose mask has no holes, except that ``position`` counts an empty response as a
        group member.
    :ivar zero_tail: where one response of a group is longer than all the others, its
        baseline beyond the second-longest is 0 (verl's ``handle_zero_tail``, default on).
    :ivar epsilon: added to the denominator Σ W (verl: 1e-8); > 0.
    """

    align: str = "position"
    zero_tail: bool = True
    epsilon: float = 1e-8

    def __post_init__(self) -> None:
        if self.align not in OTB_ALIGNMENTS:
            raise ValueError(f"align must be one of {', '.join(OTB_ALIGNMENTS)}, got {self.align!r}")
        check_positive("epsilon", self.epsilon)


def _compact(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Each row's masked-in entries moved to the front, in order, zeros after: ``(B, T)``."""
    index = torch.where(valid, valid.long().cumsum(-1) - 1, torch.full_like(valid, valid.shape[1], dtype=torch.long))
    out = torch.zeros(x.shape[0], x.shape[1] + 1, dtype=x.dtype, device=x.device)
    return out.scatter(1, index, torch.where(valid, x, torch.zeros_like(x)))[:, :-1]


@no_grad
def optimal_token_baseline(token_rewards: torch.Tensor, response_mask: torch.Tensor, group_ids: torch.Tensor,
                           old_logp: torch.Tensor, sum_pi_squared: torch.Tensor,
                           params: Optional[OTBParams] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal token baseline (OTB; arXiv:2602.07078; verl ``compute_optimal_token_baseline_
    advantage`` and ``compute_multi_turn_optimal_token_baseline_advantage``).

    Per token: the return G_t = Σ_{k≥t} r_k (over valid tokens); the logit-gradient proxy
    w_t = 1 − 2·π_old(y_t) + Σ_v π_old(v)²; the realised energy W_t = Σ_{j≤t} w_j. Within a
    group of N ≥ 2 responses, the baseline of step t is

        B_t = Σ_i G_t^(i)·W_t^(i) / (Σ_i W_t^(i) + ε)     (over the members valid at t)

    and A_t = G_t − B_t on valid tokens; a group of size 1 has B = 0 (A = G). With
    ``zero_tail``, the unique longest response of a group gets B = 0 beyond the second-longest
    (there the group has one member, and B_t ≈ G_t would cancel its advantage). Returns G.
    ``align`` chooses the time axis (see :class:`OTBParams`). No gradient; ``(B, T)`` in
    and out, float64 inside.
    """
    params = params or OTBParams()
    valid = response_mask.bool()
    lengths = valid.sum(-1)                                                        # (B,)
    returns = returns_to_go(token_rewards.double(), response_mask)                 # (B, T), 0 on padding
    w = 1.0 - 2.0 * old_logp.double().exp() + sum_pi_squared.double()
    energy = torch.where(valid, w, torch.zeros_like(w)).cumsum(-1)
    groups_of = group_ids
    if params.align == "mask":
        returns_c, energy_c = _compact(returns, valid), _compact(energy, valid)
        on = torch.arange(valid.shape[1], device=valid.device)[None, :] < lengths[:, None]
        _, inverse = torch.unique(torch.as_tensor(group_ids, device=valid.device).reshape(-1), return_inverse=True)
        first_free = int(inverse.max()) + 1 if len(lengths) else 0
        singletons = first_free + torch.arange(len(lengths), device=valid.device)
        groups_of = torch.where(lengths > 0, inverse, singletons)                  # empty responses: alone
    else:
        returns_c, energy_c, on = returns, energy, valid
    groups = Groups.of(groups_of, valid.device)
    weight = torch.where(on, energy_c, torch.zeros_like(energy_c))
    numerator = groups.onehot.T @ (returns_c * weight)                             # (G, T)
    denominator = groups.onehot.T @ weight + params.epsilon
    baseline = (numerator / denominator)[groups.inverse]                           # (B, T)
    baseline = torch.where((groups.size > 1)[:, None], baseline, torch.zeros_like(baseline))
    if params.zero_tail:
        length = lengths.double()
        longest = groups.max(length)
        unique = (groups.total((length == longest).double()) == 1) & (length == longest) & (groups.size > 1)
        second = groups.max(torch.where(length < longest, length, torch.full_like(length, -torch.inf)))
        steps = torch.arange(valid.shape[1], device=valid.device, dtype=torch.float64)[None, :]
        baseline = torch.where(unique[:, None] & (steps >= second[:, None]), torch.zeros_like(baseline), baseline)
    advantages_c = torch.where(on, returns_c - baseline, torch.zeros_like(baseline))
    if params.align == "mask":
        index = (valid.long().cumsum(-1) - 1).clamp(min=0)
        advantages = torch.where(valid, advantages_c.gather(1, index), torch.zeros_like(advantages_c))
    else:
        advantages = advantages_c
    dtype = token_rewards.dtype
    return advantages.to(dtype), returns.to(dtype)


@hookimpl
def rlzoo_register_advantage_estimators(register) -> None:
    register("grpo", grpo, params=GRPOParams, needs=("groups",), paper="arXiv:2402.03300",
             description="(s − group mean) / (group std + ε), broadcast over tokens")
    register("dr_grpo", dr_grpo, needs=("groups",), paper="arXiv:2503.20783",
             description="s − group mean, no std division (Dr. GRPO)")
    register("rloo", rloo, needs=("groups",), paper="arXiv:2402.14740",
             description="s − mean of the other n−1 scores of the group (leave-one-out)")
    register("reinforce_pp_baseline", reinforce_pp_baseline, needs=("groups",),
             aliases=("reinforce_plus_plus_baseline",), paper="arXiv:2501.03262",
             description="s − group mean, whitened over the batch (REINFORCE++ baseline)")
    register("opo", opo, needs=("groups",), paper="arXiv:2505.23585",
             description="s − length-weighted group mean (optimal baseline)")
    register("grpo_passk", grpo_passk, params=GRPOPassKParams, needs=("groups",),
             paper="arXiv:2503.19595",
             description="only each group's best response learns: r_max − r_second (÷ std)")
    register("maxrl", maxrl, params=MaxRLParams, needs=("groups",), paper="arXiv:2602.02710",
             nonnegative_rewards=True,
             description="(s − group mean) / group mean: the success-rate-normalised advantage (MaxRL)")
    register("gdpo", gdpo, params=GDPOParams, needs=("groups",), paper="arXiv:2601.05242",
             description="each reward function normalised in its group, weighted sum whitened over the batch (GDPO)")
    register("optimal_token_baseline", optimal_token_baseline, params=OTBParams, needs=("groups",),
             aliases=("otb",), paper="arXiv:2602.07078",
             description="G_t − a per-step group baseline weighted by the realised energy Σ(1−2π+Σπ²) (OTB)")
    register("gpg", gpg, needs=("groups",), paper="arXiv:2504.02546",
             description="α·(s − group mean), α = B / #non-zero scores (GPG)")
