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

import importlib.metadata
from pathlib import Path
from typing import Any

from rlzoo.contract.registry import Registry

from rlzoo.core import distributed
from rlzoo.plan.episode_rules import episode_plan
from rlzoo.core.errors import ConfigError
from rlzoo.contract.kinds import KINDS
from rlzoo.plan.records import CorrectionStep, KLPlan, LoraPlan, RolloutPlan, RunPlan, UpdatePlan
from rlzoo.config.layers import resolve_config
from rlzoo.config.resolved import ResolvedConfig

__all__ = ["CorrectionStep", "KLPlan", "LoraPlan", "RolloutPlan", "RunPlan", "UpdatePlan", "build_plan",
           "peft_problem"]


PEFT_MIN_VERSION = (0, 11)
"""The oldest ``peft`` whose ``disable_adapter``, ``merge_and_unload`` and
``set_peft_model_state_dict`` rlzoo relies on."""
LORA_INSTALL = "pip install 'rlzoo[lora]' (or pip install 'peft>=0.11')"


def peft_problem() -> str | None:
    """Why ``peft`` cannot serve a LoRA run (not installed, or older than
    :data:`PEFT_MIN_VERSION`), or ``None``; checked without importing it."""
    try:
        version = importlib.metadata.version("peft")
    except importlib.metadata.PackageNotFoundError:
        return "the peft package is not installed"
    numbers = tuple(int(part) for part in (version.split(".") + ["0", "0"])[:2] if part.isdigit())
    if len(numbers) == 2 and numbers < PEFT_MIN_VERSION:
        return f"peft {version} is installed, older than 0.11"
    return None


def _world(cfg: Any) -> int:
    env = distributed.env_world_size()
    return env if env > 1 else int(cfg.launcher.nproc)


def _names(components: list[Any], need: str) -> str:
    """The components that need ``need``, each with the inputs its function names that imply it
    (``advantage gae via its input values``): a plugin learns which argument built what."""
    named = []
    for c in components:
        if need in c.needs:
            carriers = [i for i in c.inputs if (spec := KINDS[c.kind].inputs.get(i)) is not None and spec.need == need]
            named.append(f"{c.kind} {c.name}" + (f" via its input {', '.join(carriers)}" if carriers else ""))
    return ", ".join(named)


def load_config(registry: Registry, overrides: list[str] | None = None, config_file: str | Path | None = None,
                base: dict[str, Any] | None = None, base_label: str = "base") -> ResolvedConfig:
    """The resolved config of a run with its plan decided (``resolved.plan``): the layers
    merged and the components chosen (:func:`rlzoo.config.layers.resolve_config`, which
    documents the parameters), then :func:`build_plan`. Raises
    :class:`~rlzoo.core.errors.ConfigError` on any bad input or inconsistent combination,
    before anything is built or written."""
    resolved = resolve_config(registry, overrides, config_file, base, base_label)
    resolved.plan = build_plan(resolved)
    return resolved


def build_plan(resolved: ResolvedConfig) -> RunPlan:
    """Decide the run plan of ``resolved``; every consistency check of a run lives here.

    :raises ConfigError: one line naming the conflicting keys and how to resolve them.
    """
    cfg = resolved.cfg
    comps = resolved.components
    world = _world(cfg)
    kl_on = float(cfg.kl.coef) > 0
    to_teacher = kl_on and cfg.kl.target == "teacher"
    acting = [c for path, c in comps.items()
              if not (path.startswith("kl.") and not kl_on) and path not in ("value_loss", "rollout_correction")]
    acting += [c for c, _ in resolved.corrections]
    acting += [c for c, _ in resolved.extensions]
    needs: set[str] = set()
    for component in acting:
        is_kl_to_teacher = to_teacher and component is comps["kl.estimator"]
        needs |= _target_needs(component.needs) if is_kl_to_teacher else component.needs
    if "critic" in needs and "value_loss" in comps:
        needs |= comps["value_loss"].needs
    _check_consistency(resolved, needs, kl_on, world)
    _check_async(resolved, world)
    episodes = episode_plan(resolved, needs, kl_on, world)

    lora = _lora_plan(cfg)
    models = {"policy": "trained" if lora is None else f"base weights frozen, rank-{lora.rank} LoRA adapters trained"}
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
    if "sum_pi_squared" in needs:
        old_reasons.append(f"Σπ² read by {_names(acting, 'sum_pi_squared')}")
    bypass = cfg.trainer.old_logp == "rollout"
    if old_reasons and not bypass:
        passes["old_logp"] = "; ".join(old_reasons)
    if "entropy" in needs:
        passes["old_entropy"] = f"with old_logp, for {_names(acting, 'entropy')}"
    if "sum_pi_squared" in needs:
        passes["old_sum_pi_squared"] = f"with old_logp, from the full logits, for {_names(acting, 'sum_pi_squared')}"

    kl = None
    if kl_on:
        estimator = comps["kl.estimator"]
        controller = comps["kl.controller"]
        uses_logits = "logits" in estimator.needs
        kl = KLPlan(placement=str(cfg.kl.apply), estimator=estimator.name, controller=controller.name,
                    coef=float(cfg.kl.coef), uses_logits=uses_logits,
                    controller_updates=controller.name != "fixed", target=str(cfg.kl.target))
    if "reference" in needs or "logits" in needs:
        readers = _names(acting, 'reference') or _names(acting, 'logits')
        models["reference"] = (f"frozen initial policy, for {readers}" if lora is None else
                               f"the policy with its LoRA adapters disabled (the frozen base weights; no second "
                               f"copy), for {readers}")
        if "reference" in needs:
            passes["ref_logp"] = f"reference log-probs of the sampled tokens ({_names(acting, 'reference')})"
        if "logits" in needs:
            passes["ref_logits"] = f"reference logits in each update micro-batch ({_names(acting, 'logits')})"
    if "teacher" in needs or "teacher_logits" in needs:
        models["teacher"] = f"frozen teacher {cfg.teacher.path} ({_teacher_readers(resolved, acting)})"
        if "teacher" in needs:
            passes["teacher_logp"] = (f"teacher log-probs of the sampled tokens "
                                      f"({_teacher_readers(resolved, acting, 'teacher')})")
        if "teacher_logits" in needs:
            passes["teacher_logits"] = (f"teacher logits in each update micro-batch "
                                        f"({_teacher_readers(resolved, acting, 'teacher_logits')})")
    if "critic" in needs:
        models["critic"] = (f"value model initialised from the policy ({_names(acting, 'critic')})"
                            + ("; all its weights are trained (LoRA adapts the policy only)" if lora else ""))
        passes["values"] = "critic values of the rollout (the value loss's old values)"
    models.update(_scorer_models(resolved))
    rollout_dtype = cfg.rollout.dtype or cfg.model.dtype
    if cfg.rollout.dtype and cfg.rollout.dtype != cfg.model.dtype:
        models["rollout"] = (f"a {cfg.rollout.dtype} copy of the policy for generation, synced after each "
                             "update (rollout.dtype)")
    describe = comps["rollout.backend"].meta.get("plan")
    if describe is not None:  # a backend that says what it runs beside the trainer, refusing what it cannot run
        models["rollout"] = describe(cfg, resolved.params["rollout.backend"], world)

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
                                       staleness=int(cfg.rollout.staleness), mode=str(cfg.rollout.mode),
                                       weight_sync_every=int(cfg.rollout.weight_sync_every),
                                       max_staleness=int(cfg.rollout.max_staleness),
                                       stale_batches=str(cfg.rollout.stale_batches),
                                       queue_size=int(cfg.rollout.queue_size)),
                   corrections=_correction_steps(resolved), bypass=bypass, record=bool(cfg.rollout.record),
                   correction_in_loss="correction_weights" in comps["policy_loss"].inputs,
                   precision=str(cfg.trainer.precision), lora=lora, episodes=episodes,
                   sampled_mask="response_mask" if episodes is None else "loss_mask")
    plan.warnings.extend(_inert_choices(resolved, plan))
    return plan


TARGET_NEEDS = {"reference": "teacher", "logits": "teacher_logits"}
"""What the KL estimator's needs become under ``kl.target=teacher``: its ``ref_logp`` input is
the teacher's log-probs of the sampled tokens (the ``teacher_logp`` pass), its ``ref_logits``
the teacher's logits (a teacher forward in each update micro-batch)."""


def _target_needs(needs: frozenset[str]) -> set[str]:
    """The KL estimator's ``needs`` with the teacher in place of the reference (:data:`TARGET_NEEDS`)."""
    return {TARGET_NEEDS.get(need, need) for need in needs}


def _teacher_readers(resolved: ResolvedConfig, acting: list[Any], need: str = "") -> str:
    """Who reads the teacher (for ``need``: ``teacher`` log-probs or ``teacher_logits``; both when
    empty): the components whose inputs name it, and the KL estimator when ``kl.target=teacher``."""
    readers = [_names(acting, "teacher")] if need in ("", "teacher") else []
    cfg = resolved.cfg
    if float(cfg.kl.coef) > 0 and cfg.kl.target == "teacher":
        estimator = resolved.components["kl.estimator"]
        kl_needs = _target_needs(estimator.needs)
        if (need in kl_needs) if need else bool(kl_needs & {"teacher", "teacher_logits"}):
            inputs = "ref_logits" if "teacher_logits" in kl_needs else "ref_logp"
            readers.append(f"kl_estimator {estimator.name} via its input {inputs} (kl.target=teacher)")
    return ", ".join(r for r in readers if r)


def _lora_plan(cfg: Any) -> LoraPlan | None:
    lora = cfg.model.lora
    if int(lora.rank) == 0:
        return None
    return LoraPlan(rank=int(lora.rank), alpha=float(lora.alpha), dropout=float(lora.dropout),
                    target_modules=tuple(str(name) for name in lora.target_modules))


def _check_lora(cfg: Any, world: int) -> None:
    """LoRA runs need peft and a data-parallel strategy that keeps whole modules."""
    rank = int(cfg.model.lora.rank)
    if rank == 0:
        return
    problem = peft_problem()
    if problem is not None:
        raise ConfigError(f"model.lora.rank={rank} trains LoRA adapters through peft, but {problem}: "
                          f"{LORA_INSTALL}; or set model.lora.rank=0 to train every weight")
    if world > 1 and cfg.distributed.strategy == "fsdp":
        raise ConfigError(f"model.lora.rank={rank} with distributed.strategy=fsdp is not supported (FSDP2 would "
                          "need each peft adapter layer sharded on its own, which rlzoo does not do): use "
                          "distributed.strategy=ddp (the frozen base is small enough to replicate when the "
                          "adapters are what trains), or model.lora.rank=0")


def _check_async(resolved: ResolvedConfig, world: int) -> None:
    """What ``rollout.mode=async`` cannot run: refused before anything is built."""
    cfg = resolved.cfg
    if cfg.rollout.mode != "async":
        return
    refillers = [c.name for c, _ in resolved.extensions if hasattr(c.fn, "rlzoo_after_rollout")]
    if refillers:
        raise ConfigError(f"extension {', '.join(refillers)} acts after each rollout and may refill the batch "
                          "(ctx.resample), but with rollout.mode=async only the generator process generates: "
                          "use rollout.mode=sync")
    if int(cfg.rollout.staleness):
        raise ConfigError(f"rollout.staleness={cfg.rollout.staleness} is the synchronous, reproducible queue; with "
                          "rollout.mode=async the bound is rollout.max_staleness: set one of the two")
    if world > 1:
        raise ConfigError(f"rollout.mode=async runs one generator process beside one trainer; under torchrun "
                          f"({world} processes) it is not supported: use rollout.mode=sync (or launcher.nproc=1)")
    if cfg.get("env") is not None:
        raise ConfigError("rollout.mode=async with env (multi-turn episodes) is not supported yet (untested: the "
                          "generator process has not been checked to play episodes): use rollout.mode=sync")
    if int(cfg.model.lora.rank):
        raise ConfigError("rollout.mode=async with model.lora.rank > 0 is not supported (the generator's copy of "
                          "the policy has no adapters): use rollout.mode=sync")
    sync_every, bound = int(cfg.rollout.weight_sync_every), int(cfg.rollout.max_staleness)
    if cfg.rollout.stale_batches == "drop" and bound < sync_every - 1:
        raise ConfigError(f"rollout.max_staleness={bound} with rollout.weight_sync_every={sync_every} and "
                          f"stale_batches=drop could drop every batch (the generator's weights may be "
                          f"{sync_every - 1} versions old between syncs): set rollout.max_staleness >= "
                          f"{sync_every - 1}, or rollout.stale_batches=keep")


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
    for need, what in (("entropy", "the entropies"), ("sum_pi_squared", "the Σπ²")):
        if need in needs:
            acting = [*resolved.components.values(), *(c for c, _ in resolved.extensions)]
            raise ConfigError(f"trainer.old_logp=rollout skips the old-log-prob pass, which computes {what} "
                              f"{_names(acting, need)} read(s): set trainer.old_logp=compute")


def _check_consistency(resolved: ResolvedConfig, needs: set[str], kl_on: bool, world: int) -> None:
    cfg = resolved.cfg
    _check_lora(cfg, world)
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
    if "teacher" in needs or "teacher_logits" in needs:
        teacher = cfg.teacher.path
        if not teacher:
            raise ConfigError(f"{_teacher_readers(resolved, acting)} distil(s) from a teacher model: set "
                              "teacher.path to a local model directory (written by save_pretrained; its tokenizer "
                              "must be the policy's)")
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
    inert = [c.name for c, _ in resolved.corrections if "logp" not in c.inputs]
    if inert and same_distribution and not plan.rollout.off_policy:
        warnings.append(f"rollout_correction {', '.join(inert)} corrects for μ ≠ π_old, but the hf backend "
                        "samples from the trained policy itself in its own dtype (rollout/mismatch_k3 ≈ 0): its "
                        "weights are 1 to float rounding; set rollout.dtype=bfloat16 (or rollout.top_p < 1) for a gap "
                        "to correct")
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
    return warnings
