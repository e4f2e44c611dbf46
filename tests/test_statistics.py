"""The statistics of rlzoo compare against hand-computed values, scipy and rliable's
definitions (rlzoo/analysis/intervals.py, aggregates.py, sequential.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from rlzoo.analysis.aggregates import (
    improvement_last_axis,
    iqm,
    iqm_last_axis,
    probability_of_improvement,
    stratified_bootstrap,
)
from rlzoo.analysis.intervals import (
    Contrast,
    components,
    paired_contrast,
    prompts_needed,
    satterthwaite,
    seed_contrast,
    seeds_needed,
    unpaired_contrast,
)
from rlzoo.analysis.sequential import SequentialDesign

A = np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])    # 2 seeds × 3 prompts
B = np.array([[0.0, 0.0, 1.0], [0.0, 1.0, 1.0]])


def test_one_group_s_interval_from_the_mean_squares_by_hand() -> None:
    """Run means 2/3, 1/3: s² = 1/18, seeds part 1/36. Prompt means ½, 0, 1: s² = ¼, /3 = 1/12.
    Residuals ±(1/3, −1/6, −1/6): SS 1/3 over 2 df, MS_res = 1/6; their share 1/6 / (2·3) = 1/36.
    Var = 1/36 + (1/12 − 1/36) = 1/12; df = (1/12)² / ((1/36)²/1 + (1/18)²/2) = 3."""
    comp = components(A)
    assert (comp.runs, comp.prompts) == (2, 3)
    assert comp.run_var == pytest.approx(1 / 18) and comp.residual == pytest.approx(1 / 6)
    interval = paired_contrast([A], [1.0]).interval()
    assert interval.value == pytest.approx(0.5) and interval.method == "seeds × prompts"
    assert interval.seeds_var == pytest.approx(1 / 36) and interval.prompts_var == pytest.approx(1 / 18)
    assert interval.se == pytest.approx(math.sqrt(1 / 12)) and interval.df == pytest.approx(3)
    half = 3.182446305284263 * math.sqrt(1 / 12)              # t(0.975, 3)
    assert (interval.low, interval.high) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))


def test_a_paired_difference_cancels_the_prompts_and_keeps_their_interaction() -> None:
    """A − B per prompt: ½, −½, 0: s² ¼, /3 = 1/12, less both residual shares 2 · 1/36: 1/36.
    Seeds: 1/36 each. Var = 3/36 = 1/12; df = (1/12)² / (2·(1/36)² + (1/36)²/2) = 3.6."""
    interval = paired_contrast([A, B], [1.0, -1.0]).interval()
    assert interval.value == pytest.approx(0.0)
    assert interval.seeds_var == pytest.approx(2 / 36) and interval.prompts_var == pytest.approx(1 / 36)
    assert interval.df == pytest.approx(3.6)
    assert interval.high == pytest.approx(stats.t.ppf(0.975, 3.6) * math.sqrt(1 / 12))
    # on different prompt sets nothing cancels: each group's own prompt part (1/18) adds
    unpaired = unpaired_contrast([A, B], [1.0, -1.0]).interval()
    assert unpaired.prompts_var == pytest.approx(1 / 18 + 1 / 18) and unpaired.seeds_var == pytest.approx(2 / 36)


def test_prompt_difficulty_shared_by_two_groups_cancels_when_paired() -> None:
    """Two groups with the same per-prompt values plus a constant: the paired difference has
    no prompt variance left; unpaired it keeps both groups' prompt spread."""
    prompts = np.array([0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    group = np.stack([prompts, prompts])
    paired = paired_contrast([group + 0.1, group], [1.0, -1.0]).interval()
    assert paired.value == pytest.approx(0.1) and paired.se == pytest.approx(0.0)
    assert (paired.low, paired.high) == (pytest.approx(0.1), pytest.approx(0.1)) and math.isinf(paired.df)
    assert unpaired_contrast([group + 0.1, group], [1.0, -1.0]).interval().se == pytest.approx(
        math.sqrt(2 * prompts.var(ddof=1) / 6))


def test_a_group_of_one_run_covers_the_prompts_only() -> None:
    interval = paired_contrast([np.array([[1.0, 0.0, 1.0, 1.0]])], [1.0]).interval()
    assert interval.method == "prompts only" and interval.seeds_var == 0
    assert interval.se == pytest.approx(math.sqrt(0.25 / 4)) and interval.df == pytest.approx(3)


def test_values_per_run_give_welch_s_interval() -> None:
    """[1, 2, 3] and [2, 4]: variances 1 and 2, Var = 1/3 + 1 = 4/3, df = (16/9)/(1/18 + 1) = 32/19."""
    x, y = np.array([1.0, 2.0, 3.0]), np.array([2.0, 4.0])
    interval = seed_contrast([x, y], [1.0, -1.0]).interval()
    assert interval.value == -1 and interval.method == "seeds only"
    assert interval.se == pytest.approx(math.sqrt(4 / 3)) and interval.df == pytest.approx(32 / 19)
    welch = stats.ttest_ind(x, y, equal_var=False).confidence_interval(0.95)
    assert (interval.low, interval.high) == (pytest.approx(welch.low), pytest.approx(welch.high))
    single = seed_contrast([np.array([0.7])], [1.0]).interval()
    assert single.method == "one run" and single.value == 0.7 and single.se == 0


def test_satterthwaite_by_hand() -> None:
    assert satterthwaite([(1.0, 2.0), (1.0, 2.0)]) == pytest.approx(4.0)
    assert satterthwaite([(1.0, 4.0)]) == pytest.approx(4.0)
    assert math.isinf(satterthwaite([(0.0, 3.0)]))


def _normal_contrast(run_var: float, runs: int = 2) -> Contrast:
    """Two groups of one value per run with variance ``run_var`` each (no prompts)."""
    values = np.array([0.0, math.sqrt(2 * run_var)])[:runs]   # s² = run_var for two runs
    return seed_contrast([values, values], [1.0, -1.0])


def test_seeds_needed_solves_the_power_equation() -> None:
    contrast = _normal_contrast(0.01)
    n = seeds_needed(contrast, 0.1)
    df = 2 * (n - 1)     # Welch with equal variances and runs
    need = lambda k, d: (stats.t.ppf(0.975, d) + stats.t.ppf(0.8, d)) * math.sqrt(0.02 / k)  # noqa: E731
    assert need(n, df) <= 0.1 < need(n - 1, 2 * (n - 2))
    assert n == 17                       # with t quantiles on 32 df; the normal's 2·(1.96 + 0.84)² · 0.01/0.01 = 15.7
    assert seeds_needed(contrast, 0.2) < n and seeds_needed(contrast, -0.1) == n
    assert seeds_needed(contrast, 0.0) is None
    one = seed_contrast([np.array([0.5]), np.array([0.1, 0.2])], [1.0, -1.0])
    assert seeds_needed(one, 0.1) is None            # one run: no seed variance to plan from


def test_seeds_needed_gives_the_promised_power_in_simulation() -> None:
    """With the seeds planned for a true difference, Welch's 95% interval excludes 0 in about
    80% of 2,000 simulated comparisons of normal runs."""
    rng = np.random.default_rng(7)
    n = seeds_needed(_normal_contrast(0.01), 0.1)
    hits = 0
    for _ in range(2000):
        x, y = rng.normal(0.1, 0.1, n), rng.normal(0.0, 0.1, n)
        hits += seed_contrast([x, y], [1.0, -1.0]).interval().excludes_zero
    assert 0.76 <= hits / 2000 <= 0.86


def test_more_prompts_shrink_what_seeds_cannot() -> None:
    """A contrast whose prompt interaction dominates (prompts suit one group or the other):
    no number of seeds resolves 0.05 on 64 prompts, more prompts do, fewer with more seeds or
    for a larger difference."""
    rng = np.random.default_rng(0)
    easy_for_a, easy_for_b = rng.random(64), rng.random(64)      # prompts differ in which group they suit
    a = (rng.random((3, 64)) < easy_for_a).astype(float)
    b = (rng.random((3, 64)) < easy_for_b).astype(float)
    contrast = paired_contrast([a, b], [1.0, -1.0])
    assert seeds_needed(contrast, 0.05) is None and seeds_needed(contrast, 0.1) is None
    prompts = prompts_needed(contrast, 0.05, runs=3)
    assert prompts is not None and prompts > 64
    assert prompts_needed(contrast, 0.05, runs=10) < prompts and prompts_needed(contrast, 0.1, runs=3) < prompts


def test_iqm_is_rliable_s_trimmed_mean() -> None:
    assert iqm(np.arange(1.0, 9.0)) == 4.5                      # drops 1, 2 and 7, 8
    assert iqm(np.array([0.0, 1.0, 100.0])) == pytest.approx(101 / 3)   # ⌊0.75⌋ = 0: nothing trimmed
    scores = np.random.default_rng(1).random((5, 3))             # runs × tasks, flattened as rliable does
    assert iqm(scores) == pytest.approx(stats.trim_mean(scores, 0.25, axis=None))


def test_probability_of_improvement_is_rliable_s_mann_whitney_share() -> None:
    assert probability_of_improvement(np.array([1.0, 2.0]), np.array([1.0, 0.0])) == 0.875   # ties count ½
    assert probability_of_improvement(np.array([0.3]), np.array([0.3])) == 0.5
    x, y = np.array([0.1, 0.4, 0.35, 0.8, 0.2]), np.array([0.3, 0.3, 0.05, 0.6])
    assert probability_of_improvement(x, y) == pytest.approx(
        stats.mannwhitneyu(x, y, alternative="greater").statistic / 20)
    tasks_x, tasks_y = np.array([[1.0, 0.0], [2.0, 0.0]]), np.array([[0.0, 1.0], [0.0, 1.0]])
    assert probability_of_improvement(tasks_x, tasks_y) == 0.5     # task 1: 1, task 2: 0; the mean over tasks


def test_the_stratified_bootstrap_equals_scipy_s_with_the_same_resamples() -> None:
    x, y = np.array([0.1, 0.4, 0.35, 0.8, 0.2]), np.array([0.3, 0.3, 0.05, 0.6])

    def improvement(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        return ((a[..., :, None] > b[..., None, :]).mean((-1, -2))
                + 0.5 * (a[..., :, None] == b[..., None, :]).mean((-1, -2)))

    for seed in (0, 3):
        low, high, distribution = stratified_bootstrap([x, y], probability_of_improvement, 0.9, 500, seed)
        ref = stats.bootstrap((x, y), improvement, n_resamples=500, method="percentile", confidence_level=0.9,
                              rng=np.random.default_rng(seed), vectorized=True)
        assert np.array_equal(distribution, ref.bootstrap_distribution)          # the same resamples
        batched = stratified_bootstrap([x, y], improvement_last_axis, 0.9, 500, seed, vectorized=True)
        assert np.array_equal(batched[2], distribution) and batched[:2] == (low, high)
        assert (low, high) == (pytest.approx(ref.confidence_interval.low, abs=1e-12),
                               pytest.approx(ref.confidence_interval.high, abs=1e-12))
        low, high, _ = stratified_bootstrap([x], iqm, 0.95, 500, seed)
        assert (low, high) == stratified_bootstrap([x], iqm_last_axis, 0.95, 500, seed, vectorized=True)[:2]
        ref = stats.bootstrap((x,), lambda a, axis=-1: stats.trim_mean(a, 0.25, axis=axis), n_resamples=500,
                              method="percentile", rng=np.random.default_rng(seed))
        assert (low, high) == (pytest.approx(ref.confidence_interval.low), pytest.approx(ref.confidence_interval.high))
    assert stratified_bootstrap([x], iqm)[:2] == stratified_bootstrap([x], iqm)[:2]      # seeded: a report repeats


def test_the_sequential_design_splits_alpha_over_its_looks() -> None:
    design = SequentialDesign(first=2, max_seeds=6)
    assert design.looks == 5 and design.level == pytest.approx(0.99)
    assert SequentialDesign(first=3, max_seeds=3).level == pytest.approx(0.95)
    with pytest.raises(ValueError, match="at least 2 seeds"):
        SequentialDesign(first=1, max_seeds=4)
    with pytest.raises(ValueError, match="--max-seeds 2 is below the first round's 3 seeds"):
        SequentialDesign(first=3, max_seeds=2)
