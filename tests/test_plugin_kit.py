"""The plugin author's kit: plugins from the current directory or a file, parameters in
`rlzoo list --json`, name collisions in `rlzoo list`, preset errors, rlzoo.testing's task,
reward and preset checks."""

from __future__ import annotations

import json
import random
import sys
import uuid
from pathlib import Path

import pytest

from rlzoo.commands.cli import main
from rlzoo.core.errors import ConfigError
from rlzoo.contract.loading import build_registry, make_plugin_manager, module_plugin
from rlzoo.tasks.task import Example, Task
from zoo import fake_distribution
from rlzoo.api import CHECKED_KINDS, check_component, check_reward, check_task

REWARD = """
from rlzoo.api import hookimpl
def shouty(completions):
    return [float(c.isupper()) for c in completions]

@hookimpl
def rlzoo_register_reward_functions(register):
    register("{name}", shouty, description="1 for upper-case completions")
"""


@pytest.fixture
def isolated_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The current directory is a fresh temp dir that is not on sys.path (as for the
    `rlzoo` console script); sys.path is restored afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    return tmp_path


def test_a_module_in_the_current_directory_is_a_plugin(capsys, isolated_path: Path) -> None:
    name = f"my_reward_{uuid.uuid4().hex[:8]}"
    (isolated_path / f"{name}.py").write_text(REWARD.format(name=name))
    assert main(["config", f"plugins=[{name}]", f"reward={name}"]) == 0
    assert f"name: {name}" in capsys.readouterr().out


@pytest.mark.parametrize("where", ["my_reward.py", "lib/my_reward.py"])
def test_a_file_path_is_a_plugin(capsys, isolated_path: Path, where: str) -> None:
    name = f"file_reward_{uuid.uuid4().hex[:8]}"
    (isolated_path / where).parent.mkdir(exist_ok=True)
    (isolated_path / where).write_text(REWARD.format(name=name))
    assert main(["config", f"plugins=[{where}]", f"reward={name}"]) == 0
    out = capsys.readouterr().out
    assert f"name: {name}" in out
    registry = build_registry(make_plugin_manager(modules=[where]))
    assert registry.get("reward", name).package == where


def test_a_missing_plugin_says_where_it_looked(capsys, isolated_path: Path) -> None:
    assert main(["config", "plugins=[no_such_reward_mod]"]) == 2
    err = capsys.readouterr().err
    assert "no_such_reward_mod" in err and str(isolated_path) in err and "plugins=[path/to/" in err
    assert main(["config", "plugins=[missing/rew.py]"]) == 2
    err = capsys.readouterr().err
    assert "plugin file 'missing/rew.py'" in err and "does not exist" in err and "Traceback" not in err


def test_list_json_carries_parameters(capsys) -> None:
    assert main(["list", "--json", "--kind", "policy_loss"]) == 0
    entries = {e["name"]: e for e in json.loads(capsys.readouterr().out)["components"]}
    params = {p["name"]: p for p in entries["ppo_clip"]["params"]}
    assert params["clip_high"] == {"name": "clip_high", "type": "float", "default": 0.2, "range": "> 0",
                                   "doc": params["clip_high"]["doc"]}
    assert params["clip_low"]["range"] == "(0, 1)" and "ε_low" in params["clip_low"]["doc"]
    assert params["delta"]["type"] == "Optional[float]" and params["delta"]["default"] is None
    assert entries["vanilla_pg"]["params"] == [] and entries["ppo_clip"]["inputs"]


def test_a_name_collision_in_an_installed_package_is_listed_and_refuses_runs(
        capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_distribution(tmp_path, "clashing-rlzoo-pkg", "clashing_rlzoo_mod", """
        from rlzoo.api import hookimpl
        def mine(loss, mask, counts=None):
            return (loss * mask).sum()

        @hookimpl
        def rlzoo_register_loss_aggregations(register):
            register("token-mean", mine)
            register("my-sum", mine, description="still listed")
    """)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["list"]) == 2
    out, err = capsys.readouterr()
    assert "my-sum" in out and "grpo" in out                            # everything else is listed
    assert "'token-mean' is registered twice" in err and "clashing-rlzoo-pkg:main" in err
    assert "RLZOO_DISABLE_PLUGINS=clashing-rlzoo-pkg:main" in err
    assert main(["config"]) == 2                                         # a run is still refused
    assert "registered twice" in capsys.readouterr().err
    monkeypatch.setenv("RLZOO_DISABLE_PLUGINS", "clashing-rlzoo-pkg:main")  # the documented switch
    assert main(["config"]) == 0
    capsys.readouterr()


def test_an_unknown_component_names_plugins_that_failed_to_load() -> None:
    pm = make_plugin_manager()
    registry = build_registry(pm)
    registry.load_errors.append(ConfigError("plugin 'pkg:minmax' failed to import: SyntaxError"))
    with pytest.raises(ConfigError, match=r"unknown advantage 'minmax'.*1 plugin\(s\) failed to load.*pkg:minmax"):
        registry.get("advantage", "minmax")


def _with_preset(preset: dict, source: str = "") -> tuple:
    pm = make_plugin_manager()
    plugin = module_plugin(rlzoo_register_algorithms=lambda register: register("broken", preset,
                                                                               description="d"))
    pm.register_plugin(plugin, name="pkg:presets", package="rlzoo-broken")
    return pm, build_registry(pm)


@pytest.mark.parametrize("preset, fragment", [
    ({"advantage": "grpoo"}, "unknown advantage 'grpoo'"),
    ({"trainer": {"lrr": 1e-3}}, "unknown config key 'trainer.lrr'"),
    ({"policy_loss": {"name": "ppo_clip", "clip_hgh": 0.3}}, "unknown parameter 'clip_hgh'"),
    ({"plugins": ["x"]}, "sets plugins"),
])
def test_an_error_in_a_preset_names_the_preset_and_its_package(preset: dict, fragment: str) -> None:
    from rlzoo.plan.planner import load_config

    _, registry = _with_preset(preset)
    with pytest.raises(ConfigError) as info:
        load_config(registry, ["algo=broken"])
    assert "algorithm preset 'broken' (package rlzoo-broken)" in str(info.value) and fragment in str(info.value)
    with pytest.raises(AssertionError, match="algorithm preset 'broken' does not resolve"):
        check_component(registry.get("algorithm", "broken"), registry=registry)


def test_a_command_line_error_is_not_blamed_on_the_preset() -> None:
    from rlzoo.plan.planner import load_config

    with pytest.raises(ConfigError) as info:
        load_config(build_registry(make_plugin_manager()), ["algo=grpo", "advantage.epsilonn=1"])
    assert "preset" not in str(info.value) and "epsilonn" in str(info.value)


def test_testing_checks_tasks_rewards_and_presets(registry) -> None:
    assert {"task", "reward", "algorithm"} <= set(CHECKED_KINDS)
    check_component(registry.get("task", "sort_digits"), {"num_digits": 3})
    check_component(registry.get("reward", "countdown"),
                    task=registry.get("task", "countdown").bind(None)())
    check_component(registry.get("algorithm", "dapo"), registry=registry)

    class GlobalRandom(Task):
        alphabet = "0123456789="

        def sample(self, n, rng):
            return [Example(f"{random.randint(0, 99)}=", "1") for _ in range(n)]

    with pytest.raises(AssertionError, match="draw only from rng"):
        check_task(GlobalRandom())

    class SmallAlphabet(Task):
        alphabet = "0123456789"

        def sample(self, n, rng):
            return [Example(f"{rng.randint(0, 99)}=", "1") for _ in range(n)]

    with pytest.raises(AssertionError, match="alphabet lacks '='"):
        check_task(SmallAlphabet())

    with pytest.raises(AssertionError, match="returned shape"):
        check_reward(lambda completions: [1.0] * (len(completions) - 1), "short")
    with pytest.raises(AssertionError, match="non-finite score nan for completion ''"):
        check_reward(lambda completions: [1.0 / len(c) if c else float("nan") for c in completions], "nan")

    def mutating(completions, rows):
        rows[0]["seen"] = True
        return [0.0] * len(completions)

    with pytest.raises(AssertionError, match="modified its inputs"):
        check_reward(mutating, "mutating")
