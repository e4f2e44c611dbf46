"""What a task is: a source of prompts with reference answers and a default reward.

Tasks are plugins (kind ``task``); this module holds the types they share and the loader
for users' prompt files.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlzoo.errors import ConfigError


@dataclass(frozen=True)
class Example:
    """One prompt and the reference the reward function compares a completion with."""

    prompt: str
    reference: Any


class Task:
    """Base class of tasks. Subclasses implement :meth:`sample` (and may override the rest).

    :ivar alphabet: the characters the embedded character-level tokenizer must cover, or
        ``None`` when the task needs a real tokenizer (``model.path``).
    :ivar max_new_tokens: a suggested response budget (used by ``rlzoo sft``).
    """

    alphabet: str | None = None
    max_new_tokens: int | None = None

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        """Draw ``n`` examples using only ``rng`` (so runs are reproducible and resumable)."""
        raise NotImplementedError

    def answer_text(self, example: Example) -> str:
        """The completion a perfect policy would write (the SFT target); EOS is added by
        the trainer."""
        return str(example.reference)

    def format_text(self, example: Example, rng: random.Random) -> str:
        """A completion with the right format but not (in general) the right content: the
        target of a format-only warm-up (``rlzoo sft sft.target=format``)."""
        return self.answer_text(example)


class FileTask(Task):
    """Prompts and reference answers read from a JSONL or Parquet file.

    :param path: ``.jsonl`` (one JSON object a line) or ``.parquet`` file.
    :param prompt_key: field holding the prompt text.
    :param answer_key: field holding the reference answer.
    :raises ConfigError: missing, empty or malformed file, or missing fields.
    """

    def __init__(self, path: str, prompt_key: str = "prompt", answer_key: str = "answer") -> None:
        self.path = Path(path)
        rows = self._read()
        if not rows:
            raise ConfigError(f"task file {str(self.path)!r} holds no examples")
        examples = []
        for i, row in enumerate(rows):
            if not isinstance(row, dict) or prompt_key not in row or answer_key not in row:
                raise ConfigError(
                    f"task file {str(self.path)!r} row {i + 1} lacks {prompt_key!r} or "
                    f"{answer_key!r}: {str(row)[:200]}"
                )
            if not isinstance(row[prompt_key], str) or not row[prompt_key]:
                raise ConfigError(
                    f"task file {str(self.path)!r} row {i + 1}: {prompt_key!r} must be a "
                    f"non-empty string"
                )
            examples.append(Example(prompt=row[prompt_key], reference=row[answer_key]))
        self.examples = examples

    def _read(self) -> list[Any]:
        if not self.path.is_file():
            raise ConfigError(f"task file {str(self.path)!r} does not exist")
        suffix = self.path.suffix.lower()
        if suffix in (".jsonl", ".json"):
            rows = []
            for lineno, line in enumerate(self.path.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError(
                        f"task file {str(self.path)!r} line {lineno} is not valid JSON: {exc}"
                    ) from exc
            return rows
        if suffix == ".parquet":
            try:
                import pyarrow.parquet as pq
            except ImportError as exc:
                raise ConfigError(
                    "reading a .parquet task file needs pyarrow: pip install pyarrow"
                ) from exc
            return pq.read_table(self.path).to_pylist()
        raise ConfigError(
            f"task file {str(self.path)!r}: unsupported extension {suffix!r}; use .jsonl or .parquet"
        )

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        return [self.examples[rng.randrange(len(self.examples))] for _ in range(n)]
