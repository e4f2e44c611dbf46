"""What an environment is: the other side of a multi-turn episode.

An environment (kind ``environment``, config key ``env``) gets the task's example and
returns the episode's first messages (:meth:`Environment.reset`); after each policy turn
the engine hands it the turn's text (:meth:`Environment.step`) and gets back a
:class:`StepResult`: the observation messages the policy reads next (tool results, feedback),
an optional per-turn reward, and whether the episode is over. The engine owns the tokens:
it renders the messages (with the tokenizer's chat template, or plainly for a model without
one), masks every environment token out of the losses and scores the final answer with the
task's reward functions (:mod:`rlzoo.agents.episodes`; docs/agents.md).

The engine builds one environment per episode (``factory(params=..., **inputs)``), so an
environment may keep the episode's state on ``self``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from rlzoo.tasks.task import Example

Message = dict[str, str]
"""A chat message: ``{"role": "system" | "user" | "assistant" | "tool", "content": str}``."""


@dataclass
class StepResult:
    """What the environment answers to one policy turn.

    :ivar observations: messages the policy reads before its next turn (``role`` ``tool``
        for tool results, ``user`` for feedback); ignored when ``done``.
    :ivar reward: a per-turn reward, or ``None``; the episode's per-turn rewards are summed
        and added to the terminal score of its final answer.
    :ivar done: the episode is over; the turn just taken is the final answer.
    :ivar tool_calls: tool calls the turn made (for ``episode/tool_calls``).
    :ivar tool_errors: of them, those that failed (unknown tool, bad arguments, an exception,
        a timeout, an unparsable call).
    """

    observations: list[Message] = field(default_factory=list)
    reward: float | None = None
    done: bool = False
    tool_calls: int = 0
    tool_errors: int = 0


class Environment:
    """Base class of environments. Subclasses implement :meth:`step`; :meth:`reset` and
    :attr:`tools` have defaults.

    :cvar tools: the tools the policy is offered (``rlzoo.contract.tool_schema.Tool`` objects); their
        schemas go to the chat template's ``tools=`` argument. Empty: no tool schemas.
    """

    tools: Sequence[Any] = ()

    def reset(self, example: Example) -> list[Message]:
        """The episode's first messages: by default the example's own chat messages, else one
        user turn with its prompt. The run's instruction and system prompt are applied to
        them like to any prompt (:class:`rlzoo.tasks.prompts.PromptFormat`)."""
        if example.messages:
            return [dict(m) for m in example.messages]
        return [{"role": "user", "content": example.prompt}]

    def step(self, completion: str) -> StepResult:
        """React to one policy turn (its decoded text, end-of-turn token dropped)."""
        raise NotImplementedError(f"{type(self).__name__} must implement step(completion) -> StepResult")

    def demonstration(self, example: Example) -> list[str] | None:
        """The policy turns of a good episode of ``example`` (texts, without end-of-turn
        tokens), played against this environment by ``rlzoo sft`` under ``env`` as a
        supervised warm-up; ``None`` (the default): the environment has none."""
        return None


def tool_schemas(tools: Sequence[Any]) -> list[Mapping[str, Any]] | None:
    """The OpenAI function schemas of ``tools`` for ``apply_chat_template(tools=...)``, or
    ``None`` without tools."""
    return [tool.schema for tool in tools] or None
