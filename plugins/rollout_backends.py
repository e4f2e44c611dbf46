"""Rollout backends (kind ``rollout``, config key ``rollout.backend``).

``hf``: rlzoo's KV-cache sampling loop (:func:`rlzoo.models.decode.generate`) over any Hugging
Face causal LM. It generates with the trained policy itself, or, with ``rollout.dtype``
different from ``model.dtype``, with a copy of the policy in that dtype that is synced
after each update: the set-up of a vLLM rollout in bf16 beside an fp32 trainer, so the
rollout/training mismatch that corrections address is real on a CPU too.

The contract every backend keeps is in :func:`rlzoo.contract.hookspecs.rlzoo_register_rollout_backends`;
docs/design.md describes how a colocated vLLM backend would implement it. The decode loop
(it imports transformers) is looked up on :mod:`rlzoo.api` when a backend generates, so
loading this plugin (``rlzoo list``, ``rlzoo config``) costs no transformers import.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, Iterable

import torch

from rlzoo import api
from rlzoo.api import DTYPES, Generation, hookimpl, left_pad, no_grad

RLZOO_API_VERSION = "2"


class HFRollout:
    """Generate with a transformers causal LM and a KV cache (each prompt prefilled once
    per group), returning the sampled tokens' log-probs.

    :param policy: the trained policy (unwrapped causal LM).
    :param tokenizer: its tokenizer (pad and EOS ids).
    :param device: where prompts go.
    :param dtype: ``rollout.dtype``; when it differs from the policy's, generation runs on
        a copy in that dtype, refreshed by :meth:`sync_weights`.
    :param generation_context: makes the policy's weights whole while generating (FSDP).
    """

    def __init__(self, policy: torch.nn.Module, tokenizer: Any, device: torch.device, dtype: str,
                 generation_context: Callable[[], Any]) -> None:
        self.tokenizer = tokenizer
        self.device = device
        target = DTYPES[dtype]
        self.copy = next(policy.parameters()).dtype != target
        if self.copy:
            self.model = copy.deepcopy(policy).to(target).eval().requires_grad_(False)
            self.context: Callable[[], Any] = contextlib.nullcontext
        else:
            self.model = policy
            self.context = generation_context

    def generate(self, prompt_ids: list[list[int]], *, num_samples: int, max_new_tokens: int,
                 temperature: float, top_p: float, greedy: bool = False) -> Generation:
        """``num_samples`` completions of each prompt, prompt-major; see
        :func:`rlzoo.contract.hookspecs.rlzoo_register_rollout_backends` for the shapes."""
        ids, mask = left_pad(prompt_ids, self.tokenizer.pad_token_id)
        self.model.eval()
        with self.context():
            out = api.generate(self.model, ids.to(self.device), mask.to(self.device), max_new_tokens=max_new_tokens,
                           eos_id=self.tokenizer.eos_token_id, pad_id=self.tokenizer.pad_token_id,
                           temperature=temperature, top_p=top_p, greedy=greedy, num_samples=num_samples)
        # inference-mode tensors cannot enter autograd later: plain copies
        return Generation(response_ids=out.response_ids.clone(), response_mask=out.response_mask.clone(),
                          truncated=out.truncated.clone(), logp=out.logp.clone())

    @no_grad
    def sync_weights(self, named_weights: Callable[[], Iterable[tuple[str, torch.Tensor]]]) -> None:
        """Copy the policy's weights into the generation copy (a no-op without one)."""
        if self.copy:
            self.model.load_state_dict(dict(named_weights()), strict=True)


@hookimpl
def rlzoo_register_rollout_backends(register) -> None:
    register("hf", HFRollout,
             description="transformers model + KV-cache sampling loop, prefill once per group; "
                         "rollout.dtype runs it on a synced copy in that dtype")
