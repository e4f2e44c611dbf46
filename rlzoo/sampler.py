"""The sampler: prompts from the task, completions from the rollout backend, rewards.

:meth:`Sampler.sample` makes one step's :class:`rlzoo.batch.RolloutBatch`: it draws
prompts with the task's own seeded RNG, formats and tokenises each once, has the rollout
backend generate ``rollout.n`` completions per prompt (with their rollout log-probs),
decodes and scores them (:mod:`rlzoo.scoring`), and adds the greedy baseline when the plan runs one. It is public
because extensions refill batches with it (``ctx.resample``).
"""

from __future__ import annotations

import random
from typing import Any

import torch

from rlzoo.batch import RolloutBatch
from rlzoo.errors import ConfigError
from rlzoo.plan import RunPlan
from rlzoo.rollout import left_pad
from rlzoo.scoring import Rewards
from rlzoo.tasks import Holdout, Task


class Sampler:
    """Generate and score groups of completions.

    :param task: the prompt source.
    :param rewards: the run's reward functions and weights.
    :param tokenizer: the policy's tokenizer.
    :param backend: the rollout backend (``generate``, ``sync_weights``).
    :param cfg: the run config (``model.chat_template``, ``eval.holdout``).
    :param plan: the run plan (how completions are generated, whether a greedy pass runs).
    :param device: where the batch's tensors go.
    :param seed: seeds the prompt RNG (a string makes each process's stream its own).
    """

    def __init__(self, task: Task, rewards: Rewards, tokenizer: Any, backend: Any, cfg: Any,
                 plan: RunPlan, device: torch.device, seed: int | str) -> None:
        self.task, self.rewards, self.tokenizer, self.backend = task, rewards, tokenizer, backend
        self.chat_template = cfg.model.chat_template
        self.plan, self.device = plan, device
        self.rng = random.Random(seed)
        self.holdout = Holdout(float(cfg.eval.holdout))
        self.next_group = 0
        if self.chat_template is True and not getattr(tokenizer, "chat_template", None):
            raise ConfigError("model.chat_template=true but the tokenizer has no chat template")

    def format_prompt(self, prompt: str) -> str:
        """The prompt as the model sees it: a user turn of the tokenizer's chat template
        when ``model.chat_template`` is true (or null and the tokenizer has one)."""
        if self.chat_template is False or not getattr(self.tokenizer, "chat_template", None):
            return prompt
        return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                  tokenize=False, add_generation_prompt=True)

    def encode_prompts(self, prompts: list[str]) -> list[list[int]]:
        """Token ids of each prompt as the model sees it (:meth:`format_prompt`), unpadded."""
        return self.tokenizer([self.format_prompt(p) for p in prompts], add_special_tokens=False).input_ids

    def sample(self, n_prompts: int) -> RolloutBatch:
        """Draw ``n_prompts`` training prompts (never a held-out one) and return their scored
        groups (``rollout.n`` each), with fresh group ids."""
        rollout = self.plan.rollout
        examples = self.task.sample_train(n_prompts, self.rng, self.holdout)
        group_ids = torch.arange(self.next_group, self.next_group + n_prompts).repeat_interleave(rollout.n)
        self.next_group += n_prompts
        texts = [e.prompt for e in examples]
        token_lists = self.encode_prompts(texts)
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

    def decode(self, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        """The completions' text (special tokens such as EOS dropped)."""
        rows = [ids[mask.bool()].tolist() for ids, mask in zip(response_ids.cpu(), response_mask.cpu())]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def score(self, prompts: list[str], completions: list[str], references: list[Any],
              rows: list[dict[str, Any]]) -> torch.Tensor:
        """``(B,)`` float32 scores: the weighted sum of the reward functions
        (:meth:`rlzoo.scoring.Rewards.score`)."""
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
