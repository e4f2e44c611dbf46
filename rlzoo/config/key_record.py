"""What one config key is: the :class:`Key` record, the :class:`Section` that groups keys, and
the :class:`Rule` that checks several keys together.

Everything rlzoo knows about a config key sits in its record: its type, its default, what
values it takes, whether a resumed run may change it, the value a run saved before the key
existed ran with, its name in rlzoo 0.1, one line of documentation and whether ``rlzoo
explain`` lists it. The records themselves are :mod:`rlzoo.config.keys`; the run schema,
the value checks, ``configs/default.yaml`` and the key table of docs/config.md derive from
them.
"""

from __future__ import annotations

import json
import re
import typing
from dataclasses import dataclass
from typing import Any, Callable, Union

import yaml

from omegaconf import DictConfig

from rlzoo.core.errors import ConfigError, did_you_mean

__all__ = ["NEW", "Key", "Rule", "Section", "allowed", "check_key", "nullable", "show"]


class _New:
    """The type of :data:`NEW`."""

    def __repr__(self) -> str:
        return "NEW"


NEW = _New()
"""``Key.old`` of a key that rlzoo 0.2's first runs already had."""

_BOUND = re.compile(r"^(>=|>) (-?[\d.e+-]+)$")
_INTERVAL = re.compile(r"^([\[(])(-?[\d.e+-]+), (-?[\d.e+-]+)([\])])$")


@dataclass(frozen=True)
class Key:
    """One config key.

    :ivar name: its last dotted part (``rank`` of ``model.lora.rank``).
    :ivar type: its type as the schema declares it: ``int``, ``float``, ``bool``, ``str``,
        ``Optional[...]`` (``null`` allowed), ``list[...]``, or ``Any`` for a component choice.
    :ivar default: its value in ``configs/default.yaml``.
    :ivar doc: one line: the key's comment in ``configs/default.yaml``, the start of its
        meaning in docs/config.md.
    :ivar detail: the rest of its meaning in docs/config.md (Markdown), or ``""``.
    :ivar choices: the values it takes, or ``()``.
    :ivar range: the numbers it takes: ``"> 0"``, ``">= 0"`` or an interval ``"(0, 1]"``;
        ``""`` for none (``null`` passes when the type is ``Optional``).
    :ivar why: said after an out-of-range value's error, in parentheses.
    :ivar check: what ``choices`` and ``range`` cannot say: called with the value, raises
        :class:`ConfigError` (its docstring's first line is what docs/config.md shows).
    :ivar resumable: ``resume=`` may change it (``None``: as its section says).
    :ivar explain: ``rlzoo explain`` lists it: it changes what a run computes (``None``: as its
        section says).
    :ivar not_explained: for a key ``rlzoo explain`` does not list, why: it changes how, where or
        when a run computes, or what it records, not what it computes (``""``: its section's
        reason). Every key has one or the other (``tests/test_keys.py``), so a new key is a
        decision, not a default.
    :ivar old: the value a run saved before the key existed ran with (``resume=`` fills it
        in); :data:`NEW` for a key that 0.2's first runs had.
    :ivar renamed_from: its rlzoo 0.1 name (an error naming this one), or ``""``.
    :ivar path: its dotted path, set when the table is read (:func:`rlzoo.config.keys.flatten`).
    """

    name: str
    type: Any
    default: Any
    doc: str
    detail: str = ""
    choices: tuple[Any, ...] = ()
    range: str = ""
    why: str = ""
    check: Callable[[Any], None] | None = None
    resumable: bool | None = None
    explain: bool | None = None
    not_explained: str = ""
    old: Any = NEW
    renamed_from: str = ""
    path: str = ""

    def __post_init__(self) -> None:
        if self.range and not (_BOUND.match(self.range) or _INTERVAL.match(self.range)):
            raise ValueError(f"key {self.name}: range {self.range!r} is not '> x', '>= x' or an interval '(a, b]'")


@dataclass(frozen=True)
class Rule:
    """A check that reads several keys (``trainer.precision`` against ``model.dtype``): kept
    in the section of the key it is mostly about, run after every key's own checks.

    :ivar reads: the dotted keys it reads.
    :ivar check: called with the merged config, raises :class:`ConfigError`.
    """

    reads: tuple[str, ...]
    check: Callable[[DictConfig], None]


@dataclass(frozen=True)
class Section:
    """Keys that belong together: a mapping of the config (``model``, ``model.lora``) or, with
    ``name=None``, a paragraph of top-level keys.

    :ivar name: the mapping's key (its last dotted part), or ``None``.
    :ivar entries: its keys and sub-sections, in ``configs/default.yaml`` order.
    :ivar doc: the mapping's comment in ``configs/default.yaml``, or ``""``.
    :ivar resumable: the default of its keys' ``resumable``.
    :ivar explain: the default of its keys' ``explain``.
    :ivar not_explained: the default of its keys' ``not_explained`` (those not explained).
    :ivar rules: the checks that read several keys, registered here.
    """

    name: str | None
    entries: tuple[Key | Section, ...]
    doc: str = ""
    resumable: bool = False
    explain: bool = False
    not_explained: str = ""
    rules: tuple[Rule, ...] = ()


def nullable(annotation: Any) -> bool:
    """True when ``annotation`` admits ``None`` (``Optional[...]`` or ``Any``)."""
    return annotation is Any or (typing.get_origin(annotation) is Union and type(None) in typing.get_args(annotation))


def _in_range(value: Any, text: str) -> bool:
    bound = _BOUND.match(text)
    if bound:
        limit = float(bound.group(2))
        return value > limit if bound.group(1) == ">" else value >= limit
    low_side, low, high, high_side = _INTERVAL.match(text).groups()  # type: ignore[union-attr]
    above = value > float(low) if low_side == "(" else value >= float(low)
    below = value < float(high) if high_side == ")" else value <= float(high)
    return above and below


def range_text(text: str) -> str:
    """How an error words a range: ``> 0``, ``in (0, 1]``."""
    return text if _BOUND.match(text) else f"in {text}"


def check_key(key: Key, value: Any) -> None:
    """The key's own checks, in order: its ``check``, its ``choices``, its ``range``.

    :raises ConfigError: one line naming the key, the value and what is allowed.
    """
    if key.check is not None:
        key.check(value)
    if key.choices and value not in key.choices:
        raise ConfigError(f"invalid value for {key.path}: {value!r}; choose one of "
                          f"{', '.join(map(str, key.choices))}."
                          f"{did_you_mean(str(value), [str(c) for c in key.choices])}")
    if key.range and not (value is None and nullable(key.type)):
        if value is None or not _in_range(value, key.range):
            why = f" ({key.why})" if key.why else ""
            raise ConfigError(f"invalid value for {key.path}: {value!r}; must be {range_text(key.range)}{why}")


def show(value: Any) -> str:
    """A value as YAML's flow style writes it (``null``, ``true``, ``[a, b]``, ``{name: x}``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = repr(value)
        mantissa, _, exponent = text.partition("e")
        return f"{mantissa}.0e{exponent}" if exponent and "." not in mantissa else text  # YAML 1.1 needs the dot
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    text = str(value)
    try:
        plain = yaml.safe_load(text) == value and not set(text) & set(",[]{}#'\"") and ": " not in text
    except yaml.YAMLError:
        plain = False
    return text if plain else json.dumps(text, ensure_ascii=False)


def allowed(key: Key) -> str:
    """What docs/config.md says a key takes: its choices, its range, or its check's first
    docstring line (``""`` for any value of its type)."""
    if key.choices:
        return ", ".join(f"`{show(c)}`" for c in key.choices)
    if key.range:
        text = key.range + (" or `null`" if nullable(key.type) else "")
        return text.replace("<", "&lt;")
    if key.check is not None and key.check.__doc__:
        return key.check.__doc__.strip().splitlines()[0]
    return ""
