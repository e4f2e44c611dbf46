"""Fault suite (issue 12): what a hostile or unlucky user can hand rlzoo, and what it does.

Per item of the issue: 1 code in a checkpoint; 2 a run directory belongs to one run; 3 the
lock; 4 non-finite values; 5 what a resume may change; 6 plugins on resume; 7 a full disk;
8 kills, signals, torchrun, damaged checkpoints; 9 one-line errors; 10 interpolations.
Kill points inside rlzoo are injected by ``tests/fault_runner.py`` (see its docstring).
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlzoo.run.checkpoint import (
    CheckpointError,
    check_plain,
    list_checkpoints,
    save_checkpoint,
    verify_checkpoint,
    write_manifest,
)
from rlzoo.commands.cli import main
from rlzoo.core.events import read_scalars
from zoo import TINY

SLOW = pytest.mark.slow  # end-to-end: trains, launches or installs

FAULT_RUNNER = Path(__file__).with_name("fault_runner.py")


def error_line(err: str) -> str:
    """The one ``rlzoo: error:`` line of ``err`` (and no traceback)."""
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("rlzoo: error:")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def steps(run_dir: Path) -> list[int]:
    return [step for step, _ in list_checkpoints(run_dir)]


def leftovers(run_dir: Path) -> list[str]:
    root = run_dir / "checkpoints"
    return sorted(p.name for p in root.iterdir() if p.name.startswith((".tmp-", ".del-"))) if root.is_dir() else []


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / f"step_{step:06d}" / "policy" / "model.safetensors"))


def assert_same_run(got: Path, want: Path, step: int) -> None:
    """Final weights bit-identical, every logged curve identical with each step once."""
    expected, actual = weights(want, step), weights(got, step)
    assert expected.keys() == actual.keys()
    for key in expected:
        assert torch.equal(expected[key], actual[key]), key
    want_curves, got_curves = read_scalars(want), read_scalars(got)
    for tag in ("reward/mean", "policy/loss", "entropy", "grad_norm"):
        assert [s for s, _ in got_curves[tag]] == list(range(1, step + 1)), tag
        assert got_curves[tag] == want_curves[tag], tag


def rlzoo(cwd: Path, *args: str, fault: str | None = None, env: dict[str, str] | None = None,
          timeout: float = 300) -> subprocess.CompletedProcess:
    """``rlzoo ARGS`` in a new process, with ``RLZOO_FAULT=fault`` injected (fault_runner)."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("RLZOO_FAULT", None)
    if fault:
        full_env["RLZOO_FAULT"] = fault
    return subprocess.run([sys.executable, str(FAULT_RUNNER), *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd, timeout=timeout)


class _Payload:
    """Unpickling this calls ``Path.touch(marker)``: what a crafted checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


# ------------------------------------------------------------------ 1. no code runs from a checkpoint


@SLOW
def test_a_checkpoint_that_would_run_code_is_refused_and_never_executed(capsys, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert main(["train", *TINY, f"run_dir={run_dir}", "trainer.total_steps=1"]) == 0
    capsys.readouterr()
    checkpoint = list_checkpoints(run_dir)[-1][1]
    marker = tmp_path / "PWNED"
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=True)
    state["step"] = _Payload(marker)
    with open(checkpoint / "trainer_state.pt", "wb") as handle:
        pickle.dump(state, handle)                  # torch.load reads a plain pickle too
    write_manifest(checkpoint)                      # a crafted checkpoint comes with a matching manifest

    code = main(["train", f"resume={run_dir}", "trainer.total_steps=2"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not marker.exists(), "unpickling the checkpoint ran code"
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("rlzoo: error:")]
    assert len(lines) == 1 and "refusing to load" in lines[0] and "trainer_state.pt" in lines[0]


@SLOW
def test_trainer_state_holds_only_plain_values(tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "run"
    assert main(["train", *TINY, f"run_dir={run_dir}", "trainer.total_steps=1", "algo=ppo"]) == 0
    checkpoint = list_checkpoints(run_dir)[-1][1]
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=True)   # would raise otherwise
    check_plain(state, "state")


def test_check_plain_names_the_offending_path() -> None:
    import numpy as np

    with pytest.raises(TypeError, match=r"state\['ext'\]\[1\] is a numpy.ndarray"):
        check_plain({"ext": [1, np.zeros(2)]}, "state")


def test_no_unsafe_load_in_the_package() -> None:
    root = Path(__file__).resolve().parents[1]
    offenders = []
    for folder in ("rlzoo", "plugins"):
        for path in (root / folder).rglob("*.py"):
            for lineno, line in enumerate(path.read_text().splitlines(), 1):
                if ("torch.load(" in line and "weights_only=True" not in line) or "pickle.load" in line:
                    offenders.append(f"{path.relative_to(root)}:{lineno}: {line.strip()}")
    assert offenders == []


# ------------------------------------------------------------------ 2. a run directory belongs to one run


@SLOW
def test_a_new_run_never_replaces_another_run_without_overwrite(capsys, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert main(["train", *TINY, f"run_dir={run_dir}", "trainer.total_steps=3", "checkpoint.every=1"]) == 0
    before = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}
    capsys.readouterr()

    assert main(["train", *TINY, f"run_dir={run_dir}", "trainer.total_steps=2", "seed=5"]) == 2
    line = error_line(capsys.readouterr().err)
    assert "holds another run (completed at step 3 of 3)" in line
    assert f"resume={run_dir}" in line and "--overwrite" in line
    after = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before                                             # not a byte changed

    (run_dir / "notes.txt").write_text("mine")                         # not a run's file: left alone
    assert main(["train", "--overwrite", *TINY, f"run_dir={run_dir}", "trainer.total_steps=2", "seed=5"]) == 0
    assert "--overwrite: deleting the run in" in capsys.readouterr().err
    assert steps(run_dir) == [0, 2] and len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    assert [s for s, _ in read_scalars(run_dir)["reward/mean"]] == [1, 2]
    assert "seed: 5" in (run_dir / "config.yaml").read_text() and (run_dir / "notes.txt").read_text() == "mine"


def test_overwrite_does_not_go_with_resume(capsys, tmp_path: Path) -> None:
    assert main(["config"]) == 0
    (tmp_path / "config.yaml").write_text(capsys.readouterr().out)   # a run's start, cut off
    (tmp_path / "plan.txt").write_text("")
    assert main(["train", "--overwrite", f"resume={tmp_path}"]) == 2
    assert "does not go with resume=" in error_line(capsys.readouterr().err)


def test_a_sweep_resumes_its_started_runs_with_their_overrides(tmp_path: Path) -> None:
    from rlzoo.commands.sweep import _command, plan

    run, = plan(tmp_path, ["seed=1", "plugins=[my_plugin]"])
    assert "resume=" not in " ".join(_command(run, None))
    run.run_dir.mkdir()
    (run.run_dir / "plan.txt").write_text("cut off before config.yaml")
    assert "--overwrite" in _command(run, None)                        # its own leftovers, no config to resume
    (run.run_dir / "config.yaml").write_text("seed: 1\n")
    command = _command(run, None)
    assert f"resume={run.run_dir}" in command and "plugins=[my_plugin]" in command and "--overwrite" not in command


# ------------------------------------------------------------------ 3. the lock

STEPS_PLUGIN = """
import os, signal, time
from pathlib import Path
from rlzoo.api import hookimpl
@hookimpl
def rlzoo_step_end(step, metrics, ctx):
    markers = os.environ.get("RLZOO_TEST_MARKERS")
    if markers and os.environ.get("RANK", "0") == "0":
        Path(markers, f"step-{step}").touch()
    if os.environ.get("RLZOO_TEST_KILL_RANK") == f"{os.environ.get('RANK')}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(float(os.environ.get("RLZOO_TEST_STEP_SLEEP", "0")))
"""


def _steps_plugin(tmp_path: Path) -> dict[str, str]:
    """Write the test plugin (markers, rank kills, slow steps); the env that imports it."""
    (tmp_path / "rlzoo_test_steps.py").write_text(textwrap.dedent(STEPS_PLUGIN))
    (tmp_path / "markers").mkdir()
    return {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "RLZOO_TEST_MARKERS": str(tmp_path / "markers"), "OMP_NUM_THREADS": "1"}


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


@SLOW
def test_a_run_in_use_is_refused_and_a_dead_runs_lock_is_taken_over(capsys, tmp_path: Path, monkeypatch) -> None:
    env = _steps_plugin(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))                         # the run's plugin, for resume= here
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-m", "rlzoo", "train", *TINY, f"run_dir={run_dir}",
                               "trainer.total_steps=1000", "checkpoint.every=1", "plugins=[rlzoo_test_steps]"],
                              env={**os.environ, **env, "RLZOO_TEST_STEP_SLEEP": "0.2"}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(tmp_path / "markers" / "step-2", holder)
        for args in ([*TINY, f"run_dir={run_dir}"], [f"resume={run_dir}"],
                     ["--overwrite", *TINY, f"run_dir={run_dir}"]):
            assert main(["train", *args]) == 2
            assert f"is in use by another rlzoo run (pid {holder.pid})" in error_line(capsys.readouterr().err)
    finally:
        holder.kill()                                                  # SIGKILL: its lock stays behind
        holder.communicate()
    assert (run_dir / ".lock").read_text().strip() == str(holder.pid)
    newest = steps(run_dir)[-1]
    assert main(["train", f"resume={run_dir}", f"trainer.total_steps={newest + 1}"]) == 0  # the stale lock
    assert steps(run_dir)[-1] == newest + 1 and (run_dir / ".lock").read_text().strip() == str(os.getpid())


def test_the_lock_is_exclusive_and_names_its_holder(tmp_path: Path) -> None:
    from rlzoo.core.errors import ConfigError
    from rlzoo.run.run_lock import RunLock, lock_holder

    first, second = RunLock(tmp_path), RunLock(tmp_path)
    first.acquire()
    assert lock_holder(tmp_path) == os.getpid()
    with pytest.raises(ConfigError, match=f"in use by another rlzoo run \\(pid {os.getpid()}\\)"):
        second.acquire()
    first.release()
    assert lock_holder(tmp_path) is None
    second.acquire()                                                   # released: taken over
    second.release()


# ------------------------------------------------------------------ 4. non-finite values


def test_float16_training_is_refused_with_the_reason(capsys) -> None:
    assert main(["config", "model.dtype=float16"]) == 2
    line = error_line(capsys.readouterr().err)
    assert "model.dtype=float16" in line and "NaN" in line and "bfloat16" in line


@SLOW
def test_non_finite_weights_stop_the_run_and_the_last_checkpoint_stays_intact(capsys, tmp_path: Path,
                                                                            monkeypatch) -> None:
    real_step = torch.optim.AdamW.step

    def overflowing_step(self, *args, **kwargs):                       # an update that overflowed
        result = real_step(self, *args, **kwargs)
        self.param_groups[0]["params"][-1].data.view(-1)[0] = float("inf")
        return result

    monkeypatch.setattr(torch.optim.AdamW, "step", overflowing_step)
    run_dir = tmp_path / "run"
    code = main(["train", *TINY, f"run_dir={run_dir}", "trainer.total_steps=3", "checkpoint.every=0",
                 "trainer.num_mini_batches=1"])                      # one step: the weight check sees it
    line = error_line(capsys.readouterr().err)
    assert code == 2 and "non-finite weights after the update of step 1 (policy weight" in line
    assert steps(run_dir) == [0] and verify_checkpoint(list_checkpoints(run_dir)[0][1]) is None
    assert json.loads((run_dir / "status.json").read_text())["status"] == "failed"


def test_config_numbers_must_fit_float32(capsys) -> None:
    assert main(["config", "trainer.lr=1e39"]) == 2                  # would overflow inside AdamW
    assert "float32's range" in error_line(capsys.readouterr().err)


def test_a_checkpoint_is_never_written_from_non_finite_weights(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    model.save_pretrained = lambda path: None
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match=r"not writing checkpoint .*step_000003: policy weight 'weight'"):
        save_checkpoint(tmp_path, 3, {"policy": model}, {"step": 3}, keep=2)
    with pytest.raises(CheckpointError, match=r"trainer_state\['kl'\] is not finite"):
        save_checkpoint(tmp_path, 3, {}, {"step": 3, "kl": float("inf")}, keep=2)
    assert not (tmp_path / "checkpoints").exists()


# ------------------------------------------------------------------ 5. what a resume may change


@SLOW
def test_resume_refuses_other_changes_and_records_the_accepted_ones(capsys, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert main(["train", *TINY, f"run_dir={run_dir}", "trainer.total_steps=1"]) == 0
    saved = (run_dir / "config.yaml").read_text()
    capsys.readouterr()
    assert main(["train", f"resume={run_dir}", "trainer.total_steps=2", "trainer.lr=0.01", "algo=ppo",
                 "advantage=rloo"]) == 2
    line = error_line(capsys.readouterr().err)
    for change in ("trainer.lr (0.0005 -> 0.01)", "algo ('grpo' -> 'ppo')", "advantage.name ('grpo' -> 'rloo')"):
        assert change in line, line
    assert "trainer.total_steps" not in line.split("except")[0]       # allowed, so not listed as refused
    assert (run_dir / "config.yaml").read_text() == saved and steps(run_dir) == [0, 1]

    assert main(["train", f"resume={run_dir}", "trainer.total_steps=2", "logging.log_every=2"]) == 0
    entry = json.loads((run_dir / "resumes.jsonl").read_text().splitlines()[-1])
    assert entry["step"] == 1
    assert entry["changes"] == {"trainer.total_steps": [1, 2], "logging.log_every": [1, 2]}
    assert "total_steps: 2" in (run_dir / "config.yaml").read_text()
    assert "log_every: 2" in (run_dir / "config.yaml").read_text()


def test_resumable_keys() -> None:
    from rlzoo.core.errors import ConfigError
    from rlzoo.run.resume import resume_changes

    saved = {"trainer": {"total_steps": 5, "lr": 1e-3}, "logging": {"progress": True}, "resume": None}
    assert resume_changes(saved, {**saved, "resume": "x", "logging": {"progress": False}}) == {
        "logging.progress": (True, False)}
    with pytest.raises(ConfigError, match=r"cannot change trainer.lr \(0.001 -> 0.1\)"):
        resume_changes(saved, {**saved, "trainer": {"total_steps": 5, "lr": 0.1}})


# ------------------------------------------------------------------ 6. plugins on resume


@SLOW
def test_a_run_resumes_with_the_plugins_it_started_with(capsys, tmp_path: Path, plugin_module) -> None:
    from rlzoo.run.resume import plugin_modules

    name = plugin_module("""
        from rlzoo.api import hookimpl
        def half(prompts, completions, references):
            return [0.5] * len(completions)

        @hookimpl
        def rlzoo_register_reward_functions(register):
            register("half", half)
    """)
    run_dir = tmp_path / "run"
    assert main(["train", *TINY, f"run_dir={run_dir}", "trainer.total_steps=1", f"plugins=[{name}]",
                 "reward=half"]) == 0
    assert plugin_modules([f"resume={run_dir}"], None) == [name]
    assert main(["train", f"resume={run_dir}", "trainer.total_steps=2"]) == 0, capsys.readouterr().err
    assert steps(run_dir)[-1] == 2


@SLOW
def test_a_sweep_resumes_a_failed_run_that_uses_plugins(tmp_path: Path) -> None:
    (tmp_path / "rlzoo_test_flaky.py").write_text(textwrap.dedent("""
        import os
        from rlzoo.api import hookimpl
        from rlzoo.core.errors import TrainingError

        @hookimpl
        def rlzoo_step_end(step, metrics, ctx):
            if os.environ.get("RLZOO_TEST_FAIL_AT") == str(step):
                raise TrainingError(f"flaky at step {step}")
    """))
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    sweep = ["sweep", "--dir", str(tmp_path / "s"), *TINY, "trainer.total_steps=3",
             "checkpoint.every=1", "plugins=[rlzoo_test_flaky]"]
    first = subprocess.run([sys.executable, "-m", "rlzoo", *sweep], capture_output=True, text=True, timeout=300,
                           env={**os.environ, **env, "RLZOO_TEST_FAIL_AT": "2"})
    assert first.returncode == 1 and "failed runs: run" in first.stderr
    second = subprocess.run([sys.executable, "-m", "rlzoo", *sweep], capture_output=True, text=True, timeout=300,
                            env={**os.environ, **env})
    assert second.returncode == 0 and "1 of 1 runs done" in second.stdout, second.stdout + second.stderr
    run_dir = tmp_path / "s" / "run"
    assert json.loads((run_dir / "resumes.jsonl").read_text())["step"] == 1   # resumed, not restarted
    assert steps(run_dir)[-1] == 3


# ------------------------------------------------------------------ 7. a full disk


@SLOW
def test_a_full_disk_is_one_line_and_the_run_resumes(capsys, tmp_path: Path, monkeypatch) -> None:
    run_dir = tmp_path / "run"
    real_save, writes = torch.save, []

    def disk_full(obj, f, *args, **kwargs):
        if str(f).endswith("trainer_state.pt"):
            writes.append(f)
            if len(writes) == 3:                                       # step 0, 2, then 4 fails half-way
                Path(f).write_bytes(b"\0" * 1000)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full)
    code = main(["train", *TINY, f"run_dir={run_dir}", "trainer.total_steps=6", "checkpoint.every=2"])
    line = error_line(capsys.readouterr().err)
    assert code == 2 and "cannot write checkpoint" in line and "No space left on device" in line
    assert "step_000002 stays the newest checkpoint" in line and f"resume={run_dir}" in line
    assert steps(run_dir) == [0, 2] and leftovers(run_dir) == []
    assert not (run_dir / ".status.json.tmp").exists()
    monkeypatch.undo()
    (run_dir / ".status.json.tmp").write_text("{")                     # what a kill mid-write leaves
    assert main(["train", f"resume={run_dir}"]) == 0
    assert steps(run_dir) == [4, 6] and not (run_dir / ".status.json.tmp").exists()


def _can_mount_tmpfs(tmp_path: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            f"mount -t tmpfs -o size=64k tmpfs {tmp_path}"], capture_output=True)
    return probe.returncode == 0


@SLOW
def test_a_really_full_disk(tmp_path: Path) -> None:
    """ENOSPC from the kernel: a 500 kB tmpfs fills up at the checkpoint of step 6."""
    if not _can_mount_tmpfs(tmp_path):
        pytest.skip("needs `unshare --user --mount` to mount a small tmpfs")
    disk, run_dir = tmp_path / "disk", tmp_path / "disk" / "run"
    disk.mkdir()
    python = f"{sys.executable} -m rlzoo train"
    tiny = " ".join(TINY)
    script = f"""
        set -u
        mount -t tmpfs -o size=500k tmpfs {disk}
        {python} {tiny} run_dir={run_dir} trainer.total_steps=8 checkpoint.every=2 >/dev/null 2> {tmp_path}/err1
        echo "first=$?"
        ls -A {run_dir}/checkpoints | tr '\\n' ' '; echo
        mount -o remount,size=4m {disk}
        {python} resume={run_dir} >/dev/null 2> {tmp_path}/err2
        echo "resumed=$?"
        ls -A {run_dir}/checkpoints | tr '\\n' ' '; echo
    """
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", textwrap.dedent(script)],
                          capture_output=True, text=True, timeout=300)
    out = done.stdout.splitlines()
    assert out[0] == "first=2", done.stdout + done.stderr
    line = error_line((tmp_path / "err1").read_text())
    assert "No space left on device" in line and "stays the newest checkpoint" in line
    assert out[1].split() == ["step_000002", "step_000004"]           # no temporary directory left
    assert out[2] == "resumed=0", (tmp_path / "err2").read_text()
    assert out[3].split() == ["step_000006", "step_000008"]


# ------------------------------------------------------------------ 8. kills, signals, damaged checkpoints

CHAIN = [*TINY, "trainer.total_steps=8", "checkpoint.every=2", "trainer.update_epochs=2",
         "trainer.num_mini_batches=2"]


@SLOW
def test_every_kill_point_and_signal_leaves_a_run_that_resumes_to_the_uninterrupted_result(
        capsys, tmp_path: Path) -> None:
    """One run, killed or stopped at each point in turn, each time resumed, ends bit-identical
    to an uninterrupted run, with every step logged once."""
    want, run_dir = tmp_path / "want", tmp_path / "run"
    assert main(["train", *CHAIN, f"run_dir={want}"]) == 0
    resume = [f"resume={run_dir}"]

    killed = rlzoo(tmp_path, "train", *CHAIN, f"run_dir={run_dir}", fault="write:1")  # the first checkpoint
    assert killed.returncode == -signal.SIGKILL and steps(run_dir) == []
    assert leftovers(run_dir) == [n for n in leftovers(run_dir) if n.startswith(".tmp-step_000000")] != []
    assert main(["train", *CHAIN, f"run_dir={run_dir}"]) == 2           # not silently replaced
    assert f"start it over with `rlzoo train resume={run_dir}`" in error_line(capsys.readouterr().err)

    killed = rlzoo(tmp_path, "train", *resume, fault="update:6")      # mid-update of step 2
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert "start was cut off; starting the run over" in killed.stderr
    assert steps(run_dir) == [0] and leftovers(run_dir) == []

    killed = rlzoo(tmp_path, "train", *resume, fault="rename:2")      # renaming step 4 into place
    assert killed.returncode == -signal.SIGKILL and steps(run_dir) == [0, 2]
    assert leftovers(run_dir)[0].startswith(".tmp-step_000004")

    killed = rlzoo(tmp_path, "train", *resume, fault="prune:1")       # deleting step 0 after saving step 4
    assert killed.returncode == -signal.SIGKILL and steps(run_dir) == [2, 4]
    assert leftovers(run_dir) == [".del-step_000000"]
    assert "removed what interrupted writes left: .tmp-step_000004" in killed.stderr

    stopped = rlzoo(tmp_path, "train", *resume, fault="rollout:1:SIGTERM")  # SIGTERM during step 5's rollout
    assert stopped.returncode == 0, stopped.stderr
    assert "checkpoint written at step 5" in stopped.stdout and leftovers(run_dir) == []
    assert json.loads((run_dir / "status.json").read_text())["status"] == "interrupted"
    assert steps(run_dir) == [4, 5]

    stopped = rlzoo(tmp_path, "train", *resume, fault="rollout:2:SIGINT")   # Ctrl-C during step 7
    assert stopped.returncode == 0 and "checkpoint written at step 7" in stopped.stdout
    assert steps(run_dir) == [6, 7]

    aborted = rlzoo(tmp_path, "train", *resume, fault="rollout:1:SIGINT+SIGINT")  # Ctrl-C twice: abort
    assert aborted.returncode == 130 and "interrupted (Ctrl-C)" in error_line(aborted.stderr)
    assert steps(run_dir) == [6, 7]

    newest = run_dir / "checkpoints" / "step_000007" / "policy" / "model.safetensors"
    newest.write_bytes(newest.read_bytes()[:1000])                    # truncated on disk
    capsys.readouterr()
    assert main(["train", *resume]) == 0
    err = capsys.readouterr().err
    assert "checkpoint step_000007 is damaged (policy/model.safetensors has 1000 bytes" in err
    assert "resuming from step_000006" in err and (run_dir / "checkpoints" / "damaged-step_000007").is_dir()
    assert_same_run(run_dir, want, 8)


PRESETS = sorted(path.stem for path in (Path(__file__).parents[1] / "configs" / "algo").glob("*.yaml"))


def _optimizer_steps_per_step(args: list[str]) -> int:
    """AdamW steps in one training step of a run with ``args`` (the critic's count too)."""
    from rlzoo.plan.planner import load_config
    from zoo import REGISTRY

    plan = load_config(REGISTRY, args).plan
    return plan.update.epochs * plan.update.mini_batches * (2 if "critic" in plan.models else 1)


@SLOW
@pytest.mark.parametrize("algo, point", [*((algo, "update") for algo in PRESETS), ("dapo", "write")])
def test_a_kill_then_resume_is_bit_identical_for_every_preset(capsys, tmp_path: Path, algo: str, point: str) -> None:
    """kill -9 in the middle of step 2's update (or while step 1's ``trainer_state.pt`` is
    written), then ``resume=``: the same weights and curves as the uninterrupted run, for
    every built-in preset. (A checkpoint's weights, loaded at other memory alignments than
    trained weights, once made DAPO's one-sequence mini-batches round differently.)"""
    args = [*TINY, f"algo={algo}", "trainer.total_steps=2", "checkpoint.every=1", "eval.size=0"]
    want, run_dir = tmp_path / "want", tmp_path / "run"
    assert main(["train", *args, f"run_dir={want}"]) == 0
    initial = load_file(str(want / "init_model" / "model.safetensors"))
    assert any(not torch.equal(weights(want, 2)[key], start) for key, start in initial.items())  # it learned
    per_step = _optimizer_steps_per_step(args)
    fault = f"update:{per_step + per_step // 2 + 1}" if point == "update" else "write:2"
    killed = rlzoo(tmp_path, "train", *args, f"run_dir={run_dir}", fault=fault)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert steps(run_dir)[-1] == (1 if point == "update" else 0)
    capsys.readouterr()
    assert main(["train", f"resume={run_dir}"]) == 0, capsys.readouterr().err[-3000:]
    assert_same_run(run_dir, want, 2)


def _signal_until_exit(proc: subprocess.Popen, signum: int, every: float = 0.05, timeout: float = 120) -> None:
    """Send ``signum`` to ``proc`` every ``every`` s until it exits (a scheduler that keeps
    signalling, through the checkpoint write and the exit)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        proc.send_signal(signum)
        time.sleep(every)


@SLOW
def test_sigterms_every_50_ms_stop_the_run_once_with_a_checkpoint(tmp_path: Path) -> None:
    env = _steps_plugin(tmp_path)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "rlzoo", "train", *TINY, f"run_dir={run_dir}", "eval.size=0",
                             "trainer.total_steps=1000", "checkpoint.every=0", "plugins=[rlzoo_test_steps]"],
                            env={**os.environ, **env, "RLZOO_TEST_STEP_SLEEP": "0.2"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(tmp_path / "markers" / "step-1", proc)
        _signal_until_exit(proc, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]                          # not -15: later SIGTERMs are ignored
    stopped = json.loads((run_dir / "status.json").read_text())
    assert stopped["status"] == "interrupted" and f"checkpoint written at step {stopped['step']}" in out
    assert out.count("SIGTERM received") == 1 and steps(run_dir)[-1] == stopped["step"]


@SLOW
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_sweep_stops_its_run_with_a_checkpoint_and_starts_no_other(tmp_path: Path,
                                                                                    signum: int) -> None:
    """``kill -INT`` / ``kill -TERM`` of the sweep's pid alone (not its process group): the
    running run gets the signal once, writes a checkpoint, the sweep waits for it, starts no
    further run and exits 0; nothing trains on."""
    env = _steps_plugin(tmp_path)
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "-m", "rlzoo", "sweep", "--dir", str(sweep_dir), "seed=0,1", *TINY,
                             "eval.size=0", "trainer.total_steps=1000", "checkpoint.every=0",
                             "plugins=[rlzoo_test_steps]"],
                            env={**os.environ, **env, "RLZOO_TEST_STEP_SLEEP": "0.2"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(tmp_path / "markers" / "step-1", proc)
        os.kill(proc.pid, signum)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    first, second = sweep_dir / "seed-0", sweep_dir / "seed-1"
    stopped = json.loads((first / "status.json").read_text())
    assert stopped["status"] == "interrupted" and steps(first)[-1] == stopped["step"]
    assert "[seed-0] interrupted" in out and "[seed-1] started" not in out and not (second / "config.yaml").exists()
    assert "run the same sweep command again to resume it" in out
    survivors = subprocess.run(["pgrep", "-f", f"run_dir={first}"], capture_output=True, text=True).stdout
    assert survivors.strip() == ""


def test_verification_finds_truncated_altered_and_missing_files(tmp_path: Path) -> None:
    from rlzoo.run.checkpoint import newest_intact_checkpoint

    for step in (1, 2):
        folder = tmp_path / "checkpoints" / f"step_{step:06d}"
        (folder / "policy").mkdir(parents=True)
        (folder / "policy" / "model.safetensors").write_bytes(b"w" * 100)
        (folder / "trainer_state.pt").write_bytes(b"s" * 50)
        write_manifest(folder)
    newest = tmp_path / "checkpoints" / "step_000002"
    assert newest_intact_checkpoint(tmp_path) == (newest, [])
    (newest / "trainer_state.pt").write_bytes(b"s" * 49)
    assert "trainer_state.pt has 49 bytes, the manifest says 50" in verify_checkpoint(newest)
    (newest / "trainer_state.pt").write_bytes(b"x" * 50)
    assert "does not match its SHA-256" in verify_checkpoint(newest)
    assert verify_checkpoint(newest, hashes=False) is None
    (newest / "trainer_state.pt").unlink()
    assert verify_checkpoint(newest) == "trainer_state.pt is missing"
    found, damaged = newest_intact_checkpoint(tmp_path)
    assert found == tmp_path / "checkpoints" / "step_000001" and damaged == [(newest, "trainer_state.pt is missing")]


@SLOW
def test_torchrun_group_kill_and_rank_death_resume_to_the_uninterrupted_result(tmp_path: Path) -> None:
    """launcher.nproc=2: SIGTERM to rlzoo stops torchrun and both ranks with a checkpoint
    (exit 0); a rank killed later ends the job (the newest checkpoint intact); the run
    resumes to the same weights and curves as an uninterrupted one."""
    env = _steps_plugin(tmp_path)
    env.pop("WORLD_SIZE", None)
    args = [*TINY, "launcher.nproc=2", "trainer.total_steps=6", "checkpoint.every=2", "plugins=[rlzoo_test_steps]"]
    want, run_dir = tmp_path / "want", tmp_path / "run"
    done = rlzoo(tmp_path, "train", *args, f"run_dir={want}", env=env)
    assert done.returncode == 0, done.stderr[-3000:]

    shutil.rmtree(tmp_path / "markers")
    (tmp_path / "markers").mkdir()
    launcher = subprocess.Popen([sys.executable, "-m", "rlzoo", "train", *args, f"run_dir={run_dir}"],
                                env={**os.environ, **env, "RLZOO_TEST_STEP_SLEEP": "0.5"}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(tmp_path / "markers" / "step-1", launcher)
        launcher.send_signal(signal.SIGTERM)
        out, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, err[-3000:]
    stopped = json.loads((run_dir / "status.json").read_text())
    assert stopped["status"] == "interrupted" and steps(run_dir)[-1] == stopped["step"] < 4
    assert f"checkpoint written at step {stopped['step']}" in out and "Traceback" not in err
    survivors = subprocess.run(["pgrep", "-f", f"run_dir={run_dir}"], capture_output=True, text=True).stdout
    assert survivors.strip() == ""                                    # neither torchrun nor a rank trains on

    died = rlzoo(tmp_path, "train", f"resume={run_dir}", env={**env, "RLZOO_TEST_KILL_RANK": "1:4"})
    assert died.returncode != 0
    assert "rank 0: a collective failed" in died.stderr and "the torchrun job failed" in died.stderr
    assert died.stderr.rstrip().splitlines()[-1].startswith("rlzoo: error: the torchrun job failed")
    assert steps(run_dir)[-1] < 4 and verify_checkpoint(list_checkpoints(run_dir)[-1][1]) is None

    done = rlzoo(tmp_path, "train", f"resume={run_dir}", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_run(run_dir, want, 6)


ASYNC_PLUGIN = """
import os, signal, time
from rlzoo.api import hookimpl
from rlzoo_plugins.rewards import sorted_digits

CALLS = [0]

def flaky_sorted(prompts, completions, references):
    CALLS[0] += 1  # counted per process: with rollout.mode=async and eval.size=0 only the generator scores
    if str(CALLS[0]) == os.environ.get("RLZOO_TEST_FAIL_AT"):
        if os.environ.get("RLZOO_TEST_FAIL") == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if os.environ.get("RLZOO_TEST_FAIL") == "hang":
            time.sleep(3600)
        raise ValueError("injected generator failure")
    return sorted_digits(prompts, completions, references)

@hookimpl
def rlzoo_register_reward_functions(register):
    register("flaky_sorted", flaky_sorted)
"""

ASYNC_RUN = [*TINY, "rollout.mode=async", "eval.size=0", "reward=flaky_sorted",
             "plugins=[rlzoo_test_steps,rlzoo_test_async]"]


def _async_env(tmp_path: Path) -> dict[str, str]:
    """The steps plugin's env, plus the async test plugin (a reward that fails on demand)."""
    (tmp_path / "rlzoo_test_async.py").write_text(textwrap.dedent(ASYNC_PLUGIN))
    return _steps_plugin(tmp_path)


def _children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def _running(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _running(pid)


def _start_async(tmp_path: Path, env: dict[str, str], run_dir: Path, **popen: object) -> tuple[subprocess.Popen, int]:
    """A long async run, once step 1 is done: the trainer process and its generator's pid."""
    proc = subprocess.Popen([sys.executable, "-m", "rlzoo", "train", *ASYNC_RUN, f"run_dir={run_dir}",
                             "trainer.total_steps=1000", "checkpoint.every=0"],
                            env={**os.environ, **env, "RLZOO_TEST_STEP_SLEEP": "0.2"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)
    _wait_for(tmp_path / "markers" / "step-1", proc)
    children = _children(proc.pid)   # the generator, and multiprocessing's resource tracker
    generators = [pid for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(generators) == 1, children                            # the one generator process
    return proc, generators[0]


@SLOW
@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_async_signal_checkpoints_stops_the_generator_and_the_run_resumes(tmp_path: Path, how: str) -> None:
    """SIGTERM to the trainer, or SIGINT to the whole process group (a terminal's Ctrl-C,
    which the generator ignores): the step finishes, a checkpoint is written, the generator
    is stopped (no orphan), exit 0; a resume (which regenerates the queue) completes."""
    env = _async_env(tmp_path)
    run_dir = tmp_path / "run"
    proc, generator = _start_async(tmp_path, env, run_dir, start_new_session=True)
    children = _children(proc.pid)
    try:
        if how == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert f"rollout generator process started (pid {generator}" in out
    stopped = json.loads((run_dir / "status.json").read_text())
    assert stopped["status"] == "interrupted" and steps(run_dir)[-1] == stopped["step"] >= 1
    assert f"checkpoint written at step {stopped['step']}" in out and "Traceback" not in err
    assert not _running(generator)                                    # stopped before the trainer exited
    assert all(_gone_within(pid, 10) for pid in children)             # no orphan (the resource tracker too)

    last = stopped["step"] + 2
    resumed = rlzoo(tmp_path, "train", f"resume={run_dir}", f"trainer.total_steps={last}", env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert steps(run_dir)[-1] == last
    assert [s for s, _ in read_scalars(run_dir)["rollout/staleness"]] == list(range(1, last + 1))


@SLOW
def test_a_killed_trainer_takes_its_generator_with_it(tmp_path: Path) -> None:
    env = _async_env(tmp_path)
    proc, generator = _start_async(tmp_path, env, tmp_path / "run")
    children = _children(proc.pid)
    try:
        proc.kill()
        proc.communicate(timeout=60)
        assert _gone_within(generator, 10)                           # PR_SET_PDEATHSIG: SIGKILL
        assert all(_gone_within(pid, 10) for pid in children)
    finally:
        for pid in children:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


@SLOW
@pytest.mark.parametrize("how, fragment", [
    ("raise", "failed before step 3's batch: reward function 'flaky_sorted' raised ValueError: injected generator "
              "failure"),
    ("kill", "was killed by SIGKILL before step 3's batch"),
    ("hang", "is alive but sent no batch for step 3 in 3"),  # 30 s and a little
])
def test_a_generator_crash_is_one_error_naming_it_and_a_nonzero_exit(tmp_path: Path, how: str,
                                                                     fragment: str) -> None:
    """The reward's third call (the generator's third batch) fails, or never returns: the
    trainer, waiting for step 3's batch, stops with one error line naming the generator, exit
    2, no hang (a hung generator after rollout.generator_timeout_s)."""
    env = {**_async_env(tmp_path), "RLZOO_TEST_FAIL_AT": "3", "RLZOO_TEST_FAIL": how}
    run_dir = tmp_path / "run"
    failed = rlzoo(tmp_path, "train", *ASYNC_RUN, f"run_dir={run_dir}", "trainer.total_steps=6",
                   "rollout.max_staleness=6", *["rollout.generator_timeout_s=30"] * (how == "hang"), env=env,
                   timeout=180)
    assert failed.returncode == 2, failed.stderr[-3000:]
    line = error_line(failed.stderr)
    trained = 2
    if how == "kill" and "before step 2's batch" in line:
        # SIGKILL also kills the queue's feeder thread: batch 2, put but not yet written to the
        # pipe (the trainer was still on step 1), is lost with the process; the trainer then
        # names step 2 truthfully. Seen under load in CI.
        fragment, trained = fragment.replace("step 3", "step 2"), 1
    assert "the rollout generator process (pid" in line and fragment in line, line
    assert json.loads((run_dir / "status.json").read_text())["status"] == "failed"
    assert steps(run_dir)[-1] == 0 and len(read_scalars(run_dir)["policy/loss"]) == trained


# ------------------------------------------------------------------ 9. one line, nothing half-written


def _model_dir(path: Path) -> Path:
    from omegaconf import OmegaConf

    from rlzoo.models.build import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer("0123456789=")
    cfg = OmegaConf.create(dict(arch="qwen2", hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                                num_kv_heads=1))
    build_tiny_model(cfg, tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("damage, fragment", [
    ("config.json", "JSON"),
    ("model.safetensors", "SafetensorError"),
])
def test_an_unreadable_model_directory_is_one_line(capsys, tmp_path: Path, damage: str, fragment: str) -> None:
    model = _model_dir(tmp_path / "model")
    (model / damage).write_bytes((model / damage).read_bytes()[:40])
    run_dir = tmp_path / "run"
    assert main(["train", *TINY, f"model.path={model}", f"run_dir={run_dir}", "trainer.total_steps=1"]) == 2
    line = error_line(capsys.readouterr().err)
    assert f"cannot load the model in {str(model)!r}" in line and fragment in line
    assert not run_dir.exists()                                       # created, then removed again


@pytest.mark.parametrize("where, fragment", [
    ("file", "is a file, not a directory"),
    ("file/run", "Not a directory"),
    ("/proc/rlzoo-run", "cannot create run_dir '/proc/rlzoo-run'"),
    ("readonly/run", "Permission denied"),
])
def test_an_unusable_run_dir_is_one_line(capsys, tmp_path: Path, where: str, fragment: str) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "readonly").mkdir(mode=0o555)
    if where.startswith("readonly") and os.geteuid() == 0:
        pytest.skip("root writes into a read-only directory")
    before = sorted(tmp_path.rglob("*"))
    run_dir = where if where.startswith("/") else tmp_path / where
    assert main(["train", *TINY, f"run_dir={run_dir}", "trainer.total_steps=1"]) == 2
    assert fragment in error_line(capsys.readouterr().err)
    assert sorted(tmp_path.rglob("*")) == before


@pytest.fixture(scope="module")
def finished_runs(tmp_path_factory) -> dict[str, Path]:
    """One-step runs: ``grpo`` (the run the cases damage), ``ppo``, ``wide`` (hidden 64)."""
    root = tmp_path_factory.mktemp("runs")
    extra = {"grpo": [], "ppo": ["algo=ppo"], "wide": ["model.hidden_size=64"]}
    for name, overrides in extra.items():
        assert main(["train", *TINY, f"run_dir={root / name}", "trainer.total_steps=1", *overrides]) == 0
    return {name: root / name for name in extra}


@SLOW
@pytest.mark.parametrize("case, fragment", [
    ("shapes", "is not a checkpoint of this run's model (hidden_size 64 vs 32"),
    ("algorithm", "holds no critic, but this run has one"),
    ("optimizer", "trainer_state.pt does not fit this run: optimizer state"),
])
def test_a_checkpoint_of_another_run_is_one_line(capsys, tmp_path: Path, finished_runs: dict[str, Path],
                                                 case: str, fragment: str) -> None:
    """Checkpoints put together from other runs' files (with a matching manifest, as a
    person copying directories around would produce) are refused before anything runs."""
    target = "ppo" if case == "algorithm" else "grpo"
    run_dir = tmp_path / "run"
    shutil.copytree(finished_runs[target], run_dir)
    checkpoint = run_dir / "checkpoints" / "step_000001"
    if case == "shapes":
        shutil.rmtree(checkpoint / "policy")
        shutil.copytree(finished_runs["wide"] / "checkpoints" / "step_000001" / "policy", checkpoint / "policy")
    elif case == "algorithm":
        shutil.rmtree(checkpoint)
        shutil.copytree(finished_runs["grpo"] / "checkpoints" / "step_000001", checkpoint)
    else:
        shutil.copy(finished_runs["wide"] / "checkpoints" / "step_000001" / "trainer_state.pt", checkpoint)
    (checkpoint / "manifest.json").unlink()
    write_manifest(checkpoint)
    before = sorted(p.name for p in run_dir.rglob("*"))
    capsys.readouterr()
    assert main(["train", f"resume={run_dir}", "trainer.total_steps=2"]) == 2
    assert fragment in error_line(capsys.readouterr().err)
    assert sorted(p.name for p in run_dir.rglob("*")) == before


@pytest.mark.parametrize("override, fragment", [
    ("run_name=${nosuch:x}", "cannot resolve run_name: Unsupported interpolation type nosuch"),
    ("trainer.lr=${oc.env:RLZOO_TEST_UNSET}", "cannot resolve trainer.lr"),
    ("seed=!!python/name:os.system", "cannot parse override 'seed=!!python/name:os.system'"),
])
def test_a_bad_interpolation_or_yaml_tag_is_one_line(capsys, tmp_path: Path, override: str, fragment: str) -> None:
    assert main(["train", *TINY, override, f"run_dir={tmp_path / 'run'}"]) == 2
    assert fragment in error_line(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ 10. interpolations


@SLOW
def test_interpolations_are_stored_resolved_and_compare_never_resolves(capsys, tmp_path: Path,
                                                                       monkeypatch) -> None:
    from rlzoo.plan.hparams import flatten_config

    monkeypatch.setenv("RLZOO_TEST_NAME", "from-the-environment")
    run_dir = tmp_path / "run"
    assert main(["train", *TINY, f"run_dir={run_dir}", "trainer.total_steps=1",
                 "run_name=${oc.env:RLZOO_TEST_NAME}"]) == 0
    saved = (run_dir / "config.yaml").read_text()
    assert "run_name: from-the-environment" in saved and "${" not in saved
    monkeypatch.setenv("RLZOO_TEST_NAME", "the-viewer's")             # compare shows what a run saved
    # compare's fallback for runs without recorded hparams flattens config.yaml as saved
    assert flatten_config({"run_name": "${oc.env:RLZOO_TEST_NAME}"}) == {
        "run_name": "${oc.env:RLZOO_TEST_NAME}"}


# ------------------------------------------------------------------ 11. processes sharing the machine


def test_runs_whose_threads_oversubscribe_the_cores_warn_once_naming_the_fix(capsys, tmp_path: Path,
                                                                             monkeypatch) -> None:
    from rlzoo.core import processes
    registry = tmp_path / "threads"
    monkeypatch.setattr(processes, "REGISTRY", registry)
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = processes.register(4, registry, pid=int(finished.stdout))             # a run killed with -9
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        processes.register(processes.usable_cores(), registry, pid=other.pid)     # a run using every core
        assert main(["train", *TINY, f"run_dir={tmp_path / 'run'}", "trainer.total_steps=1", "eval.size=0"]) == 0
        err = capsys.readouterr().err
        warnings = [line for line in err.splitlines() if "rlzoo runs on this machine compute with" in line]
        assert len(warnings) == 1 and "trainer.threads=1" in warnings[0] and f"pid {other.pid}" in warnings[0]
        assert dead is not None and not dead.exists()                             # the dead run's record went
        assert sorted(p.name for p in registry.iterdir()) == [str(other.pid)]     # ours went at the end
    finally:
        other.kill()
        other.wait()
    assert processes.oversubscription(processes.usable_cores(), registry) is None  # alone: fits


def test_other_work_by_hand() -> None:
    from rlzoo.core.processes import other_work

    # 400 ticks on 4 cores: 300 busy, 100 of them this process's -> 200/400 of 4 cores = 2 cores' worth
    assert other_work((1000, 5000), (1300, 5400), own=100, cores=4) == 2.0
    assert other_work((1000, 5000), (1050, 5400), own=100, cores=4) == 0.0    # own ticks counted twice: floored
    assert other_work((1000, 5000), (1000, 5000), own=0, cores=4) == 0.0      # no tick passed


def test_the_busy_machine_warning_names_trainer_threads_1(monkeypatch) -> None:
    from rlzoo.core import processes

    monkeypatch.setattr(processes, "usable_cores", lambda: 2)
    said = processes.machine_busy(2, 1.0)
    assert said is not None and "about 1.0 of its" in said and "this run's 2 torch threads" in said
    assert "trainer.threads=1" in said
    assert processes.machine_busy(1, 1.9) is None            # one thread: nothing to advise
    assert processes.machine_busy(2, 0.3) is None            # a little other work
    assert processes.machine_busy(2, None) is None           # /proc unreadable
    monkeypatch.setattr(processes, "usable_cores", lambda: 8)
    assert processes.machine_busy(4, 2.0) is None            # the threads still get a core each


def test_busy_cores_sees_another_program_spinning() -> None:
    """Another program (no rlzoo run, no record) spinning on a core is about one core's worth of
    work; the registry of rlzoo runs never saw it."""
    from rlzoo.core import processes

    if processes.busy_cores(0.01) is None:
        pytest.skip("no /proc/stat here")
    spinner = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        time.sleep(0.3)
        assert processes.busy_cores(0.5) >= 0.5
    finally:
        spinner.kill()
        spinner.wait()


SPIN = "import time\nend = time.time() + 30\nwhile time.time() < end: pass"


@pytest.mark.slow
def test_a_run_of_several_threads_beside_a_busy_program_warns_naming_trainer_threads_1(capsys, tmp_path: Path,
                                                                                       monkeypatch) -> None:
    from rlzoo.core import processes

    cores = processes.usable_cores()
    if cores < 2 or processes.busy_cores(0.01) is None:
        pytest.skip("needs 2 cores and /proc/stat")
    monkeypatch.setattr(processes, "REGISTRY", tmp_path / "threads")  # no rlzoo run to count: only the spinner
    spinner = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        time.sleep(0.3)
        overrides = [*TINY, f"trainer.threads={cores}", "trainer.total_steps=1", "eval.size=0"]
        assert main(["train", *overrides, f"run_dir={tmp_path / 'run'}"]) == 0
    finally:
        spinner.kill()
        spinner.wait()
    warnings = [line for line in capsys.readouterr().err.splitlines() if "busy with other work" in line]
    assert len(warnings) == 1 and "trainer.threads=1" in warnings[0], warnings


@pytest.mark.parametrize("subcommand", ["train", "rm"])
def test_a_failed_torchrun_job_names_the_command_that_resumes_it(monkeypatch, capsys, tmp_path: Path,
                                                                 subcommand: str) -> None:
    """The last line of a failed torchrun job names the resume of the command that ran
    (``rlzoo rm`` runs under torchrun too: its resume is ``rlzoo rm resume=``)."""
    from rlzoo.commands import launcher

    class Failed:
        pid = 0

        def __init__(self, command, **kwargs) -> None:
            assert command[command.index("rlzoo") + 1] == subcommand

        def wait(self) -> int:
            return 1

    monkeypatch.setattr(launcher.subprocess, "Popen", Failed)
    assert launcher.launch_torchrun(["x=1"], 2, tmp_path, subcommand) == 1
    last = capsys.readouterr().err.rstrip().splitlines()[-1]
    assert last.startswith("rlzoo: error: the torchrun job failed")
    assert f"`rlzoo {subcommand} resume={tmp_path}`" in last
