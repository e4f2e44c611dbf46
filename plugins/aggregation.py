"""Loss aggregation modes: how a per-token loss matrix becomes one scalar.

Formulas: ../docs/algorithms/aggregation.md (from ALGORITHMS.md, following current verl).
Every mode is a weighted sum Σ L·M·w over the batch whose normaliser comes from the
*global* batch (:class:`rlzoo.core.batch.BatchCounts`), so summing the result over micro-batches
or ranks reproduces the mode computed on the whole batch. "Sequences" are those with at
least one valid token; a fully masked row neither contributes nor counts.
"""

from __future__ import annotations

import torch

from rlzoo.api import BatchCounts, hookimpl, masked_sum

RLZOO_API_VERSION = "2"


def local_counts(mask: torch.Tensor, max_response_length: int | None = None) -> BatchCounts:
    """Counts of this ``(B, T)`` mask alone (used when no global counts are given).

    ``max_response_length`` defaults to the mask's width ``T``.
    """
    return BatchCounts(
        tokens=float(mask.sum()),
        sequences=float((mask.sum(-1) > 0).sum()),
        max_response_length=int(max_response_length or mask.shape[-1]),
    )


def token_mean(loss: torch.Tensor, mask: torch.Tensor, counts: BatchCounts | None = None) -> torch.Tensor:
    """Σ_{i,t} L·M / Σ_{i,t} M over the global batch. ``loss``, ``mask``: ``(B, T)``."""
    counts = counts or local_counts(mask)
    return masked_sum(loss, mask) / max(counts.tokens, 1.0)


def token_sum(loss: torch.Tensor, mask: torch.Tensor, counts: BatchCounts | None = None) -> torch.Tensor:
    """Σ_{i,t} L·M (no normalisation). ``loss``, ``mask``: ``(B, T)``."""
    return masked_sum(loss, mask)


def seq_mean_token_sum(
    loss: torch.Tensor, mask: torch.Tensor, counts: BatchCounts | None = None
) -> torch.Tensor:
    """(1/B')·Σ_i Σ_t L·M, B' = non-empty sequences of the global batch."""
    counts = counts or local_counts(mask)
    return masked_sum(loss, mask) / max(counts.sequences, 1.0)


def seq_mean_token_mean(
    loss: torch.Tensor, mask: torch.Tensor, counts: BatchCounts | None = None
) -> torch.Tensor:
    """(1/B')·Σ_i (Σ_t L·M / Σ_t M); empty rows contribute 0 and are not counted."""
    counts = counts or local_counts(mask)
    per_seq = masked_sum(loss, mask, dim=-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / max(counts.sequences, 1.0)


def seq_mean_token_sum_norm(
    loss: torch.Tensor, mask: torch.Tensor, counts: BatchCounts | None = None
) -> torch.Tensor:
    """Dr.GRPO: (1/B')·Σ_i Σ_t L·M / T_max with T_max the configured max response length.

    Without ``counts``, T_max is the tensor width ``T`` (pass counts for padding-free
    results). T_max is floored at 1 so a zero-width batch gives 0, not 0/0 = NaN.
    """
    counts = counts or local_counts(mask)
    t_max = max(counts.max_response_length, 1)
    return masked_sum(loss, mask) / (max(counts.sequences, 1.0) * t_max)


@hookimpl
def rlzoo_register_loss_aggregations(register) -> None:
    register("token-mean", token_mean, description="mean over all valid tokens of the batch",
             paper="verl agg_loss; DAPO arXiv:2503.14476")
    register("token-sum", token_sum, description="sum over all valid tokens (no normalisation)")
    register("seq-mean-token-sum", seq_mean_token_sum,
             description="per-sequence token sum, averaged over sequences", paper="verl agg_loss")
    register("seq-mean-token-mean", seq_mean_token_mean,
             description="per-sequence token mean, averaged over sequences (original GRPO)",
             paper="arXiv:2402.03300")
    register("seq-mean-token-sum-norm", seq_mean_token_sum_norm,
             description="token sum divided by B' and the max response length (Dr.GRPO)",
             paper="arXiv:2503.20783")
