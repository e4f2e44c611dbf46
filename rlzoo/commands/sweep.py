"""``rlzoo sweep``: the cartesian product of comma-separated override values, one run each.

``rlzoo sweep algo=grpo,dr_grpo,rloo seed=0,1,2 trainer.total_steps=200`` runs 9
trainings, each in ``runs/<sweep-name>/<run-name>/`` with a run name built from the swept
values (``algo-grpo_seed-0``). Every combination's config is resolved before the first
run starts, so a typo fails at once; the sweep then writes TensorBoard's hparams
experiment summary for all its runs into the sweep directory. Runs are separate processes
(``python -m rlzoo train``), sequential or ``--jobs N`` at a time; each run's progress
lines (a tenth of its steps each) are relayed prefixed with its name, its full output goes
to its ``train.log``. Re-running the sweep skips completed runs and resumes interrupted
ones from their last checkpoint.

A SIGINT or SIGTERM to the sweep is forwarded to the runs it is running (each runs in a
session of its own, so a terminal's Ctrl-C reaches the sweep only and each run gets the
signal once); they finish their step and write a checkpoint, no further run starts, and
the sweep waits for them and exits 0 (130 after a second Ctrl-C, which aborts them). A
run whose sweep dies gets SIGTERM (Linux), so no run trains on unwatched.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rlzoo.analysis.comparison import check_options
from rlzoo.analysis.report import difference_line, percent
from rlzoo.analysis.sequential import MAX_SEEDS, SequentialDesign
from rlzoo.commands.compare import read_comparison
from rlzoo.plan.planner import load_config
from rlzoo.core.errors import ConfigError
from rlzoo.contract.registry import Registry
from rlzoo.config.resolved import ResolvedConfig
from rlzoo.run.rundir import CONFIG_FILE, SWEEP_FILE, check_not_a_run, check_output_dir, read_status, run_files
from rlzoo.core.stopping import STOP_SIGNALS, die_with_parent, send_signal, write_now
from rlzoo.plan.hparams import effective_hparams
from rlzoo.run.tracking import ALGORITHM_KEYS, hparam_metrics, write_experiment

RELAYED = ("rlzoo: step ", "rlzoo: error", "rlzoo: evaluation")
"""Lines of a run's output the sweep repeats on its own output (prefixed with the run)."""

STOPPED_CODES = (130, -signal.SIGINT, -signal.SIGTERM)
"""Exit codes of a run stopped by a signal the sweep forwarded (before it could catch it, or
aborted by a second Ctrl-C)."""


@dataclass(frozen=True)
class SweepRun:
    """One combination: its name, directory and the overrides that define it."""

    name: str
    run_dir: Path
    overrides: tuple[str, ...]


def split_values(value: str) -> list[str]:
    """Split ``a,b,[c,d],{e: f}`` on top-level commas (not inside brackets or braces)."""
    parts, depth, current = [], 0, ""
    for ch in value:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-") or "x"


def expand(overrides: list[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """Separate fixed overrides from swept ones (``key=v1,v2``).

    :raises ConfigError: an item that is not ``key=value``, an empty swept value, or a key
        given twice (``seed=0,1 seed=2,3`` would run duplicates under misleading names:
        give its values once, ``seed=0,1,2,3``).
    """
    fixed, swept = [], []
    seen: dict[str, str] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, value = item.split("=", 1)
        if key.strip() in seen:
            raise ConfigError(f"sweep key {key.strip()!r} is given twice ({seen[key.strip()]!r} and {item!r}); give "
                              f"it once, all its values comma-separated: {key.strip()}=a,b,c")
        seen[key.strip()] = item
        values = split_values(value)
        if len(values) > 1:
            if any(v == "" for v in values):
                raise ConfigError(f"sweep values of {key!r} contain an empty item: {value!r}")
            swept.append((key, values))
        else:
            fixed.append(item)
    return fixed, swept


def plan(sweep_dir: Path, overrides: list[str]) -> list[SweepRun]:
    """All runs of the sweep, in a stable order."""
    fixed, swept = expand(overrides)
    for key in ("run_dir", "run_name", "resume"):
        if any(item.split("=", 1)[0] == key for item in fixed) or any(k == key for k, _ in swept):
            raise ConfigError(f"{key} is set by rlzoo sweep for each run; do not pass it")
    runs = []
    combos = itertools.product(*[[(key, v) for v in values] for key, values in swept]) if swept else [()]
    for combo in combos:
        name = "_".join(f"{_slug(key.split('.')[-1])}-{_slug(value)}" for key, value in combo) or "run"
        items = tuple(fixed) + tuple(f"{key}={value}" for key, value in combo)
        runs.append(SweepRun(name=name, run_dir=sweep_dir / name, overrides=items))
    if len({r.name for r in runs}) != len(runs):
        raise ConfigError("two sweep combinations map to the same run name; use distinct values")
    return runs


def validate(runs: list[SweepRun], registry: Registry, config_file: str | None) -> list[ResolvedConfig]:
    """Resolve every combination's config (raises :class:`ConfigError` on the first bad one)."""
    resolved = []
    for run in runs:
        try:
            resolved.append(load_config(registry, list(run.overrides), config_file))
        except ConfigError as exc:
            raise ConfigError(f"sweep run {run.name!r}: {exc}") from exc
    return resolved


def write_sweep_experiment(sweep_dir: Path, resolved: list[ResolvedConfig], swept: list[str]) -> None:
    """TensorBoard's hparams experiment for the whole sweep: every run's effective
    hparams, the metrics of every run, and ``differs`` on what the sweep varied: the swept
    keys (everything under them) and the :data:`rlzoo.run.tracking.ALGORITHM_KEYS` whose
    values differ. Keys that differ only as a consequence (a preset's settings, the
    parameters of a component that differs) are listed unmarked, so the five columns
    TensorBoard shows first are the ones that explain the runs."""
    metrics = list(dict.fromkeys(tag for r in resolved for tag in hparam_metrics(r.plan)))
    shown = ALGORITHM_KEYS + tuple(pattern for key in swept for pattern in (key, key + "."))
    write_experiment(sweep_dir, [effective_hparams(r.cfg, r.plan) for r in resolved], metrics, shown)


def _command(run: SweepRun, config_file: str | None) -> list[str]:
    """Resume the run when it has started (``resume=`` also redoes a start cut off before
    its first checkpoint; the combination's overrides are passed again, so a sweep whose
    settings changed since is refused with the differences), else start it; leftovers of a
    start cut off before it wrote its config are deleted (``--overwrite``)."""
    cmd = [sys.executable, "-m", "rlzoo", "train"]
    if config_file:
        cmd += ["--config", config_file]
    if (run.run_dir / CONFIG_FILE).is_file():
        return cmd + [*run.overrides, f"resume={run.run_dir}", "logging.progress=false"]
    if run_files(run.run_dir):
        cmd.append("--overwrite")
    return cmd + [*run.overrides, f"run_dir={run.run_dir}", f"run_name={run.name}",
                  "logging.progress=false"]


class _Children:
    """The sweep's running runs, and the stop signals it received (forwarded to them).

    While installed (``with _Children() as children:``, main thread only), SIGINT and
    SIGTERM are recorded and forwarded to every running child; a second SIGINT is forwarded
    too (the children abort). :attr:`stopping`: start no further run."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: set[subprocess.Popen] = set()
        self.received: list[int] = []
        self._previous: dict[int, object] = {}

    @property
    def stopping(self) -> bool:
        return bool(self.received)

    @property
    def aborted(self) -> bool:
        return self.received.count(signal.SIGINT) > 1

    def __enter__(self) -> "_Children":
        for sig in STOP_SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._forward)
            except ValueError:  # not the main thread: signals reach the caller
                break
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if self.stopping and sig == signal.SIGTERM else handler)

    def _forward(self, signum: int, frame: object) -> None:
        if signum in self.received and signum != signal.SIGINT:
            return  # more SIGTERMs change nothing
        self.received.append(signum)
        if len(self.received) == 1:
            write_now(f"sweep: {signal.Signals(signum).name} received; the running runs finish their step and "
                      "write a checkpoint, no further run starts\n")
        send_signal([child.pid for child in list(self.running)], signum)

    def start(self, command: list[str], env: dict[str, str]) -> subprocess.Popen | None:
        """Start a run (its own session, SIGTERM when the sweep dies), or None when stopping."""
        with self.lock:
            if self.stopping:
                return None
            child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                     bufsize=1, start_new_session=True, preexec_fn=die_with_parent)
            self.running.add(child)
            return child

    def done(self, child: subprocess.Popen) -> None:
        with self.lock:
            self.running.discard(child)


def check_sweep_dir(sweep_dir: Path, jobs: int) -> None:
    """:raises ConfigError: ``--jobs`` below 1, or a ``--dir`` that is a file, lies under one,
    cannot be written, or is a run directory (the sweep's runs would go inside that run)."""
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    check_not_a_run(sweep_dir, "--dir", "a sweep writes its runs into a directory of their own: choose another --dir")
    check_output_dir(sweep_dir, "--dir")


def run_sweep(sweep_dir: Path, overrides: list[str], registry: Registry, config_file: str | None = None,
              jobs: int = 1, runs: list[SweepRun] | None = None) -> list[tuple[SweepRun, str]]:
    """Run (or skip, or resume) every combination (or only ``runs``, some of them); returns
    ``(run, outcome)`` pairs.

    Outcomes: ``skipped`` (already completed), ``completed``, ``interrupted`` (stopped by a
    signal after writing a checkpoint: the next sweep resumes it), ``not started`` (the
    sweep was stopped first), ``aborted`` (a second Ctrl-C), ``failed (exit N)``.
    """
    check_sweep_dir(sweep_dir, jobs)
    runs = plan(sweep_dir, overrides) if runs is None else runs
    for run in runs:
        check_output_dir(run.run_dir, f"the run directory of sweep run {run.name!r}")
    resolved = validate(runs, registry, config_file)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / SWEEP_FILE).write_text(" ".join(overrides) + "\n")
    write_sweep_experiment(sweep_dir, resolved, [key for key, _ in expand(overrides)[1]])

    children = _Children()

    def execute(run: SweepRun) -> tuple[SweepRun, str]:
        status = read_status(run.run_dir)
        if status and status["status"] == "completed":
            return run, "skipped"
        if children.stopping:
            return run, "not started"
        run.run_dir.mkdir(parents=True, exist_ok=True)
        log = run.run_dir / "train.log"
        start = time.perf_counter()
        env = {**os.environ}
        if jobs > 1:
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
        with open(log, "a") as handle:
            child = children.start(_command(run, config_file), env)
            if child is None:
                return run, "not started"
            print(f"[{run.name}] started", flush=True)
            try:
                assert child.stdout is not None
                for line in child.stdout:
                    handle.write(line)
                    if line.startswith(RELAYED):
                        print(f"[{run.name}] {line.removeprefix('rlzoo: ').rstrip()}", flush=True)
                code = child.wait()
            finally:
                children.done(child)
        status = read_status(run.run_dir) or {}
        if code != 0 and children.stopping and code in STOPPED_CODES:  # stopped before it could checkpoint
            outcome = "aborted" if children.aborted else "interrupted"
        elif code != 0:
            outcome = f"failed (exit {code}, see {log})"
        else:
            outcome = "completed" if status.get("status") == "completed" else "interrupted"
        print(f"[{run.name}] {outcome} in {time.perf_counter() - start:.0f} s", flush=True)
        return run, outcome

    print(f"sweep: {len(runs)} runs in {sweep_dir}", flush=True)
    with children:
        if jobs == 1:
            return [execute(run) for run in runs]
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(execute, runs))


# ----------------------------------------------------------------------------- --until-resolved


def _first_seeds(overrides: list[str]) -> list[int]:
    """The first round's seeds (``seed=0,1``).

    :raises ConfigError: ``seed`` is not swept over at least two integers, or no other key is swept.
    """
    swept = dict(expand(overrides)[1])
    values = swept.get("seed", [])
    try:
        seeds = [int(v) for v in values]
    except ValueError:
        raise ConfigError(f"--until-resolved adds integer seeds; seed={','.join(values)} has others") from None
    if len(seeds) < 2:
        raise ConfigError("--until-resolved adds seeds to a first round: give it at least two, e.g. seed=0,1")
    if len(swept) < 2:
        raise ConfigError("--until-resolved compares groups: sweep a key besides seed (e.g. algo=grpo,rloo)")
    return seeds


def _group_key(run: SweepRun) -> tuple[str, ...]:
    """A run's combination without its seed: the group it belongs to."""
    return tuple(item for item in run.overrides if not item.startswith("seed="))


def _select(sweep_dir: Path, overrides: list[str], wanted: dict[tuple[str, ...], list[int]]) -> list[SweepRun]:
    """The runs of each group's seeds, named as the sweep over all of them would name them."""
    every = sorted({s for seeds in wanted.values() for s in seeds})
    spread = [item if not item.startswith("seed=") else f"seed={','.join(map(str, every))}" for item in overrides]
    return [run for run in plan(sweep_dir, spread)
            if int(next(i for i in run.overrides if i.startswith("seed=")).split("=", 1)[1])
            in wanted.get(_group_key(run), [])]


def until_resolved(sweep_dir: Path, overrides: list[str], registry: Registry, config_file: str | None, jobs: int,
                   max_seeds: int | None, baseline: list[str] | None, metric: str,
                   min_effect: float | None) -> list[tuple[SweepRun, str]]:
    """``rlzoo sweep --until-resolved``: run the first round, then add one seed to the
    baseline and to each group whose difference to it is not resolved yet, until every
    difference is resolved or the groups have ``max_seeds`` seeds (default
    :data:`rlzoo.analysis.sequential.MAX_SEEDS`); each look's intervals are
    :class:`rlzoo.analysis.sequential.SequentialDesign`'s. Prints where it stands after each
    round; returns the last round's ``(run, outcome)`` pairs.

    :raises ConfigError: what :func:`run_sweep` refuses, seeds that cannot be added, a
        ``max_seeds`` below the first round's seeds, a bad ``--baseline`` or ``--min-effect``.
    """
    check_sweep_dir(sweep_dir, jobs)
    check_options(metric, min_effect)
    seeds = _first_seeds(overrides)
    try:
        design = SequentialDesign(first=len(seeds), max_seeds=max_seeds or MAX_SEEDS)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    wanted = {_group_key(run): list(seeds) for run in plan(sweep_dir, overrides)}
    validate(_select(sweep_dir, overrides, {key: [*seeds, max(seeds) + 1] for key in wanted}),
             registry, config_file)  # an added seed that would fail fails now, not after hours
    print(f"sweep: --until-resolved: {design.describe()}", flush=True)
    done: dict[tuple[str, ...], str] = {}
    for look in range(1, design.looks + 1):
        runs = _select(sweep_dir, overrides, wanted)
        results = run_sweep(sweep_dir, overrides, registry, config_file, jobs, runs=runs)
        if any(outcome not in ("completed", "skipped") for _, outcome in results):
            return results
        _, comparison = read_comparison([run.run_dir for run in runs], baseline=baseline, metric=metric,
                                        min_effect=min_effect, level=design.level)
        baseline = baseline or [f"{key}={value}" for key, value in comparison.baseline.values.items()]
        key_of = {run.run_dir: _group_key(run) for run in runs}
        base_key = key_of[comparison.baseline.runs[0].run_dir]
        print(f"sweep: look {look} of at most {design.looks} ({len(wanted[base_key])} seeds for the baseline "
              f"{comparison.baseline.label}; intervals at {percent(design.level)}):", flush=True)
        for diff in (d for d in comparison.differences if d.metric.summary == "final"):
            key = key_of[diff.group.runs[0].run_dir]
            if diff.resolved and key not in done:
                done[key] = f"resolved at look {look} with {len(diff.group.runs)} seeds"
            print(f"  {difference_line(diff)}" + (f" [{done[key]}]" if key in done else ""), flush=True)
        open_keys = [key for key in wanted if key != base_key and key not in done]
        if not open_keys:
            print(f"sweep: every difference to {comparison.baseline.label} is resolved", flush=True)
            return results
        if look == design.looks:
            print(f"sweep: the budget of {design.max_seeds} seeds per group is spent; {len(open_keys)} difference(s) "
                  "not resolved", flush=True)
            return results
        extra = max(s for group in wanted.values() for s in group) + 1
        for key in [base_key, *open_keys]:
            wanted[key].append(extra)
        print(f"sweep: adding seed {extra} to {len(open_keys) + 1} group(s)", flush=True)
    return results
