"""Component choices (rlzoo/config/choices.py): every list-valued kind is resolved by one
path, and what differs between reward, rollout_correction and extensions is the data on
their kind records (``ListRules``)."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from rlzoo.config import layers
from rlzoo.config.choices import CHOICE_PATHS, resolve_list, take_choices
from rlzoo.contract.kinds import KINDS, LISTS, ListRules
from rlzoo.core.errors import ConfigError
from zoo import REGISTRY

REWARD = KINDS["reward"].listing
CORRECTION = KINDS["rollout_correction"].listing


def test_the_list_valued_keys_are_those_of_the_kind_records() -> None:
    assert {path: kind.name for path, kind in LISTS.items()} == {
        "reward": "reward", "rollout_correction": "rollout_correction", "extensions": "extension"}
    assert CHOICE_PATHS[-1] == "extensions" and "reward" in CHOICE_PATHS
    assert KINDS["reward"].takes_list and not KINDS["extension"].takes_list   # extensions take only a list


def test_one_resolver_follows_each_kinds_rules() -> None:
    sources: dict[str, str] = {"reward": "command line"}
    items = resolve_list(REGISTRY, "reward", REWARD, ["format", {"name": "sorted_digits", "weight": 0.5}], sources)
    assert [(i.component.name, i.weight) for i in items] == [("format", 1.0), ("sorted_digits", 0.5)]
    assert sources["reward[1].name"] == "command line"
    corrections = resolve_list(REGISTRY, "rollout_correction", CORRECTION, ["none"], {})
    assert corrections == []                                                   # none alone: no correction
    extensions = resolve_list(REGISTRY, "extension", LISTS["extensions"].listing, [None, "dynamic_sampling"], {})
    assert [i.component.name for i in extensions] == ["dynamic_sampling"]      # a null extension is skipped


def test_changing_the_rules_changes_the_behaviour_not_the_code() -> None:
    """The same items under edited rules: the resolver reads the rules, it knows no kind."""
    twice = ["format", "format"]
    with pytest.raises(ConfigError, match="reward names format more than once; each reward function is logged"):
        resolve_list(REGISTRY, "reward", REWARD, twice, {})
    assert len(resolve_list(REGISTRY, "reward", dataclasses.replace(REWARD, once=""), twice, {})) == 2
    with pytest.raises(ConfigError, match=r"reward\[0\] is null; every item names a reward function"):
        resolve_list(REGISTRY, "reward", REWARD, [None, "format"], {})
    skipping = dataclasses.replace(REWARD, skip_null=True)
    assert len(resolve_list(REGISTRY, "reward", skipping, [None, "format"], {})) == 1
    with pytest.raises(ConfigError, match=r"reward\[0\] 'format' takes no parameters; got weight"):
        resolve_list(REGISTRY, "reward", dataclasses.replace(REWARD, weighted=False), [{"name": "format",
                                                                                         "weight": 2.0}], {})
    strict = ListRules("rollout_correction", "correction", nonempty=True, reserved=("tis",))
    with pytest.raises(ConfigError, match=r"rollout_correction=\[\] names no correction; registered: icepop"):
        resolve_list(REGISTRY, "rollout_correction", strict, [], {})
    with pytest.raises(ConfigError, match="correction 'tis' would be logged as rollout_correction/tis, which rlzoo "
                                          "writes itself"):
        resolve_list(REGISTRY, "rollout_correction", strict, ["tis"], {})
    assert [i.component.name for i in resolve_list(REGISTRY, "rollout_correction", strict, ["none", "icepop"],
                                                   {})] == ["none", "icepop"]  # no none_name: none is a correction


@pytest.mark.parametrize(("override", "message"), [
    ("reward=[]", "reward=[] names no reward function; registered: countdown"),
    ("reward=[format, null]", "reward[1] is null; every item names a reward function"),
    ("reward=[{name: format, weight: .inf}]", "reward[0].weight must be a finite number within float32's range "
                                              "(|x| <= 3.4e38), got inf"),
    ("reward=[{name: format, weight: 0}]", "every reward weight is 0 (reward=['format']): the run would train on a "
                                           "constant reward of 0; give at least one function a non-zero weight"),
    ("reward={name: format, weight: 2}", "reward.weight=2: a weight belongs to one of several reward functions; "
                                         "write reward=[{name: a, weight: 1.0}, {name: b, weight: 0.5}]"),
    ("rollout_correction=[none, tis]", "rollout_correction=['none', 'tis']: none is no correction; list only the "
                                       "corrections to apply (or write rollout_correction=none)"),
    ("rollout_correction=[tis, tis]", "rollout_correction names tis more than once; each correction's metrics are "
                                      "logged as rollout_correction/<name>/..., so list each once"),
    ("extensions=[3]", "extensions[0] must be a component name or a mapping with 'name', got 3"),
])
def test_list_errors_keep_their_words(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        layers.resolve_config(REGISTRY, [override])
    assert str(info.value).startswith(message), str(info.value)


def test_the_lists_are_recorded_in_the_config_and_the_resolved_config() -> None:
    resolved = layers.resolve_config(REGISTRY, ["reward=[format, {name: sorted_digits, weight: 0.5}]",
                                                "rollout_correction=[tis]", "extensions=[dynamic_sampling]"])
    cfg = OmegaConf.to_container(resolved.cfg)
    assert [(r["name"], r["weight"]) for r in cfg["reward"]] == [("format", 1.0), ("sorted_digits", 0.5)]
    assert [c["name"] for c in cfg["rollout_correction"]] == ["tis"] and "cap" in cfg["rollout_correction"][0]
    assert [e["name"] for e in cfg["extensions"]] == ["dynamic_sampling"]
    assert [w for _, _, w in resolved.rewards] == [1.0, 0.5]
    assert [c.name for c, _ in resolved.corrections] == ["tis"]
    assert [c.name for c, _ in resolved.extensions] == ["dynamic_sampling"]
    single = layers.resolve_config(REGISTRY, ["rollout_correction=none"])
    assert single.corrections == [] and single.components["rollout_correction"].name == "none"
    assert [(c.name, w) for c, _, w in single.rewards] == [("sorted_digits", 1.0)]   # the task's default reward


def test_taking_choices_leaves_the_plain_keys_in_the_layers() -> None:
    labelled = [("defaults", {"advantage": "grpo", "kl": {"coef": 0.1, "estimator": "k3"}, "extensions": None}),
                ("command line", {"advantage": {"scale": "batch"}, "reward": ["format"], "task": "sort_digits"})]
    choices = take_choices(labelled)
    assert labelled[0][1] == {"kl": {"coef": 0.1}} and labelled[1][1] == {}
    assert choices.specs["advantage"] == {"name": "grpo", "scale": "batch"}
    assert choices.specs["kl.estimator"] == {"name": "k3"} and choices.specs["reward"] is None
    assert choices.lists == {"reward": ["format"], "extensions": []}
    assert choices.sources["advantage.scale"] == "command line" and choices.sources["advantage.name"] == "defaults"
