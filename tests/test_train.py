"""End-to-end tiny trainings: every preset, logs, checkpoints, resume, failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlzoo.run.checkpoint import list_checkpoints
from rlzoo.plan.run_input import engine_input
from rlzoo.commands.cli import main
from rlzoo.core.events import read_scalars
import zoo
from zoo import builtin_names

pytestmark = pytest.mark.slow  # end-to-end: trains, launches or installs

TINY = [*zoo.TINY, "logging.sample_every=2"]
PRESETS = builtin_names("algorithm")
REQUIRED_TAGS = {
    "reward/mean", "reward/std", "response_length/mean", "policy/loss", "policy/clipfrac",
    "policy/approx_kl", "kl/value", "kl/coef", "entropy", "grad_norm", "lr", "timing/rollout_s",
    "timing/update_s", "throughput/tokens_per_s",
}


def train(capsys, run_dir: Path, *overrides: str) -> tuple[int, str]:
    code = main(["train", *TINY, f"run_dir={run_dir}", *overrides])
    _, err = capsys.readouterr()
    return code, err


@pytest.mark.parametrize("algo", PRESETS)
def test_every_preset_trains_end_to_end(capsys, tmp_path: Path, algo: str) -> None:
    run_dir = tmp_path / algo
    code, err = train(capsys, run_dir, f"algo={algo}", "trainer.total_steps=3",
                      "checkpoint.every=2", "trainer.micro_batch_size=5")
    assert code == 0, err
    assert (run_dir / "config.yaml").is_file() and (run_dir / "init_model" / "config.json").is_file()
    steps = [step for step, _ in list_checkpoints(run_dir)]
    assert steps == [2, 3]
    final = run_dir / "checkpoints" / "step_000003"
    assert (final / "policy" / "model.safetensors").is_file()
    assert (final / "policy" / "tokenizer.json").is_file()
    assert (final / "critic").is_dir() == (algo == "ppo")
    curves = read_scalars(run_dir)
    assert REQUIRED_TAGS <= set(curves), REQUIRED_TAGS - set(curves)
    assert [s for s, _ in curves["reward/mean"]] == [1, 2, 3]
    if algo == "ppo":
        assert "value/loss" in curves
    for tag in REQUIRED_TAGS:
        assert all(torch.isfinite(torch.tensor(v)) for _, v in curves[tag]), tag


def test_hparams_and_text_samples_are_logged(capsys, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    code, err = train(capsys, tmp_path / "r", "trainer.total_steps=2")
    assert code == 0, err
    events = next((tmp_path / "r").glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events))
    acc.Reload()
    assert "samples/text_summary" in acc.Tags()["tensors"]
    plugin_data = acc.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in plugin_data


def test_same_seed_same_result_different_seed_differs(capsys, tmp_path: Path) -> None:
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        assert train(capsys, tmp_path / name, "trainer.total_steps=2", f"seed={seed}")[0] == 0
    weights = {n: load_file(str(tmp_path / n / "checkpoints" / "step_000002" / "policy" / "model.safetensors"))
               for n in "abc"}
    assert all(torch.equal(weights["a"][k], weights["b"][k]) for k in weights["a"])
    assert not all(torch.equal(weights["a"][k], weights["c"][k]) for k in weights["a"])


KILLER = """
import os, signal
from rlzoo.api import hookimpl
@hookimpl
def rlzoo_step_end(step, metrics, ctx):
    if os.environ.get("RLZOO_TEST_SIGNAL_AT") == str(step):
        os.kill(os.getpid(), getattr(signal, os.environ["RLZOO_TEST_SIGNAL"]))
"""


def _cli(run_dir: Path, *overrides: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlzoo", "train", *TINY, *overrides],
        capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=run_dir.parent,
        timeout=300,
    )


def _final_state(run_dir: Path, step: int) -> tuple[dict[str, torch.Tensor], dict]:
    ckpt = run_dir / "checkpoints" / f"step_{step:06d}"
    weights = load_file(str(ckpt / "policy" / "model.safetensors"))
    curves = read_scalars(run_dir)
    return weights, {tag: curves[tag] for tag in ("reward/mean", "policy/loss", "entropy", "value/loss")
                     if tag in curves}


@pytest.mark.parametrize("algo, sig, at", [("grpo", "SIGKILL", 5), ("ppo", "SIGKILL", 3),
                                           ("grpo", "SIGINT", 3)])
def test_resume_after_kill_or_ctrl_c_equals_uninterrupted_run(tmp_path: Path, algo: str, sig: str,
                                                              at: int) -> None:
    (tmp_path / "rlzoo_test_killer.py").write_text(textwrap.dedent(KILLER))
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    common = [f"algo={algo}", "trainer.total_steps=6", "checkpoint.every=2",
              "plugins=[rlzoo_test_killer]", "trainer.update_epochs=2", "trainer.num_mini_batches=2"]
    full = tmp_path / "full"
    done = _cli(full, f"run_dir={full}", *common, env=env)
    assert done.returncode == 0, done.stderr

    broken = tmp_path / "broken"
    killed = _cli(broken, f"run_dir={broken}", *common,
                  env={**env, "RLZOO_TEST_SIGNAL_AT": str(at), "RLZOO_TEST_SIGNAL": sig})
    if sig == "SIGKILL":
        assert killed.returncode == -signal.SIGKILL
        assert max(s for s, _ in list_checkpoints(broken)) == at - at % 2
    else:
        assert killed.returncode == 0, killed.stderr        # Ctrl-C: clean exit
        assert "checkpoint written at step 3" in killed.stdout
        assert max(s for s, _ in list_checkpoints(broken)) == at
    assert not list((broken / "checkpoints").glob(".tmp-*"))

    resumed = _cli(broken, f"resume={broken}", env=env)
    assert resumed.returncode == 0, resumed.stderr
    want_weights, want_curves = _final_state(full, 6)
    got_weights, got_curves = _final_state(broken, 6)
    for key in want_weights:
        assert torch.equal(want_weights[key], got_weights[key]), key
    assert want_curves == got_curves


def test_resume_without_checkpoint_is_a_clear_error(capsys, tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    code = main(["train", f"resume={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2 and "no checkpoint found" in err


BAD_REWARDS = """
import math
from rlzoo.api import hookimpl
def raises(prompts, completions, references):
    for c in completions:
        if len(c) >= 0:
            raise ValueError("cannot parse")
    return [0.0] * len(completions)

def wrong_shape(prompts, completions, references):
    return [0.0] * (len(completions) + 1)

def not_finite(prompts, completions, references):
    return [math.nan] * len(completions)

@hookimpl
def rlzoo_register_reward_functions(register):
    register("raises", raises)
    register("wrong_shape", wrong_shape)
    register("not_finite", not_finite)
"""


@pytest.mark.parametrize("reward, fragments", [
    ("raises", ["reward function 'raises'", "ValueError", "cannot parse", "prompt="]),
    ("wrong_shape", ["reward function 'wrong_shape'", "17 scores", "expected shape (16,)"]),
    ("not_finite", ["reward function 'not_finite'", "nan", "non-finite", "completion="]),
])
def test_failing_reward_function_is_named_with_the_sample(capsys, tmp_path: Path, plugin_module,
                                                         reward: str, fragments: list[str]) -> None:
    name = plugin_module(BAD_REWARDS)
    code, err = train(capsys, tmp_path / "r", f"plugins=[{name}]", f"reward={reward}",
                      "trainer.total_steps=2")
    assert code == 2
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    assert [step for step, _ in list_checkpoints(tmp_path / "r")] == [0]  # only the start


NAN_LOSS = """
import torch
from rlzoo.api import hookimpl
def nan_loss(logp, old_logp, advantages, response_mask):
    return logp * float("nan"), {"clipfrac": torch.tensor(0.0), "approx_kl": torch.tensor(0.0)}

@hookimpl
def rlzoo_register_policy_losses(register):
    register("nan_loss", nan_loss)
"""


def test_non_finite_loss_stops_with_the_stage_named_and_no_checkpoint(capsys, tmp_path: Path,
                                                                     plugin_module) -> None:
    name = plugin_module(NAN_LOSS)
    code, err = train(capsys, tmp_path / "r", f"plugins=[{name}]", "policy_loss=nan_loss",
                      "trainer.total_steps=2", "checkpoint.every=1")
    assert code == 2
    assert "non-finite value in policy loss" in err and "nan_loss" in err
    assert [step for step, _ in list_checkpoints(tmp_path / "r")] == [0]  # only the start


@pytest.mark.parametrize("content, fragment", [
    ("", "holds no examples"),
    ('{"prompt": "1+1="}\n', "row 1 lacks column 'answer'"),
    ("not json\n", "line 1 is not valid JSON"),
])
def test_empty_or_malformed_task_file_fails_at_start(capsys, tmp_path: Path, content: str,
                                                    fragment: str) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text(content)
    run_dir = tmp_path / "r"
    code, err = train(capsys, run_dir, f"task={{name: file, path: {path}}}")
    assert code == 2 and fragment in err and str(path) in err
    assert not run_dir.exists()


def test_file_task_trains_with_a_local_model_directory(capsys, tmp_path: Path) -> None:
    """A user's JSONL prompts with a named reward, on a model loaded from model.path."""
    first = tmp_path / "first"
    assert train(capsys, first, "trainer.total_steps=1")[0] == 0
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}{b}=", "answer": f"{min(a, b)}{max(a, b)}"}) + "\n"
                            for a in range(3) for b in range(3)))
    code, err = train(capsys, tmp_path / "second", f"model.path={first / 'init_model'}",
                      f"task={{name: file, path: {data}}}", "reward=sorted_digits",
                      "trainer.total_steps=2")
    assert code == 0, err
    assert read_scalars(tmp_path / "second")["reward/mean"][-1][0] == 2


def test_sft_writes_a_model_usable_by_train(capsys, tmp_path: Path) -> None:
    out = tmp_path / "sft"
    code = main(["sft", *TINY, "--steps", "3", "--target", "format", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert (out / "model.safetensors").is_file()
    code, err = train(capsys, tmp_path / "r", f"model.path={out}", "trainer.total_steps=1")
    assert code == 0, err


def test_chat_template_of_a_local_model_is_applied(capsys, tmp_path: Path) -> None:
    from rlzoo.plan.planner import load_config
    from rlzoo.models.build import load_tokenizer
    from rlzoo.contract.loading import build_registry, make_plugin_manager
    from rlzoo.run.trainer import Trainer

    first = tmp_path / "first"
    assert train(capsys, first, "trainer.total_steps=1")[0] == 0
    model_dir = first / "init_model"
    tokenizer = load_tokenizer(model_dir)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}={% endfor %}"
    tokenizer.save_pretrained(model_dir)
    pm = make_plugin_manager()
    registry = build_registry(pm)
    for mode, expected in (("null", "123=="), ("false", "123=")):
        resolved = load_config(registry, [*TINY, f"model.path={model_dir}", f"model.chat_template={mode}"])
        assert Trainer(engine_input(resolved), pm).sampler.format_prompt("123=") == expected
    code, err = train(capsys, tmp_path / "second", f"model.path={model_dir}", "trainer.total_steps=1")
    assert code == 0, err


def test_a_run_says_where_it_writes_and_what_to_run_next(capsys, tmp_path: Path) -> None:
    # also: trainer.max_grad_norm=null trains without clipping and still logs the norm
    run_dir = tmp_path / "run"
    assert main(["train", *TINY, f"run_dir={run_dir}", "trainer.total_steps=2", "trainer.max_grad_norm=null"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"rlzoo: run directory {run_dir} (tensorboard --logdir {run_dir})"
    assert lines[-1].startswith(f"rlzoo: checkpoints in {run_dir / 'checkpoints'} (the newest, step_000002/policy")
    assert f"`rlzoo compare {run_dir}`" in lines[-1]
    assert f"`rlzoo train resume={run_dir} trainer.total_steps=4`" in lines[-1]
    assert all(v > 0 for _, v in read_scalars(run_dir)["grad_norm"])
    assert main(["train", f"resume={run_dir}", "trainer.total_steps=3"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"rlzoo: resuming from step 2 in {run_dir} (tensorboard --logdir {run_dir})"


def test_a_non_finite_policy_gradient_says_what_fed_it(tmp_path: Path) -> None:
    # an adaptive KL controller with a tight target grows beta without bound (x 1.128 a step at horizon 100):
    # round 4 of benchmarks/doctor_recall.py had one run stop at step 240 with beta 1.4e19, advantages 1.3e10
    from rlzoo.contract.loading import build_registry, make_plugin_manager
    from rlzoo.core.errors import TrainingError
    from rlzoo.learn.learner import check_finite
    from rlzoo.plan.run_input import load_run
    from rlzoo.run.trainer import Trainer

    pm = make_plugin_manager()
    overrides = ["algo=grpo", "kl.apply=reward", "kl.coef=0.04", "kl.controller={name: adaptive, target: 1.0, "
                 "horizon: 100}", f"run_dir={tmp_path}", "logging.progress=false"]
    trainer = Trainer(load_run(build_registry(pm), overrides), pm)
    batch = trainer.sampler.sample(8)
    batch.scores = batch.rewards = (torch.arange(len(batch)) % 2).float()
    trainer.learner.prepare(batch)
    trainer.learner.kl_controller.value = 1.4e19
    largest = float(batch.advantages.abs().max())
    scales = trainer.learner._scales(batch)
    trainer.close()
    assert scales == (f"the batch's advantages reach {largest:.3g} and the KL coefficient is 1.4e+19 (the KL "
                      "controller's, from kl.coef=0.04)")
    with pytest.raises(TrainingError, match=r"^non-finite value in policy gradient \(component 'ppo_clip' .*\); "
                                            r"the batch's advantages reach .* the KL coefficient is 1\.4e\+19 .*; "
                                            r"the step was stopped"):
        check_finite(torch.tensor(float("inf")), "policy gradient", trainer.learner.policy_loss, scales)
