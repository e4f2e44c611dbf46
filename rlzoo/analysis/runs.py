"""Runs as a comparison reads them: finding run directories, reducing each run to its curves,
per-prompt evaluation records and summary numbers, and grouping runs that differ only in seed.

A run is a directory holding TensorBoard event files and a ``config.yaml``; its groups are
formed from the effective hyperparameters read back from its event files (the values
TensorBoard's HParams shows), ignoring :data:`GROUPING_IGNORES`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlzoo.core.errors import RlzooError
from rlzoo.core.events import read_events
from rlzoo.diagnostics.detectors import diagnose
from rlzoo.diagnostics.run_record import RunRecord, run_config
from rlzoo.plan.hparams import NOT_HPARAMS, flatten_config, matches
from rlzoo.run.eval_records import EvalRecord, read_records
from rlzoo.run.rundir import is_run, read_status

GROUPING_IGNORES = ("seed", "trainer.threads", "eval.every")
"""Hyperparameters that do not separate groups: the seed, and keys that change how fast a
run goes or how often it is evaluated but not what it trains."""


@dataclass
class RunSummary:
    """One run, reduced to the table's numbers (see :data:`COLUMNS`)."""

    run_dir: Path
    hparams: dict[str, Any]
    steps: np.ndarray
    smoothed: np.ndarray
    reward_final: float
    reward_best: float
    steps_to_threshold: float | None
    train_s: float
    eval_s: float
    tokens_per_s: float
    eval_curves: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    """The codes of ``rlzoo doctor``'s findings for the run."""
    records: dict[int, EvalRecord] = field(default_factory=dict)
    """Its per-prompt evaluation records by step (:mod:`rlzoo.run.eval_records`); empty for a
    run written before they existed."""
    stopped: str | None = None
    """How a run that has not finished stands (``interrupted at step 31 of 40``), else ``None``:
    its values are those of its last logged step and evaluation, not its end's."""

    def final_eval(self, tag: str) -> float | None:
        """The value of ``tag`` at the run's last evaluation, or ``None``."""
        curve = self.eval_curves.get(tag)
        return float(curve[1][-1]) if curve is not None and len(curve[1]) else None


@dataclass
class Group:
    label: str
    runs: list[RunSummary]
    values: dict[str, str | None] = field(default_factory=dict)
    """The label's keys and values (what separates this group from the others)."""


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run directories at or under ``paths`` (sorted, unique)."""
    found: set[Path] = set()
    for path in map(Path, paths):
        if not path.exists():
            raise RlzooError(f"{str(path)!r} does not exist")
        found.update(config.parent for config in [path / "config.yaml", *path.rglob("config.yaml")]
                     if is_run(config.parent))
    if not found:
        raise RlzooError(f"no runs (config.yaml + TensorBoard events) under {', '.join(map(str, paths))}")
    return sorted(found)


def windows(values: np.ndarray, window: int) -> np.ndarray:
    """Means of every ``window`` consecutive values (all values when there are fewer):
    ``len(values) - w + 1`` points, the i-th ending at ``values[i + w - 1]``."""
    w = max(1, min(window, len(values)))
    cumulative = np.cumsum(np.insert(np.asarray(values, dtype=float), 0, 0.0))
    return (cumulative[w:] - cumulative[:-w]) / w


def _plain(value: Any) -> Any:
    """TensorBoard stores every number as a float: integral ones back to int."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def stopped_early(run_dir: Path, total_steps: Any, last_step: int) -> str | None:
    """How a run stands when it has not finished (``interrupted at step 31 of 40``; ``not
    finished at step 12 of 40`` when running or killed before writing its status), or ``None``
    when its ``status.json`` says completed or it logged its last step (``total_steps``)."""
    status = read_status(run_dir) or {}
    if status.get("status") == "completed":
        return None
    if status.get("status") and status.get("step") is not None:
        return f"{status['status']} at step {status['step']} of {status.get('total_steps', total_steps)}"
    if isinstance(total_steps, int) and last_step < total_steps:
        return f"not finished at step {last_step} of {total_steps}"
    return None


def summarise(run_dir: Path, threshold: float, window: int, tag: str = "reward/mean") -> RunSummary:
    """Reduce one run to :class:`RunSummary` (its curves, the table's numbers)."""
    events = read_events(run_dir)
    curves = events.scalars
    if not curves.get(tag):
        raise RlzooError(f"run {str(run_dir)!r} has no scalar {tag!r} (has it logged a step yet?)")
    steps = np.array([s for s, _ in curves[tag]], dtype=float)
    smoothed = windows(np.array([v for _, v in curves[tag]]), window)
    smoothed_steps = steps[len(steps) - len(smoothed):]
    reached = np.nonzero(smoothed >= threshold)[0]
    hparams = events.hparams
    config = run_config(run_dir)
    if hparams is None:  # a run from before rlzoo recorded effective hparams
        hparams = {k: v for k, v in flatten_config(config).items() if not matches(k, NOT_HPARAMS)}
    step_times = [v for _, v in curves.get("timing/step_s", [])]
    return RunSummary(
        run_dir=run_dir, hparams={k: _plain(v) for k, v in hparams.items()}, steps=smoothed_steps,
        smoothed=smoothed, reward_final=float(smoothed[-1]), reward_best=float(smoothed.max()),
        steps_to_threshold=float(smoothed_steps[reached[0]]) if len(reached) else None,
        train_s=float(np.mean(step_times) * steps[-1]) if step_times else 0.0,
        eval_s=float(sum(v for _, v in curves.get("timing/eval_s", []))),
        tokens_per_s=float(np.mean([v for _, v in curves.get("throughput/tokens_per_s", [(0, 0.0)])])),
        eval_curves={t: (np.array([s for s, _ in c], dtype=float), np.array([v for _, v in c]))
                     for t, c in curves.items() if t.startswith("eval/")},
        findings=[finding.code for finding in diagnose(RunRecord(curves, config))],
        records=read_records(run_dir),
        stopped=stopped_early(run_dir, (config.get("trainer") or {}).get("total_steps"), int(steps[-1])),
    )


def _component_value(key: dict[str, str], root: str) -> str | None:
    """How a component knob reads in a label: its ``name``, or for a list of components (such as
    ``rollout_correction=[rejection, tis]``) the names of its items in order."""
    name = key.get(f"{root}.name")
    if name not in (None, "None"):
        return name
    raw = key.get(root)
    try:
        items = ast.literal_eval(raw) if raw is not None else None
    except (ValueError, SyntaxError):
        return raw
    if isinstance(items, list):
        return "[" + ", ".join(str(i.get("name", i)) if isinstance(i, dict) else str(i) for i in items) + "]"
    return raw


def _shown(key: dict[str, str], roots: set[str]) -> dict[str, str | None]:
    """A group's hyperparameters as labels show them: a component (a key with a ``.name``, or a
    list of components) by its name; its parameters under their own keys."""
    shown: dict[str, str | None] = {}
    for name, value in key.items():
        if name in roots or (name.endswith(".name") and name[:-5] in roots):
            root = name if name in roots else name[:-5]
            shown[root] = _component_value(key, root)
        else:
            shown[name] = value
    return shown


def _implied(shown: list[dict[str, str | None]], name: str, by: str) -> bool:
    """Whether ``name`` takes one value for each value of ``by`` (so ``by`` alone tells it)."""
    seen: dict[Any, Any] = {}
    return all(seen.setdefault(key.get(by), key.get(name)) == key.get(name) for key in shown)


def group_runs(summaries: list[RunSummary]) -> list[Group]:
    """Group runs (see the ``group`` column of :data:`COLUMNS`) and label each group."""
    keyed: dict[tuple, list[RunSummary]] = {}
    for summary in summaries:
        key = tuple(sorted((k, str(v)) for k, v in summary.hparams.items() if not matches(k, GROUPING_IGNORES)))
        keyed.setdefault(key, []).append(summary)
    names = {name for key in keyed for name, _ in key}
    roots = {name[:-5] for name in names if name.endswith(".name")}
    shown = [_shown(dict(key), roots) for key in keyed]
    all_names = sorted({name for key in shown for name in key})
    differing = [name for name in all_names if len({key.get(name) for key in shown}) > 1]
    # a component's parameters follow from its name when every group of that component sets them
    # alike (tis's cap, icepop's bounds); keys a preset sets follow from `algo`
    differing = [name for name in differing
                 if not any(name.startswith(f"{root}.") and root in differing and _implied(shown, name, root)
                            for root in roots)]
    if "algo" in differing:
        differing = ["algo"] + [name for name in differing if name != "algo" and not _implied(shown, name, "algo")]
    groups = []
    for key, members in zip(shown, keyed.values()):
        label = ", ".join(f"{name}={key.get(name)}" for name in differing) or _common_name(members)
        groups.append(Group(label=label, runs=members, values={name: key.get(name) for name in differing}))
    return sorted(groups, key=lambda g: [_sort_key(g.values[name]) for name in differing] or [g.label])


def _common_name(members: list[RunSummary]) -> str:
    """The label of a group that no key sets apart: its run's directory name, or for several
    seeds the directory they share (a sweep's name), never one seed's name for them all."""
    parents = {run.run_dir.parent for run in members}
    if len(members) == 1:
        return members[0].run_dir.name
    return next(iter(parents)).name if len(parents) == 1 else "all runs"


def _sort_key(value: str | None) -> tuple[int, float, str]:
    """Numbers in numeric order (staleness 2 before 10), then text."""
    try:
        return 0, float(value), ""           # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 1, 0.0, str(value)
