"""Padding-free passes: a micro-batch's sequences packed one after another, without padding.

The padded layout of a micro-batch is ``(B, P + T)``: prompts left-padded to the longest
prompt ``P``, responses right-padded to the longest response ``T``, and every layer computes
on the padding. :func:`pack` lays the valid tokens of each sequence (its prompt without
padding, then its response without padding) one after another with position ids that restart
at 0 for each sequence. transformers (5.x: ``masking_utils.find_packed_sequence_indices``)
reads a new sequence wherever the position ids do not step by one and, given no 2-D
attention mask and no cache, builds a block-diagonal causal mask from them (a sliding window
is measured in those positions too), so each sequence attends only to itself, at the
positions it has alone. The hidden state that predicts response token ``t`` of sequence
``b`` is gathered back to ``(B, T)`` (:attr:`PackedLayout.response_index`), so everything
after the decoder (the log-prob head, the values, the losses and their aggregation) sees the
padded layout's tensors.

Two layouts (:attr:`rlzoo.models.head.FastPaths.packing`):

- :data:`SEGMENTS`: every sequence in **one row**, no padding at all for the linear layers,
  norms and the head; the attention (:func:`segment_attention`: the model's own ``sdpa``)
  runs on the row's sequences as a right-padded batch, so it costs what a padded batch's
  attention costs, not the square of the row. The sequence boundaries reach the attention
  as ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (the names of transformers' own variable-length
  attention kwargs), through the keyword arguments a model passes down to its attention; a
  model on ``sdpa`` whose layers pass them runs this layout.
- :data:`ROWS`: a few rows balanced by tokens (:func:`row_plan`), each padded at its end to
  the widest row; for a model whose attention is not ``sdpa`` (e.g. Gemma-2's eager
  attention with its softcap) or whose layers do not pass keyword arguments down.

Whether a model keeps each sequence to itself this way is a property of its code (a
convolution or recurrent state, LFM2's or Mamba's, runs across the boundary; MPT's mask ignores
``position_ids``): the load-time check (:mod:`rlzoo.models.model_check`) decides per model.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AttentionInterface, AttentionMaskInterface, PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

from rlzoo.core.tokens import position_ids_from_mask

PADDED, ROWS, SEGMENTS = "padded", "rows", "segments"
"""The training-side passes' layouts: padded ``(B, P + T)``; packed into balanced rows;
packed into one row, each sequence attending as one of a padded batch."""

SEGMENT_ATTENTION = "rlzoo_sdpa_segments"
"""The attention implementation :func:`use_segment_attention` registers and sets: ``sdpa``,
per sequence when the call carries their boundaries (:func:`segment_attention`)."""


@dataclass(frozen=True)
class PackedLayout:
    """Where the sequences of a padded micro-batch lie in ``R`` packed rows of ``W`` tokens.

    :ivar input_ids: ``(R, W)`` the sequences' valid tokens, one after another; the end of a
        row that no sequence fills holds copies of the row's first token (never read).
    :ivar position_ids: ``(R, W)`` each token's position within its own sequence (0 at its
        first token); the unfilled end of a row counts from 0 again, a sequence of its own.
    :ivar response_index: ``(B, T)`` for response token ``t`` of sequence ``b``, the index in
        the flattened ``(R · W)`` rows of the hidden state that predicts it (its sequence's
        previous token); 0 where ``t`` is padding.
    :ivar tokens: valid tokens packed (the sum of the sequences' lengths).
    :ivar boundaries: with one row, the cumulative lengths of its sequences in row order
        (``[0, l_1, l_1 + l_2, ...]``); empty with several rows.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    response_index: torch.Tensor
    tokens: int
    boundaries: list[int] = field(default_factory=list)

    @property
    def computed(self) -> int:
        """Token positions a forward over the rows computes (``R · W``)."""
        return self.input_ids.numel()

    def gather(self, packed: torch.Tensor) -> torch.Tensor:
        """``packed`` ``(R, W, ...)`` at :attr:`response_index`: ``(B, T, ...)``."""
        flat = packed.reshape(self.computed, *packed.shape[2:])
        return flat.index_select(0, self.response_index.reshape(-1)).view(*self.response_index.shape,
                                                                           *packed.shape[2:])

    def attention_kwargs(self) -> dict[str, Any]:
        """The keyword arguments that carry the sequence boundaries to the attention
        (:data:`SEGMENTS`; transformers' variable-length names); none with several rows."""
        if not self.boundaries:
            return {}
        cumulative = torch.tensor(self.boundaries, dtype=torch.int32, device=self.input_ids.device)
        longest = max(b - a for a, b in zip(self.boundaries, self.boundaries[1:]))
        return {"cu_seq_lens_q": cumulative, "cu_seq_lens_k": cumulative, "max_length_q": longest,
                "max_length_k": longest}


def balanced_rows(lengths: list[int], rows: int) -> list[list[int]]:
    """Sequences (indices into ``lengths``) per row: longest first, each into the row with
    the fewest tokens so far (ties: the lower row). Every row keeps its sequences in index
    order; rows left empty are dropped."""
    fill = [0] * rows
    members: list[list[int]] = [[] for _ in range(rows)]
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        row = min(range(rows), key=lambda r: (fill[r], r))
        fill[row] += lengths[index]
        members[row].append(index)
    return [sorted(row) for row in members if row]


def row_plan(lengths: list[int]) -> list[list[int]]:
    """The rows of the :data:`ROWS` layout: :func:`balanced_rows` for ``R`` from
    ``ceil(total / longest)`` (the fewest rows no wider than the longest sequence could
    hold) up to two more, the one computing the fewest positions ``R · W`` (``W`` its widest
    row), the fewer rows on a tie."""
    total, longest = sum(lengths), max(lengths)
    fewest = -(-total // longest)
    best: list[list[int]] = []
    best_cost = None
    for rows in range(fewest, min(fewest + 2, len(lengths)) + 1):
        plan = balanced_rows(lengths, rows)
        cost = len(plan) * max(sum(lengths[i] for i in row) for row in plan)
        if best_cost is None or cost < best_cost:
            best, best_cost = plan, cost
    return best


def pack(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
         response_mask: torch.Tensor, one_row: bool = True) -> PackedLayout:
    """Pack prompt + response of each sequence (:class:`PackedLayout`): all of them in one
    row in batch order (``one_row``, :data:`SEGMENTS`), or in :func:`row_plan`'s rows.

    :param prompt_ids: ``(B, P)`` left-padded; ``prompt_mask`` ``(B, P)``, at least one
        valid token per row.
    :param response_ids: ``(B, T)`` right-padded; ``response_mask`` ``(B, T)``.
    :raises ValueError: a prompt without a valid token (nothing predicts its first response token).
    """
    batch, prompt_width = prompt_ids.shape
    response_width = response_ids.shape[1]
    device = prompt_ids.device
    valid = torch.cat([prompt_mask, response_mask], 1) > 0
    if batch and not bool(valid[:, -response_width - 1].all()):
        raise ValueError("cannot pack a sequence whose prompt has no valid token (it predicts the first response "
                         "token)")
    lengths = valid.sum(1).tolist()
    plan = ([list(range(batch))] if one_row else row_plan(lengths)) if batch else []
    fills = [sum(lengths[i] for i in row) for row in plan]
    width = max(fills, default=0)
    starts = [0] * batch
    for r, row in enumerate(plan):
        offset = r * width
        for index in row:
            starts[index] = offset
            offset += lengths[index]
    positions = position_ids_from_mask(valid.long())                          # (B, P + T), within each sequence
    destination = torch.tensor(starts, dtype=torch.long, device=device)[:, None] + positions
    rows = len(plan)
    ids = torch.cat([prompt_ids, response_ids], 1)
    flat_ids = torch.empty(rows * width, dtype=ids.dtype, device=device)
    flat_positions = torch.empty(rows * width, dtype=torch.long, device=device)
    flat_ids[destination[valid]] = ids[valid]
    flat_positions[destination[valid]] = positions[valid]
    packed_ids, packed_positions = flat_ids.view(rows, width), flat_positions.view(rows, width)
    column = torch.arange(width, device=device)[None, :] - torch.tensor(fills, dtype=torch.long, device=device)[:, None]
    unfilled = column >= 0                                                     # the end of a row: its own sequence
    packed_positions = torch.where(unfilled, column, packed_positions)
    packed_ids = torch.where(unfilled, packed_ids[:, :1].expand(rows, width), packed_ids)
    predictor = destination[:, prompt_width - 1: prompt_width - 1 + response_width]
    response_index = torch.where(response_mask > 0, predictor, torch.zeros_like(predictor))
    boundaries = [0]
    if one_row and batch:
        for length in lengths:
            boundaries.append(boundaries[-1] + length)
    return PackedLayout(input_ids=packed_ids, position_ids=packed_positions, response_index=response_index,
                        tokens=int(sum(lengths)), boundaries=boundaries if one_row and batch else [])


def packed_width(lengths: list[int], one_row: bool) -> tuple[int, int]:
    """``(R, W)`` of :func:`pack`'s layout of sequences of ``lengths`` tokens."""
    if one_row:
        return 1, sum(lengths)
    plan = row_plan(lengths)
    return len(plan), max(sum(lengths[i] for i in row) for row in plan)


# ----------------------------------------------------------------------------- attention per sequence

@dataclass(frozen=True)
class _Sequences:
    """The sequences of one packed row, right-padded for the attention alone.

    :ivar index: ``(S, L)`` each sequence's positions in the row (``L`` the longest; the
        padding repeats the sequence's last position).
    :ivar valid: ``(S, L)`` ``True`` at the sequences' own positions.
    """

    index: torch.Tensor
    valid: torch.Tensor

    @classmethod
    def of(cls, starts: list[int], lengths: list[int], device: torch.device) -> "_Sequences":
        """Sequences starting at ``starts`` in the row, of ``lengths`` tokens."""
        lengths = torch.tensor(lengths, device=device)
        starts = torch.tensor(starts, device=device)
        column = torch.arange(int(lengths.max()), device=device)
        valid = column[None, :] < lengths[:, None]
        index = starts[:, None] + torch.minimum(column[None, :], lengths[:, None] - 1)
        return cls(index=index, valid=valid)

    def pad(self, states: torch.Tensor) -> torch.Tensor:
        """``(1, heads, N, d)`` row states as ``(S, heads, L, d)``, in the layout attention
        inputs have (``(S, L, heads, d)`` in memory, as a projection's output)."""
        heads, dim = states.shape[1], states.shape[3]
        gathered = states[0].transpose(0, 1).index_select(0, self.index.reshape(-1))
        return gathered.view(*self.index.shape, heads, dim).transpose(1, 2)

    def block_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """The ``(1, 1, N, N)`` boolean mask's diagonal blocks as ``(S, 1, L, L)``; a padding
        query attends to itself alone (no row of ``sdpa`` is fully masked: no NaN)."""
        square = mask[0, 0]
        blocks = square[self.index[:, :, None], self.index[:, None, :]] & self.valid[:, None, :]
        eye = torch.eye(self.index.shape[1], dtype=torch.bool, device=mask.device)
        return (blocks | (eye & ~self.valid[:, :, None]))[:, None]


ATTENTION_CALL_FLOPS = 2e6
"""What one more ``sdpa`` call costs beside its arithmetic (gathering its sequences, the call,
Python), in attention FLOPs: about 0.2 ms at the 10 GFLOP/s this project's CPU computes
attention at (a sixth of its matmul rate). A performance knob of :func:`attention_groups`;
the numbers are the same whichever groups it makes."""


@functools.lru_cache(maxsize=64)
def attention_groups(lengths: tuple[int, ...], pair_flops: float) -> tuple[tuple[int, ...], ...]:
    """The sequences (indices into ``lengths``) each attention call of a packed row takes:
    sorted by length, consecutive runs chosen (dynamic programming) to minimise the attention's
    cost, ``Σ_calls n · L² · pair_flops`` (``n`` sequences right-padded to the run's longest,
    ``L``) plus :data:`ATTENTION_CALL_FLOPS` per call. Short sequences share a call with
    longer ones only where the padding costs less than another call."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    best = [0.0] + [float("inf")] * len(order)       # best[j]: the cost of the first j sequences
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        for start in range(end):
            cost = best[start] + (end - start) * lengths[order[start]] ** 2 * pair_flops + ATTENTION_CALL_FLOPS
            if cost < best[end]:
                best[end], cut[end] = cost, start
    groups, end = [], len(order)
    while end:
        groups.append(tuple(sorted(order[cut[end]:end])))
        end = cut[end]
    return tuple(reversed(groups))


def _causal_blocks(mask: torch.Tensor, sequences: _Sequences) -> bool:
    """Whether each sequence's diagonal block of a ``(1, 1, N, N)`` boolean mask is exactly
    causal (no window or chunk cuts the sequence): then every sequence attends with
    ``sdpa``'s causal kernel and no mask. ``S · L²`` work, not ``N²``."""
    blocks = mask[0, 0][sequences.index[:, :, None], sequences.index[:, None, :]]
    length = sequences.index.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=mask.device).tril()
    within = sequences.valid[:, :, None] & sequences.valid[:, None, :]
    return bool(torch.equal(blocks & within, causal & within))


def segment_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa`` attention, run on the packed row's sequences as right-padded
    batches when the call carries their boundaries (``cu_seq_lens_q``: :data:`SEGMENTS`), else
    exactly ``sdpa``. Each sequence attends to itself only, as in the block-diagonal mask
    transformers built for the row: with ``sdpa``'s causal kernel and no mask where that
    mask is causal within each sequence (:func:`_causal_blocks`), else with its diagonal
    blocks (a sliding window shorter than a sequence). Only the diagonal blocks are read:
    a sequence never attends outside itself here, whatever the rest of the mask says. The
    linear layers see no padding; the attention pays for each call's sequences padded to its
    longest (:func:`attention_groups`: sequences of like lengths together), not for ``N²``.

    :param query: ``(1, heads, N, head_dim)``; ``key``, ``value`` ``(1, kv_heads, N, head_dim)``.
    :return: ``(1, N, heads, head_dim)`` and no weights, as ``sdpa_attention_forward``.
    """
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    cumulative = kwargs.get("cu_seq_lens_q")
    if cumulative is None or query.shape[0] != 1 or query.shape[2] != key.shape[2] or \
            (attention_mask is not None and attention_mask.dtype != torch.bool):
        return sdpa(module, query, key, value, attention_mask, **kwargs)
    boundaries = [int(b) for b in cumulative.tolist()]
    lengths = [b - a for a, b in zip(boundaries, boundaries[1:])]
    outputs, positions = [], []
    for group in attention_groups(tuple(lengths), 4.0 * query.shape[1] * query.shape[3]):
        sequences = _Sequences.of([boundaries[i] for i in group], [lengths[i] for i in group], query.device)
        mask = None
        if attention_mask is not None and not _causal_blocks(attention_mask, sequences):
            mask = sequences.block_mask(attention_mask)
        out, _ = sdpa(module, sequences.pad(query), sequences.pad(key), sequences.pad(value), mask, **kwargs)
        outputs.append(out[sequences.valid])            # (n, L, heads, d) -> (tokens, heads, d)
        positions.append(sequences.index[sequences.valid])
    if len(outputs) == 1 and len(group) == len(lengths):
        return outputs[0][None], None                   # one call in row order
    order = torch.cat(positions).argsort()
    return torch.cat(outputs)[order][None], None


def _transformers_model(model: torch.nn.Module) -> PreTrainedModel | None:
    """The outermost transformers model in ``model`` (itself, or the one a peft or rlzoo
    wrapper holds)."""
    return next((module for module in model.modules() if isinstance(module, PreTrainedModel)), None)


def attention_implementation(model: torch.nn.Module) -> str:
    """The attention implementation ``model``'s layers look up (``sdpa``, ``eager``, ...)."""
    inner = _transformers_model(model)
    return str(getattr(inner.config, "_attn_implementation", "")) if inner is not None else ""


def use_segment_attention(model: torch.nn.Module) -> None:
    """Let ``model`` (on ``sdpa``) attend per sequence in :data:`SEGMENTS` calls: register
    :func:`segment_attention` as :data:`SEGMENT_ATTENTION` (with ``sdpa``'s mask) and set it
    as the model's implementation. Outside such calls it is ``sdpa`` itself. Not saved with
    the model (``config.json`` keeps no implementation). A model already set is left alone."""
    inner = _transformers_model(model)
    if inner is None or inner.config._attn_implementation == SEGMENT_ATTENTION:
        return
    if SEGMENT_ATTENTION not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(SEGMENT_ATTENTION, segment_attention)
        AttentionMaskInterface.register(SEGMENT_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    inner.set_attn_implementation(SEGMENT_ATTENTION)


BOUNDARY_PROBE = "rlzoo_sdpa_boundary_probe"
"""An ``sdpa`` attention implementation that records which calls carry sequence boundaries
(:func:`passes_boundaries`)."""


def passes_boundaries(model: torch.nn.Module) -> bool:
    """Whether ``model`` attends with ``sdpa`` and every attention call of its decoder
    receives the boundaries of packed sequences (``cu_seq_lens_q``, passed to the decoder as
    a keyword argument): what the :data:`SEGMENTS` layout needs (StableLM's layers, for one,
    do not pass keyword arguments down). One forward of two short sequences, without
    gradients; the model's implementation is restored."""
    inner = _transformers_model(model)
    before = attention_implementation(model)
    if inner is None or before not in ("sdpa", SEGMENT_ATTENTION):
        return False
    seen: list[bool] = []

    def probe(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
        seen.append(kwargs.get("cu_seq_lens_q") is not None)
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(BOUNDARY_PROBE, probe)
    AttentionMaskInterface.register(BOUNDARY_PROBE, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    device = next(model.parameters()).device
    ones = torch.ones(2, 2, dtype=torch.long, device=device)
    inputs = SequenceInputs.packed(pack(ones, ones.triu(), ones, ones), 2)  # prompts of 2 and 1 tokens
    inner.set_attn_implementation(BOUNDARY_PROBE)
    try:
        with torch.no_grad():
            model.get_decoder()(**inputs.kwargs())
    except TypeError:  # a forward that takes no further keyword arguments
        return False
    finally:
        inner.set_attn_implementation(before)
    return bool(seen) and all(seen)


# ----------------------------------------------------------------------------- the decoder's inputs

ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")
"""``config.layer_types`` entries whose layers mix tokens only through attention (a window or
a chunk is measured in the position ids, which restart per sequence)."""

RECURRENT_NAMES = re.compile(r"mamba|rwkv|recurrent|deltanet|linearattention|ssm|shortconv", re.IGNORECASE)
"""Module class names of layers that carry a state along the row (state-space, recurrent,
linear-attention and convolution mixers)."""


def token_mixers(model: torch.nn.Module) -> list[str]:
    """What in ``model`` mixes tokens other than attention, in words (empty: nothing): its
    ``torch.nn.Conv1d`` and recurrent modules (:data:`RECURRENT_NAMES`; GPT-2's ``Conv1D`` is
    a linear layer and is not one), and layer types its config names other than
    :data:`ATTENTION_LAYER_TYPES`. Such a layer runs along the packed row across the
    boundary between two sequences: packing it is not exact."""
    found = sorted({type(module).__name__ for module in model.modules()
                    if isinstance(module, torch.nn.Conv1d) or RECURRENT_NAMES.search(type(module).__name__)})
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    kinds = sorted({str(kind) for kind in getattr(config, "layer_types", None) or []} - set(ATTENTION_LAYER_TYPES))
    return [f"{name} layers" for name in found] + [f"layer type {kind!r}" for kind in kinds]


@dataclass(frozen=True)
class SequenceInputs:
    """What a decoder reads for a micro-batch, padded or packed, and how to take the
    response positions back out of its output.

    :ivar input_ids: ``(N, L)``: ``(B, P + T)`` padded, or ``(R, W)`` packed.
    :ivar attention_mask: ``(B, P + T)`` padded; ``None`` packed (transformers builds the
        block-diagonal mask from the position ids).
    :ivar position_ids: ``(N, L)``.
    :ivar layout: the packed layout, or ``None`` (padded).
    :ivar prompt_width: ``P``; :ivar response_width: ``T``.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    position_ids: torch.Tensor
    layout: PackedLayout | None
    prompt_width: int
    response_width: int

    @property
    def computed(self) -> int:
        """Token positions a forward computes."""
        return self.input_ids.numel()

    @classmethod
    def packed(cls, layout: PackedLayout, prompt_width: int) -> "SequenceInputs":
        """The inputs of ``layout``'s rows (of prompts padded to ``prompt_width``)."""
        return cls(layout.input_ids, None, layout.position_ids, layout, prompt_width, layout.response_index.shape[1])

    def kwargs(self) -> dict[str, Any]:
        """Every keyword argument of the decoder's call (``use_cache=False``: with a cache,
        transformers would not read packed sequences from the position ids)."""
        extra = self.layout.attention_kwargs() if self.layout is not None else {}
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask,
                "position_ids": self.position_ids, "use_cache": False, **extra}

    def responses(self, output: torch.Tensor) -> torch.Tensor:
        """The decoder's ``output`` ``(N, L, ...)`` at the positions that predict the response
        tokens: ``(B, T, ...)`` (arbitrary values where the response is padding)."""
        if self.layout is not None:
            return self.layout.gather(output)
        start = self.prompt_width - 1
        return output[:, start:start + self.response_width]


PACK_OVERHEAD_FLOPS = 6e4
"""What packing costs per token (building the layout, transformers' mask over the row, the
attention's gathers and their backward), in the model's matmul FLOPs: packing a micro-batch
pays when the share of padded positions it removes, times the model's matmul FLOPs per token
(:func:`token_flops`), exceeds it. Chosen on the embedded model (2 layers of width 64:
245,760 FLOPs a token), where packing broke even at 24 % padding
(``benchmarks/packing_threshold.py --half tuning``: 1.17x the padded time at 15 %, 1.00x at
24 %, 0.85x at 42 %), so that it packs from 24 % there; a model of SmolLM2's size (212
MFLOPs a token) packs whenever there is padding to remove."""


def token_flops(model: torch.nn.Module) -> float:
    """Matmul FLOPs per token of ``model``'s decoder: twice its weight matrices' elements,
    the embeddings left out (a mixture of experts counts every expert: an upper bound)."""
    decoder = model.get_decoder()
    embeddings = {id(module.weight) for module in decoder.modules() if isinstance(module, torch.nn.Embedding)}
    matrices = [param for param in decoder.parameters() if param.dim() >= 2 and id(param) not in embeddings]
    return 2.0 * sum(param.numel() for param in matrices)


def pack_min_share(model: torch.nn.Module) -> float:
    """The share of a micro-batch's padded positions packing must remove to be used on
    ``model`` (:data:`PACK_OVERHEAD_FLOPS` / :func:`token_flops`, at most 1)."""
    return min(1.0, PACK_OVERHEAD_FLOPS / max(token_flops(model), 1.0))


def sequence_inputs(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
                    response_mask: torch.Tensor, packing: str, min_share: float = 0.0) -> SequenceInputs:
    """The decoder's inputs for prompt + response in the layout ``packing`` (:data:`PADDED`,
    :data:`ROWS`, :data:`SEGMENTS`); a packed layout that removes less than ``min_share`` of
    the padded positions (the model's :func:`pack_min_share`) is left for the padded one
    (:func:`full_sequence`), as is one that removes nothing."""
    prompt_width, response_width = prompt_ids.shape[1], response_ids.shape[1]
    if packing != PADDED and prompt_ids.shape[0]:
        layout = _packed_layout(prompt_ids, prompt_mask, response_ids, response_mask, packing, min_share)
        if layout is not None:
            return SequenceInputs.packed(layout, prompt_width)
    input_ids, attention, positions = full_sequence(prompt_ids, prompt_mask, response_ids, response_mask)
    return SequenceInputs(input_ids, attention, positions, None, prompt_width, response_width)


def _packed_layout(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
                   response_mask: torch.Tensor, packing: str, min_share: float) -> PackedLayout | None:
    """:func:`pack`'s layout when it computes at most ``1 - min_share`` of the padded
    positions and fewer than them, else ``None``."""
    padded = prompt_ids.shape[0] * (prompt_ids.shape[1] + response_ids.shape[1])
    most = (1 - min_share) * padded
    if float(prompt_mask.sum() + response_mask.sum()) > most:   # the real tokens alone are too many
        return None
    layout = pack(prompt_ids, prompt_mask, response_ids, response_mask, one_row=packing == SEGMENTS)
    return layout if layout.computed <= most and layout.computed < padded else None


def full_sequence(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                  response_ids: torch.Tensor, response_mask: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, position_ids)`` of prompt + response, ``(B, P + T)``:
    left-padded prompts, right-padded responses, positions counting valid tokens."""
    input_ids = torch.cat([prompt_ids, response_ids], 1)
    attention = torch.cat([prompt_mask.long(), response_mask.long()], 1)
    return input_ids, attention, position_ids_from_mask(attention)
