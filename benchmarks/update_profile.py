"""Where rlzoo's rollout, update and reference pass spend their time, op by op (issue 46, "every
phase at its roofline"): one warm-up ``train_step`` of a benchmarks/compare_trl.py setting, then
``--steps`` steps whose rollout (the ``hf`` backend's loop) and learner passes run under
``torch.profiler``; the ops' own (self) CPU
time grouped into matmuls, attention, the LM head's softmax, element-wise work, copies, the
optimizer and the rest, beside the phase's roofline (rlzoo/diagnostics/roofline.py, at the
matmul rates and memory bandwidth measured in the same process before the steps).

    python benchmarks/update_profile.py --setting smollm2 --threads 1

With one thread the ops' self CPU time is their wall time; the profiler's own cost is in the
phase's wall time (printed beside it, and beside the same phase of the warm-up step, which
ran without the profiler).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

from compare_trl import SETTINGS, build_assets, prompt_tokens, rlzoo_overrides, step_work
from rlzoo.diagnostics.roofline import ModelShapes, matmul_rates, memory_bandwidth, roofline

GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm")),
    ("attention", ("scaled_dot_product", "flash_attention", "_efficient_attention", "aten::_softmax_backward")),
    ("head softmax", ("aten::_log_softmax", "aten::log_softmax", "aten::exp", "aten::logsumexp", "aten::sub_",
                      "aten::gather", "aten::scatter", "aten::sum", "aten::max")),
    ("optimizer", ("adam",)),
    ("copies", ("aten::copy_", "aten::clone", "aten::contiguous", "aten::cat", "aten::to", "aten::_to_copy",
                "aten::index", "aten::empty", "aten::zero_", "aten::fill_", "aten::zeros", "aten::ones")),
    ("element-wise", ("aten::mul", "aten::add", "aten::div", "aten::rsqrt", "aten::pow", "aten::mean", "aten::silu",
                      "aten::neg", "aten::sigmoid", "aten::where", "aten::masked", "aten::clamp", "aten::sqrt",
                      "aten::_fused_rms_norm", "aten::rms_norm", "aten::slice_backward", "aten::threshold",
                      "aten::sub", "aten::minimum", "aten::maximum", "aten::abs", "aten::log", "aten::tanh")),
)
"""Op-name fragments of each group, first match wins (lower-case compare); the rest is ``other``
(autograd's bookkeeping, views, Python-side functions' own time)."""


def group_of(name: str) -> str:
    """The :data:`GROUPS` entry an op's name falls in, or ``other``."""
    low = name.lower()
    for group, fragments in GROUPS:
        if any(fragment.lower() in low for fragment in fragments):
            return group
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", default="smollm2", choices=sorted(SETTINGS))
    parser.add_argument("--kl", type=float, default=None, help="KL coefficient (default: the setting's first)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=1, help="profiled steps after the warm-up step")
    parser.add_argument("--top", type=int, default=20, help="ops listed by self time")
    parser.add_argument("--cache", type=Path, default=Path(__file__).parent / ".cache")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = SETTINGS[args.setting]
    kl = args.kl if args.kl is not None else spec["kls"][0]

    from transformers.utils import logging as hf_logging

    from rlzoo.contract.loading import build_registry, make_plugin_manager
    from rlzoo.plan.run_input import load_run
    from rlzoo.run.trainer import Trainer

    hf_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        args.cache.mkdir(parents=True, exist_ok=True)
        model_dir, data = build_assets(args.setting, Path(tmp), args.cache)
        shapes, prompt_len = ModelShapes.from_config(model_dir), prompt_tokens(model_dir, data)
        budget = step_work(spec, prompt_len, 0.0, {})
        rates, bandwidth = matmul_rates(shapes, budget, args.threads), max(memory_bandwidth(args.threads).values())
        pm = make_plugin_manager()
        trainer = Trainer(load_run(build_registry(pm), rlzoo_overrides(model_dir, data, spec, kl, 1 + args.steps)),
                          pm)
        learner, models = trainer.learner, trainer.models
        walls: dict[str, float] = defaultdict(float)
        profiles: dict[str, list] = defaultdict(list)
        active = [False]

        def profiled(name: Callable[..., str], method: Callable) -> Callable:
            def wrapper(*a, **k):
                key, start = name(*a), time.perf_counter()
                if not active[0]:
                    try:
                        return method(*a, **k)
                    finally:
                        walls["warm-up " + key] += time.perf_counter() - start
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                    out = method(*a, **k)
                walls[key] += time.perf_counter() - start
                profiles[key].append(prof.key_averages())
                return out
            return wrapper

        learner._logp_pass = profiled(lambda module, *_: "reference" if module is models.reference_forward else "old",
                                      learner._logp_pass)
        learner.update = profiled(lambda *_: "update", learner.update)
        backend = trainer.sampler.backend
        backend.generate = profiled(lambda *_, **__: "rollout", backend.generate)
        trainer.train_step()
        active[0] = True
        lengths = []
        for _ in range(args.steps):
            metrics = trainer.train_step()
            lengths.append(metrics.get("response_length/mean", float("nan")))
    mean = sum(lengths) / len(lengths)
    entry = {"new_tokens": mean * spec["prompts"] * spec["n"], "decode_steps": spec["new_tokens"]}
    seconds = roofline(shapes, step_work(spec, prompt_len, kl, entry), rates["float32"], bandwidth, 4)
    phases = {"update": seconds["update"] + seconds["optimizer"], "reference": seconds.get("reference", float("nan")),
              "rollout": seconds["prefill"] + seconds["decode"]}
    print(f"setting {args.setting}, KL {kl}, {args.threads} thread(s), {args.steps} profiled step(s) after one "
          f"warm-up; mean completion {mean:.1f} tokens; torch {torch.__version__}")
    for key in ("rollout", "update", "reference"):
        if key not in profiles:
            continue
        per_op: dict[str, float] = defaultdict(float)
        calls: dict[str, int] = defaultdict(int)
        for averages in profiles[key]:
            for event in averages:
                per_op[event.key] += event.self_cpu_time_total / 1e6 / args.steps
                calls[event.key] += event.count // args.steps
        grouped: dict[str, float] = defaultdict(float)
        for name, seconds in per_op.items():
            grouped[group_of(name)] += seconds
        wall = walls[key] / args.steps
        print(f"\n{key}: {wall:.3f} s a step under the profiler ({walls['warm-up ' + key]:.3f} s in the warm-up "
              f"step, without it); roofline {phases.get(key, float('nan')):.3f} s (matmul FLOPs at the measured "
              f"rates; the update's with AdamW's bytes, the decode's with its weights' and KV cache's, at "
              f"{bandwidth / 1e9:.1f} GB/s)")
        total = sum(grouped.values())
        print("| group | s | share of the ops' time |\n|---|---|---|")
        for group in [g for g, _ in GROUPS] + ["other"]:
            print(f"| {group} | {grouped[group]:.3f} | {grouped[group] / total:.1%} |")
        print(f"| all ops | {total:.3f} | |\n\n| op | calls | self s | group |\n|---|---|---|---|")
        for name, seconds in sorted(per_op.items(), key=lambda kv: -kv[1])[:args.top]:
            print(f"| `{name}` | {calls[name]} | {seconds:.3f} | {group_of(name)} |")


if __name__ == "__main__":
    main()
