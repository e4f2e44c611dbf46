"""Recorded rollouts: each step's batch, as the learner received it, in the run directory.

With ``rollout.record=true`` a run writes ``rollouts/step_000001.safetensors`` (the batch's
tensors: token ids, masks, group ids, scores, rewards, rollout log-probs, ...) and a
``.json`` sidecar with its prompts and completions, after the lifecycle hooks that filter
and shape the batch, so a recording replays exactly what was learnt from. Files are
written atomically and read without unpickling anything (safetensors + JSON).
``rlzoo ab`` trains two learners on them (rlzoo/commands/ab.py).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from rlzoo.core.batch import RolloutBatch
from rlzoo.core.errors import ConfigError

ROLLOUT_DIR = "rollouts"
RECORDED = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "group_ids", "scores", "truncated",
            "rollout_logp", "loss_mask", "rewards", "baseline_scores", "reward_scores")
"""The batch fields a recording keeps: what sampling, the filters and shaping produced."""
_STEP_FILE = re.compile(r"^step_(\d+)\.safetensors$")


def json_safe(value: Any) -> Any:
    """``value`` when JSON can hold it, else its ``repr`` (a reference answer of any type)."""
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def record(run_dir: Path, step: int, batch: RolloutBatch) -> Path:
    """Write ``batch`` as the recording of ``step`` (atomically); returns the tensor file."""
    folder = Path(run_dir) / ROLLOUT_DIR
    folder.mkdir(exist_ok=True)
    stem = folder / f"step_{step:06d}"
    tensors = {name: getattr(batch, name).detach().cpu().contiguous() for name in RECORDED
               if getattr(batch, name) is not None}
    tensors["truncated"] = tensors["truncated"].to(torch.uint8)
    text = {"prompts": batch.prompts, "completions": batch.completions,
            "references": [json_safe(r) for r in batch.references]}
    for path, write in ((stem.with_suffix(".json"), lambda p: p.write_text(json.dumps(text))),
                        (stem.with_suffix(".safetensors"), lambda p: save_file(tensors, str(p)))):
        tmp = path.with_name(f".{path.name}.tmp")
        write(tmp)
        os.replace(tmp, path)
    return stem.with_suffix(".safetensors")


def recorded_steps(run_dir: Path) -> list[int]:
    """The steps recorded in ``run_dir``, in order."""
    folder = Path(run_dir) / ROLLOUT_DIR
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STEP_FILE.match(p.name)))


def check(run_dir: Path, steps: list[int]) -> None:
    """Check that each step's recording is readable (its safetensors header covers the whole file,
    its JSON parses) without loading the tensors: a truncated file or a pickle is refused before
    anything is built.

    :raises ConfigError: the first unreadable file, named, and what to do.
    """
    for step in steps:
        stem = Path(run_dir) / ROLLOUT_DIR / f"step_{step:06d}"
        try:
            with safe_open(str(stem.with_suffix(".safetensors")), "pt"):
                pass
            json.loads(stem.with_suffix(".json").read_text())
        except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
            raise ConfigError(f"cannot read the recorded rollout {stem}.safetensors / .json ({exc}): the recording "
                              f"is truncated or not rlzoo's; replay fewer steps (--steps {step - 1}) or record "
                              "the run again") from exc


def load(run_dir: Path, step: int) -> RolloutBatch:
    """The batch recorded at ``step``.

    :raises ConfigError: a missing or unreadable recording (the file named).
    """
    stem = Path(run_dir) / ROLLOUT_DIR / f"step_{step:06d}"
    try:
        tensors = load_file(str(stem.with_suffix(".safetensors")))
        text = json.loads(stem.with_suffix(".json").read_text())
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        raise ConfigError(f"cannot read the recorded rollout {stem}.safetensors / .json: {exc}") from exc
    tensors["truncated"] = tensors["truncated"].bool()
    known = {f.name for f in fields(RolloutBatch)}
    return RolloutBatch(**{k: v for k, v in tensors.items() if k in known}, prompts=text["prompts"],
                        completions=text["completions"], references=text["references"])
