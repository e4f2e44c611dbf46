"""``rlzoo sft``'s run: supervised fine-tuning on a task's reference answers (a warm-up).

Teacher-forced cross-entropy on ``prompt + target + EOS`` (the prompt built as RL builds it:
instruction, system prompt and chat template, :mod:`rlzoo.tasks.prompts`) with the loss on the target
tokens only. ``sft.target=answer`` trains on the reference answers (this teaches e.g.
digit sorting in seconds and leaves RL nothing to learn); ``format`` trains on
well-formed but unsolved completions (the task's ``format_text``: for sorting, the
prompt's digits in random order), so a following RL run has to learn the skill itself.
The model is saved with ``save_pretrained`` and used with ``rlzoo train model.path=DIR``.
As in ``rlzoo train``, the model's dropout is off (:mod:`rlzoo.models.dropout`) and its log-prob
path passes the load-time check (:mod:`rlzoo.models.model_check`) before the first step.

With ``env`` set, the targets are the environment's demonstrations
(:meth:`rlzoo.agents.environment.Environment.demonstration`: e.g. a calculator call, then the
answer), each played against the environment as a rollout plays an episode
(:func:`rlzoo.agents.episodes.replay`, within ``rollout.max_turns`` / ``max_turn_tokens`` /
``max_new_tokens``): the loss is on the policy's tokens only (the run's ``loss_mask``), the
environment's tokens are read, never trained on.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable

import torch

from rlzoo.agents.episodes import EpisodeFormat, EpisodeLimits, environment_factory, episode_tensors, replay
from rlzoo.core.errors import ConfigError, say
from rlzoo.core.masked import masked_mean
from rlzoo.core.tokens import left_pad
from rlzoo.learn.optim import adamw
from rlzoo.models.dropout import disable_dropout
from rlzoo.models.logprobs import response_forward
from rlzoo.models.model_check import check_model, report
from rlzoo.plan.run_input import RunInput
from rlzoo.run.parts import RunParts
from rlzoo.run.rundir import check_new_output_dir
from rlzoo.tasks.prompts import PromptFormat
from rlzoo.tasks.task import Example, Holdout, check_references

TARGETS = ("answer", "format")


def default_out(run_name: str | None, task_name: str) -> Path:
    """Where ``rlzoo sft`` writes its model without ``--out``: ``runs/<run_name or sft>-<task>/model``."""
    return Path("runs") / f"{run_name or 'sft'}-{task_name}" / "model"


def run_sft(run: RunInput, model_dir: Path, steps: int = 100, target: str = "answer", batch_size: int = 64,
            lr: float | None = None, out_flag: str = "--out") -> Path:
    """Train ``run``'s policy (``model.*``) on its task's examples; returns ``model_dir``, the
    directory the model is saved to.

    :param steps: optimizer steps of ``batch_size`` examples.
    :param target: ``answer`` (reference answers) or ``format`` (format-only targets).
    :param lr: learning rate (default ``trainer.lr``).
    :param out_flag: how ``model_dir`` was given, for the refusal's words (``--out`` or ``the default --out``).
    :raises ConfigError: before anything is built: a bad target or count, LoRA, or a
        ``model_dir`` that exists and is not an empty directory (a run's directory, an
        earlier SFT model: nothing is written over).
    """
    if target not in TARGETS:
        raise ConfigError(f"unknown SFT target {target!r}; choose one of {', '.join(TARGETS)}")
    if steps < 1 or batch_size < 1:
        raise ConfigError(f"steps and batch_size must be >= 1, got {steps} and {batch_size}")
    plan, seed, task_name = run.plan, run.setup.seed, run.components.task.name
    if plan.lora is not None:
        raise ConfigError(f"rlzoo sft trains every weight of the model; model.lora.rank={plan.lora.rank} "
                          "is for rlzoo train: set model.lora.rank=0")
    check_new_output_dir(model_dir, out_flag)
    parts = RunParts(run, torch.device("cpu"))  # seeded, as a run builds its parts
    task = parts.task
    reads = target == "answer" and run.components.environment is None  # its targets are the references
    use = "rlzoo sft trains on them (the text 'None', or nothing)" if reads else None
    for warning in check_references(task, task_name, use):
        say(f"rlzoo: warning: {warning}")
    rng = random.Random(seed)
    model, tokenizer = parts.models.policy, parts.models.tokenizer
    prompt_format = parts.prompt_format  # the instruction, system prompt and chat template RL uses
    prompt_format.check(tokenizer)
    disable_dropout(model)  # as rlzoo train: the loss is on the log-probs eval mode gives
    report("policy", check_model(model, torch.device("cpu")), summary=bool(plan.model.path))
    optimizer = adamw(model.parameters(), lr or plan.optimizer.lr, plan.optimizer.betas)
    model.train()
    holdout = Holdout(plan.eval.holdout)  # never train on the prompts RL runs evaluate on
    demonstrations = _demonstrations(run, tokenizer, prompt_format, target)
    for step in range(1, steps + 1):
        examples = task.sample_train(batch_size, rng, holdout)
        if demonstrations is not None:
            prompt_ids, prompt_mask, response_ids, response_mask, loss_mask = demonstrations(examples)
        else:
            texts = [task.answer_text(e) if target == "answer" else task.format_text(e, rng) for e in examples]
            prompt_ids, prompt_mask = left_pad(prompt_format.encode(examples, tokenizer), tokenizer.pad_token_id)
            targets = [tokenizer(t, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
                       for t in texts]
            width = max(len(t) for t in targets)
            response_ids = torch.full((len(targets), width), tokenizer.pad_token_id, dtype=torch.long)
            response_mask = torch.zeros((len(targets), width))
            for i, ids in enumerate(targets):
                response_ids[i, :len(ids)] = torch.tensor(ids)
                response_mask[i, :len(ids)] = 1
            loss_mask = response_mask
        out = response_forward(model, prompt_ids, prompt_mask, response_ids, response_mask,
                               chunk_size=plan.compute.logprob_chunk_size,
                               keep_max_bytes=plan.compute.logprob_keep_bytes)
        loss = -masked_mean(out.logp, loss_mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if plan.optimizer.max_grad_norm is not None:  # null: no clipping
            torch.nn.utils.clip_grad_norm_(model.parameters(), plan.optimizer.max_grad_norm)
        optimizer.step()
        if step == 1 or step % max(1, steps // 10) == 0 or step == steps:
            print(f"sft step {step}/{steps}: loss {float(loss.detach()):.4f}", flush=True)
    model_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
    return model_dir


def _demonstrations(run: RunInput, tokenizer: Any, prompt_format: PromptFormat,
                    target: str) -> Callable[[list[Example]], tuple[torch.Tensor, ...]] | None:
    """Under ``env``: a function from examples to the batch of their demonstration episodes,
    ``(prompt_ids, prompt_mask, response_ids, response_mask, loss_mask)``; ``None`` without
    ``env``.

    :raises ConfigError: ``target=format`` (an environment has no format-only episodes), or
        a demonstration that is missing or that the episode bounds cut short.
    """
    components = run.components
    make_env = environment_factory(components.environment, components.tools, tokenizer, prompt_format)
    if make_env is None:
        return None
    name, episodes = components.environment.name, run.plan.episodes
    if target != "answer":
        raise ConfigError(f"rlzoo sft --target {target} has no form under env={name!r}: with an environment, SFT "
                          "trains on its demonstration episodes (--target answer)")
    fmt = EpisodeFormat(tokenizer, prompt_format)
    limits = EpisodeLimits(max_turns=episodes.max_turns, max_turn_tokens=episodes.max_turn_tokens,
                           max_tokens=run.plan.rollout.max_new_tokens)

    def batch(examples: list[Example]) -> tuple[torch.Tensor, ...]:
        episodes = []
        for example in examples:
            env = make_env()
            turns = env.demonstration(example)
            if not turns:
                raise ConfigError(f"env={name!r} has no demonstration for the prompt {example.prompt!r} "
                                  "(Environment.demonstration returned None), so rlzoo sft cannot train on it")
            episode = replay(fmt, env, example, turns, limits)
            if episode.drift:
                raise ConfigError(f"env={name!r}: the chat template's rendering of the demonstration {turns!r} of "
                                  f"{example.prompt!r} does not start with its ids (retokenisation drift: "
                                  "docs/agents.md, Tokens and masks), so its tokens cannot be trained on")
            if episode.truncated or not episode.done:
                raise ConfigError(f"env={name!r}: the demonstration {turns!r} of {example.prompt!r} "
                                  + _unfit(replay(fmt, make_env(), example, turns, _unbounded(turns)), limits))
            episodes.append(episode)
        tensors = episode_tensors(episodes, tokenizer.pad_token_id)
        prompt_ids, prompt_mask = left_pad([e.prompt_ids for e in episodes], tokenizer.pad_token_id)
        return prompt_ids, prompt_mask, tensors["response_ids"], tensors["response_mask"], tensors["loss_mask"]

    return batch


def _unbounded(turns: list[str]) -> EpisodeLimits:
    """Bounds a demonstration of ``turns`` cannot reach: one turn more than it has, no token limits."""
    return EpisodeLimits(max_turns=len(turns) + 1, max_turn_tokens=2**31, max_tokens=2**31)


def _unfit(free: Any, limits: EpisodeLimits) -> str:
    """Why a demonstration does not fit ``limits``, from ``free``, its episode replayed
    without bounds: what it needs (turns, tokens of its longest turn, tokens in all) and
    which knob to raise to what, or that the environment never ends it."""
    runs = "".join(str(p) for p in free.policy).split("0")
    needs = {"rollout.max_turns": (free.turns, limits.max_turns),
             "rollout.max_turn_tokens": (max(len(r) for r in runs), limits.max_turn_tokens),
             "rollout.max_new_tokens": (len(free.tokens), limits.max_tokens)}
    text = (f"needs {free.turns} turn(s), {needs['rollout.max_turn_tokens'][0]} tokens in its longest turn "
            f"(end of turn included) and {len(free.tokens)} tokens after the prompt")
    raise_ = [f"{key}={now} to {need}" for key, (need, now) in needs.items() if need > now]
    if raise_:
        text += f": raise {', '.join(raise_)}"
    if not free.done:
        text += ("; the environment does not end the episode after its last turn (Environment.step must return "
                 "done=True on the final answer)")
    return text
