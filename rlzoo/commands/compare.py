"""``rlzoo compare``: a table, a curve PNG and a Markdown report over groups of runs.

Runs are found under the given directories (a run is a directory holding TensorBoard
event files and a ``config.yaml``). Every column is defined once, in :data:`COLUMNS`, and
that text is the legend printed under the table and written into ``compare.md``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlzoo.diagnostics.detectors import diagnose
from rlzoo.diagnostics.run_record import RunRecord, run_config
from rlzoo.core.errors import RlzooError
from rlzoo.core.events import read_events
from rlzoo.plan.hparams import NOT_HPARAMS, flatten_config, matches
from rlzoo.run.rundir import check_output_dir

MAX_INSET_LEGEND = 8
"""More groups than this: the curve figure's legend goes below the panels, in columns."""

GROUPING_IGNORES = ("seed", "trainer.threads", "eval.every")
"""Hyperparameters that do not separate groups: the seed, and keys that change how fast a
run goes or how often it is evaluated but not what it trains."""


COLUMNS: list[tuple[str, str]] = [
    ("group", "runs whose hyperparameters (as TensorBoard's HParams shows them) are equal except for "
              "`seed`, `trainer.threads` and `eval.every`; labelled by the keys that differ between groups "
              "(a component by its name, a list of components by their names, a component's parameters only "
              "where they differ for the same component; keys an algorithm preset sets are folded into `algo=`)"),
    ("seeds", "runs in the group; every other cell but `doctor` is their mean ± standard deviation (n−1 "
              "denominator)"),
    ("eval acc", "`eval/greedy_accuracy` at the last evaluation (after the last step): share of the held-out "
                 "prompts whose greedy completion scores at least `eval.threshold`"),
    ("eval pass@1", "`eval/pass@1` at the last evaluation: per held-out prompt, the share of its `eval.n` "
                    "sampled completions that are correct, averaged"),
    ("eval strict", "`eval/strict_accuracy` at the last evaluation: share of the held-out prompts whose greedy "
                    "completion is correct with its answer where `answer_format` says (the right answer in the "
                    "requested format)"),
    ("eval lenient", "`eval/lenient_accuracy` at the last evaluation: share of the held-out prompts whose greedy "
                     "completion holds the right answer anywhere (in any registered answer format's spans)"),
    ("reward final", "the smoothed training reward at the last step. Smoothed training reward: the mean of "
                     "`reward/mean` over W consecutive logged steps (W = `--window`, or all of a run's steps if "
                     "it has fewer), defined where a full window exists"),
    ("reward best", "the highest smoothed training reward of the run (so never below `reward final`)"),
    ("steps to T", "the first step at which the smoothed training reward reaches T (`--threshold`), averaged "
                   "over the runs that reach it; (k/N): how many of the N runs did"),
    ("train s", "seconds of training steps (rollout, scoring and update: the sum of `timing/step_s`; mean "
                "logged step × steps when `logging.log_every` > 1); start-up, evaluation and checkpoints "
                "are not included"),
    ("eval s", "seconds spent in evaluation (the sum of `timing/eval_s`)"),
    ("tokens/s", "prompt + response tokens per second of step time (`throughput/tokens_per_s`), mean over "
                 "logged steps"),
    ("doctor", "the number of `rlzoo doctor`'s findings in each run of the group, run by run (a pathology its "
               "detectors see in the run's curves; `rlzoo doctor RUN_DIR` names them, with the evidence and the "
               "overrides to try)"),
]
"""(header, definition) of every column of the table, in order; the definitions are the legend."""


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


def is_run(path: Path) -> bool:
    """A run directory: ``config.yaml`` and TensorBoard events (not inside a checkpoint)."""
    return (path / "config.yaml").is_file() and any(path.glob("events.out.tfevents.*")) \
        and "checkpoints" not in path.parts


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


def _mean_std(values: list[float | None], digits: int = 3) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "—"
    arr = np.array(present, dtype=float)
    text = f"{arr.mean():.{digits}f}"
    if len(arr) > 1:
        text += f" ± {arr.std(ddof=1):.{digits}f}"
    return text + (f" ({len(present)}/{len(values)})" if len(present) < len(values) else "")


def table(groups: list[Group], threshold: float) -> str:
    """The comparison as a Markdown table (columns: :data:`COLUMNS`)."""
    headers = [h.replace("T", f"{threshold:g}") if h == "steps to T" else h for h, _ in COLUMNS]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for group in groups:
        runs = group.runs
        reached = [r.steps_to_threshold for r in runs if r.steps_to_threshold is not None]
        steps = f"{np.mean(reached):.0f} ({len(reached)}/{len(runs)})" if reached else f"not reached (0/{len(runs)})"
        cells = [group.label, str(len(runs)),
                 _mean_std([r.final_eval("eval/greedy_accuracy") for r in runs]),
                 _mean_std([r.final_eval("eval/pass@1") for r in runs]),
                 _mean_std([r.final_eval("eval/strict_accuracy") for r in runs]),
                 _mean_std([r.final_eval("eval/lenient_accuracy") for r in runs]),
                 _mean_std([r.reward_final for r in runs]), _mean_std([r.reward_best for r in runs]), steps,
                 _mean_std([r.train_s for r in runs], 0), _mean_std([r.eval_s for r in runs], 0),
                 _mean_std([r.tokens_per_s for r in runs], 0), _findings(runs)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _findings(runs: list[RunSummary]) -> str:
    """The ``doctor`` cell: findings per run, in run order (``0``, or ``2, 0, 1`` over seeds)."""
    return ", ".join(str(len(r.findings)) for r in runs)


def legend(threshold: float, window: int) -> str:
    """The definitions of the table's columns (W and T filled in)."""
    return "\n".join(f"- **{h}**: {text}".replace("W = `--window`", f"W = {window}")
                     .replace("reaches T (`--threshold`)", f"reaches {threshold:g}") for h, text in COLUMNS)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RlzooError("rlzoo compare draws with matplotlib, which is not importable here "
                         f"({exc}); install it: pip install matplotlib") from exc
    return plt


def _band(ax: Any, steps: np.ndarray, curves: list[np.ndarray], label: str, **style: Any) -> None:
    """The mean of aligned curves with a ±1 std band (over seeds)."""
    length = min(len(c) for c in curves)
    stacked = np.stack([c[:length] for c in curves])
    mean = stacked.mean(0)
    line, = ax.plot(steps[:length], mean, label=label, linewidth=2, **style)
    if len(curves) > 1:
        std = stacked.std(0, ddof=1)
        ax.fill_between(steps[:length], mean - std, mean + std, color=line.get_color(), alpha=0.2)


def plot(groups: list[Group], out: Path, window: int, title: str) -> Path:
    """Smoothed training reward per group (left) and, when the runs evaluated, held-out
    greedy accuracy (right); mean over seeds with a ±1 std band."""
    plt = _pyplot()
    with_eval = any("eval/greedy_accuracy" in r.eval_curves for g in groups for r in g.runs)
    fig, axes = plt.subplots(1, 2 if with_eval else 1, figsize=(13 if with_eval else 8, 4.5), dpi=110,
                             squeeze=False)
    reward_ax = axes[0][0]
    for group in groups:
        label = f"{group.label} (n={len(group.runs)})"
        _band(reward_ax, group.runs[0].steps, [r.smoothed for r in group.runs], label)
        if with_eval:
            runs = [r for r in group.runs if "eval/greedy_accuracy" in r.eval_curves]
            if runs:
                steps = runs[0].eval_curves["eval/greedy_accuracy"][0]
                _band(axes[0][1], steps, [r.eval_curves["eval/greedy_accuracy"][1] for r in runs], label,
                      marker="o", markersize=3)
    reward_ax.set_ylabel(f"reward/mean, mean over {window} steps")
    reward_ax.set_title("training reward")
    if with_eval:
        axes[0][1].set_ylabel("eval/greedy_accuracy")
        axes[0][1].set_title("held-out greedy accuracy")
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
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_against(groups: list[Group], key: str, out: Path, title: str) -> Path:
    """Final smoothed training reward (left) and final held-out greedy accuracy (right) against the
    numeric hyperparameter ``key``, one line per value of the other label keys; mean ± 1 std over
    seeds as error bars.

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
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), dpi=110)
    panels = [(axes[0], "reward final (smoothed training reward at the last step)",
               lambda r: r.reward_final),
              (axes[1], "eval/greedy_accuracy at the last evaluation",
               lambda r: r.final_eval("eval/greedy_accuracy"))]
    for ax, ylabel, metric in panels:
        for rest, points in series.items():
            points.sort(key=lambda p: p[0])
            xs, means, stds = [], [], []
            for x, group in points:
                values = [v for v in (metric(r) for r in group.runs) if v is not None]
                if values:
                    xs.append(x)
                    means.append(float(np.mean(values)))
                    stds.append(float(np.std(values, ddof=1)) if len(values) > 1 else 0.0)
            if xs:
                ax.errorbar(xs, means, yerr=stds, label=rest, marker="o", capsize=3, linewidth=1.5)
        ax.set_xlabel(key)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}: mean ± std over seeds")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def _count(n: int, noun: str) -> str:
    """``1 run``, ``3 runs``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def default_out(paths: list[str | Path]) -> Path:
    """Where compare writes by default: the first path, or its parent when the first path
    is itself a run (compare never writes into a run directory)."""
    first = Path(paths[0])
    return first.parent if is_run(first) else first


def compare(paths: list[str | Path], out_dir: str | Path | None = None, threshold: float = 0.5,
            window: int = 25, x: str | None = None) -> tuple[str, Path, Path]:
    """Summarise runs; write ``compare.png`` and ``compare.md`` into ``out_dir`` (default:
    :func:`default_out`), and with ``x`` (a numeric key that separates the groups) also
    ``compare_<x>.png``, the final numbers against it. Returns ``(table and legend, png, report)``.

    :raises RlzooError: no runs, a run without ``reward/mean``, an out directory that is a
        run or a file (or under one), a window below 1, or no matplotlib.
    """
    if window < 1:
        raise RlzooError(f"--window must be >= 1, got {window}")
    out = Path(out_dir) if out_dir is not None else default_out(paths)
    if is_run(out):
        raise RlzooError(f"--out {str(out)!r} is a run directory; compare writes only outside runs")
    check_output_dir(out, "--out")
    runs = find_runs(paths)
    _pyplot()  # fail before reading every run
    groups = group_runs([summarise(run, threshold, window) for run in runs])
    text = table(groups, threshold)
    notes = legend(threshold, window)
    title = f"{_count(len(runs), 'run')} in {_count(len(groups), 'group')}"
    figures = ""
    if x is not None:
        against = plot_against(groups, x, out / f"compare_{x}.png", title)
        figures = f"![final numbers against {x}]({against.name})\n\n"
    png = plot(groups, out / "compare.png", window, title)
    report = out / "compare.md"
    run_list = "\n".join(f"- `{r}`" for r in runs)
    report.write_text(f"# Comparison\n\n{text}\n\n{notes}\n\n{figures}![curves](compare.png)\n\nRuns:\n{run_list}\n")
    return f"{text}\n\n{notes}", png, report
