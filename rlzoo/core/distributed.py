"""Data parallelism on ``torch.distributed``: process group, batch statistics, wrapping.

rlzoo does not launch or connect processes itself: ``torchrun`` starts them and sets
``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``MASTER_ADDR``; :func:`init` joins the
process group it describes. Without those variables (a plain ``rlzoo train``) everything
here is a no-op and :data:`SINGLE` describes the one process.

What is sharded and what is reduced (docs/scaling.md):

- prompts: each rank samples and generates its own ``prompts_per_step / world`` prompts,
  whole groups, so group statistics need no communication;
- batch statistics (whitening, batch reward std, GPG's α, the KL controller's mean KL):
  the advantage stage runs inside :func:`batch_statistics`, where the full reductions of
  :mod:`rlzoo.core.masked` and :func:`batch_sum` sum over all ranks;
- losses: :class:`rlzoo.core.batch.BatchCounts` hold the global token / sequence counts and
  the loss is multiplied by ``world`` to undo DDP's gradient averaging, so N ranks
  produce the gradient of the single-process global batch;
- logs and checkpoints: rank 0 only; every rank's RNG state is gathered into the
  checkpoint so a resumed run (same N) continues exactly;
- failures: a rank that fails alone (a reward function raising or returning NaN, a
  non-finite loss) must not leave the others waiting in a collective. The ranks agree on
  it at fixed points (:func:`failing_together`, :func:`raise_failures`) and every rank
  raises the same :class:`TrainingError` naming the failed rank(s) and what failed.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterator, NoReturn

import torch

from rlzoo.core.errors import ConfigError, RlzooError, TrainingError


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands in the job.

    :ivar rank: global rank (0 for a single process).
    :ivar world: number of processes.
    :ivar local_rank: rank on this node (selects the GPU).
    """

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        """True when a process group of more than one rank is active."""
        return self.world > 1

    @property
    def is_main(self) -> bool:
        """True on the rank that writes logs and checkpoints."""
        return self.rank == 0


SINGLE = DistInfo()


def env_world_size() -> int:
    """The number of processes torchrun's environment describes (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launched_by_torchrun() -> bool:
    """True when the environment describes a job of more than one process."""
    return env_world_size() > 1


def init(backend: str, device_type: str, timeout_s: float) -> DistInfo:
    """Join the process group torchrun described, or return :data:`SINGLE`.

    :param backend: ``auto`` (nccl for CUDA, gloo for CPU), ``gloo`` or ``nccl``.
    :param device_type: ``cpu`` or ``cuda``, the device training runs on.
    :param timeout_s: seconds a collective may wait before the job fails (a dead or
        stuck rank then ends the job instead of hanging it).
    """
    if not launched_by_torchrun():
        return SINGLE
    if backend == "auto":
        backend = "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl" and device_type != "cuda":
        raise ConfigError("distributed.backend=nccl needs trainer.device=cuda (use gloo on CPU)")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return DistInfo(rank=torch.distributed.get_rank(), world=torch.distributed.get_world_size(), local_rank=local_rank)


def check_collective_failure(exc: RuntimeError) -> None:
    """Under torchrun, re-raise ``exc`` as a one-line :class:`TrainingError` when it came out
    of a ``torch.distributed`` collective (a peer process died, closed its connection or
    timed out) rather than out of this process's own work; otherwise do nothing."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_filename.replace(os.sep, "/"))
        tb = tb.tb_next
    text = str(exc)
    if not launched_by_torchrun() or not (isinstance(exc, torch.distributed.DistError)
                                          or any("torch/distributed/" in name for name in frames)
                                          or "third_party/gloo/" in text or "ProcessGroupNCCL" in text):
        return  # (the last two: a collective inside DDP's backward, raised from C++ code)
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    raise TrainingError(f"rank {os.environ.get('RANK', '?')}: a collective failed, so another process of the job "
                        f"died or stopped answering ({first}); the newest checkpoint stays resumable") from exc


def shutdown() -> None:
    """Leave the process group (if one was joined), once every rank is done with it."""
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


# ----------------------------------------------------------------------------- statistics

_BATCH_SCOPE: list[bool] = []


@contextlib.contextmanager
def batch_statistics(enabled: bool = True) -> Iterator[None]:
    """Within this block, full reductions of :mod:`rlzoo.core.masked` sum over all ranks.

    The engine computes advantages and the KL controller's batch KL inside it, so batch
    whitening and batch-level scaling see the global batch. Values only: no gradient
    flows through the reduction.
    """
    _BATCH_SCOPE.append(bool(enabled) and torch.distributed.is_available() and torch.distributed.is_initialized()
                        and torch.distributed.get_world_size() > 1)
    try:
        yield
    finally:
        _BATCH_SCOPE.pop()


def batch_sum(value: torch.Tensor) -> torch.Tensor:
    """``value`` summed over the data-parallel ranks inside :func:`batch_statistics`;
    ``value`` itself outside it or in a single process. Any shape; a new tensor.

    Plugin authors use it for a batch-level statistic that is not a full reduction of
    :mod:`rlzoo.core.masked` (e.g. a count of non-zero scores).
    """
    if not (_BATCH_SCOPE and _BATCH_SCOPE[-1]):
        return value
    reduced = value.detach().clone()
    torch.distributed.all_reduce(reduced, op=torch.distributed.ReduceOp.SUM)
    return reduced


def all_reduce_floats(values: dict[str, float], info: DistInfo, op: str = "sum") -> dict[str, float]:
    """Sum (``op="sum"``), mean or max of a ``name -> float`` dict over ranks.

    Every rank must pass the same keys (they are sorted, so order does not matter).
    """
    if not info.enabled or not values:
        return dict(values)
    keys = sorted(values)
    tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    reduce_op = torch.distributed.ReduceOp
    torch.distributed.all_reduce(tensor, op=reduce_op.MAX if op == "max" else reduce_op.SUM)
    if op == "mean":
        tensor /= info.world
    return dict(zip(keys, tensor.tolist()))


def sum_floats(values: list[float], info: DistInfo) -> list[float]:
    """``values`` summed element-wise over ranks in float64 (one collective; every rank
    passes a list of the same length); the values themselves in a single process."""
    summed = all_reduce_floats({f"{i:06d}": v for i, v in enumerate(values)}, info)
    return [summed[f"{i:06d}"] for i in range(len(values))]


def gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` in a single process."""
    if not info.enabled:
        return [obj]
    out: list[Any] = [None] * info.world
    torch.distributed.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, info: DistInfo) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not info.enabled:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def barrier(info: DistInfo) -> None:
    """Wait for every rank (no-op in a single process)."""
    if info.enabled:
        torch.distributed.barrier()


# ----------------------------------------------------------------------------- failures


def failure_text(failure: BaseException | str) -> str:
    """One line saying what failed: an rlzoo error's message, otherwise (a bug) the exception's
    type and message."""
    if isinstance(failure, str):
        return failure
    text = str(failure).strip().splitlines()[0] if str(failure).strip() else ""
    return text if isinstance(failure, RlzooError) else f"{type(failure).__name__}: {text}".rstrip(": ")


def ranks_failed_message(texts: list[str | None], fallback: str = "") -> str:
    """The one line every rank raises: which ranks failed (``texts[rank]`` is what failed
    there, ``None`` where nothing did) and what; ``fallback`` when no rank names a failure
    (a non-finite gradient after the all-reduce, say)."""
    failed = [(rank, text) for rank, text in enumerate(texts) if text is not None]
    if not failed:
        what = f"{fallback} on every rank" if fallback else "an unknown failure"
    elif len(failed) == len(texts) > 1 and len({text for _, text in failed}) == 1:  # e.g. weights, equal under DDP
        what = f"{failed[0][1]}, on every rank"
    elif len(failed) == 1:
        what = f"rank {failed[0][0]} of {len(texts)} failed: {failed[0][1]}"
    else:
        what = (f"ranks {', '.join(str(rank) for rank, _ in failed)} of {len(texts)} failed: "
                + "; ".join(f"rank {rank}: {text}" for rank, text in failed))
    return f"{what}; every rank stopped, no checkpoint of this step was written, the newest one stays resumable"


def raise_failures(failure: BaseException | str | None, info: DistInfo, fallback: str = "") -> NoReturn:
    """Raise the same :class:`TrainingError` on every rank, naming each rank's ``failure``
    (``None``: this rank did not fail). A collective (a gather of the messages): every rank
    calls it, once all of them know that some rank failed. An exception that is not an
    rlzoo error (a bug) is re-raised as it is on its own rank, traceback and all."""
    texts = gather_objects(None if failure is None else failure_text(failure), info)
    error = TrainingError(ranks_failed_message(texts, fallback))
    if isinstance(failure, BaseException):
        if not isinstance(failure, RlzooError):
            raise failure
        raise error from failure
    raise error


@contextlib.contextmanager
def failing_together(info: DistInfo) -> Iterator[None]:
    """Run a stage that one rank may fail alone (rollout and scoring: a reward function that
    raises or returns NaN on one rank's completions). On leaving it the ranks agree whether
    any of them failed, with one all-reduce of one number, and if one did every rank raises
    the same :class:`TrainingError` (:func:`raise_failures`), at once, instead of the others
    waiting in their next collective for ``distributed.timeout_s``. Nothing in a single
    process: an exception propagates as it is."""
    if not info.enabled:
        yield
        return
    failure: Exception | None = None
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - every rank learns of it below, then it is raised
        failure = exc
    if all_reduce_floats({"failed": float(failure is not None)}, info, "max")["failed"]:
        raise_failures(failure, info)


# ----------------------------------------------------------------------------- FSDP2


def fully_shard_model(module: torch.nn.Module, device: torch.device,
                      example_inputs: tuple[Any, ...] | None = None) -> torch.nn.Module:
    """Shard ``module`` with FSDP2 (``torch.distributed.fsdp.fully_shard``), in place.

    Each transformer block (a submodule whose class name ends in ``DecoderLayer``, as in
    every Hugging Face causal LM) is its own group, gathered only while it runs; the
    remaining parameters (embeddings, final norm, head, a critic's value head) form the
    root group. ``example_inputs``, when given, run one no-grad forward through the root
    so FSDP initialises with it as the root before any submodule is called on its own
    (generation calls the wrapped causal LM inside :func:`gathered`). Returns ``module``
    (now an ``FSDPModule``).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    for sub in list(module.modules()):
        if sub is not module and type(sub).__name__.endswith("DecoderLayer"):
            fully_shard(sub, mesh=mesh)
    # the root reshards after forward too, so a no-grad forward (old log-probs) leaves the
    # registered parameters sharded: the ones the optimizer holds
    fully_shard(module, mesh=mesh, reshard_after_forward=True)
    if example_inputs is not None:
        with torch.no_grad():
            module(*example_inputs)
        module.reshard()
    return module


def wrap(module: torch.nn.Module, strategy: str, device: torch.device,
         example_inputs: tuple[Any, ...] | None = None) -> torch.nn.Module:
    """``module`` under the data-parallel ``strategy`` (``ddp`` or ``fsdp``), for > 1 rank.

    Under FSDP, ``example_inputs`` (positional arguments of one small forward) initialise
    the root before any submodule runs on its own (see :func:`fully_shard_model`).
    """
    if strategy == "fsdp":
        return fully_shard_model(module, device, example_inputs)
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None)


def is_sharded(module: torch.nn.Module) -> bool:
    """True when ``module`` was sharded by :func:`fully_shard_model`."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


@contextlib.contextmanager
def gathered(module: torch.nn.Module) -> Iterator[None]:
    """Within this block the root parameters of a sharded ``module`` are whole, so its
    submodules can be called directly (generation); a no-op for other modules."""
    if not is_sharded(module):
        yield
        return
    module.unshard()
    try:
        yield
    finally:
        module.reshard()


def full_state_dict(module: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """The whole (unsharded) state dict of ``module`` on the CPU, keys without ``prefix``.

    A collective for a sharded module: every rank calls it (all receive the tensors).
    """
    if is_sharded(module):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        state = module.state_dict()
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}


def optimizer_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state dict; for a sharded module the whole state keyed by parameter
    name (a collective: every rank calls it)."""
    if not is_sharded(module):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(module, optimizer,
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                         state: dict[str, Any]) -> None:
    """Inverse of :func:`optimizer_state` (every rank calls it with the saved state)."""
    if not is_sharded(module):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(module, optimizer, optim_state_dict=state,
                             options=StateDictOptions(full_state_dict=True))


def local_value(tensor: torch.Tensor) -> torch.Tensor:
    """A plain tensor from a possibly sharded one (e.g. FSDP's gradient norm)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
