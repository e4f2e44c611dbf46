"""Importance ratios: the clamp every log-ratio goes through before it is exponentiated.

ALGORITHMS.md (after verl): the ratio ρ = exp(logp − old_logp) is computed from the log
difference clamped to [−20, 20], so an extreme token can neither overflow float32 nor
produce ``inf · 0 = nan`` under a mask; sequence-level sums of log-ratios are clamped the
same way.
"""

from __future__ import annotations

import torch

LOG_RATIO_CLAMP = 20.0
"""Bound on a log-ratio (token or sequence sum) before ``exp``: |log ρ| <= 20."""


def clamped_exp(log_ratio: torch.Tensor) -> torch.Tensor:
    """``exp(clamp(log_ratio, -20, 20))``, elementwise; any shape."""
    return torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
