"""The objects that carry a rollout through the stages of a training step."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchCounts:
    """Sizes of the *global* batch a loss is normalised by.

    Loss aggregation under micro-batching or data parallelism must equal the same mode
    computed on the whole batch, so the engine counts once over the (mini-)batch and hands
    these numbers to every micro-batch's aggregation.

    :ivar tokens: valid (mask = 1) tokens in the global batch.
    :ivar sequences: sequences with at least one valid token in the global batch.
    :ivar max_response_length: the configured maximum response length (T_max of
        ``seq-mean-token-sum-norm``), a constant independent of padding.
    """

    tokens: float
    sequences: float
    max_response_length: int
