"""Runs sharing one machine's cores: a registry of the torch threads each CPU run uses.

CPU runs whose torch threads together exceed the cores they may use all slow down many
times over, far beyond their share of the cores (each thread spin-waits for threads that
are not running). Each CPU run records its pid,
its process start time and its thread count in a file of :data:`REGISTRY`; a run that finds
the live runs' threads (its own included) above its usable cores warns once, naming the
fix (``trainer.threads=1``, or fewer runs at a time). Records of dead processes are
removed by whoever finds them. Nothing here changes what a run computes.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

WAIT_POLICY = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "3000"}
"""How rlzoo's commands make torch's OpenMP threads wait, unless the environment says:
passive (sleep, not spin), after a short spin of 3000 iterations (libgomp, the OpenMP
runtime of torch's Linux wheels, reads ``GOMP_SPINCOUNT``; other runtimes ignore it)."""


def share_cores_politely() -> None:
    """Set :data:`WAIT_POLICY` unless the environment sets ``OMP_WAIT_POLICY`` or
    ``GOMP_SPINCOUNT`` itself. Call before torch is imported (the OpenMP runtime reads them
    once, when torch loads it); child processes (torchrun ranks, the async generator, a
    sweep's runs) inherit them.

    A waiting thread that spins long (libgomp's default: 300,000 iterations, ~3 ms) burns the
    share of the cores a run gets beside other work; one that never spins (passive alone)
    sleeps and wakes between every small operation. Measured on 2 cores with
    ``benchmarks/busy_machine.py`` (docs/training.md, "A shared machine"), the default run
    against ``trainer.threads=1``: idle 0.98x (libgomp's default 0.95x, passive alone 1.34x),
    beside 2 busy processes 1.29x (libgomp's default 2.37x), beside 4 1.43x (2.89x).
    """
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ.update(WAIT_POLICY)


REGISTRY = Path(tempfile.gettempdir()) / f"rlzoo-{os.getuid() if hasattr(os, 'getuid') else 'user'}" / "threads"
"""Directory of the records, one file per run process, named by its pid."""


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (Linux ``/proc``), which tells a process from a
    later one that reuses its pid; None where it cannot be read."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return start is None or _start_time(pid) in (None, start)


def register(threads: int, registry: Path | None = None, pid: int | None = None) -> Path | None:
    """Record that process ``pid`` (default: this one) computes with ``threads`` torch
    threads; returns the record (None when the registry cannot be written: the check is
    advice, never a reason to fail)."""
    pid, registry = os.getpid() if pid is None else pid, registry or REGISTRY
    record = registry / str(pid)
    try:
        registry.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"threads": int(threads), "start": _start_time(pid)}))
    except OSError:
        return None
    return record


def unregister(record: Path | None) -> None:
    """Remove a record :func:`register` wrote (if any)."""
    if record is not None:
        try:
            record.unlink()
        except OSError:
            pass


def other_runs(registry: Path | None = None) -> dict[int, int]:
    """``{pid: threads}`` of the other live processes with a record; removes dead ones'."""
    found: dict[int, int] = {}
    try:
        records = list((registry or REGISTRY).iterdir())
    except OSError:
        return found
    for record in records:
        if not record.name.isdigit() or int(record.name) == os.getpid():
            continue
        try:
            entry = json.loads(record.read_text())
            threads, start = int(entry["threads"]), entry.get("start")
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or not ours to judge
        if _alive(int(record.name), start):
            found[int(record.name)] = threads
        else:
            unregister(record)
    return found


def oversubscription(threads: int, registry: Path | None = None) -> str | None:
    """The warning for a run computing with ``threads`` torch threads when the live runs'
    threads together exceed :func:`usable_cores`; None when they fit."""
    others, cores = other_runs(registry), usable_cores()
    total = threads + sum(others.values())
    if not others or total <= cores:
        return None
    listed = ", ".join(f"pid {pid}: {n}" for pid, n in sorted(others.items()))
    return (f"{len(others) + 1} rlzoo runs on this machine compute with {total} torch threads on {cores} cores "
            f"(this one {threads}; {listed}): each runs many times slower than it would alone; give each run "
            f"trainer.threads=N with the runs' N summing to at most {cores} (trainer.threads=1 always fits one "
            "run per core), or run them one after another")
