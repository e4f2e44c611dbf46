"""Every consistency check of a run plan: what cannot work together is refused here, before anything is built.

:func:`check_consistency` is called by :func:`rlzoo.plan.planner.build_plan` with the union of
what the chosen components need; each check raises :class:`~rlzoo.core.errors.ConfigError`
with one line naming the conflicting keys and how to resolve them.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

from rlzoo.config.resolved import ResolvedConfig
from rlzoo.contract.kinds import KINDS
from rlzoo.core.errors import ConfigError

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


def who_needs(components: list[Any], need: str) -> str:
    """The components that need ``need``, each with the inputs its function names that imply it
    (``advantage gae via its input values``): a plugin learns which argument built what."""
    named = []
    for c in components:
        if need in c.needs:
            carriers = [i for i in c.inputs if (spec := KINDS[c.kind].inputs.get(i)) is not None and spec.need == need]
            named.append(f"{c.kind} {c.name}" + (f" via its input {', '.join(carriers)}" if carriers else ""))
    return ", ".join(named)


TARGET_NEEDS = {"reference": "teacher", "logits": "teacher_logits"}
"""What the KL estimator's needs become under ``kl.target=teacher``: its ``ref_logp`` input is
the teacher's log-probs of the sampled tokens (the ``teacher_logp`` pass), its ``ref_logits``
the teacher's logits (a teacher forward in each update micro-batch)."""


def target_needs(needs: frozenset[str]) -> set[str]:
    """The KL estimator's ``needs`` with the teacher in place of the reference (:data:`TARGET_NEEDS`)."""
    return {TARGET_NEEDS.get(need, need) for need in needs}


def teacher_readers(resolved: ResolvedConfig, acting: list[Any], need: str = "") -> str:
    """Who reads the teacher (for ``need``: ``teacher`` log-probs or ``teacher_logits``; both when
    empty): the components whose inputs name it, and the KL estimator when ``kl.target=teacher``."""
    readers = [who_needs(acting, "teacher")] if need in ("", "teacher") else []
    cfg = resolved.cfg
    if float(cfg.kl.coef) > 0 and cfg.kl.target == "teacher":
        estimator = resolved.components["kl.estimator"]
        kl_needs = target_needs(estimator.needs)
        if (need in kl_needs) if need else bool(kl_needs & {"teacher", "teacher_logits"}):
            inputs = "ref_logits" if "teacher_logits" in kl_needs else "ref_logp"
            readers.append(f"kl_estimator {estimator.name} via its input {inputs} (kl.target=teacher)")
    return ", ".join(r for r in readers if r)


def _model_width(cfg: Any) -> int | None:
    """The policy's hidden size: ``model.hidden_size`` for the embedded model, the
    ``hidden_size`` of ``model.path``'s ``config.json`` (read as JSON, nothing built), or
    ``None`` where it is not known before the model is built (a GGUF file, another config)."""
    if not cfg.model.path:
        return int(cfg.model.hidden_size)
    try:
        width = json.loads((Path(str(cfg.model.path)) / "config.json").read_text()).get("hidden_size")
    except (OSError, ValueError, AttributeError):
        return None
    return width if isinstance(width, int) and not isinstance(width, bool) and width > 0 else None


def _check_lora(cfg: Any, world: int) -> None:
    """LoRA runs need peft, a rank no larger than the model's width (when it is known before
    the model is built; :func:`rlzoo.models.lora.add_adapters` checks the adapted layers) and a
    data-parallel strategy that keeps whole modules."""
    rank = int(cfg.model.lora.rank)
    if rank == 0:
        return
    problem = peft_problem()
    if problem is not None:
        raise ConfigError(f"model.lora.rank={rank} trains LoRA adapters through peft, but {problem}: "
                          f"{LORA_INSTALL}; or set model.lora.rank=0 to train every weight")
    width = _model_width(cfg)
    if width is not None and rank > width:
        raise ConfigError(f"model.lora.rank={rank} exceeds the model's width (hidden_size {width}): every layer LoRA "
                          f"adapts has {width} inputs or outputs, so its update B·A has rank at most {width}; a larger "
                          f"rank only adds parameters and memory: use model.lora.rank <= {width}")
    if world > 1 and cfg.distributed.strategy == "fsdp":
        raise ConfigError(f"model.lora.rank={rank} with distributed.strategy=fsdp is not supported (FSDP2 would "
                          "need each peft adapter layer sharded on its own, which rlzoo does not do): use "
                          "distributed.strategy=ddp (the frozen base is small enough to replicate when the "
                          "adapters are what trains), or model.lora.rank=0")


def check_async(resolved: ResolvedConfig, world: int) -> None:
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


def _check_bypass(resolved: ResolvedConfig, needs: set[str]) -> None:
    """``trainer.old_logp=rollout`` takes π_old to be μ and skips the old-log-prob pass: refuse
    what only that pass computes. (A correction that reads ``old_logp`` compares the current
    policy with μ instead: :func:`rlzoo.plan.planner._correction_steps`.)"""
    for need, what in (("entropy", "the entropies"), ("sum_pi_squared", "the Σπ²")):
        if need in needs:
            acting = [*resolved.components.values(), *(c for c, _ in resolved.extensions)]
            raise ConfigError(f"trainer.old_logp=rollout skips the old-log-prob pass, which computes {what} "
                              f"{who_needs(acting, need)} read(s): set trainer.old_logp=compute")


def check_consistency(resolved: ResolvedConfig, needs: set[str], kl_on: bool, world: int) -> None:
    cfg = resolved.cfg
    _check_lora(cfg, world)
    comps = resolved.components
    acting = [*comps.values(), *(c for c, _ in resolved.extensions)]
    if cfg.trainer.old_logp == "rollout":
        _check_bypass(resolved, needs)
    if "groups" in needs and cfg.rollout.n < 2:
        raise ConfigError(f"{who_needs(acting, 'groups')} need groups of completions: set rollout.n >= 2 "
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
            raise ConfigError(f"{teacher_readers(resolved, acting)} distil(s) from a teacher model: set "
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
