"""What a tool is: a Python callable plus the OpenAI function schema the model reads.

A :class:`Tool` is a function plus its OpenAI function schema, the dict a chat template
reads through ``tokenizer.apply_chat_template(messages, tools=[tool.schema, ...])``::

    {"type": "function", "function": {"name": ..., "description": ...,
                                      "parameters": {"type": "object", "properties": {...},
                                                     "required": [...]}}}

:func:`tool_from_callable` builds it from the signature and the Google-style docstring,
in the format of transformers' ``get_json_schema``; :func:`argument_error` checks a call's
arguments against it. This is the contract of the ``tool`` kind: the registry builds each
registered tool's schema here (:func:`registered_tool`), so a hint JSON cannot express
fails at registration, naming the plugin. Calling tools is :mod:`rlzoo.agents.tool_calls`.
"""

from __future__ import annotations

import inspect
import json
import pickle
import re
import types
from dataclasses import dataclass
from typing import Any, Callable, Literal, Union, get_args, get_origin, get_type_hints


NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""A valid tool name (OpenAI's function-name rule)."""


@dataclass(frozen=True)
class Tool:
    """A callable the policy may call.

    :ivar name: what the model calls it by (``[A-Za-z0-9_-]{1,64}``).
    :ivar fn: the function, called with the call's arguments as keywords.
    :ivar schema: its OpenAI function schema (``{"type": "function", "function": {...}}``).
    :ivar unsafe: run it in a child process with a time and memory limit (code execution,
        anything that can hang or exhaust memory).
    :ivar timeout_s: wall-time limit of one call, seconds.
    :ivar memory_mb: address space one call may add, MiB (``unsafe`` tools only).
    """

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]
    unsafe: bool = False
    timeout_s: float = 5.0
    memory_mb: int = 512


# --------------------------------------------------------------------------- schemas

_SCALARS: dict[Any, dict[str, Any]] = {
    int: {"type": "integer"}, float: {"type": "number"}, str: {"type": "string"}, bool: {"type": "boolean"},
    type(None): {"type": "null"}, list: {"type": "array"}, tuple: {"type": "array"}, dict: {"type": "object"},
    Any: {},
}
_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}
_SUPPORTED = ("int, float, str, bool, list[...], tuple[...], dict[str, ...], Literal[...], Optional[...] / "
              "X | None, unions of these, Any")


def _enum(values: list[Any]) -> dict[str, Any]:
    kinds = list(dict.fromkeys(_JSON_TYPES[type(v)] for v in values))
    return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": values}


def hint_schema(hint: Any) -> dict[str, Any]:
    """The JSON schema of a type hint, as transformers' ``get_json_schema`` writes it.

    :raises TypeError: a hint JSON cannot express (a class, ``tuple[X]``), naming the
        supported ones.
    """
    origin, args = get_origin(hint), get_args(hint)
    if origin is None:
        if hint in _SCALARS:
            return dict(_SCALARS[hint])
        raise TypeError(f"type hint {hint!r} has no JSON schema; supported: {_SUPPORTED}")
    if origin is Union or origin is types.UnionType:
        subtypes = [hint_schema(t) for t in args if t is not type(None)]
        if len(subtypes) == 1:
            out = subtypes[0]
        elif all(s.keys() == {"type"} and isinstance(s["type"], str) for s in subtypes):
            names = sorted({s["type"] for s in subtypes})
            out = {"type": names[0] if len(names) == 1 else names}
        else:
            out = {"anyOf": subtypes}
        if type(None) in args:
            out["nullable"] = True
        return out
    if origin is Literal:
        if not args or any(type(a) not in _JSON_TYPES for a in args):
            raise TypeError(f"type hint {hint!r}: Literal takes int, float, str, bool or None values")
        return _enum(list(args))
    if origin is list:
        return {"type": "array", "items": hint_schema(args[0])} if args else {"type": "array"}
    if origin is tuple:
        if len(args) == 1 or ... in args:
            raise TypeError(f"type hint {hint!r}: use list[...] for a sequence of one type")
        return {"type": "array", "prefixItems": [hint_schema(t) for t in args]} if args else {"type": "array"}
    if origin is dict:
        out = {"type": "object"}
        if len(args) == 2:
            out["additionalProperties"] = hint_schema(args[1])
        return out
    raise TypeError(f"type hint {hint!r} has no JSON schema; supported: {_SUPPORTED}")


_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Return|Yields|Raises|Examples?|Notes?|Attributes):\s*$")
_ARG = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """``(description, {argument: description})`` of a Google-style docstring: the
    description is its first paragraph (lines joined by spaces), the arguments come from the
    ``Args:`` section (``name: text`` or ``name (type): text``; deeper-indented lines
    continue the text)."""
    lines = inspect.cleandoc(doc or "").splitlines()
    paragraph: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line.strip()):
            break
        paragraph.append(line.strip())
    described: dict[str, str] = {}
    in_args, indent, current = False, None, None
    for line in lines:
        stripped = line.strip()
        header = _SECTION.match(stripped)
        if header and (indent is None or len(line) - len(line.lstrip()) < indent):
            in_args, indent, current = header.group(1) in ("Args", "Arguments", "Parameters"), None, None
            continue
        if not in_args or not stripped:
            continue
        depth = len(line) - len(line.lstrip())
        indent = depth if indent is None else indent
        match = _ARG.match(stripped)
        if depth == indent and match:
            current = match.group(1).lstrip("*")
            described[current] = match.group(2).strip()
        elif depth > indent and current is not None:
            described[current] = f"{described[current]} {stripped}".strip()
        elif depth < indent:
            in_args = False
    return " ".join(paragraph), described


def function_schema(fn: Callable[..., Any], name: str | None = None, description: str | None = None) -> dict[str, Any]:
    """The OpenAI function schema of ``fn``: its parameters' types from the type hints (a
    parameter with a default is not ``required``), the descriptions from its docstring.

    Like transformers' ``get_json_schema`` except that the description is the docstring's
    first paragraph, a parameter without a description in ``Args:`` has no
    ``description`` key (the kit's :func:`rlzoo.testing.tool_checks.check_tool` asks for one), and
    the return value is left out (chat templates do not show it).

    :raises TypeError: a parameter without a type hint or with one JSON cannot express,
        ``*args`` / ``**kwargs``, or no description (no docstring and none given).
    """
    label = name or getattr(fn, "__name__", repr(fn))
    try:
        signature = inspect.signature(fn)
        hints = get_type_hints(fn.__call__ if not inspect.isroutine(fn) and not inspect.isclass(fn) else fn)
    except (TypeError, ValueError, NameError) as exc:
        raise TypeError(f"tool {label!r}: cannot read the signature of {fn!r} ({exc})") from exc
    summary, described = parse_docstring(inspect.getdoc(fn))
    properties: dict[str, Any] = {}
    required: list[str] = []
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"tool {label!r} takes *{parameter.name}: the model passes named arguments, "
                            f"so name each one with a type hint")
        if parameter.name not in hints:
            raise TypeError(f"tool {label!r}: parameter {parameter.name!r} has no type hint "
                            f"(the schema the model reads comes from it; supported: {_SUPPORTED})")
        try:
            prop = hint_schema(hints[parameter.name])
        except TypeError as exc:
            raise TypeError(f"tool {label!r}, parameter {parameter.name!r}: {exc}") from exc
        if parameter.name in described:
            prop["description"] = described[parameter.name]
        properties[parameter.name] = prop
        if parameter.default is parameter.empty:
            required.append(parameter.name)
    text = description or summary
    if not text:
        raise TypeError(f"tool {label!r} has no docstring: its first paragraph is the description the model "
                        f"reads (or pass description=...)")
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return {"type": "function", "function": {"name": label, "description": text, "parameters": parameters}}


def tool_from_callable(fn: Callable[..., Any], *, name: str | None = None, unsafe: bool = False,
                       timeout_s: float = 5.0, memory_mb: int = 512, description: str | None = None) -> Tool:
    """A :class:`Tool` whose schema comes from ``fn``'s signature and docstring
    (:func:`function_schema`).

    :param name: the name the model calls (default: ``fn.__name__``).
    :param unsafe: run each call in a child process (``fn`` must then be importable by
        reference: a module-level function).
    :param timeout_s: wall-time limit of one call (> 0).
    :param memory_mb: address space one call may add (> 0; ``unsafe`` only).
    :param description: overrides the docstring's first paragraph.
    :raises TypeError: see :func:`function_schema`; an ``unsafe`` ``fn`` that cannot be pickled.
    :raises ValueError: a bad name or limit, naming it.
    """
    name = name or getattr(fn, "__name__", "")
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(f"tool name {name!r} is not valid: 1 to 64 letters, digits, '_' or '-'")
    if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or not timeout_s > 0:
        raise ValueError(f"tool {name!r}: timeout_s must be a number > 0, got {timeout_s!r}")
    if not isinstance(memory_mb, int) or isinstance(memory_mb, bool) or memory_mb <= 0:
        raise ValueError(f"tool {name!r}: memory_mb must be an int > 0, got {memory_mb!r}")
    if unsafe:
        try:
            pickle.dumps(fn)
        except Exception as exc:  # noqa: BLE001 - pickle raises several types
            raise TypeError(f"tool {name!r} is unsafe, so it runs in a child process and its function must be "
                            f"importable by reference (a module-level function): {fn!r} cannot be pickled "
                            f"({exc})") from exc
    return Tool(name=name, fn=fn, schema=function_schema(fn, name, description), unsafe=bool(unsafe),
                timeout_s=float(timeout_s), memory_mb=memory_mb)


# --------------------------------------------------------------------------- arguments

_PY_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _show(value: Any) -> str:
    return json.dumps(value, default=repr)


def _type_error(schema: dict[str, Any], value: Any, where: str) -> str | None:
    """Why ``value`` does not fit ``schema`` (a JSON-schema subset: type, enum, nullable,
    anyOf, items, prefixItems, properties, required, additionalProperties), or ``None``."""
    if value is None and schema.get("nullable"):
        return None
    if "anyOf" in schema:
        if all(_type_error(option, value, where) for option in schema["anyOf"]):
            return f"{where}: {_show(value)} fits none of {json.dumps(schema['anyOf'])}"
        return None
    expected = schema.get("type")
    if expected is not None:
        names = expected if isinstance(expected, list) else [expected]
        if not any(_PY_TYPES.get(n, lambda v: True)(value) for n in names):
            return f"{where}: expected {' or '.join(names)}, got {_show(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where}: {_show(value)} is not one of {json.dumps(schema['enum'])}"
    if isinstance(value, list):
        if "prefixItems" in schema:
            items = schema["prefixItems"]
            if len(value) != len(items):
                return f"{where}: expected {len(items)} items, got {len(value)}"
            for i, (item_schema, item) in enumerate(zip(items, value)):
                if (error := _type_error(item_schema, item, f"{where}[{i}]")) is not None:
                    return error
        elif "items" in schema:
            for i, item in enumerate(value):
                if (error := _type_error(schema["items"], item, f"{where}[{i}]")) is not None:
                    return error
    if isinstance(value, dict):
        return _object_error(schema, value, where)
    return None


def _object_error(schema: dict[str, Any], value: dict[str, Any], where: str) -> str | None:
    properties = schema.get("properties", {})
    missing = [key for key in schema.get("required", []) if key not in value]
    if missing:
        return f"{where + ': ' if where else ''}missing required argument(s) {', '.join(map(repr, missing))}"
    extra = schema.get("additionalProperties", "properties" not in schema)
    for key, item in value.items():
        if key in properties:
            if (error := _type_error(properties[key], item, f"{where}.{key}" if where else key)) is not None:
                return error
        elif isinstance(extra, dict):
            if (error := _type_error(extra, item, f"{where}.{key}" if where else key)) is not None:
                return error
        elif not extra:
            takes = ", ".join(properties) or "no arguments"
            return f"{where + ': ' if where else ''}unexpected argument {key!r}; it takes {takes}"
    return None


def argument_error(tool: Tool, arguments: Any) -> str | None:
    """Why ``arguments`` do not fit ``tool``'s schema (missing required argument, unknown
    argument, wrong type, value outside an enum), or ``None`` when they do."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {_show(arguments)}"
    return _object_error(tool.schema["function"].get("parameters", {}), arguments, "")


# --------------------------------------------------------------------------- registration

TOOL_META = ("unsafe", "timeout_s", "memory_mb", "examples")
"""The keywords ``register`` takes for a tool, besides ``description``."""


def registered_tool(name: str, fn: Any, meta: dict[str, Any], description: str = "") -> Tool:
    """The :class:`Tool` a ``register(name, fn, unsafe=..., timeout_s=..., memory_mb=...,
    examples=[...], description=...)`` call describes; ``fn`` may be a ready :class:`Tool`
    (its schema as written; ``name`` must be its name). The model reads the docstring's
    description; ``description`` (the ``rlzoo list`` line) stands in only without one.
    ``examples`` (argument dicts the kit calls it with, :func:`rlzoo.testing.tool_checks.check_tool`)
    are checked against the schema.

    :raises TypeError, ValueError: what :func:`tool_from_callable` raises; unknown meta
        keys; an example that does not fit the schema.
    """
    unknown = sorted(set(meta) - set(TOOL_META))
    if unknown:
        raise ValueError(f"tool {name!r}: unknown register() keyword(s) {unknown}; a tool takes "
                         f"{', '.join(TOOL_META)} and description")
    if isinstance(fn, Tool):
        if fn.name != name or set(meta) - {"examples"}:
            raise ValueError(f"tool {name!r}: a registered Tool keeps its own name ({fn.name!r}) and limits")
        tool = fn
    else:
        limits = {k: meta[k] for k in ("unsafe", "timeout_s", "memory_mb") if k in meta}
        fallback = None if parse_docstring(inspect.getdoc(fn))[0] else (description or None)
        tool = tool_from_callable(fn, name=name, description=fallback, **limits)
    for example in meta.get("examples", ()):
        error = argument_error(tool, example)
        if error is not None:
            raise ValueError(f"tool {name!r}: example {example!r} does not fit its schema: {error}")
    return tool


def tool_from_component(component: Any) -> Tool:
    """The :class:`Tool` of a registered component of kind ``tool``
    (``registry.get("tool", name)``)."""
    return component.meta["tool"]


def registered_tools(registry: Any, names: list[str] | None = None) -> dict[str, Tool]:
    """Name -> :class:`Tool` for the registered tools ``names`` (aliases resolved), or every
    registered tool (kind ``tool``) when ``names`` is ``None``: the ``tools`` input of an
    environment (a :class:`ToolsByName`). An unknown name raises the registry's error listing
    the tools there are."""
    if registry is None:
        return ToolsByName()
    tools = [tool_from_component(registry.get("tool", name)) for name in (registry.names("tool") if names is None
                                                                          else names)]
    return ToolsByName({tool.name: tool for tool in tools})


class UnknownToolError(KeyError, ValueError):
    """An environment looked up a tool no tool is registered under. A ``KeyError`` (what a
    missing key is) and a ``ValueError``, which the config check of ``env`` turns into one
    error line before the run directory exists."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ToolsByName(dict):
    """Name -> :class:`Tool`: the ``tools`` input of an environment. Looking up a name that
    is not there raises :class:`UnknownToolError` listing the names that are."""

    def __missing__(self, name: str) -> Tool:
        raise UnknownToolError(f"no tool {name!r} is registered; registered tools: {', '.join(sorted(self)) or 'none'}"
                               " (rlzoo list --kind tool)")
