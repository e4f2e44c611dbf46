"""``rlzoo rm`` (rlzoo/run/rm_trainer.py; its pairs in rlzoo/tasks/pairs.py, its loss in
rlzoo/learn/bradley_terry.py): the Bradley–Terry loss by hand, the data checks, and a run
that learns held-out preferences, resumes exactly and writes a directory reward_model loads."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import zoo
from rlzoo.commands.cli import main
from rlzoo.core.errors import ConfigError
from rlzoo.learn.bradley_terry import bradley_terry
from rlzoo.tasks.pairs import batch_rows, load_pairs, split_pairs
from zoo import REGISTRY

TINY = [*zoo.TINY, "rm.batch_size=16", "rm.eval_every=0", "trainer.lr=0.003"]


def sorting_pairs(path: Path, count: int = 200, seed: int = 0) -> Path:
    """Pairs over 3-digit sorting: the sorted digits chosen, a shuffled order rejected."""
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        digits = "".join(rng.choice("0123456789") for _ in range(3))
        good = "".join(sorted(digits))
        bad = good
        while bad == good and len(set(digits)) > 1:
            bad = "".join(rng.sample(digits, 3))
        if bad == good:
            bad = good[::-1] + "9"
        lines.append(json.dumps({"prompt": digits + "=", "chosen": good, "rejected": bad}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_bradley_terry_by_hand() -> None:
    chosen, rejected = torch.tensor([2.0, 0.0, -30.0]), torch.tensor([1.0, 0.0, 30.0])
    margin = torch.tensor([0.5, 0.0, 0.0])
    want = [-math.log(1 / (1 + math.exp(-0.5))), math.log(2.0), 60.0]
    assert bradley_terry(chosen, rejected, margin).tolist() == pytest.approx(want, rel=1e-6)


def test_split_and_batches_are_functions_of_the_seed_and_step() -> None:
    train, held = split_pairs(100, 0.1, seed=3)
    assert len(held) == 10 and not set(train) & set(held) and sorted(train + held) == list(range(100))
    assert split_pairs(100, 0.1, seed=3) == (train, held) and split_pairs(100, 0.1, seed=4) != (train, held)
    steps = [batch_rows(train, 32, step, seed=3) for step in range(1, 4)]  # 96 of 90 rows: wraps into epoch 1
    assert all(len(rows) == 32 for rows in steps)
    assert set(steps[0] + steps[1] + steps[2][:26]) == set(train)  # one epoch, each row once
    assert batch_rows(train, 32, 2, seed=3) == steps[1]


@pytest.mark.parametrize("row, message", [
    ({"prompt": "1=", "chosen": "1"}, "row 2 has no 'rejected' column"),
    ({"prompt": "1=", "chosen": 5, "rejected": "1"}, "row 2 column 'chosen' is '5': give text or chat messages"),
    ({"prompt": "1=", "chosen": "1", "rejected": "2", "margin": -1}, "row 2 column 'margin' is -1"),
    ({"prompt": [{"role": "user"}], "chosen": "1", "rejected": "2"}, "row 2 column 'prompt'"),
])
def test_bad_preference_rows_are_named(tmp_path: Path, row: dict, message: str, capsys) -> None:
    path = tmp_path / "prefs.jsonl"
    path.write_text(json.dumps({"prompt": "1=", "chosen": "1", "rejected": "2"}) + "\n" + json.dumps(row) + "\n")
    assert main(["rm", *TINY, f"rm.data={path}", f"run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err
    assert not (tmp_path / "run").exists()  # refused before the run directory


def test_missing_data_and_files_are_refused(tmp_path: Path, capsys) -> None:
    assert main(["rm", *TINY]) == 2
    assert "set rm.data to a .jsonl or .parquet file" in capsys.readouterr().err
    assert main(["rm", *TINY, f"rm.data={tmp_path / 'no.jsonl'}"]) == 2
    assert "preference file" in capsys.readouterr().err
    assert main(["rm", *TINY, "rm.data=x.jsonl", "rm.eval_fraction=-0.5"]) == 2
    assert "rm.eval_fraction" in capsys.readouterr().err


def test_chat_message_pairs_and_parquet_load(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{"prompt": [{"role": "user", "content": "21="}], "chosen": [{"role": "assistant", "content": "12"}],
             "rejected": [{"role": "assistant", "content": "21"}], "margin": 1.0}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    pairs = load_pairs(tmp_path / "p.parquet")
    assert pairs[0].chosen == rows[0]["chosen"] and pairs[0].margin == 1.0


def test_rm_learns_resumes_exactly_and_writes_a_reward_model(tmp_path: Path) -> None:
    data = sorting_pairs(tmp_path / "prefs.jsonl")
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = [*TINY, f"rm.data={data}", "checkpoint.every=3"]
    assert main(["rm", *common, "rm.steps=6", f"run_dir={straight}"]) == 0
    assert main(["rm", *common, "rm.steps=3", f"run_dir={split}"]) == 0
    assert main(["rm", f"resume={split}", "rm.steps=6"]) == 0
    a = load_file(straight / "reward_model" / "model.safetensors")
    b = load_file(split / "reward_model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(straight)).Reload()
    assert [e.step for e in events.Scalars("rm/loss")] == list(range(1, 7))
    assert events.Scalars("eval/accuracy")[-1].step == 6
    # the written directory scores through the reward function
    component = REGISTRY.get("reward", "reward_model")
    scorer = component.bind(component.params(path=str(straight / "reward_model"))).build(device=torch.device("cpu"))
    assert scorer(prompts=["21="], completions=["12"]).shape == (1,)


@pytest.mark.slow
def test_rm_reaches_high_held_out_accuracy_on_sorting_pairs(tmp_path: Path) -> None:
    data = sorting_pairs(tmp_path / "prefs.jsonl", count=400)
    run = tmp_path / "run"
    assert main(["rm", *TINY, f"rm.data={data}", "rm.steps=60", "rm.batch_size=32", f"run_dir={run}"]) == 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accuracy = EventAccumulator(str(run)).Reload().Scalars("eval/accuracy")[-1].value
    assert accuracy >= 0.8, accuracy


def test_rm_starts_from_a_model_path_backbone(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from rlzoo.models.build import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer("0123456789=")
    shape = OmegaConf.create({"arch": "llama", "hidden_size": 16, "intermediate_size": 32, "num_layers": 1,
                              "num_heads": 2, "num_kv_heads": 1})
    build_tiny_model(shape, tokenizer, 64).save_pretrained(str(tmp_path / "lm"))
    tokenizer.save_pretrained(str(tmp_path / "lm"))
    data = sorting_pairs(tmp_path / "prefs.jsonl", count=40)
    run = tmp_path / "run"
    assert main(["rm", *TINY, f"rm.data={data}", "rm.steps=2", f"model.path={tmp_path / 'lm'}", f"run_dir={run}"]) == 0
    config = json.loads((run / "reward_model" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"] and config["num_hidden_layers"] == 1


# ------------------------------------------------------------------ bad inputs: one line, no run directory


def _error_line(capsys) -> str:
    """The one ``rlzoo: error:`` line of the last command (no traceback)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("rlzoo: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _lying_parquet(path: Path) -> Path:
    """A Parquet file whose footer claims to be 2 GB long."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"prompt": "1=", "chosen": "1", "rejected": "2", "answer": "1"}]), path)
    data = bytearray(path.read_bytes())
    data[-8:-4] = (2_000_000_000).to_bytes(4, "little")  # footer length, before the closing b"PAR1"
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("make, fragment", [
    (lambda p: (p.with_suffix(".jsonl").write_bytes(b'{"prompt": "1=", "chosen": "1", "rejected": "2", '
                                                    b'"answer": "1"}\n{"prompt": "\xff\xfe"}\n'),
                p.with_suffix(".jsonl"))[1], "is not a UTF-8 text file (line 2: byte 76 is 0xff)"),
    (lambda p: _lying_parquet(p.with_suffix(".parquet")), "cannot be read (ArrowInvalid: "),
])
def test_unreadable_data_files_are_refused_alike_by_rm_and_task_file(tmp_path: Path, capsys, make,
                                                                     fragment: str) -> None:
    """rm.data and task=file read files through one reader (rlzoo.tasks.task.read_rows): the same
    bytes give the same one-line refusal, before any run directory."""
    path = make(tmp_path / "data")
    assert main(["rm", *TINY, f"rm.data={path}", f"run_dir={tmp_path / 'rm'}"]) == 2
    line = _error_line(capsys)
    assert f"preference file {str(path)!r}" in line and fragment in line, line
    assert main(["train", *zoo.TINY, f"task={{name: file, path: {path}}}", f"run_dir={tmp_path / 'train'}"]) == 2
    line = _error_line(capsys)
    assert f"task file {str(path)!r}" in line and fragment in line, line
    assert not (tmp_path / "rm").exists() and not (tmp_path / "train").exists()


def _pairs_file(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p, "chosen": c, "rejected": r}) + "\n" for p, c, r in rows))
    return path


@pytest.mark.parametrize("rows, extra, fragment", [
    ([("", "", "")] * 4, [], "row 1: 'prompt' and 'chosen' are both empty: the reward model would read no text"),
    ([("1=", "1", "2"), ("", "", "2")], [], "row 2: 'prompt' and 'chosen' are both empty"),
    ([("1=", "1", "1"), ("2=", "22", "22")], [], "chosen == rejected in every pair (2): the reward model cannot "
                                                 "learn a preference from ties"),
    ([("1=", "1", "2"), ("2=", "2", "1")], ["rm.eval_fraction=1.0"], "invalid value for rm.eval_fraction: 1.0; must "
                                                                    "be in [0, 1)"),
])
def test_pairs_it_cannot_learn_from_are_refused_before_the_run_directory(tmp_path: Path, capsys, rows, extra,
                                                                        fragment: str) -> None:
    data = _pairs_file(tmp_path / "prefs.jsonl", rows)
    assert main(["rm", *TINY, f"rm.data={data}", *extra, f"run_dir={tmp_path / 'run'}"]) == 2
    assert fragment in _error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_some_tied_pairs_are_a_warning(tmp_path: Path, capsys) -> None:
    data = _pairs_file(tmp_path / "prefs.jsonl", [("1=", "1", "2"), ("2=", "2", "2"), ("3=", "3", "1")])
    assert main(["rm", *TINY, f"rm.data={data}", "rm.steps=1", "rm.eval_fraction=0", "rm.batch_size=2",
                 f"run_dir={tmp_path / 'run'}"]) == 0
    assert "rlzoo: warning: rm.data" in capsys.readouterr().err
    # the message itself, by hand
    from rlzoo.tasks.pairs import load_pairs, tie_warning

    assert tie_warning(load_pairs(data), "p") == ("rm.data 'p': chosen == rejected in 1 of 3 pairs (rows 2): they add "
                                                  "a constant to the loss and teach nothing")


def test_fit_context_keeps_the_last_tokens() -> None:
    from rlzoo.models.reward_model import fit_context

    assert fit_context([[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]], 3) == ([[3, 4, 5], [6, 7], [8, 9, 10]], 1)
    assert fit_context([[1, 2]], None) == ([[1, 2]], 0)


def test_a_text_past_the_context_keeps_its_end_and_allocates_nothing_big(tmp_path: Path, capsys) -> None:
    """A 200,000-character response: the tiny backbone's context stops at TINY_CONTEXT (1024)
    and the text keeps its last 1024 tokens, with one warning; a second of CPU, not 40 GB."""
    from rlzoo.run.rm_trainer import TINY_CONTEXT

    data = _pairs_file(tmp_path / "prefs.jsonl", [("1=", "12" * 100_000, "2"), ("2=", "2", "1")])
    run = tmp_path / "run"
    assert main(["rm", *TINY, f"rm.data={data}", "rm.steps=1", "rm.eval_fraction=0", "rm.batch_size=2",
                 f"run_dir={run}"]) == 0
    err = capsys.readouterr().err
    assert err.count("longer than the reward model's context (1024 tokens)") == 1, err
    assert TINY_CONTEXT == 1024
    config = json.loads((run / "reward_model" / "config.json").read_text())
    assert config["max_position_embeddings"] == 1024


def test_the_reward_function_cuts_as_rm_trained(tmp_path: Path, capsys) -> None:
    """reward_model scores a text past its context (64 here) as its last 64 tokens."""
    from rlzoo.models.reward_model import score_ids

    model, tokenizer = zoo.tiny_reward_model(tmp_path / "rm")
    component = REGISTRY.get("reward", "reward_model")
    scorer = component.bind(component.params(path=str(tmp_path / "rm"))).build(device=torch.device("cpu"))
    long = "1=" + "0123456789" * 20
    ids = tokenizer(long, add_special_tokens=True).input_ids
    assert len(ids) > 64
    want = score_ids(model, [ids[-64:]], tokenizer.pad_token_id, 1, torch.device("cpu"))
    got = scorer(prompts=["1="], completions=[long[2:]])
    assert torch.equal(got, want)
    assert "longer than the reward model's context (64 tokens)" in capsys.readouterr().err


class _Payload:
    """Unpickling this touches ``marker``: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_pickled_reward_model_checkpoint_is_refused_on_resume(tmp_path: Path, capsys) -> None:
    """rlzoo rm resume= reads the checkpoint's reward_model/ as rlzoo train reads a policy:
    a pickle .bin is one error line and never runs."""
    import pickle

    from rlzoo.run.checkpoint import list_checkpoints, write_manifest

    data = sorting_pairs(tmp_path / "prefs.jsonl", count=8)
    run = tmp_path / "run"
    assert main(["rm", *TINY, f"rm.data={data}", "rm.steps=1", "rm.batch_size=2", f"run_dir={run}"]) == 0
    checkpoint = list_checkpoints(run)[-1][1]
    weights = checkpoint / "reward_model"
    (weights / "model.safetensors").unlink()
    marker = tmp_path / "PWNED"
    with open(weights / "pytorch_model.bin", "wb") as handle:
        pickle.dump({"x": _Payload(marker)}, handle)
    write_manifest(checkpoint)
    capsys.readouterr()
    assert main(["rm", f"resume={run}", "rm.steps=2"]) == 2
    line = _error_line(capsys)
    assert f"cannot load the model in {str(weights)!r}" in line, line
    assert not marker.exists()


# ------------------------------------------------------------------ every architecture rlzoo train accepts

NO_CLASSIFIER = {
    "codegen": {"rotary_dim": 4, "n_ctx": 256}, "cohere": {}, "cohere2": {},
    "falcon_h1": {"mamba_d_ssm": 64, "mamba_d_state": 8, "mamba_n_heads": 4, "mamba_chunk_size": 16},
    "granite": {}, "granitemoe": {"num_local_experts": 2, "num_experts_per_tok": 1}, "hyperclovax": {},
    "nanochat": {}, "vaultgemma": {},
}
"""Architectures transformers has no ``...ForSequenceClassification`` for (5.24), with the
overrides that make a tiny one: ``rlzoo rm`` puts the critic's value head on their backbone."""


def _causal_lm_dir(arch: str, path: Path) -> Path:
    """A tiny random ``arch`` causal LM with a character tokenizer, saved to ``path``."""
    import string

    from transformers import AutoConfig, AutoModelForCausalLM

    from rlzoo.models.build import build_char_tokenizer

    tokenizer = build_char_tokenizer(string.digits + string.ascii_letters + string.punctuation + " ")
    config = AutoConfig.for_model(arch, vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                  max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
                                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                  **NO_CLASSIFIER[arch])
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


@pytest.mark.parametrize("arch", sorted(NO_CLASSIFIER))
def test_rm_trains_a_reward_model_on_an_architecture_without_a_classifier_class(arch: str, tmp_path: Path) -> None:
    """The reward model is the backbone with a value head (an rlzoo critic directory), and the
    ``reward_model`` reward function scores with what was trained (the head starts at 0)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    assert arch not in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES  # else this test tests nothing new
    lm = _causal_lm_dir(arch, tmp_path / "lm")
    run = tmp_path / "run"
    assert main(["rm", *zoo.TINY, f"model.path={lm}", "rm.data=task", "rm.task_pairs=32", "rm.steps=3",
                 "rm.batch_size=8", "rm.eval_fraction=0.25", "trainer.lr=0.01", f"run_dir={run}"]) == 0
    out = run / "reward_model"
    assert (out / "value_head.safetensors").is_file() and (out / "tokenizer.json").is_file()
    component = REGISTRY.get("reward", "reward_model")
    scorer = component.bind(component.params(path=str(out))).build(device=torch.device("cpu"))
    scores = scorer(prompts=["321=", "321="], completions=["123", "312"])
    assert scores.shape == (2,) and torch.isfinite(scores).all() and bool((scores != 0).any())


def test_a_value_head_reward_model_resumes_exactly(tmp_path: Path) -> None:
    lm = _causal_lm_dir("granite", tmp_path / "lm")
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ["rm", *zoo.TINY, f"model.path={lm}", "rm.data=task", "rm.task_pairs=32", "rm.batch_size=8",
              "rm.eval_every=0", "checkpoint.every=2", "trainer.lr=0.01"]
    assert main([*common, "rm.steps=4", f"run_dir={straight}"]) == 0
    assert main([*common, "rm.steps=2", f"run_dir={split}"]) == 0
    assert main(["rm", f"resume={split}", "rm.steps=4"]) == 0
    for name in ("model.safetensors", "value_head.safetensors"):
        a, b = load_file(straight / "reward_model" / name), load_file(split / "reward_model" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_held_out_share_that_leaves_less_than_a_batch_is_a_warning(tmp_path: Path, capsys) -> None:
    data = sorting_pairs(tmp_path / "prefs.jsonl", count=40)
    assert main(["rm", *TINY, f"rm.data={data}", "rm.steps=1", "rm.batch_size=4", "rm.eval_fraction=0.999",
                 f"run_dir={tmp_path / 'run'}"]) == 0
    assert ("rlzoo: warning: rm.eval_fraction=0.999 leaves 1 of 40 pairs for training, fewer than rm.batch_size=4: "
            "each step repeats them") in capsys.readouterr().err
    assert main(["rm", *TINY, f"rm.data={data}", "rm.steps=1", "rm.batch_size=4", f"run_dir={tmp_path / 'ok'}"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_rm_is_checked_as_an_rm_run_not_as_rl_training(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rlzoo rm launcher.nproc=N` was refused for rollout.prompts_per_step (16, not divisible by
    3), a key rm never reads; now rm's own split of rm.batch_size is what is checked, before any
    process starts, and on a rank (WORLD_SIZE set) no RL check refuses the rm config either."""
    from rlzoo.run.resume import load_run_config

    assert main(["rm", "launcher.nproc=3", "rm.data=task", "rm.batch_size=7", "rm.steps=1"]) == 2
    assert capsys.readouterr().err == ("rlzoo: error: rm.batch_size=7 does not split over 3 processes: each trains on "
                                       "an equal share of a step's pairs; use a multiple of 3\n")
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it for each rank
    rl_only = ["rm.data=task", "rollout.prompts_per_step=3", "rollout.n=1", "advantage=grpo"]
    with pytest.raises(ConfigError, match="need groups of completions"):
        load_run_config(REGISTRY, rl_only)  # an RL run with these keys is still refused
    plan = load_run_config(REGISTRY, rl_only, reward_model=True).plan
    assert plan.world == 1 and plan.episodes is None
