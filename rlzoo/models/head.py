"""What a causal LM does to its logits after the output projection, and which of rlzoo's
fast paths a model runs.

rlzoo's training forward computes the log-probs from the decoder's hidden states and the
output embedding itself (:mod:`rlzoo.models.logprobs`), so it must apply whatever the model's own
``forward`` applies after the head. The transforms transformers' models apply are
recognised from the model's config (:func:`known_transform`), as each model's
``...ForCausalLM.forward`` in transformers applies them:

- ``final_logit_softcapping`` (Gemma-2, Gemma-3, ...): ``cap · tanh(logits / cap)``;
- ``logit_scale`` (Cohere, Cohere-2): ``logits · scale`` (MPT's config has the key, but
  ``MptForCausalLM`` never reads it);
- ``logits_scaling``: ``logits / scaling`` in the Granite family, ``logits · scaling`` in
  HyperCLOVAX (MuP);
- ``lm_head_multiplier`` (Falcon-H1): ``logits · multiplier``;
- ``output_multiplier`` (before a softcap): ``logits · multiplier``.

A model that transforms its logits in another way (a subclass overriding ``forward``) is
caught by the load-time probe of :mod:`rlzoo.models.model_check`, which then records
:class:`FastPaths` with ``model_logits=True`` on the model: the training forward then
reads the model's own logits (slower, correct). The decision travels with the model object
(a deep copy, e.g. the reference, keeps it); an unchecked model uses
:func:`default_paths`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from rlzoo.models.packing import PADDED

CACHE_MODES = ("preallocated", "dynamic", "none")
"""How the rollout's decode loop keeps keys and values (:func:`rlzoo.models.decode.generate`),
fastest first: ``preallocated`` (each prompt prefilled once per group and its cache
repeated; plain layers written in place into buffers allocated once), ``dynamic`` (the
model's own cache as it comes, each prompt prefilled once per completion), ``none`` (no
cache: every step re-runs the whole sequence; for a model whose cache the loop cannot use)."""

PATHS_ATTRIBUTE = "rlzoo_fast_paths"
"""The attribute of a model that holds its checked :class:`FastPaths`."""


@dataclass(frozen=True)
class LogitTransform:
    """``logits ↦ cap · tanh(scale · logits / cap)``, or ``scale · logits`` without a cap.

    :ivar scale: multiplies the head's logits first (the product of the config's factors,
        :data:`LOGIT_FACTORS`).
    :ivar softcap: the tanh cap (``final_logit_softcapping``), or ``None``.
    """

    scale: float = 1.0
    softcap: float | None = None

    def apply_(self, logits: torch.Tensor) -> torch.Tensor:
        """Transform float32 ``logits`` ``(..., V)`` in place; returns them."""
        if self.scale != 1.0:
            logits.mul_(self.scale)
        if self.softcap is not None:
            logits.div_(self.softcap).tanh_().mul_(self.softcap)
        return logits

    def backward_(self, grad: torch.Tensor, raw_logits: torch.Tensor | None) -> torch.Tensor:
        """Chain ``grad`` ``(..., V)`` (with respect to the transformed logits) back to the
        head's raw logits, in place: ``· scale`` and, with a cap, ``· (1 − tanh²(scale ·
        raw / cap))``. ``raw_logits`` (float32, consumed) is needed only with a cap."""
        if self.softcap is not None:
            if raw_logits is None:
                raise ValueError("the softcap's derivative needs the raw logits")
            tanh = raw_logits.mul_(self.scale / self.softcap).tanh_()
            grad.mul_(tanh.square_().neg_().add_(1.0))
        if self.scale != 1.0:
            grad.mul_(self.scale)
        return grad

    def describe(self) -> str:
        parts = [] if self.scale == 1.0 else [f"logits x {self.scale:g}"]
        if self.softcap is not None:
            parts.append(f"softcap {self.softcap:g}·tanh(·/{self.softcap:g})")
        return ", then ".join(parts) or "none"


@dataclass(frozen=True)
class FastPaths:
    """Which of rlzoo's fast paths a model runs, as decided by the load-time check.

    :ivar transform: the post-head transform the chunked head applies (``None``: none).
    :ivar model_logits: the training forward reads the model's own ``forward(...).logits``
        instead of the chunked head (a transform rlzoo does not know).
    :ivar cache: the decode loop's cache mode, one of :data:`CACHE_MODES`.
    :ivar packing: how the training-side passes lay out a micro-batch's sequences
        (:mod:`rlzoo.models.packing`): ``padded``, or packed without padding (``segments``:
        one row; ``rows``: a few balanced rows) where the check found that exact on this
        model. ``padded`` on a model that was not checked.
    :ivar pack_min_share: a micro-batch is packed only when that removes at least this share
        of its padded positions (:func:`rlzoo.models.packing.pack_min_share`: packing's own
        cost against the model's per-token cost).
    :ivar reason: why a fast path was left, in words (empty when none was).
    """

    transform: LogitTransform | None = None
    model_logits: bool = False
    cache: str = "preallocated"
    packing: str = PADDED
    pack_min_share: float = 0.0
    reason: str = ""

    def with_fallback(self, reason: str, **changes: Any) -> "FastPaths":
        """A copy with ``changes`` applied and ``reason`` appended."""
        return replace(self, reason="; ".join(r for r in (self.reason, reason) if r), **changes)


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a real number other than 0, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value == 0:
        return None
    return float(value)


LOGIT_FACTORS: dict[str, int] = {"logit_scale": 1, "logits_scaling": -1, "lm_head_multiplier": 1,
                                  "output_multiplier": 1}
"""Config keys of a factor on the head's logits -> its power in the transform: ``1`` the
logits are multiplied by it, ``-1`` divided (as the models that have the key apply it)."""

LOGIT_FACTOR_EXCEPTIONS: dict[str, dict[str, int]] = {
    "hyperclovax": {"logits_scaling": 1},   # HyperCLOVAXForCausalLM multiplies (Granite divides)
    "mpt": {"logit_scale": 0},              # in MptConfig, never read by MptForCausalLM
}
"""``model_type`` -> keys of :data:`LOGIT_FACTORS` whose power differs there (``0``: unused)."""


def known_transform(config: Any) -> LogitTransform | None:
    """The post-head transform named by a model config (its text config for a multimodal
    one), or ``None`` when it names none (e.g. Llama, Qwen2)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    powers = {**LOGIT_FACTORS, **LOGIT_FACTOR_EXCEPTIONS.get(getattr(text, "model_type", ""), {})}
    scale = 1.0
    for key, power in powers.items():
        if power and (factor := _number(getattr(text, key, None))) is not None:
            scale *= factor ** power
    softcap = _number(getattr(text, "final_logit_softcapping", None))
    if scale == 1.0 and softcap is None:
        return None
    return LogitTransform(scale=scale, softcap=softcap)


def default_paths(model: Any) -> FastPaths:
    """The fast paths of a model that was not checked: its config's known transform."""
    return FastPaths(transform=known_transform(model.config))


def fast_paths(model: Any) -> FastPaths:
    """The checked :class:`FastPaths` of ``model``, or :func:`default_paths`."""
    paths = getattr(model, PATHS_ATTRIBUTE, None)
    return paths if isinstance(paths, FastPaths) else default_paths(model)


def set_fast_paths(model: Any, paths: FastPaths) -> None:
    """Record the checked ``paths`` on ``model`` (read by :func:`fast_paths`)."""
    setattr(model, PATHS_ATTRIBUTE, paths)
