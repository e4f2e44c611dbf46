"""This process's peak resident memory, read one way by every benchmark.

``VmHWM`` of ``/proc/self/status``: the peak of this process's own address space since its
``exec``. Not ``getrusage(RUSAGE_SELF).ru_maxrss``: Linux carries the parent's resident size at
the fork into the child's ``ru_maxrss`` across ``exec``, so a benchmark's child process would
read at least what its parent held when it started it (compare_trl.py's workers read 879 MB,
the parent's, for all three systems of the tiny setting, 2026-11-28). Elsewhere than Linux,
``ru_maxrss`` (kilobytes on Linux, bytes on macOS), with that floor.

A benchmark's child runs ``sys.path.insert(0, BENCHMARKS); from peak_rss import peak_rss_mb``
(this module imports nothing heavy, so the child's peak is its own work's).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import threading
import time


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB (2**20 bytes): ``VmHWM`` where Linux gives it."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def rss_mb(pid: int) -> float | None:
    """Process ``pid``'s current resident set size in MiB (``VmRSS``); None once it has exited
    or where ``/proc`` does not give it."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class RssCap:
    """Kills ``proc`` (SIGKILL) as soon as its resident size passes ``cap_mb`` MiB, polled every
    ``every_s`` seconds by a daemon thread, so that one benchmark worker cannot take a shared
    machine's memory; :attr:`killed_at_mb` is the size it was killed at (None: not killed)."""

    def __init__(self, proc: subprocess.Popen, cap_mb: float, every_s: float = 0.2) -> None:
        self.proc, self.cap_mb, self.every_s = proc, cap_mb, every_s
        self.killed_at_mb: float | None = None
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while self.proc.poll() is None:
            rss = rss_mb(self.proc.pid)
            if rss is not None and rss > self.cap_mb:
                self.killed_at_mb = rss
                os.kill(self.proc.pid, signal.SIGKILL)
                return
            time.sleep(self.every_s)
