"""How long the CLI's quick commands take to answer (issue 37 item 22; docs/training.md,
"A shared machine").

Times ``rlzoo --help``, ``list``, ``config``, ``explain`` and ``diff`` as a user runs them
(a fresh interpreter each, output discarded), alternating with ``python -c "import torch"``
as the reference measured in the same run, ``--reps`` times each; prints a Markdown table of
the median wall seconds and each command's median over the reference's::

    python benchmarks/cli_startup.py --reps 5
"""

from __future__ import annotations

import argparse
import os
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


def timed(argv: list[str]) -> float:
    """Wall seconds of one run of ``argv``, which must succeed."""
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


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
    times: dict[str, list[float]] = {label: [] for label in argvs}
    for _ in range(args.reps):
        for label, argv in argvs.items():
            times[label].append(timed(argv))
    reference = statistics.median(times["import torch"])
    print(f"median of {args.reps} runs, load {os.getloadavg()[0]:.1f} at the end, {os.cpu_count()} cores\n")
    print("| command | median s | min s | median / import torch |")
    print("|---|---|---|---|")
    for label, values in times.items():
        median = statistics.median(values)
        print(f"| `{label}` | {median:.2f} | {min(values):.2f} | {median / reference:.2f} |")


if __name__ == "__main__":
    main()
