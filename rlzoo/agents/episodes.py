"""Multi-turn episodes: the policy and an environment take turns; one token sequence each.

An episode is the prompt, then alternating policy turns and environment turns (tool results,
feedback), all in one token sequence. The policy's tokens are the ids it sampled, with their
rollout log-probs and a 1 in the loss mask; the environment's tokens get a 0 and log-prob 0.
So the batch's ``response_mask`` covers the whole episode (every token is attended) and its
``loss_mask`` only the policy's tokens: every loss, KL and aggregation of the run counts the
policy's tokens (the run plan says so).

Rendering (:class:`EpisodeFormat`):

- with a chat template (the run's :class:`rlzoo.tasks.prompts.PromptFormat` decides, as for any
  prompt), the conversation is rendered by ``apply_chat_template`` (the environment's tool
  schemas as ``tools=``, observations as ``tool``/``user`` messages, each policy turn as an
  assistant message whose content is its text). The environment's tokens are what the
  template adds after the ids so far; the policy's ids are never decoded and re-encoded. When
  the template's rendering of the conversation does not start with the ids so far
  (retokenisation drift: the policy sampled a non-canonical tokenisation, or the template
  rewrites earlier turns), the episode ends there, is flagged (``episode/template_drift``)
  and a warning is printed once;
- without one, the messages' contents are concatenated: the prompt as
  :class:`rlzoo.tasks.prompts.PromptFormat` renders it, each policy turn ending with EOS, each
  observation's content as the environment wrote it.

Bounds: ``rollout.max_turns`` policy turns, ``rollout.max_turn_tokens`` tokens per policy
turn, ``rollout.max_new_tokens`` tokens per episode (policy and environment together). An
episode stopped by a bound is truncated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from rlzoo.core.errors import say
from rlzoo.agents.environment import Environment, Message, tool_schemas
from rlzoo.tasks.prompts import PromptFormat
from rlzoo.contract.checks import BoundComponent
from rlzoo.tasks.task import Example
from rlzoo.contract.tool_schema import Tool, registered_tools  # noqa: F401 - registered_tools: the env's tools
from rlzoo.agents.tool_calls import tool_call_style

COUNT_COLUMNS = ("turns", "tool_calls", "tool_errors", "template_drift", "turn_reward")
"""Columns of ``RolloutBatch.episode_counts``: per-episode statistics logged as ``episode/*``."""


@dataclass(frozen=True)
class EpisodeLimits:
    """The bounds of an episode.

    :ivar max_turns: policy turns at most.
    :ivar max_turn_tokens: tokens per policy turn at most.
    :ivar max_tokens: tokens per episode after the prompt (policy and environment) at most.
    """

    max_turns: int
    max_turn_tokens: int
    max_tokens: int


@dataclass
class Episode:
    """One episode as it is played: the conversation, its tokens and statistics.

    :ivar tokens: ids after the prompt (policy and environment tokens in order).
    :ivar policy: 1 where ``tokens`` were sampled by the policy, 0 for the environment's.
    :ivar logp: rollout log-prob of each policy token, 0 for the environment's.
    :ivar answer: the text of the last policy turn (what the task's rewards score).
    """

    example: Example
    env: Environment
    messages: list[Message]
    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    policy: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    answer: str = ""
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    turn_reward: float = 0.0
    truncated: bool = False
    drift: bool = False
    done: bool = False

    def counts(self) -> list[float]:
        """The :data:`COUNT_COLUMNS` of this episode."""
        return [self.turns, self.tool_calls, self.tool_errors, float(self.drift), self.turn_reward]


class EpisodeFormat:
    """How messages become tokens for one run (see the module docstring).

    :param tokenizer: the policy's tokenizer.
    :param prompt_format: the run's prompt settings (instruction, system prompt, chat template).
    """

    def __init__(self, tokenizer: Any, prompt_format: PromptFormat) -> None:
        self.tokenizer, self.prompt_format = tokenizer, prompt_format
        self.chat = prompt_format.chat_template is not False and bool(getattr(tokenizer, "chat_template", None))
        self.warned = False
        self.warned_unknown = False

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def render(self, messages: list[Message], tools: Sequence[Any], generation_prompt: bool) -> str:
        """The chat template's text of ``messages`` (chat runs only)."""
        return self.tokenizer.apply_chat_template(messages, tools=tool_schemas(tools), tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def start(self, example: Example, env: Environment) -> Episode:
        """A new episode of ``example``: ``env.reset`` and the prompt's ids."""
        first = self.prompt_format.messages(Example(prompt=example.prompt, reference=example.reference,
                                                    messages=tuple(env.reset(example))))
        if self.chat:
            ids = self._encode(self.render(first, env.tools, True))
        else:
            ids = self._encode(first[0]["content"] if len(first) == 1 else "\n\n".join(m["content"] for m in first))
        return Episode(example=example, env=env, messages=first, prompt_ids=ids)

    def turn_text(self, ids: list[int], ended: bool) -> str:
        """A policy turn's text (its end-of-turn token dropped): the assistant message's content."""
        if ended and ids and ids[-1] == self.tokenizer.eos_token_id:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=not self.chat)

    def observation_ids(self, episode: Episode, observations: list[Message]) -> list[int] | None:
        """The ids of the environment's turn after the episode's last policy turn (the
        messages are appended to ``episode.messages``), or ``None`` when the chat template's
        rendering does not extend the ids so far (retokenisation drift)."""
        episode.messages.extend(dict(m) for m in observations)
        if not self.chat:
            text = "".join(m["content"] for m in observations)
            ids = self._encode(text)
            self._warn_unknown(text, ids)
            return ids
        so_far = episode.prompt_ids + episode.tokens
        full = self._encode(self.render(episode.messages, episode.env.tools, True))
        if full[:len(so_far)] != so_far:
            if not self.warned:
                say("rlzoo: warning: the chat template's rendering of an episode does not start with the ids "
                    "sampled so far (retokenisation drift); such episodes end there and are counted in "
                    "episode/template_drift")
                self.warned = True
            return None
        return full[len(so_far):]

    def _warn_unknown(self, text: str, ids: list[int]) -> None:
        """Warn once when an observation holds characters the tokenizer encodes as its
        unknown token (the embedded model's knows only the task's alphabet)."""
        unknown = getattr(self.tokenizer, "unk_token_id", None)
        if self.warned_unknown or unknown is None or unknown not in ids:
            return
        chars = sorted(c for c in set(text) if self._encode(c) == [unknown])
        say(f"rlzoo: warning: the environment's observation {text[:60]!r} holds characters the tokenizer encodes "
            f"as {self.tokenizer.unk_token} ({''.join(chars)!r}): the policy cannot read them. The embedded "
            "model's tokenizer knows only the task's alphabet: keep observations inside it (as the guess and "
            "calculator environments do) or train a pretrained model.path")
        self.warned_unknown = True


def play(backend: Any, fmt: EpisodeFormat, make_env: Callable[[], Environment], examples: list[Example],
         num_samples: int, limits: EpisodeLimits, *, temperature: float, top_p: float,
         greedy: bool = False) -> list[Episode]:
    """Play ``num_samples`` episodes of each example (example-major), a turn of every
    unfinished episode per backend call; returns them finished."""
    episodes = [fmt.start(example, make_env()) for example in examples for _ in range(num_samples)]
    first = True
    while True:
        active = [e for e in episodes if not e.done]
        if not active:
            return episodes
        budgets = [min(limits.max_turn_tokens, limits.max_tokens - len(e.tokens)) for e in active]
        if first and all(episodes[i].prompt_ids == episodes[i - i % num_samples].prompt_ids
                         for i in range(len(episodes))):  # a group shares its prompt: prefill it once
            gen = backend.generate([e.prompt_ids for e in episodes[::num_samples]], num_samples=num_samples,
                                   max_new_tokens=max(budgets), temperature=temperature, top_p=top_p, greedy=greedy)
        else:
            gen = backend.generate([e.prompt_ids + e.tokens for e in active], num_samples=1,
                                   max_new_tokens=max(budgets), temperature=temperature, top_p=top_p, greedy=greedy)
        first = False
        for row, (episode, budget) in enumerate(zip(active, budgets)):
            valid = gen.response_mask[row].bool()
            ids = gen.response_ids[row][valid].tolist()[:budget]
            logps = gen.logp[row][valid].tolist()[:budget]
            ended = bool(ids) and ids[-1] == fmt.tokenizer.eos_token_id
            _policy_turn(fmt, episode, ids, logps, ended, limits)


def replay(fmt: EpisodeFormat, env: Environment, example: Example, turns: Sequence[str],
           limits: EpisodeLimits) -> Episode:
    """The episode of ``example`` in which the policy writes ``turns`` (texts, each encoded and
    ended with EOS; log-prob 0) and ``env`` answers them, as :func:`play` would play it: a
    demonstration for ``rlzoo sft`` under ``env`` (the loss goes on its policy tokens only).
    It stops where the environment ends the episode or a bound stops it (then ``truncated``)."""
    episode = fmt.start(example, env)
    for text in turns:
        if episode.done:
            break
        ids = fmt._encode(text) + [fmt.tokenizer.eos_token_id]
        ids = ids[:min(limits.max_turn_tokens, limits.max_tokens - len(episode.tokens))]
        _policy_turn(fmt, episode, ids, [0.0] * len(ids), ids[-1:] == [fmt.tokenizer.eos_token_id], limits)
    return episode


def _policy_turn(fmt: EpisodeFormat, episode: Episode, ids: list[int], logps: list[float], ended: bool,
                 limits: EpisodeLimits) -> None:
    """Append one policy turn to ``episode`` and let its environment answer."""
    episode.tokens += ids
    episode.policy += [1] * len(ids)
    episode.logp += logps
    episode.turns += 1
    text = fmt.turn_text(ids, ended)
    episode.answer = text
    episode.messages.append({"role": "assistant", "content": text})
    if not ended:  # the turn hit its token budget: no end of turn to react to
        episode.truncated = episode.done = True
        return
    result = episode.env.step(text)
    episode.tool_calls += int(result.tool_calls)
    episode.tool_errors += int(result.tool_errors)
    episode.turn_reward += float(result.reward or 0.0)
    if result.done:
        episode.done = True
        return
    if episode.turns >= limits.max_turns:
        episode.truncated = episode.done = True
        return
    observed = fmt.observation_ids(episode, result.observations)
    if observed is None:
        episode.drift = episode.truncated = episode.done = True
        return
    if len(episode.tokens) + len(observed) >= limits.max_tokens:  # no room left for a policy turn after it
        episode.truncated = episode.done = True
        return
    episode.tokens += observed
    episode.policy += [0] * len(observed)
    episode.logp += [0.0] * len(observed)


def episode_tensors(episodes: list[Episode], pad_id: int) -> dict[str, torch.Tensor]:
    """The episodes' response tensors, right-padded ``(B, T)``: ``response_ids``,
    ``response_mask`` (every episode token), ``loss_mask`` (the policy's tokens),
    ``rollout_logp``, ``truncated`` ``(B,)`` and ``episode_counts`` ``(B, K)``."""
    width = max(1, max(len(e.tokens) for e in episodes))
    ids = torch.full((len(episodes), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(episodes), width))
    policy = torch.zeros((len(episodes), width))
    logp = torch.zeros((len(episodes), width))
    for i, e in enumerate(episodes):
        n = len(e.tokens)
        ids[i, :n] = torch.tensor(e.tokens, dtype=torch.long)
        mask[i, :n] = 1.0
        policy[i, :n] = torch.tensor(e.policy, dtype=torch.float32)
        logp[i, :n] = torch.tensor(e.logp, dtype=torch.float32)
    return {"response_ids": ids, "response_mask": mask, "loss_mask": policy, "rollout_logp": logp,
            "truncated": torch.tensor([e.truncated for e in episodes]),
            "episode_counts": torch.tensor([e.counts() for e in episodes], dtype=torch.float32)}


def transcript(fmt: EpisodeFormat, episode: Episode) -> str:
    """The whole episode as text (prompt excluded), for the samples table."""
    return fmt.tokenizer.decode(episode.tokens, skip_special_tokens=False)


def environment_factory(env: BoundComponent | None, tools: dict[str, Tool], tokenizer: Any,
                        prompt_format: PromptFormat) -> Callable[[], Environment] | None:
    """Builds one environment of the run's ``env`` (bound) per episode (``None`` without
    ``env``), with the inputs it names: ``tools`` (every registered tool,
    :func:`rlzoo.contract.tool_schema.registered_tools`) and ``tool_style`` (the tool-call
    format of the run's rendering, :func:`rlzoo.agents.tool_calls.tool_call_style`)."""
    if env is None:
        return None
    style = tool_call_style(tokenizer) if EpisodeFormat(tokenizer, prompt_format).chat else "plain"
    return lambda: env.construct(tools=tools, tool_style=style)
