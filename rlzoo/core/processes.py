"""Runs sharing one machine's cores: a registry of the torch threads each CPU run uses, and
how busy the cores are with other work.

CPU runs whose torch threads together exceed the cores they may use all slow down many
times over, far beyond their share of the cores (each thread spin-waits for threads that
are not running). Each CPU run records its pid,
its process start time and its thread count in a file of :data:`REGISTRY`; a run that finds
the live runs' threads (its own included) above its usable cores warns once, naming the
fix (``trainer.threads=1``, or fewer runs at a time). Records of dead processes are
removed by whoever finds them. Other programs keep no record: :func:`busy_cores` reads how
many cores' worth of work besides this process ran over a short window (Linux ``/proc/stat``),
and :func:`machine_busy` warns a run of several threads that they will not all get a core.
Nothing here changes what a run computes.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
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


BUSY_WINDOW_S = 0.2
"""How long :func:`busy_cores` watches the machine (a run pays it once, at its start, and only
when it computes with more than one thread)."""

BUSY_FLOOR = 0.5
"""Cores' worth of other work below which :func:`machine_busy` says nothing (a shell, a
browser tab, a test runner between tests)."""


def _cpu_ticks() -> tuple[int, int] | None:
    """``(busy, total)`` clock ticks of every core since boot (``/proc/stat``), None where unreadable."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _own_ticks() -> int | None:
    """User + system clock ticks of this process, all its threads (``/proc/self/stat``)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


def busy_cores(window_s: float = BUSY_WINDOW_S) -> float | None:
    """How many cores' worth of work *other* processes did over the next ``window_s`` seconds
    (the machine's busy ticks minus this process's, over its total ticks, times its cores);
    None where ``/proc`` cannot be read (not Linux)."""
    before, own_before = _cpu_ticks(), _own_ticks()
    time.sleep(window_s)
    after, own_after = _cpu_ticks(), _own_ticks()
    if before is None or after is None or own_before is None or own_after is None:
        return None
    return other_work(before, after, own_after - own_before, os.cpu_count() or 1)


def other_work(before: tuple[int, int], after: tuple[int, int], own: int, cores: int) -> float:
    """Cores' worth of other processes' work between two :func:`_cpu_ticks` readings, this
    process having used ``own`` ticks meanwhile, on a machine of ``cores`` cores."""
    total = after[1] - before[1]
    if total <= 0:
        return 0.0
    return max(0.0, (after[0] - before[0] - own) / total * cores)


def machine_busy(threads: int, busy: float | None) -> str | None:
    """The warning for a run of ``threads`` torch threads when other work (``busy`` cores'
    worth, :func:`busy_cores`) leaves its threads fewer cores than they are; None when they
    fit, when ``busy`` is under :data:`BUSY_FLOOR` or unknown, or for one thread (nothing to advise)."""
    cores = usable_cores()
    if threads <= 1 or busy is None or busy < BUSY_FLOOR or threads + busy <= cores + BUSY_FLOOR:
        return None
    return (f"the machine's cores are busy with other work (about {busy:.1f} of its {os.cpu_count() or 1} cores "
            f"over {BUSY_WINDOW_S:g} s before this run started), so this run's {threads} torch threads will wait "
            f"for each other, many times slower than alone; trainer.threads=1 (or trainer.threads=N with N + the "
            f"busy cores <= {cores})")
