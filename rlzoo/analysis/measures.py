"""What is compared: each metric of a run (a tag and how it is summarised) and its value,
per run or per held-out prompt (from the run's evaluation records)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlzoo.analysis.runs import RunSummary
from rlzoo.run.eval_records import per_prompt

SHARES = ("eval/greedy_accuracy", "eval/strict_accuracy", "eval/lenient_accuracy", "eval/pass@")
"""Tags (prefixes) whose values are shares in [0, 1], where ``--min-effect`` is a share too."""


@dataclass(frozen=True)
class Metric:
    """One compared number: ``tag`` summarised as ``final`` (at the last evaluation, or the
    smoothed reward at the last step), ``best`` (best so far), ``auc`` (area under the
    held-out curve over its span) or ``steps`` (steps to the reward threshold)."""

    name: str
    tag: str
    summary: str

    @property
    def per_prompt(self) -> bool:
        return self.tag.startswith("eval/")

    @property
    def higher_is_better(self) -> bool:
        return self.summary != "steps"

    @property
    def share(self) -> bool:
        return self.tag.startswith(SHARES)


def _summaries(tag: str, short: str) -> list[Metric]:
    return [Metric(short, tag, "final"), Metric(f"{short} best", tag, "best"), Metric(f"{short} AUC", tag, "auc")]


REWARD = [Metric("reward final", "reward/mean", "final"), Metric("reward best", "reward/mean", "best"),
          Metric("steps to T", "reward/mean", "steps")]


def table_metrics(primary: str = "eval/greedy_accuracy") -> list[Metric]:
    """The metrics of the table (the greedy accuracy at the end, its best, its AUC, the
    other accuracies, the training reward and the steps), then the ``primary`` tag's final,
    best and AUC when it is another one."""
    metrics = [*_summaries("eval/greedy_accuracy", "eval acc"), Metric("eval pass@1", "eval/pass@1", "final"),
               Metric("eval strict", "eval/strict_accuracy", "final"),
               Metric("eval lenient", "eval/lenient_accuracy", "final"), *REWARD]
    return metrics if primary in ("eval/greedy_accuracy", "reward/mean") else metrics + _summaries(primary, primary)


def verdict_metrics(primary: str) -> list[Metric]:
    """The metrics whose differences get a verdict line: the primary metric at the end, at
    its best and over the run (AUC), and the steps to the reward threshold (without
    evaluation: the training reward at the end and at its best, and the steps)."""
    if primary == "reward/mean":
        return REWARD
    return [*_summaries(primary, "eval acc" if primary == "eval/greedy_accuracy" else primary), REWARD[-1]]


# ----------------------------------------------------------------------------- per-run values


def area_under(steps: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The area under ``values`` (K × ...) over ``steps`` (K) divided by the span (trapezoids):
    the value averaged over the run; the value itself for one evaluation."""
    if len(steps) == 1:
        return values[0]
    widths = np.diff(steps)
    areas = (widths[:, None] * (values[1:] + values[:-1]) / 2).sum(0) if values.ndim > 1 else \
        (widths * (values[1:] + values[:-1]) / 2).sum()
    return areas / (steps[-1] - steps[0])


def run_value(run: RunSummary, metric: Metric) -> float | None:
    """The run's value of ``metric`` (from its per-prompt records when it has them)."""
    if metric.tag == "reward/mean":
        return {"final": run.reward_final, "best": run.reward_best, "steps": run.steps_to_threshold}[metric.summary]
    prompts = prompt_values(run, metric)
    if prompts is not None:
        _, values = prompts
        return float(values.mean(1).max()) if metric.summary == "best" else float(values.mean())
    curve = run.eval_curves.get(metric.tag)
    if curve is None or not len(curve[1]):
        return None
    steps, values = curve
    return float({"final": values[-1], "best": values.max(), "auc": area_under(steps, values)}[metric.summary])


def prompt_values(run: RunSummary, metric: Metric) -> tuple[np.ndarray, np.ndarray] | None:
    """``(prompt ids, values)`` of a per-prompt metric, prompts in id order: values (N,) for
    ``final`` and ``auc``, (evaluations × N) for ``best``; ``None`` without records of it."""
    records = [r for _, r in sorted(run.records.items()) if metric.tag in r.tags()]
    if not records or not metric.per_prompt:
        return None
    order = np.argsort(records[-1].prompt_id, kind="stable")
    ids = records[-1].prompt_id[order]
    if any(not np.array_equal(np.sort(r.prompt_id, kind="stable"), ids) for r in records):
        return None  # the held-out set changed within the run
    matrix = np.stack([per_prompt(r, metric.tag)[np.argsort(r.prompt_id, kind="stable")] for r in records])
    if metric.summary == "final":
        return ids, matrix[-1]
    if metric.summary == "auc":
        return ids, area_under(np.array([r.step for r in records], dtype=float), matrix)
    return ids, matrix
