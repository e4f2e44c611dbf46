"""``rlzoo rm``: train a reward model from preference pairs (Bradley–Terry).

``rm.data=task`` generates the pairs from the configured task and reward
(:func:`task_pairs`: a gold score for every answer). Otherwise each row of ``rm.data``
(``.jsonl`` or ``.parquet``) holds a ``prompt``, a ``chosen`` and a
``rejected`` response (text, or chat messages: lists of ``{"role", "content"}``) and
optionally a ``margin`` (a number ≥ 0, default 0). The model scores prompt + response
exactly as the ``reward_model`` reward function will (:mod:`rlzoo.models.reward_model`) and
minimises the Bradley–Terry loss of Ouyang et al. (2022), with Llama 2's margin::

    loss = mean over pairs of −log σ(r(prompt, chosen) − r(prompt, rejected) − margin)

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
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AutoModelForSequenceClassification

from rlzoo.core import distributed
from rlzoo.core.errors import ConfigError, TrainingError, say
from rlzoo.core.rng import global_rng_state, set_global_rng_state
from rlzoo.plan.planner import PlannedConfig
from rlzoo.plan.records import RunPlan
from rlzoo.plan.run_input import engine_input
from rlzoo.rollout.parts import RunParts, device_type
from rlzoo.core.tokens import left_pad
from rlzoo.learn.learner import adamw
from rlzoo.core.dtypes import DTYPES
from rlzoo.models.build import build_char_tokenizer, build_tiny_model, load_pretrained, load_tokenizer, unreadable_model
from rlzoo.models.reward_model import (
    Text,
    context_length,
    cut_warning,
    encode,
    fit_context,
    from_causal_lm,
    plain_text,
    reward_text,
    sequence_scores,
    uses_chat_template,
)
from rlzoo.run.checkpoint import STATE_FILE, WRITE_ERRORS, check_optimizer_fits, write_error
from rlzoo.run.rundir import RM_MODEL_DIR, RunDirectory
from rlzoo.run.tracking import Tracker
from rlzoo.tasks.task import Holdout, read_rows

COLUMNS = ("prompt", "chosen", "rejected")
MARGIN = "margin"


@dataclass(frozen=True)
class Pair:
    """One preference: ``chosen`` is preferred to ``rejected`` as an answer to ``prompt``."""

    prompt: Text
    chosen: Text
    rejected: Text
    margin: float = 0.0


def _text_or_messages(value: Any) -> bool:
    if isinstance(value, str):
        return True
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value)


def load_pairs(path: str | Path) -> list[Pair]:
    """The preference pairs of a ``.jsonl`` / ``.parquet`` file.

    :raises ConfigError: a missing, unreadable or empty file, or a row without a column,
        with a value that is neither text nor chat messages, with an empty prompt and an
        empty response, or a margin that is not a finite number ≥ 0 (file, row and column
        named).
    """
    path = Path(path)
    rows = read_rows(path, "preference file")
    if not rows:
        raise ConfigError(f"preference file {str(path)!r} holds no pairs")
    pairs = []
    for number, row in enumerate(rows, 1):
        where = f"preference file {str(path)!r} row {number}"
        if not isinstance(row, dict):
            raise ConfigError(f"{where} is a {type(row).__name__}, not an object with {', '.join(COLUMNS)}")
        for column in COLUMNS:
            if column not in row:
                raise ConfigError(f"{where} has no {column!r} column (columns: {', '.join(map(str, row)) or 'none'}; "
                                  f"a pair needs {', '.join(COLUMNS)} and may have {MARGIN!r})")
            if not _text_or_messages(row[column]):
                raise ConfigError(f"{where} column {column!r} is {str(row[column])[:80]!r}: give text or chat "
                                  'messages ([{"role": ..., "content": ...}, ...])')
        for column in ("chosen", "rejected"):
            if not plain_text(row["prompt"]) + plain_text(row[column]):
                raise ConfigError(f"{where}: 'prompt' and {column!r} are both empty: the reward model would read no "
                                  "text; drop the row or give it text")
        margin = row.get(MARGIN)
        margin = 0.0 if margin is None else margin
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin < 0:
            raise ConfigError(f"{where} column {MARGIN!r} is {margin!r}: a margin is a finite number >= 0")
        pairs.append(Pair(row["prompt"], row["chosen"], row["rejected"], float(margin)))
    return pairs


def tie_warning(pairs: list[Pair], source: str) -> str | None:
    """A warning when some pairs have ``chosen == rejected`` (a tie: its loss is
    ``log(1 + e^m)`` whatever the model scores, so it teaches nothing), ``None`` when none do.

    :raises ConfigError: every pair is a tie (the run could learn nothing).
    """
    ties = [number for number, pair in enumerate(pairs, 1) if pair.chosen == pair.rejected]
    if not ties:
        return None
    rows = ", ".join(map(str, ties[:5])) + (", ..." if len(ties) > 5 else "")
    if len(ties) == len(pairs):
        raise ConfigError(f"rm.data {source!r}: chosen == rejected in every pair ({len(pairs)}): the reward model "
                          "cannot learn a preference from ties; give pairs whose responses differ")
    return (f"rm.data {source!r}: chosen == rejected in {len(ties)} of {len(pairs)} pairs (rows {rows}): they "
            "add a constant to the loss and teach nothing")


TASK_DATA = "task"
"""``rm.data=task``: pairs generated from the configured task and its reward (:func:`task_pairs`)."""


def _swap_two(text: str, rng: random.Random) -> str:
    if len(text) < 2:
        return text
    i, j = rng.sample(range(len(text)), 2)
    chars = list(text)
    chars[i], chars[j] = chars[j], chars[i]
    return "".join(chars)


def task_pairs(parts: RunParts, count: int, seed: int) -> list[Pair]:
    """``count`` preference pairs over the configured task's *training* prompts (the run's
    held-out prompts excluded): for each prompt two of {the reference answer
    (``answer_text``), a well-formed unsolved answer (``format_text``), the reference with
    two characters swapped} that the run's reward scores differently; the higher-scored is
    chosen, so the reward is the *gold* score beside the learned *proxy*.

    :raises ConfigError: the task and reward give too few pairs with distinct scores.
    """
    task = parts.task
    rewards = [fn for fn, _ in parts.reward_functions()]
    if len(rewards) != 1:
        raise ConfigError(f"rm.data={TASK_DATA} ranks answers by one reward function; reward names {len(rewards)}")
    rng = random.Random(f"rm-task/{seed}")
    holdout = Holdout(parts.plan.eval.holdout)
    pairs: list[Pair] = []
    for _ in range(20):
        examples = task.sample_train(count, rng, holdout)
        candidates = [(e, [task.answer_text(e), task.format_text(e, rng), _swap_two(task.answer_text(e), rng)])
                      for e in examples]
        drawn = [(e, *rng.sample(options, 2)) for e, options in candidates]
        texts = [text for _, a, b in drawn for text in (a, b)]
        scores = rewards[0](prompts=[e.prompt for e, _, _ in drawn for _ in (0, 1)], completions=texts,
                            references=[e.reference for e, _, _ in drawn for _ in (0, 1)],
                            rows=[dict(e.row) for e, _, _ in drawn for _ in (0, 1)])
        scores = [float(x) for x in scores]
        for k, (example, a, b) in enumerate(drawn):
            sa, sb = scores[2 * k], scores[2 * k + 1]
            if sa != sb and len(pairs) < count:
                pairs.append(Pair(example.prompt, a if sa > sb else b, b if sa > sb else a))
        if len(pairs) == count:
            return pairs
    raise ConfigError(f"rm.data={TASK_DATA}: task {parts.task_name!r} gave only {len(pairs)} pairs "
                      f"of answers its reward scores differently (of {count}); give a preference file instead")


def split_pairs(count: int, eval_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """``(train, held_out)`` row indices: a seeded shuffle, the last ``round(count ×
    eval_fraction)`` held out (at least one pair stays for training)."""
    order = list(range(count))
    random.Random(f"rm-split/{seed}").shuffle(order)
    held = min(count - 1, round(count * eval_fraction))
    return sorted(order[:count - held]), sorted(order[count - held:])


def batch_rows(train: list[int], batch_size: int, step: int, seed: int) -> list[int]:
    """The rows step ``step`` (from 1) trains on: the next ``batch_size`` of a seeded
    shuffle of ``train`` per epoch (a function of ``step`` alone, so resuming is exact)."""
    out = []
    position = (step - 1) * batch_size
    while len(out) < batch_size:
        epoch, offset = divmod(position, len(train))
        order = list(train)
        random.Random(f"rm-epoch/{seed}/{epoch}").shuffle(order)
        take = order[offset:offset + batch_size - len(out)]
        out += take
        position += len(take)
    return out


def bradley_terry(chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor) -> torch.Tensor:
    """Per-pair loss ``−log σ(r_c − r_r − m)`` ``(B,)`` (log-sigmoid: exact for large gaps)."""
    return -F.logsigmoid(chosen - rejected - margin)


class PairScorer:
    """Scores both responses of pairs with a model in one padded forward; a text longer than
    the model's context keeps its last tokens (:func:`rlzoo.models.reward_model.fit_context`, as
    the ``reward_model`` reward function does), with one warning the first time."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, chat_template: bool | None,
                 device: torch.device) -> None:
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.templated = uses_chat_template(tokenizer, chat_template)
        self.context = context_length(model)
        self.warned = False

    def __call__(self, pairs: list[Pair]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(r_chosen, r_rejected, margin)``, each ``(B,)`` float32."""
        texts = [reward_text(self.tokenizer, p.prompt, p.chosen, self.templated) for p in pairs]
        texts += [reward_text(self.tokenizer, p.prompt, p.rejected, self.templated) for p in pairs]
        ids, cut = fit_context(encode(self.tokenizer, texts, self.templated), self.context)
        if cut and not self.warned:
            self.warned = True
            say(f"rlzoo: warning: {cut_warning('rlzoo rm', cut, len(texts), self.context)}")
        ids, mask = left_pad(ids, self.tokenizer.pad_token_id)
        scores = sequence_scores(self.model, ids.to(self.device), mask.to(self.device))
        margin = torch.tensor([p.margin for p in pairs], dtype=torch.float32, device=self.device)
        return scores[:len(pairs)], scores[len(pairs):], margin


@torch.no_grad()
def evaluate(scorer: PairScorer, pairs: list[Pair], batch_size: int) -> dict[str, float]:
    """``eval/accuracy`` (share with r_c > r_r), ``eval/loss`` and ``eval/reward_gap``
    (mean r_c − r_r) of held-out pairs."""
    correct, loss, gap = 0.0, 0.0, 0.0
    for start in range(0, len(pairs), batch_size):
        chosen, rejected, margin = scorer(pairs[start:start + batch_size])
        correct += float((chosen > rejected).sum())
        loss += float(bradley_terry(chosen, rejected, margin).sum())
        gap += float((chosen - rejected).sum())
    return {"eval/accuracy": correct / len(pairs), "eval/loss": loss / len(pairs), "eval/reward_gap": gap / len(pairs)}


def _characters(value: Text) -> set[str]:
    return set(value) if isinstance(value, str) else {ch for m in value for ch in m["content"]}


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
            chars |= _characters(pair.prompt) | _characters(pair.chosen) | _characters(pair.rejected)
        tokenizer = build_char_tokenizer("".join(sorted(chars)))
        longest = max((len(p.prompt) + max(len(p.chosen), len(p.rejected)) for p in pairs
                       if all(isinstance(x, str) for x in (p.prompt, p.chosen, p.rejected))), default=0)
        context = max(model.tiny.max_positions, min(longest + 8, TINY_CONTEXT))
        policy = build_tiny_model(model.tiny, tokenizer, context)
        policy = policy.to(DTYPES[model.dtype])
    return from_causal_lm(policy), tokenizer


def describe(cfg: Any, plan: RunPlan, task_name: str, train: int, held: int) -> str:
    """The ``plan.txt`` of an ``rlzoo rm`` run (``cfg``: its ``rm`` section's keys)."""
    backbone = plan.model.path or plan.model.tiny.describe()
    o = plan.optimizer
    return ("# reward-model run (rlzoo rm)\n"
            f"data: {cfg.rm.data if cfg.rm.data != TASK_DATA else f'task {task_name} ranked by its reward'}: "
            f"{train} training pairs, {held} held out (rm.eval_fraction {cfg.rm.eval_fraction})\n"
            f"model: {backbone} with a one-output score head on the last token's hidden state (starts at 0)\n"
            f"loss: Bradley-Terry, mean over pairs of -log sigmoid(r_chosen - r_rejected - margin)\n"
            f"update: {cfg.rm.steps} steps of {cfg.rm.batch_size} pairs, AdamW lr {o.lr:g}, "
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


def run_rm(resolved: PlannedConfig, overwrite: bool = False) -> Path:
    """Train a reward model as ``resolved.cfg.rm`` says; returns the directory it wrote.

    :raises ConfigError: no ``rm.data``, a bad preference file, or a run directory that
        cannot be used, before anything is trained.
    """
    cfg = resolved.cfg
    if not cfg.rm.data:
        raise ConfigError("rlzoo rm trains on preference pairs: set rm.data to a .jsonl or .parquet file with "
                          f"{', '.join(COLUMNS)} (and optionally {MARGIN}) columns, or rm.data={TASK_DATA} for "
                          "pairs ranked by the task's reward")
    run = engine_input(resolved)
    compute = run.plan.compute
    kind = device_type(compute)
    check_world(cfg, distributed.env_world_size())
    dist = distributed.init(compute.backend, kind, compute.timeout_s)
    device = torch.device(kind, dist.local_rank) if kind == "cuda" and dist.enabled else torch.device(kind)
    parts = RunParts(run, device)  # seeded, as a run builds its parts: the task, its reward, the model's shape
    seed = run.setup.seed
    pairs = task_pairs(parts, int(cfg.rm.task_pairs), seed) if cfg.rm.data == TASK_DATA else load_pairs(cfg.rm.data)
    warning = tie_warning(pairs, str(cfg.rm.data))
    if warning is not None and dist.is_main:
        say(f"rlzoo: warning: {warning}")
    if len(pairs) < 2 and cfg.rm.eval_fraction > 0:
        raise ConfigError(f"rm.data {cfg.rm.data!r} holds {len(pairs)} pair: hold none out with rm.eval_fraction=0")
    train_rows, held_rows = split_pairs(len(pairs), float(cfg.rm.eval_fraction), seed)
    run_dir = RunDirectory(run.setup.run_dir, run.setup.resume, dist, overwrite, trained=RM_MODEL_DIR)
    try:
        out = _train(cfg, parts, run_dir, pairs, train_rows, held_rows, dist)
    except RuntimeError as exc:
        distributed.check_collective_failure(exc)  # a dead peer: one line, not a traceback
        raise
    finally:
        run_dir.close()
    distributed.shutdown()  # on an error the process exits instead, and torchrun stops the others
    return out


def check_world(cfg: Any, world: int) -> None:
    """:raises ConfigError: ``rm.batch_size`` does not split into equal shares over ``world``
    processes (each rank trains on ``rm.batch_size / world`` pairs a step)."""
    if world > 1 and int(cfg.rm.batch_size) % world:
        raise ConfigError(f"rm.batch_size={cfg.rm.batch_size} does not split over {world} processes: each trains "
                          f"on an equal share of a step's pairs; use a multiple of {world}")


def _train(cfg: Any, parts: RunParts, run_dir: RunDirectory, pairs: list[Pair], train_rows: list[int],
           held_rows: list[int], dist: distributed.DistInfo) -> Path:
    run, device = parts.run, parts.device
    plan, seed, o = run.plan, run.setup.seed, run.plan.optimizer
    step, state = 0, None
    if run_dir.resume_from is not None:
        state = run_dir.load_state()
        path = run_dir.resume_from / RM_MODEL_DIR
        with unreadable_model(path):  # as rlzoo train reads a checkpoint's policy: a pickle is refused
            model = AutoModelForSequenceClassification.from_pretrained(str(path), dtype=DTYPES[plan.model.dtype])
            tokenizer = load_tokenizer(path)
    else:
        model, tokenizer = _initial_model(parts, pairs)
    model.to(device).train()
    scorer = PairScorer(model, tokenizer, cfg.rm.chat_template, device)  # evaluation: the model itself, on rank 0
    trained = PairScorer(distributed.wrap(model, "ddp", device) if dist.enabled else model, tokenizer,
                         cfg.rm.chat_template, device)  # DDP averages the ranks' gradients
    optimizer = adamw(model.parameters(), o.lr, o.betas, o.weight_decay)
    plan_text = describe(cfg, plan, parts.task_name, len(train_rows), len(held_rows))
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
    total, status = int(cfg.rm.steps), "failed"
    try:
        while step < total:
            step += 1
            rows = batch_rows(train_rows, int(cfg.rm.batch_size), step, seed)
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
            every = int(cfg.rm.eval_every)
            if held and (last or (every and step % every == 0)) and dist.is_main:
                model.eval()
                metrics.update(evaluate(scorer, held, int(cfg.rm.batch_size)))
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
