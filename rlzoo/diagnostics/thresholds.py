"""Every threshold ``rlzoo doctor``'s detectors compare a run's curves with, in one table,
each with the source of its value: a paper, verl's or TRL's documentation, or a measurement
made here on this project's runs (the command named; docs/diagnostics.md shows the runs).

A detector reads a value with :func:`limit`; docs/diagnostics.md prints :func:`markdown`
(a test keeps the page equal to this table).
"""

from __future__ import annotations

from dataclasses import dataclass

PAPER, DOCS, MEASURED, DEFINITION = "paper", "docs", "measured here", "definition"
"""Kinds of source: a published paper; verl's / TRL's / another library's documentation or
reference code; a measurement on this project's runs; or what the quantity means (no
tuning: e.g. "exactly zero")."""


@dataclass(frozen=True)
class Threshold:
    """One threshold.

    :ivar name: what detectors call it.
    :ivar value: the number.
    :ivar meaning: what is compared with it, in words (and its unit).
    :ivar kind: :data:`PAPER`, :data:`DOCS`, :data:`MEASURED` or :data:`DEFINITION`.
    :ivar source: where the value comes from (citation, or the runs that set it).
    """

    name: str
    value: float
    meaning: str
    kind: str
    source: str


TABLE: tuple[Threshold, ...] = (
    # ---- reading curves
    Threshold("window_share", 0.05, "curves are smoothed over windows of this share of the run's logged steps "
              "(at least `min_window` steps)", MEASURED,
              "smallest window that keeps the default run's step-to-step noise out of every finding "
              "(`rlzoo train`, 1000 steps)"),
    Threshold("min_window", 5, "fewest steps in a smoothing window; a curve shorter than 4 windows is not judged",
              MEASURED, "as `window_share`"),
    Threshold("persist_share", 0.5, "a condition is *persistent* when it holds on at least this share of the "
              "steps judged", DEFINITION, "the majority of the steps"),
    # ---- entropy
    Threshold("entropy_collapse_ratio", 0.25, "entropy has *collapsed* once its smoothed value is below this "
              "share of its value over the first window", MEASURED,
              "`rlzoo train trainer.lr=2e-3` falls to 0.23 of its start by step 150 with reward/mean 0.48 and "
              "stays there; the default run falls to 0.2 too, but after its reward passed 0.7 (the shape of "
              "Cui et al. 2025, arXiv:2505.22617: performance saturates as entropy is spent)"),
    Threshold("stall_share", 0.05, "after a collapse, a reward gain below this share of the task's success score "
              "(`eval.threshold`) counts as no gain", MEASURED,
              "`rlzoo train trainer.lr=2e-3` gains under 0.02 after its collapse; the default run "
              "0.2 and more between windows before converging"),
    Threshold("success_share", 0.9, "a reward at or above this share of `eval.threshold` means the task is "
              "solved (a collapse there is convergence, not a pathology)", DEFINITION,
              "the task's own success score"),
    # ---- step size
    Threshold("approx_kl_high", 0.015, "`policy/approx_kl` (k1 KL between the rollout's policy and the "
              "updated one, mean over the step's optimizer steps) above this is a step too big", DOCS,
              "OpenAI Spinning Up PPO: target_kl 0.01, updates stop at 1.5 x target_kl"),
    Threshold("clipfrac_high", 0.1, "`policy/clipfrac` above this is a step too big", MEASURED,
              "the default run's median 0.01-0.02; `trainer.update_epochs=4 trainer.num_mini_batches=8` "
              "and `trainer.lr=5e-3` sit above 0.1"),
    # ---- KL to the reference
    Threshold("kl_blowup", 0.5, "`kl/value` (nats per token) above this at the end and still rising is a "
              "blow-up", MEASURED,
              "placeholder"),
    Threshold("kl_rise", 0.1, "and `kl/value` grew by more than this share of itself over the last half of "
              "the run (still rising) while the reward gained less than `stall_share`", MEASURED,
              "the default run's KL levels off at 1.5 by step 400, its reward by step 600"),
    Threshold("kl_pin_band", 0.2, "`kl/sequence_sum` within this relative distance of the adaptive controller's "
              "target counts as *at* the target", PAPER,
              "the controller's own error clip ±0.2 (Ziegler et al. 2019, arXiv:1909.08593; TRL "
              "AdaptiveKLController)"),
    Threshold("kl_coef_rise", 1.5, "β (`kl/coef`) grown by this factor means the controller is pushing back",
              MEASURED, "as the PPO runs of docs/diagnostics.md"),
    # ---- rollout / trainer mismatch
    Threshold("mismatch_high", 1e-3, "`rollout/mismatch_k3` (nats per token between the rollout's sampling "
              "distribution and the trained policy) above this, uncorrected", MEASURED,
              "float32 rollouts log ~1e-14, bf16 rollouts of the tiny model 1e-6 -> 1e-4 "
              "(benchmarks/RESULTS.md); `rollout.staleness=4` logs 1e-2"),
    # ---- groups, lengths
    Threshold("zero_std_high", 0.5, "`reward/zero_std_frac` (groups whose rewards are all equal) above this: "
              "most of the batch gives a group-relative advantage no signal", PAPER,
              "DAPO (arXiv:2503.14476 §3.2): groups of all-correct or all-wrong answers carry zero gradient; "
              "the value is the majority of the batch"),
    Threshold("truncation_high", 0.2, "`response_length/truncated_frac` above this at the end of a run whose "
              "reward is not rising", MEASURED,
              "the default run ends at 0; `rollout.max_new_tokens=3` ends at 1.0"),
    Threshold("length_collapse_ratio", 0.25, "`response_length/mean` below this share of its first window's "
              "value has collapsed", MEASURED, "the default run keeps above 0.6 of its start"),
    # ---- gradients, losses, values
    Threshold("spike_sigmas", 7.0, "a `grad_norm` more than this many standard deviations above the mean of the "
              "preceding `spike_window` steps is a spike", PAPER,
              "OLMo 2 (arXiv:2501.00656): the spike score counts values 7 standard deviations from a rolling mean"),
    Threshold("spike_window", 50, "steps of the rolling window (OLMo 2's is 1000, longer than these runs)", MEASURED,
              "windows of 10 steps flag the heavy-tailed batch-to-batch noise of every run here (1.3 % of the "
              "default run's steps)"),
    Threshold("spike_share", 0.02, "spikes on more than this share of the judged steps make a finding", MEASURED,
              "every run of the gallery, sick or not, has 0-1.3 % (a single spike up to 23x the median in the "
              "default run); clipping (`trainer.max_grad_norm`) bounds their effect"),
    Threshold("zero_abs", 1e-8, "`|policy/loss|` and `grad_norm` below this are zero", DEFINITION,
              "float32 rounding of a mean of zero advantages"),
    Threshold("explained_var_low", 0.0, "`value/explained_var` below this over the last half: the critic "
              "predicts the returns worse than their mean", DOCS,
              "definition of explained variance (stable-baselines3 / verl `critic/vf_explained_var`: "
              "1 perfect, 0 the mean, < 0 worse)"),
    Threshold("value_loss_flat", 0.9, "`value/loss` over the last quarter above this share of its first "
              "quarter: not falling", MEASURED, "the PPO runs of docs/diagnostics.md"),
    # ---- held-out and gold rewards
    Threshold("heldout_sigmas", 2.0, "a fall of held-out accuracy from its peak larger than this many standard "
              "errors (binomial, `eval.size` prompts) is real", DEFINITION, "a two-sided 95 % test"),
    Threshold("heldout_min_drop", 0.05, "and at least this much accuracy", MEASURED,
              "smaller falls are within the default run's evaluation-to-evaluation wobble"),
    Threshold("gold_flat", 0.05, "a gold reward gaining less than this share of `eval.threshold`, or ending "
              "this much below its peak, while the proxy rose", PAPER,
              "Gao et al. 2022 (arXiv:2210.10760): the gold score peaks and falls as a proxy is optimised"),
    # ---- learning-rate schedule
    Threshold("lr_reached", 0.99, "a warm-up that never brought `lr` to this share of `trainer.lr` never "
              "finished", DEFINITION, "the schedule's own peak"),
    Threshold("lr_decayed", 0.9, "a decaying schedule (`linear`, `cosine`) whose last `lr` is above this share "
              "of its peak never decayed", DEFINITION, "the schedule's own end point (0)"),
)
"""Every threshold, in the order docs/diagnostics.md shows them."""

BY_NAME = {t.name: t for t in TABLE}


def limit(name: str) -> float:
    """The value of threshold ``name`` (:data:`TABLE`)."""
    return BY_NAME[name].value


def markdown() -> str:
    """:data:`TABLE` as the Markdown table of docs/diagnostics.md."""
    lines = ["| threshold | value | what is compared | source |", "|---|---|---|---|"]
    lines += [f"| `{t.name}` | {t.value:g} | {t.meaning} | {t.kind}: {t.source} |" for t in TABLE]
    return "\n".join(lines) + "\n"
