"""The records of a run plan: what :func:`rlzoo.plan.planner.build_plan` decides and the engine reads.

:class:`RunPlan` and its parts (rollout, episodes, LoRA here; loss terms, KL, corrections,
update and optimizer in :mod:`rlzoo.plan.learning`; models, compute, evaluation, cadence and
prompts in :mod:`rlzoo.plan.settings`) with the text the plan renders (``plan.txt``,
``rlzoo config --plan``). Deciding them, and every consistency check, is
:mod:`rlzoo.plan.planner`'s job; these are plain frozen records.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rlzoo.contract.checks import BoundComponent
from rlzoo.plan.learning import CorrectionStep, KLPlan, LossTerm, OptimizerPlan, UpdatePlan
from rlzoo.plan.settings import CadencePlan, ComputePlan, EvalPlan, ModelPlan, PromptPlan


def plain(value: Any) -> Any:
    """A record as plain values: dataclasses as dicts, tuples as lists, a bound component as
    its name (what :meth:`RunPlan.to_dict` returns)."""
    if isinstance(value, BoundComponent):
        return value.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return value


@dataclass(frozen=True)
class RolloutPlan:
    """How each step's completions are generated.

    :ivar backend: the rollout backend (``rollout.backend``) with its parameters, bound: built
        with the run's policy, tokenizer, device and :attr:`dtype`.
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
        :mod:`rlzoo.run.async_generator`; ``rollout.mode``).
    :ivar weight_sync_every: async: the generator receives the newest weights after every
        this many steps (``rollout.weight_sync_every``).
    :ivar max_staleness: async: the bound on a trained batch's age in policy versions
        (``rollout.max_staleness``).
    :ivar stale_batches: async: ``drop`` or ``keep`` a batch beyond the bound
        (``rollout.stale_batches``).
    :ivar queue_size: async: scored batches that may wait for the trainer
        (``rollout.queue_size``).
    :ivar generator_timeout_s: async: seconds without a batch from a live generator after
        which the run fails (``rollout.generator_timeout_s``).
    """

    backend: BoundComponent
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
    generator_timeout_s: float = 1800.0

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
    :ivar terms: loss term (``policy``, ``kl``, ``entropy``, ``value``) -> its aggregation,
        mask and coefficient (:class:`rlzoo.plan.learning.LossTerm`); a term that cannot act
        (KL off or in the reward, ``entropy_coef`` 0, no critic) is absent.
    :ivar update: the update structure.
    :ivar rollout: how completions are generated (:class:`RolloutPlan`).
    :ivar model: where the policy's weights come from (:class:`rlzoo.plan.settings.ModelPlan`).
    :ivar optimizer: the optimizers and the LR schedule.
    :ivar eval: held-out evaluation and the held-out share of the prompts.
    :ivar cadence: the run's length, logging and checkpoint cadence.
    :ivar compute: device, threads, the process group and the log-prob head's chunking.
    :ivar prompt: how a prompt becomes the model's text.
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
    terms: dict[str, LossTerm]
    update: UpdatePlan
    rollout: RolloutPlan
    model: ModelPlan
    optimizer: OptimizerPlan
    eval: EvalPlan
    cadence: CadencePlan
    compute: ComputePlan = ComputePlan()
    prompt: PromptPlan = PromptPlan()
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
                    else "in each update micro-batch, comparing the current policy pi (detached) with the "
                    "rollout's mu where pi_old would be (bypass)" if step.current_as_old
                    else "in each update micro-batch (it reads the current policy)")
            what = ("its rejected tokens leave loss_mask and the rest are weighted" if step.mode == "mask"
                    else "weights the per-token policy loss (weight 0 keeps a token in the denominators)")
            lines.append(f"  {i}. {step.name}: {what}; {when}")
        if any(step.mode == "mask" for step in self.corrections):
            terms = ", ".join(name for name, term in self.terms.items() if term.mask == "loss_mask")
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
        """The plan as plain values (components by name)."""
        out = plain({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        out["needs"] = sorted(self.needs)
        out["old_logp"] = "rollout (bypass)" if self.bypass else ("pass" if "old_logp" in self.passes else "current")
        return out

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
                f"scored batch(es) wait for the trainer; the run fails if a live generator sends no batch for "
                f"{r.generator_timeout_s:g} s (rollout.mode=async, rollout.generator_timeout_s)",
                f"  version bound: a batch more than {r.max_staleness} policy version(s) older than the trained "
                f"policy is {beyond} (rollout.max_staleness, rollout.stale_batches)",
                "  reproducibility: none bit for bit (which policy version generates each batch depends on timing); "
                "rollout.staleness=k is the reproducible form; a resume regenerates the waiting batches"]

    def render(self) -> str:
        """The plan as text, one fact a line (``plan.txt``, ``rlzoo config --plan``)."""
        u = self.update
        strategy = f" ({self.compute.strategy}: each trained model wrapped)" if self.world > 1 else ""
        lines = ["# run plan", f"processes: {self.world}{strategy}", "models:"]
        lines += [f"  {name}: {why}" for name, why in self.models.items()]
        lines.append(self.model.line())
        lines.append("passes each step:")
        r = self.rollout
        samples = "completions" if self.episodes is None else "episodes"
        lines.append(f"  rollout: {r.backend.name} backend, {u.sequences} sequences ({r.dtype}): {r.n} {samples} of "
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
                         "pi/mu and the old-log-prob pass (a forward of the policy over the batch before the update) "
                         "is skipped")
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
                     else f"as a loss term: loss += beta * {self.terms['kl'].mode}(KL)")
            towards = (" towards the teacher (kl.target=teacher: its log-probs/logits replace the reference's)"
                       if k.target == "teacher" else "")
            lines.append(f"kl: {k.estimator.name}{towards} {where}; beta {k.coef} ({k.controller.name}"
                         f"{', updated each step' if k.controller_updates else ''}); "
                         "kl/value logs nats per token")
        lines.append("loss terms (coefficient x aggregation over mask):")
        lines += [f"  {name}: {_coef(name, term)}{term.mode} over {term.mask}" for name, term in self.terms.items()]
        lines.append(f"update: {u.epochs} epoch(s) x {u.mini_batches} mini-batch(es) of "
                     f"{u.sequences // u.mini_batches} sequences = {u.optimizer_steps} optimizer step(s) "
                     f"per step; {u.micro_line()}")
        lines.append(self.compute.packing_line())
        lines.append(f"log-probs under logits / {self.logprob_temperature:g} (the sampling temperature)")
        lines += [self.optimizer.line("critic" in self.models), self.eval.line(), self.cadence.line()]
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines) + "\n"


def _coef(name: str, term: LossTerm) -> str:
    """A term's coefficient as ``plan.txt`` writes it before its aggregation."""
    if name == "kl":
        return "beta x "
    return "" if term.coef == 1 else f"{term.coef:g} x "
