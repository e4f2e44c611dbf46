"""How long the CLI's quick commands take to answer (issue 37 item 22; docs/training.md,
"A shared machine").

Times ``rlzoo --help``, ``list``, ``config``, ``explain`` and ``diff`` as a user runs them
(a fresh interpreter each, output discarded), alternating with ``python -c "import torch"``
as the reference measured in the same run, ``--reps`` times each; prints a Markdown table of
the median wall seconds, each command's median over the reference's, and the median CPU
seconds (user + system) of the process, which other work on the machine changes less::

    python benchmarks/cli_startup.py --reps 5
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

COMMANDS: dict[str, list[str]] = {
    "import torch": [sys.executable, "-c", "import torch"],
    "rlzoo --help": ["--help"],
    "rlzoo list": ["list"],
    "rlzoo config": ["config"],
    "rlzoo explain": ["explain"],
    "rlzoo diff algo=ppo algo=grpo": ["diff", "algo=ppo", "algo=grpo"],
}
"""Label -> argv (a bare argument list runs the ``rlzoo`` console script)."""


def timed(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one run of ``argv``, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    """Run every command ``--reps`` times, alternating, and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    rlzoo = shutil.which("rlzoo")
    if rlzoo is None:
        raise SystemExit("the rlzoo console script is not on PATH (pip install -e .)")
    argvs = {label: argv if argv[0] == sys.executable else [rlzoo, *argv] for label, argv in COMMANDS.items()}
    for argv in argvs.values():
        timed(argv)  # warm the file cache
    times: dict[str, list[tuple[float, float]]] = {label: [] for label in argvs}
    load_before = os.getloadavg()[0]
    for _ in range(args.reps):
        for label, argv in argvs.items():
            times[label].append(timed(argv))
    reference = statistics.median(wall for wall, _ in times["import torch"])
    print(f"median of {args.reps} runs, load average {load_before:.1f} at the start and {os.getloadavg()[0]:.1f} "
          f"at the end, {os.cpu_count()} cores\n")
    print("| command | median s | min s | median / import torch | median CPU s |")
    print("|---|---|---|---|---|")
    for label, values in times.items():
        walls = [wall for wall, _ in values]
        median = statistics.median(walls)
        cpu = statistics.median(cpu for _, cpu in values)
        print(f"| `{label}` | {median:.2f} | {min(walls):.2f} | {median / reference:.2f} | {cpu:.2f} |")


if __name__ == "__main__":
    main()
