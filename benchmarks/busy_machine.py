"""The default run on an idle and on a busy machine (issue 37 item 21; docs/training.md,
"A shared machine").

Runs ``rlzoo train`` (the embedded default, ``--steps`` steps, no evaluation or checkpoints
in between) under three thread settings, alternating, ``--reps`` times each:

- ``default``: what README command 1 runs (torch's thread count; the CLI sets
  ``OMP_WAIT_POLICY=PASSIVE``);
- ``threads=1``: ``trainer.threads=1``;
- ``active``: the default with ``OMP_WAIT_POLICY=ACTIVE`` (waiting threads spin for minutes);
- ``spin=N``: the default with ``GOMP_SPINCOUNT=N`` (torch's OpenMP runtime, libgomp: a waiting
  thread spins N times, then sleeps; ``spin=300000`` is libgomp's own default, what the
  default run was before the CLI chose a policy, and the passive policy spins 0 times).

``--load N`` starts N busy processes first (each spins one Python thread: another job on
the machine) and stops them at the end; ``--load 0`` measures the idle machine. Prints a
Markdown table of wall seconds per run and each setting's median over ``threads=1``'s
median, measured in the same run::

    python benchmarks/busy_machine.py --load 0 --steps 150
    python benchmarks/busy_machine.py --load 2 --steps 30
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS: dict[str, tuple[list[str], dict[str, str]]] = {
    "default": ([], {}),
    "threads=1": (["trainer.threads=1"], {}),
    "active": ([], {"OMP_WAIT_POLICY": "ACTIVE"}),
}
"""Setting -> (extra overrides, extra environment); ``spin=N`` settings are made on demand."""


def setting(name: str) -> tuple[list[str], dict[str, str]]:
    """The overrides and environment of setting ``name``."""
    if name.startswith("spin=") and name[5:].isdigit():
        return [], {"GOMP_SPINCOUNT": name[5:]}
    return SETTINGS[name]


def spin() -> None:
    """A busy process: one core's worth of pure-Python work, until killed."""
    x = 0
    while True:
        x = (x * 1103515245 + 12345) % 2**31


def run_once(name: str, steps: int, run_dir: Path) -> float:
    """Wall seconds of one ``rlzoo train`` of the default under setting ``name``."""
    overrides, env = setting(name)
    environ = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
    cmd = [sys.executable, "-m", "rlzoo", "train", f"trainer.total_steps={steps}", "eval.every=0",
           "logging.progress=false", "checkpoint.every=0", *overrides, f"run_dir={run_dir}"]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env={**environ, **env}, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    """Parse the arguments, run the settings alternating, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", type=int, default=2, help="busy processes beside the runs (0: idle)")
    parser.add_argument("--steps", type=int, default=30, help="training steps per run")
    parser.add_argument("--reps", type=int, default=2, help="runs per setting (alternating)")
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help="comma-separated: " + ", ".join(SETTINGS) + " or spin=N")
    args = parser.parse_args()
    settings = args.settings.split(",")
    unknown = [s for s in settings if s not in SETTINGS and not (s.startswith("spin=") and s[5:].isdigit())]
    if unknown:
        parser.error(f"unknown settings {unknown}; choose from {list(SETTINGS)} or spin=N")
    spinners = [mp.Process(target=spin, daemon=True) for _ in range(args.load)]
    for p in spinners:
        p.start()
    times: dict[str, list[float]] = {s: [] for s in settings}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(args.reps):
                for name in settings:
                    seconds = run_once(name, args.steps, Path(tmp) / f"{name}-{rep}")
                    times[name].append(seconds)
                    print(f"# {name} rep {rep}: {seconds:.1f} s, load {os.getloadavg()[0]:.1f}", file=sys.stderr,
                          flush=True)
    finally:
        for p in spinners:
            p.kill()
    reference = statistics.median(times["threads=1"]) if "threads=1" in times else None
    print(f"{args.steps} steps of the default run, {args.load} busy process(es), {os.cpu_count()} cores\n")
    print("| setting | wall s per run | median / threads=1 |")
    print("|---|---|---|")
    for name, values in times.items():
        ratio = f"{statistics.median(values) / reference:.2f}" if reference else "-"
        print(f"| {name} | {' / '.join(f'{v:.1f}' for v in values)} | {ratio} |")


if __name__ == "__main__":
    main()
