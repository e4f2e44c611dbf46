"""Confidence intervals for means over seeds and held-out prompts, and the seeds they need.

A run's evaluation metric is the mean over N held-out prompts of a per-prompt value
(:func:`rlzoo.run.eval_records.per_prompt`). Every run of a task evaluates the same prompts,
so a group of n runs is a crossed seed × prompt table Y (n × N), modelled as

    y_rp = μ + a_r + b_p + e_rp,    Var a = σ²_seed, Var b = σ²_prompt, Var e = σ²_res,

with the prompts a sample of the task's held-out population. The group mean M = mean(Y)
has Var M = σ²_seed/n + σ²_prompt/N + σ²_res/(nN), and from the two-way table's mean
squares (no replication)

    Var̂ M = s²(run means)/n + [s²(prompt means)/N − MS_res/(nN)]⁺,

whose expectation is Var M exactly (the bracket is the prompts' share, kept at ≥ 0). A
difference of groups evaluated on the same prompts is the same contrast with weights ±1:
the prompts' shared difficulty b_p cancels, and what remains of the prompts is the
group × prompt interaction (the bracket over the per-prompt differences). The interval is
M ± t·SE with Student's t on Welch–Satterthwaite degrees of freedom (seed parts: n − 1,
prompt part: N − 1): with 2–3 seeds the seed part has 1–2 degrees of freedom and t is
4.3–12.7, not 1.96 — what a bootstrap over 3 seeds cannot know (it undercovers; the
calibration is in docs/compare.md, "Reading a comparison"). A group of one run has no seed
part: its interval covers the held-out prompts only. Runs without per-prompt records give
the seed part alone, from their logged values (:func:`seed_interval`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

LEVEL = 0.95
POWER = 0.80
MAX_SEEDS = 1000
"""The largest number of seeds per group :func:`seeds_needed` searches."""


@dataclass(frozen=True)
class Interval:
    """An estimate with its confidence interval.

    :ivar value: the point estimate (a group mean, or a difference of group means).
    :ivar low, high: the interval's bounds (equal to ``value`` when it has no variance).
    :ivar se: its standard error; ``df``: Satterthwaite's degrees of freedom (``inf``: normal).
    :ivar seeds_var: the variance that comes from the seeds; ``prompts_var``: from the
        held-out prompts (``se² = seeds_var + prompts_var``).
    :ivar method: ``seeds × prompts``, ``prompts only`` (one run) or ``seeds only`` (no
        per-prompt records, or a per-run value such as the training reward).
    """

    value: float
    low: float
    high: float
    se: float
    df: float
    level: float
    seeds_var: float
    prompts_var: float
    method: str

    def within(self, low: float, high: float) -> "Interval":
        """The interval cut to the values the quantity can take (a share: [0, 1]; a
        difference of shares: [−1, 1]); its coverage is unchanged."""
        return dataclasses.replace(self, low=max(self.low, low), high=min(self.high, high))

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def as_dict(self) -> dict[str, float | str]:
        return {"value": self.value, "low": self.low, "high": self.high, "se": self.se, "df": self.df,
                "level": self.level, "seeds_var": self.seeds_var, "prompts_var": self.prompts_var,
                "method": self.method}


@dataclass(frozen=True)
class Components:
    """The variance components of one group's seed × prompt table (or of one group's run
    values, without prompts), for intervals and for planning seeds.

    :ivar runs: n; ``prompts``: N (0 without per-prompt values).
    :ivar run_var: s² of the run means (n − 1 denominator; 0 for one run).
    :ivar residual: MS_res of the two-way table (0 for one run or without prompts).
    """

    runs: int
    prompts: int
    run_var: float
    residual: float

    @property
    def seed_component(self) -> float:
        """σ̂²_seed = s²(run means) − MS_res/N, at least 0: seed noise without the prompts' share."""
        return max(self.run_var - (self.residual / self.prompts if self.prompts else 0.0), 0.0)


@dataclass(frozen=True)
class Contrast:
    """A weighted sum of group means (a group: weight 1; a difference: +1 and −1) with what
    its interval is built from.

    :ivar value: Σ w_g · mean_g.
    :ivar groups: (weight, components) of each group.
    :ivar interaction: the prompts' variance of the contrast per prompt (σ̂² of
        Σ w_g ȳ_g,p over p, minus the residuals' share, at least 0; for the whole prompt set:
        divided by N). 0 without per-prompt values.
    :ivar prompts: N (0 without per-prompt values).
    :ivar unpaired: prompt parts of groups evaluated on different prompt sets, added
        (each group's own prompt variance, already divided by its N), with their N.
    """

    value: float
    groups: list[tuple[float, Components]]
    interaction: float
    prompts: int
    unpaired: list[tuple[float, int]] = field(default_factory=list)

    def variance_parts(self, runs: int | None = None, prompts: int | None = None) -> list[tuple[str, float, float]]:
        """``(source, variance, degrees of freedom)`` of each independent part of the
        contrast's variance (source ``seeds`` or ``prompts``), at the measured sizes or
        projected to ``runs`` seeds per group and ``prompts`` held-out prompts."""
        project = runs is not None or prompts is not None
        parts = []
        for weight, comp in self.groups:
            if comp.runs < 2:
                continue
            n = runs or comp.runs
            if project:
                seeds = comp.seed_component + (comp.residual / (prompts or comp.prompts) if comp.prompts else 0.0)
            else:
                seeds = comp.run_var
            parts.append(("seeds", weight * weight * seeds / n, n - 1))
        if self.prompts:
            n_prompts = prompts or self.prompts
            parts.append(("prompts", self.interaction / n_prompts, n_prompts - 1))
        for variance, n_prompts in self.unpaired:
            scale = n_prompts / prompts if prompts else 1.0
            parts.append(("prompts", variance * scale, (prompts or n_prompts) - 1))
        return parts

    def interval(self, level: float = LEVEL) -> Interval:
        """The contrast's interval at ``level`` (see the module docstring)."""
        parts = self.variance_parts()
        seeds_var = sum(v for source, v, _ in parts if source == "seeds")
        variance = sum(v for _, v, _ in parts)
        df = satterthwaite([(v, d) for _, v, d in parts])
        se = math.sqrt(variance)
        half = t_quantile(level, df) * se if se > 0 else 0.0
        one_run = any(c.runs < 2 for _, c in self.groups)
        with_prompts = bool(self.prompts or self.unpaired)
        method = ("prompts only" if one_run else "seeds × prompts") if with_prompts else \
            ("one run" if one_run else "seeds only")
        return Interval(value=self.value, low=self.value - half, high=self.value + half, se=se, df=df, level=level,
                        seeds_var=seeds_var, prompts_var=variance - seeds_var, method=method)


def satterthwaite(parts: list[tuple[float, float]]) -> float:
    """Welch–Satterthwaite degrees of freedom of a sum of independent variance estimates
    ``(variance, df)``: (Σ v)² / Σ v²/df; ``inf`` when the sum is 0."""
    total = sum(v for v, _ in parts)
    denominator = sum(v * v / df for v, df in parts if df > 0 and v > 0)
    return total * total / denominator if denominator > 0 else math.inf


def t_quantile(level: float, df: float) -> float:
    """The two-sided ``level`` quantile of Student's t with ``df`` degrees of freedom
    (the normal's for ``df`` = inf)."""
    upper = 1 - (1 - level) / 2
    return float(stats.norm.ppf(upper)) if math.isinf(df) else float(stats.t.ppf(upper, df))


def components(table: np.ndarray) -> Components:
    """The variance components of a seed × prompt table (n × N; a 1-D array: one value per
    run, no prompts)."""
    table = np.asarray(table, dtype=np.float64)
    if table.ndim == 1:
        n = len(table)
        return Components(runs=n, prompts=0, run_var=float(table.var(ddof=1)) if n > 1 else 0.0, residual=0.0)
    n, n_prompts = table.shape
    if n < 2:
        return Components(runs=n, prompts=n_prompts, run_var=0.0, residual=0.0)
    residuals = table - table.mean(1, keepdims=True) - table.mean(0, keepdims=True) + table.mean()
    dof = (n - 1) * (n_prompts - 1)
    return Components(runs=n, prompts=n_prompts, run_var=float(table.mean(1).var(ddof=1)),
                      residual=float((residuals ** 2).sum() / dof) if dof else 0.0)


def paired_contrast(tables: list[np.ndarray], weights: list[float]) -> Contrast:
    """The contrast Σ w_g · mean(Y_g) of seed × prompt tables evaluated on the same prompts
    in the same order (columns aligned)."""
    tables = [np.asarray(t, dtype=np.float64) for t in tables]
    n_prompts = tables[0].shape[1]
    if any(t.ndim != 2 or t.shape[1] != n_prompts or t.shape[0] < 1 for t in tables):
        raise ValueError("paired tables need one row per run and the same prompts (columns)")
    comps = [components(t) for t in tables]
    per_prompt = sum(w * t.mean(0) for w, t in zip(weights, tables))
    spread = float(per_prompt.var(ddof=1)) if n_prompts > 1 else 0.0
    # the per-prompt contrast carries each group's residual noise once more: take it out
    residual = sum(w * w * c.residual / c.runs for w, c in zip(weights, comps) if c.runs >= 2)
    value = float(sum(w * t.mean() for w, t in zip(weights, tables)))
    return Contrast(value=value, groups=list(zip(weights, comps)), interaction=max(spread - residual, 0.0),
                    prompts=n_prompts)


def unpaired_contrast(tables: list[np.ndarray], weights: list[float]) -> Contrast:
    """The contrast of groups evaluated on different prompt sets: each group's prompt part
    is its own (nothing cancels), and the parts add."""
    singles = [paired_contrast([t], [1.0]) for t in tables]
    return Contrast(value=float(sum(w * s.value for w, s in zip(weights, singles))),
                    groups=[(w, s.groups[0][1]) for w, s in zip(weights, singles)], interaction=0.0, prompts=0,
                    unpaired=[(w * w * s.interaction / s.prompts, s.prompts) for w, s in zip(weights, singles)])


def seed_contrast(values: list[np.ndarray], weights: list[float]) -> Contrast:
    """The contrast of group means of one value per run (no per-prompt values): Welch's
    interval when every group has two runs or more."""
    values = [np.asarray(v, dtype=np.float64) for v in values]
    return Contrast(value=float(sum(w * v.mean() for w, v in zip(weights, values))),
                    groups=[(w, components(v)) for w, v in zip(weights, values)], interaction=0.0, prompts=0)


def seeds_needed(contrast: Contrast, effect: float, level: float = LEVEL, power: float = POWER,
                 prompts: int | None = None) -> int | None:
    """The fewest seeds per group with which a difference of size ``effect`` is resolved
    (its ``level`` interval excludes 0) with probability ``power``: the smallest n with
    (t_{level, df(n)} + t_{power, df(n)}) · SE(n) ≤ |effect|, the variance components
    measured and projected to n seeds per group (and ``prompts`` held-out prompts).

    :returns: ``None`` when no number of seeds up to :data:`MAX_SEEDS` does (the held-out
        prompts' share alone is too large: more prompts are needed), or when a group has
        fewer than 2 runs (no seed variance to plan from).
    """
    if any(c.runs < 2 for _, c in contrast.groups) or effect == 0:
        return None
    # more seeds: less variance and more degrees of freedom, so it resolves from some n on
    return _smallest(lambda n: _resolves(contrast, effect, n, prompts, level, power), MAX_SEEDS)


def prompts_needed(contrast: Contrast, effect: float, runs: int, level: float = LEVEL, power: float = POWER,
                   limit: int = 1_000_000) -> int | None:
    """The fewest held-out prompts with which ``runs`` seeds per group resolve ``effect``
    (as :func:`seeds_needed`, over N instead of n); ``None`` when even ``limit`` prompts
    do not, or there are no per-prompt values."""
    if not (contrast.prompts or contrast.unpaired) or any(c.runs < 2 for _, c in contrast.groups):
        return None
    return _smallest(lambda n: _resolves(contrast, effect, runs, n, level, power), limit)  # variance falls with N


def _smallest(resolves: Callable[[int], bool], limit: int) -> int | None:
    """The smallest n in [2, ``limit``] for which ``resolves(n)`` holds (it holds from some n
    on), by bisection; ``None`` when it does not hold at ``limit``."""
    if not resolves(limit):
        return None
    low, high = 2, limit
    while low < high:
        middle = (low + high) // 2
        if resolves(middle):
            high = middle
        else:
            low = middle + 1
    return low


def _resolves(contrast: Contrast, effect: float, runs: int, prompts: int | None, level: float, power: float) -> bool:
    """Whether ``runs`` seeds per group and ``prompts`` prompts give ``power`` to resolve ``effect``:
    (t_{level, df} + t_{power, df}) · SE ≤ |effect| (the normal approximation of a t test's power)."""
    parts = contrast.variance_parts(runs=runs, prompts=prompts)
    df = satterthwaite([(v, d) for _, v, d in parts])
    beta = float(stats.norm.ppf(power)) if math.isinf(df) else float(stats.t.ppf(power, df))
    return (t_quantile(level, df) + beta) * math.sqrt(sum(v for _, v, _ in parts)) <= abs(effect)
