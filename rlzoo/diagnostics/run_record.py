"""What the detectors read and what they report: a run's logged curves and its config
(:class:`RunRecord`), loaded from a run directory (:func:`load_run`) or collected during
training; one curve with its smoothing (:class:`Curve`); a finding (:class:`Finding`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlzoo.config.yamlfile import read_yaml
from rlzoo.core.events import read_events
from rlzoo.diagnostics.thresholds import limit


@dataclass(frozen=True)
class Finding:
    """One pathology found in a run.

    :ivar code: the detector's name (``entropy_collapse``, ...).
    :ivar title: the pathology in words.
    :ivar steps: first and last step of the evidence.
    :ivar evidence: the values that show it.
    :ivar cause: its likely cause.
    :ivar fixes: ``(override, why)`` pairs: exact ``key=value`` overrides to try, in order.
    :ivar level: ``warning`` (the run is failing, or wastes what it computes) or ``note`` (worth
        knowing, not a fault: e.g. groups that agree because the task is solved).
    """

    code: str
    title: str
    steps: tuple[int, int]
    evidence: str
    cause: str
    fixes: tuple[tuple[str, str], ...] = ()
    level: str = "warning"

    def line(self) -> str:
        """The finding in one line (the trainer's warning)."""
        tried = "; try " + ", ".join(fix for fix, _ in self.fixes) if self.fixes else ""
        note = "note: " if self.level == "note" else ""
        return f"{note}{self.title} (steps {self.steps[0]}-{self.steps[1]}): {self.evidence}{tried}"

    def render(self) -> str:
        """The finding as ``rlzoo doctor`` prints it: a heading and indented lines."""
        note = " (note)" if self.level == "note" else ""
        lines = [f"[{self.code}]{note} {self.title}, steps {self.steps[0]}-{self.steps[1]}",
                 f"  evidence: {self.evidence}", f"  cause: {self.cause}"]
        lines += [f"  {'fix' if i == 0 else '   '}: {fix}  ({why})" for i, (fix, why) in enumerate(self.fixes)]
        return "\n".join(lines)


@dataclass
class RunRecord:
    """What the detectors read.

    :ivar scalars: ``tag -> [(step, value), ...]`` sorted by step (:func:`rlzoo.core.events.read_events`).
    :ivar config: the run's resolved config as plain nested dicts and lists.
    :ivar problems: what is wrong with the run's event files, one line each (empty when
        every file reads whole; :func:`rlzoo.core.events.event_file_problem`).
    """

    scalars: dict[str, list[tuple[int, float]]]
    config: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def setting(self, key: str, default: Any = None) -> Any:
        """The config value at dotted ``key`` (a component given as a mapping answers
        ``key.name`` and its parameters), or ``default``."""
        node: Any = self.config
        for part in key.split("."):
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, str) and part == "name":
                return node
            else:
                return default
        return node

    def curve(self, tag: str) -> Curve | None:
        """The finite points of ``tag`` as a :class:`Curve`, or ``None`` when it is absent or
        too short to judge (fewer than four windows)."""
        points = [(s, v) for s, v in self.scalars.get(tag, []) if math.isfinite(v)]
        window = window_size(len(points))
        if len(points) < 4 * window:
            return None
        return Curve(tag, np.array([s for s, _ in points]), np.array([v for _, v in points], dtype=float), window)

    def shortfall(self, tag: str, reference: str) -> float | None:
        """``Σ (reference - tag) / Σ |reference|`` over the steps that log both (finite values):
        how far ``tag`` stays below ``reference`` as a share of it (negative: above), or ``None``
        when they share no step or ``reference`` sums to (nearly) 0 (``zero_abs`` a step)."""
        mine = {s: v for s, v in self.scalars.get(tag, []) if math.isfinite(v)}
        theirs = {s: v for s, v in self.scalars.get(reference, []) if math.isfinite(v)}
        steps = sorted(set(mine) & set(theirs))
        scale = sum(abs(theirs[s]) for s in steps)
        if not steps or scale <= limit("zero_abs") * len(steps):
            return None
        return sum(theirs[s] - mine[s] for s in steps) / scale

    def success(self) -> float:
        """The task's success score (``eval.threshold``): the scale of rewards and gains."""
        return float(self.setting("eval.threshold", 1.0) or 1.0)


def window_size(points: int) -> int:
    """Steps per smoothing window for a curve of ``points`` points (``window_share``, at
    least ``min_window``)."""
    return max(int(limit("min_window")), round(points * limit("window_share")))


@dataclass
class Curve:
    """One logged scalar: ``steps`` and ``values`` (finite only), and the window it is smoothed over."""

    tag: str
    steps: np.ndarray
    values: np.ndarray
    window: int

    @property
    def smooth(self) -> np.ndarray:
        """Trailing moving means, one per full window (``len - window + 1`` of them; the i-th
        ends at ``values[i + window - 1]``)."""
        total = np.cumsum(np.insert(self.values, 0, 0.0))
        return (total[self.window:] - total[:-self.window]) / self.window

    def smooth_step(self, i: int) -> int:
        """The step at which smoothed point ``i`` ends."""
        return int(self.steps[i + self.window - 1])

    @property
    def start(self) -> float:
        return float(self.values[:self.window].mean())

    @property
    def end(self) -> float:
        return float(self.values[-self.window:].mean())

    def after(self, share: float) -> np.ndarray:
        """The values from ``share`` of the curve on (``0.5``: the last half)."""
        return self.values[int(len(self.values) * share):]

    def at(self, step: int) -> float:
        """The smoothed value of the window ending at ``step`` (or the first window's)."""
        i = int(np.searchsorted(self.steps, step, side="right")) - self.window
        return float(self.smooth[max(0, min(i, len(self.smooth) - 1))])

    def late_rise(self) -> float:
        """How much a least-squares line through the last half of the values rises across that
        half, as a share of the line's value at the half's start (0 when the line starts at or
        below 0 and does not rise). Two smoothed windows at the half's ends read a plateau's
        noise as a rise; the line reads the trend."""
        steps, values = self.steps[len(self.steps) // 2:].astype(float), self.values[len(self.values) // 2:]
        if len(values) < 2:
            return 0.0
        slope, intercept = np.polyfit(steps, values, 1)
        start, end = intercept + slope * steps[0], intercept + slope * steps[-1]
        return float(end / start - 1) if start > 0 else (float("inf") if end > start else 0.0)


def run_config(run_dir: str | Path) -> dict[str, Any]:
    """A run directory's ``config.yaml`` as plain dicts (``{}`` when it has none), read as every
    config file is (:func:`rlzoo.config.yamlfile.read_yaml`: safe, no object is constructed).

    :raises ConfigError: the file is damaged, not UTF-8, not a mapping, or holds a tag such as
        ``!!python/object`` (one line naming it).
    """
    config_file = Path(run_dir) / "config.yaml"  # rlzoo.run.layout.CONFIG_FILE (a layer above)
    return read_yaml(config_file, f"{run_dir}: run config") if config_file.is_file() else {}


def load_run(run_dir: str | Path) -> RunRecord:
    """The :class:`RunRecord` of a run directory: its TensorBoard scalars, ``config.yaml``
    (:func:`run_config`) and what is wrong with its event files.

    :raises ConfigError: see :func:`run_config`.
    """
    config = run_config(run_dir)
    events = read_events(run_dir)
    return RunRecord(events.scalars, config, [f"{name} {problem}" for name, problem in events.problems.items()])
