"""Rollout: sample completions from a causal LM with a KV cache, with their log-probs.

A plain sampling loop over ``model.forward`` with the cache, rather than
``model.generate``: for the small models RL research runs on a CPU the per-token overhead
of ``generate``'s processors dominates, and the loop is short enough to read. The ``hf``
rollout backend (``rlzoo_plugins.rollout_backends``) runs it; :class:`Generation` is what every
rollout backend returns.
"""

from __future__ import annotations

import inspect
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

from rlzoo.core.batch import Generation
from rlzoo.core.errors import TrainingError
from rlzoo.core.tokens import position_ids_from_mask
from rlzoo.models.head import CACHE_MODES, fast_paths


class _PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views into buffers allocated once for
    the whole decode: appending a token writes in place instead of ``torch.cat``-ing the
    cache into a new tensor at every step (which copied the cache each step and, on a CPU,
    page-faulted the fresh allocation in)."""

    def __init__(self, layer: DynamicLayer, capacity: int) -> None:
        super().__init__()
        keys, values = layer.keys, layer.values
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        length = keys.shape[-2]
        self._key_buffer = keys.new_empty((*keys.shape[:-2], capacity, keys.shape[-1]))
        self._value_buffer = values.new_empty((*values.shape[:-2], capacity, values.shape[-1]))
        self._key_buffer[..., :length, :] = keys
        self._value_buffer[..., :length, :] = values
        self.keys = self._key_buffer[..., :length, :]
        self.values = self._value_buffer[..., :length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        start, end = self.keys.shape[-2], self.keys.shape[-2] + key_states.shape[-2]
        if end > self._key_buffer.shape[-2]:
            return super().update(key_states, value_states, *args, **kwargs)
        self._key_buffer[..., start:end, :] = key_states
        self._value_buffer[..., start:end, :] = value_states
        self.keys = self._key_buffer[..., :end, :]
        self.values = self._value_buffer[..., :end, :]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the rows ``indices`` (in new buffers of the same capacity; the filled part copied)."""
        length = self.keys.shape[-2]
        for name in ("_key_buffer", "_value_buffer"):
            old = getattr(self, name)
            new = old.new_empty((len(indices), *old.shape[1:]))
            new[..., :length, :] = old[indices, ..., :length, :]
            setattr(self, name, new)
        self.keys = self._key_buffer[..., :length, :]
        self.values = self._value_buffer[..., :length, :]


def _preallocate(past: object, capacity: int) -> None:
    """Swap the plain growing layers of a prefilled cache for :class:`_PreallocatedLayer`
    (other layer kinds, e.g. sliding-window ones, are left as they are)."""
    layers = getattr(past, "layers", None)
    if not isinstance(layers, list):
        return
    for index, layer in enumerate(layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.dim() == 4:
            layers[index] = _PreallocatedLayer(layer, capacity)


SAMPLE_BLOCK = 256
"""Vocabulary entries per block of :func:`sample_categorical`'s two-level search."""

COMPACT_SHARE = 0.25
"""The decode loop drops finished rows from the batch it computes once they are this share of it
(a ragged batch's short answers stop costing a forward per step; each drop copies the live rows'
KV cache once, so drops are spaced geometrically)."""

COMPACT_MIN_STEPS = 16
"""...and only while at least this many decode steps may remain (``max_new_tokens`` left): a short
budget's few remaining steps do not pay for the copy."""

_COMPACTABLE_LAYERS = (DynamicLayer, DynamicSlidingWindowLayer, _PreallocatedLayer)
"""Cache layers whose ``batch_select_indices`` keeps exactly the selected rows' keys and values
(a model whose cache holds any other kind, e.g. a linear-attention or static layer, is never
compacted)."""


def _compactable(past: object) -> bool:
    """Whether the decode loop may drop rows of ``past`` (``None``: no cache, always)."""
    if past is None:
        return True
    layers = getattr(past, "layers", None)
    return (type(past) is DynamicCache and isinstance(layers, list)
            and all(type(layer) in _COMPACTABLE_LAYERS for layer in layers))


def _cache_kwarg(model: PreTrainedModel) -> str:
    """The forward's KV-cache argument: ``cache`` (transformers >= 5.2x) or ``past_key_values``;
    a peft model passes its keyword arguments on to the model it wraps, whose name it is."""
    inner = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    try:
        parameters = inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def _returned_cache(out: object) -> object:
    """The KV cache a forward returned, under either name (``cache`` is newer)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def sample_categorical(probs: torch.Tensor, uniform: torch.Tensor | None = None) -> torch.Tensor:
    """One index per row of ``probs`` ``(B, V)`` (non-negative, rows need not sum to 1),
    drawn with probability ``probs[b, i] / probs[b].sum()``: ``(B,)`` long.

    Inverse-CDF sampling with one uniform draw per row from torch's global RNG, searched
    in two levels (which block of :data:`SAMPLE_BLOCK` entries, then which entry), with the
    cumulative sums in float64. ``torch.multinomial`` draws one exponential per vocabulary
    entry instead (for ``V`` = 32,000 it took 45 % of a float32 rollout on a CPU); this
    draws the same distribution up to float32 rounding of the block sums. An entry of
    probability 0 (outside a top-p nucleus) is never drawn.

    :param uniform: ``(B, 1)`` float64 draws in ``(0, 1]`` to use instead of drawing them here
        (the decode loop draws one per row of its whole batch and passes the live rows').
    :raises TrainingError: a row's total is not finite and positive (the policy's logits
        overflowed or hold NaN).
    """
    rows, vocab = probs.shape
    blocks = -(-vocab // SAMPLE_BLOCK)
    padded = F.pad(probs, (0, blocks * SAMPLE_BLOCK - vocab)) if blocks * SAMPLE_BLOCK != vocab else probs
    padded = padded.view(rows, blocks, SAMPLE_BLOCK)
    block_cdf = padded.sum(-1).double().cumsum(-1)                                  # (B, blocks)
    total = block_cdf[:, -1]
    if not bool((torch.isfinite(total) & (total > 0)).all()):
        bad = (~(torch.isfinite(total) & (total > 0))).nonzero().flatten().tolist()
        raise TrainingError(f"cannot sample: the token probabilities of rows {bad[:8]} are not finite "
                            "(the policy's logits overflowed or hold NaN); the step was stopped and no "
                            "checkpoint was written for it")
    # u in (0, total]: the first cumulative sum >= u is never that of a zero-mass entry
    if uniform is None:
        uniform = 1.0 - torch.rand(rows, 1, dtype=torch.float64, device=probs.device)
    u = uniform * block_cdf[:, -1:]
    block = torch.searchsorted(block_cdf, u).clamp_(max=blocks - 1)                 # (B, 1)
    before = F.pad(block_cdf, (1, 0)).gather(1, block)                              # mass of earlier blocks
    inner_cdf = padded[torch.arange(rows, device=probs.device), block[:, 0]].cumsum(-1, dtype=torch.float64)
    inner = torch.searchsorted(inner_cdf, torch.minimum(u - before, inner_cdf[:, -1:]))
    return (block * SAMPLE_BLOCK + inner)[:, 0]


def _sample(logits: torch.Tensor, temperature: float, top_p: float,
            greedy: bool, draws: int = 0, live: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of ``(B, V)`` logits and its log-prob under the distribution it
    was drawn from: ``(token (B,), logp (B,) float32)``. With ``live``, the rows are those rows of
    a batch of ``draws``: one uniform is drawn per row of that batch and the live rows' are used,
    so the random stream is the uncompacted loop's."""
    if greedy or temperature == 0:
        token = logits.argmax(-1)
        return token, torch.zeros(token.shape, dtype=torch.float32, device=token.device)
    scaled = logits.float() if temperature == 1.0 else logits.float() / temperature
    log_probs = torch.log_softmax(scaled, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = log_probs.exp().sort(-1, descending=True)
        drop = sorted_probs.cumsum(-1) - sorted_probs > top_p
        outside = torch.zeros_like(drop).scatter(-1, order, drop)
        log_probs = torch.log_softmax(log_probs.masked_fill(outside, -torch.inf), dim=-1)
    uniform = None
    if live is not None:
        uniform = (1.0 - torch.rand(draws, 1, dtype=torch.float64, device=logits.device))[live]
    token = sample_categorical(log_probs.exp(), uniform)
    return token, log_probs.gather(-1, token[:, None]).squeeze(-1)


@torch.inference_mode()
def generate(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    num_samples: int = 1,
    cache: str | None = None,
    compact: bool = True,
) -> Generation:
    """Sample up to ``max_new_tokens`` tokens after each left-padded prompt.

    :param prompt_ids: ``(B, P)`` left-padded prompt ids; ``prompt_mask`` ``(B, P)``.
    :param num_samples: completions per prompt (a group): each prompt is prefilled once and
        its KV cache repeated, so responses are ``(B · num_samples, T)``, prompt-major
        (row ``i · num_samples + j`` is the j-th completion of prompt i).
    :param cache: how the keys and values are kept, one of :data:`rlzoo.models.head.CACHE_MODES`;
        ``None``: the mode the model's load-time check chose (:func:`rlzoo.models.head.fast_paths`).
    :param compact: drop finished rows from the computed batch (:data:`COMPACT_SHARE`,
        :data:`COMPACT_MIN_STEPS`) where the model's cache allows it (:func:`_compactable`);
        the tokens drawn are the uncompacted loop's (the same uniform per row and step), their
        log-probs equal to float32 rounding of a smaller batch's forward.
    :return: the responses and their log-probs; sampling uses torch's global RNG
        (seeded by the trainer).
    """
    cache = fast_paths(model).cache if cache is None else cache
    if cache not in CACHE_MODES:
        raise ValueError(f"cache={cache!r}; choose one of {', '.join(CACHE_MODES)}")
    use_cache = cache != "none"
    device = prompt_ids.device
    prefill_once = cache == "preallocated"      # else each prompt is repeated before its prefill
    if not prefill_once and num_samples > 1:
        prompt_ids = prompt_ids.repeat_interleave(num_samples, 0)
        prompt_mask = prompt_mask.repeat_interleave(num_samples, 0)
    attention = prompt_mask.long()
    positions = position_ids_from_mask(attention)
    out = model(input_ids=prompt_ids, attention_mask=attention, position_ids=positions,
                use_cache=use_cache, logits_to_keep=1)
    past = _returned_cache(out) if use_cache else None
    cache_kwarg = _cache_kwarg(model)
    next_logits = out.logits[:, -1]
    sequence = prompt_ids
    if prefill_once and num_samples > 1:
        past.batch_repeat_interleave(num_samples)
        next_logits = next_logits.repeat_interleave(num_samples, 0)
        attention = attention.repeat_interleave(num_samples, 0)
        positions = positions.repeat_interleave(num_samples, 0)
    if prefill_once:
        _preallocate(past, prompt_ids.shape[1] + max_new_tokens)
    batch = attention.shape[0]
    last_position = positions[:, -1]
    tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logps = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    length = torch.zeros(batch, dtype=torch.long, device=device)
    live = torch.arange(batch, device=device)           # the rows of the whole batch that are computed
    compact = compact and _compactable(past)
    steps = 0
    for t in range(max_new_tokens):
        token, token_logp = _sample(next_logits, temperature, top_p, greedy, draws=batch,
                                    live=live if len(live) < batch else None)
        done = finished[live]
        token = torch.where(done, torch.full_like(token, pad_id), token)
        tokens[live, t] = token
        logps[live, t] = torch.where(done, torch.zeros_like(token_logp), token_logp)
        length[live] += (~done).long()
        finished[live] = done | (token == eos_id)
        steps = t + 1
        if bool(finished.all()) or t == max_new_tokens - 1:
            break
        done = finished[live]
        if compact and max_new_tokens - 1 - t >= COMPACT_MIN_STEPS and int(done.sum()) >= COMPACT_SHARE * len(live):
            keep = (~done).nonzero().flatten()
            live, token, attention, last_position = live[keep], token[keep], attention[keep], last_position[keep]
            if past is None:
                sequence = sequence[keep]
            else:
                past.batch_select_indices(keep)
        rows = len(live)
        attention = torch.cat([attention, torch.ones((rows, 1), dtype=attention.dtype, device=device)], 1)
        last_position = last_position + 1
        if past is None:                                  # no cache: the whole sequence again
            sequence = torch.cat([sequence, token[:, None]], 1)
            out = model(input_ids=sequence, attention_mask=attention, position_ids=position_ids_from_mask(attention),
                        use_cache=False, logits_to_keep=1)
        else:
            out = model(input_ids=token[:, None], attention_mask=attention,
                        position_ids=last_position[:, None], use_cache=True, **{cache_kwarg: past})
            past = _returned_cache(out)
        next_logits = out.logits[:, -1]
    tokens = tokens[:, :steps]
    response_mask = (torch.arange(steps, device=device)[None, :] < length[:, None]).float()
    return Generation(response_ids=tokens, response_mask=response_mask, truncated=~finished,
                      logp=logps[:, :steps])
