"""A comparison of groups of runs: every group's metrics with 95 % intervals, each group's
difference to a baseline (paired by held-out prompt where the runs share their evaluation
set), its probability of improvement, a verdict and the seeds it would take.

Which interval each number gets (:mod:`rlzoo.analysis.intervals`):

- a metric recorded per held-out prompt (``eval/...``), at the last evaluation or as the
  area under the held-out curve: the analytic seeds × prompts interval (exact variance of
  a mean; Student's t);
- its best-so-far value (the highest over a run's evaluations, not a mean over prompts):
  the seeds' variance plus the variance over bootstrap resamples of the prompts (the same
  resamples for every run, so pairing holds);
- a value per run (training reward, steps to a threshold), or an ``eval/...`` metric of
  runs written before per-prompt records existed: Welch's interval over seeds;
- the interquartile mean (groups of 4 runs or more) and P(improvement): rliable's
  stratified percentile bootstrap over runs (:mod:`rlzoo.analysis.aggregates`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlzoo.analysis.aggregates import (
    RESAMPLES,
    SEED,
    improvement_last_axis,
    iqm,
    iqm_last_axis,
    probability_of_improvement,
    stratified_bootstrap,
)
from rlzoo.analysis.intervals import (
    LEVEL,
    Contrast,
    Interval,
    components,
    paired_contrast,
    prompts_needed,
    seed_contrast,
    seeds_needed,
    unpaired_contrast,
)
from rlzoo.analysis.measures import SHARES, Metric, prompt_values, run_value, table_metrics, verdict_metrics
from rlzoo.analysis.runs import Group
from rlzoo.core.errors import ConfigError
from rlzoo.run.eval_records import eval_metric_tags

IQM_RUNS = 4
"""Groups with at least this many runs get an interquartile mean."""

# ----------------------------------------------------------------------------- group statistics


@dataclass
class Estimate:
    """A group's metric: its interval (``None``: no value), the runs it comes from, and the
    per-run values (for P(improvement) and the IQM)."""

    interval: Interval | None
    runs: int
    values: np.ndarray
    reached: int | None = None
    """``steps to T``: the runs that reached the threshold (the interval is over those)."""


def _prompt_tables(group: Group, metric: Metric) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """The group's prompt ids and per-run prompt values, when every run has them on the same
    held-out set."""
    values = [prompt_values(run, metric) for run in group.runs]
    if any(v is None for v in values) or any(not np.array_equal(v[0], values[0][0]) for v in values):
        return None
    return values[0][0], [v[1] for v in values]


def _best(matrix: np.ndarray, columns: np.ndarray | slice = slice(None)) -> np.ndarray:
    """Best so far of a run's (evaluations × N) values on prompt ``columns``: over a batch of
    resampled index rows (B × N) it returns B values."""
    return matrix[:, columns].mean(-1).max(0)


def _resampled_contrast(tables: list[list[np.ndarray]], weights: list[float], paired: bool,
                        seed: int) -> Contrast:
    """Best-so-far: the seeds' variance of the per-run values plus the variance of the
    contrast over bootstrap resamples of the prompts (shared by every run when ``paired``)."""
    rng = np.random.default_rng(seed)
    run_values = [np.array([float(_best(m)) for m in runs]) for runs in tables]
    value = float(sum(w * v.mean() for w, v in zip(weights, run_values)))
    comps = [components(v) for v in run_values]
    n_prompts = tables[0][0].shape[1]

    def resampled(runs: list[np.ndarray], index: np.ndarray) -> np.ndarray:
        return np.mean([_best(m, index) for m in runs], axis=0)

    if paired:
        index = rng.integers(0, n_prompts, (RESAMPLES, n_prompts))
        spread = float(np.var(sum(w * resampled(runs, index) for w, runs in zip(weights, tables)), ddof=1))
        unpaired = [(spread, n_prompts)]
    else:
        unpaired = []
        for w, runs in zip(weights, tables):
            size = runs[0].shape[1]
            index = rng.integers(0, size, (RESAMPLES, size))
            unpaired.append((w * w * float(np.var(resampled(runs, index), ddof=1)), size))
    return Contrast(value=value, groups=list(zip(weights, comps)), interaction=0.0, prompts=0, unpaired=unpaired)


def contrast_of(groups: list[Group], weights: list[float], metric: Metric, paired: bool = True,
                seed: int = SEED) -> Contrast | None:
    """The contrast Σ w·mean of ``metric`` over ``groups`` with the best interval the runs
    allow (module docstring); ``None`` when a group has no value (or, for steps to T, when a
    difference involves runs that never reached the threshold)."""
    tables = [_prompt_tables(group, metric) if metric.per_prompt else None for group in groups]
    if all(t is not None for t in tables):
        same = paired and all(np.array_equal(t[0], tables[0][0]) for t in tables)
        if metric.summary == "best":
            return _resampled_contrast([t[1] for t in tables], weights, same, seed)
        stacked = [np.stack(t[1]) for t in tables]
        return paired_contrast(stacked, weights) if same else unpaired_contrast(stacked, weights)
    values = [[run_value(run, metric) for run in group.runs] for group in groups]
    if metric.summary == "steps" and len(groups) > 1 and any(v is None for vs in values for v in vs):
        return None
    values = [[v for v in vs if v is not None] for vs in values]
    if any(not vs for vs in values):
        return None
    return seed_contrast([np.array(vs) for vs in values], weights)


def estimate(group: Group, metric: Metric, level: float = LEVEL) -> Estimate:
    """One group's ``metric``: the mean with its interval at ``level``."""
    values = np.array([v for v in (run_value(run, metric) for run in group.runs) if v is not None])
    contrast = contrast_of([group], [1.0], metric)
    interval = contrast.interval(level) if contrast is not None else None
    if interval is not None and metric.share:
        interval = interval.within(0.0, 1.0)
    return Estimate(interval=interval, runs=len(group.runs),
                    values=values, reached=len(values) if metric.summary == "steps" else None)


# ----------------------------------------------------------------------------- differences


@dataclass
class Difference:
    """``group`` − ``baseline`` in one metric."""

    group: Group
    baseline: Group
    metric: Metric
    interval: Interval | None
    paired: bool
    improvement: tuple[float, float, float] | None
    """P(improvement) of the group over the baseline with its bootstrap interval."""
    seeds_observed: int | None
    """Seeds per group that resolve a true difference of the observed size (80 % power)."""
    prompts_observed: int | None
    """Without enough seeds for it: held-out prompts that would, with the seeds there are."""
    seeds_min_effect: int | None
    prompts_min_effect: int | None
    verdict: str
    familywise: Interval | None = None
    """With several groups against the baseline, the primary metric's final difference at the family-wise level
    (:attr:`Comparison.family_level`); ``None`` otherwise."""

    @property
    def resolved(self) -> bool:
        return self.interval is not None and self.interval.excludes_zero


def _improvement(x: np.ndarray, y: np.ndarray, metric: Metric, level: float) -> tuple[float, float, float] | None:
    if not len(x) or not len(y):
        return None
    sign = 1.0 if metric.higher_is_better else -1.0
    point = probability_of_improvement(sign * x, sign * y)
    low, high, _ = stratified_bootstrap([sign * x, sign * y], improvement_last_axis, level, vectorized=True)
    return point, low, high


def difference(group: Group, baseline: Group, metric: Metric, level: float = LEVEL, min_effect: float | None = None,
               paired: bool = True, family_level: float | None = None) -> Difference:
    """``group`` − ``baseline`` in ``metric``, with its verdict (see :func:`verdict`) and, given
    ``family_level``, its interval at that level too (:attr:`Difference.familywise`)."""
    contrast = contrast_of([group, baseline], [1.0, -1.0], metric, paired)
    interval = contrast.interval(level) if contrast is not None else None
    familywise = contrast.interval(family_level) if contrast is not None and family_level else None
    if interval is not None and metric.share:
        interval = interval.within(-1.0, 1.0)
        familywise = familywise.within(-1.0, 1.0) if familywise is not None else None
    x, y = (np.array([v for v in (run_value(r, metric) for r in g.runs) if v is not None]) for g in (group, baseline))
    observed = observed_prompts = None
    plannable = metric.summary != "best"  # a maximum over evaluations: no variance model to project
    if plannable and contrast is not None and interval is not None and not interval.excludes_zero \
            and interval.value != 0:
        observed = seeds_needed(contrast, interval.value, level)
        if observed is None and all(c.runs >= 2 for _, c in contrast.groups):
            observed_prompts = prompts_needed(contrast, interval.value, min(c.runs for _, c in contrast.groups), level)
    wanted = seeds_needed(contrast, min_effect, level) if plannable and contrast is not None and min_effect else None
    prompts = None
    if plannable and contrast is not None and min_effect and wanted is None:
        prompts = prompts_needed(contrast, min_effect, max(2, min(c.runs for _, c in contrast.groups)), level)
    by_prompt = paired and interval is not None and metric.per_prompt and interval.method != "seeds only"
    diff = Difference(group=group, baseline=baseline, metric=metric, interval=interval, paired=by_prompt,
                      improvement=_improvement(x, y, metric, level), seeds_observed=observed,
                      prompts_observed=observed_prompts,
                      seeds_min_effect=wanted, prompts_min_effect=prompts, verdict="", familywise=familywise)
    diff.verdict = verdict(diff, contrast, min_effect)
    return diff


def verdict(diff: Difference, contrast: Contrast | None, min_effect: float | None) -> str:
    """The difference in words: ``better`` / ``worse`` when its interval excludes 0, else
    ``not resolved`` and how many seeds per group a difference of this size would need."""
    if diff.interval is None:
        if diff.metric.summary == "steps":
            return "not computed: some runs never reached the threshold"
        return "not computed: a group has no value"
    single = [g.label for g, (_, c) in zip((diff.group, diff.baseline), contrast.groups) if c.runs < 2]
    caveat = f" (one run of {', '.join(single)}: seed noise not counted)" if single else ""
    if diff.resolved:
        up = diff.interval.value > 0
        words = "better" if up == diff.metric.higher_is_better else "worse"
        text = f"{words}{caveat}"
    elif single:
        text = f"not resolved{caveat}; a second seed per group is the least that lets seeds be planned"
    elif diff.interval.value == 0:
        text = "not resolved: no difference at all"
    elif diff.metric.summary == "best":
        text = "not resolved (seeds are planned on the final value and the AUC)"
    elif diff.seeds_observed is None and diff.prompts_observed is not None:
        runs = min(c.runs for _, c in contrast.groups)
        text = (f"not resolved; no number of seeds resolves a difference this size on this held-out set, about "
                f"{diff.prompts_observed} held-out prompts (eval.size) with {runs} seeds per group would")
    elif diff.seeds_observed is None:
        text = "not resolved; a difference this size is out of reach of 1000 seeds per group"
    else:
        text = f"not resolved; about {diff.seeds_observed} seeds per group would resolve a difference this size"
    if min_effect and not single and diff.metric.summary != "best":
        if diff.seeds_min_effect is not None:
            text += f"; {diff.seeds_min_effect} seeds per group resolve a difference of {min_effect:g}"
        elif diff.prompts_min_effect is not None:
            text += (f"; no number of seeds resolves {min_effect:g} with this held-out set: about "
                     f"{diff.prompts_min_effect} held-out prompts would (eval.size)")
        else:
            text += f"; a difference of {min_effect:g} is out of reach of 1000 seeds"
    return text


# ----------------------------------------------------------------------------- the comparison


@dataclass
class Comparison:
    """Everything ``rlzoo compare`` reports about groups of runs."""

    groups: list[Group]
    estimates: dict[str, list[Estimate]]
    """Per metric name, one :class:`Estimate` per group (in ``groups`` order)."""
    metrics: list[Metric]
    baseline: Group
    primary: str
    level: float
    differences: list[Difference]
    iqms: list[tuple[float, float, float] | None]
    """Per group: the IQM of the runs' final greedy accuracy (the training reward without
    evaluation) with its bootstrap interval."""
    notes: list[str] = field(default_factory=list)
    family_level: float | None = None
    """With k ≥ 3 groups, the level of each of the k − 1 primary-metric final differences that makes them hold
    together at :attr:`level` (Bonferroni: 1 − (1 − level) / (k − 1)); ``None`` with two groups."""


def parse_baseline(groups: list[Group], items: list[str]) -> Group:
    """The group every ``KEY=VALUE`` of ``items`` names.

    :raises ConfigError: an item that is not KEY=VALUE, or one group is not matched (the
        groups listed).
    """
    wanted = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--baseline {item!r} is not KEY=VALUE (e.g. --baseline algo=grpo)")
        wanted.append(tuple(part.strip() for part in item.split("=", 1)))
    matched = [g for g in groups if all(str(g.values.get(k)) == v for k, v in wanted)]
    if len(matched) != 1:
        which = "names no group" if not matched else f"names {len(matched)} groups"
        raise ConfigError(f"--baseline {' '.join(items)} {which}; the groups are: "
                          + "; ".join(g.label for g in groups))
    return matched[0]


def check_options(metric: str, min_effect: float | None) -> None:
    """:raises ConfigError: a ``--metric`` that is not recorded per prompt (nor
    ``reward/mean``), or a ``--min-effect`` ≤ 0, or ≥ 1 for a share (an accuracy)."""
    known = [*eval_metric_tags(2, episodes=True), "reward/mean"]
    if metric not in known and not re.fullmatch(r"eval/pass@[1-9][0-9]*", metric):
        raise ConfigError(f"--metric {metric!r} is not a metric rlzoo records per held-out prompt; choose one of "
                          f"{', '.join(known).replace('pass@2', 'pass@N')}")
    if min_effect is None:
        return
    if min_effect <= 0 or (min_effect >= 1 and metric.startswith(SHARES)) or not math.isfinite(min_effect):
        bound = " and < 1 for a share such as an accuracy" if metric.startswith(SHARES) else ""
        raise ConfigError(f"--min-effect must be > 0{bound} ({metric}), got {min_effect:g}")


def _pairing_notes(groups: list[Group], baseline: Group, metric: Metric) -> tuple[dict[int, bool], list[str]]:
    """Whether each group pairs with the baseline by prompt, and the notes to print once."""
    notes, pairs = [], {}
    sets = {id(g): _prompt_tables(g, metric) for g in groups}
    base = sets[id(baseline)]
    without = [str(r.run_dir) for g in groups for r in g.runs if not any(metric.tag in rec.tags()
                                                                          for rec in r.records.values())]
    if without and metric.per_prompt:
        notes.append(f"{len(without)} run(s) have no per-prompt records of {metric.tag} (written before rlzoo kept "
                     f"them, or without evaluation): their groups' intervals count seeds only, not the held-out "
                     f"set: {', '.join(without)}")
    for group in groups:
        own = sets[id(group)]
        pairs[id(group)] = own is not None and base is not None and np.array_equal(own[0], base[0])
        if group is not baseline and own is not None and base is not None and not pairs[id(group)]:
            notes.append(f"held-out sets differ (prompt ids): pairing refused for {group.label} "
                         f"({', '.join(r.run_dir.name for r in group.runs)}) against {baseline.label}; "
                         "unpaired intervals given")
    mixed = [g.label for g in groups if sets[id(g)] is None and all(
        any(metric.tag in rec.tags() for rec in r.records.values()) for r in g.runs)]
    if mixed and metric.per_prompt:
        notes.append(f"the runs of {', '.join(mixed)} evaluated different prompt sets: seeds-only intervals")
    return pairs, notes


def compare_groups(groups: list[Group], primary: str = "eval/greedy_accuracy", baseline: list[str] | None = None,
                   level: float = LEVEL, min_effect: float | None = None) -> Comparison:
    """Every group's estimates and each group's difference to the baseline (``baseline``:
    KEY=VALUE items naming one group; default: the group with the best final ``primary``).

    :raises ConfigError: a baseline that names no group or several, or a bad ``min_effect``.
    """
    check_options(primary, min_effect)
    metrics = table_metrics(primary)
    if not any(primary in r.eval_curves or r.records for g in groups for r in g.runs):
        primary = "reward/mean"  # nothing evaluated: the training reward decides
    estimates = {m.name: [estimate(g, m, level) for g in groups] for m in metrics}
    first = Metric(primary, primary, "final")
    base = parse_baseline(groups, baseline) if baseline else _best_group(groups, first)
    pairs, notes = _pairing_notes(groups, base, first)
    stopped = [f"{r.run_dir.name} {r.stopped}" for g in groups for r in g.runs if r.stopped]
    if stopped:
        notes.append(f"{len(stopped)} run(s) did not finish ({'; '.join(stopped)}): their values are those of their "
                     "last logged step and evaluation, not of the end of training")
    singles = [g.label for g in groups if len(g.runs) == 1]
    if singles:
        notes.append(f"one run in {', '.join(singles)}: its interval covers the held-out prompts only, not seeds")
    family = 1 - (1 - level) / (len(groups) - 1) if len(groups) >= 3 else None
    differences = [difference(g, base, m, level, min_effect if m.tag == primary else None, pairs.get(id(g), False),
                              family if m.tag == primary and m.summary == "final" else None)
                   for g in groups if g is not base for m in verdict_metrics(primary)]
    accuracy = first if primary == "reward/mean" else metrics[0]  # the table's IQM column: eval acc
    final = [estimate(g, accuracy, level) for g in groups]
    iqms = [_iqm(e.values, level) if len(e.values) >= IQM_RUNS else None for e in final]
    return Comparison(groups=groups, estimates=estimates, metrics=metrics, baseline=base, primary=primary,
                      level=level, differences=differences, iqms=iqms, notes=notes, family_level=family)


def _iqm(values: np.ndarray, level: float) -> tuple[float, float, float]:
    low, high, _ = stratified_bootstrap([values], iqm_last_axis, level, vectorized=True)
    return iqm(values), low, high


def _best_group(groups: list[Group], metric: Metric) -> Group:
    """The group with the highest mean ``metric`` (ties: the first)."""
    means = [np.mean(v) if len(v := [x for x in (run_value(r, metric) for r in g.runs) if x is not None]) else -np.inf
             for g in groups]
    return groups[int(np.argmax(means))]


def as_dict(comparison: Comparison) -> dict[str, Any]:
    """Every number of the comparison, for ``--json``."""
    def estimate_dict(e: Estimate) -> dict[str, Any]:
        return {"interval": e.interval.as_dict() if e.interval else None, "runs": e.runs,
                "run_values": e.values.tolist(), **({"reached": e.reached} if e.reached is not None else {})}

    return {
        "level": comparison.level, "family_level": comparison.family_level, "primary": comparison.primary,
        "baseline": comparison.baseline.label, "notes": comparison.notes,
        "groups": [{"label": g.label, "values": g.values, "runs": [str(r.run_dir) for r in g.runs],
                    "metrics": {m: estimate_dict(es[i]) for m, es in comparison.estimates.items()},
                    "iqm": dict(zip(("value", "low", "high"), comparison.iqms[i])) if comparison.iqms[i] else None}
                   for i, g in enumerate(comparison.groups)],
        "differences": [{"group": d.group.label, "baseline": d.baseline.label, "metric": d.metric.name,
                         "tag": d.metric.tag, "summary": d.metric.summary,
                         "interval": d.interval.as_dict() if d.interval else None, "paired": d.paired,
                         "prompts_observed": d.prompts_observed,
                         "p_improvement": dict(zip(("value", "low", "high"), d.improvement)) if d.improvement
                         else None, "seeds_observed": d.seeds_observed, "seeds_min_effect": d.seeds_min_effect,
                         "prompts_min_effect": d.prompts_min_effect, "resolved": d.resolved, "verdict": d.verdict,
                         "familywise_interval": d.familywise.as_dict() if d.familywise else None}
                        for d in comparison.differences],
    }
