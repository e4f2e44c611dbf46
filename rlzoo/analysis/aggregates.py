"""rliable's aggregate statistics over runs, implemented from their definitions (Agarwal,
Schwarzer, Castro, Courville and Bellemare 2021, "Deep Reinforcement Learning at the Edge of
the Statistical Precipice", NeurIPS; arXiv:2108.13264; the library ``rliable``, archived
since 2025-10, is not a dependency):

- the interquartile mean (IQM): the mean of the middle 50 % of the scores, trimming
  ⌊0.25·n⌋ from each end (``scipy.stats.trim_mean(scores, 0.25)``, as rliable's
  ``aggregate_iqm`` over the flattened runs × tasks scores);
- the probability of improvement P(X > Y): for each task, the share of run pairs (x, y)
  with x > y, ties counting one half (the Mann–Whitney U over n·m), averaged over tasks;
- the stratified bootstrap: resample the runs of each stratum (a task; here a group)
  with replacement, independently, and take the percentile interval of the statistic.

Every resample is drawn from a seeded :class:`numpy.random.Generator`, in the order
``scipy.stats.bootstrap`` draws them (one ``integers(0, n, (B, n))`` per sample), so the
same seed gives scipy's interval exactly (tested) and a report repeats.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

RESAMPLES = 2000
SEED = 0
"""The bootstrap's default resamples and Generator seed (a report repeats exactly)."""


def iqm(scores: np.ndarray) -> float:
    """The interquartile mean of ``scores`` (flattened): the mean of the sorted scores
    without the ⌊0.25·n⌋ lowest and ⌊0.25·n⌋ highest."""
    return float(iqm_last_axis(np.asarray(scores, dtype=np.float64).ravel()))


def iqm_last_axis(scores: np.ndarray) -> np.ndarray:
    """:func:`iqm` along the last axis (a batch of resamples at once)."""
    ordered = np.sort(np.asarray(scores, dtype=np.float64), axis=-1)
    cut = int(0.25 * ordered.shape[-1])
    return ordered[..., cut:ordered.shape[-1] - cut].mean(-1)


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) of rliable: runs × tasks scores ``x`` (n × K) and ``y`` (m × K), or one value
    per run (1-D: one task); per task the mean over run pairs of 1[x > y] + ½·1[x = y],
    averaged over tasks."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim == 1:
        return float(improvement_last_axis(x, y))
    return float(np.mean([improvement_last_axis(x[:, k], y[:, k]) for k in range(x.shape[1])]))


def improvement_last_axis(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) of one task's runs along the last axis (a batch of resamples at once)."""
    greater = (x[..., :, None] > y[..., None, :]).mean((-2, -1))
    ties = (x[..., :, None] == y[..., None, :]).mean((-2, -1))
    return greater + 0.5 * ties


def stratified_bootstrap(samples: list[np.ndarray], statistic: Callable[..., Any], level: float = 0.95,
                         resamples: int = RESAMPLES, seed: int = SEED,
                         vectorized: bool = False) -> tuple[float, float, np.ndarray]:
    """The percentile interval of ``statistic(*samples)`` under resampling each sample's
    runs (first axis) with replacement, independently.

    :param vectorized: ``statistic`` takes every resample at once (arrays B × n, the
        resamples along the first axis) and returns B values; else it is called per resample.
    :returns: ``(low, high, distribution)``: the interval at ``level`` (linear
        interpolation between order statistics, numpy's and scipy's default) and the
        ``resamples`` bootstrap values.
    """
    rng = np.random.default_rng(seed)
    samples = [np.asarray(s, dtype=np.float64) for s in samples]
    indices = [rng.integers(0, len(s), (resamples, len(s))) for s in samples]
    if vectorized:
        distribution = np.asarray(statistic(*(s[i] for s, i in zip(samples, indices))), dtype=np.float64)
    else:
        distribution = np.array([statistic(*(s[i[b]] for s, i in zip(samples, indices))) for b in range(resamples)])
    alpha = (1 - level) / 2
    low, high = np.quantile(distribution, [alpha, 1 - alpha])
    return float(low), float(high), distribution
