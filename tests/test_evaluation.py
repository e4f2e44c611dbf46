"""Held-out splits, file-task epochs, rows for rewards, and evaluation (eval/... tags)."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from rlzoo.commands.cli import main
from rlzoo.core.errors import ConfigError
from rlzoo.run import evaluation
from rlzoo.plan.settings import EvalPlan
from rlzoo.run.evaluation import Evaluator, pass_at_k
from rlzoo.plan.planner import RolloutPlan
from rlzoo.rollout.sampler import Sampler
from rlzoo.run.tracking import eval_metric_tags
from rlzoo.core.events import read_scalars
from rlzoo.models.build import build_char_tokenizer
from rlzoo.core.batch import Generation
from rlzoo.tasks.task import Example, FileTask, Holdout, Task, check_encodable
import zoo
from zoo import REGISTRY, builtin_names

GENERATED_TASKS = [name for name in builtin_names("task") if name != "file"]
TINY = [*zoo.TINY, "task.num_digits=4", "eval.size=8", "eval.n=2"]


REQUIRED = {"reasoning_gym": {"dataset": "basic_arithmetic"}}
"""Parameters of the generated tasks that have required ones."""


def _task(name: str) -> Task:
    component = REGISTRY.get("task", name)
    return component.fn(params=component.params(**REQUIRED.get(name, {})))


def test_holdout_is_a_fixed_function_of_the_prompt() -> None:
    holdout = Holdout(0.1)
    prompts = [f"{i}=" for i in range(20000)]
    held = [p for p in prompts if holdout.contains(p)]
    assert 0.09 < len(held) / len(prompts) < 0.11
    assert held == [p for p in prompts if Holdout(0.1).contains(p)]      # no seed, no state
    assert not any(Holdout(0.0).contains(p) for p in prompts[:100])
    assert set(held) >= {p for p in prompts if Holdout(0.05).contains(p)}  # nested shares


def test_holdout_select_holds_out_an_exact_share_of_a_list() -> None:
    holdout = Holdout(0.1)
    assert len(holdout.select([f"p{i}" for i in range(9)])) == 1          # at least one
    assert len(holdout.select([f"p{i}" for i in range(100)] * 3)) == 10   # of the distinct prompts
    assert holdout.select(["same"] * 5) == set()                           # nothing left to train on otherwise
    assert Holdout(0.0).select(["a", "b"]) == set()


@pytest.mark.parametrize("name", GENERATED_TASKS)
def test_generated_tasks_never_train_on_their_evaluation_prompts(name: str) -> None:
    task, holdout = _task(name), Holdout(0.1)
    evals = task.eval_set(64, holdout)
    assert len(evals) == 64 and len({e.prompt for e in evals}) == 64
    assert all(holdout.contains(e.prompt) for e in evals)
    assert [e.prompt for e in task.eval_set(64, holdout)] == [e.prompt for e in evals]   # the same every run
    train = task.sample_train(2000, random.Random(0), holdout)
    assert len(train) == 2000 and not {e.prompt for e in train} & {e.prompt for e in evals}
    assert not any(holdout.contains(e.prompt) for e in train)


def test_a_prompt_space_too_small_for_the_holdout_is_an_error() -> None:
    class Tiny(Task):
        def sample(self, n, rng):
            return [Example("x=", "x") for _ in range(n)]

    holdout = Holdout(0.99)
    if not holdout.contains("x="):
        holdout = Holdout(Holdout.key("x=") + 1e-9)
    with pytest.raises(ConfigError, match="too small for eval.holdout"):
        Tiny().sample_train(4, random.Random(0), holdout)


def _write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_file_task_iterates_seeded_shuffled_epochs_and_resumes(tmp_path: Path) -> None:
    rows = [{"prompt": f"q{i}", "answer": str(i), "level": i % 3} for i in range(40)]
    task = FileTask(str(_write_rows(tmp_path / "d.jsonl", rows)))
    holdout = Holdout(0.1)
    held = {e.prompt for e in task.eval_set(100, holdout)}
    assert len(held) == 4
    rng = random.Random(7)
    first = [e.prompt for e in task.sample_train(36, rng, holdout)]
    second = [e.prompt for e in task.sample_train(36, rng, holdout)]
    assert sorted(first) == sorted(second) == sorted({r["prompt"] for r in rows} - held)  # each row once per epoch
    assert first != second                                                                # a new order each epoch
    assert task.epoch == 1 and task.sample_train(1, rng, holdout)[0].row["level"] in (0, 1, 2)

    # a checkpoint mid-epoch: a fresh task resumes the same order
    task_a = FileTask(str(tmp_path / "d.jsonl"))
    rng_a = random.Random(3)
    task_a.sample_train(10, rng_a, holdout)
    state, rng_state = task_a.state_dict(), rng_a.getstate()
    expected = [e.prompt for e in task_a.sample_train(50, rng_a, holdout)]
    task_b = FileTask(str(tmp_path / "d.jsonl"))
    task_b.load_state_dict(state)
    rng_b = random.Random()
    rng_b.setstate(rng_state)
    assert [e.prompt for e in task_b.sample_train(50, rng_b, holdout)] == expected


def test_file_task_eval_path_evaluates_that_file_and_trains_on_every_row(tmp_path: Path) -> None:
    train = _write_rows(tmp_path / "train.jsonl", [{"prompt": f"q{i}", "answer": "a"} for i in range(10)])
    evals = _write_rows(tmp_path / "eval.jsonl", [{"prompt": f"e{i}", "answer": "b"} for i in range(3)])
    task = FileTask(str(train), eval_path=str(evals))
    holdout = Holdout(0.5)
    assert [e.prompt for e in task.eval_set(8, holdout)] == ["e0", "e1", "e2"]
    assert sorted(e.prompt for e in task.sample_train(10, random.Random(0), holdout)) == sorted(
        f"q{i}" for i in range(10))


def test_unencodable_answers_are_refused_and_prompts_warned(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer("0123456789=")
    good = FileTask(str(_write_rows(tmp_path / "g.jsonl", [{"prompt": "12=", "answer": "12"}] * 3)))
    assert check_encodable(good, "file", tokenizer, Holdout(0.1)) == []
    prompts = FileTask(str(_write_rows(tmp_path / "p.jsonl", [{"prompt": "sum 12=", "answer": "3"},
                                                               {"prompt": "12=", "answer": "3"}])))
    [warning] = check_encodable(prompts, "file", tokenizer, Holdout(0.1))
    assert "1 of 2 checked prompts" in warning and "' msu'" in warning and "sum 12=" in warning
    answers = FileTask(str(_write_rows(tmp_path / "a.jsonl", [{"prompt": "1=", "answer": "one"},
                                                               {"prompt": "2=", "answer": "2"}])))
    with pytest.raises(ConfigError, match=r"1 of 2 checked answers contain characters .*'eno'.*'one'"):
        check_encodable(answers, "file", tokenizer, Holdout(0.1))


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert pass_at_k(8, 0, 1) == 0.0 and pass_at_k(8, 8, 8) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)          # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 3, 2) == 1.0                               # fewer than 2 wrong ones
    strict = ["eval/greedy_accuracy", "eval/greedy_score", "eval/strict_accuracy", "eval/lenient_accuracy"]
    assert eval_metric_tags(4) == [*strict, "eval/pass@1", "eval/pass@4", "eval/sampled_score"]
    assert eval_metric_tags(0) == strict


class _ScriptedSampler:
    """Stands in for the Sampler: completions are scripted per prompt, scores read them."""

    device = torch.device("cpu")
    environment = None                     # single completions: Sampler.complete's own path
    complete = Sampler.complete

    def __init__(self, answers: dict[str, tuple[str, list[str]]]) -> None:
        self.answers = answers
        self.prompts: list[str] = []
        self.backend = SimpleNamespace(generate=self.generate)
        rollout = RolloutPlan(backend="scripted", dtype="float32", prompts_per_process=2, n=2, max_new_tokens=3,
                              temperature=1.0, top_p=1.0)
        self.plan = SimpleNamespace(rollout=rollout, update=SimpleNamespace(sequences=4))

    def encode_prompts(self, examples):
        self.prompts = [e.prompt for e in examples]
        return [[1] for _ in examples]

    def generate(self, ids, *, num_samples, max_new_tokens, temperature, top_p, greedy=False):
        texts = [self.answers[p][0] if greedy else self.answers[p][1][j]
                 for p in self.prompts for j in range(num_samples)]
        self.texts = texts
        ones = torch.ones(len(texts), 1)
        return Generation(response_ids=ones.long(), response_mask=ones, truncated=torch.zeros(len(texts)).bool(),
                          logp=torch.zeros(len(texts), 1))

    def decode(self, ids, mask):
        return self.texts

    def score(self, prompts, completions, references, rows):
        return torch.tensor([float(c) for c in completions])

    @property
    def rewards(self):  # every completion holds an answer; lenient scores are the scores
        return SimpleNamespace(answers=lambda completions: completions,
                               lenient_scores=lambda p, c, r, rows: self.score(p, c, r, rows))


def test_evaluator_metrics_hand_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {"a": ("1.0", ["1.0", "0.0", "0.0", "1.0"]),    # greedy correct, 2 of 4 samples
               "b": ("0.5", ["0.0", "0.0", "0.0", "0.0"]),    # partial credit is not correct
               "c": ("0.0", ["1.0", "1.0", "1.0", "1.0"])}
    plan = EvalPlan(size=3, n=4, every=10, threshold=1.0, holdout=0.1)
    examples = [Example(p, None) for p in answers]
    evaluator = Evaluator(examples, _ScriptedSampler(answers), plan, SimpleNamespace(world=1, rank=0, enabled=False))
    clock = iter([100.0, 102.5])                                   # the evaluation's start and end
    monkeypatch.setattr(evaluation.time, "perf_counter", lambda: next(clock))
    metrics = evaluator.run(step=10)
    monkeypatch.undo()
    assert metrics["eval/greedy_accuracy"] == pytest.approx(1 / 3)
    assert metrics["eval/greedy_score"] == pytest.approx(0.5)
    assert metrics["eval/pass@1"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert metrics["eval/pass@4"] == pytest.approx(2 / 3)
    assert metrics["eval/sampled_score"] == pytest.approx(6 / 12)
    assert metrics["timing/eval_s"] == pytest.approx(2.5)
    assert [s.completion for s in evaluator.samples] == ["1.0", "0.5", "0.0"]
    plan = dataclasses.replace(plan, threshold=0.5)               # a threshold for partial credit
    assert Evaluator(examples, _ScriptedSampler(answers), plan, evaluator.dist).run(1)[
        "eval/greedy_accuracy"] == pytest.approx(2 / 3)
    assert evaluator.due(10, last=False) and not evaluator.due(11, last=False) and evaluator.due(11, last=True)


@pytest.mark.slow
def test_evaluation_never_changes_training(capsys, tmp_path: Path) -> None:
    common = [*TINY, "task.num_digits=3", "trainer.total_steps=4", "checkpoint.every=0"]
    assert main(["train", *common, f"run_dir={tmp_path / 'on'}", "eval.every=1"]) == 0
    assert main(["train", *common, f"run_dir={tmp_path / 'off'}", "eval.size=0"]) == 0
    capsys.readouterr()
    on, off = read_scalars(tmp_path / "on"), read_scalars(tmp_path / "off")
    assert [s for s, _ in on["eval/greedy_accuracy"]] == [1, 2, 3, 4] and "eval/greedy_accuracy" not in off
    for tag in ("reward/mean", "policy/loss", "entropy"):
        assert on[tag] == off[tag], tag
    weights = [load_file(tmp_path / run / "checkpoints/step_000004/policy/model.safetensors") for run in ("on", "off")]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


@pytest.mark.slow
@pytest.mark.parametrize("task", [*GENERATED_TASKS, "file"])
def test_every_task_logs_eval_tags_at_the_interval_and_the_end(capsys, tmp_path: Path, task: str) -> None:
    spec = [f"task={task}"]
    if task in REQUIRED:
        params = ", ".join(f"{key}: {value}" for key, value in REQUIRED[task].items())
        spec = [f"task={{name: {task}, {params}}}"]
    if task == "file":
        data = _write_rows(tmp_path / "d.jsonl", [{"prompt": f"{a}{b}=", "answer": f"{a + b}"}
                                                  for a in range(10) for b in range(10)])
        spec = [f"task={{name: file, path: {data}}}"]
    assert main(["train", *TINY, *spec, f"run_dir={tmp_path / 'r'}", "trainer.total_steps=3",
                 "eval.every=2"]) == 0, capsys.readouterr().err
    curves = read_scalars(tmp_path / "r")
    for tag in [*eval_metric_tags(2), "timing/eval_s"]:
        assert [s for s, _ in curves[tag]] == [2, 3], tag


@pytest.mark.slow
def test_rewards_receive_the_rows_of_a_file_task(capsys, tmp_path: Path, plugin_module) -> None:
    seen = tmp_path / "seen.jsonl"
    module = plugin_module(f"""
        import json
        from rlzoo.api import hookimpl
        def by_level(completions, rows):
            with open({str(seen)!r}, "a") as handle:
                handle.write(json.dumps(rows) + "\\n")
            return [float(row["level"]) for row in rows]

        @hookimpl
        def rlzoo_register_reward_functions(register):
            register("by_level", by_level)
    """)
    data = _write_rows(tmp_path / "d.jsonl", [{"prompt": f"{i}=", "answer": str(i), "level": i % 2}
                                              for i in range(10)])
    first = tmp_path / "first"
    assert main(["train", *TINY, "task.num_digits=3", "trainer.total_steps=1", f"run_dir={first}"]) == 0
    code = main(["train", *TINY, f"plugins=[{module}]", f"model.path={first / 'init_model'}",
                 f"task={{name: file, path: {data}}}", "reward=by_level", "trainer.total_steps=1",
                 f"run_dir={tmp_path / 'r'}"])
    assert code == 0, capsys.readouterr().err
    batches = [json.loads(line) for line in seen.read_text().splitlines()]
    assert batches and all(row["level"] == int(row["prompt"][:-1]) % 2 for rows in batches for row in rows)
    assert {"prompt", "answer", "level"} <= set(batches[0][0])


def test_a_task_holding_out_fewer_prompts_than_eval_size_is_evaluated_on_those_with_a_warning(capsys) -> None:
    class Ten(Task):
        def sample(self, n, rng):
            return [Example(f"{rng.randrange(10)}=", "0") for _ in range(n)]

    holdout = Holdout(0.5)
    held = sorted({e.prompt for e in Ten().eval_set(100, holdout)})
    assert 0 < len(held) < 10
    plan = EvalPlan(size=100, n=0, every=10, threshold=1.0, holdout=0.5)
    dist = SimpleNamespace(world=1, rank=0, enabled=False, is_main=True)
    evaluator = Evaluator.build(plan, Ten(), "ten", _ScriptedSampler({}), dist)
    assert sorted(e.prompt for e in evaluator.examples) == held
    assert f"eval.size=100 but task 'ten' holds out only {len(held)} prompts" in capsys.readouterr().err
