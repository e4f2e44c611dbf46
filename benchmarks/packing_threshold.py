"""When packing a micro-batch pays: the learner packed against padded, alternating on the same batches.

    python benchmarks/packing_threshold.py --half tuning      # the embedded model: where PACK_OVERHEAD_FLOPS came from
    python benchmarks/packing_threshold.py --half held-out   # other shapes and tasks: does the rule pick the faster?

For each configuration a trainer samples ``--steps`` batches; on each, the learner's passes
and update (``Learner.prepare`` + ``Learner.update``) run once with every micro-batch packed
(``PACK_OVERHEAD_FLOPS`` 0) and once padded, in alternating order, from the same weights (each
run on a copy of the batch; the update's weights move on, which timing does not care about).
Printed per configuration: the share of the padded positions packing removes (over every
micro-batch of the steps), the median time ratio packed / padded, the rule's decision (pack
when the share is at least the model's ``rlzoo.models.packing.pack_min_share``:
``PACK_OVERHEAD_FLOPS`` over its matmul FLOPs per token) and whether that was the faster
choice. Timings are ratios taken in one process, one torch thread.

The tuning half (the embedded default model, 2 layers of width 64, on its default task with
longer response budgets) is what ``PACK_OVERHEAD_FLOPS`` was chosen on: the share where
packing stops being slower there. The held-out half (other widths, depths and tasks)
reports the rule.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import tempfile
import time
from datetime import date

import torch
from transformers.utils import logging as hf_logging

from rlzoo.contract.loading import build_registry, make_plugin_manager
from rlzoo.diagnostics.roofline import machine
from rlzoo.models import packing
from rlzoo.models.head import fast_paths, set_fast_paths
from rlzoo.plan.run_input import load_run
from rlzoo.run.trainer import Trainer

HALVES = {
    "tuning": [[f"rollout.max_new_tokens={n}"] for n in (7, 10, 14, 20, 28)],
    "held-out": [
        ["model.hidden_size=128", "model.intermediate_size=512", "model.num_layers=4", f"rollout.max_new_tokens={n}"]
        for n in (8, 16, 32)] + [
        ["task=arithmetic", "reward=exact_match", f"rollout.max_new_tokens={n}"] for n in (6, 12, 24)],
}
"""Overrides of the default run per configuration; ``rollout.max_new_tokens`` sets how
ragged the batches are (the random initial policy stops at EOS anywhere in the budget)."""


def measure(overrides: list[str], steps: int) -> tuple[float, float, float]:
    """``(share of padded positions packing removes, median time packed / padded, the
    model's pack_min_share)``."""
    hf_logging.set_verbosity_error()
    pm = make_plugin_manager()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(load_run(build_registry(pm), ["trainer.threads=1", "eval.size=0", "logging.progress=false",
                                                        f"run_dir={tmp}/run", *overrides]), pm)
        policy, reference = trainer.models.policy, trainer.models.reference
        checked = dataclasses.replace(fast_paths(policy), pack_min_share=0.0)   # every micro-batch packed
        if checked.packing == packing.PADDED:
            raise SystemExit(f"{overrides}: the model check left this model padded")
        threshold = packing.pack_min_share(policy)
        ratios, real, padded = [], 0.0, 0.0
        for step in range(steps):
            batch = trainer._produce()
            for rows in torch.arange(len(batch)).split(trainer.plan.update.micro_batch_size):
                mb = batch.select(rows)
                real += float(mb.prompt_mask.sum() + mb.response_mask.sum())
                padded += len(mb) * (mb.prompt_ids.shape[1] + mb.response_ids.shape[1])
            seconds = {}
            for layout in ((checked.packing, packing.PADDED) if step % 2 else (packing.PADDED, checked.packing)):
                for model in (policy, reference):
                    if model is not None:
                        set_fast_paths(model, dataclasses.replace(checked, packing=layout))
                copied = copy.deepcopy(batch)
                start = time.perf_counter()
                trainer.learner.prepare(copied)
                trainer.learner.update(copied)
                seconds[layout] = time.perf_counter() - start
            if step:                                           # the first step warms up
                ratios.append(seconds[checked.packing] / seconds[packing.PADDED])
        trainer.run_dir.close()
    return 1 - real / padded, statistics.median(ratios), threshold


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--half", choices=sorted(HALVES), default="tuning")
    parser.add_argument("--steps", type=int, default=13, help="batches per configuration (the first warms up)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = [f"Measured {date.today().isoformat()} on {machine()}, torch {torch.__version__}, one thread; "
             f"{args.steps - 1} batches per configuration after one warm-up. Command: `python "
             f"benchmarks/packing_threshold.py --half {args.half} --steps {args.steps}`", "",
             "| configuration | padding removed | time packed / padded | the model's pack_min_share | rule | right? |",
             "|---|---|---|---|---|---|"]
    for overrides in HALVES[args.half]:
        share, ratio, threshold = measure(overrides, args.steps)
        pack = share >= threshold
        lines.append(f"| {' '.join(overrides)} | {share:.1%} | {ratio:.3f} | {threshold:.3f} | "
                     f"{'pack' if pack else 'pad'} | {'yes' if pack == (ratio < 1) else 'no'} |")
        print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
