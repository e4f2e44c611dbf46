"""Rollout corrections applied as the run plan lists them, and the off-policy diagnostics.

The plan (:class:`rlzoo.plan.learning.CorrectionStep`) lists the corrections in ``rollout_correction``
order, each with a stage and a mode. :class:`Corrections` applies them: the ``batch``-stage
ones (they read no current-policy log-prob) once per step over the whole batch, before the
mini-batches, in order, each seeing the ``loss_mask`` the earlier ones left; their weights
are multiplied into ``batch.correction_weights`` and a ``mask``-mode correction's zero-weight
tokens are removed from ``batch.loss_mask`` (so the aggregation's denominators, counted per
mini-batch afterwards, no longer count them). The ``update``-stage ones (they read ``logp``)
run in each micro-batch and multiply in there; under ``trainer.old_logp=rollout`` (bypass)
so do the ones that read ``old_logp``, given the current policy's log-probs (detached) in its
place, so they compare π with μ as verl's bypass mode does. Metrics are logged per
correction as ``rollout_correction/<name>/<key>``.

:func:`offpolicy_metrics` are verl's off-policy diagnostics of μ against π_old.
"""

from __future__ import annotations

from typing import Any

import torch

from rlzoo.core import distributed
from rlzoo.core.batch import RolloutBatch
from rlzoo.core.ratios import LOG_RATIO_CLAMP
from rlzoo.core.errors import TrainingError
from rlzoo.core.masked import masked_mean
from rlzoo.plan.learning import CorrectionStep


def metric_key(step: CorrectionStep, key: str) -> str:
    """The logged name of correction ``step``'s metric ``key``."""
    return f"rollout_correction/{step.name}/{key}"


class Corrections:
    """The run's rollout corrections, as the plan lists them (each step carries its bound
    correction with its parameters).

    :param steps: the plan's correction steps, in order.
    :param dist: this process's place in the job (batch-stage reductions are global).
    """

    def __init__(self, steps: tuple[CorrectionStep, ...], dist: distributed.DistInfo) -> None:
        self.dist = dist
        self.batch_steps = [step for step in steps if step.stage == "batch"]
        self.update_steps = [step for step in steps if step.stage == "update"]

    def apply_to_batch(self, batch: RolloutBatch) -> dict[str, float]:
        """Apply the batch-stage corrections to the whole ``batch`` (this process's share;
        full reductions such as a batch normalisation are over all processes): sets
        ``batch.correction_weights`` and narrows ``batch.loss_mask`` for ``mask`` mode.
        Returns their metrics (already global)."""
        metrics: dict[str, float] = {}
        if not self.batch_steps:
            return metrics
        weights = None
        with distributed.batch_statistics(self.dist.enabled):
            for step in self.batch_steps:
                bound = step.correction
                if batch.old_logp is None and "old_logp" in bound.component.inputs:
                    raise TrainingError(f"rollout_correction {step.name!r} reads old_logp, but the run plan runs no "
                                        "old-log-prob pass (a plan edited after build_plan decided it?)")
                mask = batch.loss_mask
                found, found_metrics = bound(old_logp=batch.old_logp, rollout_logp=batch.rollout_logp,
                                             advantages=batch.advantages, response_mask=mask)
                found = found.detach() * mask
                if step.mode == "mask":
                    batch.loss_mask = mask * (found != 0).to(mask.dtype)
                weights = found if weights is None else weights * found
                metrics.update({metric_key(step, k): float(v) for k, v in found_metrics.items()})
            if any(step.mode == "mask" for step in self.batch_steps):
                kept = masked_mean(batch.loss_mask, batch.response_mask)
                metrics["rollout_correction/loss_mask_frac"] = float(kept)
        batch.correction_weights = weights
        return metrics

    def weights(self, mb: RolloutBatch, old_logp: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor,
                add: Any) -> torch.Tensor | None:
        """The micro-batch's correction weights ``(B, T)``: the batch-stage product times
        each update-stage correction's weights (``logp`` detached), or ``None`` when the run
        has no correction. A ``current_as_old`` step (bypass) gets the detached ``logp`` as
        its ``old_logp``: it compares π with μ. ``add(name, value)`` records each
        update-stage metric."""
        weights = mb.correction_weights
        current = logp.detach()
        for step in self.update_steps:
            found, found_metrics = step.correction(old_logp=current if step.current_as_old else old_logp,
                                                   rollout_logp=mb.rollout_logp, logp=current,
                                                   advantages=mb.advantages, response_mask=mask)
            weights = found.detach() if weights is None else weights * found.detach()
            for key, value in found_metrics.items():
                add(metric_key(step, key), float(value))
        return weights


def offpolicy_metrics(old_logp: torch.Tensor, rollout_logp: torch.Tensor,
                      mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """verl's off-policy diagnostics (``compute_offpolicy_metrics``) of μ (the rollout)
    against π_old, over ``(B, T)`` inputs; x = log π_old − log μ.

    ``chi2_token``: mean over valid tokens of exp(2x) − 1 (χ²(π_old‖μ) per token);
    ``chi2_seq``: mean over non-empty sequences of exp(2 Σ_t x) − 1; ``training_ppl`` /
    ``rollout_ppl``: mean over non-empty sequences of exp(−mean_t log p) under π_old / μ;
    ``log_ppl_diff``: mean over sequences of mean_t log μ − mean_t log π_old (= log of the
    perplexity ratio training/rollout), ``log_ppl_abs_diff`` its absolute value's mean;
    ``kl``: mean over valid tokens of log μ − log π_old (k1 of KL(μ‖π_old)). x and Σ x are
    clamped to ±20 before the exp; perplexities are taken in float64. verl averages the
    sequence metrics over every sequence, an empty one included; rlzoo over non-empty ones.
    Every metric is 0 when no token is valid (a batch of empty responses: nothing diverged).
    """
    valid = mask.bool()
    fmask = valid.to(torch.float32)
    zero = torch.zeros_like(fmask)
    x = torch.where(valid, (old_logp - rollout_logp).detach().float(), zero)
    non_empty = (fmask.sum(-1) > 0).to(torch.float32)
    mean_old = masked_mean(torch.where(valid, old_logp.detach().float(), zero), fmask, dim=-1).double()
    mean_rollout = masked_mean(torch.where(valid, rollout_logp.detach().float(), zero), fmask, dim=-1).double()
    seq_log_ratio = x.clamp(-1e6, 1e6).sum(-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    rho_sq = torch.exp(2 * x.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    diff = mean_rollout - mean_old
    seq = non_empty.double()
    return {
        "chi2_token": masked_mean(rho_sq - 1.0, fmask),
        "chi2_seq": masked_mean(torch.exp(2 * seq_log_ratio) - 1.0, non_empty),
        "training_ppl": masked_mean(torch.exp(-mean_old), seq).float(),
        "rollout_ppl": masked_mean(torch.exp(-mean_rollout), seq).float(),
        "log_ppl_diff": masked_mean(diff, seq).float(),
        "log_ppl_abs_diff": masked_mean(diff.abs(), seq).float(),
        "kl": masked_mean(-x, fmask),
    }
