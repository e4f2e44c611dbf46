"""Atomic checkpoints: models as safetensors (``save_pretrained``) plus trainer state.

Layout of ``<run_dir>/checkpoints/step_000050/``: ``policy/`` (model + tokenizer),
``critic/`` (when the run has one) and ``trainer_state.pt`` (step, optimizer, scheduler,
KL controller, RNG states, extension states). A checkpoint is written into a temporary
directory and renamed into place, so a crash or SIGKILL leaves either the complete
checkpoint or none; the newest complete one is the one resumed from.

Nothing in a checkpoint can run code when it is loaded: weights are safetensors, and
``trainer_state.pt`` holds only tensors and plain values (dict, list, tuple, str, int,
float, bool, None). It is written only after :func:`check_plain` accepted it and read with
``torch.load(weights_only=True)``, which refuses any other object, so a crafted file handed
to ``resume=`` is an error, never executed.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pickle

import torch

from rlzoo.errors import ConfigError

CHECKPOINT_DIR = "checkpoints"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / "trainer_state.pt").is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def _fsync_tree(path: Path) -> None:
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as handle:
                os.fsync(handle.fileno())


def save_checkpoint(run_dir: str | Path, step: int, models: dict[str, Any], state: dict[str, Any],
                    keep: int) -> Path:
    """Write checkpoint ``step`` atomically and keep only the newest ``keep``.

    :param models: name -> object with ``save_pretrained(path)`` (tokenizers included).
    :param state: trainer state of tensors and plain values (see :func:`check_plain`),
        saved with ``torch.save``.
    :raises TypeError: ``state`` holds another kind of object (named by its path).
    """
    check_plain(state, "trainer_state")
    root = Path(run_dir) / CHECKPOINT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(step)
    tmp = root / f".tmp-{checkpoint_name(step)}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    for name, model in models.items():
        target = tmp / name.split(":")[0]
        model.save_pretrained(str(target))
    torch.save(state, tmp / "trainer_state.pt")
    _fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    dir_fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for _, old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return final


PLAIN_TYPES = (str, int, float, bool, type(None), torch.Tensor)


def check_plain(value: Any, path: str) -> None:
    """Raise ``TypeError`` naming ``path`` unless ``value`` is built only of tensors, plain
    scalars and dicts / lists / tuples of them: what ``torch.load(weights_only=True)``
    reads back without running any code."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int)):
                raise TypeError(f"{path} has a key of type {type(key).__name__}; checkpoints take str or int keys")
            check_plain(item, f"{path}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_plain(item, f"{path}[{index}]")
    elif not isinstance(value, PLAIN_TYPES):
        raise TypeError(f"{path} is a {type(value).__module__}.{type(value).__name__}; checkpoint state holds "
                        "only tensors, str, int, float, bool, None and dicts / lists / tuples of them")


def load_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state of ``checkpoint``, read with ``weights_only=True``.

    :raises ConfigError: the file holds anything but tensors and plain values (it is not
        loaded: unpickling it could run code) or cannot be read.
    """
    path = Path(checkpoint) / "trainer_state.pt"
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"refusing to load {path}: it holds objects other than tensors and plain "
                          f"values, and unpickling them could run code ({first})") from exc
    except (OSError, RuntimeError, EOFError) as exc:
        raise ConfigError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
