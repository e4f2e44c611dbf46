"""How long a task's reference answers are in tokens, and the check that a run's response
budget can hold them (a warning at the start of a run; the doctor's length-budget check
reads the lengths the run logs)."""

from __future__ import annotations

from typing import Any

from rlzoo.tasks.task import Holdout, Task, checked_examples

ANSWER_SAMPLE = 1024
"""The most listed examples whose answers :func:`answer_token_lengths` tokenises."""


def answer_token_lengths(task: Task, tokenizer: Any, holdout: Holdout) -> list[int]:
    """Tokens of each checked example's reference answer as a policy would write it
    (:meth:`Task.answer_text`, no special tokens; :func:`checked_examples`, at most
    :data:`ANSWER_SAMPLE`): the smallest ``rollout.max_new_tokens`` that can hold a correct
    answer to every prompt is their maximum, and below their minimum no completion can be
    correct (the answer's own tokens; an answer format that wraps it needs more)."""
    texts = [task.answer_text(e) for e in checked_examples(task, holdout, ANSWER_SAMPLE)]
    if not texts:
        return []
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False).input_ids]


def check_budget(lengths: list[int], max_new_tokens: int, task_name: str) -> list[str]:
    """A warning when ``rollout.max_new_tokens`` is below every reference answer's length in
    tokens (``lengths``, :func:`answer_token_lengths`): no completion can then be correct."""
    if not lengths or max_new_tokens >= min(lengths):
        return []
    shortest, longest = min(lengths), max(lengths)
    span = f"{shortest}" if shortest == longest else f"{shortest} to {longest}"
    return [f"rollout.max_new_tokens={max_new_tokens} cannot hold any reference answer of task {task_name!r} (they "
            f"take {span} tokens): no completion can be correct; rollout.max_new_tokens={longest} holds every one"]
