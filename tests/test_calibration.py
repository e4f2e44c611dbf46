"""Proof that rlzoo compare's intervals are honest: A/A calibration on simulated outcomes with
a known truth and on real runs that differ only in seed, and the false-positive rate of
``rlzoo sweep --until-resolved`` (benchmarks/interval_calibration.py runs the same functions
with more comparisons; docs/compare.md quotes its tables)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from benchmark_scripts import load_benchmark

REAL = Path(__file__).parent / "data" / "aa_records_default.npz"
SIMS = 1200
"""Comparisons per case: a calibrated 95% interval covers in 93.8–96.2% of them with
probability 0.95 (binomial), so the test's 93–97% band is failed by chance about once in
a thousand cases; the seeds are fixed, so the outcome never changes without the code."""


CAL = load_benchmark("interval_calibration")


@pytest.mark.parametrize("runs", [2, 3, 5])
@pytest.mark.parametrize("scenario", CAL.SCENARIOS[:3], ids=lambda s: s.name)
def test_a_a_differences_cover_zero_95_percent_of_the_time(scenario, runs: int) -> None:
    assert 0.93 <= CAL.coverage(scenario, runs, SIMS, seed=11, difference=True) <= 0.97


@pytest.mark.parametrize("scenario", CAL.SCENARIOS[:2], ids=lambda s: s.name)
def test_a_true_difference_is_covered_95_percent_of_the_time(scenario) -> None:
    assert 0.93 <= CAL.coverage(scenario, 3, SIMS, seed=12, difference=True, shift=0.5) <= 0.97


@pytest.mark.parametrize("runs, low", [(3, 0.90), (5, 0.93), (10, 0.93)])
def test_a_group_s_interval_covers_its_population_mean(runs: int, low: float) -> None:
    """One group's mean over seeds and the prompt population (the held-out set's sampling
    noise counted), where the prompts dominate. With 3 seeds a group's interval undercovers
    a little (about 92%: Satterthwaite's t for a sum whose seed part has 2 degrees of
    freedom; docs/compare.md says so); differences, where the seeds dominate, do not."""
    assert low <= CAL.coverage(CAL.SCENARIOS[0], runs, SIMS, seed=13) <= 0.97


def test_the_percentile_bootstrap_over_three_seeds_is_not_what_compare_uses() -> None:
    """Why the t interval: the two-level percentile bootstrap undercovers with 3 seeds."""
    assert CAL.coverage(CAL.SCENARIOS[1], 3, 400, seed=14, method="bootstrap") < 0.88


@pytest.mark.parametrize("runs", [2, 3, 5])
@pytest.mark.parametrize("step", [200, 300])
def test_a_a_on_real_runs_that_differ_only_in_seed(runs: int, step: int) -> None:
    """20 default-task runs of one config (seeds 0-19, 300 steps, evaluated at 100, 200 and
    300; how the file was made: docs/compare.md, "Reading a comparison"), split at random
    into two groups of n: the paired interval of their held-out greedy accuracy holds 0 in
    96-98% of 1,200 splits. On these runs the intervals err on the wide side, up to a point
    past the 97% of a calibrated interval: the seeds' accuracies have a long right tail (at
    step 300: median 0.18, the two best 0.48 and 0.70; at 200: 0.03 and 0.125), and
    Student's t is conservative for such a sample (the variance is estimated without bias:
    0.0161 against 0.0162 over the splits). The lower bound is the one that protects a claim."""
    with np.load(REAL) as data:
        steps, values = list(data["steps"]), data["values"]
    table = values[steps.index(step)]
    assert table.shape == (20, 128) and 0.02 < table.mean() < 0.5
    assert 0.93 <= CAL.real_aa_coverage(table, runs, SIMS, seed=15) <= 0.985


def test_real_a_a_coverage_past_97_percent_is_what_a_pool_of_20_seeds_reads() -> None:
    """Why the real runs' 98% at step 300 does not show a miscalibrated interval: the 4,000
    splits of one pool of 20 seeds are not independent comparisons, and which 20 seeds the
    pool holds moves their coverage. A scenario with the real table's moments (fitted by
    ``interval_calibration.py --real ... --pool-spread``: α −2.25, seed sd 1.5, prompt sd 1.5)
    covers 0 in 93-97% of fresh comparisons, and its pools of 20 seeds read a coverage as high
    as the real pool's in more than 5% of pools."""
    with np.load(REAL) as data:
        steps, values = list(data["steps"]), data["values"]
    table = values[steps.index(300)]
    fitted = CAL.Scenario("fitted to step 300", alpha=-2.25, seed_sd=1.5, prompt_sd=1.5)
    rng = np.random.default_rng(21)
    moments = np.mean([CAL.table_moments(fitted.draw(rng, 20)[0]) for _ in range(30)], axis=0)
    assert np.all(np.abs(moments / CAL.table_moments(table) - 1) < 0.15)
    assert 0.93 <= CAL.coverage(fitted, 3, SIMS, seed=22, difference=True) <= 0.97
    real = CAL.real_aa_coverage(table, 3, SIMS, seed=15)
    pools = CAL.pool_coverages(fitted, 20, 3, 60, 300, seed=23)
    assert real > 0.97 and np.mean(pools >= real) > 0.05


def test_the_sequential_sweep_keeps_its_false_positive_rate_at_5_percent() -> None:
    """A/A comparisons looked at with 2, 3, ..., 8 seeds per group: with each look at 95%
    some look declares a difference far more often than 5%; with the Bonferroni bound over
    the 7 looks at most 5%."""
    naive = CAL.sequential_false_positives(CAL.SCENARIOS[1], 2, 8, 1000, seed=16, naive=True)
    held = CAL.sequential_false_positives(CAL.SCENARIOS[1], 2, 8, 1000, seed=16)
    assert naive > 0.08 and held <= 0.05
