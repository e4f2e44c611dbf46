"""Preference pairs: the data ``rlzoo rm`` trains a reward model on.

A pair says that ``chosen`` is preferred to ``rejected`` as an answer to ``prompt``. Pairs
come from a file (:func:`load_pairs`: each row of a ``.jsonl`` or ``.parquet`` file holds a
``prompt``, a ``chosen`` and a ``rejected`` response, text or chat messages, and optionally
a ``margin``, a number ≥ 0) or from a task (:func:`task_pairs`: answers of the task's
training prompts ranked by its reward). :func:`split_pairs` holds a seeded share out for
evaluation and :func:`batch_rows` says which pairs a training step reads, as a function of
the step alone so that a resumed run reads what an uninterrupted one would.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from rlzoo.core.errors import ConfigError
from rlzoo.tasks.prompts import Text, plain_text
from rlzoo.tasks.task import Holdout, Task, read_rows

COLUMNS = ("prompt", "chosen", "rejected")
MARGIN = "margin"

TASK_DATA = "task"
"""``rm.data=task``: pairs generated from the configured task and its reward (:func:`task_pairs`)."""


@dataclass(frozen=True)
class Pair:
    """One preference: ``chosen`` is preferred to ``rejected`` as an answer to ``prompt``."""

    prompt: Text
    chosen: Text
    rejected: Text
    margin: float = 0.0

    def characters(self) -> set[str]:
        """Every character of the pair's three texts (what a character tokenizer must cover)."""
        return {ch for text in (self.prompt, self.chosen, self.rejected) for ch in plain_text(text)}


def _text_or_messages(value: Any) -> bool:
    if isinstance(value, str):
        return True
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value)


def load_pairs(path: str | Path) -> list[Pair]:
    """The preference pairs of a ``.jsonl`` / ``.parquet`` file.

    :raises ConfigError: a missing, unreadable or empty file, or a row without a column,
        with a value that is neither text nor chat messages, with an empty prompt and an
        empty response, or a margin that is not a finite number ≥ 0 (file, row and column
        named).
    """
    path = Path(path)
    rows = read_rows(path, "preference file")
    if not rows:
        raise ConfigError(f"preference file {str(path)!r} holds no pairs")
    pairs = []
    for number, row in enumerate(rows, 1):
        where = f"preference file {str(path)!r} row {number}"
        if not isinstance(row, dict):
            raise ConfigError(f"{where} is a {type(row).__name__}, not an object with {', '.join(COLUMNS)}")
        for column in COLUMNS:
            if column not in row:
                raise ConfigError(f"{where} has no {column!r} column (columns: {', '.join(map(str, row)) or 'none'}; "
                                  f"a pair needs {', '.join(COLUMNS)} and may have {MARGIN!r})")
            if not _text_or_messages(row[column]):
                raise ConfigError(f"{where} column {column!r} is {str(row[column])[:80]!r}: give text or chat "
                                  'messages ([{"role": ..., "content": ...}, ...])')
        for column in ("chosen", "rejected"):
            if not plain_text(row["prompt"]) + plain_text(row[column]):
                raise ConfigError(f"{where}: 'prompt' and {column!r} are both empty: the reward model would read no "
                                  "text; drop the row or give it text")
        margin = row.get(MARGIN)
        margin = 0.0 if margin is None else margin
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin < 0:
            raise ConfigError(f"{where} column {MARGIN!r} is {margin!r}: a margin is a finite number >= 0")
        pairs.append(Pair(row["prompt"], row["chosen"], row["rejected"], float(margin)))
    return pairs


def tie_warning(pairs: list[Pair], source: str) -> str | None:
    """A warning when some pairs have ``chosen == rejected`` (a tie: its loss is
    ``log(1 + e^m)`` whatever the model scores, so it teaches nothing), ``None`` when none do.

    :raises ConfigError: every pair is a tie (the run could learn nothing).
    """
    ties = [number for number, pair in enumerate(pairs, 1) if pair.chosen == pair.rejected]
    if not ties:
        return None
    rows = ", ".join(map(str, ties[:5])) + (", ..." if len(ties) > 5 else "")
    if len(ties) == len(pairs):
        raise ConfigError(f"rm.data {source!r}: chosen == rejected in every pair ({len(pairs)}): the reward model "
                          "cannot learn a preference from ties; give pairs whose responses differ")
    return (f"rm.data {source!r}: chosen == rejected in {len(ties)} of {len(pairs)} pairs (rows {rows}): they "
            "add a constant to the loss and teach nothing")


def _swap_two(text: str, rng: random.Random) -> str:
    if len(text) < 2:
        return text
    i, j = rng.sample(range(len(text)), 2)
    chars = list(text)
    chars[i], chars[j] = chars[j], chars[i]
    return "".join(chars)


Score = Callable[..., Sequence[float]]
"""A reward function as the engine calls it: ``(prompts=, completions=, references=, rows=)`` → scores."""


def task_pairs(task: Task, task_name: str, score: Score, holdout: Holdout, count: int, seed: int) -> list[Pair]:
    """``count`` preference pairs over ``task``'s *training* prompts (``holdout``'s prompts
    excluded): for each prompt two of {the reference answer (``answer_text``), a well-formed
    unsolved answer (``format_text``), the reference with two characters swapped} that
    ``score`` (the run's one reward function) scores differently; the higher-scored is
    chosen, so the reward is the *gold* score beside the learned *proxy*.

    :raises ConfigError: the task and reward give too few pairs with distinct scores.
    """
    rng = random.Random(f"rm-task/{seed}")
    pairs: list[Pair] = []
    for _ in range(20):
        examples = task.sample_train(count, rng, holdout)
        candidates = [(e, [task.answer_text(e), task.format_text(e, rng), _swap_two(task.answer_text(e), rng)])
                      for e in examples]
        drawn = [(e, *rng.sample(options, 2)) for e, options in candidates]
        texts = [text for _, a, b in drawn for text in (a, b)]
        scores = score(prompts=[e.prompt for e, _, _ in drawn for _ in (0, 1)], completions=texts,
                       references=[e.reference for e, _, _ in drawn for _ in (0, 1)],
                       rows=[dict(e.row) for e, _, _ in drawn for _ in (0, 1)])
        scores = [float(x) for x in scores]
        for k, (example, a, b) in enumerate(drawn):
            sa, sb = scores[2 * k], scores[2 * k + 1]
            if sa != sb and len(pairs) < count:
                pairs.append(Pair(example.prompt, a if sa > sb else b, b if sa > sb else a))
        if len(pairs) == count:
            return pairs
    raise ConfigError(f"rm.data={TASK_DATA}: task {task_name!r} gave only {len(pairs)} pairs "
                      f"of answers its reward scores differently (of {count}); give a preference file instead")


def split_pairs(count: int, eval_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """``(train, held_out)`` row indices: a seeded shuffle, the last ``round(count ×
    eval_fraction)`` held out (at least one pair stays for training)."""
    order = list(range(count))
    random.Random(f"rm-split/{seed}").shuffle(order)
    held = min(count - 1, round(count * eval_fraction))
    return sorted(order[:count - held]), sorted(order[count - held:])


def batch_rows(train: list[int], batch_size: int, step: int, seed: int) -> list[int]:
    """The rows step ``step`` (from 1) trains on: the next ``batch_size`` of a seeded
    shuffle of ``train`` per epoch (a function of ``step`` alone, so resuming is exact)."""
    out = []
    position = (step - 1) * batch_size
    while len(out) < batch_size:
        epoch, offset = divmod(position, len(train))
        order = list(train)
        random.Random(f"rm-epoch/{seed}/{epoch}").shuffle(order)
        take = order[offset:offset + batch_size - len(out)]
        out += take
        position += len(take)
    return out
