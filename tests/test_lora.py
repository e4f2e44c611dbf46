"""LoRA through peft (``model.lora.*``): config-time refusals, the adapters-off reference,
adapter-only optimisation, bit-exact resume, ``rlzoo export`` and the rollout paths."""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from rlzoo.commands.cli import main
from rlzoo.plan.run_input import engine_input, load_run
from rlzoo.plan.planner import load_config
from rlzoo.core.errors import ConfigError
from rlzoo.core.events import read_scalars
from rlzoo.commands.export import export_policy
from rlzoo.models.logprobs import response_forward
from rlzoo.models.lora import ADAPTER_WEIGHTS, AdaptersOff, adapter_parameters, base_state_dict
from rlzoo.models.build import load_pretrained
from rlzoo.run.resume import load_run_config
from rlzoo.run.trainer import Trainer
from zoo import PM, REGISTRY, TINY

LORA = ["model.lora.rank=4", "model.lora.alpha=8", "trainer.lr=0.01"]
"""A LoRA run of the tiny model (a large lr, so the adapters move away from B = 0 at once)."""
QUIET = ["eval.size=0", "logging.sample_every=0"]


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def _trainer(tmp_path: Path, *overrides: str, name: str = "run") -> Trainer:
    return Trainer(load_run(REGISTRY, [*TINY, *QUIET, *LORA, *overrides, f"run_dir={tmp_path / name}"]), PM)


def _logp(model: torch.nn.Module, batch) -> torch.Tensor:
    with torch.no_grad():
        return response_forward(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                batch.response_mask).logp


# ------------------------------------------------------------------ config time


def test_missing_or_old_peft_is_refused_with_the_pip_command(capsys, monkeypatch) -> None:
    real = importlib.metadata.version

    def version(name: str) -> str:
        if name == "peft":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    err = _error(capsys, ["config", "model.lora.rank=8"])
    assert "model.lora.rank=8 trains LoRA adapters through peft, but the peft package is not installed" in err
    assert "pip install 'rlzoo[lora]'" in err
    assert main(["config"]) == 0                                    # rank 0 never asks for peft
    capsys.readouterr()
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.10.0" if name == "peft" else real(name))
    assert "peft 0.10.0 is installed, older than 0.11" in _error(capsys, ["config", "model.lora.rank=8"])


@pytest.mark.parametrize("override, message", [
    ("model.lora.rank=-1", "invalid value for model.lora.rank: -1; must be >= 0"),
    ("model.lora.alpha=0", "invalid value for model.lora.alpha: 0.0; must be > 0"),
    ("model.lora.dropout=1.0", "invalid value for model.lora.dropout: 1.0; must be in [0, 1)"),
    ("model.lora.target_modules=[]", "invalid value for model.lora.target_modules: []"),
    ("model.lora.rnak=4", "unknown config key 'model.lora.rnak'"),
])
def test_bad_lora_values_are_refused(capsys, override: str, message: str) -> None:
    assert message in _error(capsys, ["config", override])


def test_fsdp_and_sft_are_refused_and_rank_zero_warns_about_inert_keys(capsys) -> None:
    err = _error(capsys, ["config", "model.lora.rank=4", "launcher.nproc=2", "distributed.strategy=fsdp"])
    assert "model.lora.rank=4 with distributed.strategy=fsdp is not supported" in err
    assert "use distributed.strategy=ddp" in err
    err = _error(capsys, ["sft", "--steps", "1", "model.lora.rank=4"])
    assert "rlzoo sft trains every weight of the model; model.lora.rank=4 is for rlzoo train" in err
    resolved = load_config(REGISTRY, ["model.lora.alpha=32"])
    assert any("model.lora.rank=0: every weight is trained" in w and "model.lora.alpha" in w
               for w in resolved.plan.warnings)


def test_the_plan_lists_no_second_copy_for_the_reference() -> None:
    plan = load_config(REGISTRY, [*LORA, "kl.coef=0.05"]).plan
    text = plan.render()
    assert "policy: base weights frozen, rank-4 LoRA adapters trained" in text
    assert ("reference: the policy with its LoRA adapters disabled (the frozen base weights; no second copy)"
            in text)
    assert "lora: rank-4 adapters on q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, scaled by " \
           "alpha/rank = 8/4 = 2, dropout 0" in text
    assert plan.to_dict()["lora"]["rank"] == 4
    assert not any("model.lora.dropout" in w for w in plan.warnings)   # dropout 0: nothing to warn about
    full = load_config(REGISTRY, ["kl.coef=0.05"]).plan
    assert full.lora is None and full.models["reference"].startswith("frozen initial policy")
    assert "lora" not in full.render()


@pytest.mark.parametrize("targets, message", [
    ("[q_proj, wq]", "model.lora.target_modules names wq, which match(es) no layer of this model; its linear "
                     "layers are named down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"),
    ("[nothing]", "cannot be adapted"),
    ("[q_proj, lm_head]", "model.lora.target_modules adapts the output embedding"),
])
def test_target_modules_must_name_decoder_layers_of_the_model(tmp_path: Path, targets: str, message: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        _trainer(tmp_path, f"model.lora.target_modules={targets}")
    assert message in str(info.value)


def test_a_rank_above_the_width_is_refused_before_the_run_directory(tmp_path: Path, capsys) -> None:
    """model.lora.rank=100000 on 32-wide layers trained for minutes on gigabytes: the rank of
    an update B·A of a layer is at most the smaller of its inputs and outputs. The tiny
    model's width (hidden_size 32) and a model.path's config.json are known at config time."""
    run = tmp_path / "run"
    err = _error(capsys, ["train", *TINY, *QUIET, "model.lora.rank=100000", f"run_dir={run}"])
    assert ("model.lora.rank=100000 exceeds the model's width (hidden_size 32): every layer LoRA adapts has 32 inputs "
            "or outputs, so its update B·A has rank at most 32") in err and "use model.lora.rank <= 32" in err
    assert not run.exists()
    load_config(REGISTRY, [*TINY, "model.lora.rank=32"])  # the width itself is a full-rank update: accepted
    model_dir = tmp_path / "lm"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"hidden_size": 24}')
    with pytest.raises(ConfigError, match=r"model.lora.rank=25 exceeds the model's width \(hidden_size 24\)"):
        load_config(REGISTRY, [f"model.path={model_dir}", "model.lora.rank=25"])


def test_a_rank_above_every_adapted_layer_is_refused_when_the_model_is_built(tmp_path: Path, capsys) -> None:
    """Only k_proj and v_proj (32 -> 16 in the tiny model): rank 20 passes the config's
    width check and is refused when the adapters are built, naming the layers' widths;
    the run directory made for it is removed again."""
    run = tmp_path / "run"
    err = _error(capsys, ["train", *TINY, *QUIET, "model.lora.rank=20", "model.lora.target_modules=[k_proj, v_proj]",
                          f"run_dir={run}"])
    assert ("model.lora.rank=20 exceeds the width of every adapted layer (the smaller of its inputs and outputs: "
            "k_proj 16, v_proj 16)") in err and "use model.lora.rank <= 16" in err
    assert not run.exists()


# ------------------------------------------------------------------ the run's models


def test_only_adapters_train_and_the_reference_is_the_base_with_adapters_off(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, "kl.coef=0.05", "model.lora.dropout=0.1")
    models = trainer.models
    adapter_dropout = [m.p for name, m in models.policy.named_modules()
                       if ".lora_dropout." in name and isinstance(m, torch.nn.Dropout)]
    assert adapter_dropout and set(adapter_dropout) == {0.1}          # the user's choice, kept
    assert any(w.startswith("model.lora.dropout=0.1 is on in the update only (training mode), not in the rollout")
               for w in trainer.plan.warnings)
    base = copy.deepcopy(models.policy.get_base_model())
    plain = type(base)(base.config)
    plain.load_state_dict(base_state_dict(models.policy))           # the initial policy without peft
    assert models.reference is None and isinstance(models.reference_forward, AdaptersOff)
    adapters = adapter_parameters(models.policy)
    assert adapters and all(p.requires_grad for p in adapters.values())
    optimized = [p for group in trainer.learner.optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in optimized} == {id(p) for p in adapters.values()}
    frozen = {k: v.detach().clone() for k, v in models.policy.named_parameters() if "lora_" not in k}
    before = {k: v.detach().clone() for k, v in adapters.items()}

    batch = trainer.sampler.sample(trainer.ctx.prompts)
    metrics = trainer.learn(batch)
    assert metrics["kl/value"] >= 0
    assert all(torch.equal(v, dict(models.policy.named_parameters())[k]) for k, v in frozen.items())
    assert any(not torch.equal(before[k], v) for k, v in adapters.items())
    # the reference pass is the initial policy's log-probs, bit for bit, and the policy moved
    assert torch.equal(batch.ref_logp, _logp(plain, batch) * batch.response_mask)
    models.policy.eval()
    assert not torch.allclose(_logp(models.policy, batch), _logp(plain, batch))
    with models.policy.disable_adapter():
        assert torch.equal(_logp(models.policy, batch), _logp(plain, batch))
    trainer.close()


def test_the_first_step_equals_full_finetuning_at_b_zero(tmp_path: Path) -> None:
    """At step 0 the adapted policy is the base one (B = 0): the same rollout, rewards and
    old log-probs as a run without adapters, from the same seed."""
    lora = _trainer(tmp_path, "trainer.num_mini_batches=2", name="lora")
    full = Trainer(load_run(REGISTRY, [*TINY, *QUIET, "trainer.num_mini_batches=2",
                                          f"run_dir={tmp_path / 'full'}"]), PM)
    state = torch.get_rng_state()
    a = lora.sampler.sample(lora.ctx.prompts)
    torch.set_rng_state(state)
    b = full.sampler.sample(full.ctx.prompts)
    assert torch.equal(a.response_ids, b.response_ids)
    torch.testing.assert_close(a.rollout_logp, b.rollout_logp, rtol=0, atol=1e-6)
    lora.close()
    full.close()


# ------------------------------------------------------------------ checkpoints, resume, export


def test_checkpoints_hold_adapters_and_resume_bit_exactly(tmp_path: Path) -> None:
    common = [*TINY, *QUIET, *LORA, "kl.coef=0.05", "model.lora.dropout=0.1", "trainer.num_mini_batches=2",
              "checkpoint.every=1"]
    want, run = tmp_path / "want", tmp_path / "run"
    assert main(["train", *common, "trainer.total_steps=4", f"run_dir={want}"]) == 0
    assert main(["train", *common, "trainer.total_steps=2", f"run_dir={run}"]) == 0
    assert main(["train", f"resume={run}", "trainer.total_steps=4"]) == 0
    policy_dir = run / "checkpoints" / "step_000004" / "policy"
    assert (policy_dir / ADAPTER_WEIGHTS).is_file() and not (policy_dir / "model.safetensors").exists()
    assert (run / "init_model" / "model.safetensors").is_file()    # the base, a plain model directory
    got = load_file(str(policy_dir / ADAPTER_WEIGHTS))
    expected = load_file(str(want / "checkpoints" / "step_000004" / "policy" / ADAPTER_WEIGHTS))
    assert got.keys() == expected.keys() and all("lora_" in key for key in got)
    for key in expected:
        assert torch.equal(got[key], expected[key]), key
    got_curves, want_curves = read_scalars(run), read_scalars(want)
    for tag in ("reward/mean", "policy/loss", "kl/value", "grad_norm"):
        assert got_curves[tag] == want_curves[tag], tag


def test_export_merges_adapters_into_a_model_that_model_path_loads(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    assert main(["train", *TINY, *QUIET, *LORA, "trainer.total_steps=2", f"run_dir={run}"]) == 0
    out = tmp_path / "merged"
    assert main(["export", str(run), str(out)]) == 0
    assert f"wrote {out} from {run / 'checkpoints' / 'step_000002'}" in capsys.readouterr().out
    assert not (out / "adapter_config.json").exists()
    merged, _ = load_pretrained(out)
    trainer = Trainer(engine_input(load_run_config(REGISTRY, [f"resume={run}"])), PM)  # the base + the step-2 adapters
    batch = trainer.sampler.sample(trainer.ctx.prompts)
    trainer.models.policy.eval()
    adapted = _logp(trainer.models.policy, batch)
    base, _ = load_pretrained(run / "init_model")
    assert (adapted - _logp(base, batch)).abs().max() > 1e-3       # the adapters changed the policy
    torch.testing.assert_close(_logp(merged, batch), adapted, rtol=0, atol=1e-5)
    trainer.close()
    # model.path loads it as a plain model: a new run starts from the merged weights
    again = Trainer(load_run(REGISTRY, [*TINY, *QUIET, f"model.path={out}", f"run_dir={tmp_path / 'again'}"]), PM)
    torch.testing.assert_close(_logp(again.models.policy, batch), adapted, rtol=0, atol=1e-5)
    again.close()
    assert "exists and is not an empty directory" in _error(capsys, ["export", str(run), str(out)])
    assert "has no checkpoint step_000009" in _error(capsys, ["export", str(run), str(tmp_path / "x"), "--step", "9"])


def test_export_of_a_full_finetuning_run_is_its_policy(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main(["train", *TINY, *QUIET, "trainer.total_steps=1", f"run_dir={run}"]) == 0
    export_policy(run, tmp_path / "out")
    got = load_file(str(tmp_path / "out" / "model.safetensors"))
    want = load_file(str(run / "checkpoints" / "step_000001" / "policy" / "model.safetensors"))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


# ------------------------------------------------------------------ rollout, precision, critic


def test_the_rollout_samples_from_the_adapted_policy_it_trains(tmp_path: Path) -> None:
    """The KV-cache decode loop (through peft's forward) and the training forward (decoder +
    chunked head over the output embedding) give the same log-probs once the adapters have
    moved: ``rollout/mismatch_k3`` stays at float rounding."""
    trainer = _trainer(tmp_path)
    first = trainer.train_step()
    second = trainer.train_step()
    assert first["grad_norm"] > 0 and second["rollout/mismatch_k3"] < 1e-9
    assert second["rollout/max_abs_log_ratio"] < 1e-4
    trainer.close()


def test_rollout_dtype_copy_syncs_the_adapters(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, "rollout.dtype=bfloat16", "trainer.total_steps=1")
    trainer.train_step()
    backend = trainer.sampler.backend
    assert backend.copy
    live = dict(trainer.models.policy.named_parameters())
    for name, param in backend.model.named_parameters():
        assert param.dtype == torch.bfloat16
        assert torch.equal(param, live[name].detach().to(torch.bfloat16)), name
    trainer.close()


def test_gradient_checkpointing_gives_the_adapters_the_same_gradients(tmp_path: Path) -> None:
    """The embeddings are frozen, so checkpointed blocks get an input that requires grad
    (``enable_input_require_grads``): the adapters' gradients equal those without it."""
    grads = []
    for checkpointing in ("false", "true"):
        trainer = _trainer(tmp_path, f"model.gradient_checkpointing={checkpointing}", name=checkpointing)
        if not grads:
            batch = trainer.sampler.sample(trainer.ctx.prompts)
            trainer.learner.prepare(batch)
        trainer.models.policy.train()
        forward = trainer.models.policy_forward
        trainer.learner._accumulate(forward, batch, lambda mb, forward=forward: forward(
            mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask)[0].sum())
        grads.append({k: p.grad.clone() for k, p in adapter_parameters(trainer.models.policy).items()})
        trainer.close()
    assert grads[0].keys() == grads[1].keys()
    assert any(bool(g.abs().max() > 0) for g in grads[1].values())
    for key, grad in grads[0].items():
        torch.testing.assert_close(grads[1][key], grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("overrides", [
    ["trainer.precision=bf16"],
    ["algo=ppo"],
    ["kl.estimator=full", "kl.coef=0.1"],
])
def test_lora_trains_under_bf16_with_a_critic_and_with_full_vocabulary_kl(tmp_path: Path, overrides) -> None:
    trainer = _trainer(tmp_path, *overrides)
    adapters = adapter_parameters(trainer.models.policy)
    before = {k: v.detach().clone() for k, v in adapters.items()}
    metrics = trainer.train_step()
    assert metrics["grad_norm"] > 0
    moved = [k for k, v in adapters.items() if not torch.equal(before[k], v)]
    assert any(".lora_B." in k for k in moved)
    if trainer.models.critic is not None:
        assert not any("lora_" in k for k, _ in trainer.models.critic.named_parameters())
        assert metrics["value/loss"] >= 0
    if "kl.estimator=full" in overrides:  # reference logits with the adapters off; later mini-batches moved
        assert metrics["kl/value"] > 0
    trainer.close()


# ------------------------------------------------------------------ torchrun DDP


@pytest.mark.slow
def test_two_ddp_ranks_equal_one_process(tmp_path: Path) -> None:
    """One update of a LoRA run under torchrun (2 ranks, gloo) equals one process on the
    global batch: the adapters' gradients are all-reduced, the frozen base has none."""
    args = [*TINY, *QUIET, *LORA, "algo=grpo", "loss_agg=seq-mean-token-mean", "trainer.micro_batch_size=3",
            "trainer.num_mini_batches=1"]
    trainer = Trainer(load_run(REGISTRY, [*args, f"run_dir={tmp_path / 'one'}"]), PM)
    batch = trainer.sampler.sample(4)
    scores = torch.rand(len(batch), generator=torch.Generator().manual_seed(7))
    batch.scores, batch.rewards = scores, scores.clone()
    torch.save(batch, tmp_path / "batch.pt")
    trainer.learn(batch)
    want = {k: v.detach().clone() for k, v in trainer.models.policy.named_parameters()}
    grads = {k: v.grad.clone() for k, v in trainer.models.policy.named_parameters() if v.grad is not None}
    trainer.close()
    assert grads and all("lora_" in k for k in grads)
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps([{"overrides": [*args, f"run_dir={tmp_path / 'dp'}"],
                                 "batch": str(tmp_path / "batch.pt"), "out": str(tmp_path / "dp.out")}]))
    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(Path(__file__).with_name("dist_worker.py")), str(spec)],
                          capture_output=True, text=True, env={**env, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-8000:]
    got = torch.load(tmp_path / "dp.out", weights_only=False)
    assert got["wrapper"] == "DistributedDataParallel"
    assert got["grads"].keys() == grads.keys()
    for key, grad in grads.items():
        torch.testing.assert_close(got["grads"][key], grad, rtol=1e-4, atol=1e-7)
    for key, param in want.items():
        assert (got["params"][key] - param).abs().max() <= 1e-5, key


def test_a_run_from_before_model_lora_existed_resumes_without_adapters(tmp_path: Path) -> None:
    run = tmp_path / "old"
    assert main(["train", *TINY, *QUIET, "trainer.total_steps=1", f"run_dir={run}"]) == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    del saved["model"]["lora"]                                       # as rlzoo wrote it before this key
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    assert main(["train", f"resume={run}", "trainer.total_steps=2"]) == 0
    assert "lora" not in (run / "plan.txt").read_text()
    assert (run / "checkpoints" / "step_000002" / "policy" / "model.safetensors").is_file()
