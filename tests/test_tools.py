"""Tools (rlzoo/agents/tool_calls.py, rlzoo/agents/sandbox.py, plugins/tools.py, rlzoo/testing/tool_checks.py): schemas
from signatures, tool-call parsing in both styles, error observations, the child process's
time and memory limits, registration as kind ``tool`` and the kit's check."""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time
from pathlib import Path
from typing import Any, Literal, Optional

import pytest
import tool_fns

from rlzoo.core.errors import PluginError, RefusedComponentError, UnknownComponentError
from rlzoo.contract.loading import build_registry, make_plugin_manager, module_plugin
from rlzoo.api import check_component, check_tool
from rlzoo.contract.tool_schema import Tool, tool_from_callable
from rlzoo.agents import sandbox
from rlzoo.agents.tool_calls import ToolCall, call_tool, parse_tool_calls, tool_call_style
from rlzoo.contract.tool_schema import registered_tools
from rlzoo_plugins.tools import calculator

ROOT = Path(__file__).parents[1]


# --------------------------------------------------------------------------- schemas

def multiply(x: float, y: float) -> float:
    """A function that multiplies two numbers

    Args:
        x: The first number to multiply
        y: The second number to multiply
    """
    return x * y


def search(query: str, limit: int = 10, exact: bool = False, tags: Optional[list[str]] = None,
           mode: Literal["fast", "slow"] = "fast", weights: dict[str, float] | None = None,
           anything: Any = None, pair: tuple[int, str] = (0, "")) -> list:
    """Search the notes.

    Returns the matching notes, best first. This second paragraph is not
    part of the description.

    Args:
        query (str): The words to look
            for, over two lines.
        limit: How many results at most.
        exact: Match whole words only.
        tags: Only notes with one of these tags.
        mode: How hard to look.
        weights: A weight per field.
        anything: Passed through.
        pair: A number and a label.

    Returns:
        The notes.
    """
    return []


def test_schema_of_a_simple_function_is_the_openai_format() -> None:
    assert tool_from_callable(multiply).schema == {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "A function that multiplies two numbers",
            "parameters": {
                "type": "object",
                "properties": {
                    "x": {"type": "number", "description": "The first number to multiply"},
                    "y": {"type": "number", "description": "The second number to multiply"},
                },
                "required": ["x", "y"],
            },
        },
    }


def test_schema_types_defaults_and_docstring_sections() -> None:
    tool = tool_from_callable(search, name="note-search")
    assert tool.schema == {
        "type": "function",
        "function": {
            "name": "note-search",
            "description": "Search the notes.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "The words to look for, over two lines."},
                    "limit": {"type": "integer", "description": "How many results at most."},
                    "exact": {"type": "boolean", "description": "Match whole words only."},
                    "tags": {"type": "array", "items": {"type": "string"}, "nullable": True,
                             "description": "Only notes with one of these tags."},
                    "mode": {"type": "string", "enum": ["fast", "slow"], "description": "How hard to look."},
                    "weights": {"type": "object", "additionalProperties": {"type": "number"}, "nullable": True,
                                "description": "A weight per field."},
                    "anything": {"description": "Passed through."},
                    "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                             "description": "A number and a label."},
                },
                "required": ["query"],
            },
        },
    }
    assert (tool.unsafe, tool.timeout_s, tool.memory_mb) == (False, 5.0, 512)


def _one_line(a: int, b: str | None = None, c: Literal[1, 2] = 1, d: list[float] | None = None) -> str:
    """Do something.

    Args:
        a: An int.
        b: Maybe a string.
        c: One or two.
        d: Numbers.
    """
    return ""


@pytest.mark.parametrize("fn", [multiply, _one_line], ids=lambda f: f.__name__)
def test_schema_matches_transformers_get_json_schema(fn) -> None:
    """For one-paragraph docstrings rlzoo's schema is transformers' (less the return value)."""
    from transformers.utils import get_json_schema

    theirs = get_json_schema(fn)
    theirs["function"].pop("return", None)
    assert tool_from_callable(fn).schema == theirs


class Unknown:
    pass


def _no_hint(a, b: int) -> int:
    """Doc."""
    return b


def _star(*values: int) -> int:
    """Doc."""
    return 0


def _class_hint(a: Unknown) -> int:
    """Doc."""
    return 0


def _no_doc(a: int) -> int:
    return a


@pytest.mark.parametrize("fn, kwargs, error, message", [
    (_no_hint, {}, TypeError, "parameter 'a' has no type hint"),
    (_star, {}, TypeError, "takes \\*values"),
    (_class_hint, {}, TypeError, "parameter 'a'.*has no JSON schema; supported: int, float"),
    (_no_doc, {}, TypeError, "has no docstring"),
    (multiply, {"name": "two words"}, ValueError, "tool name 'two words' is not valid"),
    (multiply, {"timeout_s": 0}, ValueError, "timeout_s must be a number > 0, got 0"),
    (multiply, {"memory_mb": 1.5}, ValueError, "memory_mb must be an int > 0, got 1.5"),
    (lambda a: a, {"unsafe": True, "name": "anon"}, TypeError, "must be\\s+importable by reference"),
])
def test_tool_from_callable_refuses_what_has_no_schema(fn, kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        tool_from_callable(fn, **kwargs)


# --------------------------------------------------------------------------- parsing

def test_hermes_calls_one_several_and_none() -> None:
    text = ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n'
            '</tool_call>\n<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}</tool_call>')
    assert parse_tool_calls(text, "hermes") == [ToolCall("calculator", {"expression": "12*34"}),
                                                ToolCall("search", {"query": "x"})]
    assert parse_tool_calls("The answer is 408.", "hermes") == []
    assert parse_tool_calls('<tool_call>{"name": "now"}</tool_call>', "hermes") == [ToolCall("now", {})]


@pytest.mark.parametrize("text, message", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "1"</tool_call>', "is not valid JSON"),
    ('<tool_call>{"arguments": {}}</tool_call>', 'must be a JSON object {"name"'),
    ('<tool_call>["calculator"]</tool_call>', 'must be a JSON object {"name"'),
    ('<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>', "arguments of the call to 'calculator'"),
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call> <tool_call>{"name": "b"', "is not closed"),
])
def test_malformed_hermes_call_is_an_observation(text: str, message: str) -> None:
    result = parse_tool_calls(text, "hermes")
    assert isinstance(result, str) and result.startswith("error: ") and message in result, result


TOO_DEEP = "is not valid JSON for a tool call (brackets nested deeper than 100)"


@pytest.mark.parametrize("text, message", [
    ("<tool_call>" + "[" * 500 + "</tool_call>", TOO_DEEP),
    ("<tool_call>" + "[" * 1000 + "</tool_call>", TOO_DEEP),
    ("<tool_call>" + "{" * 100_000 + "</tool_call>", TOO_DEEP),
    ('<tool_call>{"name": "f", "arguments": {"x": ' + "[" * 990 + "]" * 990 + "}}</tool_call>", TOO_DEEP),
    ('<tool_call>{"name": "f", "arguments": "' + "[" * 5000 + '"}</tool_call>',
     "the arguments of the call to 'f' must be a JSON object"),
    ("<tool_call>" + "[" * 100 + "</tool_call>", "is not valid JSON (Expecting value at character 100)"),
])
def test_a_call_nested_to_any_depth_is_an_observation(text: str, message: str) -> None:
    """1000 brackets raised RecursionError where 500 gave the error observation: any depth
    is an observation now (brackets inside strings do not count)."""
    result = parse_tool_calls(text, "hermes")
    assert isinstance(result, str) and result.startswith("error: ") and message in result, result[:300]


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = '<tool_call>{"name": "f", "arguments": {"x": "' + "[{" * 500 + '", "y": [[1]]}}</tool_call>'
    assert parse_tool_calls(text, "hermes") == [ToolCall("f", {"x": "[{" * 500, "y": [[1]]})]
    deep = '<tool_call>{"name": "f", "arguments": {"x": ' + "[" * 98 + "]" * 98 + "}}</tool_call>"
    assert isinstance(parse_tool_calls(deep, "hermes"), list)  # 100 levels with the two objects: accepted


def test_plain_calls_one_per_line() -> None:
    text = ('I will use the tool.\nCALL calculator(expression="12*34")\n  CALL search(query=\'x\', limit=3, '
            'exact=true, tags=["a"], weights={"b": 1.5}, mode=None)\nA CALL in prose is not a call.')
    assert parse_tool_calls(text, "plain") == [
        ToolCall("calculator", {"expression": "12*34"}),
        ToolCall("search", {"query": "x", "limit": 3, "exact": True, "tags": ["a"], "weights": {"b": 1.5},
                            "mode": None})]
    assert parse_tool_calls("408", "plain") == []
    assert parse_tool_calls("CALL now()", "plain") == [ToolCall("now", {})]
    assert parse_tool_calls("CALL f(pair=(1, 'a'))", "plain") == [ToolCall("f", {"pair": [1, "a"]})]


@pytest.mark.parametrize("text, message", [
    ('CALL calculator("12*34")', "must name its arguments"),
    ("CALL calculator(expression=12*", "cannot read the tool call"),
    ("CALL calculator(expression=x)", "argument 'expression' of the tool call"),
    ("CALL math.sqrt(x=2)", "is not a call of a tool by name"),
    ("CALL f(x={1, 2})", "argument 'x' of the tool call"),
    ("CALL f(x=1j)", "argument 'x' of the tool call"),
    ('CALL calculator(expression="1")\nCALL 42', "is not a call of a tool by name"),
])
def test_malformed_plain_call_is_an_observation(text: str, message: str) -> None:
    result = parse_tool_calls(text, "plain")
    assert isinstance(result, str) and result.startswith("error: ") and message in result, result


def test_unknown_style_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown tool-call style 'json'; styles are hermes, plain"):
        parse_tool_calls("", "json")


QWEN_LIKE = ("{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for tool in tools %}"
             "{{- tool | tojson }}{%- endfor %}{{- '</tools>\\nFor each function call, return a json object within "
             "<tool_call></tool_call> XML tags' }}{%- endif %}")


class _Tokenizer:
    def __init__(self, chat_template: Any) -> None:
        self.chat_template = chat_template


@pytest.mark.parametrize("template, style", [
    (QWEN_LIKE, "hermes"),
    ({"default": "{{ messages }}", "tool_use": QWEN_LIKE}, "hermes"),
    (None, "plain"),
    ("{% for m in messages %}{{ m.content }}{% endfor %}", "plain"),
    ("{% if tools %}{{ tools | tojson }}[TOOL_CALLS]{% endif %}", "plain"),
])
def test_tool_call_style_reads_the_chat_template(template: Any, style: str) -> None:
    assert tool_call_style(_Tokenizer(template)) == style


HERMES_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}"
    "{{- tool | tojson }}{%- endfor %}{{- '\\n</tools>\\nFor each function call, return a json object with function "
    "name and arguments within <tool_call></tool_call> XML tags<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') }}"
    "{%- for tool_call in message.tool_calls or [] %}{%- set call = tool_call.function %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' + (call.arguments | tojson) + '}\\n"
    "</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endfor %}")
"""A Qwen2.5-style template: the tools' schemas as JSON in the system turn, the assistant's
calls as ``<tool_call>`` JSON (the structure of Qwen2.5's own template)."""


def test_hermes_parser_reads_the_calls_the_template_writes() -> None:
    from rlzoo.models.build import build_char_tokenizer

    tokenizer = build_char_tokenizer("0123456789")
    tokenizer.chat_template = HERMES_TEMPLATE
    calc = tool_from_callable(calculator)
    calls = [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12*34"}}},
             {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "5 - 1"}}}]
    text = tokenizer.apply_chat_template([{"role": "user", "content": "12*34 and 5-1?"},
                                          {"role": "assistant", "content": "Computing.", "tool_calls": calls}],
                                         tools=[calc.schema], tokenize=False)
    assert tool_call_style(tokenizer) == "hermes"
    assert json.dumps(calc.schema) in text  # the template shows the schema as rlzoo built it
    assistant = text.split("<|im_start|>assistant\n")[1]
    assert parse_tool_calls(assistant, "hermes") == [ToolCall("calculator", {"expression": "12*34"}),
                                                     ToolCall("calculator", {"expression": "5 - 1"})]


# --------------------------------------------------------------------------- calling

def _raises(a: int) -> int:
    """Raise.

    Args:
        a: Ignored.
    """
    raise KeyError("nope")


SEARCH = tool_from_callable(search)


@pytest.mark.parametrize("arguments, message", [
    ({}, "error: bad arguments for tool 'search': missing required argument(s) 'query'"),
    ({"query": 3}, "query: expected string, got 3"),
    ({"query": "x", "limit": True}, "limit: expected integer, got true"),
    ({"query": "x", "limit": 2.5}, "limit: expected integer, got 2.5"),
    ({"query": "x", "mode": "medium"}, 'mode: "medium" is not one of ["fast", "slow"]'),
    ({"query": "x", "tags": ["a", 1]}, "tags[1]: expected string, got 1"),
    ({"query": "x", "weights": {"a": "b"}}, 'weights.a: expected number, got "b"'),
    ({"query": "x", "pair": [1]}, "pair: expected 2 items, got 1"),
    ({"query": "x", "page": 2}, "unexpected argument 'page'; it takes query, limit, exact"),
    ({"query": {1, 2}}, "query: expected string, got \"{1, 2}\""),
])
def test_bad_arguments_are_an_error_observation(arguments: dict, message: str) -> None:
    observation, is_error = call_tool(SEARCH, ToolCall("search", arguments))
    assert is_error and message in observation, observation


def test_good_arguments_including_nulls_reach_the_function() -> None:
    arguments = {"query": "x", "limit": 3, "tags": None, "weights": {"a": 1}, "anything": {"k": [1]}, "pair": [1, "a"]}
    assert call_tool(SEARCH, ToolCall("search", arguments)) == ("[]", False)
    assert call_tool(tool_from_callable(multiply), ToolCall("multiply", {"x": 3, "y": 0.5})) == ("1.5", False)


def test_unknown_tool_names_the_tools() -> None:
    tools = {"search": SEARCH, "multiply": tool_from_callable(multiply)}
    assert call_tool(None, ToolCall("serch", {}), tools) == (
        "error: unknown tool 'serch'; the tools are: multiply, search", True)
    assert call_tool(SEARCH, ToolCall("calc", {})) == ("error: unknown tool 'calc'; the tools are: search", True)
    assert call_tool(None, ToolCall("multiply", {"x": 1, "y": 2}), tools) == ("2", False)


def test_an_exception_is_an_observation() -> None:
    assert call_tool(tool_from_callable(_raises), ToolCall("_raises", {"a": 1})) == (
        "error: tool '_raises' raised KeyError: 'nope'", True)


SPINS: list[int] = []


def _spins(start: int) -> str:
    """Count up for ever.

    Args:
        start: Where to start.
    """
    SPINS.append(start)
    while True:
        SPINS[0] += 1


def _children() -> set[str]:
    """This process's child processes (Linux), an empty set elsewhere."""
    path = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    return set(path.read_text().split()) if path.exists() else set()


def _tool_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("rlzoo-tool-")]


def test_a_safe_tool_that_loops_is_stopped_at_its_timeout_and_leaves_nothing_running() -> None:
    """The loop's thread ends at the limit: no thread is left, the count it was raising stands
    still afterwards, and no child process was started."""
    SPINS.clear()
    spins = tool_from_callable(_spins, timeout_s=0.3)
    children = _children()
    start = time.perf_counter()
    assert call_tool(spins, ToolCall("_spins", {"start": 0})) == (
        "error: tool '_spins' timed out after 0.3 s and was stopped", True)
    assert 0.3 <= time.perf_counter() - start < 0.3 + sandbox.STOP_GRACE_S
    assert _tool_threads() == []
    counted = SPINS[0]
    time.sleep(0.2)
    assert SPINS[0] == counted > 0
    assert _children() == children


def _naps(seconds: float) -> str:
    """Sleep, then note it.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    SPINS.append(-1)  # never reached when the tool was stopped: ToolTimeout is raised as the sleep returns
    return "done"


def test_a_safe_tool_blocked_outside_python_says_so_and_ends_when_the_call_returns() -> None:
    SPINS.clear()
    naps = tool_from_callable(_naps, timeout_s=0.2)
    start = time.perf_counter()
    assert call_tool(naps, ToolCall("_naps", {"seconds": 1.5 + sandbox.STOP_GRACE_S})) == (
        "error: tool '_naps' timed out after 0.2 s and could not be stopped (blocked outside Python; its thread "
        "ends when that call returns)", True)
    assert time.perf_counter() - start < 1.2 + sandbox.STOP_GRACE_S
    assert _tool_threads() == ["rlzoo-tool-_naps"]
    deadline = time.monotonic() + 10
    while _tool_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _tool_threads() == [] and SPINS == []  # ended as the sleep returned, before the line after it


def test_a_safe_tool_that_ends_in_time_answers_as_before() -> None:
    """The stop costs a call that finishes nothing: its result, its exception, its thread gone."""
    naps = tool_from_callable(_naps, timeout_s=5)
    assert call_tool(naps, ToolCall("_naps", {"seconds": 0.01})) == ("done", False)
    assert call_tool(tool_from_callable(calculator), ToolCall("calculator", {"expression": "12*34"})) == ("408", False)
    assert _tool_threads() == []


def test_an_episode_records_a_stopped_tool_as_a_failed_call() -> None:
    from rlzoo_plugins.environments import ToolsEnv, ToolsEnvParams

    SPINS.clear()
    env = ToolsEnv(ToolsEnvParams(tools=["_spins"]), {"_spins": tool_from_callable(_spins, timeout_s=0.2)}, "plain")
    result = env.step("CALL _spins(start=1)")
    assert (result.done, result.tool_calls, result.tool_errors) == (False, 1, 1)
    assert result.observations == [{"role": "tool",
                                    "content": "error: tool '_spins' timed out after 0.2 s and was stopped"}]
    assert _tool_threads() == []


def test_unsafe_tool_runs_in_a_process_and_its_exception_is_an_observation() -> None:
    add = tool_from_callable(tool_fns.add, unsafe=True)
    assert call_tool(add, ToolCall("add", {"a": 2, "b": 3})) == ("5", False)
    divide = tool_from_callable(tool_fns.divide, unsafe=True)
    assert call_tool(divide, ToolCall("divide", {"a": 1, "b": 0})) == (
        "error: tool 'divide' raised ZeroDivisionError: division by zero", True)


def test_unsafe_tool_is_killed_at_its_timeout() -> None:
    sleep = tool_from_callable(tool_fns.sleep, unsafe=True, timeout_s=0.5)
    start = time.perf_counter()
    assert call_tool(sleep, ToolCall("sleep", {"seconds": 60})) == (
        "error: tool 'sleep' timed out after 0.5 s and was killed", True)
    assert time.perf_counter() - start < 5
    assert call_tool(sleep, ToolCall("sleep", {"seconds": 0.01})) == ("awake", False)


def test_unsafe_tool_is_held_to_its_memory_limit() -> None:
    allocate = tool_from_callable(tool_fns.allocate, unsafe=True, memory_mb=64)
    assert call_tool(allocate, ToolCall("allocate", {"megabytes": 16})) == (str(16 * 2**20), False)
    assert call_tool(allocate, ToolCall("allocate", {"megabytes": 512})) == (
        "error: tool 'allocate' exceeded its memory limit of 64 MB", True)


def test_unsafe_tool_whose_process_dies_is_an_observation() -> None:
    exit_now = tool_from_callable(tool_fns.exit_now, unsafe=True)
    observation, is_error = call_tool(exit_now, ToolCall("exit_now", {"code": 3}))
    assert is_error and observation.startswith("error: tool 'exit_now' crashed (its process ended with exit code 3")


def test_unsafe_tool_that_ends_its_process_or_forges_a_result_is_told_apart() -> None:
    """exit code 0 is no crash: a tool that ends its process itself, and one that writes a
    result of its own to rlzoo's pipe and then returns, are reported as what they did."""
    exit_now = tool_from_callable(tool_fns.exit_now, unsafe=True)
    assert call_tool(exit_now, ToolCall("exit_now", {"code": 0})) == (
        "error: tool 'exit_now' ended its process (exit code 0) before returning a result: did it call os._exit() "
        "or close the result pipe?", True)
    forge = tool_from_callable(tool_fns.forge, unsafe=True)
    forged = len(json.dumps({"observation": "42", "is_error": False}))
    honest = len(json.dumps({"observation": "honest", "is_error": False}))
    assert call_tool(forge, ToolCall("forge", {"value": "42"})) == (
        f"error: tool 'forge' returned, but its result pipe held {forged + honest} bytes that are not one "
        "result: something in the tool's process wrote to rlzoo's result pipe itself, so nothing it holds is used",
        True)


def test_unsafe_tool_works_from_a_script_without_a_main_file() -> None:
    """The child process never re-runs the caller's ``__main__`` (multiprocessing's spawn would,
    and fails for a script read from stdin or a notebook)."""
    import subprocess
    import sys

    script = ("import tool_fns\nfrom rlzoo.api import ToolCall, call_tool, tool_from_callable\n"
              "print(call_tool(tool_from_callable(tool_fns.add, unsafe=True), ToolCall('add', {'a': 1, 'b': 2})))\n")
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parent)
    assert done.stdout.strip() == "('3', False)", done.stderr


# --------------------------------------------------------------------------- the calculator

@pytest.mark.parametrize("expression, value", [
    ("12*34", "408"), ("(7 - 2) / 4", "1.25"), ("6/3", "2"), ("-2**3", "-8"), ("17 // 5 + 17 % 5", "5"),
    ("0.1 + 0.2", "0.30000000000000004"), ("123456789 * 987654321", "121932631112635269"),
])
def test_calculator_evaluates_arithmetic(expression: str, value: str) -> None:
    assert calculator(expression) == value


@pytest.mark.parametrize("expression, message", [
    ("__import__('os').system('true')", "is not arithmetic"),
    ("x + 1", "'x' is not arithmetic"),
    ("2 ** 100000", "more than 1000 digits"),
    ("9**999 * 9**999 * 9**999 * 9**999", "more than 1000 digits"),
    ("1e308 * 10", "the result is inf"),
    ("True + 1", "'True' is not arithmetic"),
    ("1 +", "cannot read"),
    ("1" * 201, "longer than 200 characters"),
])
def test_calculator_refuses_what_is_not_small_arithmetic(expression: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        calculator(expression)


# --------------------------------------------------------------------------- registration and the kit

REGISTRY = build_registry(make_plugin_manager())


def test_calculator_is_registered_with_its_schema_and_passes_the_kit() -> None:
    component = REGISTRY.get("tool", "calculator")
    tool = component.meta["tool"]
    assert tool.fn is calculator and component.package == "rlzoo"
    assert tool.schema["function"]["parameters"]["required"] == ["expression"]
    check_component(component)
    assert call_tool(tool, ToolCall("calculator", {"expression": "1/0"})) == (
        "error: tool 'calculator' raised ZeroDivisionError: division by zero", True)


def test_registered_tools_by_name() -> None:
    tools = registered_tools(REGISTRY, ["calculator"])
    assert list(tools) == ["calculator"] and tools["calculator"] is REGISTRY.get("tool", "calculator").meta["tool"]
    with pytest.raises(UnknownComponentError, match="unknown tool 'calculater'; registered: calculator"):
        registered_tools(REGISTRY, ["calculater"])


def test_rlzoo_list_lists_the_tools(capsys) -> None:
    from rlzoo.commands.cli import main

    assert main(["list", "--kind", "tool"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Tools (tool):") and re.search(r"^  calculator +rlzoo +safe arithmetic", out, re.M)


def _register(**meta):
    def hook(register):  # called once per registry built
        given = dict(meta)
        register(given.pop("name", "bad"), given.pop("fn", _no_hint), **given)
    return module_plugin(rlzoo_register_tools=hook)


@pytest.mark.parametrize("meta, message", [
    ({}, "plugin 'bad-plugin': tool 'bad': parameter 'a' has no type hint"),
    ({"fn": multiply, "timeout": 3}, "unknown register() keyword(s) ['timeout']"),
    ({"fn": multiply, "examples": [{"x": 1}]}, "example {'x': 1} does not fit its schema: missing required"),
    ({"fn": multiply, "name": "a b"}, "tool name 'a b' is not valid"),
])
def test_a_tool_that_cannot_be_described_is_refused_at_registration(meta: dict, message: str) -> None:
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(_register(**meta), name="bad-plugin")
    with pytest.raises(RefusedComponentError) as refused:  # a run stops: the tool is refused at registration
        build_registry(pm)
    assert message in str(refused.value) and refused.value.kind == "tool", refused.value
    errors = build_registry(pm, strict=False).load_errors  # the rest load (rlzoo list)
    assert len(errors) == 1 and isinstance(errors[0], PluginError) and message in str(errors[0]), errors


def test_a_registered_tool_object_keeps_its_hand_written_schema() -> None:
    schema = {"type": "function", "function": {"name": "mul", "description": "Multiply.", "parameters": {
        "type": "object", "properties": {"x": {"type": "number", "description": "x"},
                                         "y": {"type": "number", "description": "y"}}, "required": ["x", "y"]}}}
    tool = Tool("mul", multiply, schema)
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(_register(name="mul", fn=tool, examples=[{"x": 2, "y": 3}]), name="hand")
    component = build_registry(pm).get("tool", "mul")
    assert component.meta["tool"] is tool and component.description == "Multiply."
    check_component(component)


def _nondeterministic(n: int) -> int:
    """Roll a die.

    Args:
        n: Sides.
    """
    return random.randint(1, 10**9)


def _undescribed(n: int) -> int:
    """Echo."""
    return n


def _fails_on_example(n: int) -> int:
    """Fail on 7.

    Args:
        n: A number.
    """
    if n == 7:
        raise ValueError("seven")
    return n


@pytest.mark.parametrize("tool, examples, message", [
    (tool_from_callable(_nondeterministic), (), "is not deterministic: called twice with {'n': 1}"),
    (tool_from_callable(_undescribed), (), "argument 'n' has no description"),
    (tool_from_callable(_fails_on_example), [{"n": 7}], "example {'n': 7} failed: error: tool"),
    (Tool("t", _undescribed, {"type": "function", "function": {"name": "t", "description": "d", "parameters": {
        "type": "object", "properties": {}, "required": ["n"]}}}), (), "required argument(s) ['n'] are not in"),
    (Tool("t", _undescribed, {"type": "function", "function": {"name": "t", "description": "d", "parameters": {
        "type": "object", "properties": {"m": {"type": "integer", "description": "m"}}, "required": ["m"]}}}), (),
     "the schema's arguments ['m'] are not the function's ['n']"),
    (Tool("t", _undescribed, {"type": "function", "function": {"name": "t", "description": "d", "parameters": {
        "type": "object", "properties": {"n": {"type": "int", "description": "n"}}}}}), (), "has type 'int'"),
])
def test_the_kit_catches_a_broken_tool(tool: Tool, examples, message: str) -> None:
    with pytest.raises(AssertionError, match=re.escape(message)):
        check_tool(tool, examples=examples)


def test_the_tool_in_docs_agents_md_passes_the_kit() -> None:
    """The example tool of docs/agents.md registers, and its schema is the one printed there."""
    text = (ROOT / "docs/agents.md").read_text()
    code = re.search(r"```python file=rlzoo_hilo/tools.py\n(.*?)```", text, re.S).group(1)
    printed = json.loads(re.search(r"```json\n(.*?)```", text, re.S).group(1))
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/agents.md", "exec"), namespace)
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(module_plugin(rlzoo_register_tools=namespace["rlzoo_register_tools"]), name="docs")
    component = build_registry(pm).get("tool", "convert_length")
    assert component.meta["tool"].schema == printed
    check_component(component)
    check_tool(tool_from_callable(namespace["convert_length"]), examples=[{"value": 1.0, "unit": "mi"}])


def test_the_sandbox_reads_no_pickle_from_the_tool_process() -> None:
    """The child answers in JSON: bytes a tool's process writes that are not one
    ``{observation, is_error}`` object (a crafted pickle included) are never loaded."""
    import pickle

    from rlzoo.agents.sandbox import _parse_result

    assert _parse_result(b'{"observation": "42", "is_error": false}') == ("42", False)
    assert _parse_result(pickle.dumps(("42", False))) is None
    assert _parse_result(b'{"observation": 42, "is_error": false}') is None
    assert _parse_result(b'["42", false]') is None


def test_an_unsafe_tool_must_be_importable_by_reference() -> None:
    with pytest.raises(TypeError, match="must be importable by reference"):
        tool_from_callable(lambda x: x, name="anon", unsafe=True)
    tool = Tool(name="anon", fn=lambda x: x, schema=tool_from_callable(tool_fns.add).schema, unsafe=True)
    observation, is_error = call_tool(tool, ToolCall("anon", {"a": 1, "b": 2}))  # a hand-made Tool: told at the call
    assert is_error and "must be a module-level function" in observation
