"""Tool calls: reading the calls out of a completion and running them.

:func:`parse_tool_calls` reads the calls out of a completion, in the style the tokenizer's
chat template teaches (:func:`tool_call_style`): ``hermes`` (``<tool_call>{json}</tool_call>``,
Qwen and Hermes templates) or ``plain`` (``CALL name(arg=value)`` lines, for models and
templates without tool support). :func:`call_tool` runs one call and returns
``(observation, is_error)``: whatever goes wrong (unknown tool, arguments that do not fit
the schema, an exception, a timeout, a tool that exhausts its memory) becomes an
observation the model reads, never an exception. What a tool is (:class:`Tool`, its schema)
is :mod:`rlzoo.contract.tool_schema`; tools registered by plugins are kind ``tool``
(:func:`rlzoo.contract.hookspecs.rlzoo_register_tools`). docs/agents.md is the guide.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

from rlzoo.agents.sandbox import run_in_subprocess, run_in_thread
from rlzoo.contract.tool_schema import Tool, argument_error

STYLES = ("hermes", "plain")
"""The tool-call formats :func:`parse_tool_calls` reads."""


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: the tool's name and its arguments (parsed JSON)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def call_tool(tool: Tool | None, call: ToolCall, tools: dict[str, Tool] | None = None) -> tuple[str, bool]:
    """Run one call: ``(observation, is_error)``. Never raises for anything the tool or
    the call does; every failure is an ``error: ...`` observation the model reads.

    :param tool: the tool the call names, or ``None`` to look it up in ``tools`` (an
        unknown name is an error observation listing the tools there are).
    :param call: the parsed call (:func:`parse_tool_calls`).
    :param tools: name -> tool, for the lookup and for the list of names.
    """
    if tool is None or tool.name != call.name:
        known = tools if tools is not None else ({tool.name: tool} if tool is not None else {})
        tool = known.get(call.name)
        if tool is None:
            return f"error: unknown tool {call.name!r}; the tools are: {', '.join(sorted(known)) or 'none'}", True
    error = argument_error(tool, call.arguments)
    if error is not None:
        return f"error: bad arguments for tool {tool.name!r}: {error}", True
    if tool.unsafe:
        return run_in_subprocess(tool.name, tool.fn, dict(call.arguments), tool.timeout_s, tool.memory_mb)
    return run_in_thread(tool.name, tool.fn, dict(call.arguments), tool.timeout_s)


# --------------------------------------------------------------------------- parsing

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_PLAIN = re.compile(r"^[ \t]*CALL[ \t]+(.*?)[ \t]*$", re.MULTILINE)
_JSON_NAMES = {"true": True, "false": False, "null": None}


MAX_NESTING = 100
"""The deepest brackets a hermes tool call may nest (a call's arguments are plain values;
Python's JSON reader recurses once per level and would fail near 1000)."""


def _nesting(text: str) -> int:
    """The deepest nesting of ``[`` / ``{`` in JSON ``text``, outside strings (malformed text too)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _load_json(text: str, what: str) -> tuple[Any, str | None]:
    """``(json.loads(text), None)``, or ``(None, error observation)`` naming ``what``: text
    that is not JSON, or that nests deeper than :data:`MAX_NESTING` (refused before it is
    parsed, so no depth reaches the parser's recursion limit)."""
    if _nesting(text) > MAX_NESTING:
        return None, f"error: {what} is not valid JSON for a tool call (brackets nested deeper than {MAX_NESTING})"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"error: {what} is not valid JSON ({exc.msg} at character {exc.pos})"
    except RecursionError:  # a stack already deep when the call is parsed
        return None, f"error: {what} is not valid JSON for a tool call (nested too deeply)"


def _hermes_call(body: str) -> ToolCall | str:
    shown = body.strip()
    payload, error = _load_json(shown, f"the tool call {shown[:200]!r}")
    if error is not None:
        return error
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return (f"error: the tool call {shown[:200]!r} must be a JSON object "
                f'{{"name": "<tool>", "arguments": {{...}}}}')
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        parsed, error = _load_json(arguments, f"the arguments of the call to {payload['name']!r}")
        arguments = arguments if error is not None else parsed  # not JSON: refused as not an object below
    if not isinstance(arguments, dict):
        return f"error: the arguments of the call to {payload['name']!r} must be a JSON object, got {arguments!r}"
    return ToolCall(payload["name"], arguments)


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    return ast.literal_eval(node)


def _plain_call(line: str) -> ToolCall | str:
    usage = 'write CALL name(argument=value, ...), e.g. CALL calculator(expression="12*34")'
    try:
        node = ast.parse(line, mode="eval").body
    except SyntaxError as exc:
        return f"error: cannot read the tool call {line[:200]!r} ({exc.msg}); {usage}"
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return f"error: the tool call {line[:200]!r} is not a call of a tool by name; {usage}"
    if node.args or any(k.arg is None for k in node.keywords):
        return f"error: the tool call {line[:200]!r} must name its arguments; {usage}"
    arguments = {}
    for keyword in node.keywords:
        try:
            arguments[keyword.arg] = json.loads(json.dumps(_literal(keyword.value)))  # tuples -> lists
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return (f"error: argument {keyword.arg!r} of the tool call {line[:200]!r} is not a literal value "
                    f"(a string, number, true/false, null, list or dict)")
    return ToolCall(node.func.id, arguments)


def parse_tool_calls(text: str, style: str) -> list[ToolCall] | str:
    """The tool calls in a completion, in order (``[]``: none, the completion is a final
    answer), or an error observation for the model when one is malformed.

    ``style="hermes"`` (Qwen2.5/3, Hermes templates): each call is
    ``<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>``
    (``arguments`` may be a JSON string holding the object); a ``<tool_call>`` left open is
    malformed.

    ``style="plain"`` (no tool support in the template): each call is a line of its own,
    ``CALL name(argument=value, ...)``, with named arguments whose values are literals
    (strings in quotes, numbers, ``true``/``false``/``null`` or Python's ``True``/``False``/
    ``None``, lists, dicts); the rest of the text is ignored.

    :raises ValueError: an unknown ``style``.
    """
    if style == "hermes":
        calls = [_hermes_call(body) for body in _HERMES.findall(text)]
        if text.count("<tool_call>") != len(calls):
            return "error: a <tool_call> is not closed with </tool_call>"
    elif style == "plain":
        calls = [_plain_call(line) for line in _PLAIN.findall(text)]
    else:
        raise ValueError(f"unknown tool-call style {style!r}; styles are {', '.join(STYLES)}")
    for call in calls:
        if isinstance(call, str):
            return call
    return calls  # type: ignore[return-value]


def tool_call_style(tokenizer: Any) -> str:
    """``"hermes"`` when the tokenizer's chat template renders tools and teaches the
    ``<tool_call>`` format (Qwen2.5/3, Hermes), else ``"plain"``: no template, a template
    without tools, or one with another tool format (Llama 3.1's JSON, Mistral's
    ``[TOOL_CALLS]``, which :func:`parse_tool_calls` does not read)."""
    template = getattr(tokenizer, "chat_template", tokenizer if isinstance(tokenizer, str) else None)
    if isinstance(template, dict):  # named templates: the one for tool use, else the default
        template = template.get("tool_use") or template.get("default")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("tool_use") or named.get("default")
    if isinstance(template, str) and "tools" in template and "<tool_call>" in template:
        return "hermes"
    return "plain"
