"""Micro-batches by token count (``trainer.micro_batch_tokens``): how many token positions a
forward over some sequences computes in each layout, the split of a mini-batch into
micro-batches within a budget, and the refusal of a budget no micro-batch of one sequence fits.

The gradient does not depend on the split: every loss aggregation divides by counts of the
whole mini-batch (:class:`rlzoo.core.batch.BatchCounts`), so the micro-batches' losses sum to
the mini-batch's whatever sequences they group.
"""

from __future__ import annotations

from rlzoo.core.errors import ConfigError
from rlzoo.models.packing import PADDED, SEGMENTS, balanced_rows, packed_width


def computed_tokens(prompt_lengths: list[int], response_lengths: list[int], packing: str,
                    min_share: float = 0.0) -> int:
    """Token positions one forward over these sequences computes, as
    :func:`rlzoo.models.packing.sequence_inputs` lays out a micro-batch trimmed to them: padded
    to their longest prompt and response, ``B · (max prompt + max response)``, unless the
    layout ``packing`` removes at least ``min_share`` of that (and some), then the sequences'
    own tokens (:data:`SEGMENTS`) or ``R · W`` (:data:`ROWS`)."""
    if not prompt_lengths:
        return 0
    padded = len(prompt_lengths) * (max(prompt_lengths) + max(response_lengths))
    if packing == PADDED:
        return padded
    rows, width = packed_width([p + r for p, r in zip(prompt_lengths, response_lengths)], packing == SEGMENTS)
    packed = rows * width
    return packed if packed <= (1 - min_share) * padded and packed < padded else padded


def token_micro_batches(prompt_lengths: list[int], response_lengths: list[int], budget: int,
                        packing: str, min_share: float = 0.0) -> list[list[int]]:
    """Split sequences into micro-batches whose forward computes at most ``budget`` token
    positions each (:func:`computed_tokens`); each micro-batch lists its sequences in index
    order, the micro-batches ordered by their first sequence.

    Packed: ``k`` groups of balanced token counts (:func:`balanced_rows`: longest first, each
    into the group with the fewest tokens), ``k`` from ``ceil(total / budget)`` up until every
    group fits (verl's dynamic batch size balances its micro-batches the same way). Padded:
    sequences sorted by length, longest first, filled in that order while the micro-batch's
    padded size fits, so each micro-batch pads to lengths close to its own. A sequence
    longer than ``budget`` is a micro-batch of its own (it cannot be split).
    """
    count = len(prompt_lengths)
    if count == 0:
        return []
    lengths = [p + r for p, r in zip(prompt_lengths, response_lengths)]

    def cost(group: list[int]) -> int:
        return computed_tokens([prompt_lengths[i] for i in group], [response_lengths[i] for i in group], packing,
                               min_share)

    if packing != PADDED:
        groups = -(-sum(lengths) // budget)
        while True:
            split = balanced_rows(lengths, min(groups, count))
            if groups >= count or all(cost(group) <= budget or len(group) == 1 for group in split):
                return sorted(split)
            groups += 1
    micro: list[list[int]] = []
    for index in sorted(range(count), key=lambda i: (-lengths[i], i)):
        if micro and cost(micro[-1] + [index]) <= budget:
            micro[-1].append(index)
        else:
            micro.append([index])
    return sorted(sorted(group) for group in micro)


def check_micro_batch_tokens(budget: int | None, longest_prompt: int, max_new_tokens: int) -> None:
    """:raises ConfigError: ``trainer.micro_batch_tokens`` cannot hold the longest sequence
    a step can make: the longest prompt (``longest_prompt`` tokens) + ``max_new_tokens``."""
    longest = longest_prompt + max_new_tokens
    if budget is not None and budget < longest:
        raise ConfigError(f"trainer.micro_batch_tokens={budget} is smaller than the longest sequence of this run: "
                          f"{longest} tokens (its longest prompt, {longest_prompt} tokens, + rollout.max_new_tokens="
                          f"{max_new_tokens}); a sequence cannot be split across micro-batches: set "
                          f"trainer.micro_batch_tokens to at least {longest}")
