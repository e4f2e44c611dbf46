"""The vLLM engine process of the ``vllm`` rollout backend (:mod:`rlzoo_plugins.vllm_rollout`).

The trainer never imports vLLM: it spawns this process (``torch.multiprocessing``, spawn),
which builds one ``vllm.LLM`` in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no further
engine-core or worker process) and serves the trainer's requests over a pipe:

- ``("generate", request)`` -> ``("ok", [[(token_ids, logprobs, stopped), ...n], ...prompts])``;
- ``("sync", None)`` -> ``("ok", seconds)``: reload every weight from the shared-memory
  buffers the trainer has just filled (the model runner's ``reload_weights``, which also
  redoes the CPU backend's oneDNN repacking; ``load_weights`` alone fails there), then drop
  the prefix cache, whose keys and values the old weights computed;
- ``("info", None)`` -> ``("ok", {...})``: threads, cores, peak RSS;
- ``("stop", None)``: exit.

A failure is answered ``("error", one line)``; the trainer raises it. The engine is built
with dummy weights from the policy's ``config.json`` and then loaded from the trainer's
weights in memory, so a local model directory, a converted GGUF file, the embedded tiny model,
a resumed checkpoint and merged LoRA adapters all reach it the same way, never through disk.

CPU threads: the parent spawns this process with ``OMP_NUM_THREADS`` and, where it binds,
``OMP_PLACES``/``OMP_PROC_BIND`` set (OpenMP reads them when the library loads), and the
process restricts itself to its cores before vLLM starts; vLLM's own binding
(``VLLM_CPU_OMP_THREADS_BIND``) belongs to its multi-process executor, which is not used.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from rlzoo.api import die_with_parent, STOP_SIGNALS


@dataclass
class EngineSpec:
    """What the engine process builds (picklable).

    :ivar config_dir: a directory holding the policy's ``config.json`` (no weights).
    :ivar dtype: the engine's dtype (``float32``, ``bfloat16``, ``float16``).
    :ivar device: ``cpu`` or ``cuda``.
    :ivar cores: CPU cores the process may run on (None: leave its affinity as inherited).
    :ivar max_model_len: prompt plus completion tokens one sequence may hold.
    :ivar kv_cache_bytes: the KV cache's size on a CPU (None on CUDA: a memory fraction).
    :ivar gpu_memory_utilization: CUDA: the share of the GPU's memory vLLM may take.
    :ivar sleep: CUDA: release the weights' and KV cache's GPU memory between rollouts.
    :ivar parent: the trainer's pid (the engine exits when it is gone).
    :ivar compile: vLLM's compilation of the model instead of eager execution.
    """

    config_dir: str
    dtype: str
    device: str
    cores: list[int] | None
    max_model_len: int
    kv_cache_bytes: int | None
    gpu_memory_utilization: float
    sleep: bool
    parent: int
    compile: bool = False


CPU_BLOCK_TOKENS = 32
"""KV-cache block size on a CPU: the smallest the CPU attention takes (its default is 128).
The n samples of a prompt share its prefill only through whole cached blocks: with 128-token
blocks a 50-token prompt shares none, and prefilling 4 prompts for 8 samples each took 7.8×
the time of one sample each; with 32-token blocks 3.4× (SmolLM2, one core, alternating)."""


def engine_kwargs(spec: EngineSpec) -> dict[str, Any]:
    """The ``vllm.LLM`` keyword arguments of ``spec``.

    ``processed_logprobs``: the log-probs of the distribution the tokens are drawn from
    (after temperature and top-p), not of the raw logits. ``generation_config="vllm"``:
    none of the model's generation defaults (extra EOS ids, a repetition penalty) apply,
    only what each request asks, as in rlzoo's own decode loop. ``enforce_eager`` unless
    ``spec.compile``: vLLM's compilation costs a minute or more at every start.
    """
    kwargs: dict[str, Any] = dict(
        model=spec.config_dir, dtype=spec.dtype, load_format="dummy", skip_tokenizer_init=True,
        logprobs_mode="processed_logprobs", generation_config="vllm", enforce_eager=not spec.compile,
        max_model_len=spec.max_model_len, enable_prefix_caching=True, seed=0)
    if spec.device == "cpu":
        kwargs["kv_cache_memory_bytes"] = spec.kv_cache_bytes
        kwargs["block_size"] = CPU_BLOCK_TOKENS
    else:
        kwargs["gpu_memory_utilization"] = spec.gpu_memory_utilization
        kwargs["enable_sleep_mode"] = spec.sleep
    return kwargs


class Engine:
    """One ``vllm.LLM`` with the trainer's weights; see the module docstring.

    :param llm: the engine (or a stand-in with ``generate``, ``collective_rpc``,
        ``reset_prefix_cache``, ``sleep`` and ``wake_up``: tests drive it with one).
    :param weights: the shared-memory buffers the trainer fills before each ``sync``.
    :param sleep: put the engine to sleep after each rollout (CUDA sleep mode).
    :param sampling_params: ``vllm.SamplingParams`` (a stand-in in tests).
    """

    def __init__(self, llm: Any, weights: dict[str, torch.Tensor], sleep: bool = False,
                 sampling_params: Any = None) -> None:
        self.llm, self.weights, self.sleep = llm, weights, sleep
        if sampling_params is None:
            from vllm import SamplingParams as sampling_params
        self.sampling_params = sampling_params
        self.asleep = False
        self.sync()

    def _wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def sync(self) -> float:
        """Load the weights in the shared buffers; returns the seconds it took."""
        start = time.perf_counter()
        self._wake()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(self.weights.items())})
        self.llm.reset_prefix_cache()
        return time.perf_counter() - start

    def generate(self, request: dict[str, Any]) -> list[list[tuple[list[int], list[float], bool]]]:
        """``request["n"]`` completions of each of ``request["prompts"]`` (token-id lists),
        each ``(token_ids, logprobs of the sampled tokens, stopped at a stop token)``, in
        the order of their sample index."""
        self._wake()
        greedy = bool(request["greedy"])
        params = [self.sampling_params(
            n=int(request["n"]), max_tokens=int(request["max_new_tokens"]),
            temperature=0.0 if greedy else float(request["temperature"]),
            top_p=1.0 if greedy else float(request["top_p"]),
            stop_token_ids=[int(request["eos_id"])], logprobs=0, detokenize=False,
            seed=None if greedy else int(request["seed"]) + i * int(request["n"]))
            for i in range(len(request["prompts"]))]  # sample j of prompt i: seed + i·n + j
        outputs = self.llm.generate([{"prompt_token_ids": list(ids)} for ids in request["prompts"]], params,
                                    use_tqdm=False)
        if self.sleep:
            self.llm.sleep(level=1)
            self.asleep = True
        result = []
        for output in outputs:
            completions = sorted(output.outputs, key=lambda c: c.index)
            result.append([(list(c.token_ids), [entry[token].logprob for entry, token in zip(c.logprobs, c.token_ids)],
                            c.finish_reason == "stop") for c in completions])
        return result


def _failure(exc: BaseException) -> str:
    """One line naming the exception and where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}{where}"


def _detach(parent: int) -> bool:
    """Ignore the stop signals (the trainer decides when to stop), die with the trainer;
    False when the trainer is already gone."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    with contextlib.suppress(AttributeError, ValueError, OSError):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    die_with_parent(signal.SIGKILL)
    return os.getppid() == parent


def info() -> dict[str, Any]:
    """The engine process's threads, cores and peak RSS (MB)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return {"threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "cores": cores, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def engine_main(spec: EngineSpec, weights: dict[str, torch.Tensor], conn: Any) -> None:
    """The engine process: build, answer ``ready`` (with :func:`info` and the vLLM
    version), then serve requests until ``stop``, a closed pipe or the trainer's death."""
    if not _detach(spec.parent):
        return
    try:
        if spec.cores is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, spec.cores)
        start = time.perf_counter()
        warnings.filterwarnings("ignore", category=FutureWarning)  # vLLM's own, nothing a user can act on
        import vllm

        engine = Engine(vllm.LLM(**engine_kwargs(spec)), weights, sleep=spec.sleep and spec.device != "cpu")
        conn.send(("ready", {**info(), "version": vllm.__version__, "build_s": time.perf_counter() - start}))
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the trainer
        conn.send(("error", _failure(exc)))
        raise SystemExit(1) from None
    while True:
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError):
            return
        if kind == "stop":
            return
        try:
            if kind == "generate":
                conn.send(("ok", engine.generate(payload)))
            elif kind == "sync":
                conn.send(("ok", engine.sync()))
            elif kind == "info":
                conn.send(("ok", info()))
            else:
                conn.send(("error", f"unknown request {kind!r}"))
        except Exception as exc:  # noqa: BLE001 - answered, the engine stays up
            conn.send(("error", _failure(exc)))
