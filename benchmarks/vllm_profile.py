"""Where the vLLM engine's rollout time goes on a CPU, against the roofline (issue 35).

    python benchmarks/vllm_profile.py                      # SmolLM2 (compare_trl.py's smollm2 setting), one core
    python benchmarks/vllm_profile.py --model DIR --prompts FILE.jsonl --reps 1 --max-new-tokens 4   # any model

Builds the engine exactly as ``rollout.backend=vllm`` does (:func:`rlzoo_plugins.vllm_engine.engine_kwargs`:
float32, 32-token KV blocks, prefix caching, processed log-probs; in this process, on one core,
``OMP_NUM_THREADS=1``), loads the model directory's weights through the plugin's ``Engine``
(``reload_weights`` from memory, as every sync does) and generates the smollm2 setting's
rollout: ``--prompts-per-step`` prompts of ``--prompts`` (rendered text, compare_trl.py's
``prompts-smollm2.jsonl``), ``--n`` samples each, at most ``--max-new-tokens``, temperature
``--temperature``, a fresh prefix cache before each (a sync drops it). Timers wrapped around
vLLM's own methods (nothing changed in vLLM) split every engine step into:

- ``schedule``: the scheduler's ``schedule``; ``update``: its ``update_from_output``;
- ``forward``: the model's forward, of which ``linear`` (every linear layer: qkv, o,
  gate-up, down), ``attention`` (the attention layers, paged KV cache writes included)
  and ``other`` (embedding, norms, rotary, activation, residuals);
- ``logits``: ``compute_logits`` (the LM head over the whole vocabulary);
- ``sampler``: vLLM's sampler (temperature, top-p/top-k, seeded draws, the processed log-probs);
- ``prepare``: the rest of the model runner's ``execute_model`` and ``sample_tokens`` (input
  tensors, the batch's bookkeeping); ``engine``: the rest of ``LLMEngine.step`` (output processing).

A step is a prefill step when it schedules more tokens than requests. Floors, in this process
at one thread: ``matmul floor``, torch's ``F.linear`` at the vLLM model's own shapes (qkv fused, gate and
up fused) for each decode step's batch of running sequences, plus the prefill's rows; ``torch
decode``, the transformers model's forward with a KV cache at batch ``prompts x n`` (no
sampling), per step; ``roofline``: :mod:`rlzoo.diagnostics.roofline`'s prefill and decode for
the same token counts at the matmul rates and memory bandwidth measured here now.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from rlzoo.diagnostics.roofline import linear_seconds

sys.path.insert(0, str(Path(__file__).resolve().parent))
CACHE = Path(__file__).resolve().parent / ".cache"
PARTS = ("schedule", "prepare", "linear", "attention", "other", "logits", "sampler", "update", "engine")
"""The parts of an engine step, in the order the table shows them (they sum to the step)."""


class StepTimer:
    """Wraps vLLM's methods with timers (instance attributes shadowing the methods, nothing
    in vLLM changed) and records every engine step's parts (seconds) and sizes."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []
        self.current: dict[str, float] = {}

    def add(self, part: str, seconds: float) -> None:
        self.current[part] = self.current.get(part, 0.0) + seconds

    def wrap(self, owner: Any, attr: str, part: str, after: Callable[[Any], None] | None = None) -> None:
        """Time ``owner.attr`` calls into ``part``; ``after(result)`` sees each result."""
        method = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = method(*args, **kwargs)
            self.add(part, time.perf_counter() - start)
            if after is not None:
                after(result)
            return result
        setattr(owner, attr, timed)

    def install(self, llm: Any, layers: bool = True) -> None:
        """Wrap the in-process engine's step, scheduler, model runner, sampler and, with
        ``layers``, its linear and attention layers (not inside a compiled model)."""
        engine = llm.llm_engine
        core = engine.engine_core.engine_core
        runner = core.model_executor.driver_worker.worker.model_runner

        def sizes(out: Any) -> None:
            self.current["tokens"] = float(out.total_num_scheduled_tokens)
            self.current["requests"] = float(len(out.num_scheduled_tokens))

        self.wrap(core.scheduler, "schedule", "schedule", sizes)
        self.wrap(core.scheduler, "update_from_output", "update")
        self.wrap(core.model_executor, "execute_model", "execute")
        self.wrap(core.model_executor, "sample_tokens", "sample")
        self.wrap(runner.model, "forward", "forward")
        self.wrap(runner.model, "compute_logits", "logits")
        self.wrap(runner.sampler, "forward", "sampler")
        for module in runner.model.modules() if layers else ():
            kind = type(module).__name__
            if kind.endswith("Linear") and not any(True for _ in module.children()):
                self.wrap(module, "forward", "linear")
            elif kind == "Attention":
                self.wrap(module, "forward", "attention")
        step = engine.step

        def timed_step() -> Any:
            self.current = {}
            start = time.perf_counter()
            result = step()
            c = self.current
            c["step"] = time.perf_counter() - start
            if "tokens" in c:  # a step that ran the model
                c["other"] = c.get("forward", 0.0) - c.get("linear", 0.0) - c.get("attention", 0.0)
                c["prepare"] = (c.get("execute", 0.0) + c.get("sample", 0.0) - c.get("forward", 0.0)
                                - c.get("logits", 0.0) - c.get("sampler", 0.0))
                c["engine"] = c["step"] - c["execute"] - c.get("sample", 0.0) - c["schedule"] - c["update"]
                self.steps.append(c)
            return result
        engine.step = timed_step


def split_steps(steps: list[dict[str, float]]) -> dict[str, list[dict[str, float]]]:
    """The steps as ``prefill`` (more tokens scheduled than requests) and ``decode``."""
    return {"prefill": [s for s in steps if s["tokens"] > s["requests"]],
            "decode": [s for s in steps if s["tokens"] <= s["requests"]]}


def phase_sums(steps: list[dict[str, float]]) -> dict[str, float]:
    """Seconds per part summed over ``steps``, and their count and total."""
    sums = {part: sum(s.get(part, 0.0) for s in steps) for part in ("step", *PARTS)}
    sums["count"] = float(len(steps))
    return sums


def linear_shapes(config: Any) -> list[tuple[int, int, int]]:
    """``(out_features, in_features, count)`` of the linear layers a token goes through in
    vLLM's llama (q, k and v fused; gate and up fused), per forward, and the LM head."""
    d = config.hidden_size
    head = getattr(config, "head_dim", None) or d // config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    q, k, f, layers = config.num_attention_heads * head, kv * head, config.intermediate_size, config.num_hidden_layers
    return [(q + 2 * k, d, layers), (d, q, layers), (2 * f, d, layers), (d, f, layers)]


def time_linear(rows: int, out_features: int, in_features: int, repeats: int = 5) -> float:
    """Best seconds of one float32 ``F.linear`` of ``rows`` x ``in_features`` by an
    (``out_features``, ``in_features``) weight, after a warm-up call."""
    return linear_seconds(rows, out_features, in_features, repeats=repeats)


def matmul_floor(config: Any, rows_per_step: list[int], head_rows: list[int]) -> dict[str, float]:
    """Seconds torch's ``F.linear`` needs for the backbone's linears at ``rows_per_step``
    rows in each step and the LM head at ``head_rows`` rows (the same length)."""
    cache: dict[tuple[int, int, int], float] = {}

    def linear(rows: int, out_f: int, in_f: int) -> float:
        if rows and (rows, out_f, in_f) not in cache:
            cache[rows, out_f, in_f] = time_linear(rows, out_f, in_f)
        return cache.get((rows, out_f, in_f), 0.0)

    shapes = linear_shapes(config)
    backbone = sum(linear(m, o, i) * count for m in rows_per_step for o, i, count in shapes)
    head = sum(linear(m, config.vocab_size, config.hidden_size) for m in head_rows)
    return {"backbone": backbone, "head": head}


def torch_decode(model_dir: Path, prompt_ids: list[list[int]], n: int, steps: int) -> list[float]:
    """Seconds of each of ``steps`` decode steps of the transformers model at batch
    ``len(prompt_ids) x n`` with its KV cache (float32, greedy, no stop): a plain-torch
    decode of the rollout's shape."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    width = max(map(len, prompt_ids))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompt_ids for _ in range(n)])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids for _ in range(n)])
    times = []
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        for _ in range(steps):
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            mask = torch.cat([mask, torch.ones_like(token)], 1)
            start = time.perf_counter()
            out = model(input_ids=token, attention_mask=mask, past_key_values=out.past_key_values, use_cache=True)
            times.append(time.perf_counter() - start)
    return times


@contextmanager
def one_core(core: int | None) -> Iterator[int | None]:
    """This process on ``core`` (default: the last usable), ``OMP_NUM_THREADS=1`` and vLLM's
    in-process engine, set before torch and vLLM load."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    if hasattr(os, "sched_setaffinity"):
        core = sorted(os.sched_getaffinity(0))[-1] if core is None else core
        os.sched_setaffinity(0, [core])
    yield core


def profile(args: argparse.Namespace) -> dict[str, Any]:
    """Run the engine and the floors; returns the measurements (see the module docstring)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    from rlzoo.diagnostics.roofline import (DTYPE_BYTES, ModelShapes, StepWork, machine, matmul_rates,
                                            memory_bandwidth, roofline)
    from rlzoo_plugins.vllm_engine import Engine, EngineSpec, engine_kwargs
    from rlzoo_plugins.vllm_rollout import max_model_len

    model_dir = Path(args.model)
    config = AutoConfig.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    need = args.prompts_per_step * (args.reps + 1)
    texts = [rows[i % len(rows)]["prompt"] for i in range(need)]
    prompts = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    batches = [prompts[i:i + args.prompts_per_step] for i in range(0, need, args.prompts_per_step)]

    import vllm

    kv_bytes = args.kv_cache_mb << 20
    spec = EngineSpec(config_dir=str(model_dir), dtype="float32", device="cpu", cores=None,
                      max_model_len=max_model_len(config, kv_bytes, torch.float32), kv_cache_bytes=kv_bytes,
                      gpu_memory_utilization=0.0, sleep=False, parent=os.getppid(), compile=args.compile)
    weights = load_file(model_dir / "model.safetensors")
    if getattr(config, "tie_word_embeddings", False) and "lm_head.weight" not in weights:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    start = time.perf_counter()
    engine = Engine(vllm.LLM(**engine_kwargs(spec)), weights)
    build_s = time.perf_counter() - start
    timer = StepTimer()
    timer.install(engine.llm, layers=not args.compile)

    def request(batch: list[list[int]], n: int, tokens: int, seed: int) -> dict[str, Any]:
        return {"prompts": batch, "n": n, "max_new_tokens": tokens, "temperature": args.temperature,
                "top_p": 1.0, "greedy": False, "seed": seed, "eos_id": tokenizer.eos_token_id}

    def run(batch: list[list[int]], n: int, tokens: int, seed: int) -> tuple[float, list, list[dict]]:
        engine.llm.reset_prefix_cache()
        timer.steps = []
        start = time.perf_counter()
        groups = engine.generate(request(batch, n, tokens, seed))
        return time.perf_counter() - start, groups, timer.steps

    run(batches[0], args.n, args.max_new_tokens, 0)  # warm-up
    rollouts = []
    for rep, batch in enumerate(batches[1:]):
        wall, groups, steps = run(batch, args.n, args.max_new_tokens, rep + 1)
        lengths = [len(ids) for group in groups for ids, _, _ in group]
        prefill_shared = run(batch, args.n, 1, rep + 1)[0]
        prefill_single = run(batch, 1, 1, rep + 1)[0]
        rollouts.append({"wall": wall, "lengths": lengths, "steps": steps, "prompt_tokens": list(map(len, batch)),
                         "prefill_n": prefill_shared, "prefill_1": prefill_single})

    # floors, for the median rollout's token counts
    middle = sorted(rollouts, key=lambda r: r["wall"])[len(rollouts) // 2]
    phases = split_steps(middle["steps"])
    decode_rows = [int(s["requests"]) for s in phases["decode"]]
    prefill_rows = [int(s["tokens"]) for s in phases["prefill"]]
    floor = matmul_floor(config, prefill_rows + decode_rows,
                         [int(s["requests"]) for s in phases["prefill"]] + decode_rows)
    shapes = ModelShapes.from_config(config)
    lengths = middle["lengths"]
    work = StepWork(groups=args.prompts_per_step, sequences=args.prompts_per_step * args.n,
                    prompt_tokens=statistics.mean(middle["prompt_tokens"]), new_tokens=statistics.mean(lengths),
                    decode_steps=max(lengths))
    rates = matmul_rates(shapes, work, threads=1, dtypes=("float32",))["float32"]
    bandwidth = max(memory_bandwidth(threads=1).values())
    roof = roofline(shapes, work, rates, bandwidth, DTYPE_BYTES["float32"])
    decode = torch_decode(model_dir, batches[1], args.n, args.max_new_tokens) if args.torch_decode else []
    return {"build_s": build_s, "compile": args.compile,
            "machine": machine(), "torch": torch.__version__, "vllm": vllm.__version__, "rollouts": rollouts,
            "median": middle, "matmul_floor": floor, "roofline": {k: roof[k] for k in ("prefill", "decode")},
            "rates": rates, "bandwidth": bandwidth, "torch_decode": decode}


def report(result: dict[str, Any], args: argparse.Namespace) -> str:
    """The measurements as Markdown: the rollouts, the median one's parts, the floors."""
    walls = [r["wall"] for r in result["rollouts"]]
    middle = result["median"]
    phases = split_steps(middle["steps"])
    sums = {name: phase_sums(steps) for name, steps in phases.items()}
    lines = [f"Rollouts (s): {', '.join(f'{w:.2f}' for w in walls)}; median {statistics.median(walls):.2f} s, "
             f"{sum(middle['lengths'])} new tokens, {len(phases['decode'])} decode steps, prompts "
             f"{statistics.mean(middle['prompt_tokens']):.1f} tokens on average.",
             f"Prefill alone (max_tokens=1, s): {args.n} samples per prompt {middle['prefill_n']:.3f}, one sample per "
             f"prompt {middle['prefill_1']:.3f} ({middle['prefill_n'] / middle['prefill_1']:.2f}x).", "",
             "| phase | steps | step s | " + " | ".join(f"{p} s" for p in PARTS) + " |",
             "|---|---|---|" + "---|" * len(PARTS)]
    for name, s in sums.items():
        lines.append(f"| {name} | {s['count']:.0f} | {s['step']:.3f} | " + " | ".join(f"{s[p]:.3f}" for p in PARTS)
                     + " |")
    floor, roof = result["matmul_floor"], result["roofline"]
    decode = phases["decode"]
    full = [s["step"] for s in decode if s["requests"] == max(s2["requests"] for s2 in decode)] if decode else []
    lines += ["", f"Matmul floor (torch F.linear at vLLM's shapes, these steps' rows): backbone "
              f"{floor['backbone']:.3f} s, head {floor['head']:.3f} s; vLLM's linear + logits: "
              f"{sums['prefill']['linear'] + sums['decode']['linear']:.3f} + "
              f"{sums['prefill']['logits'] + sums['decode']['logits']:.3f} s.",
              f"Roofline (float32 matmul GFLOP/s decode/backbone {result['rates']['decode/backbone'] / 1e9:.0f}, "
              f"decode/head {result['rates']['decode/head'] / 1e9:.0f}, update/backbone "
              f"{result['rates']['update/backbone'] / 1e9:.0f}; {result['bandwidth'] / 1e9:.1f} GB/s): prefill "
              f"{roof['prefill']:.3f} s, decode {roof['decode']:.3f} s, sum {roof['prefill'] + roof['decode']:.3f} s."]
    if full:
        lines.append(f"A decode step at the full batch: vLLM median {statistics.median(full) * 1e3:.1f} ms "
                     f"({len(full)} steps)" + (f"; the transformers model's forward, the same batch, median "
                                               f"{statistics.median(result['torch_decode']) * 1e3:.1f} ms"
                                               if result["torch_decode"] else "") + ".")
    how = "compiled by vLLM (--compile)" if result["compile"] else "eager (the plugin's default)"
    lines.append(f"Engine {how}, built and loaded in {result['build_s']:.1f} s. Measured on {result['machine']}, "
                 f"torch {result['torch']}, vLLM {result['vllm']}, one core.")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(CACHE / "smollm2-135m-instruct"), help="a model directory "
                   "(default: compare_trl.py's converted SmolLM2)")
    p.add_argument("--prompts", default=str(CACHE / "prompts-smollm2.jsonl"), help="JSON lines with rendered "
                   "'prompt' text (default: compare_trl.py's smollm2 prompts)")
    p.add_argument("--prompts-per-step", type=int, default=4)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--reps", type=int, default=3, help="measured rollouts after one warm-up")
    p.add_argument("--kv-cache-mb", type=int, default=1024)
    p.add_argument("--core", type=int, help="the core to run on (default: the last)")
    p.add_argument("--torch-decode", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the transformers model's decode at the same batch")
    p.add_argument("--compile", action="store_true", help="the engine as rollout.backend.compile=true builds it "
                   "(vLLM compiles the model with torch inductor; the layers are not timed apart)")
    p.add_argument("--json", help="also write the measurements here")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    for path in (args.model, args.prompts):
        if not Path(path).exists():
            sys.exit(f"vllm_profile: {path} does not exist; python benchmarks/compare_trl.py --setting smollm2 makes "
                     "the default model directory and prompts")
    with one_core(args.core):
        result = profile(args)
    text = report(result, args)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
