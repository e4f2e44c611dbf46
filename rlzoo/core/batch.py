"""The objects that carry a rollout through the stages of a training step."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch


@dataclass(frozen=True)
class BatchCounts:
    """Sizes of the *global* batch a loss is normalised by.

    Loss aggregation under micro-batching or data parallelism must equal the same mode
    computed on the whole batch, so the engine counts once over the (mini-)batch and hands
    these numbers to every micro-batch's aggregation.

    :ivar tokens: valid (mask = 1) tokens in the global batch.
    :ivar sequences: sequences with at least one valid token in the global batch.
    :ivar max_response_length: the configured maximum response length (``rollout.max_new_tokens``,
        T_max of ``seq-mean-token-sum-norm``), a constant independent of padding: not the
        longest response of the batch.

    These three are all an aggregation learns of the batch beyond its micro-batch.
    """

    tokens: float
    sequences: float
    max_response_length: int


def _pad_to(t: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    extra = width - t.shape[1]
    if extra <= 0:
        return t
    pad = torch.full((t.shape[0], extra), value, dtype=t.dtype, device=t.device)
    return torch.cat([pad, t], 1) if left else torch.cat([t, pad], 1)


UNPADDED = ("reward_scores", "episode_counts")
"""2-D fields whose second dimension is not a token position (never padded by concat)."""


@dataclass
class RolloutBatch:
    """One step's rollout as it moves through the stages; B sequences.

    Prompts are left-padded ``(B, P)``; responses right-padded ``(B, T)``. Optional fields
    are filled by later stages (``None`` until then). ``loss_mask`` starts equal to
    ``response_mask``; extensions may zero entries to keep tokens out of the losses
    (e.g. truncated completions), while ``response_mask`` keeps describing the text.
    ``scores`` ``(B,)`` are the raw task scores (what filters and ``reward/mean`` see);
    ``rewards`` ``(B,)`` start equal to them and are what shaping extensions modify and
    what the advantage estimator is fed (on the last valid token). ``rollout_logp``
    ``(B, T)`` are the log-probs of the sampled tokens under the distribution the rollout
    backend sampled from (after temperature and top-p), recorded for every run.
    ``reward_scores`` ``(B, K)`` are each reward function's raw scores (``scores`` is their
    weighted sum; :mod:`rlzoo.rollout.scoring`). ``correction_weights`` ``(B, T)`` are the product of
    the rollout corrections computed over the whole batch before the update
    (:mod:`rlzoo.learn.correcting`), ``None`` without any.

    A multi-turn batch (``env`` set; :mod:`rlzoo.agents.episodes`) holds one episode per row:
    ``response_mask`` covers every token after the prompt (policy and environment, all
    attended), ``loss_mask`` only the policy's tokens, ``rollout_logp`` is 0 on environment
    tokens, ``completions`` are the final answers the rewards scored, ``transcripts`` the
    whole episodes as text and ``episode_counts`` ``(B, K)`` their statistics
    (:data:`rlzoo.agents.episodes.COUNT_COLUMNS`). Single-turn batches leave the last two ``None``.

    Lifecycle hooks change a batch in place (:meth:`keep`, :meth:`extend`,
    :meth:`copy_from`), so the next hook and the engine see the result.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    group_ids: torch.Tensor
    scores: torch.Tensor
    truncated: torch.Tensor
    prompts: list[str]
    completions: list[str]
    references: list[Any]
    rollout_logp: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    baseline_scores: torch.Tensor | None = None
    old_logp: torch.Tensor | None = None
    old_entropy: torch.Tensor | None = None
    old_sum_pi_squared: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    token_rewards: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    reward_scores: torch.Tensor | None = None
    teacher_logp: torch.Tensor | None = None
    correction_weights: torch.Tensor | None = None
    episode_counts: torch.Tensor | None = None
    transcripts: list[str] | None = None

    def __post_init__(self) -> None:
        if self.loss_mask is None:
            self.loss_mask = self.response_mask.clone()
        if self.rewards is None:
            self.rewards = self.scores.clone()

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    @property
    def response_lengths(self) -> torch.Tensor:
        """``(B,)`` number of response tokens (EOS included)."""
        return self.response_mask.sum(-1)

    def select(self, index: torch.Tensor | list[int]) -> "RolloutBatch":
        """The sub-batch of rows ``index`` (tensor fields and lists alike)."""
        idx = torch.as_tensor(index, dtype=torch.long)
        rows = idx.tolist()
        values: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                values[f.name] = value[idx]
            elif isinstance(value, list):
                values[f.name] = [value[i] for i in rows]
            else:
                values[f.name] = value
        return RolloutBatch(**values)

    def trimmed(self) -> "RolloutBatch":
        """This batch without the padding columns no row uses: the prompts' leading columns
        where every ``prompt_mask`` is 0, the responses' trailing ones where every
        ``response_mask`` is 0 (every token field cut alike, as :meth:`concat` pads them).
        The batch itself when there are none."""
        used_prompt = self.prompt_mask.bool().any(0).nonzero()
        used_response = self.response_mask.bool().any(0).nonzero()
        first = int(used_prompt[0]) if len(used_prompt) else self.prompt_mask.shape[1]
        last = int(used_response[-1]) + 1 if len(used_response) else 0
        if first == 0 and last == self.response_mask.shape[1]:
            return self
        values: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor) and value.dim() == 2 and f.name not in UNPADDED:
                value = value[:, first:] if f.name.startswith("prompt_") else value[:, :last]
            values[f.name] = value
        return RolloutBatch(**values)

    def to(self, device: torch.device | str) -> "RolloutBatch":
        """A batch with every tensor on ``device`` (this one when they already are)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        if all(not isinstance(v, torch.Tensor) or v.device == torch.device(device) for v in values.values()):
            return self
        return RolloutBatch(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in values.items()})

    def copy_from(self, other: "RolloutBatch") -> None:
        """Make this batch ``other`` (every field), in place."""
        for f in fields(self):
            setattr(self, f.name, getattr(other, f.name))

    def keep(self, index: torch.Tensor | list[int]) -> None:
        """Keep only rows ``index`` (in that order), in place."""
        self.copy_from(self.select(index))

    def extend(self, other: "RolloutBatch") -> None:
        """Append ``other``'s rows (padding as :meth:`concat`), in place."""
        self.copy_from(RolloutBatch.concat([self, other]))

    @staticmethod
    def concat(batches: list["RolloutBatch"]) -> "RolloutBatch":
        """Stack batches along B, padding prompts on the left and responses on the right."""
        if len(batches) == 1:
            return batches[0]
        width_p = max(b.prompt_ids.shape[1] for b in batches)
        width_t = max(b.response_ids.shape[1] for b in batches)
        values: dict[str, Any] = {}
        for f in fields(RolloutBatch):
            items = [getattr(b, f.name) for b in batches]
            if all(v is None for v in items):
                values[f.name] = None
            elif any(v is None for v in items) and f.name == "transcripts":
                raise ValueError("cannot concatenate batches: transcripts is set in only some")
            elif isinstance(items[0], list):
                values[f.name] = [x for item in items for x in item]
            elif any(v is None for v in items):
                raise ValueError(f"cannot concatenate batches: {f.name} is set in only some")
            elif items[0].dim() == 2 and f.name not in UNPADDED:
                left = f.name.startswith("prompt_")
                width = width_p if left else width_t
                values[f.name] = torch.cat([_pad_to(v, width, 0, left) for v in items], 0)
            else:
                values[f.name] = torch.cat(items, 0)
        return RolloutBatch(**values)


@dataclass
class Generation:
    """Sampled responses, right-padded.

    :ivar response_ids: ``(B, T)`` token ids, ``pad_id`` after the end.
    :ivar response_mask: ``(B, T)`` float, 1 up to and including EOS (or the last token
        when the response hit ``max_new_tokens``).
    :ivar truncated: ``(B,)`` bool, True when no EOS was produced within the budget.
    :ivar logp: ``(B, T)`` float32, the log-prob of each sampled token under the
        distribution it was drawn from (logits / temperature, restricted to the top-p
        nucleus and renormalised); 0 on padding and for greedy decoding (a point mass).
    """

    response_ids: torch.Tensor
    response_mask: torch.Tensor
    truncated: torch.Tensor
    logp: torch.Tensor
