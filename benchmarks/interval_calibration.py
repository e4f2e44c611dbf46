"""Are rlzoo compare's 95% intervals 95% intervals? Coverage in simulation and on real runs.

    python benchmarks/interval_calibration.py                 # the simulated tables (a few minutes)
    python benchmarks/interval_calibration.py --real tests/data/aa_records_default.npz [--pool-spread]
    python benchmarks/interval_calibration.py --pack runs/aa-default tests/data/aa_records_default.npz

**Simulated outcomes with a known truth.** Each comparison draws a fresh held-out set of N
prompts and fresh seeds from a crossed logistic model: prompt p of run r is correct with
probability σ(α + a_r + b_p + c_gp), with a seed effect a ~ N(0, s_seed²), a prompt
difficulty b ~ N(0, s_prompt²) shared by every run and group, and a group × prompt
interaction c ~ N(0, s_inter²). The truth of a group is E σ(α + a + b + c) over seeds and
the prompt population (Gauss–Hermite quadrature); of an A/A difference, 0. Coverage is the
share of comparisons whose interval holds the truth. Two intervals are measured: rlzoo's
(Student's t on the seeds × prompts variance components, :mod:`rlzoo.analysis.intervals`)
and the percentile bootstrap over seeds with the prompts resampled within (two levels, the
same prompt resample for every run), the method the issue suggested first.

**Real runs (A/A).** ``--pack`` keeps, from a sweep of one config over many seeds, each
seed's per-prompt greedy correctness at the last evaluation; ``--real`` splits those seeds
at random into two groups of n (a comparison of a config with itself, true difference 0)
and counts the intervals that hold 0.

**The sequential sweep.** A/A comparisons looked at after every added seed: how often any
look declares a difference, with each look at 95% (naive) and at 1 − 5%/K (rlzoo's
Bonferroni bound, :mod:`rlzoo.analysis.sequential`).

``tests/test_calibration.py`` runs the same functions with fewer (but at least 1,000)
comparisons per case; docs/compare.md ("Reading a comparison") quotes this script's tables.
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.special import expit

from rlzoo.analysis.aggregates import iqm, stratified_bootstrap
from rlzoo.analysis.intervals import LEVEL, paired_contrast, t_quantile
from rlzoo.analysis.sequential import SequentialDesign
from rlzoo.run.eval_records import per_prompt, read_records

GAUSS_HERMITE = np.polynomial.hermite_e.hermegauss(120)


@dataclass(frozen=True)
class Scenario:
    """A crossed logistic model of per-prompt correctness (module docstring)."""

    name: str
    alpha: float = -0.5
    seed_sd: float = 0.5
    prompt_sd: float = 1.5
    interaction_sd: float = 0.3
    prompts: int = 128

    def truth(self, shift: float = 0.0) -> float:
        """E σ(α + shift + a + b + c) over seeds and the prompt population."""
        nodes, weights = GAUSS_HERMITE
        scale = np.sqrt(self.seed_sd ** 2 + self.prompt_sd ** 2 + self.interaction_sd ** 2)
        return float((expit(self.alpha + shift + scale * nodes) * weights).sum() / weights.sum())

    def draw(self, rng: np.random.Generator, runs: int, shifts: tuple[float, ...] = (0.0,)) -> list[np.ndarray]:
        """One comparison: a runs × prompts 0/1 table per group (one entry of ``shifts``
        each), all on one freshly drawn held-out set."""
        difficulty = rng.normal(0, self.prompt_sd, self.prompts)
        tables = []
        for shift in shifts:
            seeds = rng.normal(0, self.seed_sd, (runs, 1))
            interaction = rng.normal(0, self.interaction_sd, self.prompts)
            chance = expit(self.alpha + shift + seeds + difficulty + interaction)
            tables.append((rng.random((runs, self.prompts)) < chance).astype(np.float64))
        return tables


SCENARIOS = (Scenario("prompts dominate"), Scenario("seeds and prompts", seed_sd=1.0, prompt_sd=1.0),
             Scenario("seeds dominate", seed_sd=1.5, prompt_sd=0.5, interaction_sd=0.0),
             Scenario("few prompts", seed_sd=0.7, prompts=32))


def t_interval(tables: list[np.ndarray], weights: list[float], level: float = LEVEL) -> tuple[float, float]:
    """rlzoo's interval of Σ w·mean(table)."""
    interval = paired_contrast(tables, weights).interval(level)
    return interval.low, interval.high


def bootstrap_interval(tables: list[np.ndarray], weights: list[float], rng: np.random.Generator,
                       level: float = LEVEL, resamples: int = 400) -> tuple[float, float]:
    """The two-level percentile bootstrap: seeds resampled within each group, the prompts
    resampled once per resample for every run."""
    n_prompts = tables[0].shape[1]
    prompts = rng.integers(0, n_prompts, (resamples, n_prompts))
    values = np.zeros(resamples)
    for weight, table in zip(weights, tables):
        seeds = rng.integers(0, len(table), (resamples, len(table)))
        run_means = table[seeds[:, :, None], prompts[:, None, :]].mean(-1)   # (B, runs)
        values += weight * run_means.mean(-1)
    low, high = np.quantile(values, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(low), float(high)


def coverage(scenario: Scenario, runs: int, sims: int, seed: int, difference: bool = False,
             method: str = "t", shift: float = 0.0) -> float:
    """The share of ``sims`` simulated comparisons whose interval holds the truth: of one
    group's mean, or of a paired difference (``shift``: the first group's shift on the logit
    scale; 0 is A/A)."""
    rng = np.random.default_rng(seed)
    shifts, weights = ((shift, 0.0), [1.0, -1.0]) if difference else ((shift,), [1.0])
    truth = scenario.truth(shift) - (scenario.truth(0.0) if difference else 0.0)
    held = 0
    for _ in range(sims):
        tables = scenario.draw(rng, runs, shifts)
        low, high = t_interval(tables, weights) if method == "t" else bootstrap_interval(tables, weights, rng)
        held += low <= truth <= high
    return held / sims


def real_aa_coverage(table: np.ndarray, runs: int, sims: int, seed: int) -> float:
    """A/A coverage on real runs: ``table`` is seeds × prompts of one config; each comparison
    splits ``2·runs`` distinct seeds into two groups and asks whether the paired interval
    holds 0."""
    rng = np.random.default_rng(seed)
    held = 0
    for _ in range(sims):
        chosen = rng.permutation(len(table))[:2 * runs]
        low, high = t_interval([table[chosen[:runs]], table[chosen[runs:]]], [1.0, -1.0])
        held += low <= 0 <= high
    return held / sims


def table_moments(table: np.ndarray) -> np.ndarray:
    """What a seeds × prompts 0/1 table shows of its variance components: the mean, the
    standard deviation of the runs' means and of the prompts' means."""
    return np.array([table.mean(), table.mean(1).std(ddof=1), table.mean(0).std(ddof=1)])


def fit_scenario(table: np.ndarray, seed: int = 0, draws: int = 30) -> Scenario:
    """A :class:`Scenario` whose pools of ``len(table)`` runs show ``table``'s moments
    (:func:`table_moments`, relative squared error summed, averaged over ``draws`` pools) on a
    grid of α, seed and prompt standard deviations (interaction kept at 0.3)."""
    rng = np.random.default_rng(seed)
    target = table_moments(table)
    best, best_error = None, np.inf
    for alpha, seed_sd, prompt_sd in itertools.product(np.arange(-5.0, 0.01, 0.25), (0.25, 0.5, 0.75, 1.0, 1.25,
                                                       1.5, 2.0), (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)):
        scenario = Scenario("fitted", alpha=float(alpha), seed_sd=seed_sd, prompt_sd=prompt_sd,
                            prompts=table.shape[1])
        moments = np.mean([table_moments(scenario.draw(rng, len(table))[0]) for _ in range(draws)], axis=0)
        error = float((((moments - target) / target) ** 2).sum())
        if error < best_error:
            best, best_error = scenario, error
    return best


def pool_coverages(scenario: Scenario, pool: int, runs: int, pools: int, splits: int, seed: int) -> np.ndarray:
    """What :func:`real_aa_coverage` reads on pools of ``pool`` runs drawn from ``scenario``:
    one coverage per pool, each from ``splits`` splits into two groups of ``runs``. Its spread
    is how far a real pool's coverage can sit from the interval's own coverage by the luck of
    which seeds the pool holds (the splits of one pool are not independent comparisons)."""
    rng = np.random.default_rng(seed)
    return np.array([real_aa_coverage(scenario.draw(rng, pool)[0], runs, splits, seed=i) for i in range(pools)])


def sequential_false_positives(scenario: Scenario, first: int, max_seeds: int, sims: int, seed: int,
                               naive: bool = False) -> float:
    """The share of A/A comparisons that some look declares resolved, seeds added one per
    look from ``first`` to ``max_seeds``, each look at 95% (``naive``) or at the
    :class:`SequentialDesign` level."""
    design = SequentialDesign(first=first, max_seeds=max_seeds)
    level = LEVEL if naive else design.level
    rng = np.random.default_rng(seed)
    declared = 0
    for _ in range(sims):
        a, b = scenario.draw(rng, max_seeds, (0.0, 0.0))
        for n in range(first, max_seeds + 1):
            low, high = t_interval([a[:n], b[:n]], [1.0, -1.0], level)
            if low > 0 or high < 0:
                declared += 1
                break
    return declared / sims


def iqm_coverage(scenario: Scenario, runs: int, sims: int, seed: int) -> float:
    """Coverage of rlzoo's IQM interval (rliable's percentile bootstrap over runs) for the
    IQM of the run means: truth by a large simulation of the same scenario."""
    rng = np.random.default_rng(seed)
    big = np.array([iqm(scenario.draw(rng, runs)[0].mean(1)) for _ in range(20000)])
    truth = float(big.mean())
    held = 0
    for i in range(sims):
        values = scenario.draw(rng, runs)[0].mean(1)
        low, high, _ = stratified_bootstrap([values], iqm, resamples=500, seed=i)
        held += low <= truth <= high
    return held / sims


def pack(sweep_dir: Path, out: Path, tag: str = "eval/greedy_accuracy") -> None:
    """Write the per-prompt values of ``tag`` at every evaluation step the seeds share into
    ``out``: ``values`` (steps × seeds × prompts, prompts in id order) and ``steps``."""
    tables: dict[int, list[np.ndarray]] = {}
    ids, seeds = None, []
    for run in sorted(sweep_dir.iterdir()):
        records = read_records(run) if run.is_dir() else {}
        if not records:
            continue
        seeds.append(run.name)
        for step, record in records.items():
            order = np.argsort(record.prompt_id, kind="stable")
            if ids is not None and not np.array_equal(ids, record.prompt_id[order]):
                raise SystemExit(f"{run} evaluated another held-out set")
            ids = record.prompt_id[order]
            tables.setdefault(step, []).append(per_prompt(record, tag)[order])
    steps = sorted(step for step, rows in tables.items() if len(rows) == len(seeds))
    values = np.array([tables[step] for step in steps])
    np.savez_compressed(out, values=values, steps=np.array(steps), prompt_id=ids, seeds=np.array(seeds), tag=tag)
    print(f"wrote {out}: {len(seeds)} seeds × {len(ids)} prompts of {tag} at steps {steps}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--real", type=Path, help="A/A coverage on a packed file of real runs")
    parser.add_argument("--pack", nargs=2, type=Path, metavar=("SWEEP_DIR", "OUT"))
    parser.add_argument("--sims", type=int, default=4000)
    parser.add_argument("--pool-spread", action="store_true",
                        help="with --real: the spread of a pool's A/A coverage, on a scenario fitted to each step")
    args = parser.parse_args()
    if args.pack:
        pack(*args.pack)
        return
    if args.real:
        with np.load(args.real) as data:
            values, steps = data["values"], data["steps"]
        for step, table in zip(steps, values):
            accuracies = np.percentile(table.mean(1), [0, 50, 100])
            cover = [f"{n} vs {n} seeds {real_aa_coverage(table, n, args.sims, 0):.3f}" for n in (2, 3, 5)]
            print(f"step {step}: the seeds' accuracy min {accuracies[0]:.3f}, median {accuracies[1]:.3f}, max "
                  f"{accuracies[2]:.3f}; A/A coverage {', '.join(cover)}")
            if args.pool_spread and table.mean() > 0:
                fitted = fit_scenario(table)
                print(f"  fitted: alpha {fitted.alpha}, seed sd {fitted.seed_sd}, prompt sd {fitted.prompt_sd}; "
                      f"moments real {np.round(table_moments(table), 3)}")
                for n in (2, 3, 5):
                    fresh = coverage(fitted, n, args.sims // 2, 7, difference=True)
                    spread = np.quantile(pool_coverages(fitted, len(table), n, 150, 500, 5), [0.05, 0.5, 0.95])
                    print(f"  {n} vs {n}: fresh comparisons {fresh:.3f}; a pool of {len(table)} seeds reads "
                          f"{spread[0]:.3f} / {spread[1]:.3f} / {spread[2]:.3f} (5th / 50th / 95th percentile)")
        return
    print(f"t quantiles: df 1 {t_quantile(0.95, 1):.2f}, 2 {t_quantile(0.95, 2):.2f}, 4 {t_quantile(0.95, 4):.2f}")
    print("| scenario | n seeds | group: t | group: bootstrap | A/A difference: t | A/A difference: bootstrap |")
    print("|---|---|---|---|---|---|")
    for scenario, runs in itertools.product(SCENARIOS, (2, 3, 5, 10)):
        cells = [coverage(scenario, runs, args.sims, 1, difference, method)
                 for difference in (False, True) for method in ("t", "bootstrap")]
        print(f"| {scenario.name} | {runs} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    for scenario in SCENARIOS[:2]:
        print(f"{scenario.name}: a true difference (logit +0.5), 3 seeds: t coverage "
              f"{coverage(scenario, 3, args.sims, 2, True, 't', 0.5):.3f}")
    for runs in (4, 5, 10):
        print(f"IQM, {runs} runs (prompts dominate): coverage {iqm_coverage(SCENARIOS[0], runs, 1000, 3):.3f}")
    for first, most in ((2, 6), (2, 10), (3, 8)):
        naive = sequential_false_positives(SCENARIOS[1], first, most, args.sims // 2, 4, naive=True)
        held = sequential_false_positives(SCENARIOS[1], first, most, args.sims // 2, 4)
        print(f"sequential A/A, {first} to {most} seeds: false positives naive {naive:.3f}, Bonferroni {held:.3f}")


if __name__ == "__main__":
    main()
