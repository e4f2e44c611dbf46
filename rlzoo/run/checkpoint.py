"""Atomic, verified checkpoints: models as safetensors (``save_pretrained``) plus trainer state.

Layout of ``<run_dir>/checkpoints/step_000050/``: ``policy/`` (model + tokenizer),
``critic/`` (when the run has one), ``trainer_state.pt`` (step, optimizer, scheduler, KL
controller, RNG states, extension states) and ``manifest.json``, written last: the size
and SHA-256 of every other file.

What a crash, a kill or a full disk can leave, and what happens to it:

- A checkpoint is written into ``.tmp-step_000050-<pid>/`` and renamed into place, so a
  ``step_*`` directory is always complete. A failed write (``ENOSPC``, ...) removes its
  temporary directory and raises :class:`CheckpointError`; a kill leaves it behind, and
  the next save or resume of the run removes it.
- Pruning first renames an old checkpoint to ``.del-step_*`` and then deletes it, so a
  kill during pruning never leaves a half-deleted ``step_*``; leftovers go like temps.
- A checkpoint damaged later (a truncated or altered file) fails :func:`verify_checkpoint`
  against its manifest; resume falls back to the newest intact one
  (:func:`newest_intact_checkpoint`).
- Non-finite weights or optimizer state are never written (:func:`first_non_finite`).

Nothing in a checkpoint can run code when it is loaded: weights are safetensors, and
``trainer_state.pt`` holds only tensors and plain values (dict, list, tuple, str, int,
float, bool, None). It is written only after :func:`check_plain` accepted it and read with
``torch.load(weights_only=True)``, which refuses any other object, so a crafted file handed
to ``resume=`` is an error, never executed.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import pickle
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from rlzoo.core.deferred import no_grad
from rlzoo.core.errors import ConfigError, TrainingError

CHECKPOINT_DIR = "checkpoints"
STATE_FILE = "trainer_state.pt"
MANIFEST_FILE = "manifest.json"
TMP_PREFIX = ".tmp-"
"""A checkpoint being written (``.tmp-step_000050-<pid>``)."""
DELETE_PREFIX = ".del-"
"""A checkpoint being deleted by pruning (``.del-step_000010``)."""
DAMAGED_PREFIX = "damaged-"
"""A checkpoint that failed verification, set aside on resume (never deleted by rlzoo)."""
_STEP_DIR = re.compile(r"^step_(\d+)$")
_HASH_CHUNK = 1 << 20


class CheckpointError(TrainingError):
    """A checkpoint could not be written; the run's previous checkpoints are untouched."""


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first: ``step_*`` directories with a manifest
    (or, written before manifests existed, with ``trainer_state.pt``). Not verified."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and ((child / MANIFEST_FILE).is_file() or (child / STATE_FILE).is_file()):
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint (not verified; see :func:`newest_intact_checkpoint`)."""
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _files(root: Path) -> Iterator[Path]:
    for folder, _, names in os.walk(root):
        for name in sorted(names):
            yield Path(folder) / name


def write_manifest(checkpoint: Path) -> None:
    """Write ``manifest.json``: ``{"files": {relative path: {"size": bytes, "sha256": hex}}}``
    for every file of ``checkpoint`` (call it after all of them are written)."""
    files = {str(path.relative_to(checkpoint)): {"size": path.stat().st_size, "sha256": _sha256(path)}
             for path in _files(checkpoint) if path.name != MANIFEST_FILE}
    (checkpoint / MANIFEST_FILE).write_text(json.dumps({"files": files}, indent=1, sort_keys=True))


def verify_checkpoint(checkpoint: Path, hashes: bool = True) -> str | None:
    """Why ``checkpoint`` cannot be resumed from, or ``None`` when it is intact.

    :param hashes: compare SHA-256 digests too (reads every byte), not only sizes.
    A checkpoint without a manifest (rlzoo before manifests) is checked for its files only.
    """
    manifest_path = checkpoint / MANIFEST_FILE
    if not manifest_path.is_file():
        missing = [name for name in (STATE_FILE, "policy/config.json") if not (checkpoint / name).is_file()]
        return f"{missing[0]} is missing" if missing else None
    try:
        files = json.loads(manifest_path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{MANIFEST_FILE} is unreadable ({type(exc).__name__})"
    for name, expected in sorted(files.items()):
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != expected["size"]:
            return f"{name} has {size} bytes, the manifest says {expected['size']}"
        if hashes and _sha256(path) != expected["sha256"]:
            return f"{name} does not match its SHA-256 in the manifest"
    return None


def newest_intact_checkpoint(run_dir: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint that passes :func:`verify_checkpoint`, and the newer ones that
    failed it (``(path, reason)``, newest first)."""
    damaged = []
    for _, checkpoint in reversed(list_checkpoints(run_dir)):
        reason = verify_checkpoint(checkpoint)
        if reason is None:
            return checkpoint, damaged
        damaged.append((checkpoint, reason))
    return None, damaged


def set_aside(checkpoint: Path) -> Path:
    """Rename a damaged checkpoint to ``damaged-step_*`` (kept for inspection, no longer
    counted as a checkpoint, so pruning can never mistake it for the newest)."""
    target = checkpoint.with_name(DAMAGED_PREFIX + checkpoint.name)
    suffix = 1
    while target.exists():
        target = checkpoint.with_name(f"{DAMAGED_PREFIX}{checkpoint.name}.{suffix}")
        suffix += 1
    os.replace(checkpoint, target)
    return target


def remove_leftovers(run_dir: str | Path) -> list[Path]:
    """Delete what interrupted writes and prunings left in ``checkpoints/`` (``.tmp-*``,
    ``.del-*``); returns what was removed. Call it only while holding the run's lock."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    stale = [p for p in root.iterdir() if p.name.startswith((TMP_PREFIX, DELETE_PREFIX))]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)
"""What a failed write raises: ``OSError`` from Python, ``RuntimeError`` from ``torch.save``
and ``SafetensorError`` from ``save_pretrained`` (neither of the last two keeps the errno)."""


def write_error(exc: BaseException, where: Path) -> str:
    """Why a write under ``where`` failed, in words: the OS's reason, or "No space left on
    device" when the file system holding ``where`` has no space left for this user."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({exc.filename})" if exc.filename else exc.strerror
    with contextlib.suppress(OSError):
        if os.statvfs(where).f_bavail == 0:
            return os.strerror(errno.ENOSPC)
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _fsync_tree(path: Path) -> None:
    for file in _files(path):
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _delete(path: Path) -> None:
    """Rename to ``.del-*`` (atomic), then delete: a kill never leaves a partial ``step_*``."""
    doomed = path.with_name(DELETE_PREFIX + path.name)
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _named_tensors(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """``(path, tensor or float)`` of every float-valued leaf of a nested state."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _named_tensors(item, f"{path}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _named_tensors(item, f"{path}[{index}]")
    elif isinstance(value, float) or (isinstance(value, torch.Tensor) and value.is_floating_point()):
        yield path, value


def first_non_finite(models: dict[str, Any], state: dict[str, Any] | None = None) -> str | None:
    """The name of the first weight (or trainer-state value) holding NaN or inf, else ``None``.

    :param models: name -> a model (``state_dict()``) or an object with a ``state_dict``
        mapping (gathered weights); objects without weights (tokenizers) are skipped.
    """
    for name, model in models.items():
        weights = getattr(model, "state_dict", None)
        weights = weights() if callable(weights) else weights
        for key, tensor in (weights or {}).items():
            local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
            if local.is_floating_point() and not _all_finite(local):
                return f"{name} weight {key!r}"
    for path, value in _named_tensors(state or {}, "trainer_state"):
        if not (math.isfinite(value) if isinstance(value, float) else _all_finite(value)):
            return path
    return None


@no_grad
def _all_finite(tensor: torch.Tensor) -> bool:
    """Whether every element is finite. A finite sum proves it with one reduction and no
    copy; only a non-finite sum (or one that overflowed) is checked element by element."""
    return bool(torch.isfinite(tensor.sum())) or bool(torch.isfinite(tensor).all())


def save_checkpoint(run_dir: str | Path, step: int, models: dict[str, Any], state: dict[str, Any],
                    keep: int) -> Path:
    """Write checkpoint ``step`` atomically, verified by a manifest, and keep only the newest ``keep``.

    :param models: name -> object with ``save_pretrained(path)`` (tokenizers included);
        ``"policy:tokenizer"`` is saved into ``policy/``.
    :param state: trainer state of tensors and plain values (see :func:`check_plain`),
        saved with ``torch.save``.
    :raises TypeError: ``state`` holds another kind of object (named by its path).
    :raises CheckpointError: a weight or state value is not finite (nothing is written), or
        the write failed (disk full, ...): its temporary directory is removed and the
        previous checkpoints are untouched.
    """
    check_plain(state, "trainer_state")
    run_dir = Path(run_dir)
    root = run_dir / CHECKPOINT_DIR
    final = root / checkpoint_name(step)
    previous = latest_checkpoint(run_dir)
    kept = (f"{previous} stays the newest checkpoint, resumable with `rlzoo train resume={run_dir}`"
            if previous is not None else "the run has no earlier checkpoint")
    bad = first_non_finite(models, state)
    if bad is not None:
        raise CheckpointError(f"not writing checkpoint {final}: {bad} is not finite (NaN or inf); {kept}")
    tmp = root / f"{TMP_PREFIX}{checkpoint_name(step)}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        for name, model in models.items():
            model.save_pretrained(str(tmp / name.split(":")[0]))
        torch.save(state, tmp / STATE_FILE)
        write_manifest(tmp)
        _fsync_tree(tmp)
        if final.exists():
            _delete(final)
        os.replace(tmp, final)
        _fsync_dir(root)
    except WRITE_ERRORS as exc:
        reason = write_error(exc, run_dir)  # before the space is freed again
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"cannot write checkpoint {final}: {reason}; nothing of it was kept, {kept}") from exc
    for _, old in list_checkpoints(run_dir)[:-keep]:
        try:
            _delete(old)
        except OSError:
            pass  # pruning is best effort: an old checkpoint left behind is still a valid one
    remove_leftovers(run_dir)
    return final


def check_optimizer_fits(optimizer: torch.optim.Optimizer | None, where: str | Path) -> None:
    """:raises ConfigError: a loaded optimizer state holds a tensor whose shape differs from
    its parameter's (``load_state_dict`` does not check; the first step would fail)."""
    if optimizer is None:
        return
    for group in optimizer.param_groups:
        for index, param in enumerate(group["params"]):
            for key, value in optimizer.state.get(param, {}).items():
                if isinstance(value, torch.Tensor) and value.dim() and value.shape != param.shape:
                    raise ConfigError(f"{where} does not fit this run: optimizer state {key!r} of parameter "
                                      f"{index} has shape {tuple(value.shape)}, the parameter "
                                      f"{tuple(param.shape)}; was it written by another run?")


PLAIN_SCALARS = (str, int, float, bool, type(None))
"""With tensors, the leaves checkpoint state may hold (a tuple without torch's type: importing this
module must not load a deferred torch, :mod:`rlzoo.core.deferred`)."""


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
    elif not isinstance(value, (*PLAIN_SCALARS, torch.Tensor)):
        raise TypeError(f"{path} is a {type(value).__module__}.{type(value).__name__}; checkpoint state holds "
                        "only tensors, str, int, float, bool, None and dicts / lists / tuples of them")


def load_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state of ``checkpoint``, read with ``weights_only=True``.

    :raises ConfigError: the file holds anything but tensors and plain values (it is not
        loaded: unpickling it could run code) or cannot be read.
    """
    path = Path(checkpoint) / STATE_FILE
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"refusing to load {path}: it holds objects other than tensors and plain "
                          f"values, and unpickling them could run code ({first})") from exc
    except (OSError, RuntimeError, EOFError) as exc:
        raise ConfigError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
