"""What a plugin author reads when something is wrong (issue 47 items 15, 16): a component refused
at registration (a misspelt input name) stops every run with one message that says so, with a
did-you-mean, while the plugin's other components stay registered; a plugin that fails to
import names its fix; a non-finite advantage names its package and the check that tests it;
and the contract facts docs/plugins.md states: what ``counts`` carries, which metrics a
correction gets, the masked reductions' signatures, a hand-built ``RolloutBatch``."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import torch

import rlzoo.api
from rlzoo.api import (KINDS, RefusedComponentError, RolloutBatch, UnknownComponentError, build_registry,
                       make_plugin_manager, module_plugin)
from rlzoo.commands.cli import main
from rlzoo.plan.planner import load_config
from rlzoo.plan.run_input import engine_input
from rlzoo.run.trainer import Trainer
from zoo import TINY, fake_distribution

DOCS = Path(__file__).parents[1] / "docs" / "plugins.md"
ADVANTAGE_INPUTS = ", ".join(KINDS["advantage"].inputs)

TYPO = """
from rlzoo.api import hookimpl


def misspelt(token_reward, response_mask):
    return token_reward * response_mask, token_reward * response_mask


def fine(token_rewards, response_mask):
    return token_rewards * response_mask, token_rewards * response_mask


@hookimpl
def rlzoo_register_advantage_estimators(register):
    register("misspelt", misspelt)  # refused: the engine passes token_rewards
    register("fine", fine)          # registered after it, and kept
"""


def test_a_misspelt_input_stops_every_run_with_one_message_saying_the_component_was_refused(plugin_module,
                                                                                           capsys) -> None:
    name = plugin_module(TYPO)
    for chosen in ("misspelt", "fine", "grpo"):  # was: exit 0 for fine and grpo, 'unknown advantage' for misspelt
        assert main(["config", f"plugins=[{name}]", f"advantage={chosen}"]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"rlzoo: error: plugin 'module:{name}': advantage 'misspelt' takes 'token_reward', which is not an input "
            f"of its kind. Did you mean 'token_rewards'? The engine passes {ADVANTAGE_INPUTS} "
            "(rlzoo_register_advantage_estimators). The plugin loaded, but its advantage 'misspelt' is refused at "
            "registration, and no run starts until it is fixed or the plugin leaves plugins=[...]\n"), err


def test_a_refused_component_leaves_the_plugins_other_components_registered(plugin_module) -> None:
    name = plugin_module(TYPO)
    with pytest.raises(RefusedComponentError) as refused:
        build_registry(make_plugin_manager(modules=[name]))
    assert (refused.value.kind, refused.value.name, refused.value.plugin) == ("advantage", "misspelt", f"module:{name}")
    registry = build_registry(make_plugin_manager(modules=[name]), strict=False)
    assert registry.get("advantage", "fine").plugin == f"module:{name}"  # registered after the refused one
    assert [type(error) for error in registry.load_errors] == [RefusedComponentError]
    with pytest.raises(UnknownComponentError) as info:
        registry.get("advantage", "misspelt")
    assert str(info.value).startswith(f"advantage 'misspelt' is not registered: plugin 'module:{name}': advantage "
                                      "'misspelt' takes 'token_reward', which is not an input of its kind. Did you "
                                      "mean 'token_rewards'?"), info.value
    assert "failed to load" not in str(info.value)  # the plugin loaded (it said '1 plugin(s) failed to load')
    with pytest.raises(UnknownComponentError, match=r"unknown advantage 'misspelled'.*Refused at registration: "
                                                    rf"advantage 'misspelt' \(plugin 'module:{name}'\)\.$"):
        registry.get("advantage", "misspelled")


def test_an_input_misspelt_with_a_default_is_refused_too() -> None:
    """``group_id=None`` would never be passed: the estimator silently sees no groups."""
    def estimator(token_rewards, response_mask, group_id=None, scale=2.0):
        return token_rewards, token_rewards

    plugin = module_plugin(rlzoo_register_advantage_estimators=lambda register: register("grouped", estimator))
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(plugin, name="mine")
    with pytest.raises(RefusedComponentError) as refused:
        build_registry(pm)
    assert str(refused.value) == (
        "plugin 'mine': advantage 'grouped' takes 'group_id' (with a default), which is not an input of its kind, so "
        f"the engine never passes it. Did you mean 'group_ids'? The engine passes {ADVANTAGE_INPUTS} "
        "(rlzoo_register_advantage_estimators). The plugin loaded, but its advantage 'grouped' is refused at "
        "registration, and no run starts until it is fixed")
    # a parameter of its own (scale) is no misspelling: without group_id the estimator registers
    def own_parameter(token_rewards, response_mask, scale=2.0):
        return token_rewards, token_rewards

    pm.unregister(plugin)
    pm.register(module_plugin(rlzoo_register_advantage_estimators=lambda register: register("scaled", own_parameter)),
                name="mine2")
    assert build_registry(pm).get("advantage", "scaled").inputs == ("token_rewards", "response_mask")


def test_an_installed_package_with_a_refused_component_lists_with_exit_2_and_is_skipped_by_the_switch(
        capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = fake_distribution(tmp_path, "typo-rlzoo-pkg", "typo_rlzoo_mod", TYPO)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["list", "--kind", "advantage"]) == 2
    out, err = capsys.readouterr()
    assert re.search(r"^  fine +typo-rlzoo-pkg", out, re.M) and "misspelt" not in out  # the rest is listed
    assert err.startswith(f"rlzoo: error: plugin '{plugin}': advantage 'misspelt' takes 'token_reward'") and \
        err.endswith(f"no run starts until it is fixed or the plugin is skipped: RLZOO_DISABLE_PLUGINS={plugin}\n")
    assert main(["list", "--kind", "loss_agg"]) == 0  # another kind: a warning
    assert "rlzoo: warning: " in capsys.readouterr().err
    assert main(["config"]) == 2
    capsys.readouterr()
    monkeypatch.setenv("RLZOO_DISABLE_PLUGINS", plugin)
    assert main(["config"]) == 0
    capsys.readouterr()


# ---------------------------------------------------------------------------- plugins that do not import


@pytest.mark.parametrize("source, requires, fix", [
    ("import rlzoo_no_such_dep_pkg\n", ("rlzoo-no-such-dep-pkg>=1", "rlzoo-other-missing; extra == 'x'"),
     "It needs rlzoo-no-such-dep-pkg, a dependency of broken-rlzoo-pkg that is not installed: pip install "
     "rlzoo-no-such-dep-pkg; or skip the plugin: RLZOO_DISABLE_PLUGINS=broken-rlzoo-pkg:main"),
    ("import yaml_but_misnamed_xyz\n", ("pyyaml-like-xyz",),  # one declared and absent: the module's provider
     "It needs pyyaml-like-xyz, a dependency of broken-rlzoo-pkg that is not installed: pip install pyyaml-like-xyz; "
     "or skip the plugin: RLZOO_DISABLE_PLUGINS=broken-rlzoo-pkg:main"),
    ("import rlzoo_undeclared_dep\n", ("pyyaml",),  # installed requirement; the missing module is not declared
     "Install the package that provides the module 'rlzoo_undeclared_dep' (broken-rlzoo-pkg does not declare it; "
     "its pip name may differ from the module's), or skip the plugin: RLZOO_DISABLE_PLUGINS=broken-rlzoo-pkg:main"),
    ("raise ValueError('bad constant')\n", (),
     "Its traceback: python -c 'import broken_rlzoo_mod'; fix broken-rlzoo-pkg, or skip the plugin: "
     "RLZOO_DISABLE_PLUGINS=broken-rlzoo-pkg:main"),
])
def test_a_plugin_that_fails_to_import_names_its_fix(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    source: str, requires: tuple[str, ...], fix: str) -> None:
    fake_distribution(tmp_path, "broken-rlzoo-pkg", "broken_rlzoo_mod", source, requires=requires)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["config", "algo=grpo"]) == 0  # the rest of rlzoo works: a warning
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if "broken-rlzoo-pkg" in line]
    assert line.startswith("rlzoo: warning: plugin 'broken-rlzoo-pkg:main' (entry point 'broken_rlzoo_mod') failed to "
                           "import: ") and line.endswith(f". {fix}"), line
    (error,) = build_registry(make_plugin_manager()).load_errors
    assert (error.plugin, error.package) == ("broken-rlzoo-pkg:main", "broken-rlzoo-pkg")  # what a fixture filters by


# ---------------------------------------------------------------------------- a non-finite advantage


def test_a_non_finite_advantage_names_its_package_and_the_check_that_tests_it(plugin_module, capsys,
                                                                            tmp_path: Path) -> None:
    name = plugin_module("""
from rlzoo.api import hookimpl

def nan_adv(token_rewards, response_mask):
    advantages = token_rewards * float("nan") * response_mask
    return advantages, advantages

@hookimpl
def rlzoo_register_advantage_estimators(register):
    register("nan_adv", nan_adv)
""")
    code = main(["train", *TINY, f"plugins=[{name}]", "advantage=nan_adv", "trainer.total_steps=1", "eval.size=0",
                 f"run_dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.endswith(
        f"rlzoo: error: non-finite value in advantage estimation (component 'nan_adv' of package {name}; "
        "rlzoo.api.check_component(registry.get('advantage', 'nan_adv')) tests it on its kind's edge cases); the "
        "step was stopped and no checkpoint was written for it\n"), err
    registry = build_registry(make_plugin_manager(modules=[name]))
    with pytest.raises(AssertionError, match="nan_adv"):  # and it does find it
        rlzoo.api.check_component(registry.get("advantage", "nan_adv"))


# ---------------------------------------------------------------------------- what docs/plugins.md states


def _one_step(tmp_path: Path, plugin, overrides: list[str]) -> dict[str, float]:
    pm = make_plugin_manager()
    pm.register(plugin, name="spy")
    try:
        resolved = load_config(build_registry(pm), [*TINY, f"run_dir={tmp_path / 'r'}", *overrides])
        trainer = Trainer(engine_input(resolved), pm)
        try:
            return trainer.train_step()
        finally:
            trainer.close()
    finally:
        pm.unregister(plugin)


def test_counts_carry_the_configured_max_length_and_the_mini_batchs_tokens_and_sequences(tmp_path: Path) -> None:
    seen: list[tuple[float, float, int, float, float, float]] = []

    def spy(loss, mask, counts=None):
        seen.append((counts.tokens, counts.sequences, counts.max_response_length, float(mask.sum()),
                     float((mask.sum(-1) > 0).sum()), float(mask.sum(-1).max())))
        return (loss * mask).sum() / max(counts.tokens, 1.0)

    def first_three_tokens(batch, ctx):  # the loss sees at most 3 tokens of each response
        batch.loss_mask = batch.loss_mask * (torch.arange(batch.loss_mask.shape[1]) < 3)

    plugin = module_plugin(rlzoo_register_loss_aggregations=lambda register: register("spy-mean", spy),
                           rlzoo_before_update=first_three_tokens)
    _one_step(tmp_path, plugin, ["loss_agg=spy-mean", "rollout.max_new_tokens=9", "trainer.micro_batch_size=4",
                                 "trainer.num_mini_batches=2", "kl.coef=0"])
    assert len(seen) == 4  # 16 sequences: 2 mini-batches of 8, each 2 micro-batches of 4; one loss term
    for first, second in (seen[:2], seen[2:]):  # one mini-batch's micro-batches share its counts:
        assert first[:3] == second[:3]
        assert first[0] == first[3] + second[3] and first[1] == first[4] + second[4]  # its loss_mask's 1s and rows
    assert {entry[2] for entry in seen} == {9}  # the configured rollout.max_new_tokens ...
    assert max(entry[5] for entry in seen) == 3  # ... not the longest row of the mask the loss sees


def test_a_third_party_correction_gets_exactly_its_own_metrics(tmp_path: Path) -> None:
    def ones(rollout_logp, response_mask):
        return response_mask.float(), {"mine": torch.tensor(0.25)}

    plugin = module_plugin(rlzoo_register_rollout_corrections=lambda register: register("spy_ones", ones))
    metrics = _one_step(tmp_path, plugin, ["rollout_correction=spy_ones"])
    assert [key for key in metrics if key.startswith("rollout_correction/")] == ["rollout_correction/spy_ones/mine"]
    assert metrics["rollout_correction/spy_ones/mine"] == 0.25


def test_the_documented_required_fields_of_a_batch_are_the_dataclass_s() -> None:
    text = DOCS.read_text()
    line = re.search(r"A batch built by hand \(to test a hook\) needs its required fields: (.*?)\.\n", text).group(1)
    required = [f.name for f in dataclasses.fields(RolloutBatch)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    assert re.findall(r"`(\w+)`", line) == required


@pytest.mark.parametrize("name", ["masked_sum", "masked_mean", "masked_var", "masked_whiten", "clamped_exp"])
def test_the_documented_signature_of_each_reduction_is_its_own(name: str) -> None:
    documented = re.search(rf"^\| `{name}\((.*?)\)` \|", DOCS.read_text(), re.M).group(1)
    parameters = [part.partition("=") for part in documented.split(", ")]
    actual = inspect.signature(getattr(rlzoo.api, name)).parameters.values()
    assert [(p, ast.literal_eval(d) if d else None) for p, _, d in parameters] == \
        [(p.name, None if p.default is p.empty else p.default) for p in actual]


def test_the_reductions_give_what_the_table_says_where_the_mask_is_empty() -> None:
    values = torch.tensor([[3.0, float("nan")], [5.0, 7.0]])
    empty = torch.zeros(2, 2)
    one = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    assert float(rlzoo.api.masked_sum(values, empty)) == 0.0
    assert float(rlzoo.api.masked_mean(values, empty)) == 0.0
    assert rlzoo.api.masked_mean(values, torch.tensor([[1.0, 0.0], [0.0, 0.0]]), dim=-1).tolist() == [3.0, 0.0]
    assert float(rlzoo.api.masked_var(values, empty)) == 0.0 and float(rlzoo.api.masked_var(values, one)) == 0.0
    assert rlzoo.api.masked_whiten(values, empty).tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert rlzoo.api.masked_whiten(values, one).tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert rlzoo.api.clamped_exp(torch.tensor([-50.0, 0.0, 50.0])).tolist() == pytest.approx(
        [2.061153622438558e-09, 1.0, 485165195.4097903])  # e^-20, 1, e^20
