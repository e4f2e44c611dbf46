"""``rlzoo rm``'s run: train a reward model from preference pairs (Bradley–Terry).

``rm.data=task`` generates the pairs from the configured task and reward
(:func:`rlzoo.tasks.pairs.task_pairs`: a gold score for every answer); otherwise ``rm.data``
is a preference file (:func:`rlzoo.tasks.pairs.load_pairs`). The model scores prompt +
response exactly as the ``reward_model`` reward function will (:mod:`rlzoo.models.reward_model`)
and minimises the Bradley–Terry loss (:mod:`rlzoo.learn.bradley_terry`).

A share ``rm.eval_fraction`` of the pairs (chosen by ``seed``) is held out; every
``rm.eval_every`` steps and after the last, ``eval/accuracy`` is the share of held-out
pairs with r(chosen) > r(rejected) (``eval/loss`` their loss). Step ``s`` trains on the
next ``rm.batch_size`` pairs of a seeded shuffle per epoch, a function of ``s`` alone, so
a resumed run sees the pairs an uninterrupted one would.

The backbone is the embedded tiny model (``model.*``, a character tokenizer over the
task's and the data's characters) or ``model.path``; the head starts at zero. The run
directory, locking, atomic checkpoints (``checkpoints/step_*/reward_model/``, optimizer
and RNG state) and ``resume=`` are those of ``rlzoo train`` (:mod:`rlzoo.run.rundir`,
:mod:`rlzoo.run.checkpoint`); the trained model is written to ``<run_dir>/reward_model/``,
which ``reward={name: reward_model, path: <run_dir>/reward_model}`` loads.

Under torchrun (``launcher.nproc=N`` re-runs it there, as ``rlzoo train``) each rank trains
on its contiguous share of a step's pairs and DDP averages the gradients, so a step is the
one process's step; rank 0 evaluates, logs and writes; the checkpoint holds every rank's
RNG state, and a resume needs the same number of processes.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from rlzoo.core import distributed
from rlzoo.core.dtypes import DTYPES
from rlzoo.core.errors import ConfigError, TrainingError, say
from rlzoo.core.rng import global_rng_state, set_global_rng_state
from rlzoo.learn.bradley_terry import PairScorer, bradley_terry, evaluate_pairs
from rlzoo.learn.optim import adamw
from rlzoo.models.build import build_char_tokenizer, build_tiny_model, load_pretrained, load_tokenizer, unreadable_model
from rlzoo.models.reward_model import from_causal_lm, read_scorer
from rlzoo.plan.records import RunPlan
from rlzoo.plan.run_input import RunInput
from rlzoo.plan.settings import RewardModelPlan
from rlzoo.run.checkpoint import STATE_FILE, WRITE_ERRORS, check_optimizer_fits, write_error
from rlzoo.run.parts import RunParts, device_type
from rlzoo.run.rundir import RM_MODEL_DIR, RunDirectory
from rlzoo.run.tracking import Tracker
from rlzoo.tasks.pairs import (COLUMNS, MARGIN, TASK_DATA, Pair, batch_rows, load_pairs, split_pairs, task_pairs,
                               tie_warning)
from rlzoo.tasks.task import Holdout


TINY_CONTEXT = 1024
"""How far the embedded tiny backbone's context grows to cover the longest pair of the data
(tokens = characters; it is at least the policy's, ``4 × (rollout.max_new_tokens + 64)``):
longer texts keep their last tokens (:class:`PairScorer`), so one long row cannot make the
model, and its attention, grow without bound."""


def _initial_model(parts: RunParts, pairs: list[Pair]) -> tuple[torch.nn.Module, Any]:
    """The reward model to start from: ``model.path``'s backbone, or the tiny default with a
    character tokenizer over the task's alphabet and every character of the pairs."""
    model = parts.plan.model
    if model.path:
        policy, tokenizer = load_pretrained(model.path, model.dtype)
    else:
        chars = set(parts.task.alphabet or "")
        for pair in pairs:
            chars |= pair.characters()
        tokenizer = build_char_tokenizer("".join(sorted(chars)))
        longest = max((len(p.prompt) + max(len(p.chosen), len(p.rejected)) for p in pairs
                       if all(isinstance(x, str) for x in (p.prompt, p.chosen, p.rejected))), default=0)
        context = max(model.tiny.max_positions, min(longest + 8, TINY_CONTEXT))
        policy = build_tiny_model(model.tiny, tokenizer, context)
        policy = policy.to(DTYPES[model.dtype])
    return from_causal_lm(policy), tokenizer


def describe(rm: RewardModelPlan, plan: RunPlan, task_name: str, train: int, held: int) -> str:
    """The ``plan.txt`` of an ``rlzoo rm`` run."""
    backbone = plan.model.path or plan.model.tiny.describe()
    o = plan.optimizer
    return ("# reward-model run (rlzoo rm)\n"
            f"data: {rm.data if rm.data != TASK_DATA else f'task {task_name} ranked by its reward'}: "
            f"{train} training pairs, {held} held out (rm.eval_fraction {rm.eval_fraction})\n"
            f"model: {backbone} with a one-output score head on the last token's hidden state (starts at 0)\n"
            f"loss: Bradley-Terry, mean over pairs of -log sigmoid(r_chosen - r_rejected - margin)\n"
            f"update: {rm.steps} steps of {rm.batch_size} pairs, AdamW lr {o.lr:g}, "
            f"grad norm clipped at {o.max_grad_norm}\n"
            f"output: {RM_MODEL_DIR}/ (reward={{name: reward_model, path: <run_dir>/{RM_MODEL_DIR}}})\n")


def _write_model(model: torch.nn.Module, tokenizer: Any, out: Path) -> None:
    """Save ``model`` + ``tokenizer`` to ``out`` atomically (a temporary directory renamed)."""
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except WRITE_ERRORS as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise TrainingError(f"cannot write the reward model to {out}: {write_error(exc, out.parent)}") from exc


def run_rm(run: RunInput, rm: RewardModelPlan, overwrite: bool = False) -> Path:
    """Train a reward model as ``rm`` says, with ``run``'s model, task, optimizer and run
    directory; returns the directory it wrote.

    :raises ConfigError: no ``rm.data``, a bad preference file, or a run directory that
        cannot be used, before anything is trained.
    """
    if not rm.data:
        raise ConfigError("rlzoo rm trains on preference pairs: set rm.data to a .jsonl or .parquet file with "
                          f"{', '.join(COLUMNS)} (and optionally {MARGIN}) columns, or rm.data={TASK_DATA} for "
                          "pairs ranked by the task's reward")
    compute = run.plan.compute
    kind = device_type(compute)
    check_world(rm.batch_size, distributed.env_world_size())
    dist = distributed.init(compute.backend, kind, compute.timeout_s)
    device = torch.device(kind, dist.local_rank) if kind == "cuda" and dist.enabled else torch.device(kind)
    parts = RunParts(run, device)  # seeded, as a run builds its parts: the task, its reward, the model's shape
    seed = run.setup.seed
    pairs = _task_pairs(parts, rm.task_pairs, seed) if rm.data == TASK_DATA else load_pairs(rm.data)
    warning = tie_warning(pairs, rm.data)
    if warning is not None and dist.is_main:
        say(f"rlzoo: warning: {warning}")
    if len(pairs) < 2 and rm.eval_fraction > 0:
        raise ConfigError(f"rm.data {rm.data!r} holds {len(pairs)} pair: hold none out with rm.eval_fraction=0")
    train_rows, held_rows = split_pairs(len(pairs), rm.eval_fraction, seed)
    if len(train_rows) < rm.batch_size and dist.is_main:
        say(f"rlzoo: warning: rm.eval_fraction={rm.eval_fraction:g} leaves {len(train_rows)} of {len(pairs)} pairs "
            f"for training, fewer than rm.batch_size={rm.batch_size}: each step repeats them; lower "
            "rm.eval_fraction (or rm.batch_size)")
    run_dir = RunDirectory(run.setup.run_dir, run.setup.resume, dist, overwrite, trained=RM_MODEL_DIR)
    try:
        out = _train(rm, parts, run_dir, pairs, train_rows, held_rows, dist)
    except RuntimeError as exc:
        distributed.check_collective_failure(exc)  # a dead peer: one line, not a traceback
        raise
    finally:
        run_dir.close()
    distributed.shutdown()  # on an error the process exits instead, and torchrun stops the others
    return out


def _task_pairs(parts: RunParts, count: int, seed: int) -> list[Pair]:
    """``rm.data=task``'s pairs: :func:`rlzoo.tasks.pairs.task_pairs` over the run's task,
    ranked by its one reward function, its held-out prompts excluded.

    :raises ConfigError: the run's reward is not one function.
    """
    rewards = [fn for fn, _ in parts.reward_functions()]
    if len(rewards) != 1:
        raise ConfigError(f"rm.data={TASK_DATA} ranks answers by one reward function; reward names {len(rewards)}")
    return task_pairs(parts.task, parts.task_name, rewards[0], Holdout(parts.plan.eval.holdout), count, seed)


def check_world(batch_size: int, world: int) -> None:
    """:raises ConfigError: ``rm.batch_size`` does not split into equal shares over ``world``
    processes (each rank trains on ``rm.batch_size / world`` pairs a step)."""
    if world > 1 and batch_size % world:
        raise ConfigError(f"rm.batch_size={batch_size} does not split over {world} processes: each trains "
                          f"on an equal share of a step's pairs; use a multiple of {world}")


def _train(rm: RewardModelPlan, parts: RunParts, run_dir: RunDirectory, pairs: list[Pair], train_rows: list[int],
           held_rows: list[int], dist: distributed.DistInfo) -> Path:
    run, device = parts.run, parts.device
    plan, seed, o = run.plan, run.setup.seed, run.plan.optimizer
    step, state = 0, None
    if run_dir.resume_from is not None:
        state = run_dir.load_state()
        path = run_dir.resume_from / RM_MODEL_DIR
        with unreadable_model(path):  # as rlzoo train reads a checkpoint's policy: a pickle is refused
            model = read_scorer(path, plan.model.dtype)
            tokenizer = load_tokenizer(path)
    else:
        model, tokenizer = _initial_model(parts, pairs)
    model.to(device).train()
    scorer = PairScorer(model, tokenizer, rm.chat_template, device)  # evaluation: the model itself, on rank 0
    trained = PairScorer(distributed.wrap(model, "ddp", device) if dist.enabled else model, tokenizer,
                         rm.chat_template, device)  # DDP averages the ranks' gradients
    optimizer = adamw(model.parameters(), o.lr, o.betas, o.weight_decay)
    plan_text = describe(rm, plan, parts.task_name, len(train_rows), len(held_rows))
    models = {RM_MODEL_DIR: model, f"{RM_MODEL_DIR}:tokenizer": tokenizer}

    def save() -> None:  # every rank calls it (the RNG states are gathered); rank 0 writes
        rng = distributed.gather_objects(global_rng_state(), dist)
        run_dir.save_checkpoint(step, models, {"step": step, "optimizer": optimizer.state_dict(),
                                               "world_size": dist.world, "rng": rng[0] if len(rng) == 1 else rng},
                                keep=plan.cadence.checkpoint_keep)

    if state is None:
        with run_dir.starting():
            run_dir.start(run.setup.config_yaml, plan_text, model, tokenizer)
            save()
    else:
        where = run_dir.resume_from / STATE_FILE
        try:
            step = int(state["step"])
            optimizer.load_state_dict(state["optimizer"])
            check_optimizer_fits(optimizer, where)
            rng = state["rng"]
            if int(state.get("world_size", 1)) != dist.world:
                raise ValueError(f"it was written by {state.get('world_size', 1)} processes, this run has {dist.world}")
            set_global_rng_state(rng[dist.rank] if isinstance(rng, list) else rng)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise ConfigError(f"{where} does not fit this run ({type(exc).__name__}: {exc}); was it written by "
                              "another run?") from exc
        run_dir.record_resume(step, run.setup.resume_changes, plan_text)
    if dist.is_main:
        print(plan_text, end="", flush=True)
    tracker = Tracker(str(run_dir.path), purge_step=step + 1 if state is not None else None) if dist.is_main else None
    held = [pairs[i] for i in held_rows]
    total, status = rm.steps, "failed"
    try:
        while step < total:
            step += 1
            rows = batch_rows(train_rows, rm.batch_size, step, seed)
            share = len(rows) // dist.world  # this rank's contiguous share of the step's pairs
            batch = [pairs[i] for i in rows[dist.rank * share:(dist.rank + 1) * share]]
            chosen, rejected, margin = trained(batch)
            loss = bradley_terry(chosen, rejected, margin).mean()  # DDP's mean over ranks: the mean over all pairs
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            clip = math.inf if o.max_grad_norm is None else o.max_grad_norm  # null: measure the norm, never clip
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if not torch.isfinite(loss) or not torch.isfinite(grad_norm):
                raise TrainingError(f"non-finite loss or gradient at rm step {step}; the newest checkpoint stays "
                                    f"resumable with `rlzoo rm resume={run_dir.path}`")
            optimizer.step()
            metrics = distributed.all_reduce_floats(
                {"rm/loss": float(loss.detach()), "rm/accuracy": float((chosen > rejected).float().mean()),
                 "rm/reward_gap": float((chosen - rejected).detach().mean())}, dist, op="mean")
            metrics.update({"grad_norm": float(grad_norm), "lr": o.lr})
            last = step == total
            every = rm.eval_every
            if held and (last or (every and step % every == 0)) and dist.is_main:
                model.eval()
                metrics.update(evaluate_pairs(scorer, held, rm.batch_size))
                model.train()
            if tracker is not None and (step % plan.cadence.log_every == 0 or last or "eval/accuracy" in metrics):
                tracker.log_scalars(step, metrics)
            if dist.is_main and (step == 1 or last or step % max(1, total // 10) == 0):
                shown = " ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k in ("rm/loss", "eval/accuracy"))
                print(f"rlzoo rm: step {step}/{total} {shown}", flush=True)
            if last or (plan.cadence.checkpoint_every and step % plan.cadence.checkpoint_every == 0):
                if tracker is not None:
                    tracker.flush()
                save()
        out = run_dir.path / RM_MODEL_DIR
        run_dir.on_main(lambda: _write_model(model, tokenizer, out))
        status = "completed"
        return out
    finally:
        if tracker is not None:
            tracker.close()
        run_dir.write_status(status, step, total, quiet=status != "completed")
