"""The testing kit's checks of an environment (kind ``environment``): what a plugin author
runs on their own environment (``rlzoo.api.check_environment``, or ``check_component``
on its registration).

:func:`check_environment` asserts, naming the environment and the rule broken: ``reset``
returns chat messages; ``tools`` are :class:`rlzoo.contract.tool_schema.Tool` objects with OpenAI function
schemas; ``step`` returns a :class:`rlzoo.agents.environment.StepResult` with chat messages, a
finite reward or ``None`` and counts with ``tool_errors <= tool_calls``; two environments
fed the same example and the same turns answer the same (an episode must replay under a
seed); and an episode played against it with scripted turns keeps its tokens right: the
policy's tokens are exactly the scripted ones with their log-probs, the environment's are
out of the loss mask with log-prob 0, the mask never covers padding.
"""

from __future__ import annotations

import math
import string
from typing import Any, Callable, Sequence

import torch

from rlzoo.agents.environment import Environment, StepResult
from rlzoo.agents.episodes import EpisodeFormat, EpisodeLimits, episode_tensors, play
from rlzoo.models.build import build_char_tokenizer
from rlzoo.tasks.prompts import PromptFormat
from rlzoo.core.batch import Generation
from rlzoo.tasks.task import Example
from rlzoo.contract.tool_schema import Tool

ROLES = ("system", "user", "assistant", "tool")
PROBE_TURNS = ("12*34", 'CALL calculator(expression="12*34")',
               '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>', "hello", "42")
"""Policy turns fed to an environment under check: tool calls in each format, free text, an answer."""


class _ScriptedBackend:
    """A rollout backend that samples the given turns (their characters + EOS), log-prob -1 each."""

    def __init__(self, tokenizer: Any, turns: Sequence[str]) -> None:
        self.tokenizer, self.turns = tokenizer, list(turns)

    def generate(self, prompt_ids: list[list[int]], *, num_samples: int, max_new_tokens: int, temperature: float,
                 top_p: float, greedy: bool = False) -> Generation:
        text = self.turns.pop(0) if self.turns else "42"
        ids = (self.tokenizer(text, add_special_tokens=False).input_ids + [self.tokenizer.eos_token_id])
        ids = ids[:max_new_tokens]
        rows = len(prompt_ids) * num_samples
        tokens = torch.tensor([ids] * rows)
        return Generation(response_ids=tokens, response_mask=torch.ones(tokens.shape),
                          truncated=torch.full((rows,), ids[-1] != self.tokenizer.eos_token_id),
                          logp=-torch.ones(tokens.shape))


def _check_messages(messages: Any, label: str, where: str) -> None:
    assert isinstance(messages, list), f"{label}: {where} must return a list of messages, got {type(messages).__name__}"
    for message in messages:
        assert isinstance(message, dict) and message.get("role") in ROLES and isinstance(message.get("content"), str), (
            f"{label}: {where} returned {message!r}; a message is {{'role': one of {ROLES}, 'content': str}}")


def _check_result(result: Any, label: str, turn: str) -> None:
    assert isinstance(result, StepResult), (f"{label}: step({turn!r}) must return rlzoo.agents.environment.StepResult, "
                                            f"got {type(result).__name__}")
    _check_messages(result.observations, label, f"step({turn!r}).observations")
    assert result.reward is None or (isinstance(result.reward, (int, float)) and math.isfinite(result.reward)), (
        f"{label}: step({turn!r}).reward must be a finite number or None, got {result.reward!r}")
    assert 0 <= result.tool_errors <= result.tool_calls, (
        f"{label}: step({turn!r}) counts {result.tool_errors} tool errors of {result.tool_calls} calls")
    assert result.done or result.observations, f"{label}: step({turn!r}) neither ends the episode nor observes"


def _replay(make_env: Callable[[], Environment], example: Example, turns: Sequence[str]) -> list[Any]:
    env = make_env()
    out: list[Any] = [env.reset(example)]
    for turn in turns:
        result = env.step(turn)
        out.append((result.observations, result.reward, result.done, result.tool_calls, result.tool_errors))
        if result.done:
            break
    return out


def check_environment(make_env: Callable[[], Environment], name: str = "environment",
                      examples: Sequence[Example] = (), turns: Sequence[str] = PROBE_TURNS) -> None:
    """Check the environment ``make_env()`` builds (see the module docstring).

    :param make_env: builds a fresh environment (one per episode, as the engine does).
    :param examples: task examples to start episodes from (default: ``12*34=``).
    :param turns: policy turns to feed it (default: :data:`PROBE_TURNS`).
    :raises AssertionError: naming the environment and the broken rule.
    """
    examples = list(examples) or [Example("12*34=", "408")]
    for example in examples:
        env = make_env()
        assert isinstance(env, Environment), f"{name}: the factory must build an rlzoo.agents.environment.Environment"
        for tool in env.tools:
            assert isinstance(tool, Tool) and tool.schema.get("type") == "function", (
                f"{name}: tools must be rlzoo.api.Tool objects with OpenAI function schemas, got {tool!r}")
        _check_messages(env.reset(example), name, "reset(example)")
        for turn in turns:
            fresh = make_env()
            fresh.reset(example)
            _check_result(fresh.step(turn), name, turn)
        assert _replay(make_env, example, turns) == _replay(make_env, example, turns), (
            f"{name}: two environments fed the same example and turns answered differently; reset/step must draw "
            "randomness only from the example (or a generator seeded from it)")
        _check_episode_tokens(make_env, example, turns, name)


def _check_episode_tokens(make_env: Callable[[], Environment], example: Example, turns: Sequence[str],
                          name: str) -> None:
    tokenizer = build_char_tokenizer(string.printable)
    fmt = EpisodeFormat(tokenizer, PromptFormat(chat_template=False))
    limits = EpisodeLimits(max_turns=len(turns), max_turn_tokens=256, max_tokens=4096)
    episodes = play(_ScriptedBackend(tokenizer, turns), fmt, make_env, [example], 1, limits,
                    temperature=1.0, top_p=1.0)
    tensors = episode_tensors(episodes, tokenizer.pad_token_id)
    loss, response, logp = tensors["loss_mask"], tensors["response_mask"], tensors["rollout_logp"]
    assert bool((loss <= response).all()), f"{name}: the loss mask covers padding"
    assert bool((logp[(response - loss).bool()] == 0).all()), f"{name}: environment tokens carry log-probs"
    episode = episodes[0]
    sampled = [t for t, p in zip(episode.tokens, episode.policy) if p]
    expected = []
    for turn in turns[:episode.turns]:
        expected += tokenizer(turn, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    assert sampled == expected, f"{name}: the policy tokens of an episode are not the sampled ones"
