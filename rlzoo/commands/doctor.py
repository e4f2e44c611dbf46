"""``rlzoo doctor``: after a run, what went wrong, with the evidence and the knob to turn; before
one (``--plan``), what it will cost.

Post-mortem: each run directory's logged curves go through every detector of
:mod:`rlzoo.diagnostics.detectors`; the report names each finding, the steps and values that
show it, its likely cause and the overrides to try, and what became of each finding the run
printed while it trained (``doctor.jsonl``). A path that holds no run, a run whose event files
cannot be read whole, is named. Pre-flight: the run plan and the model's config give the
estimated peak memory and step time of :mod:`rlzoo.diagnostics.preflight`, against this
machine's free memory, before any model is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rlzoo.commands.compare import find_runs
from rlzoo.config.resolved import ResolvedConfig
from rlzoo.core.errors import RlzooError
from rlzoo.diagnostics.detectors import diagnose
from rlzoo.diagnostics.preflight import Estimate, estimate
from rlzoo.diagnostics.run_record import Finding, RunRecord, load_run
from rlzoo.run.rundir import read_findings_log, read_status


@dataclass(frozen=True)
class Examined:
    """One run's post-mortem: its directory, the last step it logged, how it ended
    (``status.json``, or ``None``), its findings, what is wrong with its logs, and the
    findings printed during the run that no longer hold (``(step, title)``)."""

    run_dir: Path
    steps: int
    status: dict | None
    findings: list[Finding]
    problems: list[str] = field(default_factory=list)
    gone: list[tuple[int, str]] = field(default_factory=list)

    @property
    def unreadable(self) -> bool:
        """Whether nothing could be judged: the path holds no run, or no curve could be read."""
        return self.steps == 0 and bool(self.problems)


def not_a_run(path: Path) -> Examined:
    """The report of a path that holds no run (a directory without a run's files)."""
    why = ("has a config.yaml but no TensorBoard event files: the run logged nothing"
           if (path / "config.yaml").is_file() else
           "is not a run directory: no config.yaml with TensorBoard event files at or under it")
    return Examined(path, 0, None, [], [why])


def examine_run(run_dir: Path) -> Examined:
    """The post-mortem of one run directory (:class:`Examined`).

    :raises ConfigError: its ``config.yaml`` is damaged or holds a tag such as ``!!python``.
    """
    record = load_run(run_dir)
    steps = max((points[-1][0] for points in record.scalars.values() if points), default=0)
    problems = list(record.problems)
    if not record.scalars and not problems:
        problems.append("holds TensorBoard event files with no scalars in them")
    findings = diagnose(record) if record.scalars else []
    return Examined(run_dir, steps, read_status(run_dir), findings, problems, gone_findings(run_dir, record, findings))


def gone_findings(run_dir: Path, record: RunRecord, findings: list[Finding]) -> list[tuple[int, str]]:
    """The findings the run printed while it trained (``doctor.jsonl``) that the post-mortem no
    longer reports, as ``(step first printed, what it said then)``: their condition held on the
    curves up to that step (the detectors on those curves say what they saw) and not on the
    whole run."""
    now = {finding.code for finding in findings}
    first: dict[str, tuple[int, str]] = {}
    for entry in read_findings_log(run_dir):
        first.setdefault(str(entry["code"]), (int(entry["step"]), str(entry["title"])))
    gone = []
    for code, (step, title) in first.items():
        if code in now or not record.scalars:
            continue
        then = RunRecord({tag: [(s, v) for s, v in points if s <= step] for tag, points in record.scalars.items()},
                         record.config)
        said = [f"{f.title}: {f.evidence}" for f in diagnose(then) if f.code == code]
        gone.append((step, said[0] if said else title))
    return gone


def examine(paths: list[str | Path]) -> list[Examined]:
    """The post-mortem of every run at or under ``paths`` (sweep directories: each run), and a
    report for each path that holds none.

    :raises RlzooError: a path does not exist; a run's ``config.yaml`` cannot be read.
    """
    out, seen = [], set()
    for path in map(Path, paths):
        try:
            runs = find_runs([path])
        except RlzooError:
            if not path.exists():
                raise
            out.append(not_a_run(path))
            continue
        out += [examine_run(run) for run in runs if run not in seen]
        seen.update(runs)
    return out


def report(results: list[Examined]) -> str:
    """The post-mortem as ``rlzoo doctor`` prints it: per run a heading (its directory, the
    steps it logged, how it ended, how many findings), what is wrong with its logs, then each
    finding or ``no findings``, then what became of findings printed during the run."""
    blocks = []
    for result in results:
        if result.unreadable:
            reason = "; ".join(result.problems)
            blocks.append(f"{result.run_dir}: {reason}; nothing to diagnose")
            continue
        ended = f", {result.status['status']} at step {result.status.get('step')}" if result.status else ""
        count = len(result.findings)
        head = f"{result.run_dir}: {result.steps} steps logged{ended}; {count} finding{'s' if count != 1 else ''}"
        lines = [head] + [f"  logs: {problem}; the findings are on what could be read (up to step {result.steps})"
                          for problem in result.problems]
        lines += [f.render() for f in result.findings] if result.findings else ["  no findings"]
        lines += [f"  printed during the run at step {step}, no longer holds on all {result.steps} steps: {said}"
                  for step, said in result.gone]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def preflight(resolved: ResolvedConfig) -> Estimate:
    """The pre-flight estimate of ``resolved``'s run (none of its models is built)."""
    return estimate(resolved)
