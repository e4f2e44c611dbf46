"""Several reward functions per run (``reward=[...]``, rlzoo/rollout/scoring.py) and the ``gdpo``
advantage estimator that normalises them one by one."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlzoo.run import recording
from rlzoo.commands.ab import run_ab
from rlzoo.commands.cli import main
from rlzoo.plan.planner import load_config
from rlzoo.core.errors import ConfigError, TrainingError
from rlzoo.rollout.scoring import Rewards
from rlzoo.plan.hparams import effective_hparams
import zoo
from zoo import REGISTRY

TWO = "reward=[exact_match, {name: length_match, weight: 0.5}]"
TINY = [*zoo.TINY, "eval.size=0"]


def _load(*overrides: str):
    return load_config(REGISTRY, list(overrides))


# ------------------------------------------------------------------------------ config


def test_a_reward_list_resolves_with_weights_and_parameters_recorded() -> None:
    resolved = _load(TWO)
    assert [(c.name, w) for c, _, w in resolved.rewards] == [("exact_match", 1.0), ("length_match", 0.5)]
    assert [dict(item) for item in resolved.cfg.reward] == [{"name": "exact_match", "strip": True, "weight": 1.0},
                                                            {"name": "length_match", "weight": 0.5}]
    assert resolved.sources["reward"] == "command line"
    assert "reward" not in resolved.components
    hparams = effective_hparams(resolved.cfg, resolved.plan)
    assert hparams["reward.name"] == "1·exact_match + 0.5·length_match"
    assert hparams["reward.length_match.weight"] == 0.5


def test_one_reward_is_one_function_of_weight_one() -> None:
    resolved = _load("reward=exact_match")
    assert [(c.name, w) for c, _, w in resolved.rewards] == [("exact_match", 1.0)]
    default = _load()
    assert [(c.name, w) for c, _, w in default.rewards] == [("sorted_digits", 1.0)]
    assert dict(default.cfg.reward) == {"name": "sorted_digits"}


@pytest.mark.parametrize("override, message", [
    ("reward=[]", r"reward=\[\] names no reward function; registered: .*length_match"),
    ("reward=[exact_match, exact_match]", "names exact_match more than once"),
    ("reward=[{name: exact_match, weight: .nan}]",
     r"reward\[0\]\.weight must be a finite number within float32.s range .*, got nan"),
    ("reward=[{name: exact_match, weight: heavy}]",
     r"reward\[0\]\.weight must be a finite number within float32.s range .*, got 'heavy'"),
    ("reward=[exact_mach]", r"reward\[0\]: unknown reward 'exact_mach'.*exact_match"),
    ("reward=[{name: exact_match, strp: false}]", r"unknown parameter 'strp' for reward\[0\] 'exact_match'"),
    ("reward={name: exact_match, weight: 2}", "a weight belongs to one of several reward functions"),
])
def test_bad_reward_lists_are_refused_naming_the_item(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(override)


def test_a_later_layer_replaces_the_list(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("reward: [exact_match, length_match]\n")
    resolved = load_config(REGISTRY, ["reward=numeric_match"], config_file=config)
    assert [c.name for c, _, _ in resolved.rewards] == ["numeric_match"]
    back = load_config(REGISTRY, [], config_file=config)
    assert [c.name for c, _, _ in back.rewards] == ["exact_match", "length_match"]


# ----------------------------------------------------------------------------- scoring


def test_scores_are_the_weighted_sum_and_each_function_is_kept() -> None:
    rewards = Rewards(_load(TWO).reward_functions())
    scores, per_reward = rewards.score(["12=", "34=", "5="], ["12", "3", ""], ["12", "34", "5"], [{}, {}, {}])
    assert per_reward.tolist() == [[1.0, 1.0], [0.0, 0.5], [0.0, 0.0]]
    assert scores.tolist() == [1.5, 0.25, 0.0]
    assert rewards.names == ["exact_match", "length_match"]


def test_one_function_of_weight_one_is_its_scores_unchanged() -> None:
    rewards = Rewards(_load().reward_functions())
    scores, per_reward = rewards.score(["3081="], ["0183"], ["0138"], [{}])
    assert scores.tolist() == [0.5] and per_reward.shape == (1, 1)


def test_a_failing_function_is_named_with_its_sample() -> None:
    rewards = Rewards(_load(TWO).reward_functions())
    with pytest.raises(TrainingError, match="reward function 'length_match' returned 1 scores"):
        rewards.functions[1] = _Broken(rewards.functions[1])
        rewards.score(["1=", "2="], ["1", "2"], ["1", "2"], [{}, {}])


class _Broken:
    def __init__(self, inner) -> None:
        self.name = inner.name

    def __call__(self, **inputs) -> list[float]:
        return [1.0]


# -------------------------------------------------------------------------------- gdpo


def _gdpo(scores: list[list[float]], weights: list[float], groups: list[int], **params) -> list[float]:
    component = REGISTRY.get("advantage", "gdpo")
    bound = component.bind(component.params(**params))
    adv, ret = bound(reward_scores=torch.tensor(scores), reward_weights=torch.tensor(weights),
                     response_mask=torch.ones(len(scores), 2), group_ids=torch.tensor(groups))
    assert torch.equal(adv, ret) and torch.equal(adv[:, 0], adv[:, 1])
    return adv[:, 0].tolist()


def _reference(scores: list[list[float]], weights: list[float], groups: list[int], eps: float = 1e-4,
               whiten: bool = True) -> list[float]:
    """The formula in plain Python (statistics.stdev is the unbiased std)."""
    total = [0.0] * len(scores)
    for k, w in enumerate(weights):
        for g in set(groups):
            rows = [i for i, gi in enumerate(groups) if gi == g]
            column = [scores[i][k] for i in rows]
            mean = statistics.fmean(column) if len(rows) > 1 else 0.0
            std = statistics.stdev(column) if len(rows) > 1 else 1.0
            for i in rows:
                total[i] += w * (scores[i][k] - mean) / (std + eps)
    if not whiten:
        return total
    mean, std = statistics.fmean(total), statistics.stdev(total)
    return [(t - mean) / (std + eps) for t in total]


SCORES = [[1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.5], [1.0, 0.25], [0.0, 0.0], [1.0, 1.0]]
GROUPS = [3, 3, 3, 3, 8, 8, 8, 5]              # group 5 has one member


@pytest.mark.parametrize("whiten", [True, False])
def test_gdpo_matches_the_formula_by_hand(whiten: bool) -> None:
    got = _gdpo(SCORES, [1.0, 0.5], GROUPS, whiten=whiten)
    assert got == pytest.approx(_reference(SCORES, [1.0, 0.5], GROUPS, whiten=whiten), abs=1e-6)


def test_gdpo_hand_computed_two_rewards_one_group() -> None:
    # {1,1,0,0} per reward: mean 0.5, unbiased std sqrt(1/3); sums ±2a and 0, 0; then whitened
    a = 0.5 / ((1 / 3) ** 0.5 + 1e-4)
    s = [2 * a, 0.0, 0.0, -2 * a]
    std = statistics.stdev(s)
    assert _gdpo(SCORES[:4], [1.0, 1.0], [0, 0, 0, 0]) == pytest.approx([x / (std + 1e-4) for x in s], abs=1e-6)


def test_gdpo_separates_what_grpo_collapses() -> None:
    """The paper's motivation: GRPO normalises the sum, so a group whose best answer earned
    both rewards (sums 2, 0, 0, 0) gets the same advantages as one whose best earned one
    (1, 0, 0, 0); GDPO gives the first twice the advantage."""
    scores = [[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    grpo = REGISTRY.get("advantage", "grpo")
    sums = torch.tensor([[a + b] for a, b in scores])
    collapsed, _ = grpo(token_rewards=sums, response_mask=torch.ones(8, 1), group_ids=torch.tensor(groups))
    assert torch.allclose(collapsed[:4], collapsed[4:], atol=1e-5)
    separated = _gdpo(scores, [1.0, 1.0], groups)
    assert separated[4] == pytest.approx(2 * separated[0], rel=1e-4) and separated[0] > 0


def test_gdpo_all_equal_rewards_and_missing_scores() -> None:
    assert _gdpo([[0.7, 0.2]] * 4, [1.0, 1.0], [1, 1, 1, 1]) == [0.0] * 4
    component = REGISTRY.get("advantage", "gdpo")
    with pytest.raises(TrainingError, match="gdpo.*reward_scores"):
        component(reward_scores=None, reward_weights=torch.ones(1), response_mask=torch.ones(2, 1),
                  group_ids=torch.tensor([0, 0]))


def test_the_plan_refuses_what_gdpo_would_ignore_and_warns_with_one_reward() -> None:
    with pytest.raises(ConfigError, match="gdpo.*KL in the reward would be ignored"):
        _load("advantage=gdpo", TWO, "kl.apply=reward", "kl.coef=0.05", "kl.estimator=k1")
    with pytest.raises(ConfigError, match="reward shaping of extension overlong_shaping would be ignored"):
        _load("advantage=gdpo", TWO, "extensions=[overlong_shaping]")
    assert any("with one (sorted_digits)" in w for w in _load("advantage=gdpo").plan.warnings)
    assert not any("with one" in w for w in _load("advantage=gdpo", TWO).plan.warnings)


# ----------------------------------------------------------------------------- in a run


@pytest.fixture(scope="module")
def two_reward_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("rewards") / "run"
    assert main(["train", *TINY, TWO, f"run_dir={run_dir}", "trainer.total_steps=3", "rollout.record=true"]) == 0
    return run_dir


@pytest.mark.slow
def test_a_run_logs_each_reward_and_records_their_scores(two_reward_run: Path) -> None:
    acc = EventAccumulator(str(two_reward_run))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"reward/mean", "reward/exact_match", "reward/length_match"} <= tags
    for step in (1, 2, 3):
        mean = acc.Scalars("reward/mean")[step - 1].value
        parts = [acc.Scalars(f"reward/{n}")[step - 1].value for n in ("exact_match", "length_match")]
        assert mean == pytest.approx(parts[0] + 0.5 * parts[1], abs=1e-6)
        batch = recording.load(two_reward_run, step)
        assert batch.reward_scores.shape == (len(batch), 2)
        assert torch.allclose(batch.scores, batch.reward_scores @ torch.tensor([1.0, 0.5]))
    saved = (two_reward_run / "config.yaml").read_text()
    assert "length_match" in saved and "weight: 0.5" in saved
    status = json.loads((two_reward_run / "status.json").read_text())
    assert status["status"] == "completed"


@pytest.mark.slow
def test_gdpo_and_grpo_update_differently_on_the_same_batches(two_reward_run: Path, tmp_path: Path) -> None:
    result = run_ab(two_reward_run, ["advantage=grpo"], ["advantage=gdpo"], tmp_path / "ab")
    assert max(1.0 - c for c in result.series["ab/cosine"]) > 1e-4   # identical sides: < 1e-6 (test_ab.py)
    assert max(result.series["ab/kl_a_b"]) > 0
