"""The comparison as text: the Markdown table with its legend (every column defined once, in
:data:`COLUMNS`), the differences to the baseline in words, and the report file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlzoo.analysis.comparison import Comparison, Difference, Estimate
from rlzoo.analysis.intervals import Interval

COLUMNS: list[tuple[str, str]] = [
    ("group", "runs whose hyperparameters (as TensorBoard's HParams shows them) are equal except for "
              "`seed`, `trainer.threads` and `eval.every`; labelled by the keys that differ between groups "
              "(a component by its name, a list of components by their names, a component's parameters only "
              "where they differ for the same component; keys an algorithm preset sets are folded into `algo=`); "
              "the baseline of the differences is marked"),
    ("seeds", "runs in the group. Every cell from `eval acc` to `steps to T` is the group's mean with its 95% "
              "confidence interval `[low, high]` (an accuracy's kept within [0, 1]); for a metric of the held-out "
              "prompts it counts both the seeds and the finite held-out set (Student's t on the seeds × prompts "
              "variance components), for a value per run (the training reward, steps) the seeds (Welch's t). "
              "`(prompts only)`: one run, whose intervals cover the held-out prompts only (no seed noise can be "
              "estimated from one run)"),
    ("eval acc", "`eval/greedy_accuracy` at the last evaluation (after the last step): share of the held-out "
                 "prompts whose greedy completion scores at least `eval.threshold`"),
    ("eval acc best", "the highest `eval/greedy_accuracy` over a run's evaluations (best so far; its interval "
                      "adds the variance over bootstrap resamples of the held-out prompts to the seeds')"),
    ("eval acc AUC", "the area under a run's held-out greedy accuracy curve divided by its span of steps "
                     "(trapezoids over the evaluations): its accuracy averaged over the run"),
    ("eval pass@1", "`eval/pass@1` at the last evaluation: per held-out prompt, the share of its `eval.n` "
                    "sampled completions that are correct, averaged"),
    ("eval strict", "`eval/strict_accuracy` at the last evaluation: share of the held-out prompts whose greedy "
                    "completion is correct with its answer where `answer_format` says (the right answer in the "
                    "requested format)"),
    ("eval lenient", "`eval/lenient_accuracy` at the last evaluation: share of the held-out prompts whose greedy "
                     "completion holds the right answer anywhere (in any registered answer format's spans)"),
    ("IQM eval acc", "the interquartile mean of the runs' `eval acc` (the mean of the middle half; groups of 4 "
                     "runs or more) with rliable's stratified percentile bootstrap interval over runs"),
    ("reward final", "the smoothed training reward at the last step. Smoothed training reward: the mean of "
                     "`reward/mean` over W consecutive logged steps (W = `--window`, or all of a run's steps if "
                     "it has fewer), defined where a full window exists"),
    ("reward best", "the highest smoothed training reward of the run (so never below `reward final`)"),
    ("steps to T", "the first step at which the smoothed training reward reaches T (`--threshold`), averaged "
                   "over the runs that reach it (the interval too); (k/N): how many of the N runs did"),
    ("train s", "seconds of training steps (rollout, scoring and update: the sum of `timing/step_s`; mean "
                "logged step × steps when `logging.log_every` > 1); start-up, evaluation and checkpoints "
                "are not included. This and the next two cells are mean ± standard deviation over the seeds "
                "(a spread, not an interval: times depend on the machine's load)"),
    ("eval s", "seconds spent in evaluation (the sum of `timing/eval_s`)"),
    ("tokens/s", "prompt + response tokens per second of step time (`throughput/tokens_per_s`), mean over "
                 "logged steps"),
    ("doctor", "the number of `rlzoo doctor`'s findings in each run of the group, run by run (a pathology its "
               "detectors see in the run's curves; `rlzoo doctor RUN_DIR` names them, with the evidence and the "
               "overrides to try)"),
]
"""(header, definition) of every column of the table, in order; the definitions are the legend."""

INTERVAL_COLUMNS = ("eval acc", "eval acc best", "eval acc AUC", "eval pass@1", "eval strict", "eval lenient",
                    "reward final", "reward best", "steps to T")
"""The columns that hold a metric's mean and interval (:func:`rlzoo.analysis.comparison.table_metrics` names)."""


def number(value: float, digits: int = 3) -> str:
    """A number as the report writes it (``-0.000`` as ``0.000``; a true minus sign)."""
    text = f"{value:.{digits}f}"
    return (text if text.strip("-0.") else text.lstrip("-")).replace("-", "−")


def percent(level: float) -> str:
    """A confidence level as a percentage: ``95%``, ``98.33%``."""
    return f"{100 * level:.4g}%"


def interval_text(interval: Interval | None, digits: int = 3) -> str:
    """``0.652 [0.581, 0.723]``; the mean alone when it has no interval; ``—`` for no value."""
    if interval is None:
        return "—"
    if interval.method == "one run":
        return number(interval.value, digits)
    return f"{number(interval.value, digits)} [{number(interval.low, digits)}, {number(interval.high, digits)}]"


def _cell(estimate: Estimate, name: str) -> str:
    if name == "steps to T":
        if not estimate.reached:
            return f"not reached (0/{estimate.runs})"
        return f"{interval_text(estimate.interval, 0)} ({estimate.reached}/{estimate.runs})"
    return interval_text(estimate.interval)


def _spread(values: list[float]) -> str:
    """Mean ± standard deviation (n − 1) of seconds-like values, to the unit."""
    if not values:
        return "—"
    arr = np.array(values, dtype=float)
    return f"{arr.mean():.0f}" + (f" ± {arr.std(ddof=1):.0f}" if len(arr) > 1 else "")


def table(comparison: Comparison, threshold: float) -> str:
    """The comparison as a Markdown table (columns: :data:`COLUMNS`)."""
    headers = [h.replace("T", f"{threshold:g}") if h == "steps to T" else h for h, _ in COLUMNS]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for i, group in enumerate(comparison.groups):
        runs = group.runs
        label = group.label + (" (baseline)" if group is comparison.baseline else "")
        seeds = f"{len(runs)}" + (" (prompts only)" if len(runs) == 1 else "")
        cells = [label, seeds]
        for column in INTERVAL_COLUMNS[:6]:
            cells.append(_cell(comparison.estimates[column][i], column))
        iqm = comparison.iqms[i]
        cells.append(f"{number(iqm[0])} [{number(iqm[1])}, {number(iqm[2])}]" if iqm else "—")
        for column in INTERVAL_COLUMNS[6:]:
            cells.append(_cell(comparison.estimates[column][i], column))
        cells += [_spread([r.train_s for r in runs]), _spread([r.eval_s for r in runs]),
                  _spread([r.tokens_per_s for r in runs]), ", ".join(str(len(r.findings)) for r in runs)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def legend(threshold: float, window: int) -> str:
    """The definitions of the table's columns (W and T filled in)."""
    return "\n".join(f"- **{h}**: {text}".replace("W = `--window`", f"W = {window}")
                     .replace("reaches T (`--threshold`)", f"reaches {threshold:g}") for h, text in COLUMNS)


def difference_line(diff: Difference) -> str:
    """``eval acc: algo=rloo − algo=grpo = −0.019, 95% CI [−0.071, 0.033], P(improvement) 0.33
    [0.00, 0.78]: not resolved; about 14 seeds per group would ...``"""
    head = f"{diff.metric.name}: {diff.group.label} − {diff.baseline.label}"
    if diff.interval is None:
        return f"{head}: {diff.verdict}"
    iv = diff.interval
    digits = 0 if diff.metric.summary == "steps" else 3
    text = (f"{head} = {number(iv.value, digits)}, {percent(iv.level)} CI [{number(iv.low, digits)}, "
            f"{number(iv.high, digits)}]")
    if diff.improvement is not None:
        point, low, high = diff.improvement
        text += f", P(improvement) {point:.2f} [{low:.2f}, {high:.2f}]"
    return f"{text}: {diff.verdict}"


def differences(comparison: Comparison) -> str:
    """The differences to the baseline in words, one line each, after a heading that says
    what they are."""
    notes = [f"Note: {note}" for note in comparison.notes]
    if not comparison.differences:
        return "\n".join([f"One group ({comparison.baseline.label}): no differences to report.", *notes])
    paired = any(d.paired for d in comparison.differences)
    how = "paired by held-out prompt" if paired else "unpaired"
    head = (f"Differences to the baseline {comparison.baseline.label} ({how}; {percent(comparison.level)} intervals; "
            "P(improvement): the chance that a run of the group beats a run of the baseline, rliable's "
            "definition, with its bootstrap interval; seeds: for 80% power at this level):")
    lines = [head]
    if comparison.primary in comparison.estimates:     # a --metric the table's columns do not show
        lines.append(f"{comparison.primary} at the last evaluation: " + "; ".join(
            f"{g.label} {interval_text(e.interval)}" for g, e in zip(comparison.groups,
                                                                    comparison.estimates[comparison.primary])))
    return "\n".join([*lines, *(f"- {difference_line(d)}" for d in comparison.differences),
                      *familywise_lines(comparison), *notes])


def familywise_lines(comparison: Comparison) -> list[str]:
    """With k ≥ 3 groups: which of the k − 1 primary-metric verdicts hold together at the comparison's level
    (each interval at the Bonferroni level excludes 0 as well), and which do not; nothing with two groups."""
    family = [d for d in comparison.differences if d.familywise is not None]
    if comparison.family_level is None or not family:
        return []
    head = (f"Family-wise ({len(family)} groups against the baseline in {family[0].metric.name}; Bonferroni: each "
            f"interval at {percent(comparison.family_level)}, so that all {len(family)} hold together at "
            f"{percent(comparison.level)}; the other metrics' lines are not corrected):")
    lines = []
    for diff in family:
        iv, label = diff.familywise, diff.group.label
        interval = f"{percent(iv.level)} CI [{number(iv.low)}, {number(iv.high)}]"
        if iv.excludes_zero:
            words = "better" if (iv.value > 0) == diff.metric.higher_is_better else "worse"
            lines.append(f"  - {label}: {words}, {interval}")
        elif diff.resolved:
            lines.append(f"  - {label}: not resolved family-wise, {interval} (resolved alone at "
                         f"{percent(comparison.level)})")
        else:
            lines.append(f"  - {label}: not resolved, {interval}")
    return [head, *lines]


def write_report(out: Path, comparison: Comparison, text: str, figures: list[str], runs: list[Path]) -> Path:
    """``compare.md``: the table and legend, the differences, the figures and the runs."""
    report = out / "compare.md"
    pictures = "\n\n".join(figures)
    listing = "\n".join(f"- `{r}`" for r in runs)
    report.write_text(f"# Comparison\n\n{text}\n\n{differences(comparison)}\n\n{pictures}\n\nRuns:\n{listing}\n")
    return report
