"""The records of what the learner does: loss terms, KL, rollout corrections, the update, the optimizer.

Plain frozen records decided by :func:`rlzoo.plan.planner.build_plan`. A record that names a
component carries it bound with its parameters (:class:`rlzoo.contract.checks.BoundComponent`):
the engine calls what the plan holds, so a name and its parameters cannot disagree, and a
plan edited after it was decided (tests do) is followed as edited.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlzoo.contract.checks import BoundComponent


@dataclass(frozen=True)
class LossTerm:
    """One term of a loss: ``coef × aggregation(per-token term)``, normalised by the counts of ``mask``.

    :ivar aggregation: the ``loss_agg`` component the term is aggregated with, bound.
    :ivar mask: the batch mask the term covers and is normalised by: ``loss_mask`` or
        ``response_mask``.
    :ivar coef: the term's weight in its loss, signed: ``policy`` 1, ``entropy``
        −``trainer.entropy_coef`` (a bonus), ``kl`` β as ``kl.coef`` sets it (each step the
        term is weighted by the KL controller's value, which starts there and which a resume
        restores), ``value`` 1 (the critic's own loss).
    """

    aggregation: BoundComponent
    mask: str
    coef: float = 1.0

    @property
    def mode(self) -> str:
        """The aggregation's name (``seq-mean-token-mean``, ...)."""
        return self.aggregation.name


@dataclass(frozen=True)
class KLPlan:
    """Where KL to the reference (or the teacher) acts.

    :ivar placement: ``"reward"`` (β·KL_t subtracted from the token rewards) or ``"loss"``
        (β·agg(KL) added to the policy loss).
    :ivar estimator: the ``kl_estimator`` component, bound.
    :ivar controller: the ``kl_controller`` component, bound (built with ``init_coef=coef``).
    :ivar coef: the initial β.
    :ivar uses_logits: the estimator reads full-vocabulary logits (computed in the update).
    :ivar controller_updates: the controller is fed the batch's KL every step.
    :ivar target: what the KL pulls towards (``kl.target``): ``"reference"``, the frozen initial
        policy, or ``"teacher"``, the model at ``teacher.path`` (on-policy distillation: the
        estimator's ``ref_logp`` / ``ref_logits`` are the teacher's).
    """

    placement: str
    estimator: BoundComponent
    controller: BoundComponent
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
    :ivar micro_batch_tokens: token positions per forward/backward instead
        (``trainer.micro_batch_tokens``), or ``None``: ``micro_batch_size`` sequences.
    """

    sequences: int
    sequences_per_process: int
    epochs: int
    mini_batches: int
    micro_batch_size: int
    micro_batch_tokens: int | None = None

    def micro_line(self) -> str:
        """How a mini-batch is split for forward/backward, in words (``plan.txt``)."""
        if self.micro_batch_tokens is None:
            return f"micro-batches of {self.micro_batch_size}"
        return (f"micro-batches of at most {self.micro_batch_tokens} token positions each, balanced by tokens "
                "(trainer.micro_batch_tokens)")

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps per training step (epochs × mini-batches)."""
        return self.epochs * self.mini_batches

    @property
    def on_policy(self) -> bool:
        """One optimizer step per rollout: the policy never moves before its loss is taken."""
        return self.optimizer_steps == 1


@dataclass(frozen=True)
class CorrectionStep:
    """One rollout correction of the run, in ``rollout_correction`` order.

    :ivar correction: the ``rollout_correction`` component with its parameters, bound.
    :ivar stage: ``batch``: computed once per step over the whole batch before the
        mini-batches (it reads no current-policy log-prob); ``update``: in each update
        micro-batch (it reads ``logp``, the policy being trained, or ``current_as_old``).
    :ivar mode: ``weight`` (its weights multiply the per-token policy loss) or ``mask``
        (its zero-weight tokens also leave ``loss_mask``, so every term over that mask
        stops counting them).
    :ivar current_as_old: ``trainer.old_logp=rollout`` (bypass) and the correction reads
        ``old_logp``: π_old is μ there, so its ``old_logp`` input is the current policy's
        log-probs (detached) instead, in each update micro-batch (stage ``update``), and it
        compares π with μ (verl's ``compute_policy_loss_bypass_mode``).
    """

    correction: BoundComponent
    stage: str
    mode: str
    current_as_old: bool = False

    @property
    def name(self) -> str:
        """The correction's name."""
        return self.correction.name


@dataclass(frozen=True)
class OptimizerPlan:
    """The optimizers (AdamW, fused where the device has the kernel) and their schedule.

    :ivar lr: the policy's learning rate (``trainer.lr``).
    :ivar critic_lr: the critic's (``trainer.critic_lr``; used when the plan has a critic).
    :ivar betas: AdamW's ``(beta1, beta2)``.
    :ivar weight_decay: AdamW's decoupled weight decay.
    :ivar max_grad_norm: gradients are clipped to this global norm; ``None`` measures the norm
        and never clips.
    :ivar schedule: the LR multiplier over training steps: ``constant``, ``linear`` or ``cosine``
        decay to 0 (:func:`rlzoo.learn.optim.lr_factor`).
    :ivar warmup_steps: training steps of linear warm-up before it.
    :ivar schedule_steps: the steps the decay spans (``trainer.total_steps``).
    """

    lr: float
    critic_lr: float
    betas: tuple[float, float]
    weight_decay: float
    max_grad_norm: float | None
    schedule: str
    warmup_steps: int
    schedule_steps: int

    def line(self, critic: bool) -> str:
        """The optimizer as one line of ``plan.txt``."""
        clip = "never clipped (norm logged)" if self.max_grad_norm is None else f"clipped at {self.max_grad_norm:g}"
        warmup = f"linear warm-up over {self.warmup_steps} steps, then " if self.warmup_steps else ""
        decay = "constant" if self.schedule == "constant" else \
            f"{self.schedule} decay to 0 at step {self.schedule_steps}"
        return (f"optimizer: AdamW lr {self.lr:g}{f' (critic {self.critic_lr:g})' if critic else ''}, betas "
                f"{self.betas[0]:g}/{self.betas[1]:g}, weight decay {self.weight_decay:g}; LR {warmup}{decay}; "
                f"gradient norm {clip}")
