"""Scoring: the run's reward functions, each called and checked, and their weighted sum.

``reward`` names one function, or several with weights
(``reward=[{name: a, weight: 1.0}, {name: b, weight: 0.5}]``). Each returns one score per
completion; the batch keeps every function's raw scores as ``reward_scores`` ``(B, K)``
(logged as ``reward/<name>`` when K > 1; what ``gdpo`` normalises one by one) and their
weighted sum Σ_k w_k·r_k as ``scores`` ``(B,)``, which every other stage sees (filters,
``reward/mean``, the advantage estimators' ``token_rewards``, evaluation). With one
function the sum is its score unchanged.

A reward registered as a class (a *scorer*, e.g. ``reward_model``) is built once per run
(:meth:`rlzoo.contract.checks.BoundComponent.build`, on the run's device) before it gets here;
:class:`Rewards` tells it whether it scores a training batch (``training``), keeps its
``state_dict`` in the checkpoint, logs its ``metrics()`` every step and, once per step where
every rank is, lets it fold its running statistics over the ranks (``settle``).

The run's answer format (``answer_format``) finds each completion's answer; functions that
name the ``answers`` input get it (``None`` where the format finds none). Evaluation's
lenient score (:meth:`Rewards.lenient_scores`) takes the best score over every span any
registered answer format finds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from rlzoo.contract.checks import BoundComponent, BuiltComponent, build_rewards
from rlzoo.core.errors import TrainingError
from rlzoo.plan.run_input import Components

if TYPE_CHECKING:
    from rlzoo.models.reward_model import Reduce


class Rewards:
    """The reward functions of a run and their weights.

    :param functions: ``(bound reward function or built scorer, weight)`` pairs, in config order.
    :param answer_format: the run's answer format (``None``: the completion is the answer).
    :param all_formats: every registered answer format (for :meth:`lenient_scores`).
    """

    def __init__(self, functions: list[tuple[BoundComponent | BuiltComponent, float]],
                 answer_format: BoundComponent | None = None, all_formats: list[BoundComponent] | None = None) -> None:
        if not functions:
            raise ValueError("a run needs at least one reward function")
        self.functions = [fn for fn, _ in functions]
        self.names = [fn.name for fn in self.functions]
        self.weights = torch.tensor([float(w) for _, w in functions], dtype=torch.float32)
        self.answer_format = answer_format
        self.all_formats = list(all_formats or [])

    @classmethod
    def of(cls, components: Components, **setup: Any) -> "Rewards":
        """The run's reward functions (scorers built with the ``setup`` inputs: ``device``,
        ``tokenizer``) and answer format, with every registered format for lenient scoring."""
        return cls(build_rewards(list(components.rewards), **setup), components.answer_format,
                   list(components.answer_formats))

    def __len__(self) -> int:
        return len(self.functions)

    def _scorers(self) -> list[tuple[str, Any]]:
        """``(key, instance)`` of every built scorer (key ``<k>:<name>``, unique per run)."""
        return [(f"{k}:{fn.name}", fn.instance) for k, fn in enumerate(self.functions)
                if isinstance(fn, BuiltComponent)]

    def state_dict(self) -> dict[str, Any]:
        """The scorers' states (plain values), by :meth:`_scorers` key."""
        return {key: scorer.state_dict() for key, scorer in self._scorers() if hasattr(scorer, "state_dict")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, scorer in self._scorers():
            if key in state and hasattr(scorer, "load_state_dict"):
                scorer.load_state_dict(state[key])

    def settle(self, reduce: Reduce | None = None) -> None:
        """Let every scorer with running statistics (``settle``) fold in the training batches
        scored since the last call: once per step, where every rank is (``reduce`` sums a list
        of floats over the ranks, one collective per such scorer; ``None``: this process alone).
        Scoring itself does no collective, so ranks may score different numbers of batches."""
        for _, scorer in self._scorers():
            if hasattr(scorer, "settle"):
                scorer.settle(reduce)

    def metrics(self) -> dict[str, float]:
        """What the scorers report (``metrics()``) since the last call, e.g. their time."""
        out: dict[str, float] = {}
        for _, scorer in self._scorers():
            if hasattr(scorer, "metrics"):
                out.update({key: float(value) for key, value in scorer.metrics().items()})
        return out

    def answers(self, completions: list[str]) -> list[str | None]:
        """The answer the run's answer format finds in each completion (its last span),
        ``None`` where it finds none; the completions themselves without a format."""
        if self.answer_format is None:
            return list(completions)
        return [found[-1] if found else None for found in (_spans(self.answer_format, c) for c in completions)]

    def score(self, prompts: list[str], completions: list[str], references: list[Any],
              rows: list[dict[str, Any]], training: bool = False, answers: list[str | None] | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scores (B,), reward_scores (B, K))``: the weighted sum and each function's raw
        float32 scores (column k is ``reward[k]``'s).

        :param training: the completions are a training batch (scorers with running
            statistics update them only then; evaluation and greedy baselines leave them).
        :param answers: the answers to pass (default: :meth:`answers` of ``completions``).

        :raises TrainingError: a function raised (naming it and the first failing sample),
            returned the wrong number of scores or a non-finite one.
        """
        for _, scorer in self._scorers():
            scorer.training = training
        answers = self.answers(completions) if answers is None else answers
        columns = [_call(fn, prompts, completions, references, rows, answers) for fn in self.functions]
        per_reward = torch.stack(columns, dim=1)
        if len(columns) == 1 and float(self.weights[0]) == 1.0:
            return columns[0], per_reward
        return per_reward @ self.weights, per_reward

    def lenient_scores(self, prompts: list[str], completions: list[str], references: list[Any],
                       rows: list[dict[str, Any]]) -> torch.Tensor:
        """``(B,)`` the best weighted score over the candidate answers of each completion:
        every span any registered answer format finds, and the completion itself, each
        passed as both the completion and the answer ("the right answer anywhere")."""
        owner: list[int] = []
        candidates: list[str] = []
        for i, completion in enumerate(completions):
            spans = dict.fromkeys([completion, *(s for f in self.all_formats for s in _spans(f, completion))])
            owner += [i] * len(spans)
            candidates += list(spans)
        scores, _ = self.score([prompts[i] for i in owner], candidates, [references[i] for i in owner],
                               [rows[i] for i in owner], answers=list(candidates))
        best = torch.full((len(completions),), -torch.inf)
        return best.scatter_reduce(0, torch.tensor(owner, dtype=torch.long), scores, reduce="amax")


def _spans(answer_format: BoundComponent, text: str) -> list[str]:
    """The answer format's spans of ``text``, checked to be a list of str."""
    found = answer_format(text=text)
    if not isinstance(found, list) or not all(isinstance(s, str) for s in found):
        raise TrainingError(f"answer_format {answer_format.name!r} returned {type(found).__name__} for "
                            f"{text[:80]!r}; the contract is a list of str")
    return found


def _call(fn: BoundComponent | BuiltComponent, prompts: list[str], completions: list[str], references: list[Any],
          rows: list[dict[str, Any]], answers: list[str | None]) -> torch.Tensor:
    """One reward function's ``(B,)`` float32 scores, checked."""
    name = fn.name
    try:
        raw = fn(prompts=prompts, completions=completions, references=references, rows=rows, answers=answers)
    except Exception as exc:  # noqa: BLE001 - name the reward and find the sample
        for i in range(len(prompts)):
            try:
                fn(prompts=prompts[i:i + 1], completions=completions[i:i + 1],
                   references=references[i:i + 1], rows=rows[i:i + 1], answers=answers[i:i + 1])
            except Exception:  # noqa: BLE001
                raise TrainingError(
                    f"reward function {name!r} raised {type(exc).__name__}: {exc} on sample "
                    f"prompt={prompts[i]!r} completion={completions[i]!r}"
                ) from exc
        raise TrainingError(f"reward function {name!r} raised {type(exc).__name__}: {exc}") from exc
    try:
        scores = torch.as_tensor(raw, dtype=torch.float32).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise TrainingError(f"reward function {name!r} returned {type(raw).__name__}, "
                            f"not a list of {len(prompts)} floats") from exc
    if scores.numel() != len(prompts) or torch.as_tensor(raw).dim() > 1:
        raise TrainingError(f"reward function {name!r} returned {scores.numel()} scores "
                            f"(shape {tuple(torch.as_tensor(raw).shape)}) for {len(prompts)} "
                            f"completions; expected shape ({len(prompts)},)")
    bad = (~torch.isfinite(scores)).nonzero().flatten().tolist()
    if bad:
        i = bad[0]
        raise TrainingError(f"reward function {name!r} returned {scores[i].item()} (non-finite) "
                            f"for prompt={prompts[i]!r} completion={completions[i]!r}")
    return scores

