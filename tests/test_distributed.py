"""Data parallel under torchrun (gloo on CPU): N ranks equal one process on the global batch."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlzoo.plan.run_input import load_run
from rlzoo.contract.loading import build_registry, make_plugin_manager
from rlzoo.run.trainer import Trainer

pytestmark = pytest.mark.slow  # end-to-end: trains, launches or installs

WORKER = Path(__file__).with_name("dist_worker.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
COMMON = ["task.num_digits=3", "rollout.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=5",
          "trainer.micro_batch_size=3", "trainer.update_epochs=1", "trainer.num_mini_batches=1",
          "trainer.lr=0.001", "logging.progress=false", "model.hidden_size=32", "model.intermediate_size=64"]
EPISODES = ["env=guess", "rollout.max_new_tokens=40", "rollout.max_turn_tokens=12", "rollout.max_turns=3"]
"""A multi-turn run (the guessing game on 3-digit sorting, whose answers are integers); later
overrides win over COMMON's rollout.max_new_tokens."""
CASES = {
    # name: overrides (loss_agg given explicitly: the denominators under test)
    "grpo": ["algo=grpo", "loss_agg=seq-mean-token-mean"],
    "dr_grpo": ["algo=dr_grpo", "loss_agg=seq-mean-token-sum-norm"],
    # GAE with whitening, a critic, KL in the reward with the adaptive controller
    "ppo": ["algo=ppo", "loss_agg=token-mean", "advantage.whiten=true"],
    # batch-level reward std and GPG's alpha are batch statistics too
    "grpo_batch_std": ["algo=grpo", "advantage.scale=batch", "loss_agg=token-mean"],
    "gpg": ["algo=grpo", "advantage=gpg", "loss_agg=token-sum"],
    # multi-turn episodes: the denominators count the policy's tokens (loss_mask) of the global batch
    "grpo_episodes": ["algo=grpo", "loss_agg=token-mean", *EPISODES],
}
FSDP_CASES = {  # the same global-batch equality with sharded parameters, gradients and optimizer
    "grpo_fsdp": ["algo=grpo", "loss_agg=seq-mean-token-mean"],
    "ppo_fsdp": ["algo=ppo", "loss_agg=token-mean"],
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("WORLD_SIZE", None)
    env["OMP_NUM_THREADS"] = "1"
    return env


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_equal_one_process_after_one_update(tmp_path: Path, strategy: str) -> None:
    pm = make_plugin_manager()
    registry = build_registry(pm)
    cases, expected = [], {}
    chosen = CASES if strategy == "ddp" else FSDP_CASES
    for name, overrides in chosen.items():
        args = [*COMMON, *overrides, f"distributed.strategy={strategy}"]
        trainer = Trainer(load_run(registry, [*args, f"run_dir={tmp_path / name}"]), pm)
        batch = trainer.sampler.sample(4)
        if "env=guess" in overrides:  # the episodes hold environment tokens, out of the loss mask
            assert (batch.response_mask - batch.loss_mask).sum() > 0
        # a random policy scores ~0 everywhere; varied scores (one group all equal) exercise the math
        scores = torch.rand(len(batch), generator=torch.Generator().manual_seed(7))
        scores[:4] = 0.5
        batch.scores, batch.rewards = scores, scores.clone()
        torch.save(batch, tmp_path / f"{name}.pt")
        metrics = trainer.learn(batch)
        expected[name] = {
            "params": {k: v.detach().clone() for k, v in trainer.models.policy.named_parameters()},
            "grads": {k: v.grad.clone() for k, v in trainer.models.policy.named_parameters() if v.grad is not None},
            "critic": ({k: v.detach().clone() for k, v in trainer.models.critic.named_parameters()}
                       if trainer.models.critic is not None else None),
            "advantages": batch.advantages, "metrics": metrics, "kl_coef": float(trainer.learner.kl_controller.value),
        }
        cases.append({"overrides": [*args, f"run_dir={tmp_path / name}-dp"], "batch": str(tmp_path / f"{name}.pt"),
                      "out": str(tmp_path / f"{name}-dp.out")})
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps(cases))
    proc = subprocess.run([*TORCHRUN, str(WORKER), str(spec)], capture_output=True, text=True, env=_env(),
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-12000:]
    for name in chosen:
        got = torch.load(tmp_path / f"{name}-dp.out", weights_only=False)
        want = expected[name]
        assert got["wrapper"] == {"ddp": "DistributedDataParallel", "fsdp": "FSDPResponseForward"}[strategy]
        torch.testing.assert_close(got["advantages"], want["advantages"], rtol=1e-5, atol=1e-6,
                                   msg=lambda m, n=name: f"{n}: advantages differ: {m}")
        assert want["grads"].keys() == got["grads"].keys()
        for key, grad in want["grads"].items():
            torch.testing.assert_close(got["grads"][key], grad, rtol=1e-4, atol=1e-7,
                                       msg=lambda m, n=name, k=key: f"{n}: gradient of {k} differs: {m}")
        for key, param in want["params"].items():
            assert (got["params"][key] - param).abs().max() <= 1e-5, f"{name}: {key} differs after the update"
        if want["critic"] is not None:
            for key, param in want["critic"].items():
                assert (got["critic"][key] - param).abs().max() <= 1e-5, f"{name}: critic {key} differs"
        for key in ("policy/loss", "entropy", "advantages/mean", "kl/value"):
            if key in want["metrics"]:
                assert got["metrics"][key] == pytest.approx(want["metrics"][key], rel=1e-4, abs=1e-6), key
        assert got["kl_coef"] == pytest.approx(want["kl_coef"], rel=1e-6)


def _rlzoo(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlzoo", *args], capture_output=True, text=True, env=_env(),
                          timeout=timeout)


def test_launcher_trains_logs_on_rank_zero_and_resumes_with_the_same_world(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = ["train", *COMMON, "launcher.nproc=2", f"run_dir={run_dir}", "checkpoint.every=0"]
    proc = _rlzoo(*args, "trainer.total_steps=2")
    assert proc.returncode == 0, proc.stderr[-12000:]
    assert "torch.distributed.run --standalone --nproc_per_node=2" in proc.stderr
    assert proc.stdout.count("rlzoo: 2 steps") == 1  # the summary line, from rank 0 only
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    state = torch.load(run_dir / "checkpoints/step_000002/trainer_state.pt", weights_only=True)
    assert state["world_size"] == 2 and len(state["ranks"]) == 2
    assert state["ranks"][0]["sampler"]["rng"] != state["ranks"][1]["sampler"]["rng"]  # ranks draw different prompts

    proc = _rlzoo("train", f"resume={run_dir}", "trainer.total_steps=3")  # the saved launcher.nproc=2
    assert proc.returncode == 0, proc.stderr[-12000:]
    assert (run_dir / "checkpoints/step_000003").is_dir()
    assert json.loads((run_dir / "status.json").read_text())["status"] == "completed"

    proc = _rlzoo("train", f"resume={run_dir}", "trainer.total_steps=4", "launcher.nproc=1")
    assert proc.returncode == 2
    assert "cannot change launcher.nproc (2 -> 1)" in proc.stderr and "Traceback" not in proc.stderr


def test_launcher_trains_episodes_on_two_ranks(tmp_path: Path) -> None:
    from rlzoo.core.events import read_scalars

    run_dir = tmp_path / "run"
    proc = _rlzoo("train", *COMMON, *EPISODES, "launcher.nproc=2", f"run_dir={run_dir}", "trainer.total_steps=2")
    assert proc.returncode == 0, proc.stderr[-12000:]
    assert (run_dir / "checkpoints/step_000002").is_dir()
    curves = read_scalars(run_dir)
    assert [step for step, _ in curves["episode/turns"]] == [1, 2]
    assert all(1 <= turns <= 3 for _, turns in curves["episode/turns"])


def test_fsdp_checkpoints_whole_weights_and_resumes(tmp_path: Path) -> None:
    """FSDP2 with a critic: the checkpoint holds whole (gathered) weights and optimizer
    states that load in one process too, and the sharded run resumes from it."""
    from rlzoo.models.build import load_pretrained

    run_dir = tmp_path / "run"
    proc = _rlzoo("train", *COMMON, "algo=ppo", "distributed.strategy=fsdp", "launcher.nproc=2",
                  f"run_dir={run_dir}", "checkpoint.every=0", "trainer.total_steps=2")
    assert proc.returncode == 0, proc.stderr[-12000:]
    checkpoint = run_dir / "checkpoints/step_000002"
    init, _ = load_pretrained(run_dir / "init_model")
    trained, _ = load_pretrained(checkpoint / "policy")
    init_params, trained_params = dict(init.named_parameters()), dict(trained.named_parameters())
    assert init_params.keys() == trained_params.keys()
    assert all(trained_params[k].shape == v.shape for k, v in init_params.items())
    assert any(not torch.equal(trained_params[k], v) for k, v in init_params.items())  # it trained
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=True)
    names = set(state["learner"]["optimizer"]["state"])
    assert "model.model.embed_tokens.weight" in names and len(names) == len(init_params)
    assert (checkpoint / "critic" / "value_head.safetensors").is_file()

    proc = _rlzoo("train", f"resume={run_dir}", "trainer.total_steps=3")
    assert proc.returncode == 0, proc.stderr[-12000:]
    assert (run_dir / "checkpoints/step_000003").is_dir()


def test_launcher_rejects_prompts_not_divisible_by_ranks(tmp_path: Path) -> None:
    proc = _rlzoo("train", "launcher.nproc=3", "rollout.prompts_per_step=4", f"run_dir={tmp_path}/r")
    assert proc.returncode == 2
    assert "rollout.prompts_per_step=4 must be divisible by the number of processes (3)" in proc.stderr
    assert not (tmp_path / "r").exists()


def _worker_pid(parent: int, rank: int) -> int | None:
    """The pid of the torchrun worker of ``rank`` among ``parent``'s descendants."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and any(v.startswith(b"TORCHELASTIC_RUN_ID=") for v in environ) \
                and _descends(int(entry.name), parent):
            return int(entry.name)
    return None


def _descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
    return False


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc to find the worker")
def test_a_killed_rank_ends_the_job_with_the_rank_named(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = [*TORCHRUN, "-m", "rlzoo", "train", *COMMON, "trainer.total_steps=100000", f"run_dir={run_dir}",
           "distributed.timeout_s=30", "checkpoint.every=0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        deadline = time.monotonic() + 180
        while not list(run_dir.glob("events.out.tfevents.*")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.5)
        time.sleep(2)
        victim = _worker_pid(proc.pid, rank=1)
        assert victim is not None, "rank 1's process not found"
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
        elapsed = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert elapsed < 60
    assert "rank" in err and "SIGKILL" in err, err[-3000:]
    assert f"pid: {victim}" in err or f"PID {victim}" in err, err[-3000:]


FAULT_PLUGIN = '''
import atexit, math, os, time
from pathlib import Path
from rlzoo.api import hookimpl
from rlzoo.core.errors import TrainingError

if os.environ.get("RANK") == "0":
    atexit.register(lambda: Path(os.environ["RLZOO_TEST_FIRED"] + ".rank0").write_text(str(time.time())))
elif os.environ.get("RLZOO_TEST_LINGER"):  # rank 1 keeps its connections open after its error, as a peer
    atexit.register(time.sleep, float(os.environ["RLZOO_TEST_LINGER"]))  # that NCCL does not see leave

CALLS = {}

def _fire(kind):
    """True on rank 1 the second time (step 2) when the test asked for a fault of ``kind``
    (step 1 runs the agreements with nothing to agree on); records when it fired."""
    if os.environ.get("RANK") != "1" or os.environ.get("RLZOO_TEST_FAULT") != kind:
        return False
    CALLS[kind] = CALLS.get(kind, 0) + 1
    if CALLS[kind] != 2:
        return False
    Path(os.environ["RLZOO_TEST_FIRED"]).write_text(str(time.time()))
    return True

def nan_on_rank_1(prompts, completions, references):
    return [math.nan if _fire("reward") else 0.5] * len(completions)

@hookimpl
def rlzoo_register_reward_functions(register):
    register("nan_on_rank_1", nan_on_rank_1)

@hookimpl
def rlzoo_before_update(batch, ctx):
    if _fire("advantage"):
        batch.advantages[0, 0] = math.nan

@hookimpl
def rlzoo_step_end(step, metrics, ctx):
    if _fire("step_end"):
        raise TrainingError("step_end plugin failed on purpose")
'''


@pytest.mark.parametrize("fault, what", [
    ("reward", "reward function 'nan_on_rank_1' returned nan (non-finite)"),  # rollout and scoring
    ("advantage", "non-finite value in policy loss (component 'ppo_clip' of package rlzoo; "),  # the update
    ("step_end", "step_end plugin failed on purpose"),                       # after the update
])
def test_a_failure_on_one_rank_stops_every_rank_at_once_with_the_rank_named(tmp_path: Path, fault: str,
                                                                             what: str) -> None:
    """A NaN (or an error) on rank 1 only, in step 2: rank 0 must not wait in a collective for
    distributed.timeout_s=300 nor be killed by torchrun: both ranks raise the same one line
    naming rank 1 and what failed, both exit 2, the step-0 checkpoint stays intact. With the
    NaN reward, rank 1 also lingers 90 s after its error with its connections open (as NCCL
    does not notice a peer leave; gloo does at once): rank 0 still ends within seconds."""
    from rlzoo.run.checkpoint import list_checkpoints, verify_checkpoint

    (tmp_path / "rlzoo_test_rank_fault.py").write_text(FAULT_PLUGIN)
    fired, run_dir = tmp_path / "fired", tmp_path / "run"
    env = {**_env(), "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "RLZOO_TEST_FAULT": fault, "RLZOO_TEST_FIRED": str(fired), "RLZOO_TEST_LINGER": "90" * (fault == "reward")}
    reward = ["reward=nan_on_rank_1"] if fault == "reward" else []
    proc = subprocess.run([*TORCHRUN, "-m", "rlzoo", "train", *COMMON, "model.num_layers=1", "trainer.threads=1",
                           "plugins=[rlzoo_test_rank_fault]", *reward, "trainer.total_steps=3", "checkpoint.every=0",
                           f"run_dir={run_dir}", "distributed.timeout_s=300"],
                          capture_output=True, text=True, env=env, timeout=600)
    ended = time.time()
    assert proc.returncode != 0 and fired.exists(), proc.stderr[-3000:]
    rank0_ended = float(Path(f"{fired}.rank0").read_text())
    assert rank0_ended - float(fired.read_text()) < 60, proc.stderr[-3000:]  # not distributed.timeout_s
    assert ended - float(fired.read_text()) < 90, proc.stderr[-3000:]        # (+30 s: torchrun kills a lingerer)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("rlzoo: error: ")]
    assert len(lines) == 2 and lines[0] == lines[1], proc.stderr[-3000:]  # rank 0 says what rank 1 says
    assert lines[0].startswith(f"rlzoo: error: rank 1 of 2 failed: {what}") and "every rank stopped" in lines[0]
    assert "a collective failed" not in proc.stderr and "[rank0]" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.count("exitcode  : 2 ") == 2 - (fault == "reward"), proc.stderr[-3000:]  # rank 0 not killed
    assert json.loads((run_dir / "status.json").read_text()) | {"time": 0} == {
        "status": "failed", "step": 2, "total_steps": 3, "time": 0}
    (step, newest), = list_checkpoints(run_dir)
    assert step == 0 and verify_checkpoint(newest) is None


RM_WORKER = Path(__file__).with_name("rm_moments_worker.py")


def test_reward_model_statistics_are_those_of_every_rank_s_scores(tmp_path: Path) -> None:
    """Ranks that score different numbers of batches settle once a step and then hold the same
    normalisation statistics: the population mean and m2 of the union of their raw scores,
    computed here in one process; each batch was normalised by the statistics settled before it."""
    from zoo import REGISTRY, tiny_reward_model

    tiny_reward_model(tmp_path / "rm", "0123456789=")
    proc = subprocess.run([*TORCHRUN, str(RM_WORKER), str(tmp_path / "rm"), str(tmp_path)], capture_output=True,
                          text=True, env=_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-12000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    component = REGISTRY.get("reward", "reward_model")
    raw = component.bind(component.params(path=str(tmp_path / "rm"))).build(device=torch.device("cpu"), tokenizer=None)
    settled = {"count": 0, "mean": 0.0, "m2": 0.0}
    for step in range(2):
        assert ranks[0]["states"][step] == ranks[1]["states"][step]  # the same statistics on both ranks
        scored = [3 * sum(r + 1 + s for s in range(step + 1)) for r in (0, 1)]  # texts each rank scored so far
        texts = [t for r in (0, 1) for t in ranks[r]["texts"][:scored[r]]]
        union = raw(prompts=[p for p, _ in texts], completions=[c for _, c in texts]).double()
        moments = ranks[0]["states"][step]["0:reward_model"]["moments"]
        assert moments["count"] == len(union) == (3 + 6 if step == 0 else 9 + 6 + 9)
        assert moments["mean"] == pytest.approx(float(union.mean()), abs=1e-6)
        assert moments["m2"] == pytest.approx(float(((union - union.mean()) ** 2).sum()), abs=1e-5)
        assert moments["pending"] == [0.0, 0.0, 0.0]
        batches = ranks[0]["returned"][:1] if step == 0 else ranks[0]["returned"][1:]
        first = ranks[0]["texts"][(0 if step == 0 else 3):(3 if step == 0 else 6)]
        own = raw(prompts=[p for p, _ in first], completions=[c for _, c in first]).double()
        std = math.sqrt(settled["m2"] / settled["count"]) if settled["count"] else 1.0
        torch.testing.assert_close(batches[0].double(), (own - settled["mean"]) / (std + 1e-8), atol=1e-5, rtol=0)
        settled = moments


def test_launcher_normalises_the_reward_model_over_both_ranks_and_resumes_the_statistics(tmp_path: Path) -> None:
    from zoo import tiny_reward_model

    tiny_reward_model(tmp_path / "rm", "0123456789=")
    run_dir = tmp_path / "run"
    reward = f"reward={{name: reward_model, path: {tmp_path / 'rm'}, normalize: true}}"
    proc = _rlzoo("train", *COMMON, reward, "launcher.nproc=2", f"run_dir={run_dir}", "checkpoint.every=0",
                  "trainer.total_steps=2")
    assert proc.returncode == 0, proc.stderr[-12000:]
    proc = _rlzoo("train", f"resume={run_dir}", "trainer.total_steps=3")
    assert proc.returncode == 0, proc.stderr[-12000:]
    for step, count in ((2, 32), (3, 48)):  # 4 prompts x 4 samples a step, scored 8 on each rank
        state = torch.load(run_dir / f"checkpoints/step_{step:06d}/trainer_state.pt", weights_only=True)
        moments = [rank["sampler"]["rewards"]["0:reward_model"]["moments"] for rank in state["ranks"]]
        assert moments[0] == moments[1] and moments[0]["count"] == count, moments
        assert moments[0]["pending"] == [0.0, 0.0, 0.0] and moments[0]["m2"] > 0


def test_rm_on_two_ranks_equals_one_process_and_resumes_exactly(tmp_path: Path) -> None:
    """``rlzoo rm launcher.nproc=2``: each rank trains on half of a step's pairs, DDP averages
    the gradients, so the reward model equals the one process's (to 1e-5); rank 0
    writes one event file and the model; a resume on 2 ranks continues it bit for bit; a batch
    that does not split over the ranks is refused before anything starts."""
    from safetensors.torch import load_file
    from test_rm import TINY, sorting_pairs

    data = sorting_pairs(tmp_path / "prefs.jsonl", count=40)
    common = [*TINY, f"rm.data={data}", "rm.batch_size=8", "rm.eval_every=2", "checkpoint.every=2"]
    runs = {name: tmp_path / name for name in ("one", "two", "split")}
    for name, extra in (("one", []), ("two", ["launcher.nproc=2"]), ("split", ["launcher.nproc=2"])):
        steps = "rm.steps=2" if name == "split" else "rm.steps=4"
        proc = _rlzoo("rm", *common, *extra, steps, f"run_dir={runs[name]}")
        assert proc.returncode == 0, proc.stderr[-12000:]
    assert "torch.distributed.run --standalone --nproc_per_node=2 -m rlzoo rm" in proc.stderr
    assert proc.stdout.count("saved the reward model to") == 1 and proc.stdout.count("rlzoo rm: step 1/2") == 1
    proc = _rlzoo("rm", f"resume={runs['split']}", "rm.steps=4")  # the saved launcher.nproc=2
    assert proc.returncode == 0, proc.stderr[-12000:]
    model = {name: load_file(path / "reward_model" / "model.safetensors") for name, path in runs.items()}
    assert all(torch.equal(model["two"][k], model["split"][k]) for k in model["two"])  # the resume is exact
    for key, weight in model["one"].items():  # as the trainer's test: the gradient's summation order differs
        assert (model["two"][key] - weight).abs().max() <= 1e-5, key
    assert len(list(runs["two"].glob("events.out.tfevents.*"))) == 1
    state = torch.load(runs["two"] / "checkpoints/step_000004/trainer_state.pt", weights_only=False)
    assert state["world_size"] == 2 and len(state["rng"]) == 2

    proc = _rlzoo("rm", *common, "rm.batch_size=7", "launcher.nproc=2", f"run_dir={tmp_path / 'odd'}")
    assert proc.returncode == 2 and not (tmp_path / "odd").exists()
    assert proc.stderr.strip().splitlines()[-1] == (
        "rlzoo: error: rm.batch_size=7 does not split over 2 processes: each trains on an equal share of a step's "
        "pairs; use a multiple of 2")
