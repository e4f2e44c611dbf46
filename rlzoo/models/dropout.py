"""Dropout off: a model computes the same log-probs in training mode as in eval mode.

The update runs the policy in training mode (``model.train()``: gradient checkpointing and
some layers need it), while the rollout, the old-log-prob pass π_old and the reference run
in eval mode. A model whose config has dropout > 0 (GPT-2 and OPT ship 0.1) would then
train on log-probs of a randomly thinned network: the first mini-batch's importance ratio
is not 1 and the KL compares a noisy policy with a clean reference. rlzoo therefore sets
every dropout probability of the models it trains to 0 when it builds them
(:func:`disable_dropout`, as TRL's ``disable_dropout``), and the load-time check
(:mod:`rlzoo.models.model_check`) measures the training path in training mode, so a random layer
this misses is refused rather than trained on.

The one exception is LoRA's own ``model.lora.dropout`` (peft's ``lora_dropout`` layers),
an explicit choice: it is kept, the plan warns what it does, and the check switches it off
while it measures (:func:`adapter_dropout_off`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TypeVar

import torch

ADAPTER_DROPOUT = "lora_dropout"
"""The name peft gives the dropout on LoRA adapters' input (``...q_proj.lora_dropout.default``):
``model.lora.dropout``, left as the user set it."""

RANDOM_ATTRIBUTE_MARKS = ("drop", "jitter")
"""A float attribute of a module whose name holds one of these is a probability or noise
scale that transformers' layers apply only in training mode (``attention_dropout``,
``dropout_p``, ``layerdrop``, ``drop_prob``, ``jitter_noise``, ...)."""


def _is_adapter(name: str) -> bool:
    return ADAPTER_DROPOUT in name.split(".")


ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)


def _random_rates(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module, str, float]]:
    """``(module name, module, attribute, value)`` of every rate > 0 :func:`disable_dropout`
    zeroes (LoRA adapters' dropout left out)."""
    for name, module in model.named_modules():
        if _is_adapter(name):
            continue
        for key, value in list(vars(module).items()):
            if isinstance(value, float) and value > 0 and (
                    is_random_rate(key) or (key == "p" and isinstance(module, torch.nn.modules.dropout._DropoutNd))):
                yield name, module, key, value


def disable_dropout(model: ModuleT) -> ModuleT:
    """Set every dropout probability of ``model`` to 0, in place; returns ``model``.

    Zeroed: the ``p`` of every ``torch.nn.Dropout``-family layer, and every float attribute
    > 0 of a module named like a rate (:func:`is_random_rate`: what transformers' attention
    passes as ``dropout=`` in training mode, a functional dropout's ``p``, layer drop,
    router jitter). LoRA adapters' dropout (:data:`ADAPTER_DROPOUT`) is left alone. The
    model's config is not changed, so what a run saves keeps the model's own settings.
    """
    for _, module, key, _ in list(_random_rates(model)):
        setattr(module, key, 0.0)
    return model


def active_rates(model: torch.nn.Module) -> list[str]:
    """``module.attribute=value`` of every rate :func:`disable_dropout` would zero."""
    return [f"{name or type(module).__name__}.{key}={value:g}" for name, module, key, value in _random_rates(model)]


def is_random_rate(name: str) -> bool:
    """Whether an attribute or config field called ``name`` is named like a training-mode
    probability or noise scale (:data:`RANDOM_ATTRIBUTE_MARKS`)."""
    return any(mark in name.lower() for mark in RANDOM_ATTRIBUTE_MARKS)


@contextlib.contextmanager
def adapter_dropout_off(model: torch.nn.Module) -> Iterator[None]:
    """Within: LoRA adapters' dropout (:data:`ADAPTER_DROPOUT`) at 0; restored after."""
    saved = [(module, module.p) for name, module in model.named_modules()
             if _is_adapter(name) and isinstance(module, torch.nn.modules.dropout._DropoutNd)]
    try:
        for module, _ in saved:
            module.p = 0.0
        yield
    finally:
        for module, p in saved:
            module.p = p
