"""``rlzoo explain`` and ``rlzoo diff``: a run's knobs with their provenance, and its plan.

Every algorithmic knob of the resolved config is listed with its value, the layer that set
it (``defaults``, ``preset dapo``, ``--config run.yaml``, ``command line``, ``default of
ppo_clip``) and, when a preset set it, the preset card's source and deviation. Then the
run plan (models, passes, KL placement and units, aggregation, update structure) and its
warnings for choices that cannot act. ``diff`` resolves two configs and lists the knobs
that differ, each side with its source. docs/algorithms/presets.md is
:func:`presets_markdown`'s output (a test checks it is current).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from rlzoo.plan.planner import load_config
from rlzoo.config.resolved import ResolvedConfig
from rlzoo.config.preset_cards import Preset, load_preset
from rlzoo.contract.registry import Registry

SECTIONS = ("algo", "seed", "task", "reward", "model.path", "rollout", "env", "rollout_correction", "advantage",
            "policy_loss", "loss_agg", "value_loss", "kl", "trainer", "extensions", "eval")
"""The config keys (and subtrees) that define what a run does algorithmically."""

OPERATIONAL = {"trainer.device", "trainer.threads", "trainer.logprob_chunk_size", "trainer.logprob_keep_mb",
               "trainer.micro_batch_size"}
"""Knobs under ``trainer`` that change how fast a run goes, not what it computes."""


@dataclass(frozen=True)
class Knob:
    """One config value and its provenance.

    :ivar key: dotted key (a component's name is ``<path>.name``).
    :ivar value: the resolved value.
    :ivar source: the layer that set it.
    :ivar note: the preset card's source (and deviation), when a preset set it.
    :ivar unused: why the value cannot act in this run, or ``""``.
    """

    key: str
    value: Any
    source: str
    note: str = ""
    unused: str = ""


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
    return any(key == s or key.startswith((s + ".", s + "[")) for s in SECTIONS) and key not in OPERATIONAL


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
        note = ""
        if preset is not None and source == f"preset {preset.name}":
            entry = preset.entry_for(key.removesuffix(".name"))
            note = entry.text() if entry else ""
        out.append(Knob(key=key, value=value, source=source, note=note, unused=_unused(key, resolved)))
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
    for knob in rows:
        tail = f"  {knob.note}" if knob.note else ""
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
    for key in keys:
        left, right = knobs_a.get(key), knobs_b.get(key)
        if left is not None and right is not None and left.value == right.value:
            continue

        def cell(knob: Knob | None) -> str:
            if knob is None:
                return "—"
            note = f"; {knob.note}" if knob.note else ""
            unused = f" (unused: {knob.unused})" if knob.unused else ""
            return f"`{_show(knob.value)}` [{knob.source}{note}]{unused}".replace("|", "\\|")

        lines.append(f"| `{key}` | {cell(left)} | {cell(right)} |")
    plan_a = a.plan.render().splitlines()
    plan_b = b.plan.render().splitlines()
    only_a = [line for line in plan_a if line not in plan_b]
    only_b = [line for line in plan_b if line not in plan_a]
    if len(lines) == 2 and not only_a and not only_b:
        return "the two configs resolve to the same knobs and plan\n"
    lines += ["", "# plan lines only in " + labels[0], *only_a, "", "# plan lines only in " + labels[1], *only_b]
    return "\n".join(lines) + "\n"


def presets_markdown(registry: Registry, package: str = "rlzoo") -> str:
    """docs/algorithms/presets.md: every preset of ``package`` with each knob it sets, its
    value, source and deviation, and the update structure its plan gives."""
    lines = ["# Algorithm presets", "",
             "Generated by `rlzoo explain --presets-markdown` from the preset cards in "
             "`configs/algo/` (a test checks this page is current). Each preset is its paper's "
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
            shown = {k: v for k, v in values.items() if k == key or k.startswith(key + ".")}
            value = _show(shown[key]) if key in shown else ", ".join(
                f"{k[len(key) + 1:]}={_show(v)}" for k, v in shown.items())
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
