"""The run plan: what a run *is*, decided once from the resolved config.

Before any model is built, :func:`build_plan` turns the config and the chosen components
into a :class:`RunPlan`: which models exist and why, which passes run each step, where KL
goes and in what unit, which aggregation each loss term uses, the update structure, and
warnings for choices that cannot act. Every consistency check lives here, so a bad
combination is refused (``ConfigError``, exit 2) before a run directory exists. The engine
reads the plan and branches on nothing else; ``rlzoo config`` prints it, every run writes
it to ``plan.txt`` in its directory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlzoo import distributed
from rlzoo.errors import ConfigError
from rlzoo.resolved import ResolvedConfig


@dataclass(frozen=True)
class KLPlan:
    """Where KL to the reference acts.

    :ivar placement: ``"reward"`` (β·KL_t subtracted from the token rewards) or ``"loss"``
        (β·agg(KL) added to the policy loss).
    :ivar estimator: the ``kl_estimator`` component's name.
    :ivar controller: the ``kl_controller`` component's name.
    :ivar coef: the initial β.
    :ivar uses_logits: the estimator reads full-vocabulary logits (computed in the update).
    :ivar controller_updates: the controller is fed the batch's KL every step.
    """

    placement: str
    estimator: str
    controller: str
    coef: float
    uses_logits: bool
    controller_updates: bool


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
        (``rollout.staleness``; :mod:`rlzoo.rollout_queue`); 0 is on-policy.
    """

    backend: str
    dtype: str
    prompts_per_process: int
    n: int
    max_new_tokens: int
    temperature: float
    top_p: float
    staleness: int = 0


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
class RunPlan:
    """What a run is. Built by :func:`build_plan`; read by the engine.

    :ivar world: processes (1, or torchrun's / ``launcher.nproc``'s N).
    :ivar needs: the union of what the chosen components need.
    :ivar models: model name -> why it exists (``policy`` always).
    :ivar passes: pass name -> why it runs each step: ``greedy`` (a greedy rollout),
        ``old_logp`` (log-probs before the update), ``old_entropy`` (with them),
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
    :ivar record: each step's batch is written to ``rollouts/`` (``rollout.record``).
    :ivar precision: ``trainer.precision``: ``fp32``, or ``bf16`` compute over float32 weights.
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
    record: bool = False
    precision: str = "fp32"
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
                "controller_updates": self.kl.controller_updates},
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
            "warnings": list(self.warnings),
        }

    def render(self) -> str:
        """The plan as text, one fact a line (``plan.txt``, ``rlzoo config --plan``)."""
        u = self.update
        lines = ["# run plan", f"processes: {self.world}", "models:"]
        lines += [f"  {name}: {why}" for name, why in self.models.items()]
        lines.append("passes each step:")
        r = self.rollout
        lines.append(f"  rollout: {r.backend} backend, {u.sequences} sequences ({r.dtype}): {r.n} completions of "
                     f"at most {r.max_new_tokens} tokens per prompt, temperature {r.temperature:g}"
                     f"{f', top_p {r.top_p:g}' if r.top_p < 1 else ''}")
        if r.staleness:
            lines.append(f"  rollout queue: step t trains on the rollouts of the policy of step t-{r.staleness} "
                         f"(steps 1-{r.staleness} on the initial policy's; rollout.staleness)")
        lines += [f"  {name}: {why}" for name, why in self.passes.items()]
        if self.bypass:
            lines.append("old log-probs: the rollout's (trainer.old_logp=rollout, bypass): the importance ratio is "
                         "pi/mu and no old-log-prob pass runs")
        lines += self._correction_lines()
        if self.record:
            lines.append("each step's batch is recorded in rollouts/ (rlzoo ab replays it)")
        if self.precision == "bf16":
            lines.append("precision: bf16 autocast for every model forward and backward of the learner over float32 "
                         "weights and optimizer state; softmax, log-probs, losses and values in float32")
        if self.kl is None:
            lines.append("kl: off (kl.coef = 0)")
        else:
            k = self.kl
            where = ("in the reward: r_t -= beta * KL_t" if k.placement == "reward"
                     else f"as a loss term: loss += beta * {self.aggregation['kl']}(KL)")
            lines.append(f"kl: {k.estimator} {where}; beta {k.coef} ({k.controller}"
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


def _world(cfg: Any) -> int:
    env = distributed.env_world_size()
    return env if env > 1 else int(cfg.launcher.nproc)


def _names(components: list[Any], need: str) -> str:
    return ", ".join(f"{c.kind} {c.name}" for c in components if need in c.needs)


def build_plan(resolved: ResolvedConfig) -> RunPlan:
    """Decide the run plan of ``resolved``; every consistency check of a run lives here.

    :raises ConfigError: one line naming the conflicting keys and how to resolve them.
    """
    cfg = resolved.cfg
    comps = resolved.components
    world = _world(cfg)
    kl_on = float(cfg.kl.coef) > 0
    acting = [c for path, c in comps.items()
              if not (path.startswith("kl.") and not kl_on) and path not in ("value_loss", "rollout_correction")]
    acting += [c for c, _ in resolved.corrections]
    acting += [c for c, _ in resolved.extensions]
    needs: set[str] = set()
    for component in acting:
        needs |= component.needs
    if "critic" in needs and "value_loss" in comps:
        needs |= comps["value_loss"].needs
    _check_consistency(resolved, needs, kl_on, world)

    models = {"policy": "trained"}
    passes: dict[str, str] = {}
    if "greedy" in needs:
        passes["greedy"] = f"a greedy rollout of each prompt for the baseline ({_names(acting, 'greedy')})"
    t = cfg.trainer
    update = UpdatePlan(
        sequences=int(cfg.rollout.prompts_per_step) * int(cfg.rollout.n),
        sequences_per_process=int(cfg.rollout.prompts_per_step) // world * int(cfg.rollout.n),
        epochs=int(t.update_epochs), mini_batches=int(t.num_mini_batches),
        micro_batch_size=int(t.micro_batch_size))
    old_reasons = []
    if not update.on_policy:
        old_reasons.append(f"{update.optimizer_steps} optimizer steps per rollout (the ratio's denominator)")
    if kl_on and cfg.kl.apply == "reward":
        old_reasons.append("KL in the reward is taken at rollout time")
    if "old_logp" in needs:
        old_reasons.append(f"read by {_names(acting, 'old_logp')}")
    if "entropy" in needs:
        old_reasons.append(f"entropies read by {_names(acting, 'entropy')}")
    bypass = cfg.trainer.old_logp == "rollout"
    if old_reasons and not bypass:
        passes["old_logp"] = "; ".join(old_reasons)
    if "entropy" in needs:
        passes["old_entropy"] = f"with old_logp, for {_names(acting, 'entropy')}"

    kl = None
    if kl_on:
        estimator = comps["kl.estimator"]
        controller = comps["kl.controller"]
        uses_logits = "logits" in estimator.needs
        kl = KLPlan(placement=str(cfg.kl.apply), estimator=estimator.name, controller=controller.name,
                    coef=float(cfg.kl.coef), uses_logits=uses_logits,
                    controller_updates=controller.name != "fixed")
    if "reference" in needs or "logits" in needs:
        models["reference"] = f"frozen initial policy, for {_names(acting, 'reference') or _names(acting, 'logits')}"
        if "reference" in needs:
            passes["ref_logp"] = f"reference log-probs of the sampled tokens ({_names(acting, 'reference')})"
        if "logits" in needs:
            passes["ref_logits"] = f"reference logits in each update micro-batch ({_names(acting, 'logits')})"
    if "teacher" in needs:
        models["teacher"] = f"frozen teacher {cfg.teacher.path} ({_names(acting, 'teacher')})"
        passes["teacher_logp"] = f"teacher log-probs of the sampled tokens ({_names(acting, 'teacher')})"
    if "critic" in needs:
        models["critic"] = f"value model initialised from the policy ({_names(acting, 'critic')})"
        passes["values"] = "critic values of the rollout (the value loss's old values)"
    models.update(_scorer_models(resolved))
    rollout_dtype = cfg.rollout.dtype or cfg.model.dtype
    if cfg.rollout.dtype and cfg.rollout.dtype != cfg.model.dtype:
        models["rollout"] = (f"a {cfg.rollout.dtype} copy of the policy for generation, synced after each "
                             "update (rollout.dtype)")

    aggregation = {"policy": comps["loss_agg"].name}
    masks = {"policy": "loss_mask"}
    if kl is not None and kl.placement == "loss":
        aggregation["kl"], masks["kl"] = comps["loss_agg"].name, "loss_mask"
    if float(t.entropy_coef) > 0:
        aggregation["entropy"], masks["entropy"] = comps["loss_agg"].name, "loss_mask"
    if "critic" in needs:
        aggregation["value"], masks["value"] = comps["loss_agg"].name, "response_mask"

    plan = RunPlan(world=world, needs=frozenset(needs), models=models, passes=passes, kl=kl,
                   aggregation=aggregation, masks=masks, update=update,
                   rollout=RolloutPlan(backend=comps["rollout.backend"].name, dtype=str(rollout_dtype),
                                       prompts_per_process=int(cfg.rollout.prompts_per_step) // world,
                                       n=int(cfg.rollout.n), max_new_tokens=int(cfg.rollout.max_new_tokens),
                                       temperature=float(cfg.rollout.temperature), top_p=float(cfg.rollout.top_p),
                                       staleness=int(cfg.rollout.staleness)),
                   corrections=_correction_steps(resolved), bypass=bypass, record=bool(cfg.rollout.record),
                   precision=str(cfg.trainer.precision))
    plan.warnings.extend(_inert_choices(resolved, plan))
    return plan


def _correction_steps(resolved: ResolvedConfig) -> tuple[CorrectionStep, ...]:
    """The corrections in order, each with its stage and mode (see :class:`CorrectionStep`)."""
    steps = []
    for index, (component, params) in enumerate(resolved.corrections):
        stage = "update" if "logp" in component.inputs else "batch"
        mode = str(getattr(params, "mode", "weight"))
        if mode == "mask" and stage == "update":
            raise ConfigError(f"rollout_correction[{index}] {component.name!r} has mode=mask but reads the current "
                              "policy (logp), known only inside each micro-batch, after the aggregation's "
                              "denominators are counted: use mode=weight")
        steps.append(CorrectionStep(name=component.name, index=index, stage=stage, mode=mode))
    return tuple(steps)


def _check_bypass(resolved: ResolvedConfig, needs: set[str]) -> None:
    """``trainer.old_logp=rollout`` takes π_old to be μ: refuse what would then read nothing."""
    reads_old = [c.name for c, _ in resolved.corrections if "old_logp" in c.inputs]
    if reads_old:
        raise ConfigError(f"trainer.old_logp=rollout makes the rollout's log-probs pi_old, so rollout_correction "
                          f"{', '.join(reads_old)} (which compares pi_old with the rollout's mu) would weight every "
                          "token 1: remove it, or set trainer.old_logp=compute (opmask compares mu with the current "
                          "policy and works in both)")
    if "entropy" in needs:
        acting = [*resolved.components.values(), *(c for c, _ in resolved.extensions)]
        raise ConfigError(f"trainer.old_logp=rollout skips the old-log-prob pass, which computes the entropies "
                          f"{_names(acting, 'entropy')} read(s): set trainer.old_logp=compute")


def _check_consistency(resolved: ResolvedConfig, needs: set[str], kl_on: bool, world: int) -> None:
    cfg = resolved.cfg
    comps = resolved.components
    acting = [*comps.values(), *(c for c, _ in resolved.extensions)]
    if cfg.trainer.old_logp == "rollout":
        _check_bypass(resolved, needs)
    if "groups" in needs and cfg.rollout.n < 2:
        raise ConfigError(f"{_names(acting, 'groups')} need groups of completions: set rollout.n >= 2 "
                          f"(got {cfg.rollout.n})")
    if cfg.rollout.record and world > 1:
        raise ConfigError("rollout.record=true records one process's batches; record a run of a single process "
                          f"(this job has {world})")
    if cfg.rollout.prompts_per_step % world:
        raise ConfigError(f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} must be divisible by the "
                          f"number of processes ({world}): each process takes whole groups")
    per_process = cfg.rollout.prompts_per_step // world * cfg.rollout.n
    mini = int(cfg.trainer.num_mini_batches)
    if per_process % mini:
        raise ConfigError(f"trainer.num_mini_batches={mini} does not divide the {per_process} sequences each "
                          f"process trains on per step (rollout.prompts_per_step={cfg.rollout.prompts_per_step}"
                          f"{f' / {world} processes' if world > 1 else ''} x rollout.n={cfg.rollout.n}): "
                          "choose a divisor so mini-batches are equal")
    required = comps["policy_loss"].meta.get("loss_agg")
    if required and required != comps["loss_agg"].name:
        source = resolved.sources.get("loss_agg.name", "?")
        raise ConfigError(f"policy_loss {comps['policy_loss'].name!r} is defined with loss_agg={required} "
                          f"(it registers so); loss_agg is {comps['loss_agg'].name} (from {source}): set "
                          f"loss_agg={required}")
    _check_reward_inputs(resolved, kl_on)
    if "teacher" in needs:
        teacher = cfg.teacher.path
        if not teacher:
            raise ConfigError(f"{_names(acting, 'teacher')} distil(s) from a teacher model: set teacher.path to a "
                              "local model directory (written by save_pretrained; its tokenizer must be the policy's)")
        if not (Path(str(teacher)) / "config.json").is_file():
            raise ConfigError(f"teacher.path {str(teacher)!r} is not a local model directory (no config.json); "
                              "rlzoo never downloads models")
    if kl_on:
        estimator, controller = comps["kl.estimator"], comps["kl.controller"]
        if "logits" in estimator.needs and cfg.kl.apply == "reward":
            raise ConfigError(f"kl.estimator {estimator.name!r} reads full-vocabulary logits, which exist only "
                              "in the update: use it with kl.apply=loss (or choose a sampled-token estimator "
                              "such as k1 for kl.apply=reward)")
        if controller.name != "fixed" and cfg.kl.apply == "loss":
            raise ConfigError(f"kl.controller={controller.name} adapts beta of the KL folded into the reward "
                              "(Ziegler et al. 2019); with kl.apply=loss beta is fixed (as verl's kl_loss_coef): "
                              "set kl.controller=fixed or kl.apply=reward")


def _scorer_models(resolved: ResolvedConfig) -> dict[str, str]:
    """The models the reward scorers load (a reward registered as a class with a
    ``describe(params)``), each with its plan line; the line's ``ValueError`` (no model
    directory, ...) is a config error, raised before anything is built."""
    models: dict[str, str] = {}
    for component, params, _ in resolved.rewards:
        describe = getattr(component.fn, "describe", None) if isinstance(component.fn, type) else None
        if describe is None:
            continue
        try:
            line = str(describe(params))
        except ValueError as exc:
            raise ConfigError(f"reward {component.name!r}: {exc}") from exc
        key = component.name if component.name not in models else f"{component.name}#{len(models) + 1}"
        models[key] = line
    return models


def _check_reward_inputs(resolved: ResolvedConfig, kl_on: bool) -> None:
    """An advantage estimator that reads each reward function's raw scores (``reward_scores``)
    rather than ``token_rewards`` never sees KL in the reward or a shaped reward: refuse both."""
    advantage = resolved.components["advantage"]
    if "reward_scores" not in advantage.inputs or "token_rewards" in advantage.inputs:
        return
    if kl_on and resolved.cfg.kl.apply == "reward":
        raise ConfigError(f"advantage {advantage.name!r} normalises each reward function's raw scores, so KL in "
                          "the reward would be ignored: set kl.apply=loss (or kl.coef=0)")
    shapers = [c.name for c, _ in resolved.extensions if hasattr(c.fn, "rlzoo_shape_rewards")]
    if shapers:
        raise ConfigError(f"advantage {advantage.name!r} normalises each reward function's raw scores, so the "
                          f"reward shaping of extension {', '.join(shapers)} would be ignored: remove it, or make "
                          "the shaping a reward function of its own in reward=[...]")


def _inert_choices(resolved: ResolvedConfig, plan: RunPlan) -> list[str]:
    """Choices that cannot change anything under ``plan``, said in words."""
    cfg = resolved.cfg
    warnings = []
    loss = resolved.components["policy_loss"]
    same_distribution = (plan.rollout.backend == "hf" and plan.rollout.dtype == cfg.model.dtype
                         and float(cfg.rollout.top_p) == 1.0)
    ratio_moves = plan.bypass and (not same_distribution or plan.rollout.staleness > 0)  # pi/mu != 1
    if plan.update.on_policy and not loss.meta.get("ratio_free") and not ratio_moves:
        warnings.append(
            f"one on-policy update per rollout (update_epochs=1, num_mini_batches=1): the importance ratio is "
            f"exactly 1, so {loss.name}'s clip ranges and caps never act (ppo_clip, cispo and vanilla_pg give "
            "identical updates); raise trainer.num_mini_batches or trainer.update_epochs for off-policy steps")
    if plan.kl is None:
        set_by_user = [key for key in ("kl.estimator.name", "kl.controller.name", "kl.apply")
                       if resolved.sources.get(key) == "command line"]
        if set_by_user:
            warnings.append(f"kl.coef=0: KL is off, so {', '.join(k.removesuffix('.name') for k in set_by_user)} "
                            "has no effect")
    inert = [c.name for c, _ in resolved.corrections if "logp" not in c.inputs]
    if inert and same_distribution and not plan.rollout.staleness:
        warnings.append(f"rollout_correction {', '.join(inert)} corrects for μ ≠ π_old, but the hf backend "
                        "samples from the trained policy itself in its own dtype (rollout/mismatch_k3 ≈ 0): its "
                        "weights are 1 to float rounding; set rollout.dtype=bfloat16 (or rollout.top_p < 1) for a gap "
                        "to correct")
    if plan.rollout.staleness >= int(cfg.trainer.total_steps):
        warnings.append(f"rollout.staleness={plan.rollout.staleness} >= trainer.total_steps="
                        f"{cfg.trainer.total_steps}: every step trains on the initial policy's rollouts")
    advantage = resolved.components["advantage"]
    if "reward_scores" in advantage.inputs and len(resolved.rewards) == 1:
        warnings.append(f"advantage {advantage.name} normalises each of several reward functions separately; with "
                        f"one ({resolved.rewards[0][0].name}) that is a group normalisation followed by a batch "
                        "whitening: list the reward functions with reward=[{name: a, weight: 1.0}, ...]")
    if cfg.teacher.path and "teacher" not in plan.needs:
        warnings.append(f"teacher.path is set but no component reads the teacher (teacher_logp): {cfg.teacher.path} "
                        "is not loaded; distil with advantage=opd")
    if "critic" not in plan.needs and resolved.sources.get("value_loss.name") == "command line":
        warnings.append("value_loss is set but no component needs a critic: it has no effect")
    return warnings
