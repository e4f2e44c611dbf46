"""The sampler: prompts from the task, completions from the rollout backend, rewards.

:meth:`Sampler.sample` makes one step's :class:`rlzoo.core.batch.RolloutBatch`: it draws
prompts with the task's own seeded RNG, formats and tokenises each once, has the rollout
backend generate ``rollout.n`` completions per prompt (with their rollout log-probs),
decodes and scores them (:mod:`rlzoo.rollout.scoring`), and adds the greedy baseline when the
plan runs one. It is public because extensions refill batches with it (``ctx.resample``).
With an environment (``env``) each completion is a multi-turn episode
(:mod:`rlzoo.agents.episodes`), scored on its final answer.
"""

from __future__ import annotations

import random
from typing import Any, Callable, NamedTuple

import torch

from rlzoo.core.batch import RolloutBatch
from rlzoo.agents.environment import Environment
from rlzoo.agents.episodes import EpisodeFormat, EpisodeLimits, episode_tensors, play, transcript
from rlzoo.plan.records import RunPlan
from rlzoo.tasks.prompts import PromptFormat
from rlzoo.core.tokens import left_pad
from rlzoo.rollout.scoring import Rewards
from rlzoo.tasks.task import Example, Holdout, Task


class Completions(NamedTuple):
    """Completions as :meth:`Sampler.complete` returns them (example-major).

    :ivar answers: what the rewards score: each completion's text, or an episode's final answer.
    :ivar shown: what a samples table shows: the completion, or the whole episode after its prompt.
    :ivar turns: policy turns of each episode; ``None`` without an environment.
    """

    answers: list[str]
    shown: list[str]
    turns: list[int] | None


class Sampler:
    """Generate and score groups of completions.

    :param task: the prompt source.
    :param rewards: the run's reward functions and weights.
    :param tokenizer: the policy's tokenizer.
    :param backend: the rollout backend (``generate``, ``sync_weights``).
    :param plan: the run plan (how completions are generated, whether a greedy pass runs,
        the held-out share of the prompts).
    :param device: where the batch's tensors go.
    :param seed: seeds the prompt RNG (a string makes each process's stream its own).
    :param prompt_format: instruction, system prompt and chat template (:mod:`rlzoo.tasks.prompts`).
    :param environment: builds one environment per episode (the run's ``env``); ``None``
        samples single completions.
    """

    def __init__(self, task: Task, rewards: Rewards, tokenizer: Any, backend: Any, plan: RunPlan,
                 device: torch.device, seed: int | str, prompt_format: PromptFormat,
                 environment: Callable[[], Environment] | None = None) -> None:
        self.task, self.rewards, self.tokenizer, self.backend = task, rewards, tokenizer, backend
        self.prompt_format = prompt_format
        self.plan, self.device = plan, device
        self.rng = random.Random(seed)
        self.holdout = Holdout(plan.eval.holdout)
        self.next_group = 0
        self.prompt_format.check(tokenizer)
        self.environment = environment
        self.episode_format = EpisodeFormat(tokenizer, self.prompt_format) if environment is not None else None

    def format_prompt(self, prompt: Example | str) -> str:
        """The prompt as the model sees it (:meth:`rlzoo.tasks.prompts.PromptFormat.render`)."""
        return self.prompt_format.render(prompt, self.tokenizer)

    def encode_prompts(self, prompts: list[Example] | list[str]) -> list[list[int]]:
        """Token ids of each prompt as the model sees it (:meth:`format_prompt`), unpadded."""
        return self.prompt_format.encode(prompts, self.tokenizer)

    def sample(self, n_prompts: int) -> RolloutBatch:
        """Draw ``n_prompts`` training prompts (never a held-out one) and return their scored
        groups (``rollout.n`` each), with fresh group ids."""
        rollout = self.plan.rollout
        examples = self.task.sample_train(n_prompts, self.rng, self.holdout)
        group_ids = torch.arange(self.next_group, self.next_group + n_prompts).repeat_interleave(rollout.n)
        self.next_group += n_prompts
        if self.environment is not None:
            return self._sample_episodes(examples, group_ids)
        texts = [e.prompt for e in examples]
        token_lists = self.encode_prompts(examples)
        gen = self.backend.generate(token_lists, num_samples=rollout.n, max_new_tokens=rollout.max_new_tokens,
                                    temperature=rollout.temperature, top_p=rollout.top_p)
        prompt_ids, prompt_mask = left_pad(token_lists, self.tokenizer.pad_token_id)
        prompts = [p for p in texts for _ in range(rollout.n)]
        references = [e.reference for e in examples for _ in range(rollout.n)]
        rows = [dict(e.row) for e in examples for _ in range(rollout.n)]
        completions = self.decode(gen.response_ids, gen.response_mask)
        scores, reward_scores = self.rewards.score(prompts, completions, references, rows, training=True)
        baseline = None
        if self.plan.runs("greedy"):
            greedy = self.backend.generate(token_lists, num_samples=1, max_new_tokens=rollout.max_new_tokens,
                                           temperature=rollout.temperature, top_p=rollout.top_p, greedy=True)
            greedy_scores = self.score(texts, self.decode(greedy.response_ids, greedy.response_mask),
                                       [e.reference for e in examples], [dict(e.row) for e in examples])
            baseline = greedy_scores.repeat_interleave(rollout.n).to(self.device)
        device = self.device
        return RolloutBatch(
            prompt_ids=prompt_ids.repeat_interleave(rollout.n, 0).to(device),
            prompt_mask=prompt_mask.repeat_interleave(rollout.n, 0).to(device),
            response_ids=gen.response_ids.to(device), response_mask=gen.response_mask.to(device),
            group_ids=group_ids.to(device), scores=scores.to(device), truncated=gen.truncated.to(device),
            prompts=prompts, completions=completions, references=references,
            rollout_logp=gen.logp.to(device), baseline_scores=baseline, reward_scores=reward_scores.to(device))

    def _sample_episodes(self, examples: list[Example], group_ids: torch.Tensor) -> RolloutBatch:
        """``rollout.n`` episodes of each example, scored on their final answers plus the sum
        of their per-turn rewards."""
        rollout, n, fmt = self.plan.rollout, self.plan.rollout.n, self.episode_format
        episodes = play(self.backend, fmt, self.environment, examples, n, self.limits,
                        temperature=rollout.temperature, top_p=rollout.top_p)
        prompts = [e.prompt for e in examples for _ in range(n)]
        references = [e.reference for e in examples for _ in range(n)]
        rows = [dict(e.row) for e in examples for _ in range(n)]
        answers = [e.answer for e in episodes]
        scores, reward_scores = self.rewards.score(prompts, answers, references, rows, training=True)
        tensors = episode_tensors(episodes, self.tokenizer.pad_token_id)
        scores = scores + tensors["episode_counts"][:, -1]  # the summed per-turn rewards
        prompt_ids, prompt_mask = left_pad([e.prompt_ids for e in episodes], self.tokenizer.pad_token_id)
        device = self.device
        return RolloutBatch(
            prompt_ids=prompt_ids.to(device), prompt_mask=prompt_mask.to(device), group_ids=group_ids.to(device),
            scores=scores.to(device), prompts=prompts, completions=answers, references=references,
            reward_scores=reward_scores.to(device), transcripts=[transcript(fmt, e) for e in episodes],
            **{name: value.to(device) for name, value in tensors.items()})

    @property
    def limits(self) -> EpisodeLimits:
        """The episode bounds of the plan."""
        episodes = self.plan.episodes
        return EpisodeLimits(max_turns=episodes.max_turns, max_turn_tokens=episodes.max_turn_tokens,
                             max_tokens=self.plan.rollout.max_new_tokens)

    def complete(self, examples: list[Example], num_samples: int, greedy: bool) -> Completions:
        """``num_samples`` completions of each example (example-major): what evaluation
        scores (the final answers of episodes with an environment) and what it shows."""
        rollout = self.plan.rollout
        if self.environment is not None:
            episodes = play(self.backend, self.episode_format, self.environment, examples, num_samples, self.limits,
                            temperature=rollout.temperature, top_p=rollout.top_p, greedy=greedy)
            return Completions([e.answer for e in episodes], [transcript(self.episode_format, e) for e in episodes],
                               [e.turns for e in episodes])
        gen = self.backend.generate(self.encode_prompts(examples), num_samples=num_samples,
                                    max_new_tokens=rollout.max_new_tokens, temperature=rollout.temperature,
                                    top_p=rollout.top_p, greedy=greedy)
        answers = self.decode(gen.response_ids, gen.response_mask)
        return Completions(answers, answers, None)

    def decode(self, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        """The completions' text (special tokens such as EOS dropped)."""
        rows = [ids[mask.bool()].tolist() for ids, mask in zip(response_ids.cpu(), response_mask.cpu())]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def score(self, prompts: list[str], completions: list[str], references: list[Any],
              rows: list[dict[str, Any]]) -> torch.Tensor:
        """``(B,)`` float32 scores: the weighted sum of the reward functions
        (:meth:`rlzoo.rollout.scoring.Rewards.score`)."""
        return self.rewards.score(prompts, completions, references, rows)[0]

    def state_dict(self) -> dict[str, Any]:
        """The prompt RNG, group counter, the task's position in its data and the reward
        scorers' states (plain values, for checkpoints)."""
        return {"rng": self.rng.getstate(), "next_group": self.next_group, "task": self.task.state_dict(),
                "rewards": self.rewards.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.next_group = int(state["next_group"])
        self.task.load_state_dict(state.get("task", {}))
        self.rewards.load_state_dict(state.get("rewards", {}))
