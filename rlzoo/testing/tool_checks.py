"""The testing kit's checks of a tool (kind ``tool``): for plugin authors' test suites.

::

    from rlzoo.api import check_tool, tool_from_callable

    def test_my_tool():
        check_tool(tool_from_callable(my_tool), examples=[{"city": "Paris"}])

:func:`rlzoo.api.check_component` runs it on a registered tool with the ``examples``
it registered. Each failure is an ``AssertionError`` naming the tool and what is wrong.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable
from typing import Any

from rlzoo.contract.tool_schema import NAME, Tool, argument_error
from rlzoo.agents.tool_calls import ToolCall, call_tool

_TYPES = ("string", "integer", "number", "boolean", "array", "object", "null")


def _check_property(label: str, key: str, prop: Any) -> None:
    assert isinstance(prop, dict), f"{label}: the schema of argument {key!r} is {prop!r}, not an object"
    types = prop.get("type", [])
    for name in types if isinstance(types, list) else [types]:
        assert name in _TYPES, f"{label}: argument {key!r} has type {name!r}; JSON schema types are {_TYPES}"
    assert isinstance(prop.get("description"), str) and prop["description"].strip(), (
        f"{label}: argument {key!r} has no description (the model reads it): describe it under "
        f"'Args:' in the docstring")


def check_schema(tool: Tool, label: str | None = None) -> None:
    """``tool.schema`` is an OpenAI function schema a chat template can render: JSON, named
    as the tool, a description, an object of described, typed parameters whose ``required``
    ones exist, and (for a plain function) exactly the function's parameters."""
    label = label or f"tool {tool.name!r}"
    schema = tool.schema
    try:
        assert json.loads(json.dumps(schema)) == schema, "it changes through JSON"
    except (TypeError, ValueError, AssertionError) as exc:
        raise AssertionError(f"{label}: the schema is not plain JSON ({exc})") from exc
    assert schema.get("type") == "function" and isinstance(schema.get("function"), dict), (
        f'{label}: the schema must be {{"type": "function", "function": {{...}}}}, got keys {sorted(schema)}')
    function = schema["function"]
    assert function.get("name") == tool.name and NAME.match(tool.name), (
        f"{label}: the schema's name {function.get('name')!r} must be the tool's name, [A-Za-z0-9_-]{{1,64}}")
    assert isinstance(function.get("description"), str) and function["description"].strip(), (
        f"{label}: the schema has no description")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    assert parameters.get("type") == "object" and isinstance(parameters.get("properties", {}), dict), (
        f'{label}: "parameters" must be {{"type": "object", "properties": {{...}}}}')
    properties = parameters.get("properties", {})
    for key, prop in properties.items():
        _check_property(label, key, prop)
    required = parameters.get("required", [])
    assert isinstance(required, list) and len(set(required)) == len(required), (
        f"{label}: 'required' must be a list of distinct names, got {required!r}")
    assert set(required) <= set(properties), (
        f"{label}: required argument(s) {sorted(set(required) - set(properties))} are not in 'properties'")
    if inspect.isfunction(tool.fn):
        signature = inspect.signature(tool.fn).parameters
        assert list(signature) == list(properties), (
            f"{label}: the schema's arguments {list(properties)} are not the function's {list(signature)}")
        without_default = [k for k, p in signature.items() if p.default is p.empty]
        assert sorted(without_default) == sorted(required), (
            f"{label}: 'required' {required} must be the function's parameters without a default "
            f"{without_default}")


def sample_value(schema: dict[str, Any]) -> Any:
    """A value that fits ``schema`` (the first enum value, the first ``anyOf`` option, a
    small value of the first non-null type)."""
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return sample_value(schema["anyOf"][0])
    types = schema.get("type", "string")
    types = [t for t in (types if isinstance(types, list) else [types]) if t != "null"] or ["null"]
    kind = types[0]
    if kind == "array":
        if "prefixItems" in schema:
            return [sample_value(item) for item in schema["prefixItems"]]
        return [sample_value(schema["items"])] if "items" in schema else []
    if kind == "object":
        return {key: sample_value(prop) for key, prop in schema.get("properties", {}).items()}
    return {"string": "1", "integer": 1, "number": 1.5, "boolean": True, "null": None}[kind]


def _call_twice(tool: Tool, label: str, arguments: dict[str, Any]) -> tuple[str, bool]:
    first = call_tool(tool, ToolCall(tool.name, arguments))
    assert isinstance(first, tuple) and len(first) == 2 and isinstance(first[0], str) and isinstance(
        first[1], bool), f"{label}: call_tool returned {first!r}, not (observation, is_error)"
    second = call_tool(tool, ToolCall(tool.name, arguments))
    assert first == second, (f"{label} is not deterministic: called twice with {arguments!r} it answered "
                             f"{first!r} and then {second!r}")
    return first


def check_tool(tool: Tool, label: str | None = None, examples: Iterable[dict[str, Any]] = ()) -> None:
    """A tool keeps the contract: a valid schema (:func:`check_schema`); called with
    arguments that fit its schema (every argument, then the required ones only) it answers
    an observation, never raises, and answers the same again; each of ``examples`` (argument
    dicts) fits the schema and succeeds (``is_error`` false); a call missing a required
    argument or naming an unknown one is an error observation, not a call of the function.

    :raises AssertionError: naming the tool and the broken rule.
    """
    label = label or f"tool {tool.name!r}"
    check_schema(tool, label)
    parameters = tool.schema["function"].get("parameters", {})
    full = sample_value({"type": "object", **parameters})
    required = {key: full[key] for key in parameters.get("required", [])}
    for arguments in (full, required):
        error = argument_error(tool, arguments)
        assert error is None, f"{label}: arguments {arguments!r} built from its own schema are refused: {error}"
        _call_twice(tool, label, arguments)
    for example in examples:
        error = argument_error(tool, example)
        assert error is None, f"{label}: example {example!r} does not fit its schema: {error}"
        observation, is_error = _call_twice(tool, label, example)
        assert not is_error, f"{label}: example {example!r} failed: {observation}"
    if required:
        missing = dict(required)
        missing.pop(next(iter(required)))
        observation, is_error = call_tool(tool, ToolCall(tool.name, missing))
        assert is_error and "missing required" in observation, (
            f"{label}: a call without required argument {next(iter(required))!r} answered {observation!r}")
    observation, is_error = call_tool(tool, ToolCall(tool.name, {**full, "no_such_argument_": 1}))
    extra_allowed = parameters.get("additionalProperties", "properties" not in parameters)
    assert is_error or extra_allowed, f"{label}: a call with an unknown argument answered {observation!r}"
