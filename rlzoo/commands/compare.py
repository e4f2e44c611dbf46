"""``rlzoo compare``: a table with 95% intervals, the differences to a baseline, curve and
forest PNGs, a Markdown report and a JSON file over groups of runs.

The command reads runs (:mod:`rlzoo.analysis.runs`), calls the statistics
(:mod:`rlzoo.analysis.comparison`) and writes what :mod:`rlzoo.analysis.report` and
:mod:`rlzoo.analysis.figures` make of them; every column is defined once, in
:data:`rlzoo.analysis.report.COLUMNS`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlzoo.analysis.comparison import Comparison, as_dict, check_options, compare_groups
from rlzoo.analysis.figures import forest, plot, plot_against, pyplot
from rlzoo.analysis.intervals import LEVEL
from rlzoo.analysis.report import differences, legend, table, write_report
from rlzoo.analysis.runs import find_runs, group_runs, is_run, summarise
from rlzoo.core.errors import RlzooError
from rlzoo.run.rundir import check_not_a_run, check_output_dir

__all__ = ["Compared", "compare", "default_out", "find_runs", "read_comparison"]


@dataclass
class Compared:
    """What ``rlzoo compare`` made: the comparison, its text, and the files it wrote."""

    comparison: Comparison
    text: str
    files: list[Path]


def _count(n: int, noun: str) -> str:
    """``1 run``, ``3 runs``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def default_out(paths: list[str | Path]) -> Path:
    """Where compare writes by default: the first path, or its parent when the first path
    is itself a run (compare never writes into a run directory)."""
    first = Path(paths[0])
    return first.parent if is_run(first) else first


def read_comparison(paths: list[str | Path], threshold: float = 0.5, window: int = 25,
                    baseline: list[str] | None = None, metric: str = "eval/greedy_accuracy",
                    min_effect: float | None = None, level: float = LEVEL) -> tuple[list[Path], Comparison]:
    """Read the runs at or under ``paths`` and compare their groups (nothing written).

    :raises RlzooError: no runs, a run without ``reward/mean``, a window below 1, a bad
        ``--baseline`` or ``--min-effect``.
    """
    if window < 1:
        raise RlzooError(f"--window must be >= 1, got {window}")
    check_options(metric, min_effect)
    runs = find_runs(paths)
    groups = group_runs([summarise(run, threshold, window) for run in runs])
    return runs, compare_groups(groups, metric, baseline, level, min_effect)


def compare(paths: list[str | Path], out_dir: str | Path | None = None, threshold: float = 0.5,
            window: int = 25, x: str | None = None, baseline: list[str] | None = None,
            metric: str = "eval/greedy_accuracy", min_effect: float | None = None) -> Compared:
    """Compare runs; write ``compare.png`` (curves), ``compare_differences.png`` (forest
    plot), ``compare.md`` and ``compare.json`` into ``out_dir`` (default:
    :func:`default_out`), and with ``x`` (a numeric key that separates the groups) also
    ``compare_<x>.png``.

    :raises RlzooError: what :func:`read_comparison` raises, an out directory that is a run
        or a file (or under one), or no matplotlib.
    """
    out = Path(out_dir) if out_dir is not None else default_out(paths)
    check_not_a_run(out, "--out", "compare writes only outside runs")
    check_output_dir(out, "--out")
    if window < 1:
        raise RlzooError(f"--window must be >= 1, got {window}")
    pyplot()  # fail before reading every run
    runs, comparison = read_comparison(paths, threshold, window, baseline, metric, min_effect)
    text = f"{table(comparison, threshold)}\n\n{legend(threshold, window)}"
    title = f"{_count(len(runs), 'run')} in {_count(len(comparison.groups), 'group')}"
    figures, files = [], []
    if x is not None:
        against = plot_against(comparison.groups, x, out / f"compare_{x}.png", title)
        figures.append(f"![final numbers against {x}]({against.name})")
        files.append(against)
    files.append(plot(comparison, out / "compare.png", window, title))
    figures.append("![curves](compare.png)")
    diffs = forest(comparison, out / "compare_differences.png", min_effect)
    if diffs is not None:
        files.append(diffs)
        figures.append("![differences to the baseline](compare_differences.png)")
    files.append(write_report(out, comparison, text, figures, runs))
    (out / "compare.json").write_text(json.dumps(as_dict(comparison), indent=1))
    files.append(out / "compare.json")
    return Compared(comparison=comparison, text=f"{text}\n\n{differences(comparison)}", files=files)
