"""A run's directory: the files a run writes and reads, in one place.

::

    runs/<run-name>/
      config.yaml                 the resolved config (also TensorBoard hparams)
      plan.txt                    the run plan (rlzoo.plan)
      events.out.tfevents.*       TensorBoard scalars, text samples, hparams
      init_model/                 the initial policy + tokenizer (the frozen reference)
      checkpoints/step_000100/    policy/, critic/, trainer_state.pt (rlzoo.checkpoint)
      status.json                 completed | interrupted | failed, step

Rank 0 writes; every method that writes is safe to call on every rank (the others wait).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from rlzoo import distributed
from rlzoo.checkpoint import latest_checkpoint, load_state, save_checkpoint

INIT_MODEL_DIR = "init_model"
STATUS_FILE = "status.json"
CONFIG_FILE = "config.yaml"
PLAN_FILE = "plan.txt"


def default_run_name(cfg: Any) -> str:
    """``<algo>-<task>-s<seed>-<timestamp>`` unless ``run_name`` is set."""
    if cfg.run_name:
        return str(cfg.run_name)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{cfg.algo or 'custom'}-{cfg.task.name}-s{cfg.seed}-{stamp}"


class RunDirectory:
    """The directory of one run.

    :param cfg: the resolved config (``resume``, ``run_dir``, ``run_name``).
    :param dist: this process's place in the job (every rank gets rank 0's path).
    """

    def __init__(self, cfg: Any, dist: distributed.DistInfo) -> None:
        self.dist = dist
        path = str(cfg.resume or cfg.run_dir or Path("runs") / default_run_name(cfg))
        self.path = Path(distributed.broadcast_object(path, dist))
        self.resume_from = latest_checkpoint(self.path) if cfg.resume else None

    @property
    def init_model(self) -> Path:
        return self.path / INIT_MODEL_DIR

    def load_state(self) -> dict[str, Any]:
        """The trainer state of the checkpoint resumed from (see :func:`load_state`)."""
        return load_state(self.resume_from)

    def start(self, config_yaml: str, plan_text: str, initial_policy: Any, tokenizer: Any) -> None:
        """Create the directory of a new run: ``init_model/``, ``config.yaml``, ``plan.txt``."""
        if self.dist.is_main:
            self.path.mkdir(parents=True, exist_ok=True)
            initial_policy.save_pretrained(str(self.init_model))
            tokenizer.save_pretrained(str(self.init_model))
            (self.path / CONFIG_FILE).write_text(config_yaml)
            (self.path / PLAN_FILE).write_text(plan_text)
        distributed.barrier(self.dist)

    def save_checkpoint(self, step: int, models: dict[str, Any], state: dict[str, Any], keep: int) -> None:
        """Write checkpoint ``step`` (rank 0; every rank calls this, the others wait)."""
        if self.dist.is_main:
            save_checkpoint(self.path, step, models, state, keep=keep)
        distributed.barrier(self.dist)

    def write_status(self, status: str, step: int, total_steps: int) -> None:
        """Record how the run ended (``rlzoo sweep`` skips completed runs)."""
        if self.dist.is_main:
            write_status(self.path, status, step, total_steps)


def write_status(run_dir: Path, status: str, step: int, total_steps: int) -> None:
    """Write ``status.json`` atomically: ``status``, ``step``, ``total_steps``."""
    tmp = run_dir / f".{STATUS_FILE}.tmp"
    tmp.write_text(json.dumps({"status": status, "step": step, "total_steps": total_steps}))
    tmp.replace(run_dir / STATUS_FILE)


def read_status(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``status.json`` (``status``, ``step``, ``total_steps``), or ``None``."""
    path = Path(run_dir) / STATUS_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def summary_line(run_dir: Path) -> str:
    """One line about a finished run: steps, time, mean reward of the first and last 10%."""
    from rlzoo.events import read_scalars

    curves = read_scalars(run_dir)
    rewards = [v for _, v in curves.get("reward/mean", [])]
    if not rewards:
        return f"rlzoo: run finished; logs in {run_dir}"
    tail = max(1, len(rewards) // 10)
    seconds = sum(v for _, v in curves.get("timing/step_s", []))
    return (f"rlzoo: {len(rewards)} steps in {seconds:.0f} s of training; reward/mean "
            f"{np.mean(rewards[:tail]):.3f} (first 10%) -> {np.mean(rewards[-tail:]):.3f} (last 10%); "
            f"logs: tensorboard --logdir {run_dir}")
