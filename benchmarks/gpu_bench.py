"""rlzoo (hf rollout backend) and TRL's GRPOTrainer on one CUDA GPU, bfloat16, SmolLM2-shaped (issue 35).

    pip install -e ".[bench]"                                       # torch, transformers, TRL: nothing more
    python benchmarks/gpu_bench.py --write benchmarks/RESULTS.md    # on a CUDA machine
    python benchmarks/gpu_bench.py --device cpu --steps 1 --warmup 0 --layers 1 --new-tokens 4 --prompts 2 --n 2

The last line is the smoke test (a one-layer model on the CPU, seconds); the first is the
benchmark. The model has SmolLM2-135M-Instruct's shape (llama, hidden 576, 30 layers, 9 heads
/ 3 KV heads, MLP 1,536, a 49,152-token vocabulary, tied head: 134.5 M weights), built from
config with random weights and a word-level dummy tokenizer (``compare_trl.py``'s
``smollm2-shape`` setting): nothing is downloaded. Work per step: 8 prompts of 16 words x 8
completions of 128 new tokens (the random policy writes no EOS, and the exact-match reward's
answer is one no completion can write: every step has the same full-length workload), lr
1e-5, KL 0.04 (k3) with a reference copy, one optimizer step per rollout.

Systems, each in its own process (its peak GPU memory its own), alternating step by step
(``compare_trl.measure``):

- ``rlzoo-bf16``: ``trainer.device=cuda trainer.precision=bf16 rollout.dtype=bfloat16`` with
  the default ``hf`` rollout backend (rlzoo's KV-cache loop; no vLLM);
- ``trl-bf16``: ``GRPOTrainer`` with ``bf16=True`` on the GPU (``model.generate``).

Activation checkpointing is off in both (rlzoo's default; TRL's ``GRPOConfig`` defaults to on,
which this benchmark overrode only from 2026-11-28) or on in both (``--gradient-checkpointing``).

Reported per system: the median step, the rollout's tokens per second (rlzoo:
``timing/rollout_s``; TRL: its ``_generate`` timed by the worker), the peak GPU memory torch
allocated (``torch.cuda.max_memory_allocated``; what the caching allocator reserved on top
is not counted) and the card's name. ``--write`` replaces (or appends) this benchmark's
section of the Markdown file.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_trl import SETTINGS, build_assets, measure  # noqa: E402
from race_trl import write_section  # noqa: E402

SECTION = "## GPU: SmolLM2-shaped, rlzoo and TRL on CUDA in bfloat16 (issue 35)"
SETTING = "smollm2-shape"
SYSTEMS = ["rlzoo-bf16", "trl-bf16"]


def table(summary: dict[str, dict]) -> str:
    """One row per system: median step, rollout seconds and tokens/s, peak GPU memory."""
    lines = ["| system | median s/step | vs TRL | rollout s | rollout tok/s | new tokens/step | peak GPU MB |",
             "|---|---|---|---|---|---|---|"]
    trl = summary.get("trl-bf16")
    for name, entry in summary.items():
        vs_trl = f"{entry['median_step_s'] / trl['median_step_s']:.2f}" if trl else "—"
        gpu = f"{entry['peak_gpu_mb']:.0f}" if "peak_gpu_mb" in entry else "—"
        lines.append(f"| {name} | {entry['median_step_s']:.3f} | {vs_trl} | {entry['rollout_s']:.3f} | "
                     f"{entry['rollout_tok_s']:.0f} | {entry['new_tokens']:.0f} | {gpu} |")
    return "\n".join(lines)


def device_name(device: str) -> str:
    """The card (``cuda``) or the CPU it ran on."""
    import torch

    from rlzoo.diagnostics.roofline import machine

    return torch.cuda.get_device_name() if device == "cuda" else machine()


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per system")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured steps first")
    parser.add_argument("--layers", type=int, help="decoder layers (default: SmolLM2's 30)")
    parser.add_argument("--prompts", type=int, help="prompts per step (default 8)")
    parser.add_argument("--n", type=int, help="completions per prompt (default 8)")
    parser.add_argument("--new-tokens", type=int, help="new tokens per completion (default 128)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per worker")
    parser.add_argument("--micro-batch", type=int, help="rlzoo's sequences per forward/backward "
                        "(trainer.micro_batch_size; default: all of a step's, prompts x n)")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="recompute activations in backward in rlzoo and TRL (default: off in both)")
    parser.add_argument("--write", metavar="FILE", help="replace or append this benchmark's section of FILE")
    args = parser.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False); "
                     "--device cpu runs the smoke test")
    spec = dict(SETTINGS[SETTING])
    changes = {"layers": args.layers, "prompts": args.prompts, "n": args.n, "new_tokens": args.new_tokens}
    spec.update({key: value for key, value in changes.items() if value is not None})
    spec["micro_batch"] = args.micro_batch or spec["prompts"] * spec["n"]  # default: one forward/backward
    spec["gradient_checkpointing"] = args.gradient_checkpointing
    kl = spec["kls"][0]
    run = argparse.Namespace(setting=SETTING, spec=spec, device=args.device, threads=args.threads, baseline=None,
                             steps=args.steps, warmup=args.warmup, systems=SYSTEMS, eval=False, eval_size=None)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, data = build_assets(SETTING, Path(tmp), spec=spec)
        summary = measure(run, kl, model_dir, data)
    wall = time.perf_counter() - start
    import transformers
    import trl

    command = "python benchmarks/gpu_bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = (f"{SECTION}\n\n{table(summary)}\n\nMeasured {date.today().isoformat()} on {device_name(args.device)} "
            f"({args.device}), torch {torch.__version__}, transformers {transformers.__version__}, TRL "
            f"{trl.__version__}; {spec['layers']} layers, {spec['prompts']} prompts x {spec['n']} completions of "
            f"{spec['new_tokens']} new tokens, KL {kl} with a reference copy, bfloat16, rlzoo micro-batch "
            f"{spec['micro_batch']}, activation checkpointing {'on' if args.gradient_checkpointing else 'off'} in "
            f"both; {args.steps} measured steps "
            f"after {args.warmup} warm-up, systems alternating step by step; the whole run took {wall:.0f} s. "
            f"Settings: the docstring of benchmarks/gpu_bench.py. Command: `{command}`\n")
    print(text)
    if args.write:
        write_section(Path(args.write), text, SECTION)
    return text


if __name__ == "__main__":
    main()
