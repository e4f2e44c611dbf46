"""The share of a run's time its evaluations took, read from the run's TensorBoard scalars.

    python benchmarks/eval_share.py runs/smollm2-arith          # every run at or under the paths

Per run: the seconds of its training steps (``timing/step_s``; with ``logging.log_every`` > 1
only some steps are logged, so their mean times the last step), the seconds of its
evaluations (``timing/eval_s``, every evaluation is logged), how many evaluations ran, and the
share ``eval / (train + eval)``. Start-up, checkpoints and logging are in neither.

How ``eval.*`` sets that share (docs/tasks.md, "What evaluation costs"): one evaluation
generates ``eval.size × (1 + eval.n)`` completions (greedy and sampled), a run evaluates
``total_steps / eval.every`` times (+1 with ``eval.at_start``), so the share is about
``E·t_eval / (E·t_eval + total_steps·t_step)``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from rlzoo.analysis.runs import find_runs
from rlzoo.core.events import read_scalars


@dataclass(frozen=True)
class EvalShare:
    """One run's training and evaluation seconds."""

    run_dir: Path
    train_s: float
    eval_s: float
    evaluations: int

    @property
    def share(self) -> float:
        """Evaluation's share of the run's step and evaluation time (0 without either)."""
        total = self.train_s + self.eval_s
        return self.eval_s / total if total else 0.0


def eval_share(run_dir: Path) -> EvalShare:
    """Read ``run_dir``'s scalars (see the module docstring)."""
    curves = read_scalars(run_dir)
    steps = curves.get("timing/step_s", [])
    train_s = sum(v for _, v in steps) / len(steps) * steps[-1][0] if steps else 0.0
    evals = curves.get("timing/eval_s", [])
    return EvalShare(run_dir=run_dir, train_s=train_s, eval_s=sum(v for _, v in evals), evaluations=len(evals))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="run directories, or directories holding runs")
    args = parser.parse_args(argv)
    print("| run | train s | eval s | evaluations | eval share |")
    print("|---|---|---|---|---|")
    for run in find_runs(args.paths):
        found = eval_share(run)
        print(f"| {run} | {found.train_s:.0f} | {found.eval_s:.0f} | {found.evaluations} | {found.share:.1%} |")


if __name__ == "__main__":
    main()
