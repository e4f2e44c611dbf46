"""How a task's prompt becomes the text the model reads: one code path for RL, evaluation
and ``rlzoo sft``.

A prompt goes through, in order:

1. ``task.instruction``: a template around the question, ``{question}`` standing for the
   task's prompt and ``{format}`` for the answer format's hint (``answer_format``'s
   ``hint``, e.g. "Give your final answer between <answer> and </answer>."). Unset, the
   prompt is the question, followed on a new line by the hint when the format has one.
2. ``model.system_prompt``: a system turn before it.
3. the tokenizer's chat template (``model.chat_template``; null applies it when the
   tokenizer has one): a user turn (after the system turn) and the generation prompt.
   Without a chat template the system prompt and the instructed question are joined by a
   blank line.

A prompt of chat messages (a file task whose prompt column holds ``[{role, content}]``,
verl's and TRL's layout) keeps its turns: the instruction applies to its last user turn,
and the system prompt is put first unless the messages start with a system turn of their
own. The embedded tiny model's tokenizer has no chat template and every setting above is
unset by default: the default run's prompts are the task's prompts unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

from rlzoo.core.errors import ConfigError
from rlzoo.plan.settings import PromptPlan
from rlzoo.tasks.task import Example

Text = str | list[dict[str, str]]
"""A prompt or response: plain text, or chat messages (``[{"role": ..., "content": ...}]``)."""


def plain_text(value: Text) -> str:
    """The text of a prompt or response: itself, or its messages' contents joined."""
    return value if isinstance(value, str) else "".join(str(m.get("content", "")) for m in value)


@dataclass(frozen=True)
class PromptFormat(PromptPlan):
    """The prompt settings of a run (:class:`rlzoo.plan.settings.PromptPlan`: instruction,
    answer-format hint, system prompt, chat template) and what they do to a prompt (see the
    module docstring)."""

    @classmethod
    def of(cls, settings: PromptPlan) -> "PromptFormat":
        """The format of the run plan's prompt settings (``plan.prompt``)."""
        return cls(**dataclasses.asdict(settings))

    def check(self, tokenizer: Any) -> None:
        """:raises ConfigError: ``model.chat_template=true`` and the tokenizer has none."""
        if self.chat_template is True and not getattr(tokenizer, "chat_template", None):
            raise ConfigError("model.chat_template=true but the tokenizer has no chat template")

    def instruct(self, question: str) -> str:
        """The question inside the instruction template."""
        if self.instruction is None:
            return f"{question}\n{self.format_hint}" if self.format_hint else question
        return self.instruction.format(question=question, format=self.format_hint)

    def messages(self, prompt: Example | str) -> list[dict[str, str]]:
        """The conversation: the system turn (if any) and the instructed user turn(s)."""
        given = prompt.messages if isinstance(prompt, Example) else None
        text = prompt.prompt if isinstance(prompt, Example) else prompt
        turns = [dict(m) for m in given] if given else [{"role": "user", "content": text}]
        last_user = max((i for i, m in enumerate(turns) if m["role"] == "user"), default=None)
        if last_user is not None:
            turns[last_user]["content"] = self.instruct(turns[last_user]["content"])
        if self.system_prompt and turns[0]["role"] != "system":
            turns.insert(0, {"role": "system", "content": self.system_prompt})
        return turns

    def render(self, prompt: Example | str, tokenizer: Any) -> str:
        """The text the model reads (before tokenisation)."""
        turns = self.messages(prompt)
        if self.chat_template is False or not getattr(tokenizer, "chat_template", None):
            if len(turns) == 1:
                return turns[0]["content"]
            return "\n\n".join(m["content"] for m in turns)
        return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)

    def encode(self, prompts: Sequence[Example | str], tokenizer: Any) -> list[list[int]]:
        """Token ids of each prompt as the model reads it (:meth:`render`), unpadded."""
        return tokenizer([self.render(p, tokenizer) for p in prompts], add_special_tokens=False).input_ids
