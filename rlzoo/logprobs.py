"""Per-token log-probabilities and entropy of the response tokens, computed in chunks.

The policy's hidden states are projected to the vocabulary a chunk of tokens at a time
(only valid response tokens, never padding), and each chunk runs under activation
checkpointing when gradients are on, so no full ``(B, T, V)`` float32 logit or
log-softmax tensor is kept for backward: peak memory grows with ``chunk_size · V``
rather than ``B · T · V``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from rlzoo.rollout import position_ids_from_mask


@dataclass
class SequenceOutput:
    """Outputs over the response positions, all ``(B, T)`` (``logits``: ``(B, T, V)``)."""

    logp: torch.Tensor
    entropy: torch.Tensor | None = None
    logits: torch.Tensor | None = None


def head_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """LM-head logits ``(..., V)`` as float32, for a float32 softmax. Under autocast
    (``trainer.precision=bf16``) the matmul runs in bfloat16 like the backbone's, as verl and
    TRL compute it; otherwise it runs in float32 (bfloat16 weights are upcast first)."""
    if torch.is_autocast_enabled(hidden.device.type):
        return F.linear(hidden, weight, bias).float()
    return F.linear(hidden.float(), weight.float(), None if bias is None else bias.float())


def _head_chunk(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, with_entropy: bool, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head_logits(hidden, weight, bias)
    if temperature != 1.0:
        logits = logits / temperature
    log_norm = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - log_norm
    if with_entropy:
        entropy = log_norm - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    else:
        entropy = torch.zeros_like(logp)
    return logp, entropy


CHECKPOINT_MIN_BYTES = 16 * 2**20
"""Chunks are recomputed in backward only when the float32 logits of all valid tokens
would take more than this (below it, keeping them costs less than recomputing)."""


def token_logprobs(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor,
                   mask: torch.Tensor, chunk_size: int = 1024, with_entropy: bool = False,
                   checkpoint_min_bytes: int = CHECKPOINT_MIN_BYTES, temperature: float = 1.0
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of ``targets`` under ``head(hidden) / temperature``.

    :param hidden: ``(B, T, H)`` hidden states that predict ``targets``.
    :param head: the output projection (``H -> V``).
    :param targets: ``(B, T)`` token ids.
    :param mask: ``(B, T)``; only positions with mask > 0 are computed, the rest are 0.
    :param chunk_size: tokens projected to the vocabulary at a time.
    :param checkpoint_min_bytes: with gradients on, chunks run under activation
        checkpointing when (valid tokens × V × 4 bytes) exceeds this.
    :param temperature: the logits are divided by it (the sampling temperature, so the
        log-probs are those of the distribution the tokens were sampled from).
    :return: ``logp`` ``(B, T)`` and ``entropy`` ``(B, T)`` (nats) or ``None``.
    """
    batch, length = targets.shape
    flat_index = mask.reshape(-1).nonzero().squeeze(-1)
    flat_hidden = hidden.reshape(batch * length, -1).index_select(0, flat_index)
    flat_targets = targets.reshape(-1).index_select(0, flat_index)
    logit_bytes = flat_index.numel() * head.weight.shape[0] * 4
    use_checkpoint = (torch.is_grad_enabled() and (hidden.requires_grad or head.weight.requires_grad)
                      and logit_bytes > checkpoint_min_bytes)
    logp_parts, entropy_parts = [], []
    for start in range(0, flat_index.numel(), chunk_size):
        args = (flat_hidden[start:start + chunk_size], head.weight, head.bias,
                flat_targets[start:start + chunk_size], with_entropy, temperature)
        if use_checkpoint:
            lp, ent = checkpoint(_head_chunk, *args, use_reentrant=False)
        else:
            lp, ent = _head_chunk(*args)
        logp_parts.append(lp)
        entropy_parts.append(ent)
    dtype = torch.float32
    logp = torch.zeros(batch * length, dtype=dtype, device=hidden.device)
    entropy = torch.zeros(batch * length, dtype=dtype, device=hidden.device)
    if logp_parts:
        logp = logp.index_put((flat_index,), torch.cat(logp_parts))
        entropy = entropy.index_put((flat_index,), torch.cat(entropy_parts))
    logp = logp.view(batch, length)
    return logp, (entropy.view(batch, length) if with_entropy else None)


def full_sequence(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                  response_ids: torch.Tensor, response_mask: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, position_ids)`` of prompt + response, ``(B, P + T)``."""
    input_ids = torch.cat([prompt_ids, response_ids], 1)
    attention = torch.cat([prompt_mask.long(), response_mask.long()], 1)
    return input_ids, attention, position_ids_from_mask(attention)


def response_forward(model: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                     response_ids: torch.Tensor, response_mask: torch.Tensor, *,
                     chunk_size: int = 1024, with_entropy: bool = False,
                     with_logits: bool = False, temperature: float = 1.0) -> SequenceOutput:
    """One forward of the policy over prompt + response; outputs at response positions.

    Runs the decoder, then the chunked head (:func:`token_logprobs`) on
    ``logits / temperature``. ``with_logits`` also returns the full ``(B, T, V)`` tempered
    logits (for estimators that read ``logits``).
    """
    input_ids, attention, positions = full_sequence(prompt_ids, prompt_mask, response_ids, response_mask)
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention,
                                 position_ids=positions, use_cache=False).last_hidden_state
    prompt_len = prompt_ids.shape[1]
    hidden = hidden[:, prompt_len - 1: prompt_len - 1 + response_ids.shape[1]]
    head = model.get_output_embeddings()
    logp, entropy = token_logprobs(hidden, head, response_ids, response_mask, chunk_size, with_entropy,
                                   temperature=temperature)
    logits = None
    if with_logits:
        logits = head_logits(hidden, head.weight, head.bias) / temperature
    return SequenceOutput(logp=logp, entropy=entropy, logits=logits)


class ResponseForward(torch.nn.Module):
    """The policy's training forward as one module: what DDP or FSDP wrap.

    ``forward`` runs :func:`response_forward` on the wrapped causal LM, so the decoder and
    the chunked head both run inside the wrapper's forward (data-parallel wrappers
    synchronise gradients of, and FSDP gathers, exactly the parameters used there).
    Returns ``(logp, entropy, logits)``, each ``(B, T)`` (``logits`` ``(B, T, V)``) or ``None``.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
                response_mask: torch.Tensor, chunk_size: int = 1024, with_entropy: bool = False,
                with_logits: bool = False, temperature: float = 1.0
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        out = response_forward(self.model, prompt_ids, prompt_mask, response_ids, response_mask,
                               chunk_size=chunk_size, with_entropy=with_entropy, with_logits=with_logits,
                               temperature=temperature)
        return out.logp, out.entropy, out.logits
