"""The run schema and the checks on a merged config's values.

Each key's type, default, choices, range and checks are its record in
:mod:`rlzoo.config.keys`; :data:`RunConfig` (the OmegaConf structured schema, so a merge
refuses an unknown key or a wrongly typed value, :mod:`rlzoo.config.layers`),
:data:`RENAMED_KEYS` and :data:`ADDED_KEYS` derive from them. :func:`check_values` then
checks what types cannot say: finiteness, choices, ranges, combinations of keys.
"""

from __future__ import annotations

import math
import re
import string
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ValidationError

from rlzoo.config.keys import added_keys, check_keys, renamed_keys, run_schema
from rlzoo.core.errors import ConfigError

RunConfig = run_schema()
"""The run schema, derived from the key records (:func:`rlzoo.config.keys.run_schema`)."""

INSTRUCTION_FIELDS = ("question", "format")
"""The fields an instruction template may use."""


def check_instruction(instruction: Any) -> None:
    """``task.instruction`` is null or a template using ``{question}`` and only :data:`INSTRUCTION_FIELDS`.

    :raises ConfigError: naming the bad value and the fields.
    """
    if instruction is None:
        return
    if not isinstance(instruction, str):
        raise ConfigError(f"invalid value for task.instruction: {instruction!r}; a template string such as "
                          "'Solve: {question} {format}'")
    try:
        used = {name for _, name, _, _ in string.Formatter().parse(instruction) if name is not None}
    except ValueError as exc:
        raise ConfigError(f"invalid task.instruction {instruction!r}: {exc} (write a literal brace as {{{{ or }}}})") \
            from exc
    unknown = sorted(used - set(INSTRUCTION_FIELDS))
    if unknown or "question" not in used:
        what = f"unknown field {{{unknown[0]}}}" if unknown else "no {question}"
        raise ConfigError(f"invalid task.instruction {instruction!r}: {what}; the template's fields are "
                          f"{', '.join('{' + f + '}' for f in INSTRUCTION_FIELDS)} and {{question}} is required")


TASK_KEYS: tuple[str, ...] = ("instruction",)
"""Keys of the ``task`` mapping that every task takes besides its own parameters
(:mod:`rlzoo.tasks.prompts`): recorded with the task's parameters, never passed to its factory."""


RENAMED_KEYS: dict[str, str] = renamed_keys()
"""Keys of rlzoo 0.1 -> their rlzoo 0.2 names (an old key is an error naming the new one);
derived from the key records' ``renamed_from``."""

ADDED_KEYS: dict[str, Any] = added_keys()
"""Keys added after a run may have been saved -> the value such a run ran with (a resumed run
whose ``config.yaml`` lacks one gets it, and that is no change); derived from the key
records' ``old``."""


FLOAT32_MAX = 3.4028234663852886e38
"""Config numbers meet float32 tensors (a learning rate beyond it fails inside the optimizer)."""

INT64_MAX = 2**63 - 1
"""Config integers meet int64 tensors and counters (Python's own ints have no bound)."""

def non_finite(data: Any, prefix: str = "") -> list[tuple[str, float]]:
    """``(dotted key, value)`` of every NaN, infinite or beyond-float32 float in a nested container."""
    if isinstance(data, dict):
        return [hit for key, value in data.items() for hit in non_finite(value, f"{prefix}{key}.")]
    if isinstance(data, (list, tuple)):
        return [hit for i, value in enumerate(data) for hit in non_finite(value, f"{prefix[:-1]}[{i}].")]
    if isinstance(data, float) and not (math.isfinite(data) and abs(data) <= FLOAT32_MAX):
        return [(prefix[:-1], data)]
    return []

def huge_ints(data: Any, prefix: str = "") -> list[tuple[str, int]]:
    """``(dotted key, value)`` of every integer beyond int64 in a nested container."""
    if isinstance(data, dict):
        return [hit for key, value in data.items() for hit in huge_ints(value, f"{prefix}{key}.")]
    if isinstance(data, (list, tuple)):
        return [hit for i, value in enumerate(data) for hit in huge_ints(value, f"{prefix[:-1]}[{i}].")]
    if isinstance(data, int) and not isinstance(data, bool) and abs(data) > INT64_MAX:
        return [(prefix[:-1], data)]
    return []


def check_numbers(data: Any, label: str, sep: str = ": ") -> None:
    """Refuse a NaN, an infinity, a float beyond float32 or an integer beyond int64 in ``data``.

    :param label: how the message introduces the key (``"value for"``, ``"parameter for policy_loss 'x':"``).
    :param sep: between the key and its value (``"="`` for a component parameter).
    :raises ConfigError: one line naming the key and the value.
    """
    bad = non_finite(data)
    if bad:
        raise ConfigError(f"invalid {label} {bad[0][0]}{sep}{bad[0][1]}; config values must be finite numbers within "
                          "float32's range (|x| <= 3.4e38)")
    big = huge_ints(data)
    if big:
        raise ConfigError(f"invalid {label} {big[0][0]}{sep}{big[0][1]}; config integers must fit in int64 "
                          f"(|n| <= {INT64_MAX})")


BOOLEAN_TYPES = (bool, Optional[bool])
"""The annotations of a boolean key or parameter (``null`` allowed for the second)."""


def check_booleans(data: Any, annotations: dict[str, Any], label: str, sep: str = ": ") -> None:
    """Refuse a boolean key or parameter given anything but ``true`` / ``false`` (YAML's
    booleans; also ``null`` where its type is ``Optional[bool]``): OmegaConf would read a
    number as ``bool(n)`` (``2`` as true) and a few words as booleans, while other words
    fail, so rlzoo reads booleans one way: YAML's.

    :param data: a config layer or a component's given parameters (a nested dict, before
        any merge converts it).
    :param annotations: dotted key -> its declared type; keys of other types are not looked at.
    :param label: how the message introduces the key (``"value for"``).
    :raises ConfigError: one line naming the key, its value and what a boolean is.
    """
    for key, annotation in annotations.items():
        if annotation not in BOOLEAN_TYPES:
            continue
        node: Any = data
        for part in key.split("."):
            node = node.get(part, _ABSENT) if isinstance(node, dict) else _ABSENT
        if node is _ABSENT or isinstance(node, bool) or (node is None and annotation is not bool) or (
                isinstance(node, str) and node.startswith("${")):  # an interpolation: its value is checked after
            continue
        allowed = "true or false" + (" (or null)" if annotation is not bool else "")
        raise ConfigError(f"invalid {label} {key}{sep}{node!r}; a boolean is {allowed}")


_ABSENT = object()


def check_values(cfg: DictConfig) -> None:
    """Check what the schema's types cannot: finiteness, then each key's choices, range and
    own check, then the rules that read several keys (all from the key records,
    :func:`rlzoo.config.keys.check_keys`).

    :raises ConfigError: one line naming the key, its value and what is allowed.
    """
    check_numbers(OmegaConf.to_container(cfg), "value for")
    check_keys(cfg)


def schema_keys(node: Any, prefix: str = "") -> list[str]:
    keys = []
    if isinstance(node, DictConfig):
        for key in node.keys():
            full = f"{prefix}{key}"
            keys.append(full)
            child = node._get_node(key)
            if isinstance(child, DictConfig):
                keys.extend(schema_keys(child, full + "."))
    return keys

def type_message(exc: ValidationError, where: str | None = None) -> str:
    key = where or exc.full_key or "?"
    text = str(exc).splitlines()[0]
    match = re.search(r"could not be converted to ([A-Za-z_]+)", text)
    value = re.search(r"Value '([^']*)'", text)
    if match and value:
        return f"invalid value for {key}: {value.group(1)!r} is not a valid {match.group(1).lower()}"
    return f"invalid value for {key}: {text}"
