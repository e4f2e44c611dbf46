"""Evaluation on the task's held-out prompts: greedy accuracy and pass@k.

Every ``eval.every`` steps and after the last step, the policy answers each of the
``eval.size`` held-out prompts (:meth:`rlzoo.tasks.task.Task.eval_set`, never trained on) once
greedily and ``eval.n`` times by sampling at the rollout temperature; the run's reward
function scores them. A completion is *correct* when its score is at least
``eval.threshold`` (default 1.0: a perfect answer, also for partial-credit rewards).
Logged tags:

- ``eval/greedy_accuracy``: share of prompts whose greedy completion is correct;
- ``eval/greedy_score``: mean score of the greedy completions (partial credit counts);
- ``eval/strict_accuracy``: share of prompts whose greedy completion is correct *and*
  holds an answer where the run's ``answer_format`` says (the right answer in the
  requested format; equal to ``greedy_accuracy`` under ``answer_format=plain``);
- ``eval/lenient_accuracy``: share of prompts whose greedy completion holds the right
  answer anywhere: its best score over every span any registered answer format finds
  (:meth:`rlzoo.rollout.scoring.Rewards.lenient_scores`) is correct; at least the strict accuracy;
- ``eval/pass@1``: mean over prompts of c/n, c the correct ones among the n samples;
- ``eval/pass@<n>``: the unbiased pass@n estimate (some sample correct), when n > 1;
- ``eval/sampled_score``: mean score of the samples (``reward/mean`` on held-out prompts);
- ``eval/greedy_turns``: with an environment, the mean policy turns of the greedy episodes
  (the samples table then shows whole episodes);
- ``timing/eval_s``: seconds the evaluation took (not part of ``timing/step_s``).

With ``eval.at_start=true`` a fresh run also evaluates before its first step (logged at
step 0), so every tag has a before → after pair. Evaluation never changes training: it
runs under :func:`torch.random.fork_rng` with its own seed (the step), draws no prompts
from the sampler's RNG and leaves the group counter alone, so a run with evaluation trains
exactly as one without (tested).
"""

from __future__ import annotations


import time
from typing import NamedTuple

import numpy as np
import torch

from rlzoo.core import distributed
from rlzoo.core.errors import ConfigError, say
from rlzoo.plan.settings import EvalPlan
from rlzoo.rollout.sampler import Completions, Sampler
from rlzoo.run.eval_records import EvalRecord, metrics as record_metrics
from rlzoo.tasks.task import Example, Holdout, Task, prompt_id
from rlzoo.run.tracking import Sample

EVAL_PREFIX = "eval/"
EVAL_TIME_TAG = "timing/eval_s"


class Answer(NamedTuple):
    """What evaluation keeps of one held-out example."""

    greedy: float
    """Score of the greedy completion."""
    sampled: list[float]
    """Scores of the ``eval.n`` samples."""
    shown: str
    """The greedy completion (the whole episode with an environment), for the samples table."""
    found: bool
    """Whether the answer format finds an answer in the greedy completion."""
    lenient: float
    """Lenient score of the greedy completion."""
    turns: int | None
    """Policy turns of the greedy episode; ``None`` without an environment."""


class Evaluator:
    """Evaluates the policy on a fixed held-out set (see the module docstring).

    :param examples: the held-out examples (the same on every rank).
    :param sampler: the run's sampler: its tokenizer, chat template, rollout backend and
        reward function are used; its RNG and state are not.
    :param evaluation: the plan's evaluation (``plan.eval``); generation follows the run plan
        (``sampler.plan``).
    :param dist: this process's place in the job: each rank answers a share of the prompts.
    """

    def __init__(self, examples: list[Example], sampler: Sampler, evaluation: EvalPlan,
                 dist: distributed.DistInfo) -> None:
        self.examples, self.sampler, self.dist = examples, sampler, dist
        self.every, self.n = evaluation.every, evaluation.n
        self.at_start = evaluation.at_start
        self.threshold = evaluation.threshold
        self.rollout = sampler.plan.rollout
        # at most as many sequences per generate call as a training rollout (the size the
        # user made fit in memory): every prompt once greedily, or eval.n samples each
        self.sequences = max(1, sampler.plan.update.sequences)
        self.samples: list[Sample] = []
        """Greedy answers to the first held-out prompts at the last evaluation (logged as text)."""
        self.prompt_ids = np.array([prompt_id(e.prompt) for e in examples], dtype=np.uint64)
        self.record: EvalRecord | None = None
        """Every held-out prompt's outcome at the last evaluation (:mod:`rlzoo.run.eval_records`)."""

    @classmethod
    def build(cls, evaluation: EvalPlan, task: Task, task_name: str, sampler: Sampler,
              dist: distributed.DistInfo) -> "Evaluator | None":
        """The run's evaluator, or ``None`` when ``eval.size`` is 0.

        :raises ConfigError: the task has no held-out prompts to evaluate on.
        """
        size = evaluation.size
        if size == 0:
            return None
        examples = task.eval_set(size, Holdout(evaluation.holdout))
        if not examples:
            raise ConfigError(f"eval.size={size} but task {task_name!r} has no held-out prompts "
                              f"(eval.holdout={evaluation.holdout}): raise eval.holdout, give the task an "
                              "eval_path, or set eval.size=0 to train without evaluation")
        if len(examples) < size and dist.is_main:
            say(f"rlzoo: warning: eval.size={size} but task {task_name!r} holds out only {len(examples)} "
                f"prompts (eval.holdout={evaluation.holdout} of its prompt space): evaluating those")
        return cls(examples, sampler, evaluation, dist)

    def describe(self) -> str:
        """One line for the start of a run: what is evaluated, how often."""
        when = f"every {self.every} steps and after the last" if self.every else "after the last step"
        when = f"before the first step, {when}" if self.at_start else when
        sampled = f" and {self.n} samples" if self.n else ""
        return (f"rlzoo: evaluation on {len(self.examples)} held-out prompts (greedy{sampled} each, correct = "
                f"score >= {self.threshold:g}) {when}")

    def due(self, step: int, last: bool) -> bool:
        """Whether to evaluate after ``step``."""
        return last or (self.every > 0 and step % self.every == 0)

    def _generate(self, examples: list[Example], samples: int) -> tuple[list[float], Completions]:
        """Scores and completions of ``samples`` completions per example (one greedy one
        when 0), example-major, in calls of at most ``self.sequences`` sequences."""
        sampler = self.sampler
        per_example = max(1, samples)
        per_call = max(1, self.sequences // per_example)
        scores: list[float] = []
        answers: list[str] = []
        shown: list[str] = []
        turns: list[int] | None = []
        for start in range(0, len(examples), per_call):
            part = examples[start:start + per_call]
            done = sampler.complete(part, per_example, greedy=samples == 0)
            repeat = lambda items: [x for x in items for _ in range(per_example)]  # noqa: E731
            scores += sampler.score(repeat([e.prompt for e in part]), done.answers, repeat([e.reference for e in part]),
                                    repeat([dict(e.row) for e in part])).tolist()
            answers += done.answers
            shown += done.shown
            turns = None if done.turns is None or turns is None else turns + done.turns
        return scores, Completions(answers, shown, turns)

    def _answer(self, examples: list[Example], seed: int) -> list[Answer]:
        """The :class:`Answer` of each example."""
        with torch.random.fork_rng(devices=_devices(self.sampler.device)):
            torch.manual_seed(seed)
            greedy, done = self._generate(examples, 0)
            sampled: list[list[float]] = [[] for _ in examples]
            if self.n:
                flat, _ = self._generate(examples, self.n)
                sampled = [flat[i * self.n:(i + 1) * self.n] for i in range(len(examples))]
        rewards = self.sampler.rewards
        found = [answer is not None for answer in rewards.answers(done.answers)]
        lenient = rewards.lenient_scores([e.prompt for e in examples], done.answers, [e.reference for e in examples],
                                         [dict(e.row) for e in examples]).tolist() if examples else []
        turns = done.turns if done.turns is not None else [None] * len(examples)
        return [Answer(*fields) for fields in zip(greedy, sampled, done.shown, found, lenient, turns)]

    def run(self, step: int) -> dict[str, float]:
        """Evaluate now; returns the ``eval/...`` metrics and ``timing/eval_s`` (the same on
        every rank). A collective under torchrun: every rank calls it."""
        start = time.perf_counter()
        world, rank = self.dist.world, self.dist.rank
        mine = list(range(rank, len(self.examples), world))
        per_rank = -(-len(self.examples) // world)
        # equal shares, so every rank calls the backend equally often (FSDP gathers weights)
        padded = mine + [0] * (per_rank - len(mine))
        failure: Exception | None = None
        try:
            answers = self._answer([self.examples[i] for i in padded], seed=1_000_003 * step + rank)[:len(mine)]
        except Exception as exc:  # noqa: BLE001 - a reward failing on one rank: the ranks agree on it below
            if not self.dist.enabled:
                raise
            failure, answers = exc, []
        parts = distributed.gather_objects((failure is not None, list(zip(mine, answers))), self.dist)
        if any(failed for failed, _ in parts):  # every rank raises the same error (the same gather, no extra one)
            distributed.raise_failures(failure, self.dist)
        results = dict(item for _, part in parts for item in part)
        answers = [results[i] for i in range(len(self.examples))]
        greedy = np.array([a.greedy for a in answers], dtype=np.float64)
        strict = (greedy >= self.threshold) & np.array([a.found for a in answers], dtype=bool)
        lenient = strict | (np.array([a.lenient for a in answers]) >= self.threshold)
        with_turns = bool(answers) and answers[0].turns is not None
        self.record = EvalRecord(
            step=step, threshold=self.threshold, prompt_id=self.prompt_ids, greedy_score=greedy,
            greedy_correct=greedy >= self.threshold, strict_correct=strict, lenient_correct=lenient,
            sampled_scores=np.array([a.sampled for a in answers], dtype=np.float64).reshape(len(answers), self.n),
            greedy_turns=np.array([a.turns for a in answers], dtype=np.int64) if with_turns else None)
        metrics = record_metrics(self.record)
        self.samples = [Sample(self.examples[i].prompt, self.examples[i].reference, answers[i].shown,
                               answers[i].greedy) for i in range(min(8, len(self.examples)))]
        metrics[EVAL_TIME_TAG] = time.perf_counter() - start
        return metrics


def _devices(device: torch.device) -> list[int]:
    """CUDA devices whose RNG :func:`torch.random.fork_rng` must restore."""
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


def eval_only(metrics: dict[str, float]) -> dict[str, float]:
    """The evaluation entries of a step's metrics (logged even off the ``log_every`` grid)."""
    return {tag: value for tag, value in metrics.items() if tag.startswith(EVAL_PREFIX) or tag == EVAL_TIME_TAG}
