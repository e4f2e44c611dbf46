"""Recorded rollouts and ``rlzoo ab``: two learners on the identical batches."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import torch

from rlzoo.run import recording
from rlzoo.commands.ab import run_ab
from rlzoo.core.batch import RolloutBatch
from rlzoo.commands.cli import main
from zoo import TINY



def test_a_recorded_batch_reads_back_exactly(tmp_path: Path) -> None:
    batch = RolloutBatch(prompt_ids=torch.tensor([[0, 5], [3, 4]]), prompt_mask=torch.tensor([[0, 1], [1, 1]]),
                         response_ids=torch.tensor([[7, 2], [8, 0]]),
                         response_mask=torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
                         group_ids=torch.tensor([4, 4]), scores=torch.tensor([0.5, 1.0]),
                         truncated=torch.tensor([False, True]), prompts=["12=", "3="], completions=["7", "8"],
                         references=[(1, 2), "3"], rollout_logp=torch.tensor([[-0.5, -0.1], [-2.0, 0.0]]))
    batch.rewards = batch.rewards - 0.25                    # shaped rewards are what the learner saw
    recording.record(tmp_path, 7, batch)
    assert recording.recorded_steps(tmp_path) == [7]
    back = recording.load(tmp_path, 7)
    for name in recording.RECORDED:
        left, right = getattr(batch, name), getattr(back, name)
        assert (left is None and right is None) or torch.equal(left, right), name
    assert back.prompts == batch.prompts and back.references == [[1, 2], "3"]


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("ab") / "run"
    assert main(["train", *TINY, f"run_dir={run_dir}", "trainer.total_steps=3", "rollout.record=true"]) == 0
    assert recording.recorded_steps(run_dir) == [1, 2, 3]
    return run_dir


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"}


@pytest.mark.slow
def test_identical_sides_make_identical_updates_and_different_losses_diverge(recorded_run: Path,
                                                                              tmp_path: Path) -> None:
    before = _digest(recorded_run)
    same = run_ab(recorded_run, ["policy_loss=ppo_clip"], ["policy_loss=ppo_clip"], tmp_path / "same")
    assert same.steps == [1, 2, 3]
    assert all(abs(c - 1.0) < 1e-6 for c in same.series["ab/cosine"])
    assert all(kl < 1e-9 for kl in same.series["ab/kl_a_b"])
    assert same.series["ab/a/policy/loss"] == same.series["ab/b/policy/loss"]
    differ = run_ab(recorded_run, ["policy_loss=ppo_clip"], ["policy_loss=vanilla_pg"], tmp_path / "differ")
    assert all(c < 0.99999 for c in differ.series["ab/cosine"][1:])
    assert all(kl > 0 for kl in differ.series["ab/kl_a_b"])
    assert all(kl > 0 for kl in differ.series["ab/kl_recording_b"])
    assert (tmp_path / "differ" / "ab.png").is_file() and any((tmp_path / "differ").glob("events.out.tfevents.*"))
    assert _digest(recorded_run) == before                       # the recorded run is only read


EPISODES = ["env=guess", "rollout.max_new_tokens=48", "rollout.max_turn_tokens=16", "rollout.max_turns=3"]
"""A tiny multi-turn run (the guessing game on 3-digit sorting: integer answers, partial-credit
rewards, so updates are not zero) whose random policy ends most turns (a small alphabet, 16
tokens a turn), so its episodes hold environment tokens (the game's hints)."""


@pytest.mark.slow
def test_episodes_record_and_replay_with_kl_over_the_policy_tokens(tmp_path: Path) -> None:
    run_dir = tmp_path / "episodes"
    assert main(["train", *TINY, *EPISODES, f"run_dir={run_dir}", "trainer.total_steps=2", "rollout.record=true"]) == 0
    batch = recording.load(run_dir, 1)
    env_tokens = batch.response_mask - batch.loss_mask
    assert env_tokens.sum() > 0.05 * batch.response_mask.sum()     # the episodes hold environment tokens
    assert float((batch.rollout_logp * env_tokens).abs().sum()) == 0  # which carry no rollout log-prob
    same = run_ab(run_dir, ["policy_loss=ppo_clip"], ["policy_loss=ppo_clip"], tmp_path / "same")
    assert same.steps == [1, 2] and all(abs(c - 1.0) < 1e-6 for c in same.series["ab/cosine"])
    differ = run_ab(run_dir, ["policy_loss=ppo_clip"], ["policy_loss=vanilla_pg"], tmp_path / "differ")
    assert all(kl > 0 for kl in differ.series["ab/kl_a_b"])
    # KL(recording || learner) over the sampled tokens: small after an update; over the
    # environment tokens too (rollout log-prob 0 against the policy's ~log(1/V)) it would be ~2 a token
    assert all(0 < kl < 0.01 for kl in differ.series["ab/kl_recording_a"]), differ.series["ab/kl_recording_a"]


def test_ab_refuses_a_run_without_recordings_and_an_output_inside_the_run(capsys, tmp_path: Path) -> None:
    run_dir = tmp_path / "plain"
    assert main(["train", *TINY, f"run_dir={run_dir}", "trainer.total_steps=1"]) == 0
    capsys.readouterr()
    assert main(["ab", str(run_dir), "--a", "policy_loss=cispo"]) == 2
    assert "holds no recorded rollouts" in capsys.readouterr().err
    recording.record(run_dir, 1, _tiny_batch())
    assert main(["ab", str(run_dir), "--out", str(run_dir / "ab")]) == 2
    assert "inside the recorded run" in capsys.readouterr().err
    other = tmp_path / "other"  # another run's directory as --out: refused, as rlzoo export refuses it
    shutil.copytree(run_dir, other)
    before = _digest(other)
    assert main(["ab", str(run_dir), "--out", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"--out {str(other)!r} exists and is not an empty directory (it holds a run: completed at step 1 of 1)" \
        in err and "Traceback" not in err
    assert _digest(other) == before
    for frozen in ("rollout.n=2", "reward=exact_match", "seed=3", "task.num_digits=5", "model.hidden_size=8",
                   "env=guess"):
        assert main(["ab", str(run_dir), "--a", "policy_loss=cispo", "--b", frozen]) == 2
        assert f"{frozen.split('=')[0]} shapes the batches" in capsys.readouterr().err


def _tiny_batch() -> RolloutBatch:
    return RolloutBatch(prompt_ids=torch.tensor([[4, 5]]), prompt_mask=torch.ones(1, 2, dtype=torch.long),
                        response_ids=torch.tensor([[6]]), response_mask=torch.ones(1, 1),
                        group_ids=torch.tensor([0]), scores=torch.tensor([0.0]), truncated=torch.tensor([False]),
                        prompts=["1="], completions=["1"], references=["1"], rollout_logp=torch.zeros(1, 1))


def test_recording_is_a_single_process_feature(capsys) -> None:
    assert main(["config", "rollout.record=true", "launcher.nproc=2"]) == 2
    assert "rollout.record=true records one process's batches" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncated", "pickle"])
def test_ab_refuses_an_unreadable_recording_and_leaves_no_output(capsys, tmp_path: Path, damage: str) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("seed: 0\n")
    path = recording.record(run_dir, 1, _tiny_batch())
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:-8])
    else:
        torch.save({"response_ids": torch.zeros(1)}, path)
    out = tmp_path / "out"
    assert main(["ab", str(run_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "step_000001.safetensors" in err and "record the run again" in err
    assert not out.exists()
