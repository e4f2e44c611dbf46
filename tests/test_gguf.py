"""``model.path`` naming a ``.gguf`` file (issue 20): loaded through transformers'
``gguf_file=``, saved as a plain model directory (the gguf quantizer dropped), so
``init_model/`` and checkpoints hold the converted weights and a resume never converts
again; without the ``gguf`` package, a clear exit 2 naming the pip command.

The GGUF file is written here with gguf's own writer: a 1-layer llama of width 16 with a
byte-level BPE vocabulary of 42 tokens (no download, no 98 MB model)."""

from __future__ import annotations

import importlib.util
import json
import string
from pathlib import Path

import pytest
import torch

from rlzoo.models import build as models
from rlzoo.models import model_files
from rlzoo.commands.cli import main

TOKENS = ["<s>", "</s>", "<unk>"] + list(string.digits + string.ascii_lowercase + "+-=? ")


def write_tiny_gguf(path: Path) -> None:
    """A tiny llama GGUF file (float32 tensors) with a BPE tokenizer over :data:`TOKENS`."""
    gguf = pytest.importorskip("gguf", reason="the gguf extra is not installed (pip install 'rlzoo[gguf]')")
    numpy = pytest.importorskip("numpy")
    vocab, hidden, ff, heads = len(TOKENS), 16, 32, 2
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_block_count(1)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(TOKENS)
    writer.add_token_merges([])
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types([3, 3, 2] + [1] * (vocab - 3))
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    rng = numpy.random.default_rng(0)

    def tensor(*shape: int):
        return (rng.standard_normal(shape) * 0.1).astype(numpy.float32)

    writer.add_tensor("token_embd.weight", tensor(vocab, hidden))
    writer.add_tensor("output.weight", tensor(vocab, hidden))
    writer.add_tensor("output_norm.weight", numpy.ones(hidden, numpy.float32))
    for name, shape in [("attn_q", (hidden, hidden)), ("attn_k", (hidden, hidden)), ("attn_v", (hidden, hidden)),
                        ("attn_output", (hidden, hidden)), ("ffn_gate", (ff, hidden)), ("ffn_up", (ff, hidden)),
                        ("ffn_down", (hidden, ff))]:
        writer.add_tensor(f"blk.0.{name}.weight", tensor(*shape))
    for name in ("attn_norm", "ffn_norm"):
        writer.add_tensor(f"blk.0.{name}.weight", numpy.ones(hidden, numpy.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_gguf_file_loads_saves_as_a_plain_directory_and_reloads_equal(tmp_path: Path) -> None:
    pytest.importorskip("accelerate", reason="transformers reads GGUF files with accelerate (the gguf extra)")
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    model, tokenizer = models.load_pretrained(path)
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id is not None
    model.save_pretrained(tmp_path / "out")                      # refused while the gguf quantizer is attached
    tokenizer.save_pretrained(tmp_path / "out")
    assert "quantization_config" not in json.loads((tmp_path / "out" / "config.json").read_text())
    again, again_tokenizer = models.load_pretrained(tmp_path / "out")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert again_tokenizer("12+3=")["input_ids"] == tokenizer("12+3=")["input_ids"]


@pytest.mark.slow
def test_train_from_a_gguf_file_and_resume_without_it(tmp_path: Path, capsys) -> None:
    pytest.importorskip("accelerate", reason="transformers reads GGUF files with accelerate (the gguf extra)")
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    run = tmp_path / "run"
    common = ["task.num_digits=3", "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4",
              "eval.size=0", "logging.progress=false", "trainer.threads=1"]
    assert main(["train", f"model.path={path}", f"run_dir={run}", "trainer.total_steps=1", *common]) == 0, \
        capsys.readouterr().err
    assert "policy model check" in capsys.readouterr().out
    assert (run / "init_model" / "model.safetensors").is_file()
    path.unlink()                                                 # resume reads init_model/, never the GGUF file
    assert main(["train", f"resume={run}", "trainer.total_steps=2"]) == 0, capsys.readouterr().err


def test_a_gguf_path_without_the_gguf_package_exits_2_naming_the_pip_command(tmp_path: Path, capsys,
                                                                              monkeypatch) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(model_files.importlib.util, "find_spec",
                        lambda name, *a: None if name == "gguf" else real(name, *a))
    code = main(["train", f"model.path={path}", f"run_dir={tmp_path / 'run'}", "logging.progress=false"])
    err = capsys.readouterr().err
    assert code == 2 and "is a GGUF file, which needs the gguf package: pip install 'rlzoo[gguf]'" in err
    assert not (tmp_path / "run").exists()


def test_a_missing_gguf_file_exits_2(tmp_path: Path, capsys) -> None:
    code = main(["train", f"model.path={tmp_path / 'absent.gguf'}", f"run_dir={tmp_path / 'run'}"])
    assert code == 2 and "absent.gguf' is not a file" in capsys.readouterr().err
