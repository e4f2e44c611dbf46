"""Scoring: the run's reward functions, each called and checked, and their weighted sum.

``reward`` names one function, or several with weights
(``reward=[{name: a, weight: 1.0}, {name: b, weight: 0.5}]``). Each returns one score per
completion; the batch keeps every function's raw scores as ``reward_scores`` ``(B, K)``
(logged as ``reward/<name>`` when K > 1; what ``gdpo`` normalises one by one) and their
weighted sum Σ_k w_k·r_k as ``scores`` ``(B,)``, which every other stage sees (filters,
``reward/mean``, the advantage estimators' ``token_rewards``, evaluation). With one
function the sum is its score unchanged.

A reward registered as a class (a *scorer*, e.g. ``reward_model``) is built once per run
(:meth:`rlzoo.contract.BoundComponent.build`, on the run's device) before it gets here;
:class:`Rewards` tells it whether it scores a training batch (``training``), keeps its
``state_dict`` in the checkpoint and logs its ``metrics()`` every step.
"""

from __future__ import annotations

from typing import Any

import torch

from rlzoo.contract import BoundComponent, BuiltComponent
from rlzoo.errors import TrainingError


class Rewards:
    """The reward functions of a run and their weights.

    :param functions: ``(bound reward function or built scorer, weight)`` pairs, in config order.
    """

    def __init__(self, functions: list[tuple[BoundComponent | BuiltComponent, float]]) -> None:
        if not functions:
            raise ValueError("a run needs at least one reward function")
        self.functions = [fn for fn, _ in functions]
        self.names = [fn.name for fn in self.functions]
        self.weights = torch.tensor([float(w) for _, w in functions], dtype=torch.float32)

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

    def metrics(self) -> dict[str, float]:
        """What the scorers report (``metrics()``) since the last call, e.g. their time."""
        out: dict[str, float] = {}
        for _, scorer in self._scorers():
            if hasattr(scorer, "metrics"):
                out.update({key: float(value) for key, value in scorer.metrics().items()})
        return out

    def score(self, prompts: list[str], completions: list[str], references: list[Any],
              rows: list[dict[str, Any]], training: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scores (B,), reward_scores (B, K))``: the weighted sum and each function's raw
        float32 scores (column k is ``reward[k]``'s).

        :param training: the completions are a training batch (scorers with running
            statistics update them only then; evaluation and greedy baselines leave them).

        :raises TrainingError: a function raised (naming it and the first failing sample),
            returned the wrong number of scores or a non-finite one.
        """
        for _, scorer in self._scorers():
            scorer.training = training
        columns = [_call(fn, prompts, completions, references, rows) for fn in self.functions]
        per_reward = torch.stack(columns, dim=1)
        if len(columns) == 1 and float(self.weights[0]) == 1.0:
            return columns[0], per_reward
        return per_reward @ self.weights, per_reward


def _call(fn: BoundComponent | BuiltComponent, prompts: list[str], completions: list[str], references: list[Any],
          rows: list[dict[str, Any]]) -> torch.Tensor:
    """One reward function's ``(B,)`` float32 scores, checked."""
    name = fn.name
    try:
        raw = fn(prompts=prompts, completions=completions, references=references, rows=rows)
    except Exception as exc:  # noqa: BLE001 - name the reward and find the sample
        for i in range(len(prompts)):
            try:
                fn(prompts=prompts[i:i + 1], completions=completions[i:i + 1],
                   references=references[i:i + 1], rows=rows[i:i + 1])
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
