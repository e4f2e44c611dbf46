"""Parameter introspection for tools and people: ``rlzoo list --json`` and ``rlzoo explain``.

:func:`describe_params` reads a component's parameter dataclass: each field's type,
default, attribute docstring and the range it states.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
import typing
from typing import Any

from rlzoo.contract.registry import Component

_RANGE_PATTERNS = (
    re.compile(r"\bin\s+([\[(][^\])]*[\])])"),                                # "in (0, 1)", "in [0, 1]"
    # "; > 0", "must be > 1": a bound that ends the clause (not "A < 0 the ...", "> 1 + c")
    re.compile(r"(?:^|;\s*|must be\s+)((?:>=|<=|>|<|≥|≤)\s*-?\d+(?:\.\d+)?(?:e-?\d+)?)(?=\.?(?:$|[;,)]|\s\())"),
    re.compile(r"\((\d+)\.\.(\d+)\)"),                                        # "(1..30)"
)


def _field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass (the string right after each field)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, following in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant) and \
                isinstance(following.value.value, str):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def describe_params(component: Component) -> list[dict[str, Any]]:
    """The component's parameters for tools and people (``rlzoo list --json``): ``name``,
    ``type``, ``default``, ``doc`` (the field's docstring) and ``range`` (a field's
    ``metadata["range"]``, else the interval its docstring states, e.g. ``(0, 1)``,
    ``> 0``; ``None`` when it states none)."""
    if component.params is None:
        return []
    try:
        hints = typing.get_type_hints(component.params)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: fall back to its text
        hints = {}
    docs = _field_docs(component.params)
    out = []
    for f in dataclasses.fields(component.params):
        hint = hints.get(f.name, f.type)
        type_name = hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        if isinstance(default, tuple):
            default = list(default)
        if not isinstance(default, (str, int, float, bool, list, dict, type(None))):
            default = repr(default)
        doc = docs.get(f.name)
        span = f.metadata.get("range")
        for pattern in _RANGE_PATTERNS if span is None and doc else ():
            match = pattern.search(doc)
            if match:
                span = f"[{match.group(1)}, {match.group(2)}]" if pattern.groups == 2 else match.group(1)
                break
        out.append({"name": f.name, "type": type_name, "default": default, "doc": doc, "range": span})
    return out
