"""Policy, reference and critic models; the embedded tiny model and its tokenizer.

The embedded default is a tiny causal transformer built from a ``transformers`` config
(Qwen2 or Llama architecture) and a character-level tokenizer built with the
``tokenizers`` library. Both are written with ``save_pretrained`` and read back through
:func:`load_pretrained`, the same path that loads any local Hugging Face model directory
(``model.path=/path/to/model``). Nothing is ever downloaded.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from rlzoo.core import distributed
from rlzoo.core.dtypes import DTYPES
from rlzoo.models import lora
from rlzoo.models.dropout import disable_dropout
from rlzoo.core.errors import ConfigError, say
from rlzoo.models.head import fast_paths, set_fast_paths
from rlzoo.models.logprobs import ResponseForward
from rlzoo.models.model_check import CheckResult, check_model
from rlzoo.models.model_files import (GGUF_SUFFIX, check_model_dir, gguf_tokenizer, load_tokenizer,
                                      unreadable_model)
from rlzoo.plan.records import RunPlan
from rlzoo.plan.settings import ModelPlan, TinyModel

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"


def build_char_tokenizer(alphabet: str) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per character of ``alphabet`` plus
    ``<pad>`` (id 0), ``<s>`` (1), ``</s>`` (2) and ``<unk>`` (3)."""
    chars = sorted(set(alphabet))
    vocab = {PAD: 0, BOS: 1, EOS: 2, UNK: 3}
    for ch in chars:
        vocab[ch] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK,
        padding_side="left", clean_up_tokenization_spaces=False,
    )


def build_tiny_model(shape: TinyModel, tokenizer: PreTrainedTokenizerBase,
                     max_positions: int = 512) -> PreTrainedModel:
    """A randomly initialised causal LM of ``shape`` (``model.arch``, ``model.*``) with a
    table of ``max_positions`` positions."""
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    if shape.hidden_size % shape.num_heads or shape.num_heads % shape.num_kv_heads:
        raise ConfigError(
            f"model.hidden_size ({shape.hidden_size}) must be divisible by model.num_heads "
            f"({shape.num_heads}), and num_heads by model.num_kv_heads ({shape.num_kv_heads})"
        )
    if shape.arch == "qwen2":
        model: PreTrainedModel = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    return model


def load_pretrained(path: str | Path, dtype: str = "float32") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a local directory or ``.gguf`` file (never
    a hub id); a GGUF file goes through :func:`load_gguf`.

    :raises ConfigError: no ``config.json``, or a file of the directory cannot be read as
        a model or tokenizer (the directory and the first line of the reason named).
    """
    path = Path(path)
    if path.suffix.lower() == GGUF_SUFFIX:
        return load_gguf(path, dtype)
    check_model_dir(path)
    with unreadable_model(path):
        tokenizer = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype])
    check_tokenizer_fits(model, tokenizer, f"model.path {str(path)!r}")
    return align_storage(model), tokenizer


def check_tokenizer_fits(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, what: str) -> None:
    """Refuse a tokenizer that is not ``model``'s; warn of added tokens without an embedding row.

    An embedding with more rows than the tokenizer has tokens (padded to a multiple, as most
    released models are) is normal. A tokenizer whose base vocabulary, or whose pad, EOS or BOS
    id, reaches past the embedding is not the model's (its ids index past the embedding or
    mean other tokens). Added tokens past it (transformers' GGUF reader adds
    ``<|endoftext|>`` to a vocabulary without it) cannot be sampled, only fail where a text
    holds one: a warning names them.

    :param what: names the model in the message, e.g. ``model.path '/m'``.
    :raises ConfigError: the tokenizer is not the model's (both sizes named).
    """
    rows = getattr(model.get_input_embeddings(), "num_embeddings", None)
    if rows is None or len(tokenizer) <= rows:
        return
    used = {name: getattr(tokenizer, f"{name}_token_id") for name in ("pad", "eos", "bos")}
    past = {name: id_ for name, id_ in used.items() if id_ is not None and id_ >= rows}
    if tokenizer.vocab_size > rows or past:
        why = (f"its {', '.join(f'{name} id {id_}' for name, id_ in past.items())} and " if past else "")
        raise ConfigError(f"{what} does not fit its tokenizer: the tokenizer has {len(tokenizer)} tokens, the "
                          f"model's input embedding {rows} rows ({why}ids {rows}..{len(tokenizer) - 1} have no "
                          "embedding): save the tokenizer the model was trained with beside it, or resize the "
                          "model's embeddings (model.resize_token_embeddings(len(tokenizer))) and save both")
    extra = [tokenizer.convert_ids_to_tokens(i) for i in range(rows, len(tokenizer))]
    say(f"rlzoo: warning: {what}: the tokenizer's added token(s) {', '.join(map(repr, extra[:5]))}"
        f"{' ...' if len(extra) > 5 else ''} (ids {rows}..{len(tokenizer) - 1}) have no row in the model's "
        f"{rows}-row input embedding: the model cannot sample them, and a text holding one fails")


CPU_ALIGNMENT = 64
"""Bytes: torch's CPU allocator aligns every allocation to this."""


def align_storage(model: torch.nn.Module) -> torch.nn.Module:
    """Give each CPU parameter and buffer of ``model`` that does not start on a
    :data:`CPU_ALIGNMENT` boundary a copy of its own that does (returns ``model``).

    ``from_pretrained`` leaves the weights where they lie in the safetensors file (offsets
    after its header, e.g. 56 mod 64), while a model built or trained in memory has aligned
    ones; some CPU kernels round differently on the two (a DAPO run resumed from a
    checkpoint drifted by up to 1e-6 from the uninterrupted run). Aligned, a loaded model
    computes exactly what the saved one did. Tied weights stay tied (one parameter)."""
    with torch.no_grad():
        for param in model.parameters():
            if param.device.type == "cpu" and param.data_ptr() % CPU_ALIGNMENT:
                param.data = param.data.clone(memory_format=torch.contiguous_format)
        for module in model.modules():
            for name, buffer in module._buffers.items():
                if buffer is not None and buffer.device.type == "cpu" and buffer.data_ptr() % CPU_ALIGNMENT:
                    module._buffers[name] = buffer.clone(memory_format=torch.contiguous_format)
    return model


def load_gguf(path: Path, dtype: str = "float32") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM and its tokenizer from a GGUF file, through transformers' ``gguf_file=``
    (the weights dequantised to ``dtype``).

    transformers marks such a model as quantised with ``gguf`` and refuses to
    ``save_pretrained`` it; the weights are plain dequantised tensors by then, so the
    quantizer and the config's ``quantization_config`` are dropped: the run's
    ``init_model/`` and checkpoints are ordinary model directories, loaded without
    converting again.

    :raises ConfigError: see :func:`check_gguf_path`; a file transformers cannot read.
    """
    tokenizer = gguf_tokenizer(path)
    with unreadable_model(path):
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=DTYPES[dtype])
    check_tokenizer_fits(model, tokenizer, f"model.path {str(path)!r}")
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tokenizer


def load_teacher(path: str | Path, dtype: str, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """The frozen teacher of on-policy distillation, from a local model directory.

    :raises ConfigError: the directory is not a model, or its tokenizer maps text to other
        ids than the policy's (the teacher would score other tokens than were sampled).
    """
    teacher, teacher_tokenizer = load_pretrained(path, dtype)
    ours, theirs = tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    if ours != theirs:
        differ = sorted(set(ours.items()) ^ set(theirs.items()), key=str)[:3]
        raise ConfigError(f"teacher.path {str(path)!r} has another tokenizer than the policy ({len(theirs)} vs "
                          f"{len(ours)} tokens; e.g. {differ}): distillation compares log-probs of the same "
                          "token ids, so the teacher must share the policy's tokenizer")
    return teacher.eval().requires_grad_(False)


class ValueModel(torch.nn.Module):
    """A critic: a transformer backbone plus a linear head giving one value per token.

    :param backbone: a base model (``AutoModel``) whose last hidden state is ``(B, L, H)``.
    """

    def __init__(self, backbone: PreTrainedModel) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = torch.nn.Linear(backbone.config.hidden_size, 1)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_policy_config(cls, config: AutoConfig, state_from: PreTrainedModel | None = None) -> "ValueModel":
        """A critic with the policy's architecture, initialised from ``state_from``'s
        backbone weights when given (the usual PPO initialisation)."""
        backbone = AutoModel.from_config(config)
        if state_from is not None:  # base_model: AutoModel's class (OPT's get_decoder() is one level down)
            backbone.load_state_dict(state_from.base_model.state_dict())
        return cls(backbone)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """Values ``(B, L)`` for every position of ``input_ids`` ``(B, L)``; ``attention_mask``
        ``None`` for packed rows, ``kwargs`` to the backbone
        (:meth:`rlzoo.models.packing.SequenceInputs.kwargs`)."""
        kwargs = {"use_cache": False, **kwargs}
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                               position_ids=position_ids, **kwargs).last_hidden_state
        with torch.autocast(device_type=hidden.device.type, enabled=False):  # float32 values under bf16
            return self.value_head(hidden.float()).squeeze(-1)

    def save_pretrained(self, path: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Backbone as a Hugging Face model directory plus ``value_head.safetensors``;
        ``state_dict`` (this module's keys) replaces the live weights (e.g. gathered shards)."""
        from safetensors.torch import save_file

        path = Path(path)
        state = state_dict if state_dict is not None else self.state_dict()
        backbone = {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}
        head = {k[len("value_head."):]: v.contiguous() for k, v in state.items() if k.startswith("value_head.")}
        self.backbone.save_pretrained(str(path), state_dict=backbone)
        save_file(head, str(path / "value_head.safetensors"))

    def load_from(self, path: str | Path) -> None:
        """Load weights saved by :meth:`save_pretrained`.

        :raises ConfigError: ``path`` is missing or does not hold a critic of this shape.
        """
        from safetensors.torch import load_file

        path = Path(path)
        if not (path / "config.json").is_file():
            raise ConfigError(f"{str(path)!r} holds no critic, but this run has one: was the checkpoint "
                              "written by a run of another algorithm?")
        with unreadable_model(path):
            loaded = AutoModel.from_pretrained(str(path), dtype=next(self.backbone.parameters()).dtype)
            self.backbone.load_state_dict(loaded.state_dict())
            self.value_head.load_state_dict(load_file(str(path / "value_head.safetensors")))


class _WithStateDict:
    """A model's ``save_pretrained`` with given (gathered) weights."""

    def __init__(self, model: Any, state_dict: dict[str, torch.Tensor]) -> None:
        self.model, self.state_dict = model, state_dict

    def save_pretrained(self, path: str) -> None:
        self.model.save_pretrained(path, state_dict=self.state_dict)


@dataclass
class RunModels:
    """The models of a run, as the plan asks for them.

    :ivar policy: the trained causal LM (unwrapped).
    :ivar tokenizer: its tokenizer.
    :ivar policy_forward: :class:`rlzoo.models.logprobs.ResponseForward` of the policy, wrapped by
        DDP / FSDP under torchrun: what the update calls.
    :ivar reference: the frozen initial policy, or ``None``.
    :ivar reference_forward: its :class:`ResponseForward`, or ``None``.
    :ivar critic: the :class:`ValueModel`, or ``None``.
    :ivar critic_forward: the critic as the update calls it (wrapped under torchrun).
    :ivar teacher_forward: :class:`ResponseForward` of the frozen teacher (``teacher.path``),
        or ``None``.
    :ivar initial: what the run's ``init_model/`` keeps, when not the policy itself (a LoRA
        run: the base weights without adapters, :class:`rlzoo.models.lora.SavedBase`).
    :ivar checks: ``name -> CheckResult`` of the load-time check of each causal LM's fast
        paths (:mod:`rlzoo.models.model_check`): ``policy`` (which the reference shares), ``teacher``.
    """

    policy: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    policy_forward: torch.nn.Module
    reference: PreTrainedModel | None = None
    reference_forward: torch.nn.Module | None = None
    critic: ValueModel | None = None
    critic_forward: torch.nn.Module | None = None
    teacher_forward: torch.nn.Module | None = None
    initial: Any = None
    checks: dict[str, CheckResult] = field(default_factory=dict)

    def generation_context(self) -> Any:
        """A context within which the policy's weights are whole (FSDP; otherwise a no-op)."""
        return distributed.gathered(self.policy_forward)

    def policy_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of the policy's state (gathered whole under FSDP)."""
        if distributed.is_sharded(self.policy_forward):
            return iter(distributed.full_state_dict(self.policy_forward, "model.").items())
        return iter(self.policy.state_dict().items())

    def saveable_policy(self) -> Any:
        """The policy as an object with ``save_pretrained`` (a collective under FSDP)."""
        return _saveable(self.policy, self.policy_forward, "model.")

    def saveable_initial(self) -> Any:
        """What ``init_model/`` keeps (an object with ``save_pretrained``): the initial
        policy, or under LoRA its base weights (checkpoints keep the adapters)."""
        return self.initial if self.initial is not None else self.saveable_policy()

    def trainable(self) -> list[torch.nn.Parameter]:
        """The policy's parameters the optimizer updates: all of them, or under LoRA the
        adapters only (the frozen base requires no gradient)."""
        return [param for param in self.policy.parameters() if param.requires_grad]

    def saveable(self) -> dict[str, Any]:
        """``name -> object with save_pretrained`` for a checkpoint (a collective when the
        models are sharded: their whole weights are gathered on every rank)."""
        models: dict[str, Any] = {"policy": self.saveable_policy(), "policy:tokenizer": self.tokenizer}
        if self.critic is not None:
            models["critic"] = _saveable(self.critic, self.critic_forward, "")
        return models


def _saveable(model: Any, wrapper: torch.nn.Module, prefix: str) -> Any:
    if not distributed.is_sharded(wrapper):
        return model
    return _WithStateDict(model, distributed.full_state_dict(wrapper, prefix))


def build_tokenizer(model: ModelPlan, task: Any, task_name: str) -> PreTrainedTokenizerBase:
    """The policy's tokenizer alone, without its weights (what :func:`build_policy` returns
    beside them): ``model.path``'s, or the embedded model's character tokenizer over the
    alphabet of the task ``task_name``.

    :raises ConfigError: an unreadable ``model.path``, or a task that needs a real tokenizer.
    """
    if model.path:
        path = Path(model.path)
        if path.suffix.lower() == GGUF_SUFFIX:
            return gguf_tokenizer(path)
        check_model_dir(path)
        with unreadable_model(path):
            return load_tokenizer(path)
    if task.alphabet is None:
        raise ConfigError(f"task {task_name!r} needs a real tokenizer: set model.path to a local "
                          "model directory")
    return build_char_tokenizer(task.alphabet)


def build_policy(model: ModelPlan, task: Any, task_name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The initial policy and its tokenizer: ``model.path`` loaded, or the embedded tiny
    model (``model.*``) with a character tokenizer over the alphabet of the task ``task_name``.

    :raises ConfigError: an unreadable ``model.path``, or a task that needs a real tokenizer.
    """
    if model.path:
        return load_pretrained(model.path, model.dtype)
    tokenizer = build_tokenizer(model, task, task_name)
    policy = build_tiny_model(model.tiny, tokenizer, model.tiny.max_positions)
    return policy.to(DTYPES[model.dtype]), tokenizer


def build_run_models(plan: RunPlan, task: Any, task_name: str, device: torch.device, dist: distributed.DistInfo,
                     resume_from: Path | None, init_model_dir: Path) -> RunModels:
    """Build (or, resuming, load) the models ``plan.models`` names, on ``device``, wrapped
    for the data-parallel strategy under torchrun.

    :param task: supplies the embedded tokenizer's alphabet when ``model.path`` is unset
        (``task_name``: its name, for the error when it has none).
    :param resume_from: a checkpoint directory to load the policy and critic from.
    :param init_model_dir: the run's ``init_model/``: the reference when resuming (and
        under LoRA the base the checkpoint's adapters are loaded onto).
    :raises ConfigError: no usable model (e.g. a task that needs ``model.path``).
    """
    dtype = plan.model.dtype
    if resume_from is not None and plan.lora is None:
        policy, tokenizer = load_pretrained(resume_from / "policy", dtype)
    elif resume_from is not None:
        policy, tokenizer = load_pretrained(init_model_dir, dtype)  # the frozen base
    else:
        policy, tokenizer = build_policy(plan.model, task, task_name)
    disable_dropout(policy)  # the update runs in training mode: its log-probs must be eval mode's
    reference = None
    if "reference" in plan.models and plan.lora is None:
        if resume_from is not None:
            reference = disable_dropout(load_pretrained(init_model_dir, dtype)[0])
        else:
            reference = copy.deepcopy(policy)
        reference = reference.eval().requires_grad_(False)
    teacher, checks = None, {}
    if "teacher" in plan.models:
        teacher = load_teacher(plan.model.teacher, dtype, tokenizer).to(device)
        checks["teacher"] = check_model(teacher, device, trained=False,  # frozen: eval mode only
                                        padding_free=plan.compute.padding_free)
    critic = None
    if "critic" in plan.models:
        critic = disable_dropout(ValueModel.from_policy_config(policy.config, policy).to(device))
        if resume_from is not None:
            critic.load_from(resume_from / "critic")  # before any sharding
    initial = None
    if plan.lora is not None:  # after the critic: it starts from the plain base weights
        policy = lora.add_adapters(policy, plan.lora)
        if resume_from is not None:
            lora.load_adapters(policy, resume_from / "policy")
        initial = lora.SavedBase(policy)
    policy.to(device)
    checks["policy"] = check_model(policy, device, padding_free=plan.compute.padding_free)
    if reference is not None:
        reference.to(device)
        set_fast_paths(reference, fast_paths(policy))
    if plan.model.gradient_checkpointing:
        enable = getattr(policy, "activation_checkpointing_enable", None) or policy.gradient_checkpointing_enable
        enable()  # transformers 5.2x renamed it (the old name warns that it goes in v6)
        if plan.lora is not None:  # frozen embeddings: reentrant checkpointing (transformers 4's
            policy.enable_input_require_grads()  # default) needs a block input that requires grad
    reference_forward = ResponseForward(reference) if reference is not None else None
    if plan.lora is not None and "reference" in plan.models:
        reference_forward = lora.AdaptersOff(ResponseForward(policy))
    models = RunModels(policy=policy, tokenizer=tokenizer, policy_forward=ResponseForward(policy),
                       reference=reference, reference_forward=reference_forward,
                       critic=critic, critic_forward=critic,
                       teacher_forward=ResponseForward(teacher) if teacher is not None else None, initial=initial,
                       checks=checks)
    if dist.enabled:
        token = torch.zeros((1, 1), dtype=torch.long, device=device)  # one token of prompt and of response
        example = (token, torch.ones_like(token), token, torch.ones_like(token))
        models.policy_forward = distributed.wrap(models.policy_forward, plan.compute.strategy, device, example)
        if critic is not None:
            models.critic_forward = distributed.wrap(critic, plan.compute.strategy, device)
    return models
