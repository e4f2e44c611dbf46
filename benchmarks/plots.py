"""Curves of single runs from TensorBoard logs as a PNG (benchmarks/learning_curves.py).
``rlzoo compare`` draws groups of runs itself (:mod:`rlzoo.analysis.figures`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlzoo.core.errors import RlzooError
from rlzoo.core.events import read_scalars


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average over ``window`` points (shorter at the start)."""
    if window <= 1 or len(values) == 0:
        return values
    cumulative = np.cumsum(np.insert(values, 0, 0.0))
    out = np.empty_like(values, dtype=float)
    for i in range(len(values)):
        lo = max(0, i + 1 - window)
        out[i] = (cumulative[i + 1] - cumulative[lo]) / (i + 1 - lo)
    return out


def plot_runs(runs: dict[str, str | Path], out: str | Path, tag: str = "reward/mean",
              window: int = 25, title: str | None = None) -> Path:
    """Plot ``tag`` of each run (label -> run dir) against step, raw and smoothed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RlzooError(f"plotting needs matplotlib, which is not importable here ({exc}): "
                         "pip install matplotlib") from exc
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for label, run_dir in runs.items():
        curves = read_scalars(run_dir)
        if tag not in curves:
            raise RlzooError(f"run {str(run_dir)!r} has no scalar {tag!r}")
        steps = np.array([s for s, _ in curves[tag]])
        values = np.array([v for _, v in curves[tag]])
        line, = ax.plot(steps, smooth(values, window), label=label, linewidth=2)
        ax.plot(steps, values, color=line.get_color(), alpha=0.2, linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel(tag)
    ax.grid(alpha=0.3)
    ax.set_title(title or tag)
    ax.legend(loc="lower right")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
