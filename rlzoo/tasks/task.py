"""What a task is: a source of prompts with reference answers, its held-out split, and the
loader for users' prompt files.

Tasks are plugins (kind ``task``). A task implements :meth:`Task.sample`; the engine draws
training prompts through :meth:`Task.sample_train` and evaluation prompts through
:meth:`Task.eval_set`, which split every task the same way unless it overrides them
(:class:`FileTask` does, for epochs and ``eval_path``). docs/tasks.md is the guide.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from rlzoo.core.errors import ConfigError
from rlzoo.config.yamlfile import read_utf8

PROBE_DRAWS = 256
"""Examples drawn (with a throw-away RNG) to check a task that cannot list its examples."""


@dataclass(frozen=True)
class Example:
    """One prompt, the reference the reward compares a completion with, and the row it
    came from.

    :ivar prompt: the prompt text (before any chat template).
    :ivar reference: what the reward function receives as ``references[i]`` (any value).
    :ivar row: further columns of the example (a file task's whole row), passed to reward
        functions that name the ``rows`` input; empty for the built-in generated tasks.
    :ivar messages: the prompt as chat messages (``{role, content}`` dicts) when the data
        gives it so; ``prompt`` is then their text (:mod:`rlzoo.tasks.prompts` renders them).
    """

    prompt: str
    reference: Any
    row: Mapping[str, Any] = field(default_factory=dict, compare=False)
    messages: tuple[Mapping[str, str], ...] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Holdout:
    """The held-out share of a task's prompt space (``eval.holdout``).

    Every prompt text has a key in [0, 1), a keyed hash of the text; a prompt is held out
    when its key is below ``fraction``. The split is a pure function of the prompt, so
    every seed, algorithm and process agrees on it, and training never sees a prompt that
    evaluation uses. A finite list of prompts (a file) holds out exactly
    ``max(1, round(fraction · distinct prompts))`` of them instead: those with the
    smallest keys (:meth:`select`).
    """

    fraction: float

    @staticmethod
    def key(prompt: str) -> float:
        """The prompt's position in [0, 1) (uniform over prompts, fixed for ever)."""
        digest = hashlib.blake2b(prompt.encode("utf-8"), digest_size=8, person=b"rlzoo-eval").digest()
        return int.from_bytes(digest, "big") / 2.0**64

    def contains(self, prompt: str) -> bool:
        """Whether ``prompt`` belongs to the held-out (evaluation) share."""
        return self.fraction > 0 and self.key(prompt) < self.fraction

    def select(self, prompts: list[str]) -> set[str]:
        """The held-out prompts of a finite list: the share ``fraction`` of its distinct
        prompts (at least one when ``fraction`` > 0 and there are two or more), smallest
        keys first."""
        distinct = sorted(set(prompts), key=self.key)
        if self.fraction <= 0 or len(distinct) < 2:
            return set()
        count = min(len(distinct) - 1, max(1, round(self.fraction * len(distinct))))
        return set(distinct[:count])


class Task:
    """Base class of tasks. Subclasses implement :meth:`sample`; the rest has defaults.

    :ivar alphabet: every character the task's prompts and answers use: the embedded
        character-level tokenizer is built from it (characters outside it become
        ``<unk>``). ``None`` when the task needs a real tokenizer (``model.path``).
    :ivar max_new_tokens: a suggested response budget in tokens; ``rlzoo sft`` uses it
        (RL runs use ``rollout.max_new_tokens``).
    """

    alphabet: str | None = None
    max_new_tokens: int | None = None

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        """Draw ``n`` examples from the task's whole distribution, using only ``rng`` (so
        runs are reproducible and resumable). Held-out prompts may come out: the engine
        drops them from training (:meth:`sample_train`)."""
        raise NotImplementedError

    def sample_train(self, n: int, rng: random.Random, holdout: Holdout) -> list[Example]:
        """``n`` training examples: draws of :meth:`sample` whose prompt is not held out.

        :raises ConfigError: the draws keep landing in the held-out share (a prompt space
            too small for ``eval.holdout``).
        """
        out: list[Example] = []
        drawn = 0
        while len(out) < n:
            batch = self.sample(n - len(out), rng)
            drawn += len(batch)
            out += [example for example in batch if not holdout.contains(example.prompt)]
            if drawn >= 100 * n and len(out) < n:
                raise ConfigError(f"{type(self).__name__}: {drawn} draws gave {len(out)} training prompts; the "
                                  f"prompt space is too small for eval.holdout={holdout.fraction}: lower it")
        return out

    def eval_set(self, size: int, holdout: Holdout) -> list[Example]:
        """Up to ``size`` distinct held-out examples, the same for every run of the task:
        draws of :meth:`sample` with a fixed RNG (at most ``100 · size``) whose prompt is
        held out. Fewer when the held-out share has fewer distinct prompts."""
        rng = random.Random("rlzoo-eval")
        found: dict[str, Example] = {}
        for _ in range(100):
            for example in self.sample(size, rng):
                if holdout.contains(example.prompt) and example.prompt not in found:
                    found[example.prompt] = example
            if len(found) >= size:
                break
        return list(found.values())[:size]

    def examples(self) -> list[Example] | None:
        """Every example, when the task holds a finite list (a file); ``None`` otherwise.
        Used to check that the tokenizer can encode them."""
        return None

    def answer_text(self, example: Example) -> str:
        """The completion a perfect policy would write (the SFT target); EOS is added by
        the trainer."""
        return str(example.reference)

    def format_text(self, example: Example, rng: random.Random) -> str:
        """A completion with the right format but not (in general) the right content: the
        target of a format-only warm-up (``rlzoo sft --target format``)."""
        return self.answer_text(example)

    def state_dict(self) -> dict[str, Any]:
        """Progress through the task's data (plain values, saved in checkpoints). Stateless
        tasks, which draw only from the ``rng`` they are given, keep the default ``{}``."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


def _unencodable(texts: list[str], tokenizer: Any) -> list[tuple[str, str]]:
    """``(text, characters)`` for every text the tokenizer maps partly to its unknown token
    (byte-level tokenizers have none: nothing is unencodable). One batched call for all."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or not texts:
        return []
    encoded = tokenizer(texts, add_special_tokens=False).input_ids
    bad = []
    for text, ids in zip(texts, encoded):
        if unk in ids:
            chars = sorted(set(text))
            per_char = tokenizer(chars, add_special_tokens=False).input_ids
            bad.append((text, "".join(ch for ch, char_ids in zip(chars, per_char) if unk in char_ids)))
    return bad


def _missing(reference: Any) -> bool:
    """A reference answer that gives nothing to compare with: null, or text that is empty or blank."""
    return reference is None or (isinstance(reference, str) and not reference.strip())


def check_references(task: Task, task_name: str, use: str | None) -> list[str]:
    """Check that the examples of a task that lists them (a file) have reference answers
    when something reads them: a reward that compares with a null reference scores 0
    whatever the policy writes, one that compares with an empty reference rewards the empty
    completion, and an SFT target would be the text ``None`` or nothing.

    :param use: how the run reads the references, completing "but ..." (``reward
        'exact_match' compares completions with them``); ``None``: nothing reads them, no check.
    :returns: a warning to print when some references are null or empty.
    :raises ConfigError: every reference is null or empty (naming the count and the use).
    """
    examples = task.examples()
    if examples is None or use is None:
        return []
    missing = [example.reference for example in examples if _missing(example.reference)]
    kinds = " or ".join(k for k, there in (("null", any(r is None for r in missing)),
                                          ("empty", any(r is not None for r in missing))) if there)
    where = f"task {task_name!r}"
    if missing and len(missing) == len(examples):
        raise ConfigError(f"{where}: every reference answer is {kinds} (all {len(missing)} examples), but {use}: "
                          "fill the answers, set task.answer_key to the column that holds them, or use a reward "
                          "that reads none (reward_model)")
    if missing:
        article = "an" if kinds.startswith("empty") else "a"
        return [f"{where}: {len(missing)} of {len(examples)} examples have {article} {kinds} reference answer, "
                f"but {use}"]
    return []


def probe_examples(task: Task, holdout: Holdout) -> list[Example]:
    """The examples a check looks at: every example of a task that lists them (a file), else
    16 of its evaluation set plus :data:`PROBE_DRAWS` draws (a fixed, throw-away RNG)."""
    examples = task.examples()
    if examples is None:
        examples = task.eval_set(16, holdout) + task.sample(PROBE_DRAWS, random.Random("rlzoo-probe"))
    return examples


def check_encodable(task: Task, task_name: str, tokenizer: Any, holdout: Holdout) -> list[str]:
    """Check that the tokenizer can encode the task's prompts and answers.

    Every example of a task that lists them (:meth:`Task.examples`), else the evaluation
    set plus :data:`PROBE_DRAWS` draws. An answer the tokenizer cannot encode could never
    be written by the policy (its reward would stay 0 silently): refused. A prompt with
    such characters is encoded with ``<unk>`` in their place: a warning with the count.

    :returns: warnings to print.
    :raises ConfigError: an answer is not encodable (naming the count, an example and the
        characters).
    """
    examples = probe_examples(task, holdout)
    bad_answers = _unencodable([task.answer_text(e) for e in examples], tokenizer)
    bad_prompts = _unencodable([e.prompt for e in examples], tokenizer)
    where = f"task {task_name!r}"
    union = lambda bad: "".join(sorted({ch for _, missing in bad for ch in missing}))  # noqa: E731
    if bad_answers:
        raise ConfigError(f"{where}: {len(bad_answers)} of {len(examples)} checked answers contain characters "
                          f"the tokenizer cannot encode ({union(bad_answers)!r}), e.g. {bad_answers[0][0][:80]!r}: "
                          "the policy could never write them. Use a model.path whose tokenizer covers them, or "
                          "leave those examples out of the data")
    if bad_prompts:
        return [f"{where}: {len(bad_prompts)} of {len(examples)} checked prompts contain characters the tokenizer "
                f"cannot encode ({union(bad_prompts)!r}; the model sees <unk> instead), e.g. "
                f"{bad_prompts[0][0][:80]!r}"]
    return []


class FileTask(Task):
    """Prompts and reference answers read from a data file, iterated in seeded shuffled
    epochs.

    Files: JSONL (one object a line), Parquet, or a directory written by ``datasets``'
    ``save_to_disk`` (a ``Dataset``, or a ``DatasetDict`` whose ``split`` is read; read
    with pyarrow, ``datasets`` is not needed). The prompt column holds text, or chat
    messages (a list of ``{role, content}``: verl's and TRL's layout), which keep their
    turns (:mod:`rlzoo.tasks.prompts`); the example's ``prompt`` text is then the last user turn.
    ``answer_key`` may name a nested field with dots (verl's ``reward_model.ground_truth``);
    unset, it is ``answer``, or ``reward_model.ground_truth`` in a file without an
    ``answer`` column that has it. Every column reaches reward functions as the row.

    The rows whose prompts :meth:`Holdout.select` holds out are the evaluation set; with
    ``eval_path`` (or ``eval_split``) those rows are the evaluation set instead and every
    row of ``path`` trains. Training walks the training rows in a random order drawn from
    the run's sampler RNG, a new order each epoch; the position is saved in checkpoints,
    so a resumed run continues the same epoch. Its ``alphabet`` is every character of the
    files' prompts and answers, so the embedded tiny model can train on it without
    ``model.path``.

    :param path: a ``.jsonl`` / ``.parquet`` file or a ``save_to_disk`` directory.
    :param prompt_key: column holding the prompt (text or messages).
    :param answer_key: column holding the reference answer (dots for nested fields).
    :param eval_path: a file of the same kinds holding the evaluation examples.
    :param split: the split of a ``DatasetDict`` directory to train on.
    :param eval_split: a split of ``path`` (a ``DatasetDict`` directory) to evaluate on.
    :raises ConfigError: missing, empty or malformed file, or missing fields (naming the
        file, row and column).
    """

    def __init__(self, path: str, prompt_key: str = "prompt", answer_key: str | None = None,
                 eval_path: str | None = None, split: str = "train", eval_split: str | None = None) -> None:
        self.path = Path(path)
        self.prompt_key, self.answer_key = prompt_key, answer_key
        self.rows = self._load(self.path, split)
        if eval_path and eval_split:
            raise ConfigError("give eval_path or eval_split, not both")
        self.eval_rows = (self._load(Path(eval_path), split) if eval_path else
                          self._load(self.path, eval_split) if eval_split else None)
        texts = [self.answer_text(e) + "".join(m["content"] for m in e.messages or [{"content": e.prompt}])
                 for e in self.examples()]
        self.alphabet = "".join(sorted({ch for text in texts for ch in text}))
        self.epoch, self.cursor, self.epoch_seed = 0, 0, None
        self._order: list[int] | None = None
        self._held_out: set[str] | None = None
        self._train_rows: list[int] | None = None

    def _load(self, path: Path, split: str) -> list[Example]:
        rows = read_rows(path, split=split)
        if not rows:
            raise ConfigError(f"task file {str(path)!r} holds no examples")
        answer_key = self.answer_key or _default_answer_key(rows[0])
        examples = []
        for i, row in enumerate(rows):
            where = f"task file {str(path)!r} row {i + 1}"
            if not isinstance(row, dict):
                raise ConfigError(f"{where} is a {type(row).__name__}, not an object of columns: {str(row)[:200]}")
            found, reference = _field(row, answer_key)
            if self.prompt_key not in row or not found:
                missing = self.prompt_key if self.prompt_key not in row else answer_key
                raise ConfigError(f"{where} lacks column {missing!r} (columns: {', '.join(map(str, row))}); set "
                                  f"task.{'prompt_key' if missing == self.prompt_key else 'answer_key'}")
            prompt, messages = _prompt(row[self.prompt_key], f"{where} column {self.prompt_key!r}")
            examples.append(Example(prompt=prompt, reference=reference, row=row, messages=messages))
        return examples

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        """``n`` rows drawn uniformly with replacement (``rlzoo sft``; training uses epochs)."""
        return [self.rows[rng.randrange(len(self.rows))] for _ in range(n)]

    def examples(self) -> list[Example]:
        return self.rows + (self.eval_rows or [])

    def held_out(self, holdout: Holdout) -> set[str]:
        """The prompts of ``path`` kept for evaluation (none with ``eval_path``)."""
        if self._held_out is None:
            self._held_out = set() if self.eval_rows is not None else holdout.select([r.prompt for r in self.rows])
        return self._held_out

    def _training_rows(self, holdout: Holdout) -> list[int]:
        if self._train_rows is None:
            held_out = self.held_out(holdout)
            self._train_rows = [i for i, row in enumerate(self.rows) if row.prompt not in held_out]
        return self._train_rows

    def sample_train(self, n: int, rng: random.Random, holdout: Holdout) -> list[Example]:
        """The next ``n`` training rows of the current epoch's order (a new seeded order
        each epoch, drawn from ``rng``)."""
        rows = self._training_rows(holdout)
        out = []
        while len(out) < n:
            if self.epoch_seed is None or self.cursor >= len(rows):
                if self.epoch_seed is not None:
                    self.epoch += 1
                self.epoch_seed, self.cursor, self._order = rng.getrandbits(63), 0, None
            if self._order is None:
                self._order = list(rows)
                random.Random(self.epoch_seed).shuffle(self._order)
            take = self._order[self.cursor:self.cursor + n - len(out)]
            self.cursor += len(take)
            out += [self.rows[i] for i in take]
        return out

    def eval_set(self, size: int, holdout: Holdout) -> list[Example]:
        """The first ``size`` rows of ``eval_path``, or of the held-out rows of ``path``."""
        if self.eval_rows is not None:
            return self.eval_rows[:size]
        held_out = self.held_out(holdout)
        return [row for row in self.rows if row.prompt in held_out][:size]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "cursor": self.cursor, "epoch_seed": self.epoch_seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.cursor, self.epoch_seed = int(state["epoch"]), int(state["cursor"]), state["epoch_seed"]
        self._order = None


ROLES = ("system", "user", "assistant", "tool")
"""The roles a chat-messages prompt may use."""


def _default_answer_key(row: Any) -> str:
    """``answer``, or verl's ``reward_model.ground_truth`` when the row has that and no ``answer``."""
    if isinstance(row, dict) and "answer" not in row and _field(row, "reward_model.ground_truth")[0]:
        return "reward_model.ground_truth"
    return "answer"


def _field(row: Any, key: str) -> tuple[bool, Any]:
    """``(found, value)`` of a column, or of a nested field named with dots."""
    if isinstance(row, dict) and key in row:
        return True, row[key]
    node = row
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _prompt(value: Any, where: str) -> tuple[str, tuple[dict[str, str], ...] | None]:
    """``(prompt text, messages or None)`` of a prompt cell: a non-empty string, or a
    non-empty list of ``{role, content}`` with a user turn (its last one is the text).

    :raises ConfigError: naming ``where`` (file, row, column) and what is wrong.
    """
    if isinstance(value, str):
        if not value:
            raise ConfigError(f"{where} is empty; a prompt is a non-empty string or a list of chat messages")
        return value, None
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"{where} is {str(value)[:100]!r}; a prompt is a non-empty string or a list of chat "
                          "messages [{role, content}]")
    messages = []
    for j, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str) or \
                message.get("role") not in ROLES:
            raise ConfigError(f"{where} message {j + 1} is {str(message)[:100]!r}; each message is {{role, content}} "
                              f"with role one of {', '.join(ROLES)} and content a string")
        messages.append({"role": message["role"], "content": message["content"]})
    users = [m["content"] for m in messages if m["role"] == "user"]
    if not users or not users[-1]:
        raise ConfigError(f"{where} has no non-empty user message")
    return users[-1], tuple(messages)


def read_rows(path: Path, what: str = "task file", split: str = "train") -> list[Any]:
    """The rows of a ``.jsonl`` / ``.json`` (one object a line) or ``.parquet`` file, or of
    a ``datasets`` ``save_to_disk`` directory (``split`` of a ``DatasetDict``).

    Every data file of rlzoo is read here (``task=file``, ``rlzoo rm``'s ``rm.data``), so a
    file is refused the same way whichever command reads it.

    :param what: how errors name the file (``task file``, ``preference file``).
    :raises ConfigError: missing file, bytes that are not UTF-8, a line that is not JSON, an
        unknown extension, a Parquet or Arrow file pyarrow cannot read (a damaged footer).
    """
    if path.is_dir():
        with _unreadable_arrow(path, what):
            return _read_saved_dataset(path, split, what)
    if not path.is_file():
        raise ConfigError(f"{what} {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        rows = []
        text = read_utf8(path, what, "give JSON lines (one object a line)")
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{what} {str(path)!r} line {lineno} is not valid JSON: {exc}") from exc
        return rows
    if suffix == ".parquet":
        pyarrow = _pyarrow(path, what)
        with _unreadable_arrow(path, what):
            return pyarrow.parquet.read_table(path).to_pylist()
    raise ConfigError(f"{what} {str(path)!r}: unsupported extension {suffix!r}; use .jsonl, .parquet or a "
                      "directory written by datasets' save_to_disk")


@contextlib.contextmanager
def _unreadable_arrow(path: Path, what: str) -> Iterator[None]:
    """Turn pyarrow's failure to read a Parquet / Arrow file (a damaged or lying footer,
    not Parquet at all) into a :class:`ConfigError` naming the file."""
    try:
        yield
    except ConfigError:
        raise
    except (OSError, ValueError, TypeError, KeyError, IndexError, NotImplementedError) as exc:
        # pyarrow's errors derive from these (ArrowInvalid: ValueError, ArrowIOError: OSError, ...)
        lines = str(exc).strip().splitlines()
        raise ConfigError(f"{what} {str(path)!r} cannot be read ({type(exc).__name__}: "
                          f"{lines[0] if lines else ''})") from exc


def _pyarrow(path: Path, what: str) -> Any:
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError as exc:
        raise ConfigError(f"reading {what} {str(path)!r} needs pyarrow: pip install 'rlzoo[files]'") from exc
    return pyarrow


def _read_saved_dataset(path: Path, split: str, what: str) -> list[Any]:
    """The rows of a ``save_to_disk`` directory: its Arrow shards (``state.json``), or those
    of ``split`` in a ``DatasetDict`` directory (``dataset_dict.json``)."""
    splits_file = path / "dataset_dict.json"
    if splits_file.is_file():
        splits = json.loads(splits_file.read_text()).get("splits", [])
        if split not in splits:
            raise ConfigError(f"{what} {str(path)!r} is a DatasetDict without split {split!r}; its splits: "
                              f"{', '.join(splits)} (set task.split)")
        path = path / split
    state_file = path / "state.json"
    if not state_file.is_file():
        raise ConfigError(f"{what} {str(path)!r} is a directory but not one written by datasets' save_to_disk "
                          "(no state.json or dataset_dict.json)")
    pa = _pyarrow(path, what)
    rows: list[Any] = []
    for shard in json.loads(state_file.read_text()).get("_data_files", []):
        with pa.memory_map(str(path / shard["filename"])) as source:
            rows += pa.ipc.open_stream(source).read_all().to_pylist()
    return rows
