"""task=file as the field writes data (rlzoo/tasks/task.py FileTask): JSONL, Parquet and datasets'
save_to_disk directories; prompts of text or chat messages (verl's and TRL's layouts);
errors naming the file, row and column. Every file is built here, in tmp_path."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rlzoo.plan.planner import load_config
from rlzoo.plan.run_input import engine_input
from rlzoo.core.errors import ConfigError
from rlzoo.tasks.prompts import PromptFormat
from rlzoo.rollout.scoring import Rewards
from rlzoo.tasks.task import FileTask, Holdout
from zoo import REGISTRY

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

VERL = [{"data_source": "toy", "prompt": [{"role": "system", "content": "Answer briefly."},
                                          {"role": "user", "content": f"{a}+{a}?"}],
         "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(2 * a)},
         "extra_info": {"index": a}} for a in range(10)]
TRL = [{"prompt": [{"role": "user", "content": f"double {a}"}], "solution": str(2 * a)} for a in range(10)]


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _parquet(path: Path, rows: list) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_jsonl_text_prompts_as_before(tmp_path: Path) -> None:
    task = FileTask(str(_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1=", "answer": "2", "level": 1}])))
    (e,) = task.rows
    assert (e.prompt, e.reference, e.messages, e.row["level"]) == ("1+1=", "2", None, 1)


def test_verl_parquet_messages_and_nested_ground_truth(tmp_path: Path) -> None:
    task = FileTask(str(_parquet(tmp_path / "verl.parquet", VERL)))
    e = task.rows[3]
    assert e.prompt == "3+3?" and e.reference == "6"                      # reward_model.ground_truth, found unset
    assert e.messages == ({"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "3+3?"})
    assert e.row["data_source"] == "toy" and e.row["extra_info"] == {"index": 3}   # every column reaches rewards
    assert set("Answer briefly.") <= set(task.alphabet)                    # the system turn is encodable too
    text = PromptFormat(instruction="Q: {question}").render(e, type("T", (), {"chat_template": None})())
    assert text == "Answer briefly.\n\nQ: 3+3?"


def test_trl_layout_with_a_named_answer_column_in_jsonl_and_parquet(tmp_path: Path) -> None:
    for path in (_jsonl(tmp_path / "trl.jsonl", TRL), _parquet(tmp_path / "trl.parquet", TRL)):
        task = FileTask(str(path), answer_key="solution")
        assert [(e.prompt, e.reference) for e in task.rows[:2]] == [("double 0", "0"), ("double 1", "2")]
    with pytest.raises(ConfigError, match=r"row 1 lacks column 'answer' .*set task.answer_key"):
        FileTask(str(tmp_path / "trl.jsonl"))


def test_save_to_disk_dataset_and_dataset_dict(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    train, test = datasets.Dataset.from_list(VERL[:8]), datasets.Dataset.from_list(VERL[8:])
    train.save_to_disk(str(tmp_path / "one"))
    assert [e.reference for e in FileTask(str(tmp_path / "one")).rows] == [str(2 * a) for a in range(8)]
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "dict"))
    task = FileTask(str(tmp_path / "dict"), eval_split="test")
    assert len(task.rows) == 8 and [e.prompt for e in task.eval_set(5, Holdout(0.1))] == ["8+8?", "9+9?"]
    assert len(task.sample_train(16, random.Random(0), Holdout(0.1))) == 16   # every train row trains
    with pytest.raises(ConfigError, match="without split 'validation'; its splits: train, test"):
        FileTask(str(tmp_path / "dict"), split="validation")
    (tmp_path / "plain_dir").mkdir()
    with pytest.raises(ConfigError, match="not one written by datasets' save_to_disk"):
        FileTask(str(tmp_path / "plain_dir"))


@pytest.mark.parametrize("prompt, fragment", [
    ("", "column 'prompt' is empty"),
    ([], "column 'prompt' is '[]'"),
    ([{"role": "user"}], "column 'prompt' message 1 is"),
    ([{"role": "robot", "content": "hi"}], "role one of system, user, assistant, tool"),
    ([{"role": "system", "content": "only a system turn"}], "has no non-empty user message"),
])
def test_malformed_rows_name_the_file_row_and_column(tmp_path: Path, prompt, fragment: str) -> None:
    rows = [{"prompt": "fine", "answer": "1"}, {"prompt": prompt, "answer": "2"}]
    path = _jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ConfigError, match="row 2") as info:
        FileTask(str(path))
    assert str(path) in str(info.value) and fragment in str(info.value)


def test_a_messages_parquet_trains_end_to_end_and_scores_its_ground_truth(capsys, tmp_path: Path) -> None:
    from rlzoo.commands.cli import main

    data = _parquet(tmp_path / "verl.parquet", VERL * 3)
    code = main(["train", f"task={{name: file, path: {data}}}", "answer_format=last_number",
                 "reward=[exact_match, {name: format, weight: 0.1}]", "trainer.total_steps=1", "trainer.threads=1",
                 "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
                 "model.num_kv_heads=1", "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=3",
                 "logging.progress=false", "eval.size=2", "eval.n=0", f"run_dir={tmp_path / 'r'}"])
    assert code == 0, capsys.readouterr().err
    resolved = load_config(REGISTRY, [f"task={{name: file, path: {data}}}", "reward=exact_match", "eval.size=0"])
    task = resolved.build("task")
    e = task.rows[0]
    scores, _ = Rewards.of(engine_input(resolved).components).score([e.prompt], ["0"], [e.reference], [dict(e.row)])
    assert scores.tolist() == [1.0]


def test_null_reference_answers_are_refused_or_warned(capsys, tmp_path: Path) -> None:
    """Every reference null: reward 0 every step, silently; now refused before a run
    directory is left. Some null: a warning with the count."""
    from rlzoo.commands.cli import main

    short = ["trainer.total_steps=1", "trainer.threads=1", "model.hidden_size=32", "model.intermediate_size=64",
             "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1", "rollout.prompts_per_step=2",
             "rollout.n=2", "rollout.max_new_tokens=3", "logging.progress=false", "eval.size=0"]
    none = _jsonl(tmp_path / "none.jsonl", [{"prompt": f"{a}+{a}=", "answer": None} for a in range(10)])
    run = tmp_path / "run"
    assert main(["train", f"task={{name: file, path: {none}}}", "reward=exact_match", *short, f"run_dir={run}"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("rlzoo: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert ("task 'file': every reference answer is null (all 10 examples), but reward 'exact_match' compares "
            "completions with them") in lines[0]
    for blank in ("", "  "):  # exact match would reward the empty completion
        empty = _jsonl(tmp_path / "empty.jsonl", [{"prompt": f"{a}+{a}=", "answer": blank} for a in range(10)])
        assert main(["train", f"task={{name: file, path: {empty}}}", "reward=exact_match", *short,
                     f"run_dir={run}"]) == 2
        assert "every reference answer is empty (all 10 examples)" in capsys.readouterr().err
        assert not run.exists()
    mixed = _jsonl(tmp_path / "mixed.jsonl", [{"prompt": f"{a}+{a}=", "answer": None if a % 2 else ""}
                                              for a in range(10)])
    assert main(["train", f"task={{name: file, path: {mixed}}}", "reward=exact_match", *short, f"run_dir={run}"]) == 2
    assert "every reference answer is null or empty (all 10 examples)" in capsys.readouterr().err
    assert not run.exists()
    out = tmp_path / "m"
    assert main(["sft", f"task={{name: file, path: {none}}}", *short, "--steps", "1", "--out", str(out)]) == 2
    assert "but rlzoo sft trains on them (the text 'None', or nothing)" in capsys.readouterr().err
    assert not out.exists()
    some = _jsonl(tmp_path / "some.jsonl", [{"prompt": f"{a}+{a}=", "answer": None if a < 3 else str(2 * a)}
                                            for a in range(10)])
    some_empty = _jsonl(tmp_path / "some-empty.jsonl", [{"prompt": f"{a}+{a}=", "answer": "" if a < 2 else str(2 * a)}
                                                        for a in range(10)])
    assert main(["train", f"task={{name: file, path: {some_empty}}}", "reward=exact_match", *short,
                 f"run_dir={tmp_path / 'run-empty'}"]) == 0
    assert ("rlzoo: warning: task 'file': 2 of 10 examples have an empty reference answer, but reward "
            "'exact_match' compares") in capsys.readouterr().err
    assert main(["train", f"task={{name: file, path: {some}}}", "reward=exact_match", *short, f"run_dir={run}"]) == 0
    assert ("rlzoo: warning: task 'file': 3 of 10 examples have a null reference answer, but reward 'exact_match' "
            "compares") in capsys.readouterr().err
