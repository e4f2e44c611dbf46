"""Masked tensor reductions shared by the engine and plugins.

All functions take a float ``mask`` of the same shape as (or broadcastable to) the
input, 1 for valid entries and 0 for padding. Padding never influences the result, and an
all-zero mask gives 0 rather than NaN.

Full reductions (``dim=None``) are batch statistics: inside
:func:`rlzoo.core.distributed.batch_statistics` they sum over all data-parallel ranks, so
whitening and batch-level scaling under ``torchrun`` equal the single-process values.
Reductions over a dimension stay per row (local).
"""

from __future__ import annotations

import torch

from rlzoo.core.distributed import batch_sum


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ values·mask over ``dim`` (all dims when ``None``).

    Padded entries are zeroed with ``where`` so a NaN or inf in padding cannot leak.
    """
    masked = torch.where(mask.bool(), values, torch.zeros_like(values))
    return batch_sum(masked.sum()) if dim is None else masked.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ values·mask / Σ mask over ``dim``; 0 where the mask is empty."""
    count = batch_sum(mask.sum()) if dim is None else mask.sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the valid entries (over all dims); Bessel-corrected when ``unbiased``.

    Returns 0 when fewer than two entries are valid (fewer than one when biased).
    """
    mean = masked_mean(values, mask)
    count = batch_sum(mask.sum())
    sq = masked_sum((values - mean) ** 2, mask)
    denom = count - 1 if unbiased else count
    return torch.where(denom > 0, sq / denom.clamp(min=1), torch.zeros_like(sq))


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """(values − masked mean)·rsqrt(masked unbiased variance + eps) over the valid entries;
    padding 0. Exactly verl's ``verl_F.masked_whiten`` (and TRL's): eps sits inside the
    square root, on the variance.

    With ``shift_mean=False`` the mean is added back (scale only), as in verl's
    ``masked_whiten(shift_mean=False)``.
    """
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask, unbiased=True) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, torch.zeros_like(whitened))
