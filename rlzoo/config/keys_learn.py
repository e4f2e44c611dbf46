"""The config keys of the update: its components, KL, the teacher and the trainer (records:
:mod:`rlzoo.config.key_record`; the whole table: :mod:`rlzoo.config.keys`)."""

from __future__ import annotations

from typing import Any, Optional

from omegaconf import DictConfig

from rlzoo.config.key_record import Key, Rule, Section
from rlzoo.core.errors import ConfigError


def _betas(betas: Any) -> None:
    """2 numbers in [0, 1)"""
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ConfigError(f"invalid value for trainer.betas: {list(betas)}; need 2 numbers in [0, 1) "
                          "(AdamW's decay rates of its moment estimates, e.g. trainer.betas=[0.9,0.999])")


def _max_grad_norm(norm: Optional[float]) -> None:
    """> 0 or `null`"""
    if norm is not None and norm <= 0:
        raise ConfigError(f"invalid value for trainer.max_grad_norm: {norm!r}; must be > 0 "
                          "(clipping to a norm of 0 zeroes every gradient: the run would learn nothing); "
                          "trainer.max_grad_norm=null turns clipping off")


def _micro_batch_tokens(budget: Optional[int]) -> None:
    """> 0 or `null`"""
    if budget is not None and budget <= 0:
        raise ConfigError(f"invalid value for trainer.micro_batch_tokens: {budget!r}; must be > 0 (token positions "
                          "per forward/backward), or null for micro-batches of trainer.micro_batch_size sequences")


def _budget_holds_a_sequence(cfg: DictConfig) -> None:
    budget, new = cfg.trainer.micro_batch_tokens, int(cfg.rollout.max_new_tokens)
    if budget is not None and budget < new + 1:
        raise ConfigError(f"trainer.micro_batch_tokens={budget} is smaller than the longest sequence a step can "
                          f"hold: at least {new + 1} tokens (a prompt of 1 token + rollout.max_new_tokens={new}); a "
                          "sequence cannot be split across micro-batches: raise trainer.micro_batch_tokens")


def _precision_needs_float32_weights(cfg: DictConfig) -> None:
    if cfg.trainer.precision == "bf16" and cfg.model.dtype != "float32":
        raise ConfigError(f"trainer.precision=bf16 computes in bfloat16 over float32 master weights, but "
                          f"model.dtype={cfg.model.dtype} holds the weights themselves in that dtype: set "
                          "model.dtype=float32 (mixed precision) or trainer.precision=fp32 (bfloat16 weights)")


COMPONENTS = Section(None, (
    Key("env", Any, None, "multi-turn episodes with an environment (rlzoo list --kind environment; docs/agents.md)",
        "each sample becomes a multi-turn episode, scored on its final answer ([agents.md](agents.md)); "
        "`rollout.max_new_tokens` then bounds the whole episode", old=None),
    Key("rollout_correction", Any, "none",
        "none, or a correction (tis, seq_tis, icepop, ...) or a list applied in order: for a rollout that "
        "samples from μ ≠ the trained policy",
        "`[]` is the same as `none` (no correction), as `extensions=[]` is no extension, while `reward=[]` is refused "
        "(a run needs a reward) ([corrections.md](algorithms/corrections.md))"),
    Key("advantage", Any, "grpo", "advantage estimator (rlzoo list --kind advantage)"),
    Key("policy_loss", Any, "ppo_clip", "policy loss (rlzoo list --kind policy_loss)"),
    Key("loss_agg", Any, "token-mean", "how a per-token loss becomes a scalar (rlzoo list --kind loss_agg)"),
    Key("value_loss", Any, "clipped", "the critic's loss, used only with a critic (rlzoo list --kind value_loss)"),
), explain=True)

KL = Section("kl", (
    Key("coef", float, 0.0, "initial beta; 0 disables KL and the reference model", range=">= 0"),
    Key("estimator", Any, "k3", "per-token KL estimator (rlzoo list --kind kl_estimator)",
        "used only when `kl.coef > 0`", renamed_from="kl.penalty"),
    Key("apply", str, "loss", "loss (beta * agg(KL) added to the loss) | reward (r_t -= beta * KL_t)",
        choices=("loss", "reward")),
    Key("controller", Any, "fixed", "fixed | adaptive (steers beta of a KL in the reward: kl.apply=reward)"),
    Key("target", str, "reference", "reference (the frozen initial policy) | teacher (teacher.path: distillation)",
        "on-policy distillation with any KL estimator, e.g. `forward_topk` "
        "([kl.md](algorithms/kl.md#distillation-kltargetteacher))", choices=("reference", "teacher"),
        old="reference"),
), explain=True)

TEACHER = Section("teacher", (
    Key("path", Optional[str], None,
        "a local model directory: the teacher of on-policy distillation (advantage=opd, kl.target=teacher)",
        "frozen, with the policy's tokenizer; loaded only when a component reads `teacher_logp` or the KL's "
        "target is the teacher"),
), explain=True)

TRAINER = Section("trainer", (
    Key("total_steps", int, 1000, "training steps (one rollout each)", range="> 0", resumable=True),
    Key("lr", float, 0.0005, "the policy's AdamW learning rate", range=">= 0"),
    Key("critic_lr", float, 0.001, "the critic's AdamW learning rate", range=">= 0"),
    Key("weight_decay", float, 0.0, "AdamW's decoupled weight decay", range=">= 0"),
    Key("betas", list[float], [0.9, 0.99], "AdamW's decay rates of its moment estimates", check=_betas),
    Key("lr_schedule", str, "constant",
        "constant | linear | cosine: after warm-up, keep the learning rate or decay it to 0 by the last step",
        choices=("constant", "linear", "cosine")),
    Key("warmup_steps", int, 0, "steps of linear learning-rate warm-up", range=">= 0"),
    Key("update_epochs", int, 1, "passes over each rollout", "every algorithm's, not only PPO's", range="> 0",
        renamed_from="trainer.ppo_epochs"),
    Key("num_mini_batches", int, 1, "mini-batches per epoch, one optimizer step each",
        "must divide the sequences per step (per process)", range="> 0", renamed_from="trainer.mini_batches"),
    Key("micro_batch_size", int, 64, "sequences per forward/backward",
        "their gradients accumulate over the mini-batch", range="> 0",
        resumable=True, explain=False,
        not_explained="splits a mini-batch for memory: the gradients accumulate to the same sum (up to rounding)"),
    Key("micro_batch_tokens", Optional[int], None,
        "token positions per forward/backward, instead of micro_batch_size sequences (null: off)",
        "each mini-batch (and each pass before the update) is split into micro-batches that compute at most this "
        "many token positions, the sequences' own tokens when packed (`trainer.padding_free`), sequences × their "
        "longest prompt + response when padded; balanced by tokens, as verl's dynamic batch size. The gradient "
        "is the fixed split's (every aggregation divides by the mini-batch's counts), the memory of a micro-batch "
        "is bounded by the budget instead of by its longest sequence, and `rlzoo doctor --plan` estimates with "
        "it. It must hold the longest sequence (the longest prompt + `rollout.max_new_tokens`): refused before "
        "any model is built otherwise", check=_micro_batch_tokens, resumable=True, explain=False, old=None,
        not_explained="splits a mini-batch for memory: the gradients accumulate to the same sum (up to rounding)"),
    Key("padding_free", Optional[bool], None,
        "pack the sequences of the training-side passes without padding (null: where exact; true | false)",
        "the update, old-log-prob, reference, teacher and critic forwards lay each micro-batch's sequences one "
        "after another with position ids restarting per sequence, so no layer computes on padding "
        "([training.md](training.md#padding-free-passes-and-token-budget-micro-batches)). `null`: wherever the "
        "load-time model check finds the packed forward equal to each sequence alone (not on models with "
        "convolution or recurrent layers, or whose mask ignores position ids: padded there, with one warning); "
        "`true`: refused on such a model; `false`: always padded, the check skipped", resumable=True,
        explain=False, old=False, not_explained="how a forward lays out its sequences: the same numbers, rounded"),
    Key("max_grad_norm", Optional[float], 1.0, "gradient clipping to this global L2 norm; null: no clipping",
        "the norm is logged as `grad_norm` either way; `0` is refused", check=_max_grad_norm),
    Key("entropy_coef", float, 0.0, "entropy bonus: loss -= c * agg(H)", range=">= 0"),
    Key("logprob_chunk_size", int, 1024, "tokens per chunk of the log-prob/entropy head", range="> 0",
        resumable=True, explain=False, not_explained="how the head is chunked: the same log-probs"),
    Key("logprob_keep_mb", float, 256, "keep the head's log-softmax for backward up to this size (MiB), else recompute",
        "the size of a forward's response tokens × vocabulary × 4 bytes: speed for memory, the same numbers "
        "either way ([design.md](design.md#log-probs-from-hidden-states-in-chunks))", range=">= 0",
        resumable=True, explain=False, not_explained="speed for memory: the same numbers either way"),
    Key("device", str, "cpu", "cpu | cuda | auto (cuda when there is one)", choices=("cpu", "cuda", "auto"),
        explain=False, not_explained="where the run computes, not what"),
    Key("threads", int, 0, "torch threads; 0 keeps torch's choice", range=">= 0", resumable=True, explain=False,
        not_explained="how many threads compute it, not what"),
    Key("precision", str, "fp32", "fp32 | bf16: bfloat16 compute (autocast) over float32 master weights",
        "the matmuls (the LM head's too) run in bfloat16, the logits are cast to float32 before the softmax, so "
        "log-probs, entropies, values, KL and losses are float32 (CPU and GPU alike); with `model.dtype=bfloat16` "
        "it is refused (those are bfloat16 weights, not mixed precision). Pair with `rollout.dtype=bfloat16` to "
        "generate in bfloat16 too ([training.md](training.md#mixed-precision))", choices=("fp32", "bf16")),
    Key("old_logp", str, "compute",
        "compute | rollout: the rollout's log-probs are pi_old (bypass: no old-log-prob pass)",
        "`compute`: π_old, the ratio's denominator, is the trained policy's log-probs before the update (the "
        "old-log-prob pass runs when the plan needs it); `rollout`: the rollout's own log-probs μ are π_old, so "
        "the ratio is π/μ (verl's bypass mode), and a correction that compares π_old with μ compares the current "
        "policy π with μ instead, in each micro-batch (`algo=bypass_pg_is` and the other verl presets: "
        "[corrections](algorithms/corrections.md#bypass-trainerold_logprollout))",
        choices=("compute", "rollout"), old="compute"),
), explain=True, rules=(Rule(("trainer.precision", "model.dtype"), _precision_needs_float32_weights),
                         Rule(("trainer.micro_batch_tokens", "rollout.max_new_tokens"), _budget_holds_a_sequence)))
