"""Rollout in bfloat16 beside a float32 trainer: speed and the mismatch it creates.

    python benchmarks/rollout_dtype.py --setting small --rounds 6

Builds the model of a ``compare_trl.py`` setting (random weights, the same shapes), then
alternates, round by round, the ``hf`` rollout backend in float32 (on the policy itself)
and in bfloat16 (on a synced copy, ``rollout.dtype=bfloat16``) on the same prompts and
shapes (``prompts`` × ``n`` completions of ``new_tokens`` tokens, temperature 1). For each
bfloat16 rollout it scores the sampled tokens with the float32 policy and reports
``rollout/mismatch_k3`` (mean per-token k3 of log π_fp32 − log μ_bf16, as the trainer logs
it) and the largest |log-ratio|; the float32 rollout's own mismatch is the control (0 up to
the rounding of a second forward). Times are medians over the rounds (the first round of
each dtype is a warm-up and dropped); the ratio is bf16 / fp32 of the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_trl import SETTINGS, build_assets  # noqa: E402


def main() -> None:
    import torch

    from rlzoo.learn.learner import mismatch_metrics
    from rlzoo.models.logprobs import ResponseForward
    from rlzoo.models.build import load_pretrained
    from rlzoo.contract.loading import build_registry, make_plugin_manager
    from rlzoo.core.tokens import left_pad

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="small")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = SETTINGS[args.setting]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, prompt_file = build_assets(args.setting, Path(tmp))
        policy, tokenizer = load_pretrained(model_dir, "float32")
        policy.eval()
        prompts = [json.loads(line)["prompt"] for line in prompt_file.read_text().splitlines()][: spec["prompts"]]
    token_lists = tokenizer(prompts, add_special_tokens=False).input_ids
    hf = build_registry(make_plugin_manager()).get("rollout", "hf")
    device = torch.device("cpu")
    backends = {dtype: hf(policy=policy, tokenizer=tokenizer, device=device, dtype=dtype,
                          generation_context=lambda: torch.no_grad()) for dtype in ("float32", "bfloat16")}
    forward = ResponseForward(policy)
    times: dict[str, list[float]] = {d: [] for d in backends}
    mismatch: dict[str, list[float]] = {d: [] for d in backends}
    largest: dict[str, float] = {d: 0.0 for d in backends}
    for round_ in range(args.rounds + 1):
        for dtype, backend in (backends.items() if round_ % 2 == 0 else reversed(backends.items())):
            torch.manual_seed(round_)
            start = time.perf_counter()
            gen = backend.generate(token_lists, num_samples=spec["n"], max_new_tokens=spec["new_tokens"],
                                   temperature=1.0, top_p=1.0)
            elapsed = time.perf_counter() - start
            if round_ == 0:
                continue  # warm-up
            times[dtype].append(elapsed)
            ids, mask = left_pad(token_lists, tokenizer.pad_token_id)
            ids, mask = ids.repeat_interleave(spec["n"], 0), mask.repeat_interleave(spec["n"], 0)
            with torch.no_grad():
                logp, _, _ = forward(ids, mask, gen.response_ids, gen.response_mask, temperature=1.0)
            found = mismatch_metrics(logp, gen.logp, gen.response_mask)
            mismatch[dtype].append(float(found["mismatch_k3"]))
            largest[dtype] = max(largest[dtype], float(found["max_abs_log_ratio"]))
            print(f"round {round_} {dtype}: {elapsed:.2f} s, mismatch_k3 {mismatch[dtype][-1]:.2e}", flush=True)
    fp32, bf16 = statistics.median(times["float32"]), statistics.median(times["bfloat16"])
    print(f"\n| rollout ({args.setting}: {spec['prompts']}x{spec['n']} x {spec['new_tokens']} tokens, "
          f"{args.threads} threads) | s per rollout (median of {args.rounds}) | vs float32 | "
          "rollout/mismatch_k3 (mean) | max abs log-ratio |")
    print("|---|---|---|---|---|")
    for dtype, median in (("float32", fp32), ("bfloat16", bf16)):
        print(f"| {dtype} | {median:.2f} | {median / fp32:.2f} | {statistics.fmean(mismatch[dtype]):.2e} | "
              f"{largest[dtype]:.3f} |")


if __name__ == "__main__":
    main()
