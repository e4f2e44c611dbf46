"""Reward functions: rule-based ones, ``fn(prompts, completions, references) -> list[float]``,
and ``reward_model``, a scorer class built once per run that scores with a learned model.

Rule-based ones that name ``answers`` compare the answer the run's ``answer_format`` finds
in each completion (the whole completion under the default ``plain``; ``None``, scored 0,
where the format finds none), so ``answer_format=answer_tag`` works with them unchanged.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from rlzoo_plugins.tasks import eval_expression

from rlzoo import api
from rlzoo.api import hookimpl

RLZOO_API_VERSION = "2"


def sorted_digits(prompts: list[str], completions: list[str], references: list[str]) -> list[float]:
    """Partial credit for sorting: the share of positions where the completion matches the
    sorted reference, over the longer of the two lengths (so missing and extra characters
    both cost). 1.0 is a perfect answer; an empty completion scores 0."""
    scores = []
    for completion, reference in zip(completions, references):
        length = max(len(completion), len(reference), 1)
        scores.append(sum(a == b for a, b in zip(completion, reference)) / length)
    return scores


@dataclass
class ExactMatchParams:
    strip: bool = True
    """Compare after stripping surrounding whitespace."""


def _answers(completions: list[str], answers: list[str | None] | None) -> list[str | None]:
    return list(completions) if answers is None else answers


def exact_match(prompts: list[str], completions: list[str], references: list[object],
                answers: list[str | None] | None = None, params: ExactMatchParams | None = None) -> list[float]:
    """1.0 when the answer (the completion under ``answer_format=plain``) equals the
    reference (as text), else 0.0."""
    params = params or ExactMatchParams()
    norm = (lambda s: s.strip()) if params.strip else (lambda s: s)
    pairs = zip(_answers(completions, answers), references)
    return [float(a is not None and norm(a) == norm(str(r))) for a, r in pairs]


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def numeric_match(prompts: list[str], completions: list[str], references: list[object],
                  answers: list[str | None] | None = None) -> list[float]:
    """1.0 when the last number in the answer (the completion under ``answer_format=plain``)
    equals the reference number."""
    scores = []
    for answer, reference in zip(_answers(completions, answers), references):
        found = _NUMBER.findall(answer or "")
        try:
            scores.append(float(bool(found) and float(found[-1]) == float(str(reference))))
        except ValueError:
            scores.append(0.0)
    return scores


def length_match(prompts: list[str], completions: list[str], references: list[object]) -> list[float]:
    """A format reward: 1 − |len(completion) − len(reference)| / len(reference) in
    characters (surrounding whitespace stripped), floored at 0; an empty reference scores 1
    for an empty completion, else 0. A second objective for ``reward=[...]`` (e.g. with
    ``exact_match`` under ``gdpo``)."""
    scores = []
    for completion, reference in zip(completions, references):
        got, want = len(completion.strip()), len(str(reference).strip())
        scores.append(float(got == 0) if want == 0 else max(0.0, 1.0 - abs(got - want) / want))
    return scores


def format_reward(prompts: list[str], completions: list[str], answers: list[str | None] | None = None) -> list[float]:
    """A format reward: 1.0 when the run's ``answer_format`` finds an answer in the
    completion, else 0.0 (always 1 under ``plain``). Combine it with the task's reward:
    ``reward=[reasoning_gym, {name: format, weight: 0.2}]``."""
    return [float(a is not None) for a in _answers(completions, answers)]


@dataclass
class CountdownRewardParams:
    format_score: float = 0.1
    """Score of a well-formed expression over allowed numbers that misses the target; in [0, 1]."""

    def __post_init__(self) -> None:
        if not 0 <= self.format_score <= 1:
            raise ValueError(f"format_score must be in [0, 1], got {self.format_score}")


def countdown(prompts: list[str], completions: list[str], references: list[tuple],
              params: CountdownRewardParams | None = None) -> list[float]:
    """1.0 for an expression that uses each offered number at most once and equals the
    target; ``format_score`` for a valid expression that misses; 0 otherwise."""
    params = params or CountdownRewardParams()
    scores = []
    for completion, (numbers, target, _) in zip(completions, references):
        value = eval_expression(completion.strip())
        used = [int(x) for x in re.findall(r"\d+", completion)]
        pool = list(numbers)
        valid = value is not None and bool(used)
        for number in used:
            if number in pool:
                pool.remove(number)
            else:
                valid = False
        scores.append(0.0 if not valid else 1.0 if value == target else params.format_score)
    return scores


RM_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class RewardModelParams:
    path: str = ""
    """A local reward-model directory: written by `rlzoo rm`, any one-label
    ...ForSequenceClassification `save_pretrained` directory, or an rlzoo critic."""
    dtype: str = "auto"
    """auto (the dtype its config.json records) | float32 | bfloat16 | float16."""
    batch_size: int = 32
    """Sequences per forward pass (bounds the scorer's memory)."""
    chat_template: Optional[bool] = None
    """null: render [user: prompt, assistant: completion] with the reward model's chat template
    when its tokenizer has one, else prompt + completion; true | false to insist."""
    normalize: bool = False
    """Standardise scores by the running mean / std of the training batches every rank scored
    in the steps before this one (statistics shared by all ranks; kept in checkpoints)."""
    clip: float = 0.0
    """> 0: clip the (normalised) score to [-clip, clip]."""

    def __post_init__(self) -> None:
        if self.dtype not in RM_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(RM_DTYPES)}, got {self.dtype!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.clip >= 0:
            raise ValueError(f"clip must be >= 0 (0: no clipping), got {self.clip}")


class RewardModel:
    """Scores prompt + completion with a frozen learned reward model (:mod:`rlzoo.models.reward_model`).

    Built once per run on the run's device; the decoded text is re-tokenised with the reward
    model's own tokenizer and chat template, scored ``batch_size`` sequences at a time in the
    model's own dtype, then optionally normalised (running mean / std over the training batches
    of the steps before, all ranks', in the checkpoint) and clipped. ``timing/reward_model_s``
    logs the scoring time per step.
    """

    training = True
    """Set by the engine: False while scoring evaluation or greedy completions (the running
    statistics then stay as they are)."""

    def __init__(self, device: torch.device, params: RewardModelParams) -> None:
        self.describe(params)
        self.params, self.device = params, device
        self.model, self.tokenizer = api.load_reward_model(params.path, params.dtype, device)
        self.templated = api.uses_chat_template(self.tokenizer, params.chat_template)
        self.context, self.warned = api.context_length(self.model), False
        self.moments = api.RunningMoments()
        self.seconds = 0.0

    @staticmethod
    def describe(params: RewardModelParams) -> str:
        """The plan's line for this scorer.

        :raises ValueError: no ``path``, or not a reward-model directory.
        """
        if not params.path:
            raise ValueError("set path=DIR: a local reward-model directory (`rlzoo rm` writes one; "
                             "docs/reward-models.md)")
        reason = api.is_reward_model_dir(params.path)
        if reason is not None:
            raise ValueError(reason)
        extra = (", normalised by the running mean/std of the steps before (all ranks)" if params.normalize else "") + \
            (f", clipped to ±{params.clip:g}" if params.clip > 0 else "")
        if (where := api.tokenizer_dir(params.path)) != Path(params.path):
            extra += f"; its tokenizer is the one in {where} (an rlzoo critic shares the checkpoint's policy's)"
        return (f"frozen reward model {params.path} ({params.dtype} dtype, {params.batch_size} sequences per "
                "forward): reads prompt + completion as decoded text re-tokenised with its own tokenizer and "
                f"chat template (the policy's token ids are not reused, so its tokenizer may differ){extra}")

    def __call__(self, prompts: list[Any], completions: list[Any]) -> torch.Tensor:
        start = time.perf_counter()
        texts = [api.reward_text(self.tokenizer, p, c, self.templated) for p, c in zip(prompts, completions)]
        ids, cut = api.fit_context(api.encode(self.tokenizer, texts, self.templated), self.context)
        if cut and not self.warned:
            self.warned = True
            print(f"rlzoo: warning: {api.cut_warning('reward_model', cut, len(texts), self.context)}", file=sys.stderr,
                  flush=True)
        scores = api.score_ids(self.model, ids, self.tokenizer.pad_token_id, self.params.batch_size, self.device)
        if self.params.normalize:
            if self.training:
                self.moments.update(scores)
            scores = self.moments.normalize(scores)
        if self.params.clip > 0:
            scores = scores.clamp(-self.params.clip, self.params.clip)
        self.seconds += time.perf_counter() - start
        return scores

    def settle(self, reduce: api.Reduce | None) -> None:
        """Fold the training scores of this step into the normalisation statistics, every
        rank's (``reduce`` sums over ranks: one collective, every rank calls it once per step;
        ``None``: this process's alone)."""
        if self.params.normalize:
            self.moments.settle(reduce)

    def metrics(self) -> dict[str, float]:
        """Seconds spent scoring since the last call (``timing/reward_model_s``)."""
        seconds, self.seconds = self.seconds, 0.0
        return {"timing/reward_model_s": seconds}

    def state_dict(self) -> dict[str, Any]:
        return {"moments": self.moments.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.moments.load_state_dict(state["moments"])


@hookimpl
def rlzoo_register_reward_functions(register) -> None:
    register("sorted_digits", sorted_digits,
             description="share of positions matching the sorted digits (partial credit)")
    register("exact_match", exact_match, params=ExactMatchParams,
             description="1 if the completion equals the reference answer")
    register("numeric_match", numeric_match,
             description="1 if the last number in the completion equals the reference")
    register("format", format_reward,
             description="1 if the run's answer_format finds an answer (a format reward for reward=[...])")
    register("length_match", length_match,
             description="1 − relative length difference to the reference (a format reward)")
    register("countdown", countdown, params=CountdownRewardParams,
             description="1 if the expression hits the target using the offered numbers")
    register("reward_model", RewardModel, params=RewardModelParams,
             description="score of a frozen learned reward model (a local directory; `rlzoo rm` trains one)",
             paper="arXiv:2203.02155")
