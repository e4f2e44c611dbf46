"""The doctor during training: the detectors of :mod:`rlzoo.diagnostics.detectors` on the
curves logged so far, every ``eval.every`` steps and after the last (``logging.doctor``),
each finding printed once as one line."""

from __future__ import annotations

from typing import Any

import yaml

from rlzoo.diagnostics.detectors import RunRecord, diagnose


class Watch:
    """Collects a run's logged scalars and reports findings not reported before.

    :param config: the run's resolved config: ``config.yaml``'s text, as ``rlzoo doctor`` reads
        it after the run, or its data (plain dicts).
    :param every: check every this many steps (``eval.every``; 0: only after the last).
    :param scalars: what the run logged before (a resumed run's curves), ``tag -> [(step, value)]``.
    """

    def __init__(self, config: dict[str, Any] | str, every: int,
                 scalars: dict[str, list[tuple[int, float]]] | None = None) -> None:
        if isinstance(config, str):
            config = yaml.safe_load(config) or {}
        self.record = RunRecord({tag: list(points) for tag, points in (scalars or {}).items()}, config)
        self.every = every
        self.reported: set[str] = set()

    def add(self, step: int, metrics: dict[str, float]) -> None:
        """Record the scalars logged at ``step``."""
        for tag, value in metrics.items():
            self.record.scalars.setdefault(tag, []).append((step, float(value)))

    def check(self, step: int, last: bool) -> list[str]:
        """At a due step (a multiple of ``every``, or the last), one line per finding not
        reported before (a finding is known by its code); else nothing."""
        if not (last or (self.every and step % self.every == 0)):
            return []
        lines = []
        for finding in diagnose(self.record):
            if finding.code not in self.reported:
                self.reported.add(finding.code)
                lines.append(f"rlzoo: doctor: step {step}: {finding.line()}")
        return lines
