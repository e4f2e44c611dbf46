"""The Bradley–Terry loss of a reward model on preference pairs, the pair scorer and its evaluation.

The reward model ``r`` scores prompt + response exactly as the ``reward_model`` reward
function will (:mod:`rlzoo.models.reward_model`); a pair's loss is that of Ouyang et al.
(2022), with Llama 2's margin::

    loss = −log σ(r(prompt, chosen) − r(prompt, rejected) − margin)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from rlzoo.core.errors import say
from rlzoo.core.tokens import left_pad
from rlzoo.models.reward_model import (
    context_length,
    cut_warning,
    encode,
    fit_context,
    reward_text,
    sequence_scores,
    uses_chat_template,
)
from rlzoo.tasks.pairs import Pair


def bradley_terry(chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor) -> torch.Tensor:
    """Per-pair loss ``−log σ(r_c − r_r − m)`` ``(B,)`` (log-sigmoid: exact for large gaps)."""
    return -F.logsigmoid(chosen - rejected - margin)


class PairScorer:
    """Scores both responses of pairs with a model in one padded forward; a text longer than
    the model's context keeps its last tokens (:func:`rlzoo.models.reward_model.fit_context`, as
    the ``reward_model`` reward function does), with one warning the first time."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, chat_template: bool | None,
                 device: torch.device) -> None:
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.templated = uses_chat_template(tokenizer, chat_template)
        self.context = context_length(model)
        self.warned = False

    def __call__(self, pairs: list[Pair]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(r_chosen, r_rejected, margin)``, each ``(B,)`` float32."""
        texts = [reward_text(self.tokenizer, p.prompt, p.chosen, self.templated) for p in pairs]
        texts += [reward_text(self.tokenizer, p.prompt, p.rejected, self.templated) for p in pairs]
        ids, cut = fit_context(encode(self.tokenizer, texts, self.templated), self.context)
        if cut and not self.warned:
            self.warned = True
            say(f"rlzoo: warning: {cut_warning('rlzoo rm', cut, len(texts), self.context)}")
        ids, mask = left_pad(ids, self.tokenizer.pad_token_id)
        scores = sequence_scores(self.model, ids.to(self.device), mask.to(self.device))
        margin = torch.tensor([p.margin for p in pairs], dtype=torch.float32, device=self.device)
        return scores[:len(pairs)], scores[len(pairs):], margin


@torch.no_grad()
def evaluate_pairs(scorer: PairScorer, pairs: list[Pair], batch_size: int) -> dict[str, float]:
    """``eval/accuracy`` (share with r_c > r_r), ``eval/loss`` and ``eval/reward_gap``
    (mean r_c − r_r) of held-out pairs."""
    correct, loss, gap = 0.0, 0.0, 0.0
    for start in range(0, len(pairs), batch_size):
        chosen, rejected, margin = scorer(pairs[start:start + batch_size])
        correct += float((chosen > rejected).sum())
        loss += float(bradley_terry(chosen, rejected, margin).sum())
        gap += float((chosen - rejected).sum())
    return {"eval/accuracy": correct / len(pairs), "eval/loss": loss / len(pairs), "eval/reward_gap": gap / len(pairs)}
