"""Built-in environments (kind ``environment``, config key ``env``).

``tools``: offers the registered tools its ``tools`` parameter names; each policy turn is
parsed for tool calls in the format of the run's rendering (``<tool_call>{json}</tool_call>``
under a Qwen/Hermes chat template, ``CALL name(arg=value)`` lines without one:
:func:`rlzoo.agents.tool_calls.parse_tool_calls`), the calls run (:func:`rlzoo.agents.tool_calls.call_tool`: an
exception or timeout becomes an error observation) and their results are the next
observations; a turn without a call is the final answer.

``calculator``: the same with the registered ``calculator`` tool, for the ``multiply`` task.
Under a hermes chat template it uses that format; otherwise (the embedded tiny model) a
turn that is an expression (digits and at least one of ``+ - *``) is a call and its
observation is ``=<value>;``, so the whole episode stays inside the task's small alphabet:
``37*48=`` → policy ``37*48</s>`` → ``=1776;`` → policy ``1776</s>``.

``guess``: a multi-turn guessing game on any task with an integer answer: ``+;`` / ``-;``
after a wrong guess (higher / lower), done when right; the right answer's reward is
reduced by a penalty per wrong guess before it.
docs/agents.md walks through both and through writing your own.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from rlzoo.api import call_tool, Environment, hookimpl, parse_tool_calls, StepResult, Tool, ToolCall

RLZOO_API_VERSION = "2"
STYLES = ("auto", "hermes", "plain")


@dataclass
class ToolsEnvParams:
    tools: list[str] = field(default_factory=list)
    """Names of registered tools (rlzoo list --kind tool) the policy is offered (required: at least one)."""
    style: str = "auto"
    """Tool-call format: auto (the run's: hermes under a Qwen/Hermes chat template, else plain) | hermes | plain."""

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"style must be one of {', '.join(STYLES)}, got {self.style!r}")
        if not self.tools:
            raise ValueError("tools is empty: name the registered tools to offer, e.g. tools: [calculator] "
                             "(rlzoo list --kind tool); an episode without tools is a plain completion")


class ToolsEnv(Environment):
    """Runs the tool calls of each policy turn; a turn without one ends the episode.

    :param params: the tool names and call format.
    :param tools: every registered tool by name (the engine's ``tools`` input).
    :param tool_style: the run's tool-call format (``style=auto`` takes it).
    """

    def __init__(self, params: ToolsEnvParams, tools: dict[str, Tool], tool_style: str) -> None:
        missing = [name for name in params.tools if name not in tools]
        if missing:
            raise ValueError(f"unknown tool(s) {', '.join(missing)}; registered: {', '.join(sorted(tools)) or 'none'}")
        self.tools = [tools[name] for name in params.tools]
        self.style = params.style if params.style != "auto" else tool_style

    def parse(self, completion: str) -> list[ToolCall] | str:
        """The turn's tool calls (empty: a final answer), or a parse error to show the model."""
        return parse_tool_calls(completion, self.style)

    def observe(self, text: str) -> str:
        """The observation content of one tool result."""
        return text

    def step(self, completion: str) -> StepResult:
        calls = self.parse(completion)
        if isinstance(calls, str):
            return StepResult(observations=[{"role": "tool", "content": self.observe(calls)}], tool_calls=1,
                              tool_errors=1)  # a malformed call counts as a failed one
        if not calls:
            return StepResult(done=True)
        by_name = {tool.name: tool for tool in self.tools}
        observations, errors = [], 0
        for call in calls:
            text, failed = call_tool(None, call, by_name)
            errors += int(failed)
            observations.append({"role": "tool", "content": self.observe(text)})
        return StepResult(observations=observations, tool_calls=len(calls), tool_errors=errors)


_EXPRESSION = re.compile(r"^\d+(?:[+*-]\d+)+$")


@dataclass
class CalculatorEnvParams:
    style: str = "auto"
    """Tool-call format: auto (hermes under a Qwen/Hermes chat template, else expression) | hermes |
    expression (a turn that is an expression calls the calculator; its result comes back as '=<value>;')."""
    call_reward: float = 0.0
    """Per-turn reward of the episode's first tool call that runs without error (an exploration bonus; later calls
    get none), added to the final answer's score."""

    def __post_init__(self) -> None:
        if self.style not in ("auto", "hermes", "expression"):
            raise ValueError(f"style must be one of auto, hermes, expression, got {self.style!r}")
        if not -10.0 <= self.call_reward <= 10.0:
            raise ValueError(f"call_reward must be in [-10, 10], got {self.call_reward}")


class CalculatorEnv(ToolsEnv):
    """:class:`ToolsEnv` with the registered calculator tool (see the module docstring)."""

    def __init__(self, params: CalculatorEnvParams, tools: dict[str, Tool], tool_style: str) -> None:
        super().__init__(ToolsEnvParams(tools=["calculator"]), tools, tool_style)
        self.style = params.style if params.style != "auto" else ("hermes" if tool_style == "hermes" else "expression")
        self.call_reward, self.rewarded = params.call_reward, False

    def step(self, completion: str) -> StepResult:
        result = super().step(completion)
        if result.tool_calls > result.tool_errors and not self.rewarded and self.call_reward:
            result.reward, self.rewarded = self.call_reward, True
        return result

    def demonstration(self, example: Any) -> list[str] | None:
        """A call of the calculator on the prompt's expression, then the reference answer
        (``37*48=`` → ``37*48``, ``1776``; under hermes a ``<tool_call>``); ``None`` for a
        prompt that is not an expression followed by ``=``."""
        expression = str(example.prompt).strip().removesuffix("=")
        if not _EXPRESSION.match(expression):
            return None
        if self.style == "hermes":
            call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
            return [f"<tool_call>{call}</tool_call>", str(example.reference)]
        return [expression, str(example.reference)]

    def parse(self, completion: str) -> list[ToolCall] | str:
        if self.style == "hermes":
            return parse_tool_calls(completion, "hermes")
        text = completion.strip()
        return [ToolCall("calculator", {"expression": text})] if _EXPRESSION.match(text) else []

    def observe(self, text: str) -> str:
        return f"={text};" if self.style == "expression" else text


@dataclass
class GuessParams:
    turn_penalty: float = 0.1
    """A right answer after k wrong guesses earns a per-turn reward of -k times this (fewer turns score more)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.turn_penalty <= 10.0:
            raise ValueError(f"turn_penalty must be in [0, 10], got {self.turn_penalty}")


class GuessEnv(Environment):
    """Higher/lower feedback on an integer answer (any task whose reference is an integer,
    e.g. ``multiply``): a right guess ends the episode, a wrong one is answered ``+;`` (the
    answer is higher) or ``-;`` (lower), a turn that is not an integer ``=;``;
    ``rollout.max_turns`` bounds the guesses. The right answer after k wrong guesses earns
    −k·``turn_penalty`` with it: charged only on success, so an episode that never answers
    (or runs out of turns) cannot score above one that answers late."""

    def __init__(self, params: GuessParams) -> None:
        self.penalty, self.target, self.wrong = params.turn_penalty, None, 0

    def reset(self, example: Any) -> list[dict[str, str]]:
        self.target = int(str(example.reference))
        return super().reset(example)

    def step(self, completion: str) -> StepResult:
        text = completion.strip()
        guess = int(text) if re.fullmatch(r"-?\d{1,30}", text) else None
        if guess == self.target:
            return StepResult(done=True, reward=-self.penalty * self.wrong)
        self.wrong += 1
        hint = "=;" if guess is None else ("+;" if guess < self.target else "-;")
        return StepResult(observations=[{"role": "user", "content": hint}])


@hookimpl
def rlzoo_register_environments(register: Any) -> None:
    register("tools", ToolsEnv, params=ToolsEnvParams,
             description="offers registered tools; runs each turn's tool calls, a turn without one is the answer")
    register("calculator", CalculatorEnv, params=CalculatorEnvParams,
             description="a calculator tool (+ - * over integers) for the multiply task; compact call format "
                         "for models without a chat template")
    register("guess", GuessEnv, params=GuessParams,
             description="higher/lower feedback on an integer answer until it is right; a penalty per wrong guess")
