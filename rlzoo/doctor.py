"""``rlzoo doctor``: after a run, what went wrong, with the evidence and the knob to turn; before
one (``--plan``), what it will cost.

Post-mortem: each run directory's logged curves go through every detector of
:mod:`rlzoo.diagnostics.detectors`; the report names each finding, the steps and values that
show it, its likely cause and the overrides to try. Pre-flight: the run plan and the model's
config give the estimated peak memory and step time of :mod:`rlzoo.diagnostics.preflight`,
against this machine's free memory, before any model is built.
"""

from __future__ import annotations

from pathlib import Path

from rlzoo.compare import find_runs
from rlzoo.diagnostics.detectors import Finding, diagnose
from rlzoo.diagnostics.preflight import Estimate, estimate
from rlzoo.diagnostics.records import load_run
from rlzoo.resolved import ResolvedConfig
from rlzoo.rundir import read_status


def examine(paths: list[str | Path]) -> list[tuple[Path, list[Finding]]]:
    """``(run directory, its findings)`` for every run at or under ``paths``.

    :raises RlzooError: a path does not exist, or holds no run.
    """
    return [(run, diagnose(load_run(run))) for run in find_runs(paths)]


def report(results: list[tuple[Path, list[Finding]]]) -> str:
    """The post-mortem as ``rlzoo doctor`` prints it: per run a heading (its directory, the
    steps it logged and how it ended), then its findings or ``no findings``."""
    blocks = []
    for run, findings in results:
        record = load_run(run)
        steps = max((points[-1][0] for points in record.scalars.values() if points), default=0)
        status = read_status(run) or {}
        ended = f", {status['status']} at step {status.get('step')}" if status.get("status") else ""
        head = f"{run}: {steps} steps logged{ended}; {len(findings)} finding{'s' if len(findings) != 1 else ''}"
        body = "\n".join(f.render() for f in findings) if findings else "  no findings"
        blocks.append(f"{head}\n{body}")
    return "\n\n".join(blocks) + "\n"


def preflight(resolved: ResolvedConfig) -> Estimate:
    """The pre-flight estimate of ``resolved``'s run (no model is built)."""
    return estimate(resolved)
