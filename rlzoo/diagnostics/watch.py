"""The doctor during training: the detectors of :mod:`rlzoo.diagnostics.detectors` on the
curves logged so far, every ``eval.every`` steps and after the last (``logging.doctor``),
each finding printed once as one line (and recorded in the run directory, so that the
post-mortem can say what became of it); and, once the first steps are in, a warning when
every scored completion of them got the same score (:func:`rlzoo.diagnostics.flat_start.constant_at_start`)."""

from __future__ import annotations

from typing import Any

import yaml

from rlzoo.core.tags import Tag
from rlzoo.diagnostics.detectors import RunRecord, diagnose
from rlzoo.diagnostics.flat_start import constant_at_start
from rlzoo.diagnostics.run_record import Finding
from rlzoo.diagnostics.thresholds import limit


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
        self.start = RunRecord({}, config)
        self.every = every
        self.reported: set[str] = set()
        self.started = any(step >= limit("first_steps") for step, _ in self.record.scalars.get(Tag.REWARD, []))
        self.findings: list[Finding] = []
        """The findings of the last check: what ``rlzoo doctor`` would report now."""

    def add(self, step: int, metrics: dict[str, float]) -> None:
        """Record the scalars logged at ``step``."""
        for tag, value in metrics.items():
            self.record.scalars.setdefault(tag, []).append((step, float(value)))

    def check_start(self, step: int, metrics: dict[str, float]) -> str | None:
        """Every step's metrics (logged or not) until the first ``first_steps`` steps are in;
        then, once, the warning line of :func:`constant_at_start` (or ``None``)."""
        if self.started:
            return None
        for tag in (Tag.REWARD, Tag.REWARD_STD, Tag.ENTROPY, Tag.ZERO_STD_GROUPS):
            if tag in metrics:
                self.start.scalars.setdefault(tag, []).append((step, float(metrics[tag])))
        if step < limit("first_steps"):
            return None
        self.started = True
        found = constant_at_start(self.start)
        return None if found is None else f"rlzoo: warning: {found}"

    def check(self, step: int, last: bool) -> list[Finding]:
        """At a due step (a multiple of ``every``, or the last), the findings not reported before
        (a finding is known by its code); else nothing. :meth:`line` prints one."""
        if not (last or (self.every and step % self.every == 0)):
            return []
        self.findings = diagnose(self.record)
        new = [finding for finding in self.findings if finding.code not in self.reported]
        self.reported.update(finding.code for finding in new)
        return new

    @staticmethod
    def line(step: int, finding: Finding) -> str:
        """How a finding reported at ``step`` is printed."""
        return f"rlzoo: doctor: step {step}: {finding.line()}"
