"""Rollout: sample completions from a causal LM with a KV cache, with their log-probs.

A plain sampling loop over ``model.forward`` with the cache, rather than
``model.generate``: for the small models RL research runs on a CPU the per-token overhead
of ``generate``'s processors dominates, and the loop is short enough to read. The ``hf``
rollout backend (``rlzoo_plugins.rollout``) runs it; :class:`Generation` is what every
rollout backend returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel


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


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into ``(ids, mask)``, both ``(B, P)``."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        if seq:
            ids[i, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
            mask[i, width - len(seq):] = 1
    return ids, mask


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting only attended tokens, so left padding does not shift them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _sample(logits: torch.Tensor, temperature: float, top_p: float,
            greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of ``(B, V)`` logits and its log-prob under the distribution it
    was drawn from: ``(token (B,), logp (B,) float32)``."""
    if greedy or temperature == 0:
        token = logits.argmax(-1)
        return token, torch.zeros(token.shape, dtype=torch.float32, device=token.device)
    scaled = logits.float() / temperature
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(-1, descending=True)
        drop = sorted_probs.cumsum(-1) - sorted_probs > top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        scaled = scaled.masked_fill(probs == 0, -torch.inf)
    token = torch.multinomial(probs, 1).squeeze(-1)
    logp = torch.log_softmax(scaled, dim=-1).gather(-1, token[:, None]).squeeze(-1)
    return token, logp


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
) -> Generation:
    """Sample up to ``max_new_tokens`` tokens after each left-padded prompt.

    :param prompt_ids: ``(B, P)`` left-padded prompt ids; ``prompt_mask`` ``(B, P)``.
    :param num_samples: completions per prompt (a group): each prompt is prefilled once and
        its KV cache repeated, so responses are ``(B · num_samples, T)``, prompt-major
        (row ``i · num_samples + j`` is the j-th completion of prompt i).
    :return: the responses and their log-probs; sampling uses torch's global RNG
        (seeded by the trainer).
    """
    device = prompt_ids.device
    attention = prompt_mask.long()
    positions = position_ids_from_mask(attention)
    out = model(input_ids=prompt_ids, attention_mask=attention, position_ids=positions,
                use_cache=True, logits_to_keep=1)
    past = out.past_key_values
    next_logits = out.logits[:, -1]
    if num_samples > 1:
        past.batch_repeat_interleave(num_samples)
        next_logits = next_logits.repeat_interleave(num_samples, 0)
        attention = attention.repeat_interleave(num_samples, 0)
        positions = positions.repeat_interleave(num_samples, 0)
    batch = attention.shape[0]
    last_position = positions[:, -1]
    tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logps = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    length = torch.zeros(batch, dtype=torch.long, device=device)
    steps = 0
    for t in range(max_new_tokens):
        token, token_logp = _sample(next_logits, temperature, top_p, greedy)
        token = torch.where(finished, torch.full_like(token, pad_id), token)
        tokens[:, t] = token
        logps[:, t] = torch.where(finished, torch.zeros_like(token_logp), token_logp)
        length += (~finished).long()
        finished |= token == eos_id
        steps = t + 1
        if bool(finished.all()) or t == max_new_tokens - 1:
            break
        attention = torch.cat([attention, torch.ones((batch, 1), dtype=attention.dtype, device=device)], 1)
        last_position = last_position + 1
        out = model(input_ids=token[:, None], attention_mask=attention,
                    position_ids=last_position[:, None], past_key_values=past, use_cache=True)
        past = out.past_key_values
        next_logits = out.logits[:, -1]
    tokens = tokens[:, :steps]
    response_mask = (torch.arange(steps, device=device)[None, :] < length[:, None]).float()
    return Generation(response_ids=tokens, response_mask=response_mask, truncated=~finished,
                      logp=logps[:, :steps])
