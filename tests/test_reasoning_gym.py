"""task=reasoning_gym (plugins/reasoning_gym.py): one dataset or a weighted mixture, held-out
prompts training never sees, the generators' own verifiers as the reward."""

from __future__ import annotations

import random
from collections import Counter

import pytest

pytest.importorskip("reasoning_gym")

from rlzoo.commands.cli import main  # noqa: E402
from rlzoo.plan.run_input import engine_input
from rlzoo.plan.planner import load_config  # noqa: E402
from rlzoo.core.errors import ConfigError  # noqa: E402
from rlzoo.rollout.scoring import Rewards  # noqa: E402
from rlzoo.tasks.task import Holdout  # noqa: E402
from rlzoo.api import check_task  # noqa: E402
from zoo import REGISTRY  # noqa: E402

ARITH = "task={name: reasoning_gym, dataset: basic_arithmetic, config: {min_terms: 2, max_terms: 2, max_digits: 2}}"
MIX = ("task={name: reasoning_gym, datasets: [{name: chain_sum, weight: 3, config: {max_terms: 2}}, "
       "{name: basic_arithmetic, config: {max_terms: 2}}]}")


def _build(*overrides: str):
    resolved = load_config(REGISTRY, ["eval.size=0", *overrides])
    return resolved, resolved.build("task")


def test_one_dataset_samples_its_entries_and_defaults_to_its_verifier() -> None:
    resolved, task = _build(ARITH, "seed=3")
    assert [c.name for c, _, _ in resolved.rewards] == ["reasoning_gym"]
    examples = task.sample(5, random.Random(0))
    assert examples == task.sample(5, random.Random(0))                  # a function of the rng only
    for e in examples:
        assert e.prompt == e.row["question"] and e.reference == e.row["answer"]
        assert e.row["metadata"]["source_dataset"] == "basic_arithmetic"
    check_task(task, "reasoning_gym")


def test_mixing_follows_the_weights() -> None:
    _, task = _build(MIX)
    counts = Counter(e.row["metadata"]["source_dataset"] for e in task.sample(4000, random.Random(1)))
    assert counts["chain_sum"] / 4000 == pytest.approx(0.75, abs=0.03)   # weights 3 : 1 (binomial sd 0.007)
    assert set(counts) == {"chain_sum", "basic_arithmetic"}


def test_held_out_prompts_come_from_the_eval_seed_and_are_never_trained_on() -> None:
    _, task = _build(ARITH)
    holdout = Holdout(0.1)
    evals = task.eval_set(64, holdout)
    assert len(evals) == 64 and all(holdout.contains(e.prompt) for e in evals)
    train = task.sample_train(2000, random.Random(0), holdout)
    assert not {e.prompt for e in evals} & {e.prompt for e in train}
    # the evaluation entries come from generators seeded eval_seed = seed + size, which training never uses
    first = task.evaluation[0][0]
    assert task.evaluation[0].seed == task.train[0].seed + task.size and first["question"]


def test_the_reward_is_the_datasets_score_answer_on_the_extracted_answer() -> None:
    resolved, task = _build(ARITH, "answer_format=answer_tag")
    rewards = Rewards.of(engine_input(resolved).components)
    e = task.sample(1, random.Random(0))[0]
    completions = [f"<answer>{e.reference}</answer>", f"{e.reference}", "<answer>nonsense</answer>"]
    scores, _ = rewards.score([e.prompt] * 3, completions, [e.reference] * 3, [dict(e.row)] * 3)
    assert scores.tolist() == [1.0, 0.0, 0.0]
    lenient = rewards.lenient_scores([e.prompt] * 3, completions, [e.reference] * 3, [dict(e.row)] * 3)
    assert lenient.tolist() == [1.0, 1.0, 0.0]


@pytest.mark.parametrize("override, message", [
    ("task={name: reasoning_gym, dataset: basic_arithmetc}", "Did you mean 'basic_arithmetic'"),
    ("task={name: reasoning_gym}", "give dataset"),
    ("task={name: reasoning_gym, dataset: chain_sum, config: {bogus: 1}}", "refuses config"),
    ("task={name: reasoning_gym, datasets: [{name: chain_sum, weight: 0}]}", "weight must be a number > 0"),
    ("task={name: reasoning_gym, datasets: [{name: chain_sum, wieght: 2}]}", "unknown key 'wieght'"),
    # gsm_symbolic draws a value per entry of [0, size) when built: 8 GB at the default size
    ("task={name: reasoning_gym, dataset: gsm_symbolic}", "size 1,000,000,000 would take 7"),
    ("task={name: reasoning_gym, datasets: [{name: chain_sum}, {name: list_functions}], size: 200000000}",
     "'list_functions' keeps about 8 bytes per entry"),
])
def test_bad_task_settings_exit_2_naming_the_value(override: str, message: str, capsys) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(REGISTRY, [override])
    assert main(["config", override]) == 2
    assert message.split("'")[0] in capsys.readouterr().err


def test_a_size_that_fits_is_taken_and_the_refusal_names_one() -> None:
    """The size the refusal suggests is accepted (the benchmarks' ragged setting uses 100000)."""
    with pytest.raises(ConfigError, match=r"set task.size=10000000 \(or below"):
        load_config(REGISTRY, ["task={name: reasoning_gym, dataset: gsm_symbolic}"])
    _, task = _build("task={name: reasoning_gym, dataset: gsm_symbolic, size: 10000000}")
    assert task.size == 10_000_000 and len(task.sample(3, random.Random(0))) == 3


def test_rlzoo_list_names_the_datasets(capsys) -> None:
    assert main(["list", "--kind", "task"]) == 0
    out = capsys.readouterr().out
    assert "reasoning_gym" in out and "basic_arithmetic" in out and "gsm_symbolic" in out
