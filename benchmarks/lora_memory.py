"""Peak RSS of a LoRA run against full fine-tuning with a KL reference, same work.

Each configuration trains in a fresh process (``rlzoo train`` through :func:`rlzoo.commands.cli.main`)
and reports that process's peak resident set size (``VmHWM``: ``benchmarks/peak_rss.py``, as every
benchmark reads it), after a baseline process that only imports rlzoo, torch and transformers and builds the
registry. Full fine-tuning holds the policy, a frozen reference copy, gradients and two
AdamW moments per weight; LoRA holds the policy once (the reference is the same model with
its adapters disabled) and gradients and moments for the adapters only.

    python benchmarks/lora_memory.py                          # the embedded tiny default
    python benchmarks/lora_memory.py --model-path DIR --task arithmetic --reward numeric_match
    python benchmarks/lora_memory.py --stages ...            # peak after each stage of one step

Timings on a shared machine are not comparable; memory is.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
CHILD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(BENCHMARKS)}
"""The children's environment: one thread, and ``benchmarks/`` importable for :mod:`peak_rss`."""

CHILD = """
import json, sys
from peak_rss import peak_rss_mb
from rlzoo.commands.cli import main
from rlzoo.contract.loading import load_registry
argv = json.loads(sys.argv[1])
load_registry()
rc = main(argv) if argv else 0
print("PEAK_MIB", json.dumps({"rc": rc, "peak_mib": peak_rss_mb()}))
"""

STAGES = """
import json, sys
from peak_rss import peak_rss_mb
from rlzoo.contract.loading import load_registry
from rlzoo.plan.run_input import load_run
from rlzoo.run.trainer import Trainer

def peak(stage):
    print(f"| {stage} | {peak_rss_mb():.0f} |", flush=True)

pm, registry = load_registry()
peak("imported")
trainer = Trainer(load_run(registry, json.loads(sys.argv[1])), pm)
peak("models built")
trainer.run_dir.start(trainer.run_input.setup.config_yaml, trainer.plan.render(), trainer.models.saveable_initial(),
                      trainer.models.tokenizer)
peak("init_model/ written")
batch = trainer.sampler.sample(trainer.ctx.prompts)
peak("rollout")
trainer.learner.prepare(batch)
peak("old and reference passes")
trainer.learner.update(batch)
peak("update (forward, backward, AdamW)")
trainer.save()
peak("checkpoint written")
trainer.close()
"""


def stages(argv: list[str]) -> str:
    """The peak RSS (MiB) after each stage of one training step, as Markdown rows."""
    proc = subprocess.run([sys.executable, "-c", STAGES, json.dumps(argv)], capture_output=True, text=True,
                          env=CHILD_ENV)
    if proc.returncode:
        raise SystemExit(f"stages of {' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
    return "\n".join(line for line in proc.stdout.splitlines() if line.startswith("|"))


def peak_rss_mib(argv: list[str]) -> float:
    """Peak RSS in MiB of a fresh process running ``rlzoo`` with ``argv`` (nothing: import only)."""
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(argv)], capture_output=True, text=True,
                          env=CHILD_ENV)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PEAK_MIB ")]
    if proc.returncode or not lines:
        raise SystemExit(f"rlzoo {' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1].split(" ", 1)[1])
    if result["rc"]:
        raise SystemExit(f"rlzoo {' '.join(argv)} exited {result['rc']}:\n{proc.stderr[-3000:]}")
    return result["peak_mib"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", help="a local model directory (default: the embedded tiny model)")
    parser.add_argument("--task", default=None, help="task name (default: the default task)")
    parser.add_argument("--reward", default=None, help="reward name (default: the task's)")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank (default 8)")
    parser.add_argument("--steps", type=int, default=2, help="training steps per run (default 2)")
    parser.add_argument("--extra", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for both runs")
    parser.add_argument("--stages", action="store_true", help="also the peak after each stage of a step")
    args = parser.parse_args()
    common = ["algo=grpo", "kl.coef=0.04", f"trainer.total_steps={args.steps}", "eval.size=0",
              "logging.progress=false", "logging.sample_every=0", "trainer.threads=1", "checkpoint.every=0"]
    if args.model_path:
        common.append(f"model.path={args.model_path}")
    if args.task:
        common.append(f"task={args.task}")
    if args.reward:
        common.append(f"reward={args.reward}")
    common += args.extra
    with tempfile.TemporaryDirectory() as tmp:
        baseline = peak_rss_mib([])
        full = peak_rss_mib(["train", *common, f"run_dir={Path(tmp) / 'full'}"])
        lora = peak_rss_mib(["train", *common, f"model.lora.rank={args.rank}", f"run_dir={Path(tmp) / 'lora'}"])
    print("| run | peak RSS (MiB) | above import (MiB) |\n|---|---|---|")
    print(f"| import rlzoo, torch, transformers | {baseline:.0f} | 0 |")
    print(f"| full fine-tuning + reference copy | {full:.0f} | {full - baseline:.0f} |")
    print(f"| LoRA rank {args.rank}, reference = adapters off | {lora:.0f} | {lora - baseline:.0f} |")
    print(f"\nLoRA / full above import: {(lora - baseline) / max(full - baseline, 1e-9):.2f}x; overrides: "
          f"{' '.join(common)}")
    if args.stages:
        with tempfile.TemporaryDirectory() as tmp:
            for name, extra in (("full fine-tuning", []), (f"LoRA rank {args.rank}", [f"model.lora.rank={args.rank}"])):
                print(f"\n{name}, peak RSS (MiB) after each stage of one step:\n\n| stage | peak |\n|---|---|")
                print(stages([*common, *extra, f"run_dir={Path(tmp) / name.split()[0]}"]))


if __name__ == "__main__":
    main()
