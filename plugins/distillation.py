"""Advantage estimators from a teacher's log-probs: on-policy distillation (OPD), the
per-token reverse KL to the teacher as a negative advantage, optionally beside the task reward.

The call convention, shapes and shared conventions: :mod:`rlzoo_plugins.advantage_parts`.
Formulas: ../docs/algorithms/advantages.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from rlzoo.api import hookimpl, no_grad
from rlzoo_plugins.advantage_parts import check_positive, scores64

from rlzoo_plugins.kl import kl_abs, kl_k1, kl_k2, kl_k3

RLZOO_API_VERSION = "2"


OPD_ESTIMATORS = {"k1": kl_k1, "abs": kl_abs, "k2": kl_k2, "k3": kl_k3}
"""``opd``'s estimators of the per-token reverse KL(π‖π_T) from the sampled token's two
log-probs (rlzoo_plugins.kl's functions, verl's ``kl_penalty`` names)."""


@dataclass
class OPDParams:
    """Parameters of ``opd``.

    :ivar coef: weight of the per-token teacher term (> 0).
    :ivar task_reward_weight: weight of the task reward (the sequence score on every token;
        >= 0); 0 distils only.
    :ivar estimator: the per-token estimate D of KL(π‖π_T) whose negative is the advantage:
        ``k1`` (log π_old − log π_T, unbiased), ``abs`` (its absolute value), ``k2`` (½ of its
        square), ``k3`` (e^{−x} + x − 1, clamped as verl's ``low_var_kl``).
    """

    coef: float = 1.0
    task_reward_weight: float = 0.0
    estimator: str = "k1"

    def __post_init__(self) -> None:
        check_positive("coef", self.coef)
        if not self.task_reward_weight >= 0:
            raise ValueError(f"task_reward_weight must be >= 0, got {self.task_reward_weight}")
        if self.estimator not in OPD_ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(OPD_ESTIMATORS)}, got {self.estimator!r}")


@no_grad
def opd(teacher_logp: torch.Tensor, old_logp: torch.Tensor, token_rewards: torch.Tensor,
        response_mask: torch.Tensor, params: Optional[OPDParams] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """On-policy distillation (Agarwal et al. 2024, arXiv:2306.13649; Thinking Machines,
    "On-Policy Distillation", 2025): the student samples, a teacher scores every sampled
    token, and the per-token advantage is the negative reverse-KL estimate

        A_t = −coef · D(log π_old(y_t), log π_T(y_t)) + task_reward_weight · s_i

    with D the ``estimator`` (k1: D = log π_old − log π_T, so A_t = coef·(log π_T − log π_old);
    abs, k2, k3 as verl's distillation losses of those names, used as a negative reward
    with ``use_policy_gradient``); no gradient through it; s_i the sequence's score,
    broadcast over its valid tokens; returns = advantages. With a policy-gradient loss this
    minimises the per-token reverse KL(π‖π_T) on the student's own samples. π_old is the
    student before this step's update (Tinker's cookbook uses the sampler's log-probs, equal
    up to the rollout mismatch). Shapes: ``(B, T)`` in and out.
    """
    params = params or OPDParams()
    student, teacher = old_logp.double(), teacher_logp.double()
    if params.estimator == "k1":
        per_token = params.coef * (teacher - student)
    else:
        per_token = -params.coef * OPD_ESTIMATORS[params.estimator](student, teacher)
    if params.task_reward_weight:
        per_token = per_token + params.task_reward_weight * scores64(token_rewards, response_mask)[:, None]
    advantages = torch.where(response_mask.bool(), per_token, torch.zeros_like(per_token)).to(token_rewards.dtype)
    return advantages, advantages


@hookimpl
def rlzoo_register_advantage_estimators(register) -> None:
    register("opd", opd, params=OPDParams, paper="arXiv:2306.13649",
             description="minus a per-token reverse-KL estimate (k1, abs, k2, k3), student vs teacher "
                         "(on-policy distillation, teacher.path)")
