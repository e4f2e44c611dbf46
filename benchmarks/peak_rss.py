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

import resource
import sys


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
