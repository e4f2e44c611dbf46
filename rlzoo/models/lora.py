"""LoRA adapters through ``peft``: the policy of a run with ``model.lora.rank`` > 0.

The policy becomes a ``peft`` model: rank-r adapters ``B·A`` (scaled by alpha / r) on the
target linear layers, the base weights frozen. Only the adapters go to the optimizer.
The KL reference is the same model inside peft's ``disable_adapter()`` (the frozen base
weights: no second copy, :class:`AdaptersOff`). The run's ``init_model/`` keeps the base
weights as a plain model directory (:class:`SavedBase`), each checkpoint's ``policy/`` only
the adapters (``adapter_model.safetensors`` + ``adapter_config.json``, peft's format); a
resume loads the base from ``init_model/`` and the adapters over it
(:func:`load_adapters`); ``rlzoo export`` merges them into one model directory
(:func:`merged_policy`).

``peft`` is an optional dependency (``pip install 'rlzoo[lora]'``): it is imported only when
adapters are built, and :func:`rlzoo.plan.planner.build_plan` refuses ``model.lora.rank`` > 0
without it, before anything is built.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from rlzoo.core.errors import ConfigError
from rlzoo.models.logprobs import ResponseForward
from rlzoo.plan.consistency import LORA_INSTALL
from rlzoo.plan.records import LoraPlan

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
"""The files of peft's adapter format that a LoRA checkpoint's ``policy/`` holds."""
ADAPTER_MARK = "lora_"
"""Every adapter parameter's name holds it (``...q_proj.lora_A.default.weight``)."""


def _peft() -> Any:
    """The ``peft`` module (imported on first use: runs without LoRA never import it).

    :raises ConfigError: peft is not installed.
    """
    try:
        return importlib.import_module("peft")
    except ImportError as exc:
        raise ConfigError(f"LoRA needs the peft package: {LORA_INSTALL}") from exc


@contextlib.contextmanager
def _quiet_peft() -> Iterator[None]:
    """Without the FutureWarning peft's wrapping triggers in transformers 5 (it asks the
    deprecated ``is_gradient_checkpointing``): nothing a user can act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def linear_names(model: torch.nn.Module) -> list[str]:
    """The distinct last names of ``model``'s linear layers (what ``target_modules`` can name)."""
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, torch.nn.Linear)})


def add_adapters(model: torch.nn.Module, lora: LoraPlan) -> Any:
    """Wrap a causal LM with LoRA adapters (peft's ``get_peft_model``; ``model``'s modules are
    adapted in place): only the adapters require gradients.

    The adapters start as peft initialises them (A Kaiming-uniform from torch's global RNG,
    B zero), so the adapted policy equals the base one at step 0.

    :raises ConfigError: a target name matches no module of the model (its linear layers
        listed), a rank above the width of every adapted layer (min of its inputs and
        outputs: the most an update ``B·A`` can use), or an adapter would sit on the input
        or output embedding (the log-prob head reads the output embedding's weight
        directly, and with tied embeddings a merged adapter would change both).
    """
    peft = _peft()
    available = linear_names(model)
    config = peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                             target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM")
    try:
        with _quiet_peft():
            wrapped = peft.get_peft_model(model, config)
    except ValueError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"model.lora.target_modules={list(lora.target_modules)} cannot be adapted ({first}); "
                          f"this model's linear layers are named {', '.join(available)}") from exc
    adapted = [name for name, module in wrapped.named_modules() if isinstance(module, peft.tuners.lora.LoraLayer)]
    unmatched = [target for target in lora.target_modules
                 if not any(name == target or name.endswith("." + target) for name in adapted)]
    if unmatched:
        raise ConfigError(f"model.lora.target_modules names {', '.join(unmatched)}, which match(es) no layer of this "
                          f"model; its linear layers are named {', '.join(available)}")
    widths = {name.rsplit(".", 1)[-1]: min(module.in_features, module.out_features)
              for name, module in wrapped.named_modules() if isinstance(module, peft.tuners.lora.LoraLayer)
              and isinstance(getattr(module, "base_layer", None), torch.nn.Linear)}
    if widths and lora.rank > max(widths.values()):
        shown = ", ".join(f"{name} {width}" for name, width in sorted(widths.items()))
        raise ConfigError(f"model.lora.rank={lora.rank} exceeds the width of every adapted layer (the smaller of its "
                          f"inputs and outputs: {shown}), which bounds the rank of its update B·A: use "
                          f"model.lora.rank <= {max(widths.values())}")
    embeddings = {"output": wrapped.get_output_embeddings(), "input": wrapped.get_input_embeddings()}
    for which, module in embeddings.items():
        if isinstance(module, peft.tuners.lora.LoraLayer):
            raise ConfigError(f"model.lora.target_modules adapts the {which} embedding; rlzoo adapts only the "
                              "decoder's linear layers (the log-prob head reads the output embedding's weight, and "
                              "tied embeddings share it): remove that name from model.lora.target_modules")
    return wrapped


def adapter_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``name -> parameter`` of the adapters of a peft model (what the optimizer trains)."""
    return {name: param for name, param in model.named_parameters() if ADAPTER_MARK in name}


def load_adapters(model: Any, path: Path) -> None:
    """Load the adapter weights a checkpoint's ``policy/`` holds into ``model`` (a peft
    model with the same adapters), exactly as saved.

    :raises ConfigError: the files are missing or unreadable, or hold other adapters
        (another rank, other target modules) than ``model`` has.
    """
    peft = _peft()
    weights = Path(path) / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise ConfigError(f"{path} holds no LoRA adapters ({ADAPTER_WEIGHTS} is missing), but this run trains "
                          "them (model.lora.rank > 0): was the checkpoint written by another run?")
    try:
        state = load_file(str(weights))
    except (OSError, SafetensorError) as exc:
        raise ConfigError(f"cannot read {weights}: {exc}") from exc
    try:
        result = peft.set_peft_model_state_dict(model, state)
    except RuntimeError as exc:  # a shape mismatch
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(f"the adapters in {path} do not fit this run's (model.lora): {first}") from exc
    missing = [key for key in result.missing_keys if ADAPTER_MARK in key]
    if result.unexpected_keys or missing:
        raise ConfigError(f"the adapters in {path} do not fit this run's (model.lora): "
                          f"{len(result.unexpected_keys)} unexpected, {len(missing)} missing "
                          f"(e.g. {(list(result.unexpected_keys) + missing)[0]})")


def base_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The base weights of a peft model under the plain model's names (adapters left out,
    peft's ``.base_layer`` step removed): what a model directory of the base holds."""
    plain = {}
    for key, tensor in model.get_base_model().state_dict().items():
        if ADAPTER_MARK in key:
            continue
        plain[key.replace(".base_layer.", ".")] = tensor
    return plain


class SavedBase:
    """The base model of a peft model as an object with ``save_pretrained`` (the run's
    ``init_model/``: a plain model directory that ``model.path`` loads)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def save_pretrained(self, path: str) -> None:
        self.model.get_base_model().save_pretrained(path, state_dict=base_state_dict(self.model))


class AdaptersOff(torch.nn.Module):
    """The reference of a LoRA run: ``forward`` runs the policy's :class:`ResponseForward`
    with its adapters disabled (peft's ``disable_adapter()``): the frozen base weights,
    the initial policy exactly, with no second copy of the model.

    :param forward: a :class:`ResponseForward` of the peft-wrapped policy (not the
        data-parallel wrapper: the reference pass computes no gradient).
    """

    def __init__(self, forward: ResponseForward) -> None:
        super().__init__()
        self.inner = forward

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.inner.model.disable_adapter():
            return self.inner(*args, **kwargs)


def merged_policy(base: torch.nn.Module, adapter_dir: Path) -> torch.nn.Module:
    """``base`` with the adapters saved in ``adapter_dir`` merged into its weights
    (``W + (alpha / r)·B·A``; peft's ``merge_and_unload``): a plain transformers model.

    :raises ConfigError: ``adapter_dir`` holds no adapters that fit ``base``.
    """
    peft = _peft()
    try:
        with _quiet_peft():
            adapted = peft.PeftModel.from_pretrained(base, str(adapter_dir))
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"cannot load the LoRA adapters of {adapter_dir}: {first}") from exc
    return adapted.merge_and_unload()
