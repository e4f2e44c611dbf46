"""The CLI: listing, config resolution and every user-error path (exit code 2, one message)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlzoo.commands.cli import main
from rlzoo.contract.hookspecs import KIND_TITLES
from zoo import fake_distribution


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_usage_error(code: int, out: str, err: str, *fragments: str) -> None:
    assert code == 2, (out, err)
    assert "Traceback" not in err and "Traceback" not in out
    errors = [line for line in err.splitlines() if line.startswith("rlzoo: error:")]
    assert len(errors) == 1, err
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])


def test_console_script_help_lists_commands() -> None:
    result = subprocess.run([sys.executable, "-m", "rlzoo", "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    for command in ("train", "sft", "list", "config"):
        assert command in result.stdout


def test_list_groups_every_kind_with_package_and_description(capsys) -> None:
    code, out, err = run_cli(capsys, "list")
    assert code == 0, err
    for kind, title in KIND_TITLES.items():
        assert f"{title} ({kind}):" in out
    line = next(line for line in out.splitlines() if line.strip().startswith("seq-mean-token-sum-norm"))
    assert "rlzoo" in line and "Dr.GRPO" in line


def test_list_json_entries(capsys) -> None:
    code, out, _ = run_cli(capsys, "list", "--json")
    assert code == 0
    data = json.loads(out)
    entries = data["components"]
    assert data["errors"] == []
    for entry in entries:
        assert {"kind", "name", "package", "description"} <= set(entry)
    names = {(e["kind"], e["name"]) for e in entries}
    assert ("loss_agg", "token-mean") in names and ("algorithm", "grpo") in names
    assert all(e["package"] == "rlzoo" for e in entries if e["plugin"].startswith("rlzoo:"))


def test_config_resolves_layers_and_exits_zero(capsys, tmp_path: Path) -> None:
    defaults = yaml.safe_load((Path(__file__).parents[1] / "configs" / "default.yaml").read_text())
    user = tmp_path / "run.yaml"
    user.write_text("trainer:\n  lr: 0.00123\n  warmup_steps: 7\nrollout:\n  n: 4\nloss_agg: token-sum\n")
    assert defaults["trainer"]["lr"] != 0.00123 and defaults["trainer"]["warmup_steps"] != 7
    code, out, err = run_cli(capsys, "config", "--config", str(user), "algo=dr_grpo",
                             "loss_agg=seq-mean-token-mean", "rollout.n=6")
    assert code == 0, err
    cfg = yaml.safe_load(out)
    assert cfg["loss_agg"] == {"name": "seq-mean-token-mean"}       # CLI over file over preset
    assert cfg["trainer"]["lr"] == 0.00123                          # file over defaults
    assert cfg["trainer"]["warmup_steps"] == 7
    assert cfg["rollout"]["n"] == 6                                 # CLI over file
    assert cfg["advantage"]["name"] == "dr_grpo"                    # from the preset, not the default
    assert cfg["reward"] == {"name": "sorted_digits"}               # the task's default, written out


def test_preset_then_cli_component_replacement(capsys) -> None:
    code, out, _ = run_cli(capsys, "config", "algo=dapo", "policy_loss.clip_high=0.3")
    assert code == 0
    cfg = yaml.safe_load(out)
    assert cfg["policy_loss"]["clip_low"] == 0.2 and cfg["policy_loss"]["clip_high"] == 0.3
    code, out, _ = run_cli(capsys, "config", "algo=dapo", "policy_loss=vanilla_pg")
    assert code == 0
    assert yaml.safe_load(out)["policy_loss"] == {"name": "vanilla_pg"}


@pytest.mark.parametrize(
    "override, fragments",
    [
        ("algo=grpoo", ["unknown algorithm 'grpoo'", "ppo", "dapo", "Did you mean 'grpo'?"]),
        ("loss_agg=token-meen", ["unknown loss_agg 'token-meen'", "seq-mean-token-sum-norm",
                                 "Did you mean 'token-mean'?"]),
        ("advantage=gea", ["unknown advantage 'gea'", "grpo", "Did you mean 'gae'?"]),
        ("policy_loss=ppo_clipp", ["unknown policy_loss 'ppo_clipp'", "dual_clip",
                                   "Did you mean 'ppo_clip'?"]),
        ("kl.estimator=k5", ["unknown kl_estimator 'k5'", "k3", "low_var_kl"]),
        ("trainer.lrr=0.1", ["unknown config key 'trainer.lrr'", "Did you mean 'trainer.lr'?"]),
        ("rollout.nn=3", ["unknown config key 'rollout.nn'", "Did you mean 'rollout.n'?"]),
        ("trainer.lr=abc", ["trainer.lr", "'abc'", "float"]),
        ("rollout.n=two", ["rollout.n", "'two'", "int"]),
        ("trainer.lr_schedule=cosin", ["trainer.lr_schedule", "cosine"]),
        ("rollout.n=0", ["rollout.n", "> 0"]),
        ("policy_loss.clip_hihg=0.3", ["unknown parameter 'clip_hihg'", "ppo_clip",
                                       "Did you mean 'clip_high'?"]),
        ("notakey", ["notakey", "key=value"]),
        ("dual_clip,", ["'dual_clip,'", "key=value", "quote", "'policy_loss={name: dual_clip"]),
        ("trainer.betas=[1.5,0.99]", ["trainer.betas", "[1.5, 0.99]", "[0, 1)"]),
        ("seed=-1", ["seed", "-1", "[0, 2**32 - 1]"]),
        ("seed=99999999999999999999", ["seed", "99999999999999999999", "int64"]),
        ("trainer.total_steps=99999999999999999999", ["trainer.total_steps", "int64"]),
        ("policy_loss.clip_low=99999999999999999999", ["clip_low", "int64"]),
        ("trainer.max_grad_norm=0", ["trainer.max_grad_norm", "> 0", "trainer.max_grad_norm=null"]),
        ("run_name=../../x", ["run_name", "'../../x'", "run_dir=PATH"]),
        ("run_name=..", ["run_name", "'..'"]),
        ("reward=[{name: exact_match, weight: 1e39}]", ["reward[0].weight", "1e+39", "float32"]),
        ("reward=[{name: exact_match, weight: 0}, {name: length_match, weight: 0.0}]",
         ["every reward weight is 0", "exact_match", "non-zero"]),
        ("policy_loss={name:dual_clip}", ["unknown parameter 'name:dual_clip'", "space after the colon"]),
    ],
)
def test_bad_input_exits_2_with_one_clear_message(capsys, override: str, fragments: list[str]) -> None:
    code, out, err = run_cli(capsys, "config", override)
    assert_usage_error(code, out, err, *fragments)


def test_bad_input_in_train_fails_before_any_model_is_built(capsys, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    code, out, err = run_cli(capsys, "train", "algo=nope", f"run_dir={run_dir}")
    assert_usage_error(code, out, err, "unknown algorithm 'nope'")
    assert not run_dir.exists()


def test_dual_clip_parameter_range_checked_at_load(capsys) -> None:
    code, out, err = run_cli(capsys, "config", "policy_loss={name: dual_clip, clip_ratio_c: 0.5}")
    assert_usage_error(code, out, err, "clip_ratio_c", "0.5")


def test_missing_config_file(capsys, tmp_path: Path) -> None:
    code, out, err = run_cli(capsys, "config", "--config", str(tmp_path / "nope.yaml"))
    assert_usage_error(code, out, err, "nope.yaml", "does not exist")


def _billion_laughs() -> str:
    text = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    for prev, name in zip("abcdefgh", "bcdefghi"):
        text += f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]\n"
    return text


@pytest.mark.parametrize("text, fragment", [
    ("trainer: [unclosed", "not valid YAML"),
    ("- a\n- b\n", "must hold a mapping"),
    (b"\xa6\x00\xff binary", "is not a UTF-8 text file"),
    ("trainer:\n  lr: 0.001\n  total_steps: 5\n  lr: 0.002\n", "sets key 'lr' twice (lines 2 and 4)"),
    (_billion_laughs(), "expands to more than 100,000 nodes"),
    ("a: &a [*a]\n", "contains its own alias"),
])
def test_malformed_config_file(capsys, tmp_path: Path, text: str | bytes, fragment: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    code, out, err = run_cli(capsys, "config", "--config", str(path))
    assert_usage_error(code, out, err, "bad.yaml", fragment)


def test_unknown_key_in_config_file(capsys, tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  total_step: 10\n")
    code, out, err = run_cli(capsys, "config", "--config", str(path))
    assert_usage_error(code, out, err, "trainer.total_step", "Did you mean 'trainer.total_steps'?")


def test_two_plugins_registering_one_name_names_both(capsys, plugin_module) -> None:
    name = plugin_module(
        """
        from rlzoo.api import hookimpl
        def token_mean(loss, mask, counts=None):
            return (loss * mask).sum()

        @hookimpl
        def rlzoo_register_loss_aggregations(register):
            register("token-mean", token_mean, description="a clash")
        """
    )
    code, out, err = run_cli(capsys, "config", f"plugins=[{name}]")
    assert_usage_error(code, out, err, "'token-mean' is registered twice", "rlzoo:aggregation",
                       f"module:{name}")


def test_missing_plugin_module_from_config_is_named(capsys) -> None:
    code, out, err = run_cli(capsys, "config", "plugins=[no_such_rlzoo_plugin]")
    assert_usage_error(code, out, err, "no_such_rlzoo_plugin", "failed to import")


def test_plugin_that_fails_to_import_is_named_and_the_rest_still_listed(
    capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_distribution(tmp_path, "broken-rlzoo-plugin", "broken_rlzoo_mod", "raise RuntimeError('boom at import')\n",
                      entry="broken")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = run_cli(capsys, "list")
    assert code == 2
    assert "broken-rlzoo-plugin:broken" in err and "broken_rlzoo_mod" in err and "boom at import" in err
    assert "Traceback" not in err
    assert "token-mean" in out and "grpo" in out
    # a kind the broken plugin does not spoil is listed with exit 0, the plugin reported as a warning
    code, out, err = run_cli(capsys, "list", "--kind", "loss_agg")
    assert code == 0 and "token-mean" in out
    assert "rlzoo: warning:" in err and "broken-rlzoo-plugin:broken" in err and "rlzoo: error" not in err
    # other commands still work, warning about the broken plugin
    code, out, err = run_cli(capsys, "config", "algo=grpo")
    assert code == 0 and "warning" in err and "broken-rlzoo-plugin:broken" in err


def test_incompatible_plugin_api_version_is_refused(capsys, plugin_module) -> None:
    name = plugin_module(
        """
        RLZOO_API_VERSION = "1"
        """
    )
    code, out, err = run_cli(capsys, "config", f"plugins=[{name}]")
    assert_usage_error(code, out, err, "plugin API 1", "provides API 2", "docs/plugins.md")


@pytest.mark.parametrize("override, fragments", [
    ("trainer.ppo_epochs=2", ["'trainer.ppo_epochs'", "renamed to 'trainer.update_epochs'"]),
    ("trainer.mini_batches=2", ["'trainer.mini_batches'", "renamed to 'trainer.num_mini_batches'"]),
    ("kl.penalty=k1", ["'kl.penalty'", "renamed to 'kl.estimator'"]),
    ("policy_loss=vanilla", ["'vanilla' was retired", "use 'ppo_clip'"]),
])
def test_old_names_name_the_new_ones(capsys, override: str, fragments: list[str]) -> None:
    code, out, err = run_cli(capsys, "config", override)
    assert_usage_error(code, out, err, *fragments)


def test_old_key_in_a_config_file_names_the_file_and_the_new_key(capsys, tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text("trainer:\n  ppo_epochs: 4\n")
    code, out, err = run_cli(capsys, "config", "--config", str(path))
    assert_usage_error(code, out, err, "old.yaml", "trainer.update_epochs")


@pytest.mark.parametrize("overrides, fragments", [
    # a loss defined under one aggregation refuses another, naming where the other came from
    (["policy_loss=gspo", "loss_agg=token-mean"], ["policy_loss 'gspo'", "loss_agg=seq-mean-token-mean",
                                                  "token-mean (from command line)"]),
    (["algo=dapo", "policy_loss=geo_mean"], ["policy_loss 'geo_mean'", "(from preset dapo)"]),
    (["kl.estimator=full", "kl.apply=reward", "kl.coef=0.1"], ["kl.estimator 'full'", "kl.apply=loss"]),
    (["kl.controller=adaptive", "kl.apply=loss", "kl.coef=0.1"], ["kl.controller=adaptive",
                                                                   "kl.apply=reward"]),
    (["rollout.n=1"], ["advantage grpo", "rollout.n >= 2"]),
    (["trainer.num_mini_batches=5"], ["trainer.num_mini_batches=5", "128 sequences"]),
    (["rollout.temperature=0"], ["rollout.temperature", "> 0"]),
    (["trainer.lr=.nan"], ["trainer.lr", "nan", "finite"]),
    (["trainer.lr=.inf"], ["trainer.lr", "inf", "finite"]),
    (["kl.coef=.nan"], ["kl.coef", "finite"]),
    (["rollout.temperature=.nan"], ["rollout.temperature", "finite"]),
    (["policy_loss.clip_high=.inf"], ["policy_loss 'ppo_clip'", "clip_high=inf", "finite"]),
    (["rollout.dtype=float64"], ["rollout.dtype", "bfloat16"]),
])
def test_inconsistent_combinations_are_refused_before_a_run_directory_exists(
        capsys, tmp_path: Path, overrides: list[str], fragments: list[str]) -> None:
    code, out, err = run_cli(capsys, "config", *overrides)
    assert_usage_error(code, out, err, *fragments)
    run_dir = tmp_path / "run"
    code, out, err = run_cli(capsys, "train", *overrides, f"run_dir={run_dir}", "logging.progress=false")
    assert_usage_error(code, out, err, *fragments)
    assert not run_dir.exists()


def test_config_plan_prints_what_runs(capsys) -> None:
    code, out, err = run_cli(capsys, "config", "--plan", "algo=ppo", "trainer.num_mini_batches=4")
    assert code == 0, err
    assert "critic: value model" in out and "reference: frozen initial policy" in out
    assert "kl: k1 in the reward" in out and "adaptive, updated each step" in out
    assert "value: token-mean over response_mask" in out
    assert "4 epoch(s) x 4 mini-batch(es) of 32 sequences = 16 optimizer step(s)" in out
    code, out, err = run_cli(capsys, "config", "--plan", "trainer.num_mini_batches=1", "kl.coef=0")
    assert "warning: one on-policy update per rollout" in out and "reference" not in out


def test_max_grad_norm_null_turns_clipping_off(capsys) -> None:
    code, out, err = run_cli(capsys, "config", "trainer.max_grad_norm=null")
    assert code == 0, err
    assert yaml.safe_load(out)["trainer"]["max_grad_norm"] is None


def test_a_refused_resume_imports_none_of_the_runs_plugins(capsys, tmp_path: Path, plugin_module) -> None:
    marker = tmp_path / "imported"
    name = plugin_module(f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n")
    code, out, err = run_cli(capsys, "config")
    saved = {**yaml.safe_load(out), "plugins": [name]}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    (run_dir / "plan.txt").write_text("plan\n")
    for change, fragment in [("trainer.lr=0.5", "trainer.lr (0.0005 -> 0.5)"),
                             ("policy_loss=vanilla_pg", "policy_loss.name ('ppo_clip' -> 'vanilla_pg')"),
                             ("plugins=[]", "plugins (")]:
        code, out, err = run_cli(capsys, "config", f"resume={run_dir}", change)
        assert_usage_error(code, out, err, "cannot change", fragment, "nothing was imported")
        assert not marker.exists()
    code, out, err = run_cli(capsys, "config", f"resume={run_dir}", "trainer.lr=5e-4", "trainer.total_steps=7",
                             f"policy_loss={saved['policy_loss']['name']}")
    assert code == 0, err
    assert marker.read_text() == "ran"   # accepted: the run's plugins load, as documented


def test_a_resume_repeating_the_runs_own_values_is_not_refused_before_plugins(tmp_path: Path) -> None:
    from rlzoo.run.resume import check_before_plugins

    saved = {"trainer": {"lr": 0.002, "total_steps": 5}, "policy_loss": {"name": "ppo_clip", "clip_high": 0.2},
             "run_name": "123", "reward": [{"name": "a", "weight": 1.0}]}
    config = tmp_path / "run.yaml"
    config.write_text("trainer:\n  lr: 2e-3\n")          # YAML 1.1 reads 2e-3 as a string; the schema converts it
    check_before_plugins("r", saved, ["policy_loss=ppo_clip", "policy_loss.clip_high=0.2", "run_name=123",
                                      "reward=[a]", "trainer.total_steps=9"], config)
    with pytest.raises(Exception, match=r"trainer.lr \(0.002 -> 0.003\)"):
        check_before_plugins("r", saved, ["trainer.lr=0.003"], None)


# ------------------------------------------------------------------ outputs in the way, keys given twice (issue 37)


SHORT = ("trainer.total_steps=1", "trainer.threads=1", "eval.size=0", "logging.progress=false")
"""A one-step run: what a refusal test passes so that a regression costs seconds, not a training."""


def test_a_sweep_key_given_twice_is_refused(capsys, tmp_path: Path) -> None:
    """``seed=0,1 seed=2,3`` ran four runs named seed-0_seed-2 ... whose configs said seeds
    2,3,2,3: a key given twice is refused, before the sweep directory exists."""
    for items in (["seed=0,1", "seed=2,3"], ["seed=0", "seed=1,2"], ["trainer.lr=1e-3", "trainer.lr=1e-4"]):
        code, out, err = run_cli(capsys, "sweep", "--dir", str(tmp_path / "s"), *items, *SHORT)
        key = items[0].split("=")[0]
        assert_usage_error(code, out, err, f"sweep key {key!r} is given twice ({items[0]!r} and {items[1]!r})",
                           f"{key}=a,b,c")
    assert not (tmp_path / "s").exists()


def test_outputs_that_are_files_are_refused(capsys, tmp_path: Path) -> None:
    """``rlzoo sweep --dir F`` and ``rlzoo compare RUN --out F`` with F a file: one line, F untouched."""
    blocker = tmp_path / "F"
    blocker.write_text("mine\n")
    code, out, err = run_cli(capsys, "sweep", "--dir", str(blocker), "seed=0,1", *SHORT)
    assert_usage_error(code, out, err, f"--dir {str(blocker)!r} is a file, not a directory; choose another --dir")
    code, out, err = run_cli(capsys, "sweep", "--dir", str(blocker / "s"), "seed=0,1", *SHORT)
    assert_usage_error(code, out, err, f"--dir {str(blocker / 's')!r} cannot be created: {str(blocker)!r} is a file")
    code, out, err = run_cli(capsys, "compare", str(tmp_path), "--out", str(blocker))
    assert_usage_error(code, out, err, f"--out {str(blocker)!r} is a file, not a directory; choose another --out")
    assert blocker.read_text() == "mine\n" and sorted(p.name for p in tmp_path.iterdir()) == ["F"]


def _fake_run(path: Path) -> Path:
    """A directory holding a run's files (config.yaml, status.json), as a run leaves them."""
    from rlzoo.run.rundir import write_status

    path.mkdir(parents=True)
    (path / "config.yaml").write_text("seed: 0\n")
    write_status(path, "completed", 3, 3)
    return path


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_sft_refuses_an_out_that_holds_a_run_before_training(capsys, tmp_path: Path) -> None:
    run = _fake_run(tmp_path / "run")
    before = _listing(run)
    code, out, err = run_cli(capsys, "sft", "--steps", "1", *SHORT, "--out", str(run))
    assert_usage_error(code, out, err, f"--out {str(run)!r} exists and is not an empty directory (it holds a run: "
                                       "completed at step 3 of 3); write into a new (or empty) one")
    assert "sft step" not in out                              # refused before training
    assert _listing(run) == before


def test_export_refuses_a_negative_step(capsys, tmp_path: Path) -> None:
    run = _fake_run(tmp_path / "run")
    code, out, err = run_cli(capsys, "export", str(run), str(tmp_path / "out"), "--step", "-1")
    assert_usage_error(code, out, err, "--step must be a checkpoint's step (>= 0), got -1; the steps of")
    assert not (tmp_path / "out").exists()


def test_commands_make_openmp_threads_wait_briefly_unless_told_otherwise(monkeypatch) -> None:
    """A busy machine: long-spinning OpenMP threads made the default run 3x slower than
    trainer.threads=1 beside two busy processes, and passive waiting alone 1.3x slower when
    idle; every command sets the passive policy after a short spin before torch loads, and
    leaves a policy or spin count the user chose alone."""
    from rlzoo.commands.cli import main
    from rlzoo.core.processes import WAIT_POLICY

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert main(["list", "--kind", "loss_agg"]) == 0
    assert {k: os.environ[k] for k in WAIT_POLICY} == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "3000"}
    for chosen in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "100"}):
        for key in WAIT_POLICY:
            monkeypatch.delenv(key, raising=False)
        for key, value in chosen.items():
            monkeypatch.setenv(key, value)
        assert main(["list", "--kind", "loss_agg"]) == 0
        assert {k: os.environ.get(k) for k in WAIT_POLICY} == {**dict.fromkeys(WAIT_POLICY), **chosen}


def test_a_line_on_stderr_is_one_write_so_ranks_lines_never_interleave(monkeypatch) -> None:
    """stderr is unbuffered (a FileIO under a write-through text layer): print() writes the
    text and its newline in two system calls, and two torchrun ranks failing together printed
    'rlzoo: error: Arlzoo: error: B' on one line (CI, test_distributed). say() writes once."""
    import io

    from rlzoo.core.errors import say

    class Recorder(io.RawIOBase):
        def __init__(self) -> None:
            self.writes: list[bytes] = []

        def writable(self) -> bool:
            return True

        def write(self, data) -> int:
            self.writes.append(bytes(data))
            return len(data)

    raw = Recorder()
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(raw, write_through=True))
    print("rlzoo: error: by print", file=sys.stderr)
    assert raw.writes == [b"rlzoo: error: by print", b"\n"]  # what the ranks did
    raw.writes.clear()
    say("rlzoo: error: " + "x" * 3000)
    assert raw.writes == [b"rlzoo: error: " + b"x" * 3000 + b"\n"]
