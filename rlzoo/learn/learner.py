"""The learner: everything after scoring, as the run plan says.

:meth:`Learner.prepare` runs the passes of the plan (log-probs before the update, reference
log-probs, critic values), folds KL into the reward when the plan puts it there, and calls
the advantage estimator; :meth:`Learner.update` takes the plan's epochs × mini-batches of
optimizer steps, accumulating micro-batches whose losses are aggregated with the counts of
their whole mini-batch, then updates the critic. Micro-batches hold ``micro_batch_size``
sequences, or as many as ``micro_batch_tokens`` token positions hold
(:func:`rlzoo.learn.micro_batches.token_micro_batches`): the same gradient either way. The learner
holds the optimizers, LR schedulers and KL controller, and decides nothing the plan has not.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any, Callable

import numpy as np
import torch

from rlzoo.contract.checks import BoundComponent
from rlzoo.core import distributed
from rlzoo.core.batch import BatchCounts, RolloutBatch
from rlzoo.learn.correcting import Corrections, offpolicy_metrics
from rlzoo.plan.records import RunPlan
from rlzoo.plan.run_input import Components
from rlzoo.core.errors import TrainingError, say
from rlzoo.core.ratios import LOG_RATIO_CLAMP
from rlzoo.models.head import fast_paths
from rlzoo.models.logprobs import model_inputs, sum_of_squared_probs
from rlzoo.learn.gradient_share import kl_advantage_share, kl_gradient_share
from rlzoo.learn.optim import adamw, lr_factor
from rlzoo.learn.micro_batches import computed_tokens, token_micro_batches
from rlzoo.core.masked import masked_mean, masked_var
from rlzoo.models.build import RunModels
from rlzoo.core.tags import Tag


def non_finite(stage: str, component: BoundComponent) -> str:
    """What a non-finite value in ``stage`` is called in errors: the component that computed it,
    its package, and the plugin kit's check that tests it where such values most often come from."""
    c = component.component
    return (f"non-finite value in {stage} (component {c.name!r} of package {c.package or '?'}; "
            f"rlzoo.api.check_component(registry.get({c.kind!r}, {c.name!r})) tests it on its kind's edge cases)")


def check_finite(value: torch.Tensor, stage: str, component: BoundComponent, detail: str | None = None) -> None:
    """:raises TrainingError: ``value`` holds NaN or inf (the stage and component named, and ``detail``: what
    fed it)."""
    if not bool(torch.isfinite(value).all()):
        raise TrainingError(f"{non_finite(stage, component)}{f'; {detail}' if detail else ''}; the step was stopped "
                            "and no checkpoint was written for it")


def mismatch_metrics(old_logp: torch.Tensor, rollout_logp: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """How far the rollout backend's sampling distribution μ is from the trained policy
    π_old on the sampled tokens; ``(B, T)`` inputs.

    ``mismatch_k3``: masked mean of exp(x) − x − 1 with x = log π_old − log μ (the k3
    estimate of KL(μ‖π_old), verl's ``rollout_corr/k3_kl``); ``max_abs_log_ratio``: the
    largest |x| over valid tokens. x is clamped to ±20 first.
    """
    x = (old_logp - rollout_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    valid = mask.bool()
    k3 = torch.where(valid, torch.expm1(x) - x, torch.zeros_like(x))
    largest = torch.where(valid, x.abs(), torch.zeros_like(x)).max() if x.numel() else x.new_zeros(())
    return {"mismatch_k3": masked_mean(k3, mask), "max_abs_log_ratio": largest}


class NoKL:
    """The KL controller's place when the plan has no KL: β is 0, and its checkpoint entry
    is kept (a controller's ``state_dict``) so every run's state has the same keys."""

    value = 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"value": 0.0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class _WeightedMeans:
    """Metrics averaged over micro-batches with weights (then summed over ranks)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}

    def add(self, name: str, value: float, weight: float) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + value * weight
        self.weights[name] = self.weights.get(name, 0.0) + weight

    def result(self, dist: distributed.DistInfo) -> dict[str, float]:
        sums = distributed.all_reduce_floats(self.sums, dist)
        weights = distributed.all_reduce_floats(self.weights, dist)
        return {name: total / max(weights[name], 1e-12) for name, total in sums.items()}


def _counts(mask: torch.Tensor, max_response_length: int, dist: distributed.DistInfo) -> BatchCounts:
    """Token and sequence counts of ``mask`` summed over all ranks."""
    local = {"tokens": float(mask.sum()), "sequences": float((mask.sum(-1) > 0).sum())}
    total = distributed.all_reduce_floats(local, dist)
    return BatchCounts(tokens=total["tokens"], sequences=total["sequences"],
                       max_response_length=max_response_length)


class Learner:
    """Prepares a scored batch and updates the policy (and critic) on it.

    :param plan: the run plan: passes, KL, loss terms, corrections, the update, the optimizer.
    :param components: the advantage estimator, the policy and value losses, the reward weights.
    :param models: the run's models (policy, reference, critic and their wrappers).
    :param dist: this process's place in the job.
    :ivar failure: under torchrun, the first non-finite value this rank found in the current
        step (``None``: none). A rank does not raise alone, which would leave the others
        waiting in a collective: it goes on with a NaN loss, whose gradient the all-reduce
        carries to every rank, so all of them find the same non-finite gradient norm before
        the optimizer step and raise together, naming this rank and this value
        (:meth:`_clip_and_step`); in a single process the value raises where it is found.
    """

    def __init__(self, plan: RunPlan, components: Components, models: RunModels, dist: distributed.DistInfo) -> None:
        self.plan, self.models, self.dist = plan, models, dist
        self.failure: str | None = None
        self._over_budget_said = False
        self.advantage, self.policy_loss = components.advantage, components.policy_loss
        self.value_loss = components.value_loss if models.critic else None
        self.reward_weights = torch.tensor([weight for _, weight in components.rewards], dtype=torch.float32)
        self.corrections = Corrections(plan.corrections, dist)
        if plan.kl is not None:
            self.kl = plan.kl.estimator
            self.kl_controller = plan.kl.controller.construct(init_coef=plan.kl.coef)
        else:
            self.kl, self.kl_controller = None, NoKL()
        o = plan.optimizer
        factor = lr_factor(o.schedule, o.warmup_steps, o.schedule_steps)
        self.optimizer = adamw(models.trainable(), o.lr, o.betas, o.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        self.critic_optimizer = self.critic_scheduler = None
        if models.critic is not None:
            self.critic_optimizer = adamw(models.critic.parameters(), o.critic_lr, o.betas, o.weight_decay)
            self.critic_scheduler = torch.optim.lr_scheduler.LambdaLR(self.critic_optimizer, factor)

    def _check_finite(self, value: torch.Tensor, stage: str, component: BoundComponent) -> None:
        """:func:`check_finite` in a single process; under torchrun, record the first
        non-finite value as :attr:`failure` and carry on (every rank raises it later)."""
        if not self.dist.enabled:
            check_finite(value, stage, component)
        elif self.failure is None and not bool(torch.isfinite(value).all()):
            self.failure = non_finite(stage, component)

    # ---------------------------------------------------------------- passes and advantages

    def _micro_batches(self, batch: RolloutBatch) -> list[tuple[torch.Tensor, RolloutBatch]]:
        """``(rows, micro-batch)`` pairs covering ``batch``: ``micro_batch_size`` consecutive
        rows, or with ``micro_batch_tokens`` the groups of
        :func:`rlzoo.learn.micro_batches.token_micro_batches`, each trimmed of the padding columns
        none of its rows uses (:meth:`RolloutBatch.trimmed`)."""
        update = self.plan.update
        if not len(batch):
            return []
        if update.micro_batch_tokens is None:
            return [(rows, batch.select(rows)) for rows in torch.arange(len(batch)).split(update.micro_batch_size)]
        prompts = batch.prompt_mask.sum(-1).long().tolist()
        responses = batch.response_mask.sum(-1).long().tolist()
        paths = fast_paths(self.models.policy)
        groups = token_micro_batches(prompts, responses, update.micro_batch_tokens, paths.packing, paths.pack_min_share)
        for group in groups:
            size = computed_tokens([prompts[i] for i in group], [responses[i] for i in group], paths.packing,
                                   paths.pack_min_share)
            if size > update.micro_batch_tokens and not self._over_budget_said:
                self._over_budget_said = True
                say(f"rlzoo: warning: a sequence of {size} tokens is longer than trainer.micro_batch_tokens="
                    f"{update.micro_batch_tokens}: it is a micro-batch of its own, over the budget (said once)")
        return [(torch.tensor(group), batch.select(group).trimmed()) for group in groups]

    def compute(self) -> Any:
        """The context every model forward of the learner runs in: bfloat16 autocast over the
        float32 weights with ``trainer.precision=bf16`` (matmuls in bfloat16; the softmax,
        log-probs, values, losses and the optimizer stay float32), else nothing."""
        if self.plan.precision != "bf16":
            return contextlib.nullcontext()
        return torch.autocast(device_type=next(self.models.policy.parameters()).device.type, dtype=torch.bfloat16)

    def _forward(self, module: torch.nn.Module, mb: RolloutBatch, **kwargs: Any) -> tuple[Any, ...]:
        with self.compute():
            return module(mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask,
                          chunk_size=self.plan.compute.logprob_chunk_size,
                          keep_max_bytes=self.plan.compute.logprob_keep_bytes,
                          temperature=self.plan.logprob_temperature, **kwargs)

    @torch.no_grad()
    def _logp_pass(self, module: torch.nn.Module, batch: RolloutBatch, with_entropy: bool,
                   with_sum_pi_squared: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Log-probs of the sampled tokens under ``module``, and optionally per-token entropies
        and Σ_v π(v)² (from the full logits), each ``(B, T)``, 0 on padding."""
        logps, entropies, squares = [], [], []
        for rows, mb in self._micro_batches(batch):
            logp, entropy, logits = self._forward(module, mb, with_entropy=with_entropy,
                                                  with_logits=with_sum_pi_squared)
            logps.append((rows, logp))
            entropies.append((rows, entropy))
            if with_sum_pi_squared:
                squares.append((rows, sum_of_squared_probs(logits) * mb.response_mask))
        return (_rows_back(logps, batch), _rows_back(entropies, batch) if with_entropy else None,
                _rows_back(squares, batch) if with_sum_pi_squared else None)

    def _values(self, mb: RolloutBatch, critic: torch.nn.Module) -> torch.Tensor:
        """The critic's values of ``mb``'s response tokens ``(B, T)``, 0 on padding."""
        inputs = model_inputs(self.models.critic, mb.prompt_ids, mb.prompt_mask, mb.response_ids,
                              mb.response_mask, paths_of=self.models.policy)
        with self.compute():
            values = critic(**inputs.kwargs()).float()
        return inputs.responses(values) * mb.response_mask

    def prepare(self, batch: RolloutBatch) -> dict[str, float]:
        """Run the plan's passes, KL in the reward and the advantages; fills ``batch``."""
        plan, models = self.plan, self.models
        metrics: dict[str, float] = {}
        self.failure = None
        if plan.runs("old_logp"):
            models.policy.eval()
            batch.old_logp, batch.old_entropy, batch.old_sum_pi_squared = self._logp_pass(
                models.policy_forward, batch, plan.runs("old_entropy"), plan.runs("old_sum_pi_squared"))
        elif plan.bypass:
            batch.old_logp = batch.rollout_logp
        if plan.runs("ref_logp"):
            batch.ref_logp, _, _ = self._logp_pass(models.reference_forward, batch, False)
        if plan.runs("teacher_logp"):
            batch.teacher_logp, _, _ = self._logp_pass(models.teacher_forward, batch, False)
        if plan.runs("values"):
            models.critic.eval()
            with torch.no_grad():
                batch.old_values = _rows_back([(rows, self._values(mb, models.critic))
                                               for rows, mb in self._micro_batches(batch)], batch)
        with distributed.batch_statistics(self.dist.enabled):
            if plan.runs("old_logp"):
                sampled = getattr(batch, plan.sampled_mask)
                found = mismatch_metrics(batch.old_logp, batch.rollout_logp, sampled)
                metrics["rollout/mismatch_k3"] = float(found["mismatch_k3"])
                metrics.update({"rollout/max_abs_log_ratio": distributed.all_reduce_floats(
                    {"m": float(found["max_abs_log_ratio"])}, self.dist, "max")["m"]})
                metrics.update({f"rollout/{key}": float(value) for key, value in
                                offpolicy_metrics(batch.old_logp, batch.rollout_logp, sampled).items()})
            self._advantages(batch, metrics)
        return metrics

    def _advantages(self, batch: RolloutBatch, metrics: dict[str, float]) -> None:
        mask = getattr(batch, self.plan.sampled_mask)  # an episode's environment tokens are not sampled
        has_tokens = batch.response_lengths > 0
        last = (batch.response_lengths.long() - 1).clamp(min=0)
        token_rewards = torch.zeros_like(mask)
        token_rewards[has_tokens, last[has_tokens]] = batch.rewards[has_tokens]
        task_rewards = token_rewards
        if self.plan.kl is not None and self.plan.kl.placement == "reward":
            kl = self.kl(logp=batch.old_logp, ref_logp=self._kl_target_logp(batch))
            batch.kl = torch.where(mask.bool(), kl, torch.zeros_like(kl))
            token_rewards = token_rewards - float(self.kl_controller.value) * batch.kl
            sequence_kl = float(masked_mean(batch.kl.sum(-1), has_tokens.float()))
            metrics["kl/value"] = float(masked_mean(batch.kl, mask))
            metrics["kl/sequence_sum"] = sequence_kl
            if self.plan.kl.controller_updates:
                self.kl_controller.update(sequence_kl, len(batch) * self.dist.world)
        batch.token_rewards = token_rewards
        inputs = self.advantage.component.inputs
        if "reward_scores" in inputs and "token_rewards" not in inputs and not torch.equal(batch.rewards, batch.scores):
            raise TrainingError(f"advantage {self.advantage.name!r} reads each reward function's raw scores, but "
                                "an rlzoo_shape_rewards hook changed the rewards, which it would ignore: remove "
                                "the shaping or make it a reward function in reward=[...]")
        given = dict(response_mask=mask, group_ids=batch.group_ids, values=batch.old_values,
                     baseline_scores=batch.baseline_scores, old_logp=batch.old_logp, ref_logp=batch.ref_logp,
                     reward_scores=batch.reward_scores, teacher_logp=batch.teacher_logp,
                     sum_pi_squared=batch.old_sum_pi_squared, reward_weights=self.reward_weights.to(mask.device))
        advantages, returns = self.advantage(token_rewards=token_rewards, **given)
        self._check_finite(advantages, "advantage estimation", self.advantage)
        if task_rewards is not token_rewards and float(self.kl_controller.value) > 0:   # the KL is in the reward
            task_advantages, _ = self.advantage(token_rewards=task_rewards, **given)
            metrics[Tag.KL_GRAD_SHARE] = kl_advantage_share(advantages, task_advantages, mask)
        batch.advantages, batch.returns = advantages, returns
        metrics["advantages/mean"] = float(masked_mean(advantages, mask))
        if batch.teacher_logp is not None and batch.old_logp is not None:  # what distillation drives to 0
            metrics["teacher/reverse_kl"] = float(masked_mean(batch.old_logp - batch.teacher_logp, mask))
        if self.models.critic is not None:
            metrics[Tag.RETURNS] = float(masked_mean(returns, mask))
            metrics[Tag.EXPLAINED_VAR] = explained_variance(batch.old_values, returns, mask)

    # ---------------------------------------------------------------- the update

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """``update_epochs`` × ``num_mini_batches`` optimizer steps on ``batch`` (this
        process's share); returns the update's metrics averaged over all ranks."""
        models = self.models
        means = _WeightedMeans()
        grad_norms = []
        correction_metrics = self.corrections.apply_to_batch(batch)
        policy_masks = sorted({term.mask for name, term in self.plan.terms.items() if name != "value"})
        for _ in range(self.plan.update.epochs):
            order = torch.randperm(len(batch))
            for rows in order.tensor_split(self.plan.update.mini_batches):
                mini = batch.select(rows)
                counts = {mask: self._counts(mini, mask) for mask in policy_masks}
                models.policy.train()
                self.optimizer.zero_grad(set_to_none=True)
                policy_loss = functools.partial(self._policy_loss, counts=counts, means=means)
                self._accumulate(models.policy_forward, mini, policy_loss)
                grad_norms.append(self._clip_and_step(models.policy, self.optimizer, "policy gradient",
                                                      self.policy_loss, lambda: self._scales(batch)))
                if models.critic is not None:
                    self._critic_step(mini, means)
        metrics = means.result(self.dist)
        metrics.update(correction_metrics)
        metrics["grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
        self.scheduler.step()
        if self.critic_scheduler is not None:
            self.critic_scheduler.step()
        return metrics

    def _counts(self, mini: RolloutBatch, mask: str) -> BatchCounts:
        """Token and sequence counts of the mini-batch's ``mask`` (a batch field the plan
        names) over all ranks: what every aggregation of a term with that mask divides by."""
        return _counts(getattr(mini, mask), self.plan.rollout.max_new_tokens, self.dist)

    def _term(self, name: str, mb: RolloutBatch, loss: torch.Tensor, counts: dict[str, BatchCounts]) -> torch.Tensor:
        """Loss term ``name`` of a micro-batch, without its coefficient: its per-token ``loss``
        aggregated with the plan's aggregation for the term over the plan's mask for it
        (normalised by the mini-batch's global ``counts`` of that mask)."""
        term = self.plan.terms[name]
        return term.aggregation(loss=loss, mask=getattr(mb, term.mask), counts=counts[term.mask])

    def _accumulate(self, module: torch.nn.Module, mini: RolloutBatch,
                    micro_loss: Callable[[RolloutBatch], torch.Tensor]) -> None:
        """Backpropagate ``micro_loss`` of each micro-batch of ``mini`` (each already this
        micro-batch's share of the mini-batch loss); gradients are all-reduced on the last."""
        micro = self._micro_batches(mini)
        for index, (_, mb) in enumerate(micro):
            with _sync_context(module, last=index == len(micro) - 1):
                loss = micro_loss(mb)
                if self.failure is not None:  # NaN gradients on this rank, NaN after the all-reduce on every rank
                    loss = loss * math.nan
                (loss * self.dist.world).backward()  # DDP averages over ranks; counts are global

    def _clip_and_step(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, stage: str,
                       component: BoundComponent, scales: Callable[[], str] | None = None) -> float:
        """Clip the gradient norm to the plan's ``max_grad_norm`` (``None``: no clipping), refuse a non-finite one
        (saying what fed it: ``scales``), step; returns the norm before clipping."""
        max_norm = self.plan.optimizer.max_grad_norm
        norm = distributed.local_value(torch.nn.utils.clip_grad_norm_(
            model.parameters(), math.inf if max_norm is None else max_norm))  # null: measure, never clip
        detail = scales() if scales is not None and not bool(torch.isfinite(norm)) else None
        if self.dist.enabled and not bool(torch.isfinite(norm)):
            # the gradients were all-reduced: every rank has this non-finite norm and is here
            fallback = non_finite(stage, component) + (f"; {detail}" if detail else "")
            distributed.raise_failures(self.failure, self.dist, fallback=fallback)
        check_finite(norm, stage, component, detail)
        optimizer.step()
        return float(norm)

    def _scales(self, batch: RolloutBatch) -> str:
        """The sizes that feed the policy gradient, for an error: the batch's largest advantage and the KL
        coefficient (an adaptive controller's current one)."""
        parts = []
        if batch.advantages is not None:
            parts.append(f"the batch's advantages reach {float(batch.advantages.abs().max()):.3g}")
        if self.plan.kl is not None and float(self.kl_controller.value) > 0:
            adapted = f" (the KL controller's, from kl.coef={self.plan.kl.coef:g})" if self.plan.kl.controller_updates \
                else ""
            parts.append(f"the KL coefficient is {float(self.kl_controller.value):.3g}{adapted}")
        return " and ".join(parts)

    def _policy_loss(self, mb: RolloutBatch, counts: dict[str, BatchCounts], means: _WeightedMeans) -> torch.Tensor:
        """This micro-batch's share of the mini-batch loss (aggregated by global ``counts``)."""
        plan, kl_plan = self.plan, self.plan.kl
        with_logits = kl_plan is not None and kl_plan.placement == "loss" and kl_plan.uses_logits
        logp, entropy, logits = self._forward(self.models.policy_forward, mb, with_entropy=True,
                                              with_logits=with_logits)
        mask = getattr(mb, plan.terms["policy"].mask)
        tokens = counts[plan.terms["policy"].mask].tokens
        old_logp = mb.old_logp if mb.old_logp is not None else logp.detach()
        weight = float(mask.sum())
        weights = self.corrections.weights(mb, old_logp, logp, mask,
                                           lambda key, value: means.add(key, value, weight))
        token_loss, loss_metrics = self.policy_loss(
            logp=logp, old_logp=old_logp, advantages=mb.advantages, response_mask=mask,
            rollout_logp=mb.rollout_logp, ref_logp=mb.ref_logp, correction_weights=weights)
        if weights is not None and not plan.correction_in_loss:
            token_loss = token_loss * weights
        loss = plan.terms["policy"].coef * self._term("policy", mb, token_loss, counts)
        means.add("policy/loss", float(loss.detach()) * tokens / max(weight, 1.0), weight)
        for key, value in loss_metrics.items():
            means.add(f"policy/{key}", float(value), weight)
        if kl_plan is not None and kl_plan.placement == "loss":
            ref_logits = self._ref_logits(mb) if with_logits else None
            kl = self.kl(logp=logp, ref_logp=self._kl_target_logp(mb), logits=logits, ref_logits=ref_logits)
            kl_loss = float(self.kl_controller.value) * self._term("kl", mb, kl, counts)
            if logp.requires_grad and not with_logits:
                means.add(Tag.KL_GRAD_SHARE, kl_gradient_share(loss, kl_loss, logp), weight)
            loss = loss + kl_loss
            means.add("kl/value", float(masked_mean(kl.detach(), getattr(mb, plan.terms["kl"].mask))), weight)
        means.add("entropy", float(masked_mean(entropy.detach(), mask)), weight)
        if "entropy" in plan.terms:
            loss = loss + plan.terms["entropy"].coef * self._term("entropy", mb, entropy, counts)
        self._check_finite(loss, "policy loss", self.policy_loss)
        return loss

    def _kl_target_logp(self, batch: RolloutBatch) -> torch.Tensor | None:
        """What the KL estimator's ``ref_logp`` is: the reference's log-probs of the sampled
        tokens, or the teacher's under ``kl.target=teacher`` (the plan's ``KLPlan.target``)."""
        return batch.teacher_logp if self.plan.kl.target == "teacher" else batch.ref_logp

    @torch.no_grad()
    def _ref_logits(self, mb: RolloutBatch) -> torch.Tensor:
        """The KL target's ``(B, T, V)`` tempered logits for ``mb``: the reference's, or the
        teacher's under ``kl.target=teacher``."""
        target = self.models.teacher_forward if self.plan.kl.target == "teacher" else self.models.reference_forward
        return self._forward(target, mb, with_logits=True)[2]

    def _critic_step(self, mini: RolloutBatch, means: _WeightedMeans) -> None:
        models, mask = self.models, self.plan.terms["value"].mask
        counts = {mask: self._counts(mini, mask)}
        models.critic.train()
        self.critic_optimizer.zero_grad(set_to_none=True)

        def micro_loss(mb: RolloutBatch) -> torch.Tensor:
            values = self._values(mb, models.critic_forward)
            token_loss, value_metrics = self.value_loss(values=values, old_values=mb.old_values,
                                                        returns=mb.returns, response_mask=getattr(mb, mask))
            loss = self.plan.terms["value"].coef * self._term("value", mb, token_loss, counts)
            self._check_finite(loss, "value loss", self.value_loss)
            weight = float(getattr(mb, mask).sum())
            means.add("value/loss", float(loss.detach()) * counts[mask].tokens / max(weight, 1.0), weight)
            for key, value in value_metrics.items():
                means.add(f"value/{key}", float(value), weight)
            return loss

        self._accumulate(models.critic_forward, mini, micro_loss)
        norm = self._clip_and_step(models.critic, self.critic_optimizer, "value gradient", self.value_loss)
        means.add("value/grad_norm", norm, 1.0)

    # ---------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """Optimizers, schedulers, KL controller (a collective under FSDP: every rank calls it)."""
        models = self.models
        return {
            "optimizer": distributed.optimizer_state(models.policy_forward, self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "critic_optimizer": (distributed.optimizer_state(models.critic_forward, self.critic_optimizer)
                                 if self.critic_optimizer else None),
            "critic_scheduler": self.critic_scheduler.state_dict() if self.critic_scheduler else None,
            "kl_controller": self.kl_controller.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        models = self.models
        distributed.load_optimizer_state(models.policy_forward, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic_optimizer is not None:
            distributed.load_optimizer_state(models.critic_forward, self.critic_optimizer,
                                             state["critic_optimizer"])
            self.critic_scheduler.load_state_dict(state["critic_scheduler"])
        self.kl_controller.load_state_dict(state["kl_controller"])


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """How much of the returns' variance the critic's values explain, over the valid tokens
    of ``(B, T)`` tensors: 1 − Var(returns − values) / (Var(returns) + 1e-5) (verl's
    ``critic/vf_explained_var``). 1 is a perfect critic, 0 one no better than the mean return,
    below 0 one worse than that."""
    residual = masked_var(returns - values, mask)
    return float(1.0 - residual / (masked_var(returns, mask) + 1e-5))


def _rows_back(parts: list[tuple[torch.Tensor, torch.Tensor]], batch: RolloutBatch) -> torch.Tensor:
    """``(B, T)`` float32 of ``batch`` from micro-batch outputs ``(rows, (b, t))`` (``t <= T``:
    a micro-batch trimmed of padding columns; the rest is 0)."""
    out = torch.zeros(batch.response_ids.shape, dtype=torch.float32, device=batch.response_ids.device)
    for rows, part in parts:
        out[rows.to(out.device), :part.shape[1]] = part
    return out


def _sync_context(module: torch.nn.Module, last: bool) -> Any:
    """No gradient all-reduce except on a mini-batch's last micro-batch (DDP)."""
    if not last and hasattr(module, "no_sync"):
        return module.no_sync()
    return contextlib.nullcontext()
