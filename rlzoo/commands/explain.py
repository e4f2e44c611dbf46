"""``rlzoo explain`` and ``rlzoo diff``: a run's knobs with their provenance, and its plan.

Every algorithmic knob of the resolved config is listed with its value, the layer that set
it (``defaults``, ``preset dapo``, ``--config run.yaml``, ``command line``, ``default of
ppo_clip``) and, when a preset set it, the preset card's source and deviation. Then the
run plan (models, passes, KL placement and units, aggregation, update structure) and its
warnings for choices that cannot act. ``diff`` resolves two configs and lists the knobs
that differ, each side with its source. docs/algorithms/presets.md is
:func:`presets_markdown`'s output, ``configs/default.yaml`` :func:`default_yaml_text`'s and
docs/config.md's key tables :func:`keys_markdown_text`'s (tests check all three are current).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from rlzoo.config import key_docs
from rlzoo.config.key_record import show
from rlzoo.config.keys import TABLE, explained_keys, key_records
from rlzoo.contract.kinds import COMPONENT_FIELDS
from rlzoo.plan.planner import load_config
from rlzoo.plan.settings import TinyModel
from rlzoo.config.resolved import ResolvedConfig
from rlzoo.config.preset_cards import Preset, load_preset
from rlzoo.contract.registry import Registry



@dataclass(frozen=True)
class Knob:
    """One config value and its provenance.

    :ivar key: dotted key (a component's name is ``<path>.name``).
    :ivar value: the resolved value.
    :ivar source: the layer that set it.
    :ivar note: the preset card's source (and deviation), when a preset set it.
    :ivar unused: why the value cannot act in this run, or ``""``.
    :ivar card_key: the card entry ``note`` comes from (``advantage`` for ``advantage.lam``), or ``""``.
    """

    key: str
    value: Any
    source: str
    note: str = ""
    unused: str = ""
    card_key: str = ""


TINY_SHAPE = frozenset(f.name for f in dataclasses.fields(TinyModel)) - {"max_positions"}
"""The ``model.*`` keys of the embedded tiny model's shape (read only without ``model.path``)."""

EXPANDED_LISTS = ("rollout_correction",)
"""Lists of component choices shown one row per parameter (``rollout_correction[0].threshold``)."""


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, list) and prefix[:-1] in EXPANDED_LISTS and all(isinstance(v, dict) for v in data):
        out: dict[str, Any] = {}
        for i, value in enumerate(data):
            out.update(_flatten(value, f"{prefix[:-1]}[{i}]."))
        return out
    if isinstance(data, dict):
        out = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: data}


def _in_sections(key: str) -> bool:
    """``key`` is an algorithmic knob (its record's ``explain``, :func:`rlzoo.config.keys.explained_keys`),
    or a parameter of a component chosen by one."""
    return any(key == s or key.startswith((s + ".", s + "[")) for s in explained_keys())


def _unused(key: str, resolved: ResolvedConfig) -> str:
    plan = resolved.plan
    if plan.kl is None and key.startswith("kl.") and key != "kl.coef":
        return "kl.coef = 0: KL is off"
    if key.startswith("value_loss.") and "critic" not in plan.needs:
        return "no critic in this run"
    if key == "trainer.critic_lr" and "critic" not in plan.needs:
        return "no critic in this run"
    if key in ("eval.every", "eval.n", "eval.threshold", "eval.at_start") and int(resolved.cfg.eval.size) == 0:
        return "eval.size = 0: no evaluation"
    if key.removeprefix("model.") in TINY_SHAPE and resolved.cfg.model.path:
        return "model.path is set: the embedded model is not built"
    return ""


def knobs(resolved: ResolvedConfig, preset: Preset | None) -> list[Knob]:
    """The algorithmic knobs of ``resolved``, in config order, with provenance."""
    values = _flatten(OmegaConf.to_container(resolved.cfg, resolve=False))
    out = []
    for key, value in values.items():
        if not _in_sections(key):
            continue
        source_key = key if key in resolved.sources else key.split("[")[0]
        source = resolved.sources.get(source_key, "defaults")
        note, card_key = "", ""
        if preset is not None and source == f"preset {preset.name}":
            card_key = preset.card_key_for(key.removesuffix(".name")) or ""
            note = preset.card[card_key].text() if card_key else ""
        out.append(Knob(key=key, value=value, source=source, note=note, unused=_unused(key, resolved),
                        card_key=card_key))
    return out


def shown_notes(rows: list[Knob | None]) -> list[str]:
    """The note to print beside each row: a card entry's text on the first row it covers,
    then ``source: see <that row's key>`` on the others (a component's card entry covers
    every parameter of it), so a long source is printed once. ``None`` rows get ``""``."""
    first: dict[str, str] = {}
    out = []
    for knob in rows:
        if knob is None or not knob.note:
            out.append("")
        elif knob.card_key in first:
            out.append(f"source: see {first[knob.card_key]}")
        else:
            first[knob.card_key] = knob.key
            out.append(knob.note)
    return out


def _preset_of(resolved: ResolvedConfig, registry: Registry) -> Preset | None:
    algo = resolved.cfg.algo
    return load_preset(registry.get("algorithm", str(algo))) if algo else None


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in value.items()) + "}"
    return "null" if value is None else str(value)


def explain(resolved: ResolvedConfig, registry: Registry) -> str:
    """The text ``rlzoo explain`` prints: knobs with provenance, then the run plan."""
    preset = _preset_of(resolved, registry)
    lines = []
    if preset is not None:
        paper = f" ({preset.paper})" if preset.paper else ""
        lines += [f"# algo={preset.name}: {preset.description}{paper}", ""]
    rows = knobs(resolved, preset)
    width = max((len(k.key) for k in rows), default=0)
    value_width = min(max((len(_show(k.value)) for k in rows), default=0), 28)
    lines.append("# knobs: value  [set by]  source")
    for knob, note in zip(rows, shown_notes(rows)):
        tail = f"  {note}" if note else ""
        if knob.unused:
            tail += f"  (unused: {knob.unused})"
        lines.append(f"{knob.key:<{width}}  {_show(knob.value):<{value_width}}  [{knob.source}]{tail}")
    lines += ["", resolved.plan.render().rstrip()]
    return "\n".join(lines) + "\n"


def diff(a: ResolvedConfig, b: ResolvedConfig, registry: Registry, labels: tuple[str, str] = ("A", "B")) -> str:
    """The knobs and plan lines that differ between two resolved configs."""
    knobs_a = {k.key: k for k in knobs(a, _preset_of(a, registry))}
    knobs_b = {k.key: k for k in knobs(b, _preset_of(b, registry))}
    keys = [k for k in knobs_a if k in knobs_b] + [k for k in knobs_a if k not in knobs_b] + \
        [k for k in knobs_b if k not in knobs_a]
    lines = [f"| knob | {labels[0]} | {labels[1]} |", "|---|---|---|"]
    differ = [key for key in keys if key not in knobs_a or key not in knobs_b
              or knobs_a[key].value != knobs_b[key].value]
    notes_a = shown_notes([knobs_a.get(key) for key in differ])
    notes_b = shown_notes([knobs_b.get(key) for key in differ])

    def cell(knob: Knob | None, note: str) -> str:
        if knob is None:
            return "—"
        note = f"; {note}" if note else ""
        unused = f" (unused: {knob.unused})" if knob.unused else ""
        return f"`{_show(knob.value)}` [{knob.source}{note}]{unused}".replace("|", "\\|")

    for key, note_a, note_b in zip(differ, notes_a, notes_b):
        lines.append(f"| `{key}` | {cell(knobs_a.get(key), note_a)} | {cell(knobs_b.get(key), note_b)} |")
    plan_a, plan_b = _plan_lines(a.plan.render()), _plan_lines(b.plan.render())
    only_a = _with_sections([line for line in plan_a if line not in plan_b])
    only_b = _with_sections([line for line in plan_b if line not in plan_a])
    if len(lines) == 2 and not only_a and not only_b:
        return "the two configs resolve to the same knobs and plan\n"
    lines += ["", "# plan lines only in " + labels[0], *only_a, "", "# plan lines only in " + labels[1], *only_b]
    return "\n".join(lines) + "\n"


def _plan_lines(text: str) -> list[tuple[str, str]]:
    """The rendered plan's lines, each with the heading of its section: the last unindented
    line's text up to its colon (an unindented line heads its own section)."""
    out, section = [], ""
    for line in text.splitlines():
        if line and not line[0].isspace():
            section = line.split(":")[0] + ":" if ":" in line else line
        out.append((section, line))
    return out


def _with_sections(lines: list[tuple[str, str]]) -> list[str]:
    """Differing plan lines, each indented one under its section's heading (printed once,
    before the first of its lines, unless the differing line is the heading line itself)."""
    out, last = [], None
    for section, line in lines:
        if line[:1].isspace() and section != last:
            out.append(section)
        last = section
        out.append(line)
    return out


def presets_markdown(registry: Registry, package: str = "rlzoo") -> str:
    """docs/algorithms/presets.md: every preset of ``package`` with each knob it sets, its
    value, source and deviation, and the update structure its plan gives."""
    lines = ["# Algorithm presets", "",
             "Generated by `rlzoo explain --presets-markdown` from the preset cards in "
             "`configs/algo/` and the table of verl's bypass presets in `plugins/presets.py` (a test "
             "checks this page is current). Each preset is its paper's "
             "recipe scaled to the embedded default task (16 prompts × 8 completions a step, "
             "responses of at most 7 tokens, a 0.12 M-parameter model on a CPU); every knob "
             "it sets names its source, and where the preset's value differs from the source "
             "the reason is given. `rlzoo explain algo=NAME` prints the same with the whole "
             "run plan; `rlzoo diff algo=A algo=B` compares two.", ""]
    for component in registry.components("algorithm"):
        if component.package != package:
            continue
        preset = load_preset(component)
        resolved = load_config(registry, [f"algo={preset.name}"])
        paper = f" ({preset.paper})" if preset.paper else ""
        lines += [f"## `{preset.name}`", "", f"{preset.description}{paper}", "",
                  "| knob | value | source | deviation |", "|---|---|---|---|"]
        values = {k.key: k.value for k in knobs(resolved, preset)}
        for key in preset.set_keys():
            shown = {k: v for k, v in values.items() if k == key or k.startswith((key + ".", key + "["))}
            value = _show(shown[key]) if key in shown else ", ".join(  # a list's knobs: [0].name=tis, ...
                f"{k[len(key):].removeprefix('.')}={_show(v)}" for k, v in shown.items())
            entry = preset.entry_for(key)
            source = entry.source if entry else "—"
            deviation = entry.deviation if entry and entry.deviation else ""
            cells = [cell.replace("|", "\\|").replace("\n", " ") for cell in (value, source, deviation)]
            lines.append(f"| `{key}` | {cells[0]} | {cells[1]} | {cells[2]} |")
        update = resolved.plan.update
        kl = resolved.plan.kl
        kl_text = ("off" if kl is None
                   else f"{kl.estimator.name} in the {kl.placement}, β {kl.coef} ({kl.controller.name})")
        lines += ["", f"Plan: {update.epochs} epoch(s) × {update.mini_batches} mini-batch(es) = "
                      f"{update.optimizer_steps} optimizer step(s) per rollout of {update.sequences} sequences; "
                      f"KL {kl_text}; models: {', '.join(resolved.plan.models)}.", ""]
        for warning in resolved.plan.warnings:
            lines += [f"Warning: {warning}", ""]
    return "\n".join(lines).rstrip() + "\n"


def default_preset_changes(registry: Registry) -> tuple[str, dict[str, Any]]:
    """The default preset's name and the keys it sets to another value than their record's
    default: dotted key -> its value (a component choice's name)."""
    keys = key_records()
    algo = str(keys["algo"].default)
    config = load_preset(registry.get("algorithm", algo)).config
    changed = {}
    for path, key in keys.items():
        node: Any = config
        for part in path.split("."):
            node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
        if node is KeyError:
            continue
        if path in COMPONENT_FIELDS:
            node = node.get("name", key.default) if isinstance(node, dict) else node
            default = key.default.get("name") if isinstance(key.default, dict) else key.default
        else:
            default = key.default
        if node != default:
            changed[path] = node
    return algo, changed


def default_yaml_text(registry: Registry) -> str:
    """``configs/default.yaml``: the key records, each key's comment noting what the default
    preset sets it to instead."""
    algo, changed = default_preset_changes(registry)
    return key_docs.default_yaml(TABLE, {path: f"{algo} sets {show(value)}" for path, value in changed.items()})


def keys_markdown_text(registry: Registry) -> str:
    """docs/config.md's key tables (the block between :data:`rlzoo.config.key_docs.BEGIN` and ``END``)."""
    algo, changed = default_preset_changes(registry)
    return key_docs.keys_markdown(key_records(), algo, changed)
