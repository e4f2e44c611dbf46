"""The comparison's pictures: curves with 95 % bands over seeds (the baseline drawn thickest),
a forest plot of the differences to the baseline, and final numbers against a numeric key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlzoo.analysis.comparison import Comparison, contrast_of, estimate
from rlzoo.analysis.measures import Metric
from rlzoo.analysis.intervals import LEVEL, t_quantile
from rlzoo.analysis.runs import Group, RunSummary
from rlzoo.core.errors import RlzooError
from rlzoo.run.eval_records import EvalRecord

MAX_INSET_LEGEND = 8
"""More groups than this: the curve figure's legend goes below the panels, in columns."""


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend.

    :raises RlzooError: matplotlib cannot be imported (naming the install command).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RlzooError("rlzoo compare draws with matplotlib, which is not importable here "
                         f"({exc}); install it: pip install matplotlib") from exc
    return plt


def seed_band(curves: list[np.ndarray], level: float = LEVEL) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and ``level`` t-interval over seeds of aligned curves (cut to the shortest):
    ``(mean, low, high)``; the band is the mean itself for one curve."""
    length = min(len(c) for c in curves)
    stacked = np.stack([c[:length] for c in curves])
    mean = stacked.mean(0)
    if len(curves) < 2:
        return mean, mean, mean
    half = t_quantile(level, len(curves) - 1) * stacked.std(0, ddof=1) / np.sqrt(len(curves))
    return mean, mean - half, mean + half


def eval_band(group: Group, tag: str, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                      np.ndarray] | None:
    """``(steps, mean, low, high)`` of the held-out curve ``tag``: at each step every run
    evaluated at, the seeds × prompts interval of the group (seeds only without records)."""
    runs = [r for r in group.runs if tag in r.eval_curves]
    if not runs:
        return None
    steps = sorted(set.intersection(*(set(r.eval_curves[tag][0].tolist()) for r in runs)))
    rows = []
    for step in steps:
        at = Group(label=group.label, runs=[_at_step(r, tag, step) for r in runs], values=group.values)
        interval = estimate(at, Metric(tag, tag, "final"), level).interval
        rows.append((interval.value, interval.low, interval.high))
    mean, low, high = (np.array(column) for column in zip(*rows))
    return np.array(steps), mean, low, high


def _at_step(run: RunSummary, tag: str, step: float) -> RunSummary:
    """``run`` cut at ``step``: its evaluation curve and records up to it (its last is ``step``'s)."""
    steps, values = run.eval_curves[tag]
    keep = steps <= step
    records: dict[int, EvalRecord] = {s: r for s, r in run.records.items() if s <= step}
    return RunSummary(run_dir=run.run_dir, hparams=run.hparams, steps=run.steps, smoothed=run.smoothed,
                      reward_final=run.reward_final, reward_best=run.reward_best, steps_to_threshold=None,
                      train_s=run.train_s, eval_s=run.eval_s, tokens_per_s=run.tokens_per_s,
                      eval_curves={tag: (steps[keep], values[keep])}, records=records)


def _draw(ax: Any, steps: np.ndarray, mean: np.ndarray, low: np.ndarray, high: np.ndarray, label: str,
          baseline: bool, **style: Any) -> None:
    line, = ax.plot(steps, mean, label=label, linewidth=3.2 if baseline else 1.6, zorder=3 if baseline else 2,
                    **style)
    ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.25 if baseline else 0.15)


def plot(comparison: Comparison, out: Path, window: int, title: str) -> Path:
    """Smoothed training reward per group (left) and, when the runs evaluated, held-out
    greedy accuracy (right): mean over seeds with its 95% band (the baseline thickest)."""
    plt = pyplot()
    groups = comparison.groups
    with_eval = any("eval/greedy_accuracy" in r.eval_curves for g in groups for r in g.runs)
    fig, axes = plt.subplots(1, 2 if with_eval else 1, figsize=(13 if with_eval else 8, 4.5), dpi=110,
                             squeeze=False)
    reward_ax = axes[0][0]
    for group in groups:
        baseline = group is comparison.baseline
        label = f"{group.label} (n={len(group.runs)})" + (", baseline" if baseline else "")
        length = min(len(r.smoothed) for r in group.runs)
        mean, low, high = seed_band([r.smoothed for r in group.runs], comparison.level)
        _draw(reward_ax, group.runs[0].steps[:length], mean, low, high, label, baseline)
        band = eval_band(group, "eval/greedy_accuracy", comparison.level) if with_eval else None
        if band is not None:
            _draw(axes[0][1], *band, label, baseline, marker="o", markersize=3)
    reward_ax.set_ylabel(f"reward/mean, mean over {window} steps")
    reward_ax.set_title(f"training reward ({comparison.level:.0%} band over seeds)")
    if with_eval:
        axes[0][1].set_ylabel("eval/greedy_accuracy")
        axes[0][1].set_title(f"held-out greedy accuracy ({comparison.level:.0%} band: seeds × prompts)")
    for ax in axes[0]:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(groups) <= MAX_INSET_LEGEND:
            ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(title)
    if len(groups) > MAX_INSET_LEGEND:   # one legend below both panels, in columns
        columns = 3 if len(groups) > 2 * MAX_INSET_LEGEND else 2
        rows = -(-len(groups) // columns)
        fig.set_figheight(4.5 + 0.22 * rows)
        fig.legend(*reward_ax.get_legend_handles_labels(), loc="lower center", ncol=columns, fontsize=7)
        fig.tight_layout(rect=(0, 0.22 * rows / (4.5 + 0.22 * rows) + 0.02, 1, 1))
    else:
        fig.tight_layout()
    return _save(plt, fig, out)


def forest(comparison: Comparison, out: Path, min_effect: float | None = None) -> Path | None:
    """The differences to the baseline with their intervals, one panel per metric with a
    verdict (a filled marker: resolved); ``None`` when there is one group only."""
    metrics = list(dict.fromkeys(d.metric.name for d in comparison.differences))
    if not metrics:
        return None
    plt = pyplot()
    others = [g for g in comparison.groups if g is not comparison.baseline]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 1.2 + 0.45 * len(others)), dpi=110,
                             squeeze=False)
    for ax, name in zip(axes[0], metrics):
        rows = [d for d in comparison.differences if d.metric.name == name]
        for y, diff in enumerate(rows):
            if diff.interval is None:
                continue
            iv = diff.interval
            ax.errorbar([iv.value], [y], xerr=[[iv.value - iv.low], [iv.high - iv.value]], fmt="o", capsize=3,
                        color="tab:blue" if diff.resolved else "tab:gray",
                        markerfacecolor="tab:blue" if diff.resolved else "white")
            if diff.familywise is not None:    # the Bonferroni interval, thin, just below
                fw = diff.familywise
                ax.errorbar([fw.value], [y + 0.22], xerr=[[fw.value - fw.low], [fw.high - fw.value]], fmt="none",
                            capsize=2, linewidth=0.8, color="tab:orange" if fw.excludes_zero else "tab:gray")
        if all(d.interval is None for d in rows):
            ax.text(0.5, 0.5, "not computed", transform=ax.transAxes, ha="center", va="center", color="tab:gray")
        ax.axvline(0, color="black", linewidth=1)
        if min_effect and rows and rows[0].metric.tag == comparison.primary:
            for edge in (-min_effect, min_effect):
                ax.axvline(edge, color="tab:red", linewidth=0.8, linestyle="--")
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([d.group.label for d in rows] if ax is axes[0][0] else [""] * len(rows), fontsize=8)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.invert_yaxis()
        ax.set_title(f"{name}: − {comparison.baseline.label}", fontsize=9)
        ax.grid(alpha=0.3, axis="x")
        ax.xaxis.set_major_locator(plt.MaxNLocator(nbins=5))     # long tick labels (-0.075) must not overlap
    family = (f"; thin below: family-wise, {100 * comparison.family_level:.4g}% (orange: resolved)"
              if comparison.family_level else "")
    fig.suptitle(f"differences to the baseline, {comparison.level:.0%} intervals (filled: resolved){family}",
                 fontsize=10)
    fig.tight_layout()
    return _save(plt, fig, out)


def plot_against(groups: list[Group], key: str, out: Path, title: str, level: float = LEVEL) -> Path:
    """Final smoothed training reward (left) and final held-out greedy accuracy (right)
    against the numeric hyperparameter ``key``, one line per value of the other label keys;
    each point the group's mean with its 95% interval.

    :raises RlzooError: ``key`` does not separate the groups, or a value of it is not a number.
    """
    if not groups or key not in groups[0].values:
        choices = ", ".join(groups[0].values) if groups else "none"
        raise RlzooError(f"--x {key!r} is not a key that separates the groups; they differ in: {choices}")
    series: dict[str, list[tuple[float, Group]]] = {}
    for group in groups:
        try:
            x = float(group.values[key])  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise RlzooError(f"--x {key!r} needs numbers; group {group.label!r} has {group.values[key]!r}") from None
        rest = ", ".join(f"{k}={v}" for k, v in group.values.items() if k != key) or "runs"
        series.setdefault(rest, []).append((x, group))
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), dpi=110)
    panels = [(axes[0], "reward final (smoothed training reward at the last step)",
               Metric("reward final", "reward/mean", "final")),
              (axes[1], "eval/greedy_accuracy at the last evaluation",
               Metric("eval acc", "eval/greedy_accuracy", "final"))]
    for ax, ylabel, metric in panels:
        for rest, points in series.items():
            points.sort(key=lambda p: p[0])
            xs, means, lows, highs = [], [], [], []
            for x, group in points:
                contrast = contrast_of([group], [1.0], metric)
                if contrast is not None:
                    interval = contrast.interval(level)
                    xs.append(x)
                    means.append(interval.value)
                    lows.append(interval.value - interval.low)
                    highs.append(interval.high - interval.value)
            if xs:
                ax.errorbar(xs, means, yerr=[lows, highs], label=rest, marker="o", capsize=3, linewidth=1.5)
        ax.set_xlabel(key)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}: mean and {level:.0%} interval")
    fig.tight_layout()
    return _save(plt, fig, out)


def _save(plt: Any, fig: Any, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
