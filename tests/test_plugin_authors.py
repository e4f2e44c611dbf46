"""What a plugin author stumbled on (issue 37 item 24): building an environment from the
registry, running a tool from an environment's own call format, every problem of a preset
in one error, name clashes, a too-long SFT demonstration, and ``rlzoo explain`` / ``diff``
output a reader can follow."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlzoo.api import (build_registry, check_component, ConfigError, DuplicateComponentError, Environment, Example,
                       make_plugin_manager, module_plugin, Tool)
from rlzoo.commands.cli import main
from rlzoo.run.sft_trainer import _unfit
from rlzoo.agents.episodes import EpisodeLimits
from rlzoo.contract.registry import Registry
from rlzoo.plan.planner import load_config

ROOT = Path(__file__).parents[1]
TINY = ["model.hidden_size=32", "model.num_layers=1", "trainer.threads=1"]


def _doc_block(page: str, name: str) -> str:
    return re.search(rf"```python file={re.escape(name)}\n(.*?)```", (ROOT / page).read_text(), re.S).group(1)


@pytest.fixture(scope="module")
def hilo_registry():
    """A registry with agents.md's `convert_length` tool and `convert` environment, as their
    blocks are printed (the installed package is tests/test_agents_tutorial.py's)."""
    namespace: dict = {}
    for name in ("rlzoo_hilo/tools.py", "rlzoo_hilo/convert.py"):
        exec(compile(_doc_block("docs/agents.md", name), name, "exec"), namespace)
    pm = make_plugin_manager()
    plugin = module_plugin(rlzoo_register_tools=namespace["rlzoo_register_tools"],
                           rlzoo_register_environments=namespace["rlzoo_register_environments"])
    pm.register(plugin, name="docs-hilo")
    try:
        registry = build_registry(pm)
    finally:
        pm.unregister(plugin)
    assert not registry.load_errors, registry.load_errors
    return registry


def test_an_environment_is_built_from_the_registry_with_every_registered_tool(hilo_registry) -> None:
    env = hilo_registry.get("environment", "convert")()  # was: TypeError, missing 'tools'
    assert [tool.name for tool in env.tools] == ["convert_length"] and isinstance(env.tools[0], Tool)
    env.reset(Example("10 km in miles?", "6.21 mi"))
    assert env.step("10 km?").observations == [{"role": "tool", "content": "6.21 mi"}]  # 10 · 0.621371
    assert env.step("6.21 mi").done
    check_component(hilo_registry.get("environment", "convert"), registry=hilo_registry)
    # the built-ins that take tools and tool_style: the defaults are a run's without a chat template
    tools_env = hilo_registry.get("environment", "tools")(tools=["calculator", "convert_length"])
    assert [t.name for t in tools_env.tools] == ["calculator", "convert_length"] and tools_env.style == "plain"
    assert hilo_registry.get("environment", "tools")(tools=["calculator"], tool_style="hermes").style == "hermes"
    calculator = hilo_registry.get("environment", "calculator")()
    calculator.reset(Example("37*48=", "1776"))
    assert calculator.step("37*48").observations == [{"role": "tool", "content": "=1776;"}]


def test_a_registered_tools_tool_is_its_meta_and_runs_in_an_environment_built_by_hand(hilo_registry) -> None:
    tool = hilo_registry.get("tool", "convert_length").meta["tool"]
    assert isinstance(tool, Tool) and tool.name == "convert_length"
    env = hilo_registry.get("environment", "convert")(tools={"convert_length": tool})
    env.reset(Example("3 mi?", "4.83 km"))
    result = env.step("3 mi?")
    assert result.observations == [{"role": "tool", "content": "4.83 km"}]  # 3 / 0.621371 = 4.828
    assert (result.tool_calls, result.tool_errors) == (1, 0)


def test_an_environment_asking_for_a_tool_nobody_registered_is_one_config_error(plugin_module, capsys) -> None:
    name = plugin_module("""
from rlzoo.api import Environment, hookimpl, StepResult

class NeedsTool(Environment):
    def __init__(self, tools):
        self.tools = [tools["convert_lenght"]]

    def step(self, completion):
        return StepResult(done=True)

@hookimpl
def rlzoo_register_environments(register):
    register("needs_tool", NeedsTool)
""")
    code = main(["config", f"plugins=[{name}]", "env=needs_tool", "rollout.max_new_tokens=32"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("rlzoo: error: env 'needs_tool': no tool 'convert_lenght' is registered; "
                                        "registered tools: calculator"), err
    assert err.endswith(" (rlzoo list --kind tool)\n") and err.count("\n") == 1, err  # one line, before any run
    registry = build_registry(make_plugin_manager(modules=[name]))
    with pytest.raises(KeyError, match="no tool 'convert_lenght' is registered"):
        registry.get("environment", "needs_tool")()


def test_naming_an_installed_plugins_module_in_plugins_loads_it_once(plugin_module) -> None:
    """A package author tries `plugins=[their_module]` with the package installed: pluggy
    refused the second registration with a message listing every plugin."""
    import importlib

    name = plugin_module("""
from rlzoo.api import hookimpl

@hookimpl
def rlzoo_register_advantage_estimators(register):
    def mine(token_rewards, response_mask):
        return token_rewards * response_mask, token_rewards * response_mask
    register("mine_once", mine)
""")
    pm = make_plugin_manager()
    pm.register_plugin(importlib.import_module(name), name="pkg-mine:main", package="pkg-mine")  # its entry point
    pm.load_modules([name])
    assert build_registry(pm).get("advantage", "mine_once").plugin == "pkg-mine:main"


def test_an_observation_the_embedded_tokenizer_cannot_read_is_warned_once(capsys) -> None:
    from rlzoo.agents.episodes import EpisodeFormat
    from rlzoo.models.build import build_char_tokenizer
    from rlzoo.tasks.prompts import PromptFormat

    fmt = EpisodeFormat(build_char_tokenizer("0123456789+-*="), PromptFormat())  # multiply's alphabet
    episode = fmt.start(Example("6*7=", "42"), Environment())
    assert len(fmt.observation_ids(episode, [{"role": "user", "content": "+"}])) == 1
    assert capsys.readouterr().err == ""
    ids = fmt.observation_ids(episode, [{"role": "user", "content": "higher"}])
    assert ids == [fmt.tokenizer.unk_token_id] * 6
    assert capsys.readouterr().err == (
        "rlzoo: warning: the environment's observation 'higher' holds characters the tokenizer encodes as <unk> "
        "('eghir'): the policy cannot read them. The embedded model's tokenizer knows only the task's alphabet: keep "
        "observations inside it (as the guess and calculator environments do) or train a pretrained model.path\n")
    fmt.observation_ids(episode, [{"role": "user", "content": "lower"}])
    assert capsys.readouterr().err == ""  # once a run


def test_the_task_of_the_registry_call_equals_the_bound_call() -> None:
    from rlzoo.api import build_params

    registry = build_registry(make_plugin_manager())
    component = registry.get("task", "sort_digits")
    direct, bound = component(num_digits=6), component.bind(build_params(component, {"num_digits": 6}))()
    import random
    assert direct.sample(4, random.Random(1)) == bound.sample(4, random.Random(1))
    assert len(direct.sample(1, random.Random(0))[0].prompt) == 7  # six digits and '='


# ------------------------------------------------------------- presets: every problem at once

BROKEN = """
from rlzoo.api import hookimpl

@hookimpl
def rlzoo_register_algorithms(register):
    register("broken", {"advantage": "grpoo", "policy_loss": {"name": "ppo_clip", "clip_hgh": 0.3},
                        "trainer": {"update_epoch": 2, "lr": "fast"}, "rollout": {"n": 0},
                        "loss_agg": "token-mean"},
             description="d", card={"advantage": "a paper", "loss_agg": 3, "kl.coef": "nowhere"})
"""
BROKEN_LINES = [
    "card entry 'loss_agg' must be a string or {source: ..., deviation: ...}",
    "card entry 'kl.coef' names no key the preset sets (it sets advantage, policy_loss, trainer.update_epoch, "
    "trainer.lr, rollout.n, loss_agg)",
    "advantage: unknown advantage 'grpoo'",
    "unknown parameter 'clip_hgh' for policy_loss 'ppo_clip'",
    "unknown config key 'trainer.update_epoch'. Did you mean 'trainer.update_epochs'?",
    "invalid value for trainer.lr: 'fast' is not a valid float",
    "invalid value for rollout.n: 0; must be > 0",
]


def test_every_problem_of_a_preset_is_reported_in_one_error(plugin_module, capsys) -> None:
    name = plugin_module(BROKEN)
    code = main(["config", f"plugins=[{name}]", "algo=broken"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"rlzoo: error: algorithm preset 'broken' (package {name}) has 7 "
                                        "problems:\n"), err
    lines = err.splitlines()[1:]
    assert len(lines) == 7 and all(line.startswith("  - ") for line in lines), err
    for line, expected in zip(lines, BROKEN_LINES):
        assert line[4:].startswith(expected), (line, expected)
    registry = build_registry(make_plugin_manager(modules=[name]))
    with pytest.raises(AssertionError) as info:
        check_component(registry.get("algorithm", "broken"), registry=registry)
    assert str(info.value).startswith("algorithm preset 'broken' does not resolve: \n  - card entry 'loss_agg'")
    assert all(expected in str(info.value) for expected in BROKEN_LINES)


def test_a_key_that_fails_only_beside_another_is_reported_once_and_no_good_key_is_blamed(plugin_module) -> None:
    """bf16 compute over bfloat16 weights fails only together (a rule reading two keys); the
    preset's good keys (kl.coef) are not listed."""
    name = plugin_module("""
from rlzoo.api import hookimpl

@hookimpl
def rlzoo_register_algorithms(register):
    register("pair", {"trainer": {"precision": "bf16"}, "model": {"dtype": "bfloat16"}, "kl": {"coef": 0.0},
                      "advantage": "nosuch"})
""")
    registry = build_registry(make_plugin_manager(modules=[name]))
    with pytest.raises(ConfigError) as info:
        load_config(registry, ["algo=pair"])
    lines = str(info.value).splitlines()
    assert lines[0] == f"algorithm preset 'pair' (package {name}) has 2 problems:"
    assert lines[1].startswith("  - advantage: unknown advantage 'nosuch'")
    assert lines[2].startswith("  - trainer.precision=bf16 computes in bfloat16 over float32 master weights")
    assert len(lines) == 3


def test_a_preset_with_one_problem_and_a_command_line_error_keep_their_one_line(plugin_module) -> None:
    name = plugin_module("""
from rlzoo.api import hookimpl

@hookimpl
def rlzoo_register_algorithms(register):
    register("one", {"advantage": "nosuch", "loss_agg": "nosuch"})
    register("fine", {"advantage": "rloo"}, card={"advantage": "RLOO paper"})
""")
    registry = build_registry(make_plugin_manager(modules=[name]))
    with pytest.raises(ConfigError) as info:
        load_config(registry, ["algo=one", "advantage=grpo"])  # the command line replaces one broken choice
    assert "has 2 problems" in str(info.value)  # the preset's own problems, whatever overrides it
    with pytest.raises(ConfigError) as info:
        load_config(registry, ["algo=fine", "trainer.lr=fast"])
    assert str(info.value) == "invalid value for trainer.lr: 'fast' is not a valid float"
    check_component(registry.get("algorithm", "fine"), registry=registry)


def test_a_card_that_is_not_a_mapping_is_one_error_line() -> None:
    pm = make_plugin_manager()
    plugin = module_plugin(rlzoo_register_algorithms=lambda register: register("strcard", {"advantage": "rloo"},
                                                                                card="my paper"))
    pm.register_plugin(plugin, name="pkg:presets", package="rlzoo-cards")
    with pytest.raises(ConfigError) as info:  # was: ValueError from dict("my paper")
        load_config(build_registry(pm), ["algo=strcard"])
    assert str(info.value) == ("algorithm preset 'strcard' (package rlzoo-cards): 'card' must map dotted config keys "
                               "to sources")


# ------------------------------------------------------------- a name clash

def test_a_name_clash_offers_renaming_beside_disabling_the_package() -> None:
    registry = Registry()

    def k3(logp, ref_logp):
        return logp - ref_logp

    registry.add("kl_estimator", "mine", k3, plugin="pkg-a:main", package="pkg-a")
    with pytest.raises(DuplicateComponentError) as info:
        registry.add("kl_estimator", "mine", k3, plugin="pkg-b:main", package="pkg-b")
    assert str(info.value) == ("kl_estimator name 'mine' is registered twice: by plugin 'pkg-a:main' (pkg-a) and by "
                               "plugin 'pkg-b:main' (pkg-b); rename one of them (register another name), or skip one "
                               "with RLZOO_DISABLE_PLUGINS=pkg-b:main or uninstall its package")
    registry.add("kl_estimator", "ours", k3, plugin="module:ours", package="")  # plugins=[...] modules: no package
    with pytest.raises(DuplicateComponentError, match=r"by plugin 'file:ours.py' \(\?\); rename one of them "
                                                      r"\(register another name\)$"):
        registry.add("kl_estimator", "ours", k3, plugin="file:ours.py", package="")


# ------------------------------------------------------------- a demonstration that does not fit

def test_a_too_long_demonstration_says_what_it_needs_and_which_knob_to_raise(tmp_path: Path, capsys) -> None:
    """Two-digit products: `59*63` + EOS = 6 tokens, `=3717;` 6, `3717` + EOS 5: 2 turns,
    6 tokens in the longest, 17 after the prompt (the embedded tokenizer: a token a character)."""
    def sft(*bounds: str, out: str) -> int:
        return main(["sft", "env=calculator", "task=multiply", *TINY, *bounds, "--steps", "1", "--batch-size", "1",
                     "--out", str(tmp_path / out)])

    code = sft("rollout.max_turns=1", "rollout.max_turn_tokens=3", "rollout.max_new_tokens=10", out="a")
    err = capsys.readouterr().err
    assert code == 2, err
    assert "env='calculator': the demonstration ['59*63', '3717'] of '59*63=' needs 2 turn(s), 6 tokens in its " \
           "longest turn (end of turn included) and 17 tokens after the prompt: raise rollout.max_turns=1 to 2, " \
           "rollout.max_turn_tokens=3 to 6, rollout.max_new_tokens=10 to 17" in err, err
    code = sft("rollout.max_turns=2", "rollout.max_turn_tokens=6", "rollout.max_new_tokens=17", out="b")  # as it needs
    assert code == 0, capsys.readouterr().err


def test_a_demonstration_the_environment_never_ends_is_named() -> None:
    free = SimpleNamespace(policy=[1, 1, 0, 0, 0, 1], turns=2, tokens=[7] * 6, done=False)
    assert _unfit(free, EpisodeLimits(max_turns=4, max_turn_tokens=8, max_tokens=64)) == (
        "needs 2 turn(s), 2 tokens in its longest turn (end of turn included) and 6 tokens after the prompt; the "
        "environment does not end the episode after its last turn (Environment.step must return done=True on the "
        "final answer)")


# ------------------------------------------------------------- explain and diff

def test_explain_prints_a_shared_card_source_once(capsys) -> None:
    assert main(["explain", "algo=ppo"]) == 0
    out = capsys.readouterr().out
    gae = "GAE (arXiv:1506.02438) with TRL PPOConfig gamma=1.0, lam=0.95"
    assert out.count(gae) == 1
    rows = {line.split()[0]: line for line in out.splitlines() if line and not line.startswith(("#", " "))}
    assert gae in rows["advantage.name"]
    for key in ("advantage.gamma", "advantage.lam", "advantage.whiten"):
        assert rows[key].endswith("[preset ppo]  source: see advantage.name"), rows[key]
    assert rows["kl.controller.horizon"].endswith("source: see kl.controller.name")


def test_diff_prints_each_differing_plan_line_under_its_section(capsys) -> None:
    assert main(["diff", "algo=ppo", "algo=grpo"]) == 0
    out = capsys.readouterr().out
    only_ppo = out.split("# plan lines only in algo=ppo\n")[1].split("\n\n")[0].splitlines()
    assert only_ppo[0] == "models:" and only_ppo[1].startswith("  reference: frozen initial policy")
    assert only_ppo[2].startswith("  critic: value model")
    aggregation = only_ppo.index("loss terms (coefficient x aggregation over mask):")
    assert only_ppo[aggregation + 1:aggregation + 3] == ["  policy: token-mean over loss_mask",
                                                          "  value: token-mean over response_mask"]
    assert only_ppo[aggregation - 1].startswith("kl: k1 in the reward")  # an unindented line: its own heading
    assert sum(line == "models:" for line in only_ppo) == 1
    assert "`1.0` [preset ppo; source: see advantage.name]" in out  # advantage.gamma
