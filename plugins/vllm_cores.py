"""Where a vLLM engine and the trainer compute on a CPU: the cores of each process.

Used by :mod:`rlzoo_plugins.vllm_rollout` (the plan's core split, the engine's cores, an
async trainer pinning itself); docs/training.md, "Rollout engines", shows the split as
the plan prints it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterable

import torch

from rlzoo.api import ConfigError


def engine_cores(usable: Iterable[int], threads: int) -> list[int]:
    """The cores the engine runs on: the last ``threads`` of ``usable`` (sorted), all of
    them for 0 or more threads than cores."""
    cores = sorted(usable)
    return cores if threads <= 0 or threads >= len(cores) else cores[-threads:]


CORES_ENV = "RLZOO_VLLM_USABLE_CORES"
"""Set by an async run's trainer when it pins itself to its own cores: the cores it could use
before, which the generator process it spawns (inheriting the narrower mask) splits."""


def usable() -> list[int]:
    """The cores this process may run on (before an async trainer pinned itself: :data:`CORES_ENV`)."""
    if os.environ.get(CORES_ENV):
        return sorted(int(core) for core in os.environ[CORES_ENV].split(","))
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def rank_cores(cores: list[int], world: int, rank: int) -> list[int]:
    """Rank ``rank``'s contiguous slice of ``cores`` (sorted) among ``world`` ranks of a node;
    the first ``len(cores) % world`` ranks get one core more."""
    size, extra = divmod(len(cores), world)
    start = rank * size + min(rank, extra)
    return sorted(cores)[start:start + size + (rank < extra)]


@dataclass(frozen=True)
class CoreSplit:
    """Where one process's engine and trainer compute (CPU).

    :ivar engine: the engine's cores (its OpenMP threads: one per core).
    :ivar trainer: the cores the trainer is pinned to (``rollout.mode=async``); ``None``:
        not pinned, it shares the engine's cores in time.
    """

    engine: list[int]
    trainer: list[int] | None = None


def core_split(cores: list[int], threads: int, trainer_threads: int, mode: str, world: int = 1,
               rank: int = 0) -> CoreSplit:
    """The cores of rank ``rank``'s engine (and, under ``rollout.mode=async``, its trainer).

    ``sync``: the engine takes the last ``threads`` cores of the rank's slice
    (:func:`rank_cores`; 0: all of it), the trainer shares them in time. ``async`` (one
    process): both compute at once, so the trainer gets the first ``trainer_threads`` cores
    and the engine the last ``threads`` of the rest (0: all of the rest).

    :raises ConfigError: fewer cores than ranks; async without ``trainer.threads``, or with
        no core left for the engine.
    """
    if len(cores) < world:
        raise ConfigError(f"rollout.backend=vllm on {world} processes (launcher.nproc) gives each rank's engine "
                          f"cores of its own, and this process may use {len(cores)} ({core_ranges(sorted(cores))}): "
                          f"use launcher.nproc<={len(cores)}")
    mine = rank_cores(cores, world, rank)
    if mode != "async":
        return CoreSplit(engine_cores(mine, threads))
    if trainer_threads <= 0:
        raise ConfigError(f"rollout.backend=vllm with rollout.mode=async runs the engine while the trainer updates, "
                          f"on cores of their own: set trainer.threads=N (the trainer's first N of the "
                          f"{len(mine)} usable cores; the engine takes the rest), e.g. trainer.threads="
                          f"{max(1, len(mine) // 2)}")
    if trainer_threads >= len(mine):
        raise ConfigError(f"rollout.backend=vllm with rollout.mode=async needs cores for the trainer and the engine "
                          f"apart, and trainer.threads={trainer_threads} leaves none of the {len(mine)} usable "
                          f"core(s) ({core_ranges(mine)}) to the engine: "
                          + (f"use trainer.threads<={len(mine) - 1}" if len(mine) > 1 else
                             "this machine has too few cores: use rollout.mode=sync"))
    return CoreSplit(engine_cores(mine[trainer_threads:], threads), mine[:trainer_threads])


def pin(cores: list[int]) -> list[int] | None:
    """Restrict every thread of this process to ``cores`` (OpenMP's already-started
    threads keep their own mask, so each is set); returns the previous mask of the process,
    ``None`` where the OS has no affinity."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    before = sorted(os.sched_getaffinity(0))
    tasks = [int(tid) for tid in os.listdir("/proc/self/task")] if os.path.isdir("/proc/self/task") else [0]
    for tid in tasks:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cores)
    return before


def give_back(cores: list[int] | None) -> None:
    """Undo an async trainer's :func:`pin` (``cores``: its mask before)."""
    if cores is not None:
        pin(cores)
    os.environ.pop(CORES_ENV, None)


def local_rank() -> tuple[int, int]:
    """This process's rank among the node's (torchrun's ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``)."""
    return int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def core_ranges(cores: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    parts, start = [], None
    for i, core in enumerate(cores):
        start = core if start is None else start
        if i + 1 == len(cores) or cores[i + 1] != core + 1:
            parts.append(str(start) if start == core else f"{start}-{core}")
            start = None
    return ",".join(parts)


def describe_cores(cores: list[int], mode: str, engine_threads: int, trainer_threads: int, world: int) -> str:
    """The plan's words for :func:`core_split` of ``cores`` (the usable ones) under
    ``rollout.mode`` ``mode`` (``engine_threads``: the backend's ``threads``;
    ``trainer_threads``: ``trainer.threads``, 0 for torch's default; ``world``: ranks).

    :raises ConfigError: the split does not fit (see :func:`core_split`).
    """
    splits = [core_split(cores, engine_threads, trainer_threads, mode, world, rank) for rank in range(world)]
    of = f"of {core_ranges(cores)}"
    if mode == "async":
        split = splits[0]
        return (f"cores apart, since both compute at once (rollout.mode=async): the trainer's {trainer_threads} torch "
                f"thread(s) pinned to core(s) {core_ranges(split.trainer)} {of} (trainer.threads), the engine's "
                f"{len(split.engine)} OpenMP thread(s) on core(s) {core_ranges(split.engine)}")
    alternate = "rollout and update alternate, so they share the cores in time"
    threads = trainer_threads or torch.get_num_threads()
    if world == 1:
        engine = splits[0].engine
        return (f"cores: the engine's {len(engine)} OpenMP thread(s) on core(s) {core_ranges(engine)} {of}, "
                f"the trainer's {threads} torch thread(s) (trainer.threads) while the engine waits: {alternate}")
    ranks = ", ".join(f"rank {rank}: core(s) {core_ranges(split.engine)}" for rank, split in enumerate(splits))
    return (f"cores: each rank's engine on its share {of} ({ranks}), one OpenMP thread per core, the rank's {threads} "
            f"torch thread(s) (trainer.threads) while its engine waits: {alternate}")
