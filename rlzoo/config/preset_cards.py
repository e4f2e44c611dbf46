"""Algorithm presets and their cards: which knobs a preset sets, and where each comes from.

A preset is registered (kind ``algorithm``) as a mapping of config keys, or as the path of
a YAML file. A file may hold the config keys directly, or a *preset card*::

    description: "DAPO: clip-higher, token-mean, dynamic sampling, overlong shaping"
    paper: arXiv:2503.14476
    config:                       # the config keys the preset sets
      policy_loss: {name: ppo_clip, clip_low: 0.2, clip_high: 0.28}
      trainer: {num_mini_batches: 16}
    card:                         # dotted key -> where its value comes from
      policy_loss: "DAPO §3.1 eq. 10: clip-higher, ε_low 0.2, ε_high 0.28"
      trainer.num_mini_batches:
        source: "DAPO §4.1: 512-prompt rollouts in 32-prompt mini-batches = 16 steps"
        deviation: "scaled to the default 16-prompt batch: 16 mini-batches of one prompt"

A card entry covers its key and every key below it (``policy_loss`` covers
``policy_loss.clip_high``) unless a more specific entry exists. A mapping registered in
Python may carry its card as ``register(name, mapping, card={...})``. ``rlzoo explain``
prints each knob with its source; docs/algorithms/presets.md is generated from the cards.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from rlzoo.core.errors import ConfigError
from rlzoo.contract.kinds import COMPONENT_FIELDS
from rlzoo.contract.registry import Component

CARD_FILE_KEYS = frozenset({"description", "paper", "config", "card"})


@dataclass(frozen=True)
class CardEntry:
    """Where one knob's value comes from.

    :ivar source: the paper section / table / equation or reference implementation.
    :ivar deviation: why the preset's value differs from the source's, or ``""``.
    """

    source: str
    deviation: str = ""

    def text(self) -> str:
        return f"{self.source}; deviates: {self.deviation}" if self.deviation else self.source


@dataclass(frozen=True)
class Preset:
    """A preset as the config loader and ``rlzoo explain`` see it.

    :ivar name: the preset's name (``algo=name``).
    :ivar config: the config keys it sets (nested mapping).
    :ivar card: dotted key -> :class:`CardEntry` (empty for a preset without a card).
    :ivar description: one line.
    :ivar paper: its reference, or ``None``.
    :ivar package: the distribution that registered it.
    """

    name: str
    config: dict[str, Any]
    card: dict[str, CardEntry] = field(default_factory=dict)
    description: str = ""
    paper: str | None = None
    package: str = ""

    def entry_for(self, key: str) -> CardEntry | None:
        """The card entry of dotted ``key``: its own, or that of the closest enclosing key."""
        covering = self.card_key_for(key)
        return self.card[covering] if covering is not None else None

    def card_key_for(self, key: str) -> str | None:
        """The card key whose entry covers dotted ``key``: ``key`` itself or the closest enclosing key."""
        parts = key.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in self.card:
                return ".".join(parts[:end])
        return None

    def set_keys(self) -> list[str]:
        """The dotted keys the preset sets (a component choice counts as one key)."""
        return _leaf_keys(self.config)

    def stale_card_entries(self) -> list[str]:
        """One line per card entry that covers no key the preset sets (a typo, or a knob
        the preset no longer sets): ``rlzoo explain`` would show its source nowhere."""
        keys = self.set_keys()
        return [f"card entry {entry!r} names no key the preset sets (it sets {', '.join(keys) or 'none'})"
                for entry in self.card
                if not any(k == entry or k.startswith(entry + ".") or entry.startswith(k + ".") for k in keys)]


def _leaf_keys(data: Any, prefix: str = "") -> list[str]:
    keys: list[str] = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path not in COMPONENT_FIELDS and path != "extensions":
            keys.extend(_leaf_keys(value, path + "."))
        else:
            keys.append(path)
    return keys


def card_problems(raw: Any) -> tuple[dict[str, CardEntry], list[str]]:
    """The well-formed entries of a preset's raw ``card`` and one line per malformed one."""
    if raw is None:
        return {}, []
    if not isinstance(raw, dict):
        return {}, ["'card' must map dotted config keys to sources"]
    card, problems = {}, []
    for key, value in raw.items():
        if isinstance(value, str):
            card[str(key)] = CardEntry(source=value)
        elif isinstance(value, dict) and set(value) <= {"source", "deviation"} and "source" in value:
            card[str(key)] = CardEntry(source=str(value["source"]), deviation=str(value.get("deviation", "")))
        else:
            problems.append(f"card entry {key!r} must be a string or {{source: ..., deviation: ...}}")
    return card, problems


def _card(raw: Any, where: str) -> dict[str, CardEntry]:
    card, problems = card_problems(raw)
    if problems:
        raise ConfigError(f"{where}: {'; '.join(problems)}")
    return card


def load_preset(component: Component) -> Preset:
    """The preset registered as ``component`` (a mapping, a card mapping, or a YAML path).

    :raises ConfigError: an unreadable file, a value that is not a mapping, a malformed card
        (the preset and its package named; every malformed card entry).
    """
    where = preset_label(component)
    value, card, description, paper = read_preset(component, where)
    return Preset(name=component.name, config=copy.deepcopy(value), card=_card(card, where), description=description,
                  paper=paper, package=component.package)


def preset_label(component: Component) -> str:
    """How errors name a preset: ``algorithm preset 'name' (package dist)``."""
    return f"algorithm preset {component.name!r} (package {component.package or component.plugin or '?'})"


def read_preset(component: Component, where: str) -> tuple[dict[str, Any], Any, str, str | None]:
    """The preset's config keys, its raw card, description and paper, unchecked.

    :raises ConfigError: an unreadable file, a value that is not a mapping (``where`` names the preset).
    """
    value = component.fn
    if isinstance(value, (str, Path)):
        path = Path(value)
        try:
            value = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{where}: cannot read {path}: {exc}") from exc
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value)
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} is a {type(value).__name__}, not a mapping of config keys")
    card = component.meta.get("card")
    description, paper = component.description, component.paper
    if "config" in value and set(value) <= CARD_FILE_KEYS:
        card = value.get("card") or {}
        description = value.get("description", description) or description
        paper = value.get("paper", paper) or paper
        value = value["config"] or {}
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: 'config' must be a mapping of config keys")
    return value, card, description, paper


def read_card_file(path: str | Path) -> dict[str, Any]:
    """``description`` and ``paper`` of a preset card file (for registration)."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    return {"description": data.get("description", ""), "paper": data.get("paper")}
