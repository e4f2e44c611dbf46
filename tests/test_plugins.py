"""The plugin contract: hookspecs, plugin manager, registry."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from rlzoo.contract import hookspecs
from rlzoo.plan.run_input import engine_input
from rlzoo.core.errors import DuplicateComponentError, PluginError, UnknownComponentError
from rlzoo.contract.loading import build_registry, make_plugin_manager, module_plugin
from rlzoo.contract.registry import Registry

ALL_HOOKS = [name for name, _ in inspect.getmembers(hookspecs, inspect.isfunction)
             if name.startswith("rlzoo_")]


def test_every_hookspec_is_documented_with_its_parameters() -> None:
    assert sorted(ALL_HOOKS) == sorted([*hookspecs.REGISTRATION_HOOKS.values(), *hookspecs.LIFECYCLE_HOOKS])
    for name in ALL_HOOKS:
        spec = getattr(hookspecs, name)
        doc = inspect.getdoc(spec) or ""
        assert len(doc) > 80, name
        for param in inspect.signature(spec).parameters:
            assert f":param {param}:" in doc, (name, param)


DOCS = Path(__file__).parents[1] / "docs" / "plugins.md"


def _backticked(line: str) -> list[str]:
    import re

    return re.findall(r"`([^`]+)`", line)


def test_plugins_md_signatures_match_hookspecs() -> None:
    """As datasette does for its hooks: the documented signature of every hook is the
    hookspec's, and every hook is documented (so the docs cannot drift)."""
    import re

    documented = dict(re.findall(r"^### (rlzoo_\w+)\(([^)]*)\)$", DOCS.read_text(), flags=re.M))
    assert sorted(documented) == sorted(ALL_HOOKS)
    for name, params in documented.items():
        expected = list(inspect.signature(getattr(hookspecs, name)).parameters)
        assert [p.strip() for p in params.split(",") if p.strip()] == expected, name


def test_plugins_md_lists_every_kinds_inputs_as_hookspecs_does() -> None:
    import re

    lines = re.findall(r"^Inputs \(kind `(\w+)`\): (.*)$", DOCS.read_text(), flags=re.M)
    assert sorted(kind for kind, _ in lines) == sorted(hookspecs.INPUTS)
    for kind, text in lines:
        assert _backticked(text) == list(hookspecs.INPUTS[kind]), kind


def test_plugins_md_lists_the_required_metrics_of_every_kind_that_returns_metrics() -> None:
    import re

    from rlzoo.contract.kinds import KINDS

    lines = dict(re.findall(r"^Required metrics \(kind `(\w+)`\): (none|[^(]*?) \(", DOCS.read_text(), flags=re.M))
    with_metrics = {k.name for k in KINDS.values() if k.output in ("loss_metrics", "weights_metrics")}
    assert set(lines) == with_metrics
    for kind, text in lines.items():
        assert (_backticked(text) if text != "none" else []) == list(KINDS[kind].required_metrics), kind


def test_plugins_md_lists_the_batch_and_context_fields() -> None:
    import dataclasses
    import re

    from rlzoo.core.batch import RolloutBatch
    from rlzoo.run.context import RunContext

    fields = re.findall(r"^Fields: (.*)$", DOCS.read_text(), flags=re.M)
    assert [_backticked(line) for line in fields] == [[f.name for f in dataclasses.fields(RolloutBatch)],
                                                       [f.name for f in dataclasses.fields(RunContext)]]


@pytest.mark.slow
def test_the_one_file_plugin_at_the_top_of_plugins_md_lists_and_trains(tmp_path: Path, monkeypatch, capsys) -> None:
    """The page's headline example, saved as the file its first line names, used as the
    page says: ``plugins=[my_rlzoo_plugin] advantage=mean_baseline``."""
    import re

    from rlzoo.commands.cli import main
    from zoo import TINY

    block = next(b for b in re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)
                 if b.startswith("# my_rlzoo_plugin.py"))
    (tmp_path / "my_rlzoo_plugin.py").write_text(block)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = build_registry(make_plugin_manager(modules=["my_rlzoo_plugin"]))
    assert registry.get("advantage", "mean_baseline").description == "score minus the batch mean"
    code = main(["train", *TINY, "plugins=[my_rlzoo_plugin]", "advantage=mean_baseline", "trainer.total_steps=2",
                 "eval.size=0", f"run_dir={tmp_path / 'r'}"])
    assert code == 0, capsys.readouterr().err
    assert "advantage:\n  name: mean_baseline" in (tmp_path / "r" / "config.yaml").read_text()


def test_plugins_md_snippets_run_and_its_extension_example_trains(tmp_path: Path, monkeypatch) -> None:
    import re

    from rlzoo.plan.planner import load_config
    from rlzoo.run.trainer import Trainer

    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)
    assert len(blocks) >= 3
    namespace: dict = {}
    for block in blocks:
        if "def rlzoo_register_extensions" in block:
            exec(compile(block, str(DOCS), "exec"), namespace)
        elif "file=" not in block and "# my_rlzoo_plugin.py" not in block:
            exec(compile(block, str(DOCS), "exec"), {})
    plugin = module_plugin(rlzoo_register_extensions=namespace["rlzoo_register_extensions"])
    pm = make_plugin_manager()
    pm.register(plugin, name="docs-example")
    try:
        registry = build_registry(pm)
        resolved = load_config(registry, ["extensions=[{name: length_bonus, per_token: 0.5}]",
                                          f"run_dir={tmp_path / 'r'}", "model.hidden_size=32", "model.num_layers=1",
                                          "rollout.prompts_per_step=2", "rollout.n=2"])
        trainer = Trainer(engine_input(resolved), pm)
        metrics = trainer.train_step()
        trainer.close()
        assert metrics["length_bonus/mean"] > 0 and metrics["reward/shaped_mean"] > metrics["reward/mean"]
    finally:
        pm.unregister(plugin)


def test_registration_hooks_cover_every_kind() -> None:
    pm = make_plugin_manager(load_entry_points=False)
    for kind, hook in hookspecs.REGISTRATION_HOOKS.items():
        assert hasattr(pm.hook, hook), kind
        assert kind in hookspecs.KIND_TITLES


def test_injected_plugin_registers_every_kind_and_is_removable() -> None:
    calls: list[str] = []

    def nothing() -> None:
        """A component that takes none of its kind's inputs (valid for every kind)."""

    def make(kind: str):
        def hook(register):
            calls.append(kind)
            register(f"test-{kind}", nothing if kind != "algorithm" else {}, description=f"a {kind}")
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

    def k3(logp, ref_logp):
        return logp - ref_logp

    registry.add("kl_estimator", "k3", k3, aliases=("low_var_kl",), plugin="a", package="pa")
    assert registry.get("kl_estimator", "low_var_kl").name == "k3"
    assert registry.names("kl_estimator") == ["k3"]
    assert ("kl_estimator", "low_var_kl") in registry
    with pytest.raises(UnknownComponentError, match=r"unknown kl_estimator 'k33'.*Did you mean 'k3'"):
        registry.get("kl_estimator", "k33")
    with pytest.raises(DuplicateComponentError, match=r"'low_var_kl' is registered twice: by plugin 'a'"
                                                       r" \(pa\) and by plugin 'b'"):
        registry.add("kl_estimator", "low_var_kl", k3, plugin="b", package="pb")
    with pytest.raises(PluginError, match="unknown needs"):
        registry.add("advantage", "x", k3, needs=("gpu",), plugin="c")
    with pytest.raises(PluginError, match="unknown kind"):
        registry.add("optimizer", "x", k3, plugin="c")


def test_a_plugin_failing_during_registration_is_named_and_the_rest_kept() -> None:
    def broken(register):
        raise RuntimeError("kaput")

    pm = make_plugin_manager()
    pm.register(module_plugin(rlzoo_register_tasks=broken), name="faulty")
    registry = build_registry(pm)
    assert any("faulty" in str(e) and "kaput" in str(e) for e in registry.load_errors)
    assert "sort_digits" in registry.names("task")


@pytest.mark.parametrize("hook, fn, bad, valid", [
    ("rlzoo_register_tasks", lambda regster: None, "'regster'", "its arguments are register"),
    ("rlzoo_step_end", lambda step, metric, ctx: None, "'metric'", "its arguments are step, metrics, ctx"),
])
def test_a_wrong_hook_argument_name_names_the_plugin_and_the_valid_names(hook, fn, bad, valid) -> None:
    pm = make_plugin_manager(load_entry_points=False)
    with pytest.raises(PluginError) as info:
        pm.register_plugin(module_plugin(**{hook: fn}), name="typo", package="typo-pkg")
    message = str(info.value)
    assert "\n" not in message and "plugin 'typo' (typo-pkg)" in message and f"{hook}() takes {bad}" in message
    assert valid in message


def test_rlzoo_plugins_env_var_restricts_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLZOO_PLUGINS", "aggregation")
    registry = build_registry(make_plugin_manager())
    assert registry.names("loss_agg") and registry.names("task") == []
    monkeypatch.delenv("RLZOO_PLUGINS")
    monkeypatch.setenv("RLZOO_DISABLE_PLUGINS", "rlzoo:tasks,rlzoo:reasoning_gym")
    registry = build_registry(make_plugin_manager())
    # rlzoo's own tasks are gone; an installed third-party package may still register one
    assert [n for n in registry.names("task") if registry.get("task", n).plugin.startswith("rlzoo:")] == []
    assert registry.names("loss_agg")


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
from rlzoo.api import hookimpl
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

    from rlzoo.commands.cli import main
    from rlzoo.core.events import read_scalars

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


# ------------------------------------------------------------------ the contract checks itself


@pytest.mark.parametrize("fn_source, fragments", [
    ("def adv(token_rewards, response_mask, rewards_so_far):\n    pass",
     ["advantage 'x'", "takes 'rewards_so_far'", "not an input of its kind", "token_rewards"]),
    ("def adv(*tensors):\n    pass", ["takes *tensors", "inputs are passed by name"]),
    ("def adv(token_rewards, **extra):\n    pass", ["takes **extra"]),
    ("adv = 3", ["is a int, not a function"]),
])
def test_a_signature_that_does_not_fit_the_kind_is_refused_at_registration(fn_source: str,
                                                                           fragments: list[str]) -> None:
    namespace: dict = {}
    exec(fn_source, namespace)
    with pytest.raises(PluginError) as info:
        Registry().add("advantage", "x", namespace["adv"], plugin="mine", package="my-pkg")
    for fragment in ["plugin 'mine'", *fragments]:
        assert fragment in str(info.value)


def test_needs_follow_from_the_inputs_a_function_names() -> None:
    registry = Registry()

    def uses_values(token_rewards, response_mask, values):
        return token_rewards, token_rewards

    def uses_ref(logp, advantages, response_mask, ref_logp):
        return logp, {}

    assert registry.add("advantage", "v", uses_values, plugin="p").needs == frozenset({"critic"})
    assert registry.add("policy_loss", "r", uses_ref, plugin="p").needs == frozenset({"reference"})
    assert registry.add("policy_loss", "g", uses_ref, needs=("groups",), plugin="p").needs == \
        frozenset({"reference", "groups"})


def test_a_declared_need_whose_inputs_the_function_never_takes_is_refused() -> None:
    def loss(logp, advantages, response_mask):
        return logp, {}

    with pytest.raises(PluginError, match=r"declares needs 'reference' but its function takes none of ref_logp"):
        Registry().add("policy_loss", "x", loss, needs=("reference",), plugin="mine")


def test_params_dataclass_requires_a_params_argument() -> None:
    from dataclasses import dataclass

    @dataclass
    class P:
        c: float = 1.0

    def loss(logp, advantages, response_mask):
        return logp, {}

    with pytest.raises(PluginError, match="takes no 'params'"):
        Registry().add("policy_loss", "x", loss, params=P, plugin="mine")


@pytest.mark.parametrize("source, fragments", [
    ("@hookimpl\ndef rlzoo_register_advantage_estimator(register):\n    pass\n",
     ["defines 'rlzoo_register_advantage_estimator', which is no rlzoo hook",
      "Did you mean 'rlzoo_register_advantage_estimators'?"]),
    ("def rlzoo_register_tasks(register):\n    pass\n", ["rlzoo_register_tasks", "without @hookimpl"]),
    ("@hookimpl\ndef rlzoo_register_kl_penalties(register):\n    pass\n",
     ["rlzoo_register_kl_penalties", "renamed to 'rlzoo_register_kl_estimators'"]),
])
def test_a_misspelt_or_undecorated_hook_is_an_error_naming_the_plugin(capsys, plugin_module, source: str,
                                                                      fragments: list[str]) -> None:
    from rlzoo.commands.cli import main

    name = plugin_module("from rlzoo.api import hookimpl\n" + source)
    code = main(["config", f"plugins=[{name}]"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"plugin 'module:{name}'" in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


SHAPES = """
import torch
from rlzoo.api import hookimpl
def column(logp, advantages, response_mask):
    return (-advantages * logp).sum(-1, keepdim=True), {"clipfrac": torch.tensor(0.), "approx_kl": torch.tensor(0.)}

def per_sequence(logp, advantages, response_mask):
    return (-advantages * logp).sum(-1), {"clipfrac": torch.tensor(0.), "approx_kl": torch.tensor(0.)}

def no_metrics(logp, advantages, response_mask):
    return -advantages * logp, {"clipfrac": torch.tensor(0.)}

def short_advantages(token_rewards, response_mask):
    return token_rewards[:, :1], token_rewards

@hookimpl
def rlzoo_register_policy_losses(register):
    register("column", column)
    register("per_sequence", per_sequence)
    register("no_metrics", no_metrics)

@hookimpl
def rlzoo_register_advantage_estimators(register):
    register("short_advantages", short_advantages)
"""


@pytest.mark.parametrize("override, fragments", [
    ("policy_loss=column", ["policy_loss 'column'", "a per-token loss of shape (16, 1)", "(16, 4)"]),
    ("policy_loss=per_sequence", ["policy_loss 'per_sequence'", "shape (16,)", "(16, 4)"]),
    ("policy_loss=no_metrics", ["policy_loss 'no_metrics'", "no 'approx_kl' metric"]),
    ("advantage=short_advantages", ["advantage 'short_advantages'", "advantages of shape (16, 1)"]),
])
def test_a_plugin_output_of_the_wrong_shape_is_refused_with_its_name_and_package(
        capsys, tmp_path: Path, plugin_module, override: str, fragments: list[str]) -> None:
    from rlzoo.commands.cli import main

    name = plugin_module(SHAPES)
    code = main(["train", f"plugins=[{name}]", override, f"run_dir={tmp_path / 'r'}", "trainer.total_steps=1",
                 "trainer.num_mini_batches=1",
                 "model.hidden_size=32", "model.num_layers=1", "rollout.prompts_per_step=4", "rollout.n=4",
                 "rollout.max_new_tokens=4", "logging.progress=false", "task.num_digits=3"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    for fragment in [*fragments, f"package {name}"]:
        assert fragment in err, (fragment, err)


@pytest.mark.slow
def test_lifecycle_hooks_are_called_through_pluggy_so_tracing_shows_them(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "RLZOO_TRACE_HOOKS": "1"}
    result = subprocess.run([sys.executable, "-m", "rlzoo", "train", f"run_dir={tmp_path / 'r'}",
                             "trainer.total_steps=1", "model.hidden_size=32", "model.num_layers=1",
                             "rollout.prompts_per_step=2", "rollout.n=2", "logging.progress=false",
                             "extensions=[dynamic_sampling]"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for hook in [*hookspecs.LIFECYCLE_HOOKS, "rlzoo_register_tasks"]:
        assert hook in result.stderr, hook


ORDER = """
from rlzoo.api import hookimpl
class Mark:
    def __init__(self, label):
        self.label = label

    @hookimpl
    def rlzoo_after_rollout(self, batch, ctx):
        ctx.state.setdefault("order", []).append(self.label)
        batch.keep(list(range(len(batch) - 1)))          # in place: the next one sees it
        ctx.state.setdefault("sizes", []).append(len(batch))

class MarkParams:
    pass

def first(params=None):
    return Mark("first")

def second(params=None):
    return Mark("second")

@hookimpl
def rlzoo_after_rollout(batch, ctx):
    ctx.state.setdefault("order", []).append("module")

@hookimpl
def rlzoo_register_extensions(register):
    register("first", first)
    register("second", second)
"""


def test_extensions_run_in_list_order_then_modules_and_see_each_others_changes(tmp_path: Path,
                                                                              plugin_module) -> None:
    from rlzoo.plan.planner import load_config
    from rlzoo.run.trainer import Trainer

    name = plugin_module(ORDER)
    pm = make_plugin_manager(modules=[name])
    registry = build_registry(pm)
    for order in (["first", "second"], ["second", "first"]):
        resolved = load_config(registry, [f"plugins=[{name}]", f"extensions=[{', '.join(order)}]",
                                          f"run_dir={tmp_path / '-'.join(order)}", "model.hidden_size=32",
                                          "model.num_layers=1", "rollout.prompts_per_step=2", "rollout.n=2"])
        trainer = Trainer(engine_input(resolved), pm)
        try:
            trainer.train_step()
            assert trainer.ctx.state["order"] == [*order, "module"]
            assert trainer.ctx.state["sizes"] == [3, 2]
        finally:
            trainer.close()


def test_a_component_that_needs_the_reference_gets_its_log_probs(tmp_path: Path, plugin_module) -> None:
    source = """
import torch
from rlzoo.api import hookimpl
SEEN = []

def anchored(logp, advantages, response_mask, ref_logp):
    SEEN.append(ref_logp is not None and bool((ref_logp != 0).any()))
    return -advantages * logp + 0.0 * ref_logp, {"clipfrac": torch.tensor(0.), "approx_kl": torch.tensor(0.)}

@hookimpl
def rlzoo_register_policy_losses(register):
    register("anchored", anchored)
"""
    import importlib

    from rlzoo.plan.planner import load_config
    from rlzoo.run.trainer import Trainer

    name = plugin_module(source)
    pm = make_plugin_manager(modules=[name])
    registry = build_registry(pm)
    resolved = load_config(registry, [f"plugins=[{name}]", "policy_loss=anchored", f"run_dir={tmp_path / 'r'}",
                                      "kl.coef=0", "trainer.num_mini_batches=1",
                                      "model.hidden_size=32", "model.num_layers=1", "rollout.prompts_per_step=2",
                                      "rollout.n=2"])
    assert "reference" in resolved.plan.models and resolved.plan.runs("ref_logp")
    trainer = Trainer(engine_input(resolved), pm)
    trainer.train_step()
    assert importlib.import_module(name).SEEN == [True]
