"""Throughput of the synchronous loop against ``rollout.mode=async``, one core each.

    python benchmarks/async_rollout.py --steps 60 --warmup 5 --rounds 3

Trains the default task and model (``rlzoo train`` with the defaults, ``eval.size=0``,
``checkpoint.every=0``), alternating, round by round, a synchronous run and an async run
(the first mode of each round alternates too) of ``--steps`` steps each, every process
with one torch thread (``trainer.threads=1``, ``OMP_NUM_THREADS=1``: the trainer on one
core, the async generator on the other). A run's throughput is its steps after
``--warmup`` divided by the sum of their ``timing/step_s`` (the logged time from asking
for a batch to the end of the update; process start-up, the generator's start-up and the
checkpoints at both ends are outside it). The table gives, per mode, the median over the
rounds of steps/s and of the median step time, the async runs' mean ``rollout/staleness``
and dropped batches, and the ratio async / sync of the medians. Only meaningful on an
otherwise idle machine with at least 2 cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run(mode: str, steps: int, run_dir: Path, extra: list[str]) -> dict[str, list[tuple[int, float]]]:
    """Train ``steps`` steps in ``mode`` in a fresh process; its logged scalars."""
    from rlzoo.core.events import read_scalars

    command = [sys.executable, "-m", "rlzoo", "train", f"rollout.mode={mode}", f"trainer.total_steps={steps}",
               "trainer.threads=1", "eval.size=0", "checkpoint.every=0", "logging.progress=false",
               f"run_dir={run_dir}", *extra]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return read_scalars(run_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5, help="first steps of each run left out")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--extra", nargs="*", default=[], help="more key=value overrides for every run")
    args = parser.parse_args()
    if args.steps <= args.warmup:
        raise SystemExit(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    rates: dict[str, list[float]] = {"sync": [], "async": []}
    step_s: dict[str, list[float]] = {"sync": [], "async": []}
    staleness: list[float] = []
    dropped: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for mode in (("sync", "async") if round_ % 2 == 0 else ("async", "sync")):
                curves = run(mode, args.steps, Path(tmp) / f"{mode}-{round_}", args.extra)
                times = [value for step, value in curves["timing/step_s"] if step > args.warmup]
                rates[mode].append(len(times) / sum(times))
                step_s[mode].append(statistics.median(times))
                if mode == "async":
                    staleness.extend(v for s, v in curves["rollout/staleness"] if s > args.warmup)
                    dropped.extend(v for s, v in curves["rollout/dropped"] if s > args.warmup)
                print(f"round {round_} {mode}: {rates[mode][-1]:.2f} steps/s, median step "
                      f"{step_s[mode][-1] * 1000:.0f} ms", flush=True)
    sync_rate, async_rate = statistics.median(rates["sync"]), statistics.median(rates["async"])
    print(f"\n| mode ({args.rounds} rounds of {args.steps} steps, first {args.warmup} left out) | steps/s | "
          "median step | mean staleness | dropped batches |")
    print("|---|---|---|---|---|")
    print(f"| sync | {sync_rate:.2f} | {statistics.median(step_s['sync']) * 1000:.0f} ms | 0 | 0 |")
    print(f"| async | {async_rate:.2f} | {statistics.median(step_s['async']) * 1000:.0f} ms | "
          f"{statistics.fmean(staleness):.2f} | {sum(dropped):.0f} |")
    print(f"\nasync / sync steps/s: {async_rate / sync_rate:.2f}x (cores usable: {len(os.sched_getaffinity(0))})")


if __name__ == "__main__":
    main()
