"""Atomic checkpoints: models as safetensors (``save_pretrained``) plus trainer state.

Layout of ``<run_dir>/checkpoints/step_000050/``: ``policy/`` (model + tokenizer),
``critic/`` (when the run has one) and ``trainer_state.pt`` (step, optimizer, scheduler,
KL controller, RNG states, extension states). A checkpoint is written into a temporary
directory and renamed into place, so a crash or SIGKILL leaves either the complete
checkpoint or none; the newest complete one is the one resumed from.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

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
    :param state: picklable trainer state, saved with ``torch.save``.
    """
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


def load_state(checkpoint: Path) -> dict[str, Any]:
    return torch.load(checkpoint / "trainer_state.pt", weights_only=False)
