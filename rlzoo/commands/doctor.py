"""``rlzoo doctor``: after a run, what went wrong, with the evidence and the knob to turn; before
one (``--plan``), what it will cost.

Post-mortem: each run directory's logged curves go through every detector of
:mod:`rlzoo.diagnostics.detectors`; the report names each finding, the steps and values that
show it, its likely cause and the overrides to try. Pre-flight: the run plan and the model's
config give the estimated peak memory and step time of :mod:`rlzoo.diagnostics.preflight`,
against this machine's free memory, before any model is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlzoo.commands.compare import find_runs
from rlzoo.diagnostics.detectors import diagnose
from rlzoo.diagnostics.preflight import Estimate, estimate
from rlzoo.diagnostics.run_record import Finding, load_run
from rlzoo.config.resolved import ResolvedConfig
from rlzoo.run.rundir import read_status


@dataclass(frozen=True)
class Examined:
    """One run's post-mortem: its directory, the last step it logged, how it ended
    (``status.json``, or ``None``) and its findings."""

    run_dir: Path
    steps: int
    status: dict | None
    findings: list[Finding]


def examine(paths: list[str | Path]) -> list[Examined]:
    """The post-mortem of every run at or under ``paths`` (sweep directories: each run).

    :raises RlzooError: a path does not exist, or holds no run.
    """
    out = []
    for run in find_runs(paths):
        record = load_run(run)
        steps = max((points[-1][0] for points in record.scalars.values() if points), default=0)
        out.append(Examined(run, steps, read_status(run), diagnose(record)))
    return out


def report(results: list[Examined]) -> str:
    """The post-mortem as ``rlzoo doctor`` prints it: per run a heading (its directory, the
    steps it logged, how it ended, how many findings), then each finding or ``no findings``."""
    blocks = []
    for result in results:
        ended = f", {result.status['status']} at step {result.status.get('step')}" if result.status else ""
        count = len(result.findings)
        head = f"{result.run_dir}: {result.steps} steps logged{ended}; {count} finding{'s' if count != 1 else ''}"
        body = "\n".join(f.render() for f in result.findings) if result.findings else "  no findings"
        blocks.append(f"{head}\n{body}")
    return "\n\n".join(blocks) + "\n"


def preflight(resolved: ResolvedConfig) -> Estimate:
    """The pre-flight estimate of ``resolved``'s run (none of its models is built)."""
    return estimate(resolved)
