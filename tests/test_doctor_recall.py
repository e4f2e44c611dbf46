"""benchmarks/doctor_recall.py's bookkeeping: the committed listings are what the script builds,
and round 4's outcome criteria (a preset run is healthy when it learnt a tenth of the way and kept
it; a warning on one that is not is confirmed when its first fix lifts the reward 1.5x) by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark
from torch.utils.tensorboard import SummaryWriter

LISTINGS = Path(__file__).parents[1] / "benchmarks"


DR = load_benchmark("doctor_recall")
CONFIG = {"trainer": {"lr": 5e-4, "update_epochs": 1, "num_mini_batches": 1, "total_steps": 100, "warmup_steps": 0,
                      "lr_schedule": "constant", "max_grad_norm": 1.0},
          "rollout": {"n": 8, "max_new_tokens": 7, "temperature": 1.0, "top_p": 1.0, "staleness": 0},
          "kl": {"coef": 0.2, "apply": "reward", "controller": "fixed"}, "eval": {"threshold": 1.0, "size": 32},
          "rollout_correction": "none", "reward": None}


def _run(run_dir: Path, reward, steps: int = 100, **curves) -> Path:
    """A completed run whose reward/mean at step s is ``reward(s)`` (and other tags ``a__b``)."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(json.dumps(CONFIG))
    (run_dir / "status.json").write_text(json.dumps({"status": "completed", "step": steps, "total_steps": steps}))
    writer = SummaryWriter(str(run_dir))
    for step in range(1, steps + 1):
        writer.add_scalar("reward/mean", float(reward(step)), step)
        for tag, f in curves.items():
            writer.add_scalar(tag.replace("__", "/"), float(f(step)), step)
    writer.close()
    return run_dir


@pytest.mark.parametrize("which", ["round2", "round3", "round4", "round5"])
def test_the_committed_listing_is_the_set_the_script_builds(which: str) -> None:
    listing = (LISTINGS / f"doctor_recall_{which}.txt").read_text()
    assert listing == DR.split_text(DR.ROUNDS[which](), which)


def test_round4_lists_every_family_and_each_lr_too_high_run_has_its_healthy_twin() -> None:
    runs = DR.build_round4()
    families = {run.family for run in runs}
    assert families == {*DR.FAMILIES, "healthy"}
    assert sum(run.family != "healthy" for run in runs) >= 60 and sum(run.family == "healthy" for run in runs) >= 60
    assert all(DR.counterpart(run, runs) is not None for run in runs if run.family == "lr_too_high")
    assert {int(run.setting("seed")) for run in runs} == {10, 11, 12}      # seeds no earlier round used


def test_the_outcome_criterion_by_hand(tmp_path: Path) -> None:
    # 100 steps: windows of 10; first window 0.05, last 0.05 + 0.25 = 0.30, its best: healthy
    ok, figures = DR.outcome(_run(tmp_path / "learns", lambda s: 0.05 + 0.25 * min(1.0, max(0, s - 10) / 80)))
    assert ok and figures == "reward/mean 0.050 -> 0.300 (first 10 % to last), best window 0.300"
    # gains 0.09 of a success score of 1 (< HEALTHY_GAIN 0.1): not healthy
    assert not DR.outcome(_run(tmp_path / "slow", lambda s: 0.05 + 0.09 * (s > 50)))[0]
    # up by 0.25 at its best, then back to 0.70 of it (< HEALTHY_KEPT 0.8): not healthy
    fell = DR.outcome(_run(tmp_path / "fell", lambda s: 0.05 + (0.25 if 40 < s <= 80 else 0.125 * (s > 80))))
    assert not fell[0] and "best window 0.300" in fell[1]


def test_a_warning_is_confirmed_when_its_first_fix_lifts_the_reward_one_and_a_half_times(tmp_path: Path) -> None:
    # a preset run held by its KL (kl/grad_share 0.5, a flat reward): doctor's kl_pins_policy, fix kl.coef=...
    run = DR.Run("healthy-sort4-ppo-preset-s1", "healthy", ("algo=ppo", "seed=1"))
    _run(tmp_path / run.name, lambda s: 0.06, kl__grad_share=lambda s: 0.5)
    (candidate,) = DR._fix_candidates(tmp_path, [run])
    code, fix = candidate[1:]
    assert code == "kl_pins_policy" and fix.startswith("kl.coef=")
    assert DR.fix_report(tmp_path, [run]) == [f"{run.name}: kl_pins_policy, fix {fix}: not trained"]
    fixed = tmp_path / "fixed" / DR.fixed_run(run, fix).name
    _run(fixed, lambda s: 0.06 + 0.03 * (s > 50))     # last 10 %: 0.09 = 1.5 x 0.06
    assert DR.fix_report(tmp_path, [run])[0].endswith("0.060 -> 0.090 (confirmed)")
    shutil.rmtree(fixed)
    _run(fixed, lambda s: 0.06 + 0.02 * (s > 50))     # 0.08 < 1.5 x 0.06
    assert DR.fix_report(tmp_path, [run])[0].endswith("0.060 -> 0.080 (wrong)")
