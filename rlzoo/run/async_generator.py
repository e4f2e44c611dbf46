"""Asynchronous rollout: a generator process generates and scores while the trainer updates.

With ``rollout.mode=async`` the trainer starts one generator process
(``torch.multiprocessing``, spawn) that plans the run again from its saved config
(:func:`rlzoo.plan.run_input.replan`), builds the task, its own copy of the policy, the
rollout backend and the rewards as every run does (:class:`rlzoo.run.parts.RunParts`),
and then loops: take the
newest published weights, generate and score one batch (:meth:`rlzoo.rollout.sampler.Sampler.sample`),
put it, with the policy version that generated it, into a bounded queue
(``rollout.queue_size``). The trainer takes the batches in order; a batch more than
``rollout.max_staleness`` versions older than the trained policy is dropped or kept
(``rollout.stale_batches``). After every ``rollout.weight_sync_every``-th step the trainer
publishes its weights into one shared-memory copy of the policy's state (a lock guards it,
a counter names its version); the generator loads them before its next batch.

Nothing here is bit-reproducible: which version generates a batch depends on how the two
processes' timing interleaves. ``rollout.staleness=k`` (:mod:`rlzoo.rollout.staleness`) is the
reproducible form of the same staleness.

Shutdown. The generator ignores SIGINT and SIGTERM (a Ctrl-C or a scheduler signals the
whole process group; the trainer alone decides: it finishes its step, checkpoints, then
stops the generator), and gets SIGKILL from the kernel when the trainer dies
(``PR_SET_PDEATHSIG``; it also checks its parent between batches). An exception in the
generator reaches the trainer as a :class:`rlzoo.core.errors.TrainingError` naming it; a
generator that dies without one (a signal, ``os._exit``) too, with its exit code.

Resume. A checkpoint holds the prompt sampler's state after the last batch trained on
(the trainer's sampler mirrors the generator's); the batches waiting in the queue are not
saved: a resumed run's generator regenerates them, from the same prompts, with the
checkpoint's weights.
"""

from __future__ import annotations

import contextlib
import io
import os
import queue
import signal
import time
import traceback
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch
import torch.multiprocessing as mp

from rlzoo.core import processes
from rlzoo.core.batch import RolloutBatch
from rlzoo.core.errors import RlzooError, TrainingError
from rlzoo.models.hf_output import set_transformers_output
from rlzoo.models.head import FastPaths, set_fast_paths
from rlzoo.plan.records import RolloutPlan
from rlzoo.plan.run_input import replan
from rlzoo.run.parts import RunParts
from rlzoo.rollout.staleness import plain_batch
from rlzoo.core.stopping import STOP_SIGNALS, die_with_parent

POLL_S = 0.2
"""How often a waiting side checks that the other is still there."""


@dataclass
class GeneratorSpec:
    """What the generator process needs to build its side of the run (picklable).

    :ivar config_yaml: the run's resolved config (``config.yaml``'s text), planned again there.
    :ivar device: where the generator's policy copy lives (``cpu``, ``cuda:0``).
    :ivar threads: its torch threads.
    :ivar seed: seeds its sampling (another seed for each start, so a resume does not
        replay the first start's random stream).
    :ivar sampler_state: :meth:`Sampler.state_dict` to continue the prompt stream from,
        serialised with ``torch.save``.
    :ivar parent: the trainer's pid (the generator exits when it is gone).
    :ivar paths: the policy's fast paths as the trainer's load-time check decided them
        (:mod:`rlzoo.models.model_check`): the generator's copy runs the same (e.g. the cache mode).
    :ivar transformers_output: what transformers prints in the trainer
        (:func:`rlzoo.models.hf_output.transformers_output`), which the generator's fresh interpreter
        takes (it printed a ``Loading weights`` progress bar the trainer's CLI hides).
    """

    config_yaml: str
    device: str
    threads: int
    seed: int
    sampler_state: bytes
    parent: int
    paths: FastPaths
    transformers_output: tuple[int, bool] | None = None


def to_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def from_bytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)


@contextlib.contextmanager
def _stop_signals_blocked() -> Iterator[None]:
    """Hold SIGINT/SIGTERM back while the generator is spawned: the child inherits the
    blocked mask, so a Ctrl-C during its start-up (before it ignores them) cannot kill it;
    the trainer gets a signal that arrived meanwhile when the mask is restored."""
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    except (AttributeError, ValueError, OSError):  # no pthread masks here
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@dataclass
class Received:
    """A batch from the generator, as the trainer takes it (:meth:`AsyncRollout.next`).

    :ivar batch: the scored batch.
    :ivar staleness: how many versions older than the trained policy (``step − 1``) the
        batch's policy is.
    :ivar dropped: the batches before it that were beyond ``max_staleness`` under
        ``stale_batches=drop``.
    :ivar sampler_state: the generator's prompt sampler after this batch.
    :ivar reload_s: seconds the generator spent loading published weights into its policy
        and its backend (a vLLM engine's reload) before this batch and the dropped ones
        (0: it generated with the weights it had).
    """

    batch: RolloutBatch
    staleness: int
    dropped: int
    sampler_state: dict[str, Any]
    reload_s: float


class AsyncRollout:
    """The trainer's side of the generator process: start it, publish weights, take batches.

    :param plan: the run plan's rollout record (queue size, bound, what to do beyond it).
    :param spec: what the generator builds from.
    :param weights: the policy's ``(name, tensor)`` state the generator starts from.
    :param version: that state's policy version (the step it was trained after).
    """

    def __init__(self, plan: RolloutPlan, spec: GeneratorSpec,
                 weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        self.plan = plan
        context = mp.get_context("spawn")
        self.weights = {name: tensor.detach().to("cpu", copy=True).share_memory_() for name, tensor in weights}
        self.version = context.Value("q", version, lock=False)
        self.lock = context.Lock()
        self.batches = context.Queue(maxsize=plan.queue_size)
        self.errors = context.Queue()
        self.stop = context.Event()
        self.process = context.Process(target=generator_main, name="rlzoo-generator", daemon=True,
                                       args=(spec, self.weights, self.version, self.lock, self.batches,
                                             self.errors, self.stop))
        with _stop_signals_blocked():
            self.process.start()

    @property
    def pid(self) -> int | None:
        """The generator process's pid."""
        return self.process.pid

    def publish(self, version: int, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the trainer's weights after ``version`` updates into the shared state; the
        generator loads them before its next batch."""
        with self.lock, torch.no_grad():
            for name, tensor in weights:
                self.weights[name].copy_(tensor.detach())
            self.version.value = version

    def next(self, step: int) -> Received:
        """The batch step ``step`` trains on, with what came with it (:class:`Received`).

        :raises TrainingError: the generator failed or died.
        """
        dropped, reload_s = 0, 0.0
        while True:
            made_by, batch, sampler_state, reloaded = self._receive(step)
            reload_s += reloaded
            staleness = step - 1 - made_by
            if staleness > self.plan.max_staleness and self.plan.stale_batches == "drop":
                dropped += 1
                continue
            return Received(batch, staleness, dropped, sampler_state, reload_s)

    def _receive(self, step: int) -> tuple[int, RolloutBatch, dict[str, Any], float]:
        waiting_since = time.monotonic()
        while True:
            try:
                payload = self.batches.get(timeout=POLL_S)
            except queue.Empty:
                self._check(step)
                waited = time.monotonic() - waiting_since
                if waited > self.plan.generator_timeout_s:
                    raise TrainingError(
                        f"the rollout generator process (pid {self.process.pid}, rollout.mode=async) is alive but sent "
                        f"no batch for step {step} in {waited:.0f} s (rollout.generator_timeout_s="
                        f"{self.plan.generator_timeout_s:g}): it hangs (a reward function, tool or environment that "
                        "never returns?); the newest checkpoint stays resumable") from None
                continue
            item = from_bytes(payload)
            return int(item["version"]), RolloutBatch(**item["batch"]), item["sampler"], float(item["reload_s"])

    def _check(self, step: int) -> None:
        """:raises TrainingError: the generator reported an error, or is gone."""
        alive, message = self.process.is_alive(), None
        if not alive or not self.errors.empty():
            with contextlib.suppress(queue.Empty):  # a dead generator's message may still be in flight
                message = self.errors.get(timeout=2.0)
        if message is None and alive:
            return
        where = f"the rollout generator process (pid {self.process.pid}, rollout.mode=async)"
        if message is not None:
            raise TrainingError(f"{where} failed before step {step}'s batch: {message}; the newest checkpoint "
                                "stays resumable")
        code = self.process.exitcode
        how = f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0 else \
            f"exited with code {code}"
        raise TrainingError(f"{where} {how} before step {step}'s batch, without an error message (see its stderr); "
                            "the newest checkpoint stays resumable")

    def close(self, timeout: float = 5.0) -> None:
        """Stop the generator and wait for it (it holds nothing the trainer needs);
        idempotent."""
        if self.process.pid is None or self.process.exitcode is not None:
            self._close_queues()
            return
        self.stop.set()
        self.process.join(timeout=1.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=timeout)
        self._close_queues()

    def _close_queues(self) -> None:
        for channel in (self.batches, self.errors):
            channel.cancel_join_thread()
            channel.close()


# ------------------------------------------------------------------ the generator process

def _detach_signals(parent: int) -> bool:
    """Ignore the stop signals (the trainer handles them), die with the trainer; False when
    the trainer is already gone."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    with contextlib.suppress(AttributeError, ValueError, OSError):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # pending ones are now ignored
    die_with_parent(signal.SIGKILL)
    return os.getppid() == parent


class _Generator:
    """The generator's run: its sampler over its own copy of the policy."""

    def __init__(self, spec: GeneratorSpec, weights: dict[str, torch.Tensor], version: Any, lock: Any) -> None:
        self.spec, self.shared, self.version, self.lock = spec, weights, version, lock
        if spec.transformers_output is not None:
            set_transformers_output(spec.transformers_output)
        torch.set_num_threads(max(1, spec.threads))
        run = replan(spec.config_yaml)
        device = torch.device(spec.device)
        if device.type == "cpu":  # other runs count this process's threads too (the record of a
            processes.register(torch.get_num_threads())  # killed generator is removed by whoever finds it)
        parts = RunParts(run, device, seed=spec.seed, generator=True)  # its own policy copy, backend, rewards
        self.policy = parts.models.policy
        set_fast_paths(self.policy, spec.paths)  # checked by the trainer on the same model
        self.policy.eval()
        self.sampler = parts.sampler(run.setup.seed)
        self.sampler.load_state_dict(from_bytes(spec.sampler_state))
        self.prompts = run.plan.rollout.prompts_per_process
        self.loaded = -1

    def refresh(self) -> tuple[int, float]:
        """Load the newest published weights if they are new (into the policy, then its
        backend: a vLLM engine reloads them); their version and the seconds that took."""
        if self.version.value == self.loaded:
            return self.loaded, 0.0
        start = time.perf_counter()
        with self.lock, torch.no_grad():
            self.policy.load_state_dict(self.shared, strict=True)
            self.loaded = int(self.version.value)
        self.sampler.backend.sync_weights(lambda: iter(self.policy.state_dict().items()))
        return self.loaded, time.perf_counter() - start

    def produce(self) -> bytes:
        """One scored batch of the newest weights, with its version, the sampler's state and
        the time the weights took to load."""
        version, reload_s = self.refresh()
        batch = self.sampler.sample(self.prompts)
        self.sampler.rewards.settle()  # one process: the running statistics fold in each batch after it
        return to_bytes({"version": version, "batch": plain_batch(batch), "sampler": self.sampler.state_dict(),
                         "reload_s": reload_s})


def _failure(exc: BaseException) -> str:
    """One line naming the exception and where it was raised (an rlzoo error's own message
    already says what failed)."""
    if isinstance(exc, RlzooError):
        return str(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def generator_main(spec: GeneratorSpec, weights: dict[str, torch.Tensor], version: Any, lock: Any,
                   batches: Any, errors: Any, stop: Any) -> None:
    """The generator process: build, then generate until ``stop`` is set or the trainer is
    gone. An exception is sent to the trainer as one line (``errors``) and exits 1."""
    if not _detach_signals(spec.parent):
        return
    try:
        generator = _Generator(spec, weights, version, lock)
        while not stop.is_set() and os.getppid() == spec.parent:
            payload = generator.produce()
            while True:
                try:
                    batches.put(payload, timeout=POLL_S)
                    break
                except queue.Full:
                    if stop.is_set() or os.getppid() != spec.parent:
                        return
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the trainer
        errors.put(_failure(exc))
        raise SystemExit(1) from None
