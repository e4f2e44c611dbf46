"""The training engine: moves a batch through fixed stages and asks plugins at each.

    prompts -> rollout -> rewards -> ref / critic -> KL -> advantages -> update -> log/ckpt

The engine holds no algorithm formula: advantages, policy loss, KL estimator and
controller, aggregation and value loss are the components the config chose. It builds
only what those components declare they need (reference model, critic, greedy rollout,
full logits) and skips passes nobody needs (no old-log-prob forward for one on-policy
update epoch, no reference forward without KL).
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from omegaconf import OmegaConf

from rlzoo import distributed
from rlzoo.batch import BatchCounts, RolloutBatch
from rlzoo.checkpoint import latest_checkpoint, load_state, save_checkpoint
from rlzoo.config import ResolvedConfig, needs_of
from rlzoo.errors import ConfigError, TrainingError
from rlzoo.logprobs import ResponseForward, full_sequence, response_forward
from rlzoo.masked import masked_mean
from rlzoo.models import DTYPES, ValueModel, build_char_tokenizer, build_tiny_model, load_pretrained
from rlzoo.plugins import PluginManager
from rlzoo.registry import Component, Registry
from rlzoo.rollout import generate, left_pad
from rlzoo.tasks import Task
from rlzoo.tracking import Tracker

INIT_MODEL_DIR = "init_model"


@dataclass
class RunContext:
    """What lifecycle hooks see of the run.

    :ivar cfg: the resolved config.
    :ivar step: the current step (1-based once training starts).
    :ivar run_dir: where logs and checkpoints go.
    :ivar resample: ``resample(n_prompts) -> RolloutBatch``: generate and score groups for
        ``n_prompts`` fresh prompts (used by dynamic sampling to refill a batch).
    :ivar state: per-run scratch space for extensions (saved in checkpoints: its values
        must be tensors, str, int, float, bool, None, or dicts / lists / tuples of them).
    :ivar metrics: this step's extra metrics; hooks add ``name -> float`` to log them
        (under torchrun: averaged over the processes).
    :ivar counts: this step's extra metrics that count things in the batch (summed over
        the processes under torchrun, so they equal a single process's count).
    :ivar prompts: prompts (groups) this process generates per step:
        ``rollout.prompts_per_step`` divided by the number of processes.
    """

    cfg: Any
    run_dir: Path
    step: int = 0
    resample: Callable[[int], RolloutBatch] | None = None
    state: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)
    prompts: int = 0


def _run_name(cfg: Any) -> str:
    if cfg.run_name:
        return str(cfg.run_name)
    task = cfg.task.name
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{cfg.algo or 'custom'}-{task}-s{cfg.seed}-{stamp}"


def _lr_lambda(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return 1.0 - progress
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return factor


class Trainer:
    """One RL run. ``Trainer(resolved, registry, pm).run()``; see :func:`train`."""

    def __init__(self, resolved: ResolvedConfig, registry: Registry, pm: PluginManager) -> None:
        self.resolved = resolved
        self.registry = registry
        self.pm = pm
        cfg = self.cfg = resolved.cfg
        self.needs = needs_of(resolved)
        if "groups" in self.needs and cfg.rollout.n < 2:
            names = [c.name for c in resolved.components.values() if "groups" in c.needs]
            raise ConfigError(
                f"{', '.join(names)} need groups of completions: set rollout.n >= 2 "
                f"(got {cfg.rollout.n})"
            )
        if cfg.trainer.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("trainer.device=cuda but no CUDA device is available")
        auto = "cuda" if torch.cuda.is_available() else "cpu"
        device_type = auto if cfg.trainer.device == "auto" else cfg.trainer.device
        if cfg.trainer.threads:
            torch.set_num_threads(int(cfg.trainer.threads))
        world = distributed.env_world_size()
        if cfg.rollout.prompts_per_step % world:
            raise ConfigError(f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} must be divisible "
                              f"by the number of processes ({world}): each rank takes whole groups")
        self.dist = distributed.init(cfg.distributed.backend, device_type, cfg.distributed.timeout_s)
        self.local_prompts = cfg.rollout.prompts_per_step // self.dist.world
        self.device = (torch.device(device_type, self.dist.local_rank) if device_type == "cuda"
                       and self.dist.enabled else torch.device(device_type))

        self.resume_from = latest_checkpoint(cfg.resume) if cfg.resume else None
        if cfg.resume and self.resume_from is None:
            raise ConfigError(f"resume={cfg.resume!r}: no checkpoint found in {cfg.resume}/checkpoints")
        self._resume_state = load_state(self.resume_from) if self.resume_from is not None else None
        if self._resume_state is not None:
            saved_world = int(self._resume_state.get("world_size", 1))
            if saved_world != self.dist.world:
                raise ConfigError(f"{self.resume_from} was written by {saved_world} process(es); resume "
                                  f"it with the same number (this job has {self.dist.world})")
        run_dir = str(cfg.resume or cfg.run_dir or Path("runs") / _run_name(cfg))
        self.run_dir = Path(distributed.broadcast_object(run_dir, self.dist))

        self.task: Task = self._build("task")
        self.reward_component, self.reward_fn = self._reward()
        self.advantage_fn = self._bound("advantage")
        self.policy_loss_component = resolved.components["policy_loss"]
        self.policy_loss_fn = self._bound("policy_loss")
        loss_agg = self.policy_loss_component.meta.get("loss_agg")
        self.policy_agg_fn = (registry.get("loss_agg", loss_agg).bind()
                              if loss_agg else self._bound("loss_agg"))
        self.agg_fn = self._bound("loss_agg")
        self.kl_coef0 = float(cfg.kl.coef)
        self.kl_fn = self._bound("kl.penalty") if self.kl_coef0 > 0 else None
        controller = resolved.components["kl.controller"]
        self.kl_controller = controller.fn(self.kl_coef0, resolved.params["kl.controller"])
        self.value_loss_fn = self._bound("value_loss") if "critic" in self.needs else None

        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        # rank 0 draws what a single process draws; other ranks their own streams
        self.sample_rng = random.Random(cfg.seed if self.dist.rank == 0 else f"{cfg.seed}/rank{self.dist.rank}")
        self.policy, self.tokenizer = self._policy()
        self.reference = None
        if "reference" in self.needs:
            self.reference = copy.deepcopy(self.policy).eval().requires_grad_(False)
        self.critic = None
        if "critic" in self.needs:
            self.critic = ValueModel.from_policy_config(self.policy.config, self.policy).to(self.device)
        self.policy.to(self.device)
        if self.reference is not None:
            self.reference.to(self.device)
        if cfg.model.gradient_checkpointing:
            self.policy.gradient_checkpointing_enable()
        if self.critic is not None and self.resume_from is not None:
            self.critic.load_from(self.resume_from / "critic")  # before any sharding
        self.policy_forward: torch.nn.Module = ResponseForward(self.policy)
        self.critic_forward: torch.nn.Module | None = self.critic
        if self.dist.enabled:
            self.policy_forward = self._wrap(self.policy_forward)
            if self.critic is not None:
                self.critic_forward = self._wrap(self.critic)
            if self.dist.rank:
                torch.manual_seed(cfg.seed + 1_000_003 * self.dist.rank)  # distinct rollouts per rank

        tcfg = cfg.trainer
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=tcfg.lr,
                                           betas=tuple(tcfg.betas), weight_decay=tcfg.weight_decay)
        lam = _lr_lambda(tcfg.lr_schedule, tcfg.warmup_steps, tcfg.total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lam)
        self.critic_optimizer = self.critic_scheduler = None
        if self.critic is not None:
            self.critic_optimizer = torch.optim.AdamW(self.critic.parameters(), lr=tcfg.critic_lr,
                                                      betas=tuple(tcfg.betas),
                                                      weight_decay=tcfg.weight_decay)
            self.critic_scheduler = torch.optim.lr_scheduler.LambdaLR(self.critic_optimizer, lam)

        self.ctx = RunContext(cfg=cfg, run_dir=self.run_dir, resample=self._resample,
                              prompts=self.local_prompts)
        self.extensions = []
        for component, params in resolved.extensions:
            plugin = component.fn(params)
            self.pm.register(plugin, name=f"extension:{component.name}:{id(plugin)}")
            self.extensions.append((component.name, plugin))
        self.step = 0
        self._stop_requested = False

    # -------------------------------------------------------------- construction helpers

    def _build(self, path: str) -> Any:
        component = self.resolved.components[path]
        params = self.resolved.params[path]
        try:
            return component.fn(params) if component.params is not None else component.fn()
        except ConfigError:
            raise
        except (ValueError, OSError) as exc:
            raise ConfigError(f"{path} {component.name!r}: {exc}") from exc

    def _bound(self, path: str) -> Callable[..., Any]:
        return self.resolved.components[path].bind(self.resolved.params[path])

    def _wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """``module`` under the configured data-parallel strategy (called with > 1 rank)."""
        if self.cfg.distributed.strategy == "fsdp":
            example = None
            if isinstance(module, ResponseForward):  # one token of prompt and of response
                token = torch.zeros((1, 1), dtype=torch.long, device=self.device)
                example = (token, torch.ones_like(token), token, torch.ones_like(token))
            return distributed.fully_shard_model(module, self.device, example)
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=ids)

    def _sync_context(self, module: torch.nn.Module, last: bool) -> Any:
        """No gradient all-reduce except on a mini-batch's last micro-batch (DDP)."""
        if not last and hasattr(module, "no_sync"):
            return module.no_sync()
        return contextlib.nullcontext()

    def _reward(self) -> tuple[Component, Callable[..., Any]]:
        if "reward" in self.resolved.components:
            return self.resolved.components["reward"], self._bound("reward")
        task = self.resolved.components["task"]
        name = task.meta.get("reward")
        if name is None:
            raise ConfigError(f"task {task.name!r} names no default reward: set reward=NAME "
                              f"(registered: {', '.join(self.registry.names('reward'))})")
        component = self.registry.get("reward", name)
        return component, component.bind()

    def _policy(self) -> tuple[Any, Any]:
        cfg = self.cfg
        if self.resume_from is not None:
            return load_pretrained(self.resume_from / "policy", cfg.model.dtype)
        if cfg.model.path:
            model, tokenizer = load_pretrained(cfg.model.path, cfg.model.dtype)
        else:
            if self.task.alphabet is None:
                raise ConfigError(f"task {self.resolved.components['task'].name!r} needs a real "
                                  "tokenizer: set model.path to a local model directory")
            tokenizer = build_char_tokenizer(self.task.alphabet)
            max_positions = 4 * (cfg.rollout.max_new_tokens + 64)
            model = build_tiny_model(cfg.model, tokenizer, max_positions).to(DTYPES[cfg.model.dtype])
        return model, tokenizer

    # -------------------------------------------------------------- rollout and scoring

    def format_prompt(self, prompt: str) -> str:
        """The prompt as the model sees it: a user turn of the tokenizer's chat template
        when ``model.chat_template`` is true (or null and the tokenizer has one)."""
        mode = self.cfg.model.chat_template
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        if mode is True and not has_template:
            raise ConfigError("model.chat_template=true but the tokenizer has no chat template")
        if mode is False or not has_template:
            return prompt
        return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                  tokenize=False, add_generation_prompt=True)

    def _encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ``(len(prompts), P)`` ids and mask (one tokenizer call for the list)."""
        ids = self.tokenizer([self.format_prompt(p) for p in prompts], add_special_tokens=False).input_ids
        prompt_ids, prompt_mask = left_pad(ids, self.tokenizer.pad_token_id)
        return prompt_ids.to(self.device), prompt_mask.to(self.device)

    def _decode(self, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        rows = [ids[mask.bool()].tolist() for ids, mask in zip(response_ids.cpu(), response_mask.cpu())]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def _score(self, prompts: list[str], completions: list[str], references: list[Any]) -> torch.Tensor:
        name = self.reward_component.name
        try:
            raw = self.reward_fn(prompts, completions, references)
        except Exception as exc:  # noqa: BLE001 - name the reward and find the sample
            for i in range(len(prompts)):
                try:
                    self.reward_fn(prompts[i:i + 1], completions[i:i + 1], references[i:i + 1])
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

    def _resample(self, n_prompts: int) -> RolloutBatch:
        return self._rollout(n_prompts)

    def _rollout(self, n_prompts: int) -> RolloutBatch:
        cfg = self.cfg.rollout
        examples = self.task.sample(n_prompts, self.sample_rng)
        group_base = self.ctx.state.setdefault("_next_group", 0)
        self.ctx.state["_next_group"] = group_base + n_prompts
        prompts = [e.prompt for e in examples for _ in range(cfg.n)]
        references = [e.reference for e in examples for _ in range(cfg.n)]
        group_ids = torch.arange(group_base, group_base + n_prompts).repeat_interleave(cfg.n)
        unique_ids, unique_mask = self._encode([e.prompt for e in examples])  # each prompt once
        self.policy.eval()
        with distributed.gathered(self.policy_forward):  # prefilled once per group
            gen = generate(self.policy, unique_ids, unique_mask, max_new_tokens=cfg.max_new_tokens,
                           eos_id=self.tokenizer.eos_token_id, pad_id=self.tokenizer.pad_token_id,
                           temperature=cfg.temperature, top_p=cfg.top_p, num_samples=cfg.n)
        prompt_ids = unique_ids.repeat_interleave(cfg.n, 0)
        prompt_mask = unique_mask.repeat_interleave(cfg.n, 0)
        completions = self._decode(gen.response_ids, gen.response_mask)
        scores = self._score(prompts, completions, references)
        baseline = None
        if "greedy" in self.needs:
            unique_prompts = [e.prompt for e in examples]
            with distributed.gathered(self.policy_forward):
                greedy = generate(self.policy, unique_ids, unique_mask, max_new_tokens=cfg.max_new_tokens,
                                  eos_id=self.tokenizer.eos_token_id,
                                  pad_id=self.tokenizer.pad_token_id, greedy=True)
            greedy_scores = self._score(unique_prompts, self._decode(greedy.response_ids, greedy.response_mask),
                                        [e.reference for e in examples])
            baseline = greedy_scores.repeat_interleave(cfg.n)
        return RolloutBatch(
            prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=gen.response_ids,
            response_mask=gen.response_mask, group_ids=group_ids.to(self.device),
            scores=scores.to(self.device), truncated=gen.truncated, prompts=prompts,
            completions=completions, references=references,
            baseline_scores=None if baseline is None else baseline.to(self.device),
        )

    # -------------------------------------------------------------- per-step stages

    def _micro_batches(self, size: int, rows: torch.Tensor) -> list[torch.Tensor]:
        return list(rows.split(self.cfg.trainer.micro_batch_size)) if size else []

    @torch.no_grad()
    def _forward_logp(self, module: torch.nn.Module, batch: RolloutBatch,
                      with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of ``batch`` under ``module`` (a :class:`ResponseForward`,
        possibly wrapped), micro-batch by micro-batch; ``(B, T)`` each."""
        logps, entropies = [], []
        for rows in self._micro_batches(len(batch), torch.arange(len(batch))):
            mb = batch.select(rows)
            logp, entropy, _ = module(mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask,
                                      chunk_size=self.cfg.trainer.logprob_chunk_size, with_entropy=with_entropy)
            logps.append(logp)
            entropies.append(entropy)
        return torch.cat(logps), (torch.cat(entropies) if with_entropy else None)

    @torch.no_grad()
    def _forward_values(self, batch: RolloutBatch) -> torch.Tensor:
        parts = []
        for rows in self._micro_batches(len(batch), torch.arange(len(batch))):
            mb = batch.select(rows)
            parts.append(self._values(mb))
        return torch.cat(parts)

    def _values(self, mb: RolloutBatch, critic: torch.nn.Module | None = None) -> torch.Tensor:
        input_ids, attention, positions = full_sequence(mb.prompt_ids, mb.prompt_mask,
                                                        mb.response_ids, mb.response_mask)
        values = (critic or self.critic)(input_ids, attention, positions)
        start = mb.prompt_ids.shape[1] - 1
        return values[:, start:start + mb.response_ids.shape[1]] * mb.response_mask

    def _needs_old_logp(self) -> bool:
        t = self.cfg.trainer
        kl_in_reward = self.kl_fn is not None and self.cfg.kl.apply == "reward"
        return t.ppo_epochs > 1 or t.mini_batches > 1 or kl_in_reward or "entropy" in self.needs

    def _prepare(self, batch: RolloutBatch, metrics: dict[str, float]) -> None:
        """Old/ref log-probs, values, KL, token rewards and advantages."""
        if self._needs_old_logp():
            self.policy.eval()
            batch.old_logp, batch.old_entropy = self._forward_logp(
                self.policy_forward, batch, with_entropy="entropy" in self.needs)
        if self.kl_fn is not None:
            batch.ref_logp, _ = self._forward_logp(ResponseForward(self.reference), batch)
        if self.critic is not None:
            self.critic.eval()
            batch.old_values = self._forward_values(batch)
        with distributed.batch_statistics(self.dist.enabled):
            self._advantages(batch, metrics)

    def _advantages(self, batch: RolloutBatch, metrics: dict[str, float]) -> None:
        """KL in the reward, token rewards and advantages (batch statistics over all ranks)."""
        mask = batch.response_mask
        last = (batch.response_lengths.long() - 1).clamp(min=0)
        token_rewards = torch.zeros_like(mask)
        has_tokens = batch.response_lengths > 0
        token_rewards[has_tokens, last[has_tokens]] = batch.rewards[has_tokens]
        beta = float(self.kl_controller.value)
        if self.kl_fn is not None and self.cfg.kl.apply == "reward":
            if "logits" in self.resolved.components["kl.penalty"].needs:
                raise ConfigError("kl.penalty 'full' needs logits and works only with kl.apply=loss")
            kl = self.kl_fn(batch.old_logp, batch.ref_logp)
            batch.kl = torch.where(mask.bool(), kl, torch.zeros_like(kl))
            token_rewards = token_rewards - beta * batch.kl
            current_kl = float(masked_mean(batch.kl.sum(-1), has_tokens.float()))
            metrics["kl/value"] = current_kl
            self.kl_controller.update(current_kl, len(batch) * self.dist.world)
        batch.token_rewards = token_rewards
        advantages, returns = self.advantage_fn(
            token_rewards, mask, batch.group_ids, batch.old_values, batch.baseline_scores
        )
        _check_finite(advantages, "advantage estimation", self.resolved.components["advantage"].name)
        batch.advantages, batch.returns = advantages, returns
        metrics["advantages/mean"] = float(masked_mean(advantages, mask))
        if batch.returns is not None and self.critic is not None:
            metrics["value/returns_mean"] = float(masked_mean(returns, mask))

    def _update(self, batch: RolloutBatch, metrics: dict[str, float]) -> None:
        t = self.cfg.trainer
        sums: dict[str, float] = {}
        weights: dict[str, float] = {}

        def add(name: str, value: float, weight: float) -> None:
            sums[name] = sums.get(name, 0.0) + value * weight
            weights[name] = weights.get(name, 0.0) + weight

        kl_as_loss = self.kl_fn is not None and self.cfg.kl.apply == "loss"
        need_logits = kl_as_loss and "logits" in self.resolved.components["kl.penalty"].needs
        beta = float(self.kl_controller.value)
        grad_norms = []
        for _ in range(t.ppo_epochs):
            order = torch.randperm(len(batch))
            for mini_rows in order.chunk(t.mini_batches):
                mini = batch.select(mini_rows)
                counts = self._global_counts(mini)
                self.policy.train()
                self.optimizer.zero_grad(set_to_none=True)
                micro = self._micro_batches(len(mini), torch.arange(len(mini)))
                for index, rows in enumerate(micro):
                    mb = mini.select(rows)
                    sync = self._sync_context(self.policy_forward, last=index == len(micro) - 1)
                    with sync:
                        logp, entropy, logits = self.policy_forward(
                            mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask,
                            chunk_size=t.logprob_chunk_size, with_entropy=True, with_logits=need_logits)
                        loss = self._policy_micro_loss(mb, logp, entropy, logits, counts, beta, add)
                        (loss * self.dist.world).backward()  # DDP averages over ranks; counts are global
                norm = distributed.local_value(
                    torch.nn.utils.clip_grad_norm_(self.policy.parameters(), t.max_grad_norm))
                _check_finite(norm, "policy gradient", self.policy_loss_component.name)
                grad_norms.append(float(norm))
                self.optimizer.step()
                if self.critic is not None:
                    self._critic_update(mini, counts, add)
        sums = distributed.all_reduce_floats(sums, self.dist)
        weights = distributed.all_reduce_floats(weights, self.dist)
        for name, total in sums.items():
            metrics[name] = total / max(weights[name], 1e-12)
        metrics["grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0

    def _global_counts(self, mini: RolloutBatch) -> BatchCounts:
        """Token and sequence counts of the mini-batch summed over all ranks."""
        local = {"tokens": float(mini.loss_mask.sum()),
                 "sequences": float((mini.loss_mask.sum(-1) > 0).sum())}
        total = distributed.all_reduce_floats(local, self.dist)
        return BatchCounts(tokens=total["tokens"], sequences=total["sequences"],
                           max_response_length=int(self.cfg.rollout.max_new_tokens))

    def _policy_micro_loss(self, mb: RolloutBatch, logp: torch.Tensor, entropy: torch.Tensor,
                           logits: torch.Tensor | None, counts: BatchCounts, beta: float,
                           add: Callable[[str, float, float], None]) -> torch.Tensor:
        """This micro-batch's share of the mini-batch loss (aggregated by global ``counts``)."""
        t = self.cfg.trainer
        mask = mb.loss_mask
        old_logp = mb.old_logp if mb.old_logp is not None else logp.detach()
        token_loss, loss_metrics = self.policy_loss_fn(logp, old_logp, mb.advantages, mask)
        loss = self.policy_agg_fn(token_loss, mask, counts=counts)
        weight = float(mask.sum())
        add("policy/loss", float(loss.detach()) * counts.tokens / max(weight, 1.0), weight)
        for key, value in loss_metrics.items():
            add(f"policy/{key}", float(value), weight)
        if self.kl_fn is not None and self.cfg.kl.apply == "loss":
            extra = {"logits": logits, "ref_logits": self._ref_logits(mb)} if logits is not None else {}
            kl = self.kl_fn(logp, mb.ref_logp, **extra)
            loss = loss + beta * self.agg_fn(kl, mask, counts=counts)
            add("kl/value", float(masked_mean(kl.detach(), mask)), weight)
        entropy_loss = self.agg_fn(entropy, mask, counts=counts)
        add("entropy", float(masked_mean(entropy.detach(), mask)), weight)
        if t.entropy_coef:
            loss = loss - t.entropy_coef * entropy_loss
        _check_finite(loss, "policy loss", self.policy_loss_component.name)
        return loss

    @torch.no_grad()
    def _ref_logits(self, mb: RolloutBatch) -> torch.Tensor:
        return response_forward(self.reference, mb.prompt_ids, mb.prompt_mask, mb.response_ids,
                                mb.response_mask, with_logits=True).logits

    def _critic_update(self, mini: RolloutBatch, counts: BatchCounts,
                       add: Callable[[str, float, float], None]) -> None:
        t = self.cfg.trainer
        self.critic.train()
        self.critic_optimizer.zero_grad(set_to_none=True)
        micro = self._micro_batches(len(mini), torch.arange(len(mini)))
        for index, rows in enumerate(micro):
            mb = mini.select(rows)
            with self._sync_context(self.critic_forward, last=index == len(micro) - 1):
                values = self._values(mb, self.critic_forward)
                token_loss, value_metrics = self.value_loss_fn(values, mb.old_values, mb.returns,
                                                               mb.response_mask)
                loss = self.agg_fn(token_loss, mb.response_mask, counts=counts)
                _check_finite(loss, "value loss", self.resolved.components["value_loss"].name)
                (loss * self.dist.world).backward()
            weight = float(mb.response_mask.sum())
            add("value/loss", float(loss.detach()) * counts.tokens / max(weight, 1.0), weight)
            for key, value in value_metrics.items():
                add(f"value/{key}", float(value), weight)
        norm = distributed.local_value(torch.nn.utils.clip_grad_norm_(self.critic.parameters(), t.max_grad_norm))
        _check_finite(norm, "value gradient", self.resolved.components["value_loss"].name)
        add("value/grad_norm", float(norm), 1.0)
        self.critic_optimizer.step()

    # -------------------------------------------------------------- checkpoints

    def _rng_state(self) -> dict[str, Any]:
        return {
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "python_rng": random.getstate(),
            "numpy_rng": _numpy_state_plain(np.random.get_state()),
            "sample_rng": self.sample_rng.getstate(),
            "ctx_state": dict(self.ctx.state),
        }

    def _set_rng_state(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        random.setstate(state["python_rng"])
        np.random.set_state(_numpy_state_from_plain(state["numpy_rng"]))
        self.sample_rng.setstate(state["sample_rng"])
        self.ctx.state.update(state["ctx_state"])

    def _trainer_state(self) -> dict[str, Any]:
        """Everything but the weights; a collective (RNG states gathered, sharded optimizer
        states unsharded), so every rank calls it."""
        ranks = distributed.gather_objects(self._rng_state(), self.dist)
        return {
            "step": self.step,
            "world_size": self.dist.world,
            "ranks": ranks,
            "optimizer": distributed.optimizer_state(self.policy_forward, self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "critic_optimizer": (distributed.optimizer_state(self.critic, self.critic_optimizer)
                                 if self.critic_optimizer else None),
            "critic_scheduler": self.critic_scheduler.state_dict() if self.critic_scheduler else None,
            "kl_controller": self.kl_controller.state_dict(),
            "extensions": {name: plugin.state_dict() for name, plugin in self.extensions
                           if hasattr(plugin, "state_dict")},
        }

    def _saveable_models(self) -> dict[str, Any]:
        """``name -> object with save_pretrained`` for the checkpoint (a collective when
        the models are sharded: their whole weights are gathered on every rank)."""
        models: dict[str, Any] = {"policy": self._saveable(self.policy, self.policy_forward, "model."),
                                  "policy:tokenizer": self.tokenizer}
        if self.critic is not None:
            models["critic"] = self._saveable(self.critic, self.critic, "")
        return models

    @staticmethod
    def _saveable(model: Any, wrapper: torch.nn.Module, prefix: str) -> Any:
        if not distributed.is_sharded(wrapper):
            return model
        return _WithStateDict(model, distributed.full_state_dict(wrapper, prefix))

    def save(self) -> Path:
        """Write a checkpoint of this step (a collective: every rank calls it; rank 0 writes)."""
        models, state = self._saveable_models(), self._trainer_state()
        path = self.run_dir / "checkpoints"
        if self.dist.is_main:
            path = save_checkpoint(self.run_dir, self.step, models, state, keep=self.cfg.checkpoint.keep)
        distributed.barrier(self.dist)
        return path

    def _restore(self) -> None:
        """Load the trainer state of ``resume_from`` (weights were loaded at construction)."""
        state = self._resume_state
        self.step = int(state["step"])
        distributed.load_optimizer_state(self.policy_forward, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None:
            distributed.load_optimizer_state(self.critic, self.critic_optimizer, state["critic_optimizer"])
            self.critic_scheduler.load_state_dict(state["critic_scheduler"])
        self.kl_controller.load_state_dict(state["kl_controller"])
        self._set_rng_state(state["ranks"][self.dist.rank])
        for name, plugin in self.extensions:
            if name in state["extensions"] and hasattr(plugin, "load_state_dict"):
                plugin.load_state_dict(state["extensions"][name])

    # -------------------------------------------------------------- the loop

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self._stop_requested:
            raise KeyboardInterrupt
        self._stop_requested = True
        print("\nrlzoo: interrupt received; finishing this step and writing a checkpoint "
              "(press Ctrl-C again to abort without one)", flush=True)

    def run(self) -> dict[str, float]:
        """Train for ``trainer.total_steps`` steps; returns the last step's metrics."""
        cfg = self.cfg
        main = self.dist.is_main
        init_dir = self.run_dir / INIT_MODEL_DIR
        if self.resume_from is None:
            initial = self._saveable(self.policy, self.policy_forward, "model.")
            if main:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                initial.save_pretrained(str(init_dir))
                self.tokenizer.save_pretrained(str(init_dir))
                (self.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
            distributed.barrier(self.dist)
        else:
            if self.reference is not None:
                init, _ = load_pretrained(init_dir, cfg.model.dtype)
                self.reference = init.eval().requires_grad_(False).to(self.device)
            self._restore()
        tracker = None
        if main:
            tracker = Tracker(str(self.run_dir), purge_step=self.step + 1 if self.resume_from else None)
            if self.resume_from is None:
                tracker.log_hparams(cfg)
        previous = signal.getsignal(signal.SIGINT)
        in_main_thread = True
        try:
            signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:
            in_main_thread = False
        progress = None
        if cfg.logging.progress and main:
            from tqdm import tqdm

            progress = tqdm(total=cfg.trainer.total_steps, initial=self.step, desc="rlzoo train",
                            dynamic_ncols=True)
        status = "failed"
        metrics: dict[str, float] = {}
        try:
            while self.step < cfg.trainer.total_steps:
                metrics = self.train_step()
                self.pm.hook.rlzoo_step_end(step=self.step, metrics=metrics, ctx=self.ctx)
                if tracker is not None and (self.step % cfg.logging.log_every == 0
                                            or self.step == cfg.trainer.total_steps):
                    tracker.log_scalars(self.step, metrics)
                if tracker is not None and cfg.logging.sample_every and self.step % cfg.logging.sample_every == 0:
                    tracker.log_samples(self.step, self._last_samples)
                if progress is not None:
                    progress.update(1)
                    progress.set_postfix(reward=f"{metrics['reward/mean']:.3f}",
                                         step_s=f"{metrics['timing/step_s']:.2f}")
                every = cfg.checkpoint.every
                if self.dist.enabled:  # every rank stops at the same step (Ctrl-C reaches them apart)
                    flag = distributed.all_reduce_floats({"stop": float(self._stop_requested)}, self.dist, "max")
                    self._stop_requested = flag["stop"] > 0
                if self._stop_requested or (every and self.step % every == 0) \
                        or self.step == cfg.trainer.total_steps:
                    if tracker is not None:
                        tracker.flush()
                    self.save()
                if self._stop_requested:
                    status = "interrupted"
                    break
            else:
                status = "completed"
        finally:
            if progress is not None:
                progress.close()
            if tracker is not None:
                tracker.close()
            if in_main_thread:
                signal.signal(signal.SIGINT, previous)
            self.pm.hook.rlzoo_run_end(ctx=self.ctx, status=status)
            if main:
                write_status(self.run_dir, status, self.step, cfg.trainer.total_steps)
            for _, plugin in self.extensions:
                self.pm.unregister(plugin)
        if main and status == "interrupted":
            print(f"rlzoo: checkpoint written at step {self.step}; continue with "
                  f"`rlzoo train resume={self.run_dir}`", flush=True)
        elif main and status == "completed":
            print(summary_line(self.run_dir), flush=True)
        return metrics

    def train_step(self) -> dict[str, float]:
        """Run one training step (rollout → update) and return its metrics; no logging,
        checkpointing or lifecycle ``step_end`` (``run`` does those)."""
        self.step += 1
        self.ctx.step = self.step
        metrics: dict[str, float] = {}
        self.ctx.metrics, self.ctx.counts = {}, {}
        start = time.perf_counter()
        batch = self._rollout(self.local_prompts)
        for impl in self.pm.hook.rlzoo_after_rollout.get_hookimpls():  # registration order
            result = impl.function(batch=batch, ctx=self.ctx)  # each sees the previous result
            if result is not None:
                batch = result
        self.pm.hook.rlzoo_shape_rewards(batch=batch, ctx=self.ctx)
        rollout_s = time.perf_counter() - start
        scores, rewards, lengths, truncated = self._gather_rows(batch)
        metrics["reward/mean"] = float(scores.mean())
        metrics["reward/std"] = float(scores.std()) if len(scores) > 1 else 0.0
        metrics["reward/max"] = float(scores.max())
        if not torch.equal(rewards, scores):
            metrics["reward/shaped_mean"] = float(rewards.mean())
        metrics["response_length/mean"] = float(lengths.mean())
        metrics["response_length/truncated_frac"] = float(truncated.float().mean())
        scores = batch.scores
        self._last_samples = [(batch.prompts[i], batch.completions[i], float(scores[i]))
                              for i in range(min(8, len(batch)))]
        update_start = time.perf_counter()
        metrics.update(self.learn(batch))
        self.scheduler.step()
        if self.critic_scheduler is not None:
            self.critic_scheduler.step()
        update_s = time.perf_counter() - update_start
        tokens = distributed.all_reduce_floats(
            {"tokens": float(batch.response_mask.sum() + batch.prompt_mask.sum())}, self.dist)["tokens"]
        metrics.setdefault("kl/value", 0.0)
        metrics["kl/coef"] = float(self.kl_controller.value) if self.kl_fn is not None else 0.0
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        metrics["timing/rollout_s"] = rollout_s
        metrics["timing/update_s"] = update_s
        metrics["timing/step_s"] = time.perf_counter() - start
        metrics["throughput/tokens_per_s"] = tokens / max(metrics["timing/step_s"], 1e-9)
        metrics.update(distributed.all_reduce_floats(self.ctx.metrics, self.dist, op="mean"))
        metrics.update(distributed.all_reduce_floats(self.ctx.counts, self.dist, op="sum"))
        return metrics

    def learn(self, batch: RolloutBatch) -> dict[str, float]:
        """Everything after scoring, on this process's share of the global batch: old /
        reference log-probs and values as needed, KL, advantages (batch statistics over all
        ranks), then ``ppo_epochs`` × ``mini_batches`` optimizer steps. Fills ``batch``'s
        fields and returns the update's metrics (averaged over all ranks).
        """
        metrics: dict[str, float] = {}
        self._prepare(batch, metrics)
        self.pm.hook.rlzoo_before_update(batch=batch, ctx=self.ctx)
        self._update(batch, metrics)
        return metrics

    def _gather_rows(self, batch: RolloutBatch) -> tuple[torch.Tensor, ...]:
        """``(scores, rewards, lengths, truncated)`` of the global batch (all ranks), on CPU."""
        local = (batch.scores.cpu(), batch.rewards.cpu(), batch.response_lengths.cpu(),
                 batch.truncated.cpu())
        parts = distributed.gather_objects(local, self.dist)
        return tuple(torch.cat([part[i] for part in parts]) for i in range(4))


def _numpy_state_plain(state: tuple) -> dict[str, Any]:
    """NumPy's legacy RNG state as plain values and a tensor (loadable with weights_only)."""
    name, keys, pos, has_gauss, cached = state
    return {"name": str(name), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def _numpy_state_from_plain(state: dict[str, Any]) -> tuple:
    return (state["name"], state["keys"].numpy().astype(np.uint32), state["pos"], state["has_gauss"],
            state["cached_gaussian"])


class _WithStateDict:
    """A model's ``save_pretrained`` with given (gathered) weights."""

    def __init__(self, model: Any, state_dict: dict[str, torch.Tensor]) -> None:
        self.model, self.state_dict = model, state_dict

    def save_pretrained(self, path: str) -> None:
        self.model.save_pretrained(path, state_dict=self.state_dict)


def summary_line(run_dir: Path) -> str:
    """One line about a finished run: steps, time, mean reward of the first and last 10%."""
    from rlzoo.events import read_scalars

    curves = read_scalars(run_dir)
    rewards = [v for _, v in curves.get("reward/mean", [])]
    if not rewards:
        return f"rlzoo: run finished; logs in {run_dir}"
    tail = max(1, len(rewards) // 10)
    seconds = sum(v for _, v in curves.get("timing/step_s", []))
    return (f"rlzoo: {len(rewards)} steps in {seconds:.0f} s of training; reward/mean "
            f"{np.mean(rewards[:tail]):.3f} (first 10%) -> {np.mean(rewards[-tail:]):.3f} (last 10%); "
            f"logs: tensorboard --logdir {run_dir}")


STATUS_FILE = "status.json"


def write_status(run_dir: Path, status: str, step: int, total_steps: int) -> None:
    """Record how the run ended (``rlzoo sweep`` skips completed runs)."""
    import json

    tmp = run_dir / f".{STATUS_FILE}.tmp"
    tmp.write_text(json.dumps({"status": status, "step": step, "total_steps": total_steps}))
    tmp.replace(run_dir / STATUS_FILE)


def read_status(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``status.json`` (``status``, ``step``, ``total_steps``), or ``None``."""
    import json

    path = Path(run_dir) / STATUS_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _check_finite(value: torch.Tensor, stage: str, component: str) -> None:
    if not bool(torch.isfinite(value).all()):
        raise TrainingError(f"non-finite value in {stage} (component {component!r}); the step "
                            "was stopped and no checkpoint was written for it")


def train(resolved: ResolvedConfig, registry: Registry, pm: PluginManager) -> dict[str, float]:
    """Build a :class:`Trainer` and run it; returns the last step's metrics.

    Under ``torchrun`` every process calls this; the process group is left at the end.
    """
    metrics = Trainer(resolved, registry, pm).run()
    distributed.shutdown()  # on an error the process exits instead, and torchrun stops the others
    return metrics
