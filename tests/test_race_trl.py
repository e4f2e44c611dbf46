"""benchmarks/race_trl.py: the learning race of rlzoo against TRL's GRPOTrainer, on a tiny
model (the real race runs SmolLM2; see the script's docstring)."""

import string
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark



def load_race():
    return load_benchmark("race_trl")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A random qwen2 of width 32 with a character tokenizer covering the task's text."""
    import torch
    from omegaconf import OmegaConf

    from rlzoo.models.build import build_char_tokenizer, build_tiny_model

    torch.manual_seed(0)
    tokenizer = build_char_tokenizer(string.printable)
    cfg = OmegaConf.create(dict(arch="qwen2", hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                                num_kv_heads=1))
    path = tmp_path_factory.mktemp("race") / "model"
    build_tiny_model(cfg, tokenizer, max_positions=256).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_trl_settings_follow_the_rlzoo_config(tiny_model):
    """The TRL mapping reads rlzoo's resolved grpo preset, and refuses what it cannot map."""
    from rlzoo.plan.planner import load_config
    from rlzoo.contract.loading import build_registry, make_plugin_manager

    race = load_race()
    args = race.parser().parse_args([])
    registry = build_registry(make_plugin_manager())
    cfg = load_config(registry, race.rlzoo_overrides(tiny_model, 3, args)).cfg
    trl = race.trl_settings(cfg)
    assert (trl["per_device_train_batch_size"], trl["steps_per_generation"], trl["num_generations"]) == (8, 4, 8)
    assert (trl["beta"], trl["loss_type"], trl["scale_rewards"], trl["epsilon"], trl["epsilon_high"]) == \
        (0.04, "grpo", "group", 0.2, 0.2)
    assert (trl["learning_rate"], trl["adam_beta2"], trl["max_grad_norm"], trl["max_steps"], trl["seed"]) == \
        (1e-4, 0.99, 1.0, 160, 3)
    other = load_config(registry, [*race.rlzoo_overrides(tiny_model, 3, args), "loss_agg=token-sum"]).cfg
    with pytest.raises(ValueError, match="loss_agg='token-sum' has no TRL loss_type"):
        race.trl_settings(other)


@pytest.mark.slow
def test_race_on_a_tiny_model(tiny_model, tmp_path, capfd):
    """Both systems train 2 steps with evaluation every step; the table has both; TRL's
    reward wrapper gives rlzoo's reward for a known completion."""
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    pytest.importorskip("reasoning_gym")
    race = load_race()
    out = tmp_path / "race.md"
    out.write_text("# Results\n\n## Other\n\nkept\n")
    race.main(["--model", str(tiny_model), "--seeds", "0", "--steps", "2", "--eval-every", "1", "--eval-size", "4",
               "--prompts", "2", "--n", "2", "--max-new-tokens", "4", "--runs", str(tmp_path / "runs"),
               "--write", str(out)])
    printed = capfd.readouterr().out
    assert "plan of both systems" in printed and "loss_type grpo" in printed      # the TRL worker's plan
    text = out.read_text()
    assert "## Other\n\nkept" in text and race.SECTION in text
    rows = [line for line in text.splitlines() if line.startswith(("| rlzoo |", "| trl |"))]
    assert [row.split("|")[1].strip() for row in rows] == ["rlzoo", "trl"]
    for row in rows:                                   # 3 evaluations (steps 0, 1, 2) per system
        assert row.split("|")[3].count("→") == 2 and "—" not in row.split("|")[3]
    race.write_section(out, f"{race.SECTION}\n\nnew table\n")
    text = out.read_text()                                          # replaced, not appended twice
    assert text.count(race.SECTION) == 1 and "new table" in text and "| trl |" not in text
    assert "## Other\n\nkept" in text


def test_the_vllm_system_is_the_rlzoo_run_with_the_vllm_backend(tmp_path, monkeypatch, capsys):
    """``--systems rlzoo,rlzoo-vllm``: the same rlzoo run twice, the second with generation on
    a one-core vLLM engine, each in its own run directory, both rows in the table."""
    race = load_race()
    calls = []

    def run_rlzoo(model_dir, seed, args, run_dir, extra=()):
        calls.append((run_dir.name, extra))
        final = 0.5 if extra else 0.375
        return {"evals": {0: {"strict": 0.25, "lenient": 0.25}, 2: {"strict": final, "lenient": final}},
                "step_s": [1.0, 2.0], "eval_s": []}

    monkeypatch.setattr(race, "run_rlzoo", run_rlzoo)
    race.main(["--model", str(tmp_path), "--systems", "rlzoo,rlzoo-vllm", "--seeds", "0", "--steps", "2",
               "--threshold", "0.5", "--runs", str(tmp_path / "runs")])
    assert sorted(calls) == [("rlzoo-seed0", ()), ("rlzoo-vllm-seed0", ("rollout.backend={name: vllm, threads: 1}",))]
    printed = capsys.readouterr().out
    assert "| rlzoo | 0 | 0.250 → 0.375 | not reached | not reached | 1.5 | 3 |" in printed
    assert "| rlzoo-vllm | 0 | 0.250 → 0.500 | 2 | 3 | 1.5 | 3 |" in printed
