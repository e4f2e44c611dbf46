"""What a finished run prints last: one summary line (steps, time, the training reward's first and
last tenth, the held-out accuracy at the end, and how many findings ``rlzoo doctor`` reports for
the run) and where to go next."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from rlzoo.core.tags import Tag
from rlzoo.diagnostics.detectors import diagnose
from rlzoo.diagnostics.flat_start import constant_at_start
from rlzoo.diagnostics.run_record import RunRecord, load_run
from rlzoo.diagnostics.thresholds import limit
from rlzoo.run.checkpoint import CHECKPOINT_DIR, checkpoint_name


def heldout_text(run: RunRecord) -> str | None:
    """The held-out greedy accuracy at the run's last evaluation, in words, or ``None`` without
    evaluation. It is not presented as an achievement when the run's first steps scored every
    completion alike at the success level (a random policy scores it too), or when the
    evaluation before the first step (``eval.at_start``) was as high within two standard
    errors."""
    points = [(s, v) for s, v in run.scalars.get(Tag.EVAL_ACCURACY, []) if math.isfinite(v)]
    if not points:
        return None
    step, accuracy = points[-1]
    text = f"held-out greedy accuracy {accuracy:.3f} (step {step})"
    constant = constant_at_start(run)
    if constant is not None and accuracy >= limit("success_share"):
        return text + " - no achievement: every completion scored the same from the first step, so a random policy " \
                      "scores it too"
    before = [v for s, v in points if s == 0]
    if before and step > 0:
        size = max(1, int(run.setting("eval.size", 128) or 128))
        error = math.sqrt((before[0] * (1 - before[0]) + accuracy * (1 - accuracy)) / size)
        if accuracy - before[0] <= limit("heldout_sigmas") * error:
            return text + f" - no better than the initial policy's {before[0]:.3f} (step 0)"
        return text + f", from {before[0]:.3f} at step 0"
    return text


def summary_line(run_dir: Path) -> str:
    """One line about a finished run: steps, time, mean reward of the first and last 10%, the
    held-out accuracy at the end (:func:`heldout_text`) and the number of ``rlzoo doctor``'s
    findings (the same detectors on the same files)."""
    run = load_run(run_dir)
    rewards = [v for _, v in run.scalars.get(Tag.REWARD, [])]
    if not rewards:
        return f"rlzoo: run finished; logs in {run_dir}"
    tail = max(1, len(rewards) // 10)
    seconds = sum(v for _, v in run.scalars.get(Tag.STEP_S, []))
    findings = diagnose(run)
    warnings = sum(finding.level == "warning" for finding in findings)
    heldout = heldout_text(run)
    doctor = (f"doctor: {len(findings)} finding{'s' if len(findings) != 1 else ''}"
              + (f" ({warnings} warning{'s' if warnings != 1 else ''})" if warnings != len(findings) else "")
              + (f" (rlzoo doctor {run_dir})" if findings else ""))
    return (f"rlzoo: {len(rewards)} steps in {seconds:.0f} s of training; reward/mean "
            f"{np.mean(rewards[:tail]):.3f} (first 10%) -> {np.mean(rewards[-tail:]):.3f} (last 10%); "
            + (f"{heldout}; " if heldout else "") + f"{doctor}; logs: tensorboard --logdir {run_dir}")


def next_steps(run_dir: Path, step: int) -> str:
    """What a finished run prints last: where its checkpoints are and what to run next."""
    return (f"rlzoo: checkpoints in {run_dir / CHECKPOINT_DIR} (the newest, {checkpoint_name(step)}/policy, is a model "
            f"directory: model.path=); next: `rlzoo compare {run_dir}` (table and curves), or train on with "
            f"`rlzoo train resume={run_dir} trainer.total_steps={2 * step}`")
