"""Built-in tasks with verifiable answers, and the prompt-file task.

Each task is a factory ``factory(params) -> rlzoo.tasks.task.Task`` registered with the name of
its default reward function (``reward=`` meta). The generated tasks implement only
``sample``: the engine holds out a share of their prompt space for evaluation
(``eval.holdout``). docs/tasks.md is the guide (and docs/training.md explains the choice
of the default task).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

from rlzoo.api import Example, FileTask, hookimpl, Task

RLZOO_API_VERSION = "2"
DIGITS = "0123456789"


@dataclass
class SortDigitsParams:
    num_digits: int = 6
    """Digits in every prompt (1..30)."""

    def __post_init__(self) -> None:
        if not 1 <= self.num_digits <= 30:
            raise ValueError(f"num_digits must be in [1, 30], got {self.num_digits}")


class SortDigits(Task):
    """``"531826="`` → ``"123568"``: sort the prompt's digits ascending."""

    alphabet = DIGITS + "="

    def __init__(self, params: SortDigitsParams) -> None:
        self.num_digits = params.num_digits
        self.max_new_tokens = params.num_digits + 1

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        out = []
        for _ in range(n):
            digits = "".join(rng.choice(DIGITS) for _ in range(self.num_digits))
            out.append(Example(prompt=digits + "=", reference="".join(sorted(digits))))
        return out

    def format_text(self, example: Example, rng: random.Random) -> str:
        digits = list(example.prompt.rstrip("="))
        rng.shuffle(digits)
        return "".join(digits)


@dataclass
class ArithmeticParams:
    max_operand: int = 99
    """Operands are drawn uniformly from [0, max_operand]; in [1, 1000000]."""
    operations: str = "+-"
    """Characters among '+', '-', '*' to draw the operation from."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_operand <= 10**6:
            raise ValueError(f"max_operand must be in [1, 1000000], got {self.max_operand}")
        if not self.operations or set(self.operations) - set("+-*"):
            raise ValueError(f"operations must be a non-empty subset of '+-*', got {self.operations!r}")


class Arithmetic(Task):
    """``"12+34="`` → ``"46"`` (negative results written with a leading '-')."""

    alphabet = DIGITS + "+-*="

    def __init__(self, params: ArithmeticParams) -> None:
        self.params = params
        self.max_new_tokens = 2 * len(str(params.max_operand)) + 2

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        out = []
        for _ in range(n):
            a = rng.randint(0, self.params.max_operand)
            b = rng.randint(0, self.params.max_operand)
            op = rng.choice(self.params.operations)
            value = a + b if op == "+" else a - b if op == "-" else a * b
            out.append(Example(prompt=f"{a}{op}{b}=", reference=str(value)))
        return out

    def format_text(self, example: Example, rng: random.Random) -> str:
        return "".join(rng.choice(DIGITS) for _ in str(example.reference).lstrip("-"))


@dataclass
class CountdownParams:
    num_numbers: int = 3
    """How many numbers the prompt offers (2..6)."""
    max_number: int = 9
    """Numbers are drawn from [1, max_number]; in [2, 99]."""

    def __post_init__(self) -> None:
        if not 2 <= self.num_numbers <= 6:
            raise ValueError(f"num_numbers must be in [2, 6], got {self.num_numbers}")
        if not 2 <= self.max_number <= 99:
            raise ValueError(f"max_number must be in [2, 99], got {self.max_number}")


class Countdown(Task):
    """``"3,5,7:22="`` → an expression over some of the numbers (each at most once) with
    ``+ - *`` whose value is the target, e.g. ``"3*5+7"``. The reference is
    ``(numbers, target, one solution)``."""

    alphabet = DIGITS + ",:=+-*"

    def __init__(self, params: CountdownParams) -> None:
        self.params = params
        self.max_new_tokens = params.num_numbers * (len(str(params.max_number)) + 1) + 1

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        out = []
        for _ in range(n):
            numbers = [rng.randint(1, self.params.max_number) for _ in range(self.params.num_numbers)]
            order = numbers[:]
            rng.shuffle(order)
            expr = str(order[0])
            for number in order[1:]:
                expr += rng.choice("+-*") + str(number)
            target = eval_expression(expr)
            prompt = ",".join(map(str, numbers)) + f":{target}="
            out.append(Example(prompt=prompt, reference=(tuple(numbers), target, expr)))
        return out

    def answer_text(self, example: Example) -> str:
        return example.reference[2]

    def format_text(self, example: Example, rng: random.Random) -> str:
        numbers = list(example.reference[0])
        rng.shuffle(numbers)
        return "".join(str(x) + rng.choice("+-*") for x in numbers[:-1]) + str(numbers[-1])


@dataclass
class MultiplyParams:
    digits: int = 2
    """Digits of each operand (1..6): operands are drawn from [10^(digits-1), 10^digits - 1]."""

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 6:
            raise ValueError(f"digits must be in [1, 6], got {self.digits}")


class Multiply(Task):
    """``"37*48="`` → ``"1776"``: multi-digit multiplication, the task of the ``calculator``
    environment (its alphabet holds the calculator's compact call format, ``=`` and ``;``)."""

    alphabet = DIGITS + "+-*=;"

    def __init__(self, params: MultiplyParams) -> None:
        self.digits = params.digits
        self.max_new_tokens = 2 * params.digits + 1

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        low, high = 10 ** (self.digits - 1), 10 ** self.digits - 1
        out = []
        for _ in range(n):
            a, b = rng.randint(low, high), rng.randint(low, high)
            out.append(Example(prompt=f"{a}*{b}=", reference=str(a * b)))
        return out

    def format_text(self, example: Example, rng: random.Random) -> str:
        """A well-formed unsolved answer (``rlzoo sft --target format``): random digits, as many
        as the product has, the first not 0."""
        length = len(str(example.reference))
        return rng.choice(DIGITS[1:]) + "".join(rng.choice(DIGITS) for _ in range(length - 1))


@dataclass
class SecretParams:
    high: int = 9
    """The secret is drawn uniformly from [0, high] (1..10**6)."""
    tag_digits: int = 4
    """Digits of the random tag that makes each prompt distinct (2..8)."""

    def __post_init__(self) -> None:
        if not 1 <= self.high <= 10**6:
            raise ValueError(f"high must be in [1, 1000000], got {self.high}")
        if not 2 <= self.tag_digits <= 8:
            raise ValueError(f"tag_digits must be in [2, 8], got {self.tag_digits}")


class Secret(Task):
    """``"4821?"`` → ``"7"``: a secret integer in [0, ``high``] that the prompt says nothing of,
    for the ``guess`` environment, where only its higher/lower hints lead to the answer. The
    prompt is a random tag, independent of the secret, so that the held-out share
    (``eval.holdout``, a split of prompt texts) has a prompt space to split: a held-out tag
    was never trained on, and no tag tells anything of its secret. A policy that ignores the
    hints finds the secret within T guesses in at most T / (``high`` + 1) of the episodes."""

    alphabet = DIGITS + "+-=;?"

    def __init__(self, params: SecretParams) -> None:
        self.high, self.tag_digits = params.high, params.tag_digits
        self.max_new_tokens = len(str(params.high))

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        out = []
        for _ in range(n):
            tag = "".join(rng.choice(DIGITS) for _ in range(self.tag_digits))
            out.append(Example(prompt=f"{tag}?", reference=str(rng.randint(0, self.high))))
        return out

    def format_text(self, example: Example, rng: random.Random) -> str:
        """A well-formed guess: a random integer in [0, ``high``]."""
        return str(rng.randint(0, self.high))


def eval_expression(expr: str) -> Optional[int]:
    """Value of an expression of non-negative integers with ``+ - *`` (usual precedence),
    or ``None`` if it is not one. No ``eval``."""
    terms: list[int] = []
    sign, product, number = 1, 1, ""
    for ch in expr + "+":
        if ch.isdigit():
            number += ch
            continue
        if not number or ch not in "+-*":
            return None
        product *= int(number)
        number = ""
        if ch == "*":
            continue
        terms.append(sign * product)
        sign, product = (1 if ch == "+" else -1), 1
    return sum(terms)


@dataclass
class FileTaskParams:
    path: Optional[str] = None
    """A .jsonl or .parquet file, or a datasets save_to_disk directory, of prompts and reference answers (required)."""
    prompt_key: str = "prompt"
    """Column holding the prompt: text, or chat messages [{role, content}] (verl's and TRL's layout)."""
    answer_key: Optional[str] = None
    """Column holding the reference answer (the reward's ``references``), dots for a nested field; None:
    ``answer``, or verl's ``reward_model.ground_truth`` in a file that has it and no ``answer``."""
    eval_path: Optional[str] = None
    """A file of evaluation rows (same kinds); None: the rows whose prompt falls in the
    held-out share (``eval.holdout``) evaluate and the rest train."""
    split: str = "train"
    """The split read from a DatasetDict directory (``path`` and ``eval_path``)."""
    eval_split: Optional[str] = None
    """A split of the DatasetDict at ``path`` to evaluate on (instead of ``eval_path``)."""

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("path is required: task={name: file, path: data.jsonl}")


def _file_task(params: FileTaskParams) -> Task:
    return FileTask(params.path, params.prompt_key, params.answer_key, params.eval_path, params.split,
                    params.eval_split)


@hookimpl
def rlzoo_register_tasks(register) -> None:
    register("sort_digits", SortDigits, params=SortDigitsParams, reward="sorted_digits",
             description="sort the prompt's digits ascending (partial credit per position)")
    register("arithmetic", Arithmetic, params=ArithmeticParams, reward="exact_match",
             description="add/subtract/multiply two integers; exact-match reward")
    register("countdown", Countdown, params=CountdownParams, reward="countdown",
             description="reach the target with + - * over the given numbers",
             paper="TinyZero countdown")
    register("multiply", Multiply, params=MultiplyParams, reward="exact_match",
             description="multi-digit multiplication (the calculator environment's task); exact-match reward")
    register("secret", Secret, params=SecretParams, reward="exact_match",
             description="a secret integer the prompt says nothing of (the guess environment's task: only "
                         "its hints find it); exact-match reward")
    register("file", _file_task, params=FileTaskParams, reward="exact_match",
             description="prompts (text or chat messages) + reference answers from a JSONL/Parquet file or a "
                         "datasets directory, in shuffled epochs")
