"""Answer formats: where a completion's final answer is, ``fn(text) -> list[str]``.

An answer format (kind ``answer_format``, chosen by ``answer_format=NAME``) returns every
answer-like span of a completion, in order of appearance; the run's answer is the *last*
one (models restate and correct themselves), ``None`` when there is none. Reward functions
that name the ``answers`` input receive it (``exact_match``, ``numeric_match``,
``reasoning_gym``, ``format``), and evaluation reports *strict* accuracy (the right answer
where the format says) and *lenient* accuracy (the right answer among the spans of any
format). Each format registers a ``hint``: the sentence ``{format}`` stands for in
``task.instruction``. docs/tasks.md is the guide.
"""

from __future__ import annotations

import re

from rlzoo.api import hookimpl
RLZOO_API_VERSION = "2"


def plain(text: str) -> list[str]:
    """The whole completion (the default: reward functions compare the completion itself)."""
    return [text]


_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def answer_tag(text: str) -> list[str]:
    """The contents of every ``<answer>…</answer>`` pair, stripped (an unclosed tag holds none)."""
    return [match.strip() for match in _TAG.findall(text)]


_BOXED = re.compile(r"\\boxed\s*\{")


def boxed(text: str) -> list[str]:
    """The contents of every ``\\boxed{…}``, braces nested inside it kept
    (``\\boxed{\\frac{1}{2}}`` → ``\\frac{1}{2}``), stripped; an unbalanced one holds none."""
    found = []
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                found.append(text[start:i].strip())
                break
    return found


_NUMBER = re.compile(r"(?<![\d.])-?\d+(?:,\d{3})*(?:\.\d+)?")


def last_number(text: str) -> list[str]:
    """Every number (an optional leading ``-``, thousands commas dropped, decimals kept):
    the answer is the last one."""
    return [match.replace(",", "") for match in _NUMBER.findall(text)]


def exact_line(text: str) -> list[str]:
    """Every non-empty line, stripped: the answer is the last line, exactly."""
    return [line.strip() for line in text.splitlines() if line.strip()]


@hookimpl
def rlzoo_register_answer_formats(register) -> None:
    register("plain", plain, hint="",
             description="the whole completion is the answer (the default)")
    register("answer_tag", answer_tag, hint="Give your final answer between <answer> and </answer>.",
             description="the last <answer>…</answer>")
    register("boxed", boxed, hint="Put your final answer within \\boxed{}.",
             description="the last \\boxed{…} (nested braces kept)")
    register("last_number", last_number, hint="End your reply with the final answer as a number.",
             description="the last number in the completion")
    register("exact_line", exact_line, hint="Write the final answer alone on the last line.",
             description="the last non-empty line, stripped")
