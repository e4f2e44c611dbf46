"""The KL term's share of the pull on the sampled tokens' log-probs (``kl/grad_share``): what
``rlzoo doctor`` reads to say that a KL coefficient pins the policy. A KL in the loss is measured on
the loss's gradient (:func:`kl_gradient_share`), a KL folded into the reward on the advantages
(:func:`kl_advantage_share`)."""

from __future__ import annotations

import torch


def kl_gradient_share(policy_term: torch.Tensor, kl_term: torch.Tensor, logp: torch.Tensor) -> float:
    """How much of the pull on the sampled tokens' log-probs comes from the KL term:
    ``|g_kl| / (|g_kl| + |g_policy|)``, with ``g`` the gradient of each (scalar) loss term with
    respect to ``logp`` ``(B, T)`` and ``|.|`` its L2 norm over the tokens; 0 when neither pulls.
    Above 0.5 the KL term outweighs the advantage term: it holds the policy where it is. The
    parameters' gradient is the same Jacobian applied to the sum of the two, so the share is
    that of the update's driving signal. Computed with :func:`torch.autograd.grad` on the
    kept graph (nothing accumulates into ``.grad``)."""
    norms = []
    for term in (kl_term, policy_term):
        (grad,) = torch.autograd.grad(term, logp, retain_graph=True, allow_unused=True)
        norms.append(0.0 if grad is None else float(grad.double().norm()))
    total = norms[0] + norms[1]
    return norms[0] / total if total > 0 else 0.0


def kl_advantage_share(advantages: torch.Tensor, task_advantages: torch.Tensor, mask: torch.Tensor) -> float:
    """For a KL folded into the reward: the KL's share of the advantages, ``|A - A_task| /
    (|A - A_task| + |A_task|)``, with ``A`` ``(B, T)`` the advantages of the reward with the KL
    penalty, ``A_task`` those of the task reward alone (the same estimator, the same inputs), and
    ``|.|`` the L2 norm over the tokens where ``mask`` ``(B, T)`` is 1; 0 when both are 0. A policy
    loss linear in the advantage pulls each sampled token's log-prob in proportion to its advantage
    at the rollout's policy (ratio 1), so this is :func:`kl_gradient_share`'s measure for that
    placement, with every token weighted alike."""
    keep = mask.bool()
    task = task_advantages.double()[keep]
    kl = advantages.double()[keep] - task
    norms = float(kl.norm()), float(task.norm())
    total = norms[0] + norms[1]
    return norms[0] / total if total > 0 else 0.0
