"""Bounded staleness (``rollout.staleness``): which batch each step trains on, that the
knob makes the data off-policy, and that a killed run resumes onto the same stale batches."""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import pytest
import torch

from rlzoo.core.batch import RolloutBatch
from rlzoo.run.checkpoint import list_checkpoints
from rlzoo.plan.planner import load_config
from rlzoo.core.errors import ConfigError
from rlzoo.rollout.staleness import RolloutQueue
from rlzoo.core.events import read_scalars
from test_train import KILLER, _cli, _final_state
from zoo import REGISTRY, TINY


def _batch(tag: int) -> RolloutBatch:
    """A 2-sequence batch whose scores carry ``tag`` (which call produced it)."""
    return RolloutBatch(prompt_ids=torch.ones(2, 2, dtype=torch.long), prompt_mask=torch.ones(2, 2, dtype=torch.long),
                        response_ids=torch.ones(2, 3, dtype=torch.long),
                        response_mask=torch.tensor([[1, 1, 0], [1, 1, 1]]), group_ids=torch.tensor([0, 0]),
                        scores=torch.tensor([float(tag), float(tag)]), truncated=torch.tensor([False, True]),
                        prompts=["a", "a"], completions=["x", "y"], references=[[1, 2], [1, 2]],
                        rollout_logp=torch.full((2, 3), -0.5))


def _drive(queue: RolloutQueue, steps: range, total: int, made: list[int]) -> list[tuple[int, int]]:
    """``(tag of the batch trained on, staleness)`` of each step; ``made`` collects the policy
    version (step − 1) at each generation."""
    out = []
    for step in steps:
        def produce(step: int = step) -> RolloutBatch:
            made.append(step - 1)
            return _batch(len(made))
        batch, stale = queue.next(step, total, produce)
        out.append((int(batch.scores[0]), stale))
    return out


def test_zero_staleness_generates_and_trains_on_one_fresh_batch_per_step() -> None:
    made: list[int] = []
    assert _drive(RolloutQueue(0), range(1, 5), 4, made) == [(1, 0), (2, 0), (3, 0), (4, 0)]
    assert made == [0, 1, 2, 3]


def test_staleness_k_trains_step_t_on_the_policy_of_step_t_minus_k_and_wastes_nothing() -> None:
    made: list[int] = []
    trained = _drive(RolloutQueue(2), range(1, 7), 6, made)
    # steps 1-3 train on the 3 batches the initial policy made (staleness 0, 1, 2), then 2 each
    assert [stale for _, stale in trained] == [0, 1, 2, 2, 2, 2]
    assert [tag for tag, _ in trained] == [1, 2, 3, 4, 5, 6]
    assert made == [0, 0, 0, 1, 2, 3]              # 6 batches for 6 steps; none made after step 4
    # the batch trained at step t was made by policy version t - 1 - staleness
    assert all(made[tag - 1] == step - 1 - stale for step, (tag, stale) in enumerate(trained, 1))


def test_staleness_beyond_the_run_trains_every_step_on_the_initial_policy() -> None:
    made: list[int] = []
    assert [s for _, s in _drive(RolloutQueue(5), range(1, 4), 3, made)] == [0, 1, 2]
    assert made == [0, 0, 0]


def test_a_longer_resumed_run_tops_the_queue_up_again() -> None:
    queue, made = RolloutQueue(2), []
    _drive(queue, range(1, 4), 3, made)                # a 3-step run drains its queue
    assert len(queue) == 0
    assert [s for _, s in _drive(queue, range(4, 7), 6, made)] == [0, 1, 2]


def test_queue_state_round_trips_through_plain_values() -> None:
    queue, made = RolloutQueue(2), []
    _drive(queue, range(1, 2), 6, made)
    state = queue.state_dict()
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"queue-{os.getpid()}.pt"
    torch.save(state, path)
    restored = RolloutQueue(2)
    restored.load_state_dict(torch.load(path, weights_only=True))
    path.unlink()
    assert [v for v, _ in restored.items] == [v for v, _ in queue.items]
    for (_, a), (_, b) in zip(restored.items, queue.items):
        assert torch.equal(a.scores, b.scores) and torch.equal(a.loss_mask, b.loss_mask)
        assert a.references == b.references


def test_negative_staleness_is_refused_before_anything_runs() -> None:
    with pytest.raises(ConfigError, match="rollout.staleness"):
        load_config(REGISTRY, [*TINY, "rollout.staleness=-1"])


def test_the_plan_says_what_staleness_runs() -> None:
    plan = load_config(REGISTRY, [*TINY, "rollout.staleness=2"]).plan
    assert plan.rollout.staleness == 2
    assert "step t trains on the rollouts of the policy of step t-2" in plan.render()
    assert "rollout queue" not in load_config(REGISTRY, TINY).plan.render()
    too_stale = load_config(REGISTRY, [*TINY, "rollout.staleness=3", "trainer.total_steps=3"]).plan
    assert any("every step trains on the initial policy's rollouts" in w for w in too_stale.warnings)


@pytest.mark.slow
def test_stale_rollouts_are_off_policy_and_a_killed_run_resumes_onto_the_same_batches(tmp_path: Path) -> None:
    """With 2 mini-batches the old-log-prob pass runs, so ``rollout/mismatch_k3`` measures how
    far the trained policy has moved from the one that sampled: ~0 fresh, > 0 stale."""
    (tmp_path / "rlzoo_test_killer.py").write_text(textwrap.dedent(KILLER))
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    common = ["trainer.total_steps=6", "checkpoint.every=2", "plugins=[rlzoo_test_killer]",
              "trainer.num_mini_batches=2", "trainer.lr=3e-3", "eval.size=0", "rollout_correction=tis"]
    runs = {}
    for name, extra in (("fresh", "rollout.staleness=0"), ("stale", "rollout.staleness=2")):
        runs[name] = tmp_path / name
        done = _cli(runs[name], f"run_dir={runs[name]}", *common, extra, env=env)
        assert done.returncode == 0, done.stderr
    fresh, stale = read_scalars(runs["fresh"]), read_scalars(runs["stale"])
    assert [v for _, v in stale["rollout/staleness"]] == [0, 1, 2, 2, 2, 2]
    assert [v for _, v in fresh["rollout/staleness"]] == [0] * 6
    assert max(v for _, v in fresh["rollout/mismatch_k3"]) < 1e-6
    assert min(v for s, v in stale["rollout/mismatch_k3"] if s >= 3) > 1e-5
    assert fresh["reward/mean"][0] == stale["reward/mean"][0]          # step 1: the same batch
    assert fresh["reward/mean"] != stale["reward/mean"]

    broken = tmp_path / "broken"
    killed = _cli(broken, f"run_dir={broken}", *common, "rollout.staleness=2",
                  env={**env, "RLZOO_TEST_SIGNAL_AT": "5", "RLZOO_TEST_SIGNAL": "SIGKILL"})
    assert killed.returncode == -signal.SIGKILL
    assert max(s for s, _ in list_checkpoints(broken)) == 4
    resumed = _cli(broken, f"resume={broken}", env=env)
    assert resumed.returncode == 0, resumed.stderr
    want_weights, want_curves = _final_state(runs["stale"], 6)
    got_weights, got_curves = _final_state(broken, 6)
    for key in want_weights:
        assert torch.equal(want_weights[key], got_weights[key]), key
    assert want_curves == got_curves
