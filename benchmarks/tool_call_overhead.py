"""What a safe tool's call costs now that a call past its limit is stopped (issue 37 item 26;
docs/agents.md, "What can go wrong").

Calls the built-in ``calculator`` tool on ``12*34`` three ways, in shuffled rounds, ``--calls``
times each: :func:`rlzoo.agents.sandbox.run_in_thread` (how a safe tool runs: a thread
stopped at its limit), the thread as it was before the stop existed (``join`` and drop),
and in a child forked per call and killed at the limit (the alternative that was measured
and not taken), in a process that holds what a trainer holds: torch imported and, with
``--hold-mb``, that many MiB of CPU tensors (a fork copies the page tables of all of it).
Prints a Markdown table of the median and 90th-percentile milliseconds per call::

    python benchmarks/tool_call_overhead.py --calls 200 --hold-mb 0 1024
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import threading
import time
from typing import Any, Callable

import torch

from rlzoo.agents.sandbox import _outcome, run_in_thread
from rlzoo_plugins.tools import calculator


def thread_before(name: str, fn: Callable[..., Any], arguments: dict[str, Any], timeout_s: float) -> tuple[str, bool]:
    """The safe-tool call before the stop: a thread joined for ``timeout_s``, never stopped."""
    outcome: list[tuple[str, bool]] = []
    thread = threading.Thread(target=lambda: outcome.append(_outcome(name, fn, arguments)), daemon=True)
    thread.start()
    thread.join(timeout_s)
    return outcome[0]


def fork_per_call(name: str, fn: Callable[..., Any], arguments: dict[str, Any], timeout_s: float) -> tuple[str, bool]:
    """The alternative: the call in a child forked for it, its result as JSON over a pipe,
    the child reaped before returning (a timeout would kill it; not exercised here)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write_fd, json.dumps(_outcome(name, fn, arguments)).encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        observation, is_error = json.loads(pipe.read())
    os.waitpid(pid, 0)
    return observation, is_error


RUNNERS = {"thread, stopped at its limit (now)": run_in_thread, "thread, never stopped (before)": thread_before,
           "fork per call (not taken)": fork_per_call}


def per_call_ms(calls: int) -> dict[str, list[float]]:
    """Milliseconds of each call, by runner (each round runs every runner once, in a shuffled
    order: a call right after a fork pays for the child's exit)."""
    times: dict[str, list[float]] = {label: [] for label in RUNNERS}
    order = list(RUNNERS.items())
    rng = random.Random(0)
    for _ in range(calls):
        rng.shuffle(order)
        for label, runner in order:
            start = time.perf_counter()
            assert runner("calculator", calculator, {"expression": "12*34"}, 5.0) == ("408", False)
            times[label].append((time.perf_counter() - start) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--hold-mb", type=int, nargs="+", default=[0, 1024])
    args = parser.parse_args()
    held: list[torch.Tensor] = []
    print("| CPU memory held besides torch | runner | median ms/call | p90 ms/call |\n|---|---|---|---|")
    for mb in sorted(args.hold_mb):
        extra = mb - sum(t.numel() * 4 for t in held) // 2**20
        if extra > 0:
            held.append(torch.ones(extra * 2**20 // 4))  # written: resident pages, as a model's weights are
        for label, times in per_call_ms(args.calls).items():
            p90 = statistics.quantiles(times, n=10)[-1]
            print(f"| {mb} MiB | {label} | {statistics.median(times):.2f} | {p90:.2f} |", flush=True)


if __name__ == "__main__":
    main()
