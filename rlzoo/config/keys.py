"""Every config key, one record each, and what derives from them.

:data:`TABLE` lists the keys in ``configs/default.yaml`` order, a :class:`Section` per
mapping or paragraph (their records live in :mod:`rlzoo.config.keys_run`,
:mod:`rlzoo.config.keys_learn` and :mod:`rlzoo.config.keys_ops`). From it derive:

- the run schema (:func:`run_schema`: the OmegaConf structured dataclasses, one per section);
- the value checks (:func:`check_keys`: each key's choices, range and own check, then the
  rules that read several keys);
- :func:`added_keys` (what a run saved before a key existed ran with), :func:`renamed_keys`
  (rlzoo 0.1's names), :func:`resumable_keys` (what ``resume=`` may change) and
  :func:`explained_keys` (what ``rlzoo explain`` lists);
- ``configs/default.yaml`` and the key tables of docs/config.md
  (:mod:`rlzoo.config.key_docs`; tests check both files equal what it renders).

Adding a key is one :class:`Key` in its section plus the code that reads it; docs/design.md
("One record per config key") gives the steps.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

from rlzoo.config.key_record import NEW, Key, Rule, Section, check_key
from rlzoo.config.keys_learn import COMPONENTS, KL, TEACHER, TRAINER
from rlzoo.config.keys_ops import CHECKPOINT, DISTRIBUTED, EVAL, LAUNCHER, LOGGING, RM
from rlzoo.config.keys_run import MODEL, ROLLOUT, RUN, TASK

__all__ = ["TABLE", "added_keys", "check_keys", "explained_keys", "key_records", "renamed_keys",
           "resumable_keys", "rules", "run_schema"]

TABLE: tuple[Section, ...] = (RUN, TASK, MODEL, ROLLOUT, COMPONENTS, KL, TEACHER, TRAINER, LOGGING, EVAL,
                              CHECKPOINT, DISTRIBUTED, LAUNCHER, RM)
"""The config keys, in ``configs/default.yaml`` order: sections of top-level keys (``name``
``None``) and mappings."""


@dataclass(frozen=True)
class _Derived:
    keys: dict[str, Key]
    rules: tuple[Rule, ...]
    schema: type
    resumable: tuple[str, ...]


_CACHE: list[tuple[tuple[Section, ...], _Derived]] = []


def _walk(section: Section, prefix: str, resumable: bool, explain: bool, not_explained: str,
          keys: dict[str, Key], rules: list[Rule]) -> None:
    """Every key below ``section`` with its path, ``resumable``, ``explain`` and ``not_explained``
    filled in."""
    rules.extend(section.rules)
    for entry in section.entries:
        if isinstance(entry, Section):
            _walk(entry, f"{prefix}{entry.name}.", entry.resumable or resumable, entry.explain or explain,
                  entry.not_explained or not_explained, keys, rules)
            continue
        path = prefix + entry.name
        if path in keys:
            raise ValueError(f"config key {path} has two records")
        explained = explain if entry.explain is None else entry.explain
        keys[path] = dataclasses.replace(
            entry, path=path,
            resumable=resumable if entry.resumable is None else entry.resumable,
            explain=explained, not_explained=entry.not_explained or ("" if explained else not_explained))


def _class_name(path: str) -> str:
    return "".join(part.title() for part in path.split(".")[-1].split("_")) + "Config"


def _schema(entries: tuple[Key | Section, ...], name: str) -> type:
    """A dataclass with a field per key (no default: the values come from the config
    layers) and a nested dataclass per sub-section."""
    fields: list[tuple[str, Any, Any]] = []
    for entry in entries:
        if isinstance(entry, Section):
            nested = _schema(entry.entries, _class_name(entry.name or ""))
            fields.append((entry.name or "", nested, dataclasses.field(default_factory=nested)))
        else:
            fields.append((entry.name, entry.type, dataclasses.field(default=MISSING)))
    return dataclasses.make_dataclass(name, fields)


def _resumable(section: Section, prefix: str, keys: dict[str, Key]) -> list[str]:
    """A resumable mapping as ``"name."`` (every key below it), else its resumable keys."""
    below = [path for path in keys if path.startswith(prefix)] if prefix else []
    if section.resumable and below and all(keys[path].resumable for path in below):
        return [prefix]
    out: list[str] = []
    for entry in section.entries:
        if isinstance(entry, Section):
            out.extend(_resumable(entry, f"{prefix}{entry.name}.", keys))
        elif keys[prefix + entry.name].resumable:
            out.append(prefix + entry.name)
    return out


def _derived() -> _Derived:
    """What derives from :data:`TABLE` (computed again when the table is replaced, as a test does)."""
    if _CACHE and _CACHE[0][0] is TABLE:
        return _CACHE[0][1]
    keys: dict[str, Key] = {}
    rules: list[Rule] = []
    for section in TABLE:
        _walk(section, f"{section.name}." if section.name else "", section.resumable, section.explain,
              section.not_explained, keys, rules)
    top: list[Key | Section] = []
    for section in TABLE:
        top.extend(section.entries if section.name is None else (section,))
    resumable = [k for s in TABLE for k in _resumable(s, f"{s.name}." if s.name else "", keys)]
    derived = _Derived(keys=keys, rules=tuple(rules), schema=_schema(tuple(top), "RunConfig"),
                       resumable=tuple(resumable))
    _CACHE[:] = [(TABLE, derived)]
    return derived


def key_records() -> dict[str, Key]:
    """Dotted path -> :class:`Key`, in ``configs/default.yaml`` order."""
    return _derived().keys


def rules() -> tuple[Rule, ...]:
    """The checks that read several keys, in table order."""
    return _derived().rules


def run_schema() -> type:
    """The run schema: a dataclass per section, a field per key with its type and no value
    (``OmegaConf.structured`` of it refuses an unknown key or a wrongly typed value)."""
    return _derived().schema


def check_keys(cfg: DictConfig) -> None:
    """Every key's own checks (:func:`rlzoo.config.key_record.check_key`) in table order, then
    every :class:`Rule`.

    :raises ConfigError: the first failing check's one line.
    """
    for path, key in key_records().items():
        check_key(key, OmegaConf.select(cfg, path))
    for rule in rules():
        rule.check(cfg)


def added_keys() -> dict[str, Any]:
    """Keys added after rlzoo 0.2's first runs -> the value a run saved without them ran with."""
    return {path: key.old for path, key in key_records().items() if key.old is not NEW}


def renamed_keys() -> dict[str, str]:
    """rlzoo 0.1 name -> the key's name now."""
    return {key.renamed_from: path for path, key in key_records().items() if key.renamed_from}


def resumable_keys() -> tuple[str, ...]:
    """The keys ``resume=`` may change, in table order; ``"logging."`` stands for every key
    of a mapping that is resumable as a whole."""
    return _derived().resumable


def explained_keys() -> tuple[str, ...]:
    """The keys ``rlzoo explain`` lists (with every parameter of a component choice below them)."""
    return tuple(path for path, key in key_records().items() if key.explain)
