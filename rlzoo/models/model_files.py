"""Reading a model directory or GGUF file: its tokenizer exactly as saved, the checks before
loading, and one error line for a directory that cannot be read (:mod:`rlzoo.models.build`
loads the models themselves)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
from pathlib import Path
from typing import Iterator

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from rlzoo.core.errors import ConfigError

GENERIC_TOKENIZER_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a model directory exactly as it was saved.

    ``AutoTokenizer`` maps a saved generic ``tokenizers``-backed tokenizer (class
    ``PreTrainedTokenizerFast``, written as ``TokenizersBackend`` by transformers 5) to the
    architecture's own class (e.g. ``Qwen2Tokenizer``), which silently changes
    tokenization. A directory naming a generic class is therefore loaded with
    ``PreTrainedTokenizerFast`` directly; any other class goes through ``AutoTokenizer``.
    """
    path = Path(path)
    config_file = path / "tokenizer_config.json"
    tokenizer_class = None
    if config_file.is_file():
        tokenizer_class = json.loads(config_file.read_text()).get("tokenizer_class")
    if tokenizer_class in GENERIC_TOKENIZER_CLASSES and (path / "tokenizer.json").is_file():
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_model_dir(path: Path) -> None:
    """:raises ConfigError: ``path`` is not a local model directory (no ``config.json``): the
    line every command gives for a ``model.path`` it cannot read, before anything else is tried
    (a missing path would otherwise be taken for a hub id)."""
    if not (path / "config.json").is_file():
        policies = sorted(path.glob("checkpoints/*/policy/config.json")) if (path / "config.yaml").is_file() else []
        hint = f" (a run directory: its policy is a model directory, e.g. {policies[-1].parent})" if policies else ""
        raise ConfigError(
            f"model.path {str(path)!r} is not a local model directory (no config.json) or a .gguf file{hint}; "
            "rlzoo never downloads models: pass a directory written by save_pretrained"
        )


GGUF_SUFFIX = ".gguf"
GGUF_INSTALL = "pip install 'rlzoo[gguf]'  (or: pip install gguf)"
"""What installs the optional ``gguf`` package transformers reads GGUF files with."""


def check_gguf_path(path: str | Path, key: str = "model.path") -> None:
    """:raises ConfigError: ``path`` names a ``.gguf`` file that does not exist, or the
    ``gguf`` package is not installed (the pip command named). Cheap: run before loading."""
    path = Path(path)
    if path.suffix.lower() != GGUF_SUFFIX:
        return
    if not path.is_file():
        raise ConfigError(f"{key} {str(path)!r} is not a file; rlzoo never downloads models")
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"{key} {str(path)!r} is a GGUF file, which needs the gguf package: {GGUF_INSTALL}")


def gguf_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a GGUF file (left padding; EOS as the pad token when it has none).

    :raises ConfigError: see :func:`check_gguf_path`; a file transformers cannot read.
    """
    check_gguf_path(path)
    with unreadable_model(path):
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


@contextlib.contextmanager
def unreadable_model(path: Path) -> Iterator[None]:
    """Turn a failure to read a model directory (garbage JSON, a truncated safetensors
    file, a missing weight) into a :class:`ConfigError` naming ``path``."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - transformers, tokenizers and safetensors raise many kinds
        lines = str(exc).strip().splitlines()
        raise ConfigError(f"cannot load the model in {str(path)!r}: {type(exc).__name__}: "
                          f"{lines[0] if lines else ''}") from exc
