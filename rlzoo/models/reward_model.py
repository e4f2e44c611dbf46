"""Reward models: a frozen network that reads prompt + response and returns one score.

One module holds what the scorer (the ``reward_model`` reward function) and the trainer
(``rlzoo rm``, :mod:`rlzoo.run.rm_trainer`) must agree on, so a directory ``rlzoo rm`` writes scores
exactly as it was trained:

- **the text** (:func:`reward_text`): with a chat template (``chat_template`` true, or
  null and the reward model's tokenizer has one) the conversation ``[user: prompt,
  assistant: response]`` rendered by the reward model's own template; otherwise
  ``prompt + response``. Prompts and responses may also be chat messages (lists of
  ``{"role", "content"}``). The text is always tokenised by the reward model's tokenizer:
  the policy's token ids are never reused, so a reward model with another tokenizer than
  the policy reads the same decoded text;
- **the score** (:func:`sequence_scores`): the last valid token's final hidden state
  through the one-output linear head (``score`` of a ``...ForSequenceClassification``
  decoder, or the ``value_head`` of an rlzoo critic directory), with position ids counted
  over the valid tokens, so left and right padding give the same score; an encoder
  classifier (no ``score`` head) is called as it is and its one logit taken;
- **the length**: a text of more tokens than the model's context keeps its last ones
  (:func:`fit_context`: the score is read at the end);
- **the directory**: a ``save_pretrained`` directory of an
  ``AutoModelForSequenceClassification`` with ``num_labels = 1`` plus its tokenizer
  (:func:`load_reward_model` reads it, or an rlzoo critic: backbone + ``value_head.safetensors``,
  whose tokenizer is the policy's, in the checkpoint's ``policy/`` beside it). A tokenizer
  that is missing, encodes nothing or has more tokens than the model's vocabulary is
  refused at load.

:class:`RunningMoments` is the running mean / std of the optional score normalisation:
plain floats, so a checkpoint holds it and a resume continues it exactly.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedModel, PreTrainedTokenizerBase
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

from rlzoo.core.errors import ConfigError
from rlzoo.core.dtypes import DTYPES
from rlzoo.models.build import ValueModel, check_tokenizer_fits, load_tokenizer, unreadable_model
from rlzoo.core.tokens import left_pad
from rlzoo.tasks.prompts import Text, plain_text

VALUE_HEAD_FILE = "value_head.safetensors"
"""Marks an rlzoo critic directory (:class:`rlzoo.models.build.ValueModel`): scored by its value head."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
"""A directory holds a tokenizer when it has one of these (``save_pretrained`` writes both)."""

CRITIC_TOKENIZER_DIR = "policy"
"""A checkpoint's critic (``checkpoints/step_*/critic/``) has no tokenizer of its own: it reads
the policy's, which the checkpoint keeps in this directory beside it."""

PROBE_TEXT = "Hello, world! 0123456789"
"""Encoded at load: a tokenizer that gives it no token has lost its vocabulary files."""

def _messages(value: Text, role: str) -> list[dict[str, str]]:
    return list(value) if isinstance(value, list) else [{"role": role, "content": value}]


def uses_chat_template(tokenizer: PreTrainedTokenizerBase, chat_template: bool | None) -> bool:
    """Whether the reward model's text is its chat template's rendering (``chat_template``
    true, or null and the tokenizer has a template).

    :raises ConfigError: ``chat_template`` is true but the tokenizer has no template.
    """
    has = bool(getattr(tokenizer, "chat_template", None))
    if chat_template is True and not has:
        raise ConfigError("chat_template=true but the reward model's tokenizer has no chat template")
    return has if chat_template is None else bool(chat_template)


def reward_text(tokenizer: PreTrainedTokenizerBase, prompt: Text, response: Text, templated: bool) -> str:
    """The text a reward model reads for ``prompt`` + ``response`` (see the module docstring).

    :param templated: render with the tokenizer's chat template (:func:`uses_chat_template`).
    """
    if templated:
        conversation = _messages(prompt, "user") + _messages(response, "assistant")
        return tokenizer.apply_chat_template(conversation, tokenize=False)
    return plain_text(prompt) + plain_text(response)


def encode(tokenizer: PreTrainedTokenizerBase, texts: list[str], templated: bool) -> list[list[int]]:
    """Token ids of each text (special tokens added unless the chat template wrote them).

    :raises ValueError: a text has no tokens (the reward model would have nothing to read).
    """
    ids = tokenizer(texts, add_special_tokens=not templated).input_ids
    for i, row in enumerate(ids):
        if not row:
            raise ValueError(f"text {i} ({texts[i]!r}) has no tokens under the reward model's tokenizer")
    return ids


def context_length(model: torch.nn.Module) -> int | None:
    """The most tokens ``model`` reads in one sequence (its config's
    ``max_position_embeddings``; GPT-2's ``n_positions``), ``None`` when it records none."""
    config = getattr(model, "config", None)
    if config is None and isinstance(getattr(model, "backbone", None), torch.nn.Module):  # an rlzoo critic
        config = getattr(model.backbone, "config", None)
    length = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return int(length) if length else None


def fit_context(ids: list[list[int]], max_tokens: int | None) -> tuple[list[list[int]], int]:
    """``(ids, cut)``: each row longer than ``max_tokens`` keeps its *last* ``max_tokens``
    ids, ``cut`` of them were longer. The left is cut because the score is read at the last
    token, so the end of the response (what is judged) must stay; the prompt's start goes
    first. ``rlzoo rm`` and the ``reward_model`` reward function both cut so, at
    :func:`context_length`, so a reward model scores as it was trained."""
    if max_tokens is None:
        return ids, 0
    cut = sum(len(row) > max_tokens for row in ids)
    return ([row[-max_tokens:] for row in ids] if cut else ids), cut


def cut_warning(who: str, cut: int, total: int, context: int) -> str:
    """The warning, printed once, that :func:`fit_context` cut ``cut`` of ``total`` texts."""
    return (f"{who}: {cut} of {total} texts are longer than the reward model's context ({context} tokens): each keeps "
            f"its last {context} tokens (the score is read at the end); this is said once")


def is_reward_model_dir(path: str | Path) -> str | None:
    """Why ``path`` is not a reward-model directory, or ``None`` when it looks like one
    (reads ``config.json`` and looks for the tokenizer's files, :func:`tokenizer_dir`: a
    cheap check before anything is built)."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        return (f"{str(path)!r} is not a local model directory (no config.json); rlzoo never downloads "
                "models: pass a directory written by `rlzoo rm` or save_pretrained")
    if (path / VALUE_HEAD_FILE).is_file():
        return _missing_tokenizer(path)
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        return f"cannot read {config_file}: {exc}"
    architectures = config.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in architectures):
        return (f"{str(path)!r} holds a {', '.join(architectures) or 'model without architectures'}, not a "
                "...ForSequenceClassification reward model or an rlzoo critic (value_head.safetensors)")
    labels = len(config.get("id2label") or {}) or int(config.get("num_labels", 2))
    if labels != 1:
        return f"{str(path)!r} has {labels} labels; a reward model has one (num_labels=1)"
    return _missing_tokenizer(path)


def _has_tokenizer(path: Path) -> bool:
    return any((path / name).is_file() for name in TOKENIZER_FILES)


def tokenizer_dir(path: str | Path) -> Path:
    """Where the tokenizer of the reward-model directory ``path`` is: ``path`` itself, or for
    an rlzoo critic without one the checkpoint's :data:`CRITIC_TOKENIZER_DIR` beside it (when
    neither has one: ``path``, which :func:`is_reward_model_dir` refuses)."""
    path = Path(path)
    if not _has_tokenizer(path) and (path / VALUE_HEAD_FILE).is_file():
        beside = path.parent / CRITIC_TOKENIZER_DIR
        if _has_tokenizer(beside):
            return beside
    return path


def _missing_tokenizer(path: Path) -> str | None:
    """Why ``path`` has no tokenizer to read, or ``None``."""
    if _has_tokenizer(tokenizer_dir(path)):
        return None
    files = " nor ".join(TOKENIZER_FILES)
    if (path / VALUE_HEAD_FILE).is_file():
        return (f"{str(path)!r} is an rlzoo critic without a tokenizer (neither {files}), and "
                f"{str(path.parent / CRITIC_TOKENIZER_DIR)!r}, where a checkpoint keeps the policy's, has none "
                "either: save the policy's tokenizer into the critic directory (tokenizer.save_pretrained)")
    return (f"{str(path)!r} has no tokenizer (neither {files}): save the tokenizer the reward model was "
            "trained with into it (tokenizer.save_pretrained)")


def _check_tokenizer(path: Path, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> None:
    """:raises ConfigError: ``tokenizer`` encodes :data:`PROBE_TEXT` to nothing (its
    vocabulary files are missing), or has more tokens than ``model``'s input embedding (it
    is not the model's: its ids would index past the embedding, or mean other tokens)."""
    where = tokenizer_dir(path)
    if not tokenizer(PROBE_TEXT, add_special_tokens=False).input_ids:
        present = ", ".join(sorted(p.name for p in where.iterdir() if p.is_file()))
        raise ConfigError(f"the reward model's tokenizer in {str(where)!r} encodes {PROBE_TEXT!r} to no token: its "
                          f"vocabulary is missing (the directory holds {present}); save the whole tokenizer into it "
                          "(tokenizer.save_pretrained writes tokenizer.json)")
    backbone = model.backbone if isinstance(model, ValueModel) else model
    check_tokenizer_fits(backbone, tokenizer, f"the reward model in {str(path)!r} (tokenizer in {str(where)!r})")


def load_reward_model(path: str | Path, dtype: str, device: torch.device) -> tuple[torch.nn.Module,
                                                                                    PreTrainedTokenizerBase]:
    """The frozen reward model of ``path`` and its tokenizer, on ``device``.

    :param dtype: ``auto`` (the dtype its ``config.json`` records) or a key of
        :data:`rlzoo.core.dtypes.DTYPES`.
    :raises ConfigError: not a reward-model directory (:func:`is_reward_model_dir`), unreadable,
        or a tokenizer that does not fit the model (:func:`_check_tokenizer`).
    """
    reason = is_reward_model_dir(path)
    if reason is not None:
        raise ConfigError(reason)
    path = Path(path)
    with unreadable_model(path):
        tokenizer = load_tokenizer(tokenizer_dir(path))
        model = read_scorer(path, dtype)
    _check_tokenizer(path, model, tokenizer)
    return model.to(device).eval().requires_grad_(False), tokenizer


def read_scorer(path: str | Path, dtype: str) -> torch.nn.Module:
    """The model of a reward-model directory as it was saved: an rlzoo critic (backbone +
    :data:`VALUE_HEAD_FILE`) or a ``...ForSequenceClassification`` (``rlzoo rm`` resumes
    from it; :func:`load_reward_model` freezes it). Call under
    :func:`rlzoo.models.build.unreadable_model`.

    :param dtype: ``auto`` (the dtype its ``config.json`` records) or a key of
        :data:`rlzoo.core.dtypes.DTYPES`.
    """
    path = Path(path)
    if (path / VALUE_HEAD_FILE).is_file():
        config = AutoConfig.from_pretrained(str(path))
        model = ValueModel.from_policy_config(config)
        model.load_from(path)
        saved = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32")
        return model.to(DTYPES.get(saved.removeprefix("torch."), torch.float32) if dtype == "auto" else DTYPES[dtype])
    return AutoModelForSequenceClassification.from_pretrained(str(path),
                                                              dtype="auto" if dtype == "auto" else DTYPES[dtype])


def sequence_scores(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """One float32 score per row of ``input_ids`` ``(B, L)`` (either padding side): the last
    valid token's hidden state through the head. Carries gradients when ``model`` does."""
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    last = attention_mask.shape[1] - 1 - attention_mask.long().flip(-1).argmax(-1)  # (B,) last valid index
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    if isinstance(getattr(model, "module", model), ValueModel):  # also under DDP: called through the wrapper
        return model(input_ids, attention_mask, position_ids)[rows, last].float()
    head = getattr(model, "score", None)
    if not isinstance(head, torch.nn.Linear):  # an encoder classifier: its own pooling
        return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0].float()
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      use_cache=False).last_hidden_state
    return head(hidden[rows, last]).squeeze(-1).float()


@torch.no_grad()
def score_ids(model: torch.nn.Module, ids: list[list[int]], pad_id: int, batch_size: int,
              device: torch.device) -> torch.Tensor:
    """``(B,)`` float32 scores of token-id lists, ``batch_size`` sequences per forward
    (left-padded; the padding side does not change a score)."""
    out = []
    for start in range(0, len(ids), batch_size):
        input_ids, mask = left_pad(ids[start:start + batch_size], pad_id)
        out.append(sequence_scores(model, input_ids.to(device), mask.to(device)).cpu())
    return torch.cat(out) if out else torch.zeros(0)


def from_causal_lm(policy: PreTrainedModel) -> torch.nn.Module:
    """A reward model with ``policy``'s architecture and backbone weights whose head starts
    at zero (every score 0, as the critic's): a one-label ``...ForSequenceClassification``
    where transformers has that class for the architecture, else (CodeGen, Cohere, Granite,
    Falcon-H1, ...) an rlzoo critic (:class:`rlzoo.models.build.ValueModel`: the backbone and a
    linear value head), which :func:`sequence_scores` reads at the last token and
    :func:`load_reward_model` loads alike."""
    if policy.config.model_type not in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES:
        return ValueModel.from_policy_config(policy.config, state_from=policy).to(policy.dtype)
    config = policy.config.__class__.from_dict(policy.config.to_dict())
    config.num_labels = 1
    config.id2label, config.label2id = {0: "score"}, {"score": 0}
    config.architectures = None
    model = AutoModelForSequenceClassification.from_config(config).to(policy.dtype)
    model.base_model.load_state_dict(policy.base_model.state_dict())  # OPT's get_decoder() is one level down
    torch.nn.init.zeros_(model.score.weight)
    return model


Reduce = Callable[[list[float]], list[float]]
"""Sums a list of floats over the data-parallel ranks (the same length on every rank)."""


class RunningMoments:
    """Running mean and (population) standard deviation of every score seen (Chan et al.'s
    parallel update, float64), in two parts: the *settled* statistics (``count``, ``mean``,
    ``m2``) that :meth:`normalize` uses, and the scores :meth:`update` has gathered since
    the last :meth:`settle`, which folds them in, those of every rank when its ``reduce``
    sums over ranks. :meth:`normalize` gives ``(x − mean) / (std + 1e-8)``.

    Scoring (:meth:`update`) does no collective, so ranks may score different numbers of
    batches; :meth:`settle` is one collective, called where every rank is once per step.
    """

    def __init__(self) -> None:
        self.count, self.mean, self.m2 = 0, 0.0, 0.0
        self.pending = [0.0, 0.0, 0.0]
        """Since the last settle: ``[n, Σ (x − mean), Σ (x − mean)²]`` about the settled mean."""

    def update(self, values: torch.Tensor) -> None:
        """Gather a batch of values, to be folded in at the next :meth:`settle`."""
        x = values.double().flatten() - self.mean
        self.pending = [self.pending[0] + float(x.numel()), self.pending[1] + float(x.sum()),
                        self.pending[2] + float((x * x).sum())]

    def settle(self, reduce: Reduce | None = None) -> None:
        """Fold the gathered values into the statistics: this process's, or with ``reduce``
        every rank's (each rank calls it once with the same ``reduce``; afterwards all ranks
        hold the same statistics)."""
        n, shift_sum, shift_squares = reduce(list(self.pending)) if reduce is not None else self.pending
        self.pending = [0.0, 0.0, 0.0]
        n = int(round(n))
        if n == 0:
            return
        delta = shift_sum / n  # the batch's mean minus the settled mean
        batch_m2 = max(0.0, shift_squares - shift_sum * delta)
        total = self.count + n
        self.mean += delta * n / total
        self.m2 += batch_m2 + delta * delta * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count else 1.0

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        return ((values.double() - self.mean) / (self.std + 1e-8)).float()

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2, "pending": list(self.pending)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count, self.mean, self.m2 = int(state["count"]), float(state["mean"]), float(state["m2"])
        self.pending = [float(v) for v in state.get("pending", (0.0, 0.0, 0.0))]
