"""The sampler: prompts from the task, completions from the rollout backend, rewards.

:meth:`Sampler.sample` makes one step's :class:`rlzoo.batch.RolloutBatch`: it draws
prompts with the task's own seeded RNG, formats and tokenises each once, has the rollout
backend generate ``rollout.n`` completions per prompt (with their rollout log-probs),
decodes and scores them, and adds the greedy baseline when the plan runs one. It is public
because extensions refill batches with it (``ctx.resample``).
"""

from __future__ import annotations

import random
from typing import Any

import torch

from rlzoo.batch import RolloutBatch
from rlzoo.contract import BoundComponent
from rlzoo.errors import ConfigError, TrainingError
from rlzoo.plan import RunPlan
from rlzoo.rollout import left_pad
from rlzoo.tasks import Holdout, Task


class Sampler:
    """Generate and score groups of completions.

    :param task: the prompt source.
    :param reward: the bound reward function.
    :param tokenizer: the policy's tokenizer.
    :param backend: the rollout backend (``generate``, ``sync_weights``).
    :param cfg: the run config (``rollout.*``, ``model.chat_template``).
    :param plan: the run plan (whether a greedy pass runs).
    :param device: where the batch's tensors go.
    :param seed: seeds the prompt RNG (a string makes each process's stream its own).
    """

    def __init__(self, task: Task, reward: BoundComponent, tokenizer: Any, backend: Any, cfg: Any,
                 plan: RunPlan, device: torch.device, seed: int | str) -> None:
        self.task, self.reward, self.tokenizer, self.backend = task, reward, tokenizer, backend
        self.rollout_cfg = cfg.rollout
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
        cfg = self.rollout_cfg
        examples = self.task.sample_train(n_prompts, self.rng, self.holdout)
        group_ids = torch.arange(self.next_group, self.next_group + n_prompts).repeat_interleave(cfg.n)
        self.next_group += n_prompts
        texts = [e.prompt for e in examples]
        token_lists = self.encode_prompts(texts)
        gen = self.backend.generate(token_lists, num_samples=cfg.n, max_new_tokens=cfg.max_new_tokens,
                                    temperature=cfg.temperature, top_p=cfg.top_p)
        prompt_ids, prompt_mask = left_pad(token_lists, self.tokenizer.pad_token_id)
        prompts = [p for p in texts for _ in range(cfg.n)]
        references = [e.reference for e in examples for _ in range(cfg.n)]
        rows = [dict(e.row) for e in examples for _ in range(cfg.n)]
        completions = self.decode(gen.response_ids, gen.response_mask)
        scores = self.score(prompts, completions, references, rows)
        baseline = None
        if self.plan.runs("greedy"):
            greedy = self.backend.generate(token_lists, num_samples=1, max_new_tokens=cfg.max_new_tokens,
                                           temperature=cfg.temperature, top_p=cfg.top_p, greedy=True)
            greedy_scores = self.score(texts, self.decode(greedy.response_ids, greedy.response_mask),
                                       [e.reference for e in examples], [dict(e.row) for e in examples])
            baseline = greedy_scores.repeat_interleave(cfg.n).to(self.device)
        device = self.device
        return RolloutBatch(
            prompt_ids=prompt_ids.repeat_interleave(cfg.n, 0).to(device),
            prompt_mask=prompt_mask.repeat_interleave(cfg.n, 0).to(device),
            response_ids=gen.response_ids.to(device), response_mask=gen.response_mask.to(device),
            group_ids=group_ids.to(device), scores=scores.to(device), truncated=gen.truncated.to(device),
            prompts=prompts, completions=completions, references=references,
            rollout_logp=gen.logp.to(device), baseline_scores=baseline)

    def decode(self, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        """The completions' text (special tokens such as EOS dropped)."""
        rows = [ids[mask.bool()].tolist() for ids, mask in zip(response_ids.cpu(), response_mask.cpu())]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def score(self, prompts: list[str], completions: list[str], references: list[Any],
              rows: list[dict[str, Any]]) -> torch.Tensor:
        """``(B,)`` float32 scores from the reward function (given the inputs it names).

        :raises TrainingError: the reward raised (naming the first failing sample), returned
            the wrong number of scores or a non-finite one.
        """
        name = self.reward.name
        try:
            raw = self.reward(prompts=prompts, completions=completions, references=references, rows=rows)
        except Exception as exc:  # noqa: BLE001 - name the reward and find the sample
            for i in range(len(prompts)):
                try:
                    self.reward(prompts=prompts[i:i + 1], completions=completions[i:i + 1],
                                references=references[i:i + 1], rows=rows[i:i + 1])
                except Exception:  # noqa: BLE001
                    raise TrainingError(
                        f"reward function {name!r} raised {type(exc).__name__}: {exc} on sample "
                        f"prompt={prompts[i]!r} completion={completions[i]!r}"
                    ) from exc
            raise TrainingError(f"reward function {name!r} raised {type(exc).__name__}: {exc}") from exc
        try:
            scores = torch.as_tensor(raw, dtype=torch.float32).reshape(-1)
        except (TypeError, ValueError) as exc:
            raise TrainingError(f"reward function {name!r} returned {type(raw).__name__}, "
                                f"not a list of {len(prompts)} floats") from exc
        if scores.numel() != len(prompts) or torch.as_tensor(raw).dim() > 1:
            raise TrainingError(f"reward function {name!r} returned {scores.numel()} scores "
                                f"(shape {tuple(torch.as_tensor(raw).shape)}) for {len(prompts)} "
                                f"completions; expected shape ({len(prompts)},)")
        bad = (~torch.isfinite(scores)).nonzero().flatten().tolist()
        if bad:
            i = bad[0]
            raise TrainingError(f"reward function {name!r} returned {scores[i].item()} (non-finite) "
                                f"for prompt={prompts[i]!r} completion={completions[i]!r}")
        return scores

    def state_dict(self) -> dict[str, Any]:
        """The prompt RNG, group counter and the task's position in its data (plain values,
        for checkpoints)."""
        return {"rng": self.rng.getstate(), "next_group": self.next_group, "task": self.task.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.next_group = int(state["next_group"])
        self.task.load_state_dict(state.get("task", {}))
