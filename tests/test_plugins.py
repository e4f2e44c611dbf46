"""The plugin contract: hookspecs, plugin manager, registry."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from rlzoo import hookspecs
from rlzoo.errors import DuplicateComponentError, PluginError, UnknownComponentError
from rlzoo.plugins import build_registry, make_plugin_manager, module_plugin
from rlzoo.registry import Registry

ALL_HOOKS = [name for name, _ in inspect.getmembers(hookspecs, inspect.isfunction)
             if name.startswith("rlzoo_")]


def test_every_hookspec_is_documented_with_its_parameters() -> None:
    assert len(ALL_HOOKS) == len(hookspecs.REGISTRATION_HOOKS) + 5
    for name in ALL_HOOKS:
        spec = getattr(hookspecs, name)
        doc = inspect.getdoc(spec) or ""
        assert len(doc) > 80, name
        for param in inspect.signature(spec).parameters:
            assert f":param {param}:" in doc, (name, param)


def test_every_hook_is_documented_in_plugins_md() -> None:
    text = (Path(__file__).parents[1] / "docs" / "plugins.md").read_text()
    for name in ALL_HOOKS:
        assert f"`{name}" in text, name


def test_registration_hooks_cover_every_kind() -> None:
    pm = make_plugin_manager(load_entry_points=False)
    for kind, hook in hookspecs.REGISTRATION_HOOKS.items():
        assert hasattr(pm.hook, hook), kind
        assert kind in hookspecs.KIND_TITLES


def test_injected_plugin_registers_every_kind_and_is_removable() -> None:
    calls: list[str] = []

    def make(kind: str):
        def hook(register):
            calls.append(kind)
            register(f"test-{kind}", object(), description=f"a {kind}")
        return hook

    pm = make_plugin_manager(load_entry_points=False)
    plugin = module_plugin(**{hook: make(kind) for kind, hook in hookspecs.REGISTRATION_HOOKS.items()})
    pm.register(plugin, name="tester")
    try:
        registry = build_registry(pm)
        for kind in hookspecs.REGISTRATION_HOOKS:
            component = registry.get(kind, f"test-{kind}")
            assert component.plugin == "tester" and component.description == f"a {kind}"
        assert sorted(calls) == sorted(hookspecs.REGISTRATION_HOOKS)
    finally:
        pm.unregister(plugin)
    assert build_registry(pm).components() == []


def test_registry_aliases_unknown_names_and_duplicates() -> None:
    registry = Registry()
    registry.add("kl_penalty", "k3", print, aliases=("low_var_kl",), plugin="a", package="pa")
    assert registry.get("kl_penalty", "low_var_kl").name == "k3"
    assert registry.names("kl_penalty") == ["k3"]
    assert ("kl_penalty", "low_var_kl") in registry
    with pytest.raises(UnknownComponentError, match=r"unknown kl_penalty 'k33'.*Did you mean 'k3'"):
        registry.get("kl_penalty", "k33")
    with pytest.raises(DuplicateComponentError, match=r"'low_var_kl' is registered twice: by plugin 'a'"
                                                       r" \(pa\) and by plugin 'b'"):
        registry.add("kl_penalty", "low_var_kl", print, plugin="b", package="pb")
    with pytest.raises(PluginError, match="unknown needs"):
        registry.add("advantage", "x", print, needs=("gpu",), plugin="c")
    with pytest.raises(PluginError, match="unknown kind"):
        registry.add("optimizer", "x", print, plugin="c")


def test_a_plugin_failing_during_registration_is_named_and_the_rest_kept() -> None:
    def broken(register):
        raise RuntimeError("kaput")

    pm = make_plugin_manager()
    pm.register(module_plugin(rlzoo_register_tasks=broken), name="faulty")
    registry = build_registry(pm)
    assert any("faulty" in str(e) and "kaput" in str(e) for e in registry.load_errors)
    assert "sort_digits" in registry.names("task")


def test_rlzoo_plugins_env_var_restricts_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLZOO_PLUGINS", "aggregation")
    registry = build_registry(make_plugin_manager())
    assert registry.names("loss_agg") and registry.names("task") == []
    monkeypatch.delenv("RLZOO_PLUGINS")
    monkeypatch.setenv("RLZOO_DISABLE_PLUGINS", "rlzoo:tasks")
    registry = build_registry(make_plugin_manager())
    assert registry.names("task") == [] and registry.names("loss_agg")


def test_component_call_builds_params_from_keywords(registry) -> None:
    import torch

    task = registry.get("task", "sort_digits")
    assert task(num_digits=2).num_digits == 2
    agg = registry.get("loss_agg", "token-mean")
    assert float(agg(torch.ones(2, 3), torch.ones(2, 3))) == 1.0


def test_import_rlzoo_loads_no_plugin() -> None:
    import subprocess
    import sys

    code = "import sys, rlzoo; print(any(m.startswith('rlzoo_plugins') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert out.strip() == "False"


RECORDER = """
from rlzoo import hookimpl
CALLS = []

@hookimpl
def rlzoo_after_rollout(batch, ctx):
    CALLS.append(("after_rollout", ctx.step, len(batch)))

@hookimpl
def rlzoo_shape_rewards(batch, ctx):
    CALLS.append(("shape_rewards", ctx.step, len(batch)))
    batch.rewards = batch.rewards * 0 + 1.0

@hookimpl
def rlzoo_before_update(batch, ctx):
    assert batch.advantages is not None
    CALLS.append(("before_update", ctx.step, float(batch.token_rewards.sum())))

@hookimpl
def rlzoo_step_end(step, metrics, ctx):
    metrics["recorder/step"] = float(step)
    CALLS.append(("step_end", step, "reward/mean" in metrics))

@hookimpl
def rlzoo_run_end(ctx, status):
    CALLS.append(("run_end", ctx.step, status))
"""


def test_lifecycle_hooks_are_called_in_order_each_step(capsys, tmp_path: Path, plugin_module) -> None:
    import importlib

    from rlzoo.cli import main
    from rlzoo.events import read_scalars

    name = plugin_module(RECORDER)
    code = main(["train", f"plugins=[{name}]", f"run_dir={tmp_path / 'r'}", "trainer.total_steps=2",
                 "model.hidden_size=32", "model.num_layers=1", "rollout.prompts_per_step=2",
                 "rollout.n=2", "logging.progress=false"])
    assert code == 0, capsys.readouterr().err
    calls = importlib.import_module(name).CALLS
    kinds = [c[0] for c in calls]
    assert kinds == ["after_rollout", "shape_rewards", "before_update", "step_end"] * 2 + ["run_end"]
    # shaped rewards (all 1.0) reached the token rewards: one per sequence
    assert [c[2] for c in calls if c[0] == "before_update"] == [4.0, 4.0]
    assert calls[-1] == ("run_end", 2, "completed")
    assert [v for _, v in read_scalars(tmp_path / "r")["recorder/step"]] == [1.0, 2.0]
