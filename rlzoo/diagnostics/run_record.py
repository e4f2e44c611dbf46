"""What the detectors read and what they report: a run's logged curves and its config
(:class:`RunRecord`), loaded from a run directory (:func:`load_run`) or collected during
training; one curve with its smoothing (:class:`Curve`); a finding (:class:`Finding`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rlzoo.diagnostics.thresholds import limit
from rlzoo.core.events import read_scalars


@dataclass(frozen=True)
class Finding:
    """One pathology found in a run.

    :ivar code: the detector's name (``entropy_collapse``, ...).
    :ivar title: the pathology in words.
    :ivar steps: first and last step of the evidence.
    :ivar evidence: the values that show it.
    :ivar cause: its likely cause.
    :ivar fixes: ``(override, why)`` pairs: exact ``key=value`` overrides to try, in order.
    """

    code: str
    title: str
    steps: tuple[int, int]
    evidence: str
    cause: str
    fixes: tuple[tuple[str, str], ...] = ()

    def line(self) -> str:
        """The finding in one line (the trainer's warning)."""
        tried = "; try " + ", ".join(fix for fix, _ in self.fixes) if self.fixes else ""
        return f"{self.title} (steps {self.steps[0]}-{self.steps[1]}): {self.evidence}{tried}"

    def render(self) -> str:
        """The finding as ``rlzoo doctor`` prints it: a heading and indented lines."""
        lines = [f"[{self.code}] {self.title}, steps {self.steps[0]}-{self.steps[1]}",
                 f"  evidence: {self.evidence}", f"  cause: {self.cause}"]
        lines += [f"  {'fix' if i == 0 else '   '}: {fix}  ({why})" for i, (fix, why) in enumerate(self.fixes)]
        return "\n".join(lines)


@dataclass
class RunRecord:
    """What the detectors read.

    :ivar scalars: ``tag -> [(step, value), ...]`` sorted by step (:func:`rlzoo.core.events.read_scalars`).
    :ivar config: the run's resolved config as plain nested dicts and lists.
    """

    scalars: dict[str, list[tuple[int, float]]]
    config: dict[str, Any] = field(default_factory=dict)

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


def load_run(run_dir: str | Path) -> RunRecord:
    """The :class:`RunRecord` of a run directory: its TensorBoard scalars and ``config.yaml``
    (an empty config when the file is missing)."""
    config_file = Path(run_dir) / "config.yaml"
    config = yaml.safe_load(config_file.read_text()) if config_file.is_file() else None
    return RunRecord(read_scalars(run_dir), config or {})
