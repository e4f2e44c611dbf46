"""Per-token log-probabilities and entropy of the response tokens, computed in chunks.

The policy's hidden states are projected to the vocabulary a chunk of tokens at a time
(only valid response tokens, never padding) by :class:`_HeadChunk`, whose backward is
written out: at most one ``(chunk, V)`` float32 log-softmax per chunk is kept for
backward, and only while those of the whole call fit in ``keep_max_bytes`` (otherwise it
is recomputed from the chunk's hidden states), so no full ``(B, T, V)`` float32 logit
tensor is kept and peak memory is bounded by the budget, not by ``B · T · V``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from rlzoo.models.head import LogitTransform, fast_paths
from rlzoo.models.packing import SEGMENTS, SequenceInputs, sequence_inputs, use_segment_attention

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class SequenceOutput:
    """Outputs over the response positions, all ``(B, T)`` (``logits``: ``(B, T, V)``)."""

    logp: torch.Tensor
    entropy: torch.Tensor | None = None
    logits: torch.Tensor | None = None


def head_matmul_dtype(device_type: str) -> torch.dtype:
    """The LM head's matmul dtype: the autocast dtype under autocast
    (``trainer.precision=bf16``: bfloat16, as verl and TRL compute it), float32 otherwise
    (bfloat16 weights of ``model.dtype=bfloat16`` are upcast)."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else torch.float32


def head_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                transform: LogitTransform | None = None) -> torch.Tensor:
    """LM-head logits ``(..., V)`` as float32, for a float32 softmax, after the model's
    post-head ``transform`` (:mod:`rlzoo.models.head`); the matmul in :func:`head_matmul_dtype`.
    Differentiable (autograd runs through the transform)."""
    dtype = head_matmul_dtype(hidden.device.type)
    logits = F.linear(hidden.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)).float()
    if transform is not None:
        logits = logits * transform.scale
        if transform.softcap is not None:
            logits = torch.tanh(logits / transform.softcap) * transform.softcap
    return logits


def _raw_logits(hidden: torch.Tensor, weight_mm: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The head's logits ``(N, V)`` float32 before any transform; the matmul in
    ``weight_mm``'s dtype."""
    return F.linear(hidden.to(weight_mm.dtype), weight_mm, None if bias is None else bias.to(weight_mm.dtype)).float()


def _log_softmax(hidden: torch.Tensor, weight_mm: torch.Tensor, bias: torch.Tensor | None,
                 temperature: float, transform: LogitTransform | None = None) -> torch.Tensor:
    """``log_softmax(transform(head(hidden)) / temperature)``, ``(N, V)`` float32, the
    matmul in ``weight_mm``'s dtype; computed in place in the logits' buffer (a fresh
    ``N × V`` allocation costs more than the softmax on a CPU, where it is page-faulted in)."""
    logits = _raw_logits(hidden, weight_mm, bias)
    if transform is not None:
        logits = transform.apply_(logits)
    if temperature != 1.0:
        logits = logits.div_(temperature)
    return torch.log_softmax(logits, dim=-1, out=logits)


ENTROPY_BLOCK_BYTES = 2 * 2**20
"""Bytes of ``p = exp(z)`` formed at a time for the entropy (a buffer that stays in cache)."""


def _entropy(log_probs: torch.Tensor) -> torch.Tensor:
    """``-Σ_v p_v log p_v`` per row of ``(N, V)`` float32 log-probs, ``(N,)``, forming ``p``
    a block of rows at a time (:data:`ENTROPY_BLOCK_BYTES`) in one reused buffer."""
    rows, vocab = log_probs.shape
    block = max(1, ENTROPY_BLOCK_BYTES // (4 * vocab))
    entropy = torch.empty(rows, dtype=log_probs.dtype, device=log_probs.device)
    buffer = log_probs.new_empty((min(rows, block), vocab))
    for start in range(0, rows, block):
        z = log_probs[start:start + block]
        p = torch.exp(z, out=buffer[:z.shape[0]])
        entropy[start:start + z.shape[0]] = p.mul_(z).sum(-1).neg_()
    return entropy


class _HeadChunk(torch.autograd.Function):
    """Log-prob of each target and entropy under ``softmax(f(head(hidden)) / τ)`` for a
    chunk of ``N`` tokens, with a hand-written backward (``f``: the model's post-head
    transform, :class:`rlzoo.models.head.LogitTransform`, or the identity).

    Forward: one head matmul, one fused ``log_softmax`` (``z``), a gather, and (for the
    entropy) ``exp`` and a batched dot product. Backward, with ``p = exp(z)``:
    ``∂logp/∂logits = onehot(target) − p`` and ``∂H/∂logits = −p ⊙ (z + H)``, divided by
    τ, then through ``f`` (a softcap's derivative recomputes the chunk's raw logits), then
    the head's two matmuls. ``z`` is either kept from the forward (``keep``) or
    recomputed from the chunk's hidden states; nothing else of size ``N × V`` is saved.
    (autograd through the same ops spends several more passes over ``N × V``: a separate
    ``logsumexp``, a softmax for the entropy, the gather's backward; under activation
    checkpointing it also redoes the whole forward.)

    The matmuls run in ``weight_mm``'s dtype: the head's weight cast once per call
    (bfloat16 under autocast, as autograd would run them; float32 otherwise), shared by
    every chunk's forward and backward; everything else is float32.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, weight_mm: torch.Tensor,
                bias: torch.Tensor | None, targets: torch.Tensor, temperature: float, with_entropy: bool,
                keep: bool, transform: LogitTransform | None) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(hidden.device.type, enabled=False):
            log_probs = _log_softmax(hidden, weight_mm, bias, temperature, transform)
            logp = log_probs.gather(-1, targets[:, None]).squeeze(-1)
            entropy = _entropy(log_probs) if with_entropy else torch.zeros_like(logp)
        ctx.temperature, ctx.weight_dtype, ctx.transform = temperature, weight.dtype, transform
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(hidden, weight_mm, bias, targets, entropy, log_probs if keep else None)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        hidden, weight_mm, bias, targets, entropy, log_probs = ctx.saved_tensors
        if grad_logp is None and grad_entropy is None:
            return None, None, None, None, None, None, None, None, None
        transform = ctx.transform
        with torch.autocast(hidden.device.type, enabled=False):
            if log_probs is None:
                log_probs = _log_softmax(hidden, weight_mm, bias, ctx.temperature, transform)
            grad = _logits_grad(log_probs, entropy, targets, grad_logp, grad_entropy, ctx.temperature)
            if transform is not None:
                raw = _raw_logits(hidden, weight_mm, bias) if transform.softcap is not None else None
                grad = transform.backward_(grad, raw)
            grad_mm = grad.to(weight_mm.dtype)
            needs = ctx.needs_input_grad
            grad_hidden = (grad_mm @ weight_mm).to(hidden.dtype) if needs[0] else None
            grad_weight = (grad_mm.t() @ hidden.to(weight_mm.dtype)).to(ctx.weight_dtype) if needs[1] else None
            grad_bias = grad.sum(0).to(bias.dtype) if bias is not None and needs[3] else None
        return grad_hidden, grad_weight, None, grad_bias, None, None, None, None, None


def _logits_grad(log_probs: torch.Tensor, entropy: torch.Tensor, targets: torch.Tensor,
                 grad_logp: torch.Tensor | None, grad_entropy: torch.Tensor | None,
                 temperature: float) -> torch.Tensor:
    """The loss's gradient with respect to the chunk's (untempered) logits, ``(N, V)``
    float32, formed in ``log_probs``'s buffer (a saved ``z`` is consumed: the graph cannot
    be run backward twice, which autograd reports as a modified saved tensor)."""
    if grad_entropy is None:                              # −g · p
        grad = log_probs.exp_().mul_(-grad_logp[:, None])
    else:
        probs = log_probs.exp()
        grad = log_probs.add_(entropy[:, None]).mul_(probs).mul_(-grad_entropy[:, None])
        if grad_logp is not None:
            grad.sub_(probs.mul_(grad_logp[:, None]))
    if grad_logp is not None:
        grad.scatter_add_(-1, targets[:, None], grad_logp[:, None].to(grad.dtype))
    if temperature != 1.0:
        grad.div_(temperature)
    return grad


KEEP_MAX_BYTES = 256 * 2**20
"""With gradients on, the chunks' float32 log-softmax is kept for backward when that of all
valid tokens of the call fits in this many bytes, and recomputed from the hidden states
otherwise (``trainer.logprob_keep_mb``)."""


def token_logprobs(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor,
                   mask: torch.Tensor, chunk_size: int = 1024, with_entropy: bool = False,
                   keep_max_bytes: int = KEEP_MAX_BYTES, temperature: float = 1.0,
                   transform: LogitTransform | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of ``targets`` under ``transform(head(hidden)) / temperature``.

    :param hidden: ``(B, T, H)`` hidden states that predict ``targets``.
    :param head: the output projection (``H -> V``).
    :param targets: ``(B, T)`` token ids.
    :param mask: ``(B, T)``; only positions with mask > 0 are computed, the rest are 0.
    :param chunk_size: tokens projected to the vocabulary at a time.
    :param keep_max_bytes: with gradients on, each chunk's ``(chunk, V)`` float32
        log-softmax is kept for backward when (valid tokens × V × 4 bytes) is at most this,
        and recomputed in backward from the chunk's hidden states otherwise.
    :param temperature: the logits are divided by it (the sampling temperature, so the
        log-probs are those of the distribution the tokens were sampled from).
    :param transform: the model's post-head transform (:func:`rlzoo.models.head.known_transform`).
    :return: ``logp`` ``(B, T)`` and ``entropy`` ``(B, T)`` (nats) or ``None``.
    """
    batch, length = targets.shape
    flat_index = mask.reshape(-1).nonzero().squeeze(-1)
    flat_hidden = hidden.reshape(batch * length, -1).index_select(0, flat_index)
    flat_targets = targets.reshape(-1).index_select(0, flat_index)
    keep = flat_index.numel() * head.weight.shape[0] * 4 <= keep_max_bytes
    weight_mm = head.weight.detach().to(head_matmul_dtype(hidden.device.type))
    logp_parts, entropy_parts = [], []
    for start in range(0, flat_index.numel(), chunk_size):
        lp, ent = _HeadChunk.apply(flat_hidden[start:start + chunk_size], head.weight, weight_mm, head.bias,
                                   flat_targets[start:start + chunk_size], temperature, with_entropy, keep,
                                   transform)
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


def sum_of_squared_probs(logits: torch.Tensor) -> torch.Tensor:
    """Σ_v π(v)² of the softmax of ``logits`` over the last axis: ``(..., V)`` -> ``(...)``.

    exp(logsumexp(2z) − 2·logsumexp(z)) in float32 (the optimal token baseline's Σπ², as
    verl computes it): 1/V for a uniform distribution, 1 for a one-hot one.
    """
    z = logits.float()
    return torch.exp(torch.logsumexp(2 * z, dim=-1) - 2 * torch.logsumexp(z, dim=-1))


def model_inputs(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                 response_ids: torch.Tensor, response_mask: torch.Tensor, paths_of: torch.nn.Module | None = None
                 ) -> SequenceInputs:
    """The decoder inputs of prompt + response for ``model``, in the layout its checked fast
    paths name (``FastPaths.packing``, packed only where that removes ``pack_min_share`` of the
    padded positions; the paths of ``paths_of`` when given: a critic follows its policy). The
    :data:`rlzoo.models.packing.SEGMENTS` layout sets ``model``'s attention to
    :func:`rlzoo.models.packing.segment_attention` first (once; a copy made before the check,
    the reference, gets it here)."""
    paths = fast_paths(paths_of if paths_of is not None else model)
    if paths.packing == SEGMENTS:
        use_segment_attention(model)
    return sequence_inputs(prompt_ids, prompt_mask, response_ids, response_mask, paths.packing,
                           paths.pack_min_share)


def response_forward(model: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                     response_ids: torch.Tensor, response_mask: torch.Tensor, *,
                     chunk_size: int = 1024, with_entropy: bool = False,
                     with_logits: bool = False, temperature: float = 1.0,
                     keep_max_bytes: int = KEEP_MAX_BYTES) -> SequenceOutput:
    """One forward of the policy over prompt + response; outputs at response positions.

    Runs the decoder, then the chunked head (:func:`token_logprobs`) on
    ``transform(logits) / temperature``, the transform being the model's post-head one
    (:func:`rlzoo.models.head.fast_paths`). A model whose check found a transform rlzoo does not
    know (``model_logits``) runs :func:`model_logits_forward` instead. ``with_logits`` also
    returns the full ``(B, T, V)`` tempered logits (for estimators that read ``logits``).
    The sequences are packed without padding (:mod:`rlzoo.models.packing`, :func:`model_inputs`)
    where the model's check found packing exact and it computes fewer positions.
    """
    paths = fast_paths(model)
    if paths.model_logits:
        return model_logits_forward(model, prompt_ids, prompt_mask, response_ids, response_mask,
                                    with_entropy=with_entropy, with_logits=with_logits, temperature=temperature)
    inputs = model_inputs(model, prompt_ids, prompt_mask, response_ids, response_mask)
    hidden = inputs.responses(model.get_decoder()(**inputs.kwargs()).last_hidden_state)
    head = model.get_output_embeddings()
    logp, entropy = token_logprobs(hidden, head, response_ids, response_mask, chunk_size, with_entropy,
                                   keep_max_bytes=keep_max_bytes, temperature=temperature,
                                   transform=paths.transform)
    logits = None
    if with_logits:
        logits = head_logits(hidden, head.weight, head.bias, paths.transform) / temperature
    return SequenceOutput(logp=logp, entropy=entropy, logits=logits)


def model_logits_forward(model: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                         response_ids: torch.Tensor, response_mask: torch.Tensor, *, with_entropy: bool = False,
                         with_logits: bool = False, temperature: float = 1.0) -> SequenceOutput:
    """:func:`response_forward` through the model's own ``forward(...).logits``: whatever
    the model does after its head is included, at the cost of the full ``(B, P + T, V)``
    logits and autograd's backward through them. Same outputs (0 where the mask is 0)."""
    inputs = model_inputs(model, prompt_ids, prompt_mask, response_ids, response_mask)
    logits = inputs.responses(model(**inputs.kwargs()).logits).float() / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    valid = response_mask > 0
    zero = log_probs.new_zeros(())
    logp = torch.where(valid, log_probs.gather(-1, response_ids[..., None]).squeeze(-1), zero)
    entropy = None
    if with_entropy:
        entropy = torch.where(valid, -(log_probs.exp() * log_probs).sum(-1), zero)
    return SequenceOutput(logp=logp, entropy=entropy, logits=logits if with_logits else None)


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
                with_logits: bool = False, temperature: float = 1.0, keep_max_bytes: int = KEEP_MAX_BYTES
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        out = response_forward(self.model, prompt_ids, prompt_mask, response_ids, response_mask,
                               chunk_size=chunk_size, with_entropy=with_entropy, with_logits=with_logits,
                               temperature=temperature, keep_max_bytes=keep_max_bytes)
        return out.logp, out.entropy, out.logits
