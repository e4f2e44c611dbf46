"""Reproduce the learning curves in docs/training.md.

    python benchmarks/learning_curves.py --out docs/images

Runs, one after the other, as separate processes:

- ``rlzoo train`` (the embedded default: GRPO on 4-digit sorting from random init);
- ``rlzoo train algo=ppo`` (critic + GAE, adaptive KL in the reward) on the same task;
- ``rlzoo train trainer.precision=bf16``: the default in bfloat16 mixed precision;
- ``rlzoo train task.num_digits=6 ...`` for 2 minutes of wall time: 6-digit sorting from
  random init, the setting where TRL's GRPOTrainer reaches ~0.3-0.4 on this machine.

It prints the wall time and the mean reward of the first and last 10% of steps of each,
and plots them from the runs' TensorBoard logs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from rlzoo.core.events import read_scalars
from plots import plot_runs

RUNS = {
    "grpo (default)": [],
    "ppo": ["algo=ppo"],
    "grpo-bf16 (trainer.precision=bf16)": ["trainer.precision=bf16"],
}
SIX_DIGITS = ["task.num_digits=6", "rollout.max_new_tokens=9", "trainer.total_steps=3000"]


def train(run_dir: Path, overrides: list[str], time_limit: float | None = None) -> float:
    cmd = [sys.executable, "-m", "rlzoo", "train", f"run_dir={run_dir}", "logging.progress=false",
           *overrides]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd)
    try:
        proc.wait(timeout=time_limit)
    except subprocess.TimeoutExpired:
        proc.send_signal(2)  # Ctrl-C: the run checkpoints and stops cleanly
        proc.wait()
    return time.perf_counter() - start


def describe(label: str, run_dir: Path, wall: float) -> str:
    rewards = [v for _, v in read_scalars(run_dir)["reward/mean"]]
    tail = max(1, len(rewards) // 10)
    first, last = np.mean(rewards[:tail]), np.mean(rewards[-tail:])
    return (f"| {label} | {len(rewards)} | {wall:.0f} | {first:.3f} | {last:.3f} | {last - first:+.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/images", help="where the PNGs go")
    parser.add_argument("--runs", default="runs/curves", help="where the runs go")
    args = parser.parse_args()
    root, out = Path(args.runs), Path(args.out)
    rows = ["| run | steps | wall time (s) | reward, first 10% | reward, last 10% | change |",
            "|---|---|---|---|---|---|"]
    dirs = {}
    for label, overrides in RUNS.items():
        run_dir = root / label.split()[0]
        wall = train(run_dir, overrides)
        dirs[label] = run_dir
        rows.append(describe(label, run_dir, wall))
    six = root / "sort6-2min"
    wall = train(six, SIX_DIGITS, time_limit=120)
    rows.append(describe("grpo, 6-digit sorting, 2 minutes", six, wall))
    plot_runs({k: v for k, v in dirs.items() if "bf16" not in k}, out / "default_curves.png",
              title="4-digit sorting from random init (reward/mean)")
    precision = {"grpo, fp32": dirs["grpo (default)"],
                 "grpo, bf16 mixed precision": dirs["grpo-bf16 (trainer.precision=bf16)"]}
    plot_runs(precision, out / "precision_curves.png",
              title="the default run in float32 and in bf16 mixed precision (reward/mean)")
    plot_runs({"grpo, 6 digits": six}, out / "sort6_2min.png",
              title="6-digit sorting from random init, 2 minutes (reward/mean)")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
