"""configs/default.yaml tells the truth: every key the default preset replaces with another
value says so, with the value the default run uses."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from rlzoo.config.layers import default_config_path
from rlzoo.plan.planner import load_config
from rlzoo.run.resume import with_added_keys
from rlzoo.config.schema import ADDED_KEYS
from zoo import REGISTRY


def _comments(text: str) -> dict[str, str]:
    """Dotted key -> the comment on its line, for a YAML file of nested mappings."""
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        match = re.match(r"^( *)([A-Za-z_][\w-]*):(.*)$", line)
        if not match:
            continue
        indent, key, rest = len(match.group(1)), match.group(2), match.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [key])
        comments[path] = rest.split("#", 1)[1].strip() if "#" in rest else ""
        stack.append((indent, key))
    return comments


def _leaves(data: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, dict) and "name" not in value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _used(resolved, key: str) -> object:
    value = resolved.cfg
    for part in key.split("."):
        value = value[part]
    return value["name"] if hasattr(value, "keys") and "name" in value else value


def test_every_key_the_default_preset_replaces_says_so_with_its_value() -> None:
    text = default_config_path().read_text()
    comments, written = _comments(text), _leaves(yaml.safe_load(text))
    resolved = load_config(REGISTRY, [])
    algo = written["algo"]
    by_preset = {key for key in written
                 if resolved.sources.get(key, resolved.sources.get(f"{key}.name")) == f"preset {algo}"}
    replaced = {key for key in by_preset if _used(resolved, key) != written[key]}
    assert replaced, "the default preset replaces nothing? (then this test checks nothing)"
    for key in replaced:
        assert f"{algo} sets {_used(resolved, key)}" in comments[key], \
            f"configs/default.yaml: {key} is {written[key]!r} there but the default run uses {_used(resolved, key)!r}"
    noted = {key for key, comment in comments.items() if f"{algo} sets " in comment}
    assert noted <= by_preset, f"notes on keys the preset does not set: {sorted(noted - by_preset)}"


def test_the_comment_reader_follows_nesting() -> None:
    text = "a: 1  # one\nb:\n  c: x  # see\n  d:\n    e: 2 # deep\nf: 3\n"
    assert _comments(text) == {"a": "one", "b": "", "b.c": "see", "b.d": "", "b.d.e": "deep", "f": ""}


def test_every_key_added_since_0_2_0_has_the_value_old_runs_ran_with() -> None:
    """A run saved by an earlier version lacks the keys added since; ``resume=`` fills them
    from ``schema.ADDED_KEYS`` (else the resume fails on a missing key). The fixture is
    ``configs/default.yaml`` at 896f598 (the last commit before the keys of issues 20-26)."""
    old = yaml.safe_load((Path(__file__).parent / "data" / "default_896f598.yaml").read_text())
    now = _leaves(yaml.safe_load(default_config_path().read_text()))
    added = sorted(set(now) - set(_leaves(old)))
    assert added, "nothing added since 896f598? (then this test checks nothing)"
    missing = [key for key in added if key not in ADDED_KEYS and not any(k.startswith(f"{key}.") for k in ADDED_KEYS)]
    assert not missing, f"keys added without an entry in schema.ADDED_KEYS: {missing}"
    filled = _leaves(with_added_keys(old))
    for key in added:
        assert key in filled, key
