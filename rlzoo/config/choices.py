"""Component choices: taken out of the config layers, merged across them, resolved against
the registry.

A component key (``advantage``, ``kl.estimator``, ...; :data:`rlzoo.contract.kinds.COMPONENT_FIELDS`)
holds a name or a mapping with ``name`` and the component's parameters; a list-valued key
(:data:`rlzoo.contract.kinds.LISTS`: ``reward``, ``rollout_correction``, ``extensions``) may
hold a list of them. :func:`take_choices` pops every choice out of every layer (choices merge
by their own rule, which plain OmegaConf merging cannot express), and
:func:`choose_components` resolves them: each single choice by
:func:`rlzoo.config.params.resolve_component`, each list by :func:`resolve_list`, one path
for every list-valued kind, its specifics (weights, a ``none`` component, reserved names)
read from the kind's :class:`~rlzoo.contract.kinds.ListRules`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

from rlzoo.config.params import expand, resolve_component
from rlzoo.config.schema import FLOAT32_MAX, TASK_KEYS, check_instruction
from rlzoo.contract.kinds import COMPONENT_FIELDS, LISTS, ListRules
from rlzoo.contract.registry import Component, Registry
from rlzoo.core.errors import ConfigError

__all__ = ["CHOICE_PATHS", "Chosen", "Choices", "Listed", "as_spec", "choose_components", "resolve_list",
           "take_choices", "task_default_reward"]

CHOICE_PATHS: tuple[str, ...] = (*COMPONENT_FIELDS, *(path for path in LISTS if path not in COMPONENT_FIELDS))
"""Every config key that chooses components: the single choices (some of which also take a
list), then the keys that take only a list (``extensions``)."""

REQUIRED: tuple[str, ...] = ("task", "advantage", "policy_loss", "loss_agg", "rollout.backend")
"""Component keys a run cannot do without (``null`` is refused)."""


class Listed(NamedTuple):
    """One item of a list of components: the component, its parameters (its dataclass
    instance, or ``None``) and its weight (1.0 for a kind without weights)."""

    component: Component
    params: Any
    weight: float


@dataclass
class Choices:
    """The component choices of every layer, merged.

    :ivar specs: component key -> its merged choice ``{name: ..., **params}`` (``None``: null).
    :ivar lists: list-valued key -> its items, where the winning layer gave a list.
    :ivar task_extras: the ``task`` keys every task takes (:data:`rlzoo.config.schema.TASK_KEYS`).
    :ivar sources: dotted key -> the layer that set it (plain keys are added by the caller).
    """

    specs: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    lists: dict[str, list[Any]] = field(default_factory=dict)
    task_extras: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)


@dataclass
class Chosen:
    """The resolved choices.

    :ivar components: component key -> the chosen component (a single choice only).
    :ivar params: component key -> its parameter dataclass instance.
    :ivar listed: list-valued key -> its items, where it was given as a list.
    """

    components: dict[str, Component]
    params: dict[str, Any]
    listed: dict[str, list[Listed]]

    def items(self, path: str) -> list[Listed]:
        """The components a list-valued key names: its list, or its single choice (nothing
        when that is null or its kind's ``none`` component)."""
        if path in self.listed:
            return self.listed[path]
        component = self.components.get(path)
        if component is None or component.name == LISTS[path].listing.none_name:  # type: ignore[union-attr]
            return []
        return [Listed(component, self.params[path], 1.0)]


def as_spec(value: Any, where: str) -> dict[str, Any] | None:
    """A component choice as a mapping ``{name: ..., **params}`` (``None`` stays ``None``)."""
    if value is None:
        return None
    if isinstance(value, str):
        return {"name": value}
    if isinstance(value, dict):
        return dict(value)
    raise ConfigError(
        f"{where} must be a component name or a mapping with 'name', got {value!r}"
    )


def _merge_spec(current: dict[str, Any] | None, layer: dict[str, Any] | None) -> dict[str, Any] | None:
    """A later layer naming another component replaces the choice and its parameters;
    a mapping without ``name`` (or with the same name) updates the parameters."""
    if layer is None:
        return None
    if current is None or ("name" in layer and layer["name"] != current.get("name")):
        return dict(layer)
    merged = dict(current)
    merged.update(layer)
    return merged


def _pop_path(data: dict[str, Any], path: str) -> tuple[bool, Any]:
    parts = path.split(".")
    node: Any = data
    for part in parts[:-1]:
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    if not isinstance(node, dict) or parts[-1] not in node:
        return False, None
    return True, node.pop(parts[-1])


def _forget(sources: dict[str, str], path: str) -> dict[str, str]:
    """``sources`` without the keys below ``path`` (a new choice replaced their values)."""
    return {k: v for k, v in sources.items() if not k.startswith(path + ".")}


def take_choices(labelled: list[tuple[str, dict[str, Any]]]) -> Choices:
    """Pop every component choice out of the layers (in place) and merge them, lowest layer
    first; then take the task's own keys (``task.instruction``) out of its choice.

    :param labelled: ``(label, layer)``, lowest first.
    :raises ConfigError: a choice that is neither a name nor a mapping; a bad instruction.
    """
    choices = Choices()
    for path in CHOICE_PATHS:
        spec: dict[str, Any] | None = None
        for label, layer in labelled:
            present, value = _pop_path(layer, path)
            if not present:
                continue
            if path not in COMPONENT_FIELDS:  # takes only a list
                choices.lists[path] = list(value or [])
                choices.sources[path] = label
            elif isinstance(value, list) and path in LISTS:
                spec, choices.lists[path] = None, value
                choices.sources = _forget(choices.sources, path)
                choices.sources[path] = label
            else:
                choices.lists.pop(path, None)
                layer_spec = as_spec(value, path)
                if spec is None or layer_spec is None or layer_spec.get("name", spec.get("name")) != spec.get("name"):
                    choices.sources = _forget(choices.sources, path)
                spec = _merge_spec(spec, layer_spec)
                for key in (layer_spec or {"name": None}):
                    choices.sources[f"{path}.{key}"] = label
        if path in COMPONENT_FIELDS:
            choices.specs[path] = spec
        else:
            choices.lists.setdefault(path, [])
    task = choices.specs["task"]
    if task is not None:  # every task's own keys (task.instruction), not its factory's parameters
        choices.task_extras = {key: task.pop(key, None) for key in TASK_KEYS}
        check_instruction(choices.task_extras["instruction"])
    return choices


def task_default_reward(registry: Registry, choices: Choices) -> None:
    """With no reward chosen, the task's own (its registration's ``reward``), recorded as
    ``"task NAME's default reward"``.

    :raises ConfigError: the task names none.
    """
    if choices.specs["reward"] is not None or "reward" in choices.lists or choices.specs["task"] is None:
        return
    task = resolve_component(registry, "task", "task", choices.specs["task"])[0]
    if task.meta.get("reward") is None:
        raise ConfigError(f"task {task.name!r} names no default reward: set reward=NAME "
                          f"(registered: {', '.join(registry.names('reward'))})")
    choices.specs["reward"] = {"name": task.meta["reward"]}
    choices.sources["reward.name"] = f"task {task.name}'s default reward"


def _weight(value: Any, where: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or abs(value) > FLOAT32_MAX):
        raise ConfigError(f"{where}.weight must be a finite number within float32's range "
                          f"(|x| <= 3.4e38), got {value!r}")
    return float(value)


def resolve_list(registry: Registry, kind: str, rules: ListRules, items: list[Any],
                 sources: dict[str, str]) -> list[Listed]:
    """``PATH=[a, {name: b, **params}, ...]`` as :class:`Listed` items in order, by the kind's
    rules; records each parameter's source as ``PATH[i].<key>`` (the list's layer, or the
    component's default).

    :raises ConfigError: an empty list or a null item where the rules refuse one, a bad item
        or weight, every weight 0, a reserved name, ``none`` beside others, a component
        listed twice where each is logged under its name.
    """
    path = rules.path
    if rules.nonempty and not items:
        raise ConfigError(f"{path}=[] names no {rules.noun}; registered: {', '.join(registry.names(kind))}")
    label = sources.get(path, "?")
    out: list[Listed] = []
    for i, raw in enumerate(items):
        where = f"{path}[{i}]"
        spec = as_spec(raw, where)
        if spec is None:
            if rules.skip_null:
                continue
            raise ConfigError(f"{where} is null; every item names a {rules.noun}")
        weight = _weight(spec.pop("weight", 1.0), where) if rules.weighted else 1.0
        component, instance, expanded = resolve_component(registry, kind, where, spec)
        for key in expanded:
            sources[f"{where}.{key}"] = label if key in spec else f"default of {kind} {component.name}"
        out.append(Listed(component, instance, weight))
    names = [item.component.name for item in out]
    if rules.weighted and out and all(item.weight == 0 for item in out):
        raise ConfigError(f"every {path} weight is 0 ({path}={names}): the run would train on a constant {path} "
                          "of 0; give at least one function a non-zero weight")
    taken = sorted(set(names) & set(rules.reserved))
    if taken:
        raise ConfigError(f"{rules.noun} {taken[0]!r} would be logged as {path}/{taken[0]}, which rlzoo writes "
                          "itself: register it under another name")
    if rules.none_name and rules.none_name in names and len(names) > 1:
        raise ConfigError(f"{path}={names}: {rules.none_name} is no {rules.noun}; list only the {rules.noun}s to "
                          f"apply (or write {path}={rules.none_name})")
    twice = sorted({n for n in names if names.count(n) > 1}) if rules.once else []
    if twice:
        raise ConfigError(f"{path} names {', '.join(twice)} more than once; {rules.once}")
    return [item for item in out if item.component.name != rules.none_name]


def _recorded(item: Listed, rules: ListRules) -> dict[str, Any]:
    """A list item as the config records it: every parameter, and its weight where items have one."""
    return {**expand(item.component, item.params), **({"weight": item.weight} if rules.weighted else {})}


def choose_components(registry: Registry, choices: Choices, cfg: DictConfig, preset_label: str | None,
                      user_labels: set[str]) -> Chosen:
    """Resolve every choice against the registry, in :data:`CHOICE_PATHS` order, and write
    each into ``cfg`` with all its parameters.

    :param preset_label: how errors name the algorithm preset, or ``None`` without one.
    :param user_labels: the labels of the user's layers: an error in a choice only the preset
        made names the preset.
    :raises ConfigError: an unknown component or parameter, a bad list, a required key null.
    """
    chosen = Chosen(components={}, params={}, listed={})
    for path in CHOICE_PATHS:
        kind = COMPONENT_FIELDS.get(path) or LISTS[path].name
        spec = choices.specs.get(path)
        rules = LISTS[path].listing if path in LISTS else None
        if path not in choices.lists and spec is not None and rules is not None and rules.weighted \
                and "weight" in spec:
            raise ConfigError(f"{path}.weight={spec['weight']!r}: a weight belongs to one of several {rules.noun}s; "
                              f"write {path}=[{{name: a, weight: 1.0}}, {{name: b, weight: 0.5}}]")
        try:
            if path in choices.lists:
                assert rules is not None
                items = resolve_list(registry, kind, rules, choices.lists[path], choices.sources)
                chosen.listed[path] = items
                OmegaConf.update(cfg, path, [_recorded(item, rules) for item in items], force_add=True)
                continue
            if spec is None:
                continue
            component, instance, expanded = resolve_component(registry, kind, path, spec)
        except ConfigError as exc:
            setters = {v for k, v in choices.sources.items() if k.startswith(path + ".")}
            from_preset = any(v.startswith("preset ") for v in setters) and not setters & user_labels
            raise ConfigError(f"{preset_label}: {exc}" if from_preset and preset_label else str(exc)) from exc
        chosen.components[path] = component
        chosen.params[path] = instance
        if path == "task":
            expanded = {**expanded, **choices.task_extras}
        OmegaConf.update(cfg, path, expanded, force_add=True)
        for key in expanded:
            choices.sources.setdefault(f"{path}.{key}", f"default of {kind} {component.name}")
    for required in REQUIRED:
        if required not in chosen.components:
            raise ConfigError(f"'{required}' must name a component; got null")
    return chosen
