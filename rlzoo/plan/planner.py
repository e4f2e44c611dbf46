"""The run plan: what a run *is*, decided once from the resolved config.

Before any model is built, :func:`build_plan` turns the config and the chosen components
into a :class:`RunPlan`: which models exist and why, which passes run each step, where KL
goes and in what unit, each loss term's aggregation, mask and coefficient, the update
structure, the optimizer, evaluation and cadence, and warnings for choices that cannot act.
The consistency checks (:mod:`rlzoo.plan.consistency`) run here, so a bad combination is
refused (``ConfigError``, exit 2) before a run directory exists. The engine reads the plan
and branches on nothing else; ``rlzoo config`` prints it, every run writes it to
``plan.txt`` in its directory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlzoo.config.layers import resolve_config
from rlzoo.config.resolved import ResolvedConfig
from rlzoo.contract.registry import Registry
from rlzoo.core import distributed
from rlzoo.core.errors import ConfigError
from rlzoo.plan.consistency import (LORA_INSTALL, check_async, check_consistency, peft_problem, target_needs,
                                    teacher_readers, who_needs)
from rlzoo.plan.episode_rules import episode_plan
from rlzoo.plan.learning import CorrectionStep, KLPlan, LossTerm, OptimizerPlan, UpdatePlan
from rlzoo.plan.records import LoraPlan, RolloutPlan, RunPlan
from rlzoo.plan.settings import CadencePlan, ComputePlan, EvalPlan, ModelPlan, PromptPlan, RewardModelPlan, TinyModel

__all__ = ["LORA_INSTALL", "CorrectionStep", "KLPlan", "LoraPlan", "LossTerm", "PlannedConfig", "RolloutPlan",
           "RunPlan", "UpdatePlan", "build_plan", "load_config", "peft_problem"]


@dataclass(kw_only=True)
class PlannedConfig(ResolvedConfig):
    """A resolved config with its run plan: what :func:`load_config` returns.

    :ivar plan: the :class:`RunPlan` decided from the rest (:func:`build_plan`). The engine
        takes the plan and the bound components (:class:`rlzoo.plan.run_input.RunInput`), not this.
    """

    plan: RunPlan


def _world(cfg: Any) -> int:
    env = distributed.env_world_size()
    return env if env > 1 else int(cfg.launcher.nproc)


def load_config(registry: Registry, overrides: list[str] | None = None, config_file: str | Path | None = None,
                base: dict[str, Any] | None = None, base_label: str = "base",
                reward_model: bool = False) -> PlannedConfig:
    """The resolved config of a run with its plan decided (``resolved.plan``): the layers
    merged and the components chosen (:func:`rlzoo.config.layers.resolve_config`, which
    documents the parameters), then :func:`build_plan` (``reward_model``: for ``rlzoo rm``).
    Raises :class:`~rlzoo.core.errors.ConfigError` on any bad input or inconsistent
    combination, before anything is built or written."""
    resolved = resolve_config(registry, overrides, config_file, base, base_label)
    fields = {f.name: getattr(resolved, f.name) for f in dataclasses.fields(resolved)}
    return PlannedConfig(**fields, plan=build_plan(resolved, reward_model))


def build_plan(resolved: ResolvedConfig, reward_model: bool = False) -> RunPlan:
    """Decide the run plan of ``resolved``; every consistency check of a run lives here.

    :param reward_model: the plan of an ``rlzoo rm`` run, which reads the model, optimizer,
        compute, cadence and held-out share of the plan (and the task and its rewards), and
        trains no policy: the checks of RL training (groups, prompts split over the
        processes, KL, a teacher, the asynchronous rollout, episodes, the rollout backend's)
        do not apply, and the RL records are those of one process. Its own checks are
        :func:`reward_model_plan`'s and :func:`rlzoo.run.rm_trainer.check_world`.
    :raises ConfigError: one line naming the conflicting keys and how to resolve them.
    """
    cfg = resolved.cfg
    comps = resolved.components
    world = 1 if reward_model else _world(cfg)
    kl_on = float(cfg.kl.coef) > 0
    to_teacher = kl_on and cfg.kl.target == "teacher"
    acting = [c for path, c in comps.items()
              if not (path.startswith("kl.") and not kl_on) and path not in ("value_loss", "rollout_correction")]
    acting += [c for c, _ in resolved.corrections]
    acting += [c for c, _ in resolved.extensions]
    needs: set[str] = set()
    for component in acting:
        is_kl_to_teacher = to_teacher and component is comps["kl.estimator"]
        needs |= target_needs(component.needs) if is_kl_to_teacher else component.needs
    if "critic" in needs and "value_loss" in comps:
        needs |= comps["value_loss"].needs
    episodes = None
    if not reward_model:
        check_consistency(resolved, needs, kl_on, world)
        check_async(resolved, world)
        episodes = episode_plan(resolved, needs, kl_on, world)

    lora = _lora_plan(cfg)
    models = {"policy": "trained" if lora is None else f"base weights frozen, rank-{lora.rank} LoRA adapters trained"}
    passes: dict[str, str] = {}
    if "greedy" in needs:
        passes["greedy"] = f"a greedy rollout of each prompt for the baseline ({who_needs(acting, 'greedy')})"
    t = cfg.trainer
    update = UpdatePlan(
        sequences=int(cfg.rollout.prompts_per_step) * int(cfg.rollout.n),
        sequences_per_process=int(cfg.rollout.prompts_per_step) // world * int(cfg.rollout.n),
        epochs=int(t.update_epochs), mini_batches=int(t.num_mini_batches),
        micro_batch_size=int(t.micro_batch_size),
        micro_batch_tokens=None if t.micro_batch_tokens is None else int(t.micro_batch_tokens))
    old_reasons = []
    if not update.on_policy:
        old_reasons.append(f"{update.optimizer_steps} optimizer steps per rollout (the ratio's denominator)")
    if kl_on and cfg.kl.apply == "reward":
        old_reasons.append("KL in the reward is taken at rollout time")
    if "old_logp" in needs:
        old_reasons.append(f"read by {who_needs(acting, 'old_logp')}")
    if "entropy" in needs:
        old_reasons.append(f"entropies read by {who_needs(acting, 'entropy')}")
    if "sum_pi_squared" in needs:
        old_reasons.append(f"Σπ² read by {who_needs(acting, 'sum_pi_squared')}")
    bypass = cfg.trainer.old_logp == "rollout"
    if old_reasons and not bypass:
        passes["old_logp"] = "; ".join(old_reasons)
    if "entropy" in needs:
        passes["old_entropy"] = f"with old_logp, for {who_needs(acting, 'entropy')}"
    if "sum_pi_squared" in needs:
        passes["old_sum_pi_squared"] = f"with old_logp, from the full logits, for {who_needs(acting, 'sum_pi_squared')}"

    kl = None
    if kl_on:
        estimator = comps["kl.estimator"]
        controller = comps["kl.controller"]
        kl = KLPlan(placement=str(cfg.kl.apply), estimator=resolved.bound("kl.estimator"),
                    controller=resolved.bound("kl.controller"), coef=float(cfg.kl.coef),
                    uses_logits="logits" in estimator.needs, controller_updates=controller.name != "fixed",
                    target=str(cfg.kl.target))
    if "reference" in needs or "logits" in needs:
        readers = who_needs(acting, 'reference') or who_needs(acting, 'logits')
        models["reference"] = (f"frozen initial policy, for {readers}" if lora is None else
                               f"the policy with its LoRA adapters disabled (the frozen base weights; no second "
                               f"copy), for {readers}")
        if "reference" in needs:
            passes["ref_logp"] = f"reference log-probs of the sampled tokens ({who_needs(acting, 'reference')})"
        if "logits" in needs:
            passes["ref_logits"] = f"reference logits in each update micro-batch ({who_needs(acting, 'logits')})"
    if "teacher" in needs or "teacher_logits" in needs:
        models["teacher"] = f"frozen teacher {cfg.teacher.path} ({teacher_readers(resolved, acting)})"
        if "teacher" in needs:
            passes["teacher_logp"] = (f"teacher log-probs of the sampled tokens "
                                      f"({teacher_readers(resolved, acting, 'teacher')})")
        if "teacher_logits" in needs:
            passes["teacher_logits"] = (f"teacher logits in each update micro-batch "
                                        f"({teacher_readers(resolved, acting, 'teacher_logits')})")
    if "critic" in needs:
        models["critic"] = (f"value model initialised from the policy ({who_needs(acting, 'critic')})"
                            + ("; all its weights are trained (LoRA adapts the policy only)" if lora else ""))
        passes["values"] = "critic values of the rollout (the value loss's old values)"
    models.update(_scorer_models(resolved))
    rollout_dtype = cfg.rollout.dtype or cfg.model.dtype
    if cfg.rollout.dtype and cfg.rollout.dtype != cfg.model.dtype:
        models["rollout"] = (f"a {cfg.rollout.dtype} copy of the policy for generation, synced after each "
                             "update (rollout.dtype)")
    describe = None if reward_model else comps["rollout.backend"].meta.get("plan")
    if describe is not None:  # a backend that says what it runs beside the trainer, refusing what it cannot run
        models["rollout"] = describe(cfg, resolved.params["rollout.backend"], world)

    aggregation = resolved.bound("loss_agg")
    terms = {"policy": LossTerm(aggregation, "loss_mask")}
    if kl is not None and kl.placement == "loss":
        terms["kl"] = LossTerm(aggregation, "loss_mask", kl.coef)
    if float(t.entropy_coef) > 0:
        terms["entropy"] = LossTerm(aggregation, "loss_mask", -float(t.entropy_coef))
    if "critic" in needs:
        terms["value"] = LossTerm(aggregation, "response_mask")

    plan = RunPlan(world=world, needs=frozenset(needs), models=models, passes=passes, kl=kl, terms=terms,
                   update=update, model=_model_plan(cfg, "teacher" in models), optimizer=_optimizer_plan(cfg),
                   eval=_eval_plan(cfg), cadence=_cadence_plan(cfg), compute=_compute_plan(cfg),
                   prompt=_prompt_plan(resolved),
                   rollout=RolloutPlan(backend=resolved.bound("rollout.backend"), dtype=str(rollout_dtype),
                                       prompts_per_process=int(cfg.rollout.prompts_per_step) // world,
                                       n=int(cfg.rollout.n), max_new_tokens=int(cfg.rollout.max_new_tokens),
                                       temperature=float(cfg.rollout.temperature), top_p=float(cfg.rollout.top_p),
                                       staleness=int(cfg.rollout.staleness), mode=str(cfg.rollout.mode),
                                       weight_sync_every=int(cfg.rollout.weight_sync_every),
                                       max_staleness=int(cfg.rollout.max_staleness),
                                       stale_batches=str(cfg.rollout.stale_batches),
                                       queue_size=int(cfg.rollout.queue_size),
                                       generator_timeout_s=float(cfg.rollout.generator_timeout_s)),
                   corrections=_correction_steps(resolved, bypass), bypass=bypass, record=bool(cfg.rollout.record),
                   correction_in_loss="correction_weights" in comps["policy_loss"].inputs,
                   precision=str(cfg.trainer.precision), lora=lora, episodes=episodes,
                   sampled_mask="response_mask" if episodes is None else "loss_mask")
    plan.warnings.extend(_inert_choices(resolved, plan))
    if lora is not None and lora.dropout > 0:
        plan.warnings.append(
            f"model.lora.dropout={lora.dropout:g} is on in the update only (training mode), not in the rollout, the "
            "old-log-prob pass or the KL reference (eval mode): the update's log-probs are those of a randomly "
            "thinned policy, so the importance ratio of the first mini-batch is not 1 and the KL compares a noisy "
            "policy with a clean reference (rlzoo sets every other dropout to 0); model.lora.dropout=0 for exact "
            "ratios")
    return plan


def _lora_plan(cfg: Any) -> LoraPlan | None:
    lora = cfg.model.lora
    if int(lora.rank) == 0:
        return None
    return LoraPlan(rank=int(lora.rank), alpha=float(lora.alpha), dropout=float(lora.dropout),
                    target_modules=tuple(str(name) for name in lora.target_modules))


def _model_plan(cfg: Any, teacher: bool) -> ModelPlan:
    m = cfg.model
    tiny = TinyModel(arch=str(m.arch), hidden_size=int(m.hidden_size), intermediate_size=int(m.intermediate_size),
                     num_layers=int(m.num_layers), num_heads=int(m.num_heads), num_kv_heads=int(m.num_kv_heads),
                     max_positions=4 * (int(cfg.rollout.max_new_tokens) + 64))
    return ModelPlan(path=str(m.path) if m.path else None, dtype=str(m.dtype), tiny=tiny,
                     gradient_checkpointing=bool(m.gradient_checkpointing),
                     teacher=str(cfg.teacher.path) if teacher else None)


def _optimizer_plan(cfg: Any) -> OptimizerPlan:
    t = cfg.trainer
    return OptimizerPlan(lr=float(t.lr), critic_lr=float(t.critic_lr), betas=(float(t.betas[0]), float(t.betas[1])),
                         weight_decay=float(t.weight_decay),
                         max_grad_norm=None if t.max_grad_norm is None else float(t.max_grad_norm),
                         schedule=str(t.lr_schedule), warmup_steps=int(t.warmup_steps),
                         schedule_steps=int(t.total_steps))


def reward_model_plan(cfg: Any) -> RewardModelPlan:
    """``rlzoo rm``'s record, from the resolved config's ``rm`` section (its values checked by the schema)."""
    rm = cfg.rm
    return RewardModelPlan(data=None if rm.data is None else str(rm.data), steps=int(rm.steps),
                           batch_size=int(rm.batch_size), eval_fraction=float(rm.eval_fraction),
                           eval_every=int(rm.eval_every),
                           chat_template=None if rm.chat_template is None else bool(rm.chat_template),
                           task_pairs=int(rm.task_pairs))


def _eval_plan(cfg: Any) -> EvalPlan:
    e = cfg.eval
    return EvalPlan(size=int(e.size), n=int(e.n), every=int(e.every), threshold=float(e.threshold),
                    holdout=float(e.holdout), at_start=bool(e.get("at_start", False)),
                    episodes=cfg.get("env") is not None)


def _cadence_plan(cfg: Any) -> CadencePlan:
    return CadencePlan(total_steps=int(cfg.trainer.total_steps), checkpoint_every=int(cfg.checkpoint.every),
                       checkpoint_keep=int(cfg.checkpoint.keep), log_every=int(cfg.logging.log_every),
                       sample_every=int(cfg.logging.sample_every), progress=bool(cfg.logging.progress),
                       doctor=bool(cfg.logging.doctor))


def _compute_plan(cfg: Any) -> ComputePlan:
    t, d = cfg.trainer, cfg.distributed
    return ComputePlan(device=str(t.device), threads=int(t.threads or 0), backend=str(d.backend),
                       timeout_s=float(d.timeout_s), strategy=str(d.strategy),
                       logprob_chunk_size=int(t.logprob_chunk_size),
                       logprob_keep_bytes=int(t.logprob_keep_mb * 2**20),
                       padding_free=None if t.padding_free is None else bool(t.padding_free))


def _prompt_plan(resolved: ResolvedConfig) -> PromptPlan:
    """``task.instruction``, ``model.system_prompt``, ``model.chat_template`` and the chosen
    answer format's ``hint``."""
    cfg, chosen = resolved.cfg, resolved.components.get("answer_format")
    task = cfg.task
    instruction = task.get("instruction") if hasattr(task, "get") else None
    return PromptPlan(instruction=instruction, format_hint=(chosen.meta.get("hint", "") if chosen else "") or "",
                      system_prompt=cfg.model.get("system_prompt"), chat_template=cfg.model.chat_template)


def _correction_steps(resolved: ResolvedConfig, bypass: bool) -> tuple[CorrectionStep, ...]:
    """The corrections in order, each with its stage and mode (see :class:`CorrectionStep`).
    Under ``bypass`` (π_old is μ) a correction that reads ``old_logp`` is given the current
    policy's log-probs in its place, in each micro-batch, as verl's bypass mode computes its
    IS weights and rejection masks inside the policy loss."""
    steps = []
    for index, (component, params) in enumerate(resolved.corrections):
        current_as_old = bypass and "old_logp" in component.inputs
        stage = "update" if "logp" in component.inputs or current_as_old else "batch"
        mode = str(getattr(params, "mode", "weight"))
        if mode == "mask" and stage == "update":
            reads = ("with trainer.old_logp=rollout compares the current policy with the rollout's mu"
                     if current_as_old else "reads the current policy (logp)")
            raise ConfigError(f"rollout_correction[{index}] {component.name!r} has mode=mask but {reads}, known "
                              "only inside each micro-batch, after the aggregation's denominators are counted: use "
                              "mode=weight" + (" (as verl's bypass mode, whose rejection leaves the rejected tokens "
                                               "in the mini-batch's token and sequence counts)" if current_as_old
                                               else ""))
        steps.append(CorrectionStep(correction=component.bind(params), stage=stage, mode=mode,
                                    current_as_old=current_as_old))
    return tuple(steps)


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


def _inert_choices(resolved: ResolvedConfig, plan: RunPlan) -> list[str]:
    """Choices that cannot change anything under ``plan``, said in words."""
    cfg = resolved.cfg
    warnings = []
    loss = resolved.components["policy_loss"]
    same_distribution = (plan.rollout.backend.name == "hf" and plan.rollout.dtype == cfg.model.dtype
                         and float(cfg.rollout.top_p) == 1.0)
    ratio_moves = plan.bypass and (not same_distribution or plan.rollout.off_policy)  # pi/mu != 1
    if plan.update.on_policy and not loss.meta.get("ratio_free") and not ratio_moves:
        warnings.append(
            f"one on-policy update per rollout (update_epochs=1, num_mini_batches=1): the importance ratio is "
            f"exactly 1, so {loss.name}'s clip ranges and caps never act (ppo_clip, cispo and vanilla_pg give "
            "identical updates); raise trainer.num_mini_batches or trainer.update_epochs for off-policy steps")
    if plan.kl is None:
        set_by_user = [key for key in ("kl.estimator.name", "kl.controller.name", "kl.apply", "kl.target")
                       if resolved.sources.get(key) == "command line"]
        if set_by_user:
            warnings.append(f"kl.coef=0: KL is off, so {', '.join(k.removesuffix('.name') for k in set_by_user)} "
                            "has no effect")
    inert = [step.name for step in plan.corrections
             if step.stage == "batch" or (step.current_as_old and plan.update.on_policy)]
    if inert and same_distribution and not plan.rollout.off_policy:
        against = "π" if plan.bypass else "π_old"
        warnings.append(f"rollout_correction {', '.join(inert)} corrects for μ ≠ {against}, but the hf backend "
                        "samples from the trained policy itself in its own dtype (rollout/mismatch_k3 ≈ 0): its "
                        "weights are 1 to float rounding; set rollout.dtype=bfloat16 (or rollout.top_p < 1) for a gap "
                        "to correct")
    reweighting = [step.name for step in plan.corrections
                   if step.current_as_old and step.correction.component.meta.get("importance_weights")]
    if reweighting and not loss.meta.get("ratio_free"):
        warnings.append(f"trainer.old_logp=rollout makes {loss.name}'s ratio pi/mu already, and rollout_correction "
                        f"{', '.join(reweighting)} multiplies its loss by a second pi/mu weight (verl's bypass "
                        "ppo_clip applies no IS weight, only rejection masks; its bypass_pg_* presets pair the "
                        "weights with REINFORCE): policy_loss=vanilla_pg for verl's recipe (algo=bypass_pg_is, ...)")
    if plan.rollout.staleness >= int(cfg.trainer.total_steps):
        warnings.append(f"rollout.staleness={plan.rollout.staleness} >= trainer.total_steps="
                        f"{cfg.trainer.total_steps}: every step trains on the initial policy's rollouts")
    if plan.rollout.mode == "async" and plan.rollout.stale_batches == "keep" and not plan.corrections:
        warnings.append(f"rollout.stale_batches=keep trains on batches beyond rollout.max_staleness="
                        f"{plan.rollout.max_staleness} with rollout_correction=none: nothing weights the stale data")
    advantage = resolved.components["advantage"]
    if "reward_scores" in advantage.inputs and len(resolved.rewards) == 1:
        warnings.append(f"advantage {advantage.name} normalises each of several reward functions separately; with "
                        f"one ({resolved.rewards[0][0].name}) that is a group normalisation followed by a batch "
                        "whitening: list the reward functions with reward=[{name: a, weight: 1.0}, ...]")
    if cfg.teacher.path and "teacher" not in plan.models:
        warnings.append(f"teacher.path is set but no component reads the teacher (teacher_logp): {cfg.teacher.path} "
                        "is not loaded; distil with advantage=opd or kl.target=teacher (with kl.coef > 0)")
    if plan.lora is None:
        set_lora = [key for key in ("model.lora.alpha", "model.lora.dropout", "model.lora.target_modules")
                    if resolved.sources.get(key) == "command line"]
        if set_lora:
            warnings.append(f"model.lora.rank=0: every weight is trained and no adapter exists, so "
                            f"{', '.join(set_lora)} has no effect; set model.lora.rank > 0 for LoRA")
    if "critic" not in plan.needs and resolved.sources.get("value_loss.name") == "command line":
        warnings.append("value_loss is set but no component needs a critic: it has no effect")
    o = plan.optimizer
    if o.warmup_steps > plan.cadence.total_steps:
        warnings.append(f"trainer.warmup_steps={o.warmup_steps} > trainer.total_steps={plan.cadence.total_steps}: the "
                        f"learning rate never reaches trainer.lr={o.lr:g} (the last step's is "
                        f"{plan.cadence.total_steps / o.warmup_steps:.2g} of it)")
    return warnings + _parameter_warnings(resolved)


def _parameter_warnings(resolved: ResolvedConfig) -> list[str]:
    """What the chosen components' parameters say of themselves: a parameter dataclass may
    define ``warnings() -> list[str]`` for values it accepts but that likely mislead (docs/plugins.md)."""
    chosen = [(path, component, resolved.params.get(path)) for path, component in resolved.components.items()]
    chosen += [(f"rollout_correction[{i}]" if len(resolved.corrections) > 1 else "rollout_correction", component,
                params) for i, (component, params) in enumerate(resolved.corrections)]
    chosen += [(f"reward[{i}]" if len(resolved.rewards) > 1 else "reward", component, params)
               for i, (component, params, _) in enumerate(resolved.rewards)]
    chosen += [(f"extensions[{i}]", component, params) for i, (component, params) in enumerate(resolved.extensions)]
    seen: set[int] = set()
    out = []
    for where, component, params in chosen:
        said = getattr(params, "warnings", None)
        if callable(said) and id(params) not in seen:
            seen.add(id(params))
            out += [f"{where} {component.name!r}: {line}" for line in said()]
    return out
