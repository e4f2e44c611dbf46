"""Mixed precision (``trainer.precision=bf16``): bfloat16 compute over float32 master
weights; the head, log-probs, values and losses stay float32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlzoo.commands.cli import main
from rlzoo.plan.planner import load_config
from rlzoo.core.errors import ConfigError
from rlzoo.models.logprobs import response_forward
from rlzoo.models.build import build_char_tokenizer, build_tiny_model
import zoo
from zoo import REGISTRY

TINY = [*zoo.TINY, "eval.size=0"]


def test_bf16_over_bf16_weights_and_unknown_precisions_are_refused() -> None:
    with pytest.raises(ConfigError, match="trainer.precision=bf16 computes in bfloat16 over float32 master weights"):
        load_config(REGISTRY, ["trainer.precision=bf16", "model.dtype=bfloat16"])
    with pytest.raises(ConfigError, match="invalid value for trainer.precision: 'fp16'; choose one of fp32, bf16"):
        load_config(REGISTRY, ["trainer.precision=fp16"])
    plan = load_config(REGISTRY, ["trainer.precision=bf16"]).plan
    assert plan.precision == "bf16" and "precision: bf16 autocast" in plan.render()


def test_under_autocast_the_backbone_runs_in_bf16_and_the_log_probs_in_fp32() -> None:
    from omegaconf import OmegaConf

    tokenizer = build_char_tokenizer("0123456789=")
    cfg = OmegaConf.create({"arch": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_layers": 1,
                            "num_heads": 2, "num_kv_heads": 1})
    model = build_tiny_model(cfg, tokenizer)
    seen: list[torch.dtype] = []
    model.get_decoder().layers[0].mlp.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    prompt, response = torch.tensor([[4, 5, 14]]), torch.tensor([[6, 7, 2]])
    ones = torch.ones_like
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = response_forward(model, prompt, ones(prompt), response, ones(response).float(), with_entropy=True,
                               with_logits=True)
    assert seen == [torch.bfloat16]
    assert out.logp.dtype == out.entropy.dtype == out.logits.dtype == torch.float32
    reference = response_forward(model, prompt, ones(prompt), response, ones(response).float())
    assert torch.allclose(out.logp, reference.logp, atol=0.05) and not torch.equal(out.logp, reference.logp)


@pytest.mark.slow
def test_bf16_keeps_float32_weights_and_changes_the_update(tmp_path: Path) -> None:
    runs = {}
    for precision in ("fp32", "bf16"):
        run_dir = tmp_path / precision
        assert main(["train", *TINY, f"trainer.precision={precision}", f"run_dir={run_dir}",
                     "trainer.total_steps=2", "algo=ppo"]) == 0           # a critic too
        runs[precision] = {name: load_file(str(run_dir / "checkpoints" / "step_000002" / name / "model.safetensors"))
                           for name in ("policy", "critic")}
    for name in ("policy", "critic"):
        weights = runs["bf16"][name]
        assert all(t.dtype == torch.float32 for t in weights.values()), name
        assert any(not torch.equal(weights[k], runs["fp32"][name][k]) for k in weights), name


def test_the_head_matmul_follows_autocast_and_its_logits_are_float32() -> None:
    from rlzoo.models.logprobs import head_logits

    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(3, 5, 16, generator=gen), torch.randn(40, 16, generator=gen)
    plain = head_logits(hidden, weight, None)
    assert plain.dtype == torch.float32 and torch.equal(plain, torch.nn.functional.linear(hidden, weight))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = head_logits(hidden, weight, None)
    assert mixed.dtype == torch.float32
    assert torch.equal(mixed, torch.nn.functional.linear(hidden.bfloat16(), weight.bfloat16()).float())
    bf16_weights = head_logits(hidden.bfloat16(), weight.bfloat16(), None)      # model.dtype=bfloat16: upcast
    assert torch.equal(bf16_weights, torch.nn.functional.linear(hidden.bfloat16().float(), weight.bfloat16().float()))
