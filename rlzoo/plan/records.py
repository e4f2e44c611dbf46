"""The records of a run plan: what :func:`rlzoo.plan.planner.build_plan` decides and the engine reads.

:class:`RunPlan` and its parts (KL, update structure, rollout, corrections, LoRA) with the
text the plan renders (``plan.txt``, ``rlzoo config --plan``). Deciding them, and every
consistency check, is :mod:`rlzoo.plan.planner`'s job; these are plain frozen records.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

@dataclass(frozen=True)
class KLPlan:
    """Where KL to the reference (or the teacher) acts.

    :ivar placement: ``"reward"`` (β·KL_t subtracted from the token rewards) or ``"loss"``
        (β·agg(KL) added to the policy loss).
    :ivar estimator: the ``kl_estimator`` component's name.
    :ivar controller: the ``kl_controller`` component's name.
    :ivar coef: the initial β.
    :ivar uses_logits: the estimator reads full-vocabulary logits (computed in the update).
    :ivar controller_updates: the controller is fed the batch's KL every step.
    :ivar target: what the KL pulls towards (``kl.target``): ``"reference"``, the frozen initial
        policy, or ``"teacher"``, the model at ``teacher.path`` (on-policy distillation: the
        estimator's ``ref_logp`` / ``ref_logits`` are the teacher's).
    """

    placement: str
    estimator: str
    controller: str
    coef: float
    uses_logits: bool
    controller_updates: bool
    target: str = "reference"


@dataclass(frozen=True)
class UpdatePlan:
    """How one rollout becomes optimizer steps.

    :ivar sequences: sequences per step over all processes (prompts × n).
    :ivar sequences_per_process: this process's share.
    :ivar epochs: passes over the rollout.
    :ivar mini_batches: mini-batches per epoch (one optimizer step each).
    :ivar micro_batch_size: sequences per forward/backward (gradient accumulation).
    """

    sequences: int
    sequences_per_process: int
    epochs: int
    mini_batches: int
    micro_batch_size: int

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps per training step (epochs × mini-batches)."""
        return self.epochs * self.mini_batches

    @property
    def on_policy(self) -> bool:
        """One optimizer step per rollout: the policy never moves before its loss is taken."""
        return self.optimizer_steps == 1


@dataclass(frozen=True)
class RolloutPlan:
    """How each step's completions are generated.

    :ivar backend: the rollout backend's name (``rollout.backend``).
    :ivar dtype: the dtype it generates in (``rollout.dtype``, else ``model.dtype``).
    :ivar prompts_per_process: prompts this process draws each step.
    :ivar n: completions per prompt (a group).
    :ivar max_new_tokens: the response budget in tokens (also the ``T_max`` of
        ``seq-mean-token-sum-norm``).
    :ivar temperature: the sampling temperature; log-probs for training are taken under
        logits / this too (as verl and TRL do).
    :ivar top_p: the nucleus of the sampling distribution.
    :ivar staleness: step t trains on the rollouts of the policy of step t − staleness
        (``rollout.staleness``; :mod:`rlzoo.rollout.staleness`); 0 is on-policy.
    :ivar mode: ``sync`` (the trainer generates) or ``async`` (a generator process does,
        :mod:`rlzoo.rollout.async_generator`; ``rollout.mode``).
    :ivar weight_sync_every: async: the generator receives the newest weights after every
        this many steps (``rollout.weight_sync_every``).
    :ivar max_staleness: async: the bound on a trained batch's age in policy versions
        (``rollout.max_staleness``).
    :ivar stale_batches: async: ``drop`` or ``keep`` a batch beyond the bound
        (``rollout.stale_batches``).
    :ivar queue_size: async: scored batches that may wait for the trainer
        (``rollout.queue_size``).
    """

    backend: str
    dtype: str
    prompts_per_process: int
    n: int
    max_new_tokens: int
    temperature: float
    top_p: float
    staleness: int = 0
    mode: str = "sync"
    weight_sync_every: int = 1
    max_staleness: int = 2
    stale_batches: str = "drop"
    queue_size: int = 1

    @property
    def off_policy(self) -> bool:
        """Whether a step may train on rollouts of an older policy (staleness or async)."""
        return self.staleness > 0 or self.mode == "async"


@dataclass(frozen=True)
class EpisodePlan:
    """Multi-turn episodes with an environment (``env``; :mod:`rlzoo.agents.episodes`).

    :ivar env: the environment's name.
    :ivar max_turns: policy turns per episode at most (``rollout.max_turns``).
    :ivar max_turn_tokens: tokens per policy turn at most (``rollout.max_turn_tokens``).
    """

    env: str
    max_turns: int
    max_turn_tokens: int

    def lines(self, max_tokens: int) -> list[str]:
        """What an episode is, for ``plan.txt``."""
        return [f"episodes: environment {self.env}; at most {self.max_turns} policy turns of at most "
                f"{self.max_turn_tokens} tokens, {max_tokens} tokens per episode after the prompt (policy and "
                "environment); an episode stopped by a bound is truncated",
                "  masks: response_mask = every episode token (attended); loss_mask = the policy's sampled tokens "
                "only: environment/tool tokens are in no loss, KL, entropy, aggregation count or advantage "
                "statistic; response_length counts both",
                "  score: the task's rewards on the final answer (the last policy turn) + the sum of the "
                "environment's per-turn rewards"]


@dataclass(frozen=True)
class CorrectionStep:
    """One rollout correction of the run, in ``rollout_correction`` order.

    :ivar name: the correction's name.
    :ivar index: its position in ``rollout_correction`` (binds its parameters).
    :ivar stage: ``batch``: computed once per step over the whole batch before the
        mini-batches (it reads no current-policy log-prob); ``update``: in each update
        micro-batch (it reads ``logp``, the policy being trained).
    :ivar mode: ``weight`` (its weights multiply the per-token policy loss) or ``mask``
        (its zero-weight tokens also leave ``loss_mask``, so every term over that mask
        stops counting them).
    """

    name: str
    index: int
    stage: str
    mode: str


@dataclass(frozen=True)
class LoraPlan:
    """Low-rank adapters (``model.lora``, through ``peft``): only they are trained.

    :ivar rank: the adapters' rank ``r`` (> 0).
    :ivar alpha: their product ``B·A`` is scaled by ``alpha / rank``.
    :ivar dropout: dropout on the adapters' input while training.
    :ivar target_modules: names of the linear layers that get adapters.
    """

    rank: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]

    @property
    def scale(self) -> float:
        """``alpha / rank``, the factor on the adapters' product."""
        return self.alpha / self.rank


@dataclass(frozen=True)
class RunPlan:
    """What a run is. Built by :func:`build_plan`; read by the engine.

    :ivar world: processes (1, or torchrun's / ``launcher.nproc``'s N).
    :ivar needs: the union of what the chosen components need.
    :ivar models: model name -> why it exists (``policy`` always).
    :ivar passes: pass name -> why it runs each step: ``greedy`` (a greedy rollout),
        ``old_logp`` (log-probs before the update), ``old_entropy`` and
        ``old_sum_pi_squared`` (with them),
        ``ref_logp`` (reference log-probs), ``values`` (critic values).
    :ivar kl: where KL acts, or ``None`` (``kl.coef`` is 0).
    :ivar aggregation: loss term -> aggregation mode (``policy``, ``kl``, ``entropy``,
        ``value``), each normalised by the counts of the mask it names in ``masks``.
    :ivar masks: loss term -> ``loss_mask`` or ``response_mask``.
    :ivar update: the update structure.
    :ivar rollout: how completions are generated (:class:`RolloutPlan`).
    :ivar corrections: the rollout corrections applied in order (weights multiplied, masks
        intersected); empty for ``none``.
    :ivar bypass: ``trainer.old_logp=rollout``: the rollout's log-probs are π_old (the
        ratio's denominator is μ), and no old-log-prob pass runs.
    :ivar correction_in_loss: the policy loss names ``correction_weights`` and folds the weights
        in itself (a per-sequence loss: ``geo_mean``); else the engine multiplies them in.
    :ivar record: each step's batch is written to ``rollouts/`` (``rollout.record``).
    :ivar precision: ``trainer.precision``: ``fp32``, or ``bf16`` compute over float32 weights.
    :ivar lora: the policy's LoRA adapters (``model.lora.rank`` > 0), or ``None``: every
        weight is trained.
    :ivar episodes: multi-turn episodes with an environment, or ``None`` (one completion per
        sample).
    :ivar sampled_mask: the batch mask of the tokens the policy sampled: ``response_mask``, or
        ``loss_mask`` with episodes (environment tokens are in the response but not sampled).
        The advantage estimator's ``response_mask`` and the rollout-mismatch metrics use it.
    :ivar warnings: choices that cannot act under this plan, in words.
    """

    world: int
    needs: frozenset[str]
    models: dict[str, str]
    passes: dict[str, str]
    kl: KLPlan | None
    aggregation: dict[str, str]
    masks: dict[str, str]
    update: UpdatePlan
    rollout: RolloutPlan
    corrections: tuple[CorrectionStep, ...] = ()
    bypass: bool = False
    correction_in_loss: bool = False
    record: bool = False
    precision: str = "fp32"
    lora: LoraPlan | None = None
    episodes: EpisodePlan | None = None
    sampled_mask: str = "response_mask"
    warnings: list[str] = field(default_factory=list)

    @property
    def logprob_temperature(self) -> float:
        """Log-probs (old, new, reference, entropy) are taken under logits / this: the
        sampling temperature, so they are those of the distribution sampled from."""
        return self.rollout.temperature

    def _correction_lines(self) -> list[str]:
        if not self.corrections:
            return []
        lines = ["rollout corrections, in order (weights multiplied, masks intersected; each sees the loss_mask "
                 "the earlier ones left):"]
        for i, step in enumerate(self.corrections, 1):
            when = ("once per step over the whole batch, before the mini-batches" if step.stage == "batch"
                    else "in each update micro-batch (it reads the current policy)")
            what = ("its rejected tokens leave loss_mask and the rest are weighted" if step.mode == "mask"
                    else "weights the per-token policy loss (weight 0 keeps a token in the denominators)")
            lines.append(f"  {i}. {step.name}: {what}; {when}")
        if any(step.mode == "mask" for step in self.corrections):
            terms = ", ".join(t for t, m in self.masks.items() if m == "loss_mask")
            lines.append(f"  mode=mask changes the aggregation denominators: {terms} count only the tokens and "
                         "non-empty sequences the corrections keep")
        if self.correction_in_loss:
            lines.append("  the policy loss takes the weights itself (correction_weights, a per-sequence loss: "
                         "geo_mean drops weight-0 tokens from the sequence and scales it by the rest's geometric mean)")
        return lines

    def runs(self, name: str) -> bool:
        """Whether pass ``name`` runs each step."""
        return name in self.passes

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain values (what ``plan.txt`` renders)."""
        return {
            "world": self.world,
            "needs": sorted(self.needs),
            "models": dict(self.models),
            "passes": dict(self.passes),
            "kl": None if self.kl is None else {
                "placement": self.kl.placement, "estimator": self.kl.estimator,
                "controller": self.kl.controller, "coef": self.kl.coef,
                "controller_updates": self.kl.controller_updates, "target": self.kl.target},
            "aggregation": {term: f"{mode} over {self.masks[term]}" for term, mode in self.aggregation.items()},
            "update": {
                "sequences_per_step": self.update.sequences, "per_process": self.update.sequences_per_process,
                "epochs": self.update.epochs, "mini_batches_per_epoch": self.update.mini_batches,
                "optimizer_steps_per_step": self.update.optimizer_steps,
                "micro_batch_size": self.update.micro_batch_size},
            "rollout": dataclasses.asdict(self.rollout),
            "rollout_correction": [dataclasses.asdict(step) for step in self.corrections],
            "old_logp": "rollout (bypass)" if self.bypass else ("pass" if "old_logp" in self.passes else "current"),
            "precision": self.precision,
            "lora": None if self.lora is None else dataclasses.asdict(self.lora),
            **({} if self.episodes is None else {"episodes": dataclasses.asdict(self.episodes)}),
            "warnings": list(self.warnings),
        }

    def _async_lines(self) -> list[str]:
        """What ``rollout.mode=async`` runs, its version bound and what it costs."""
        r = self.rollout
        if r.stale_batches == "drop":
            beyond = "dropped (its prompts are not trained on)"
        else:
            names = ", ".join(step.name for step in self.corrections) or "none: it trains uncorrected"
            beyond = f"kept and trained on, weighted like every batch by rollout_correction ({names})"
        return [f"  rollout generator: a separate process generates and scores with its own copy of the policy, "
                f"receiving the newest weights after every {r.weight_sync_every} step(s); up to {r.queue_size} "
                "scored batch(es) wait for the trainer (rollout.mode=async)",
                f"  version bound: a batch more than {r.max_staleness} policy version(s) older than the trained "
                f"policy is {beyond} (rollout.max_staleness, rollout.stale_batches)",
                "  reproducibility: none bit for bit (which policy version generates each batch depends on timing); "
                "rollout.staleness=k is the reproducible form; a resume regenerates the waiting batches"]

    def render(self) -> str:
        """The plan as text, one fact a line (``plan.txt``, ``rlzoo config --plan``)."""
        u = self.update
        lines = ["# run plan", f"processes: {self.world}", "models:"]
        lines += [f"  {name}: {why}" for name, why in self.models.items()]
        lines.append("passes each step:")
        r = self.rollout
        samples = "completions" if self.episodes is None else "episodes"
        lines.append(f"  rollout: {r.backend} backend, {u.sequences} sequences ({r.dtype}): {r.n} {samples} of "
                     f"at most {r.max_new_tokens} tokens per prompt, temperature {r.temperature:g}"
                     f"{f', top_p {r.top_p:g}' if r.top_p < 1 else ''}")
        if r.staleness:
            lines.append(f"  rollout queue: step t trains on the rollouts of the policy of step t-{r.staleness} "
                         f"(steps 1-{r.staleness} on the initial policy's; rollout.staleness)")
        if r.mode == "async":
            lines += self._async_lines()
        lines += [f"  {name}: {why}" for name, why in self.passes.items()]
        if self.episodes is not None:
            lines += self.episodes.lines(r.max_new_tokens)
        if self.bypass:
            lines.append("old log-probs: the rollout's (trainer.old_logp=rollout, bypass): the importance ratio is "
                         "pi/mu and no old-log-prob pass runs")
        lines += self._correction_lines()
        if self.record:
            lines.append("each step's batch is recorded in rollouts/ (rlzoo ab replays it)")
        if self.lora is not None:
            a = self.lora
            lines.append(f"lora: rank-{a.rank} adapters on {', '.join(a.target_modules)}, scaled by alpha/rank = "
                         f"{a.alpha:g}/{a.rank} = {a.scale:g}, dropout {a.dropout:g}; only the adapters are trained "
                         "and checkpointed (peft), the base weights stay frozen")
        if self.precision == "bf16":
            lines.append("precision: bf16 autocast for every model forward and backward of the learner over float32 "
                         "weights and optimizer state; softmax, log-probs, losses and values in float32")
        if self.kl is None:
            lines.append("kl: off (kl.coef = 0)")
        else:
            k = self.kl
            where = ("in the reward: r_t -= beta * KL_t" if k.placement == "reward"
                     else f"as a loss term: loss += beta * {self.aggregation['kl']}(KL)")
            towards = (" towards the teacher (kl.target=teacher: its log-probs/logits replace the reference's)"
                       if k.target == "teacher" else "")
            lines.append(f"kl: {k.estimator}{towards} {where}; beta {k.coef} ({k.controller}"
                         f"{', updated each step' if k.controller_updates else ''}); "
                         "kl/value logs nats per token")
        lines.append("aggregation:")
        lines += [f"  {term}: {mode} over {self.masks[term]}" for term, mode in self.aggregation.items()]
        lines.append(f"update: {u.epochs} epoch(s) x {u.mini_batches} mini-batch(es) of "
                     f"{u.sequences // u.mini_batches} sequences = {u.optimizer_steps} optimizer step(s) "
                     f"per step; micro-batches of {u.micro_batch_size}")
        lines.append(f"log-probs under logits / {self.logprob_temperature:g} (the sampling temperature)")
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines) + "\n"
