"""Component parameters: a choice's parameters validated against the component's dataclass.

Every component declares its parameters as a dataclass (``register(..., params=...)``);
:func:`build_params` validates what a config gives against it (unknown keys with a
did-you-mean, types, ranges in ``__post_init__``) and instantiates it.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

from rlzoo.core.errors import ConfigError, did_you_mean
from rlzoo.contract.registry import Component, Registry
from rlzoo.config.schema import check_booleans, check_numbers, type_message

def build_params(component: Component, given: dict[str, Any], where: str | None = None) -> Any:
    """Validate ``given`` against the component's parameter dataclass and instantiate it.

    :raises ConfigError: unknown parameter (did-you-mean), wrong type, or a value the
        dataclass' ``__post_init__`` rejects; the message names the parameter.
    """
    where = where or component.kind
    label = f"{where} {component.name!r}"
    if component.params is None:
        if given:
            raise ConfigError(f"{label} takes no parameters; got {', '.join(sorted(given))}")
        return None
    names = [f.name for f in dataclasses.fields(component.params)]
    for key in given:
        if key not in names:
            hint = (" (YAML reads `{a:b}` as one key: write `{a: b}`, with a space after the colon)"
                    if ":" in str(key) else did_you_mean(key, names))
            raise ConfigError(
                f"unknown parameter {key!r} for {label}; parameters: "
                f"{', '.join(names) or '(none)'}.{hint}"
            )
    check_numbers(given, f"parameter for {label}:", sep="=")
    check_booleans(given, _annotations(component.params), f"parameter for {label}:", sep="=")
    try:
        node = OmegaConf.merge(OmegaConf.structured(component.params), given)
        return OmegaConf.to_object(node)
    except ValidationError as exc:
        key = f"{where}.{exc.key}" if exc.key is not None else where
        raise ConfigError(type_message(exc, key)) from exc
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid parameter for {label}: {exc}") from exc
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid parameters for {label}: {exc}") from exc


def _annotations(params: type) -> dict[str, Any]:
    """Each field of a parameter dataclass -> its type (string annotations resolved where they can be)."""
    try:
        hints = typing.get_type_hints(params)
    except (NameError, TypeError):  # an annotation naming something its module does not define
        hints = {}
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(params)}


def resolve_component(
    registry: Registry, kind: str, where: str, spec: dict[str, Any]
) -> tuple[Component, Any, dict[str, Any]]:
    if "name" not in spec or spec["name"] is None:
        raise ConfigError(f"{where} needs a 'name'; registered: {', '.join(registry.names(kind))}")
    try:
        component = registry.get(kind, spec["name"])
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    given = {k: v for k, v in spec.items() if k != "name"}
    instance = build_params(component, given, where)
    return component, instance, expand(component, instance)


def expand(component: Component, instance: Any) -> dict[str, Any]:
    """A component choice with every parameter, as it is recorded in the config."""
    expanded: dict[str, Any] = {"name": component.name}
    if instance is not None:
        expanded.update(_params_container(instance))
    return expanded


def _params_container(instance: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        if isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out
