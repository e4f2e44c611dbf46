"""The records of what a run is built from and how it runs: models, compute, evaluation, cadence, prompts,
and ``rlzoo rm``'s reward-model run.

Plain frozen records decided by :func:`rlzoo.plan.planner.build_plan` from the config
sections of the same names, so that the engine reads the plan, never the config.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TinyModel:
    """The embedded tiny causal LM (``model.*``), built when ``model.path`` is unset.

    :ivar arch: ``qwen2`` or ``llama``.
    :ivar hidden_size: the residual width.
    :ivar intermediate_size: the MLP's width.
    :ivar num_layers: decoder layers.
    :ivar num_heads: attention heads.
    :ivar num_kv_heads: key-value heads (grouped-query attention when fewer).
    :ivar max_positions: its position table: 4 × (the response budget + 64) tokens.
    """

    arch: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    max_positions: int

    def describe(self) -> str:
        """The model in words (``plan.txt``, ``rlzoo rm``'s plan)."""
        return (f"the embedded tiny {self.arch} model ({self.num_layers} layers, width {self.hidden_size}, "
                f"{self.num_heads} heads, {self.num_kv_heads} key-value)")


@dataclass(frozen=True)
class ModelPlan:
    """Where the policy's weights come from and how they are held.

    :ivar path: a local model directory or ``.gguf`` file (``model.path``), or ``None``: the
        embedded :attr:`tiny` model with a character tokenizer over the task's alphabet.
    :ivar dtype: the weights' dtype (``model.dtype``).
    :ivar tiny: the embedded model's shape (built when ``path`` is ``None``).
    :ivar gradient_checkpointing: recompute the policy's activations in backward.
    :ivar teacher: ``teacher.path`` when the plan has a teacher model (``"teacher" in
        plan.models``), else ``None``.
    """

    path: str | None
    dtype: str
    tiny: TinyModel
    gradient_checkpointing: bool = False
    teacher: str | None = None

    def line(self) -> str:
        """The policy's weights as one line of ``plan.txt``."""
        source = f"model.path {self.path}" if self.path else self.tiny.describe()
        return (f"policy weights: {source}, {self.dtype}"
                f"{'; gradient checkpointing' if self.gradient_checkpointing else ''}")


@dataclass(frozen=True)
class ComputePlan:
    """Where and how a process computes.

    :ivar device: ``cpu``, ``cuda`` or ``auto`` (``trainer.device``).
    :ivar threads: torch threads (0: torch's choice).
    :ivar backend: the process group's backend under torchrun (``auto``, ``gloo``, ``nccl``).
    :ivar timeout_s: a collective waiting longer fails the job.
    :ivar strategy: how the trained models are wrapped under torchrun: ``ddp`` or ``fsdp``.
    :ivar logprob_chunk_size: tokens per chunk of the log-prob / entropy head.
    :ivar logprob_keep_bytes: the head keeps its log-softmax for backward up to this size.
    :ivar padding_free: ``trainer.padding_free``: pack the training-side passes' sequences
        without padding where exact (``None``), always (``True``: refused where not exact) or
        never (``False``).
    """

    device: str = "cpu"
    threads: int = 0
    backend: str = "auto"
    timeout_s: float = 600.0
    strategy: str = "ddp"
    logprob_chunk_size: int = 1024
    logprob_keep_bytes: int = 256 * 2**20
    padding_free: bool | None = None

    def packing_line(self) -> str:
        """The passes' layout in words (``plan.txt``)."""
        if self.padding_free is False:
            return "training-side passes: padded (trainer.padding_free=false)"
        where = ("required: refused where the model check finds it not exact" if self.padding_free
                 else "where the model check finds it exact, padded elsewhere")
        return (f"training-side passes: each micro-batch's sequences packed without padding, {where} "
                "(trainer.padding_free)")


@dataclass(frozen=True)
class EvalPlan:
    """Held-out evaluation and the held-out share of every task's prompts.

    :ivar size: held-out prompts evaluated (0: no evaluation).
    :ivar n: sampled completions per prompt for pass@1 / pass@n (0: greedy only).
    :ivar every: evaluate every this many steps and after the last (0: only after the last).
    :ivar threshold: a completion is correct when its score reaches this.
    :ivar holdout: the share of every task's prompts kept out of training (also without
        evaluation: it changes the training data).
    :ivar at_start: also evaluate before the first step.
    :ivar episodes: the run plays episodes with an environment (its greedy turns are logged).
    """

    size: int
    n: int
    every: int
    threshold: float
    holdout: float
    at_start: bool = False
    episodes: bool = False

    def line(self) -> str:
        """Evaluation as one line of ``plan.txt``."""
        if not self.size:
            return f"evaluation: off (eval.size=0); {self.holdout:g} of the prompts still held out of training"
        when = f"every {self.every} steps and after the last" if self.every else "after the last step"
        sampled = f" and {self.n} samples" if self.n else ""
        return (f"evaluation: up to {self.size} held-out prompts ({self.holdout:g} of the prompts, never trained "
                f"on), greedy{sampled} each, correct = score >= {self.threshold:g}, "
                f"{'before the first step, ' if self.at_start else ''}{when}")


@dataclass(frozen=True)
class CadencePlan:
    """How long a run is and how often it logs and checkpoints.

    :ivar total_steps: training steps (``trainer.total_steps``).
    :ivar checkpoint_every: steps between checkpoints (0: only at the end).
    :ivar checkpoint_keep: checkpoints kept on disk.
    :ivar log_every: steps between logged scalars (evaluation is always logged).
    :ivar sample_every: steps between logged sample completions (0: never).
    :ivar progress: a progress bar on a terminal (a line every tenth of the run otherwise).
    :ivar doctor: ``rlzoo doctor``'s checks during the run, as warnings (``logging.doctor``).
    """

    total_steps: int
    checkpoint_every: int
    checkpoint_keep: int
    log_every: int = 1
    sample_every: int = 0
    progress: bool = True
    doctor: bool = True

    def line(self) -> str:
        """The cadence as one line of ``plan.txt``."""
        checkpoints = f"every {self.checkpoint_every} steps and " if self.checkpoint_every else ""
        samples = f", samples every {self.sample_every}" if self.sample_every else ""
        return (f"steps: {self.total_steps}; checkpoints {checkpoints}at the end, newest {self.checkpoint_keep} "
                f"kept; scalars logged every {self.log_every} step(s){samples}")


@dataclass(frozen=True)
class PromptPlan:
    """How a task's prompt becomes the text the model reads (:mod:`rlzoo.tasks.prompts`).

    :ivar instruction: ``task.instruction`` (``None``: the question, then the hint).
    :ivar format_hint: the answer format's hint ("" for none).
    :ivar system_prompt: ``model.system_prompt``.
    :ivar chat_template: ``model.chat_template`` (``None``: when the tokenizer has one).
    """

    instruction: str | None = None
    format_hint: str = ""
    system_prompt: str | None = None
    chat_template: bool | None = None


@dataclass(frozen=True)
class RewardModelPlan:
    """What ``rlzoo rm`` trains on and how (the ``rm`` section; docs/reward-models.md).

    :ivar data: a preference file (``.jsonl`` / ``.parquet``), ``"task"`` (pairs ranked by the
        task's reward) or ``None`` (not set: ``rlzoo rm`` refuses to start).
    :ivar steps: optimizer steps.
    :ivar batch_size: pairs per optimizer step (split over the processes under torchrun).
    :ivar eval_fraction: the share of the pairs held out for pairwise accuracy.
    :ivar eval_every: evaluate every N steps and after the last (0: only after the last).
    :ivar chat_template: render with the tokenizer's chat template (``None``: when it has one).
    :ivar task_pairs: how many pairs ``data="task"`` generates.
    """

    data: str | None
    steps: int
    batch_size: int
    eval_fraction: float
    eval_every: int
    chat_template: bool | None
    task_pairs: int
