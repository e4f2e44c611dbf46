"""``python tests/fault_runner.py ARGS...``: the ``rlzoo`` CLI with one fault injected (tests only).

``RLZOO_FAULT=<point>:<n>[:<SIGNAL>[+<SIGNAL>...]]``: the n-th time this process reaches
``<point>``, it sends itself the signals (default ``SIGKILL``) and carries on (if alive):

- ``rollout``: inside the n-th rollout (``Sampler.sample``), before it returns;
- ``update``: right after the n-th optimizer step changed the weights;
- ``write``: in the n-th checkpoint write, after the models, before ``trainer_state.pt``;
- ``rename``: just before the n-th checkpoint directory is renamed into place;
- ``prune``: in the n-th deletion of an old checkpoint, after one of its files is gone;
- ``enospc``: the n-th ``trainer_state.pt`` write stores part of the file, then fails
  with ``ENOSPC`` (no signal).

The patches wrap library functions in this process only; rlzoo ships no injection points.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sys
from pathlib import Path

import torch

COUNTS: dict[str, int] = {}


def _reached(point: str) -> bool:
    wanted, n, *_ = os.environ.get("RLZOO_FAULT", "none:0").split(":")
    if wanted != point:
        return False
    COUNTS[point] = COUNTS.get(point, 0) + 1
    return COUNTS[point] == int(n)


def _fire() -> None:
    parts = os.environ["RLZOO_FAULT"].split(":")
    for name in (parts[2] if len(parts) > 2 else "SIGKILL").split("+"):
        os.kill(os.getpid(), getattr(signal, name))


def _install() -> None:
    from rlzoo.rollout.sampler import Sampler

    sample, optimizer_step, save = Sampler.sample, torch.optim.AdamW.step, torch.save
    replace, rmtree = os.replace, shutil.rmtree

    def sample_hook(self, *args, **kwargs):
        batch = sample(self, *args, **kwargs)
        if _reached("rollout"):
            _fire()
        return batch

    def step_hook(self, *args, **kwargs):
        result = optimizer_step(self, *args, **kwargs)
        if _reached("update"):
            _fire()
        return result

    def save_hook(obj, f, *args, **kwargs):
        if str(f).endswith("trainer_state.pt"):
            if _reached("write"):
                _fire()
            if _reached("enospc"):
                Path(f).write_bytes(b"\0" * 1000)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return save(obj, f, *args, **kwargs)

    def replace_hook(src, dst, *args, **kwargs):
        if Path(src).name.startswith(".tmp-step_") and _reached("rename"):
            _fire()
        return replace(src, dst, *args, **kwargs)

    def rmtree_hook(path, *args, **kwargs):
        name = Path(path).name
        if (name.startswith(".del-step_") or name.startswith("step_")) and _reached("prune"):
            victim = next(p for p in sorted(Path(path).rglob("*")) if p.is_file())
            victim.unlink()
            _fire()
        return rmtree(path, *args, **kwargs)

    Sampler.sample = sample_hook
    torch.optim.AdamW.step = step_hook
    torch.save = save_hook
    os.replace = replace_hook
    shutil.rmtree = rmtree_hook


if __name__ == "__main__":
    _install()
    from rlzoo.commands.cli import main

    sys.exit(main(sys.argv[1:]))
