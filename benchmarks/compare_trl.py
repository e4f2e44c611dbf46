"""rlzoo vs TRL's GRPOTrainer vs the compute floor, on the same model, prompts and shapes.

    pip install -e ".[bench]"
    python benchmarks/compare_trl.py --setting tiny
    python benchmarks/compare_trl.py --setting small --write benchmarks/RESULTS.md
    python benchmarks/compare_trl.py --setting tiny --baseline ../rlzoo-main   # A/B two rlzoo versions

Each system runs in its own worker process (so peak RSS is its own) and the parent makes
them alternate, one training step at a time, so slow drifts of the machine hit all three
alike. Settings (issue 6):

- tiny: Qwen2 architecture, hidden 128, 2 layers, character vocabulary (16 tokens);
  8 prompts x 8 completions, 8 new tokens.
- small: hidden 512, 4 layers, 4 heads, 32,000-word vocabulary (dummy word-level tokens);
  8 prompts x 8 completions, 64 new tokens; KL coefficient 0 and 0.04 (reference model).

Both models come from ``rlzoo.models`` (the builder of the embedded default), saved once
and loaded by every worker. The compute floor is HF ``generate`` of the same number of
tokens with the KV cache, plus one forward/backward/optimizer step over the sequences
(plus one reference forward when KL > 0): what any GRPO implementation must spend.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

SETTINGS = {
    # micro_batch: rlzoo's sequences per forward/backward (all 64 at once where memory is no
    # concern; 16 in the small setting, where it bounds the activations kept for backward)
    "tiny": dict(hidden=128, layers=2, heads=4, kv_heads=2, vocab=None, prompts=8, n=8, new_tokens=8,
                 kls=[0.0], micro_batch=64),
    "small": dict(hidden=512, layers=4, heads=4, kv_heads=4, vocab=32_000, prompts=8, n=8,
                  new_tokens=64, kls=[0.0, 0.04], micro_batch=16),
}
LR = 1e-3
MARK = "@@rlzoo-bench@@"  # prefixes worker replies (libraries print to stdout too)


# ----------------------------------------------------------------------------- setup

def build_assets(setting: str, root: Path) -> tuple[Path, Path]:
    """Save the model + tokenizer and a JSONL of prompts; returns (model_dir, prompts)."""
    import torch
    from omegaconf import OmegaConf
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    from rlzoo.models import build_char_tokenizer, build_tiny_model

    spec = SETTINGS[setting]
    torch.manual_seed(0)
    rng = random.Random(0)
    if spec["vocab"] is None:
        tokenizer = build_char_tokenizer("0123456789=")
        prompts = ["".join(rng.choice("0123456789") for _ in range(6)) + "=" for _ in range(512)]
    else:
        words = [f"w{i}" for i in range(spec["vocab"] - 4)]
        vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(words)}}
        core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
        core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>",
                                            eos_token="</s>", unk_token="<unk>", padding_side="left")
        prompts = [" ".join(rng.choice(words) for _ in range(16)) for _ in range(512)]
    cfg = OmegaConf.create(dict(arch="qwen2", hidden_size=spec["hidden"], intermediate_size=4 * spec["hidden"],
                                num_layers=spec["layers"], num_heads=spec["heads"],
                                num_kv_heads=spec["kv_heads"]))
    model = build_tiny_model(cfg, tokenizer, max_positions=256)
    model_dir = root / f"model-{setting}"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = root / f"prompts-{setting}.jsonl"
    answer = answer_of(setting)  # a token of the vocabulary: rlzoo refuses answers its tokenizer cannot write
    data.write_text("".join(json.dumps({"prompt": p, "answer": answer}) + "\n" for p in prompts))
    return model_dir, data


def answer_of(setting: str | dict) -> str:
    """Every prompt's reference answer for the exact-match reward: one no completion can
    match, so every reward is 0, no system learns, and all of them keep generating the
    same workload (the initial policy's response lengths) at every measured step.

    With a reachable answer ("0", which tiny's character vocabulary writes in 2 tokens) the
    tiny policies learned to answer "0" and stop within ~30 steps (rlzoo's mean response
    length fell from 6.4 to 2.1 tokens), so the measured steps compared workloads that
    depended on how fast each system happened to learn. Tiny's answer is therefore longer
    than its 8-token budget; small's single word is one its random 32,000-word policy never
    produced (4,096 response tokens at every measured step)."""
    spec = SETTINGS[setting] if isinstance(setting, str) else setting
    return "0" * (spec["new_tokens"] + 1) if spec["vocab"] is None else "w0"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ----------------------------------------------------------------------------- workers

def worker_rlzoo(model_dir: Path, data: Path, spec: dict, kl: float, steps: int, bf16: bool = False):
    from transformers.utils import logging as hf_logging

    from rlzoo.config import load_config
    from rlzoo.plugins import build_registry, make_plugin_manager
    from rlzoo.trainer import Trainer

    hf_logging.set_verbosity_error()
    pm = make_plugin_manager()
    registry = build_registry(pm)
    overrides = [
        "algo=grpo", f"model.path={model_dir}", f"task={{name: file, path: {data}}}", "reward=exact_match",
        f"rollout.prompts_per_step={spec['prompts']}", f"rollout.n={spec['n']}",
        f"rollout.max_new_tokens={spec['new_tokens']}", f"trainer.lr={LR}", f"kl.coef={kl}",
        "kl.estimator=k3", "trainer.update_epochs=1", "trainer.num_mini_batches=1", f"trainer.total_steps={steps}",
        f"trainer.micro_batch_size={spec['micro_batch']}",
        "trainer.logprob_chunk_size=512", "logging.progress=false", "eval.size=0", "eval.holdout=0",
        *(["trainer.precision=bf16", "rollout.dtype=bfloat16"] if bf16 else []),
    ]
    trainer = Trainer(load_config(registry, overrides), pm)

    def step() -> dict:
        metrics = trainer.train_step()
        tokens = metrics["response_length/mean"] * spec["prompts"] * spec["n"]
        return {"step_s": metrics["timing/step_s"], "rollout_s": metrics["timing/rollout_s"],
                "update_s": metrics["timing/update_s"], "new_tokens": tokens}

    return step


def worker_floor(model_dir: Path, data: Path, spec: dict, kl: float, steps: int):
    import copy

    import torch

    from rlzoo.models import load_pretrained

    model, tokenizer = load_pretrained(model_dir)
    reference = copy.deepcopy(model).eval().requires_grad_(False) if kl > 0 else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    prompts = [json.loads(line)["prompt"] for line in data.read_text().splitlines()]
    rng = random.Random(0)

    def step() -> dict:
        batch = [p for p in rng.sample(prompts, spec["prompts"]) for _ in range(spec["n"])]
        enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False)
        start = time.perf_counter()
        model.eval()
        with torch.inference_mode():
            out = model.generate(**enc, do_sample=True, max_new_tokens=spec["new_tokens"],
                                 min_new_tokens=spec["new_tokens"], use_cache=True,
                                 pad_token_id=tokenizer.pad_token_id)
        rollout = time.perf_counter() - start
        sequences = out.clone()
        attention = torch.ones_like(sequences)
        attention[:, : enc["attention_mask"].shape[1]] = enc["attention_mask"]
        if reference is not None:
            with torch.no_grad():
                reference(input_ids=sequences, attention_mask=attention)
        model.train()
        logits = model(input_ids=sequences, attention_mask=attention).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, sequences[:, 1:, None]).squeeze(-1)
        loss = -logp[:, -spec["new_tokens"]:].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total = time.perf_counter() - start
        return {"step_s": total, "rollout_s": rollout, "update_s": total - rollout,
                "new_tokens": spec["prompts"] * spec["n"] * spec["new_tokens"]}

    return step


def worker_trl(model_dir: Path, data: Path, spec: dict, kl: float, steps: int, bf16: bool = False):
    import queue
    import threading

    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    from rlzoo.models import load_pretrained

    hf_logging.set_verbosity_error()
    model, tokenizer = load_pretrained(model_dir)
    prompts = [json.loads(line)["prompt"] for line in data.read_text().splitlines()]
    dataset = Dataset.from_dict({"prompt": prompts})

    def reward(completions, **kwargs):
        return [float(c.strip() == answer_of(spec)) for c in completions]

    go: queue.Queue = queue.Queue()
    done: queue.Queue = queue.Queue()

    class StepLock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            go.get()
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            done.put({"step_s": time.perf_counter() - self.start, "rollout_s": None, "update_s": None,
                      "new_tokens": None})

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=spec["prompts"] * spec["n"],
        num_generations=spec["n"], max_completion_length=spec["new_tokens"], learning_rate=LR,
        lr_scheduler_type="constant", beta=kl, max_steps=steps, num_iterations=1, logging_steps=10**6,
        save_strategy="no", report_to="none", use_cpu=True, bf16=bf16, disable_tqdm=True,
        gradient_accumulation_steps=1, temperature=1.0, dataloader_num_workers=0, seed=0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StepLock()])
    thread = threading.Thread(target=trainer.train, daemon=True)
    thread.start()

    def step() -> dict:
        go.put(True)
        return done.get()

    return step


WORKERS = {"rlzoo": worker_rlzoo, "rlzoo-bf16": functools.partial(worker_rlzoo, bf16=True),
           "trl": worker_trl, "trl-bf16": functools.partial(worker_trl, bf16=True), "floor": worker_floor}
BF16_SYSTEMS = ("rlzoo-bf16", "trl-bf16")
"""Systems computing in bfloat16 (rlzoo: trainer.precision=bf16 + rollout.dtype=bfloat16;
TRL: bf16=True): compared with the bf16 limit."""


# ----------------------------------------------------------------------------- the limit

def step_flops(spec: dict, prompt_tokens: int, kl: float) -> dict[str, dict[str, float]]:
    """Matmul FLOPs a GRPO step of ``spec`` cannot avoid, per phase and per kind of matmul
    (``backbone``: the layers' projections and MLP, ``head``: the LM head, ``attention``:
    QKᵀ and AV), from the model's shapes and the token counts (all completions of full
    length, the prompt prefilled once per prompt, the head only where logits are needed):

    - rollout: prefill ``prompts × P`` tokens (backbone), decode ``B × T`` tokens (backbone
      and head) with the KV cache;
    - update: forward + backward (3×) over ``B × (P + T)`` tokens, the head over ``B × T``;
    - reference (KL > 0): one forward of the same.
    """
    d, layers, ff, heads, kv = spec["hidden"], spec["layers"], 4 * spec["hidden"], spec["heads"], spec["kv_heads"]
    vocab = spec["vocab"] or 16
    kv_width = d // heads * kv
    backbone = layers * (2 * d * d + 2 * d * kv_width + 3 * d * ff)      # weights per token
    head = d * vocab
    B, T, P, G = spec["prompts"] * spec["n"], spec["new_tokens"], prompt_tokens, spec["prompts"]
    decode_ctx = P + (T + 1) / 2                                          # mean attended length
    rollout = {"backbone": 2 * backbone * (G * P + B * T), "head": 2 * head * B * T,
               "attention": 4 * layers * d * (G * P * (P + 1) / 2 + B * T * decode_ctx)}
    forward = {"backbone": 2 * backbone * B * (P + T), "head": 2 * head * B * T,
               "attention": 4 * layers * d * B * (P + T) * (P + T + 1) / 2}
    phases = {"rollout": rollout, "update": {k: 3 * v for k, v in forward.items()}}
    if kl > 0:
        phases["reference"] = dict(forward)
    return phases


def matmul_rates(spec: dict, prompt_tokens: int, threads: int) -> dict[str, dict[str, float]]:
    """FLOP/s of ``torch.matmul`` on this machine, now, for the step's shapes: per dtype
    (``float32``, ``bfloat16``), per phase (``decode``: M = B rows; ``update``: M = B × (P + T)
    rows) and per kind (``backbone``: d × 4d, ``head``: d × V); best of a few repeats."""
    import torch

    torch.set_num_threads(threads)
    d, vocab = spec["hidden"], spec["vocab"] or 16
    B = spec["prompts"] * spec["n"]
    rows = {"decode": B, "update": B * (prompt_tokens + spec["new_tokens"])}
    rates: dict[str, dict[str, float]] = {}
    for dtype in (torch.float32, torch.bfloat16):
        for phase, m in rows.items():
            for kind, n in (("backbone", 4 * d), ("head", vocab)):
                a, b = torch.randn(m, d, dtype=dtype), torch.randn(d, n, dtype=dtype)
                best = float("inf")
                for _ in range(5):
                    start = time.perf_counter()
                    for _ in range(3):
                        torch.matmul(a, b)
                    best = min(best, (time.perf_counter() - start) / 3)
                rates.setdefault(str(dtype).removeprefix("torch."), {})[f"{phase}/{kind}"] = 2 * m * d * n / best
    return rates


def limit_seconds(flops: dict[str, dict[str, float]], rates: dict[str, float]) -> float:
    """The step's time at the measured matmul rates (attention at the update rate of the
    backbone's shape): what no implementation of this step on this machine can beat."""
    total = 0.0
    for phase, kinds in flops.items():
        shape = "decode" if phase == "rollout" else "update"
        total += kinds["backbone"] / rates[f"{shape}/backbone"] + kinds["head"] / rates[f"{shape}/head"]
        total += kinds["attention"] / rates["update/backbone"]
    return total


def worker_main(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    # replies go to the original stdout; everything libraries print goes to stderr
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    spec = SETTINGS[args.setting]
    step = WORKERS[args.worker](Path(args.model_dir), Path(args.data), spec, args.kl, args.total_steps)
    print("READY", file=reply, flush=True)
    for line in sys.stdin:
        if line.strip() == "STEP":
            print(MARK + json.dumps(step()), file=reply, flush=True)
        elif line.strip() == "EXIT":
            print(MARK + json.dumps({"peak_rss_mb": peak_rss_mb()}), file=reply, flush=True)
            os._exit(0)


# ----------------------------------------------------------------------------- parent

BASELINE = "rlzoo@baseline"


class Worker:
    def __init__(self, name: str, args: argparse.Namespace, model_dir: Path, data: Path, kl: float,
                 total: int) -> None:
        self.name = name
        python, script, worker = sys.executable, __file__, name
        if name == BASELINE:  # another rlzoo checkout, with its own venv and its own copy of this script
            root = Path(args.baseline)
            python, script, worker = str(root / ".venv" / "bin" / "python"), str(root / "benchmarks" /
                                                                                   "compare_trl.py"), "rlzoo"
        cmd = [python, script, "--worker", worker, "--setting", args.setting, "--kl", str(kl),
               "--model-dir", str(model_dir), "--data", str(data), "--total-steps", str(total),
               "--threads", str(args.threads)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     stderr=None)
        self._expect("READY")

    def _expect(self, word: str) -> None:
        for line in self.proc.stdout:
            if line.strip() == word:
                return
        raise RuntimeError(f"worker {self.name} exited before {word} (exit {self.proc.wait()})")

    def _reply(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
        raise RuntimeError(f"worker {self.name} died (exit {self.proc.wait()})")

    def step(self) -> dict:
        self.proc.stdin.write("STEP\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> float:
        self.proc.stdin.write("EXIT\n")
        self.proc.stdin.flush()
        rss = self._reply()["peak_rss_mb"]
        self.proc.wait(timeout=60)
        return rss


def measure(args: argparse.Namespace, kl: float, model_dir: Path, data: Path) -> dict[str, dict]:
    total = args.warmup + args.steps
    names = [*args.systems, *([BASELINE] if args.baseline else [])]
    workers = [Worker(name, args, model_dir, data, kl, total) for name in names]
    records: dict[str, list[dict]] = {w.name: [] for w in workers}
    for i in range(total):
        for worker in workers:
            result = worker.step()
            if i >= args.warmup:
                records[worker.name].append(result)
            print(f"  kl={kl} step {i + 1}/{total} {worker.name}: {result['step_s']:.3f} s", file=sys.stderr,
                  flush=True)
    summary = {}
    for worker in workers:
        rows = records[worker.name]
        entry = {"median_step_s": statistics.median(r["step_s"] for r in rows), "peak_rss_mb": worker.close()}
        if rows[0]["rollout_s"] is not None:
            rollout = statistics.median(r["rollout_s"] for r in rows)
            update = statistics.median(r["update_s"] for r in rows)
            tokens = statistics.median(r["new_tokens"] for r in rows)
            entry.update(rollout_tok_s=tokens / rollout, update_tok_s=tokens / update)
        summary[worker.name] = entry
    return summary


def table(setting: str, results: dict[float, dict[str, dict]], limits: dict[float, dict[str, float]]) -> str:
    lines = [f"### {setting}", "",
             "| KL | system | median s/step | vs TRL | vs floor | limit s | vs limit | peak RSS (MB) | RSS vs TRL "
             "| rollout tok/s | update tok/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for kl, summary in results.items():
        trl = summary.get("trl")
        floor = summary.get("floor")
        for name, entry in summary.items():
            vs_trl = f"{entry['median_step_s'] / trl['median_step_s']:.2f}" if trl else "—"
            vs_floor = f"{entry['median_step_s'] / floor['median_step_s']:.2f}" if floor else "—"
            rss_trl = f"{entry['peak_rss_mb'] / trl['peak_rss_mb']:.2f}" if trl else "—"
            rollout = f"{entry['rollout_tok_s']:.0f}" if "rollout_tok_s" in entry else "—"
            update = f"{entry['update_tok_s']:.0f}" if "update_tok_s" in entry else "—"
            limit = limits[kl]["bfloat16" if name in BF16_SYSTEMS else "float32"]
            lines.append(f"| {kl} | {name} | {entry['median_step_s']:.3f} | {vs_trl} | {vs_floor} | "
                         f"{limit:.3f} | {entry['median_step_s'] / limit:.2f} | "
                         f"{entry['peak_rss_mb']:.0f} | {rss_trl} | {rollout} | {update} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="tiny")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per system")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured steps first")
    parser.add_argument("--kl", type=float, nargs="*", help="KL coefficients (default: the setting's)")
    parser.add_argument("--systems", nargs="+", default=["rlzoo", "trl", "floor"], choices=sorted(WORKERS))
    parser.add_argument("--baseline", metavar="DIR",
                        help="also run rlzoo from another checkout DIR (with its venv in DIR/.venv), alternating "
                        "with the others: an A/B of two rlzoo versions in one run")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--write", metavar="FILE", help="append the table to this Markdown file")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--total-steps", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.kl = args.kl[0] if isinstance(args.kl, list) else args.kl
        return worker_main(args)
    import torch

    kls = args.kl if args.kl else SETTINGS[args.setting]["kls"]
    spec = SETTINGS[args.setting]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, data = build_assets(args.setting, Path(tmp))
        from rlzoo.models import load_tokenizer

        first_prompt = json.loads(data.read_text().splitlines()[0])["prompt"]
        prompt_tokens = len(load_tokenizer(model_dir)(first_prompt, add_special_tokens=False).input_ids)
        before = matmul_rates(spec, prompt_tokens, args.threads)      # the machine now, and after the runs
        results = {kl: measure(args, kl, model_dir, data) for kl in kls}
        after = matmul_rates(spec, prompt_tokens, args.threads)
    rates = {dtype: {shape: (before[dtype][shape] + after[dtype][shape]) / 2 for shape in before[dtype]}
             for dtype in before}
    limits = {kl: {dtype: limit_seconds(step_flops(spec, prompt_tokens, kl), rates[dtype]) for dtype in rates}
              for kl in kls}
    flops = {kl: {phase: sum(kinds.values()) / 1e12 for phase, kinds in step_flops(spec, prompt_tokens, kl).items()}
             for kl in kls}
    command = "python benchmarks/compare_trl.py " + " ".join(sys.argv[1:])
    header = (f"Measured {date.today().isoformat()} on {platform.machine()} with {os.cpu_count()} cores, "
              f"torch {torch.__version__}, {args.threads} threads per worker; {args.steps} measured steps "
              f"after {args.warmup} warm-up, systems alternating step by step. Command: `{command}`")
    rate_text = "; ".join(f"{dtype} " + ", ".join(f"{shape} {rate / 1e9:.0f}" for shape, rate in shapes.items())
                          for dtype, shapes in rates.items())
    flop_text = "; ".join(f"KL {kl}: " + ", ".join(f"{phase} {tf:.3f}" for phase, tf in phases.items())
                          for kl, phases in flops.items())
    header += (f"\n\nLimit: the step's matmul FLOPs (TFLOP per step, {flop_text}) at this machine's matmul "
               f"rate for the step's shapes, measured before and after the runs (GFLOP/s, {rate_text}); "
               "`vs limit` divides each system's step by the limit of the precision it computes in.")
    text = f"{table(args.setting, results, limits)}\n\n{header}\n"
    print(text)
    if args.write:
        with open(args.write, "a") as handle:
            handle.write("\n" + text)


if __name__ == "__main__":
    main()
