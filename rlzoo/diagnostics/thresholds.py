"""Every threshold ``rlzoo doctor``'s detectors compare a run's curves with, in one table,
each with the source of its value: a paper, verl's or TRL's documentation, or a measurement
made here on this project's runs (the command named; docs/diagnostics.md shows the runs).

A detector reads a value with :func:`limit`; docs/diagnostics.md prints :func:`markdown`
(a test keeps the page equal to this table).
"""

from __future__ import annotations

from dataclasses import dataclass

PAPER, DOCS, MEASURED, DEFINITION, CHOSEN = "paper", "docs", "measured here", "definition", "chosen here"
"""Kinds of source: a published paper; a library's documentation or reference code; a
measurement on this project's runs (docs/diagnostics.md's gallery, whose commands re-make
them); what the quantity means (e.g. "exactly zero"); or a round value chosen here that no
measurement set (said so)."""


@dataclass(frozen=True)
class Threshold:
    """One threshold.

    :ivar name: what detectors call it.
    :ivar value: the number.
    :ivar meaning: what is compared with it, in words (and its unit).
    :ivar kind: :data:`PAPER`, :data:`DOCS`, :data:`MEASURED`, :data:`DEFINITION` or :data:`CHOSEN`.
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
              "(at least `min_window` steps)", CHOSEN, "a twentieth of the run; not tuned"),
    Threshold("min_window", 5, "fewest steps in a smoothing window; a curve shorter than 4 windows is not judged",
              CHOSEN, "not tuned"),
    Threshold("persist_share", 0.5, "a condition is *persistent* when it holds on at least this share of the "
              "steps judged", DEFINITION, "the majority of the steps"),
    Threshold("success_share", 0.9, "a reward at or above this share of the task's success score "
              "(`eval.threshold`) counts as solved; at or below 1 minus it, as failing", CHOSEN,
              "not tuned (the default run's last half averages 0.89-0.92 of it)"),
    # ---- nothing is learning (rlzoo/diagnostics/flat_start.py)
    Threshold("first_steps", 5, "the *first steps* a run is judged on from its start (a run broken from step 1 "
              "shows it there, with no persistence asked)", CHOSEN, "not tuned"),
    Threshold("entropy_floor", 0.1, "an entropy (nats per token) below this on the first steps: the samples "
              "of a prompt are one completion", MEASURED, "tuning half: every healthy run starts above 2.5 (the "
              "tiny model from scratch; a pretrained one starts lower), temperatures of 0.02-0.05 at 0.0007 or "
              "below; a round value far from both. Tuning set (round 2, all 132 runs): healthy runs start at 2.35 "
              "or above, the temperatures at 0.0018 or below"),
    Threshold("same_samples", 0.95, "`reward/zero_std_frac` at or above this on the first steps (groups of two "
              "or more): every group's completions score alike", MEASURED, "tuning half: healthy runs at most "
              "0.12, nucleus 0.02-0.05 at 1.00. Tuning set (round 2, all 132 runs): healthy runs at most 0.18 "
              "(rloo, sort3), every sampling knob's run at 1.00"),
    Threshold("nucleus_mismatch_high", 0.5, "`rollout/mismatch_k3` (nats per token from the sampling distribution "
              "to the policy) above this on the first steps with `rollout.top_p` below 1: the nucleus keeps the "
              "policy's top token or two, so the samples of a prompt are one completion (what shows it when a "
              "group holds one completion and `reward/zero_std_frac` cannot)", DEFINITION,
              "a nucleus sampler's KL to the policy is -log of the probability the nucleus holds, at most "
              "-log(top_p): above 0.5 the nucleus holds under e^-0.5 = 61 % of the policy's mass on average, "
              "which no `top_p` of 0.61 or more can do. Tuning set (round 3: rounds 1 and 2, 230 runs): healthy "
              "runs 0 (no nucleus), `top_p` 0.02-0.05 1.00-1.27 (mean of the first 5 steps)"),
    Threshold("early_kl_high", 0.2, "`policy/approx_kl` above this on any of the first steps: the first updates "
              "are far too big", MEASURED,
              "tuning set (round 2: all 132 runs of benchmarks/doctor_recall.py's first set): the healthy runs' "
              "largest approx-KL on their first 5 steps is 0.069 (cispo), the sick learning rates' (0.05-0.1) "
              "smallest 0.483 (GRPO, arithmetic; runs with several mini-batches: on-policy runs log 0); 0.2 is near "
              "their geometric mean (0.18). 7x any healthy run's, it is named without a flat reward (a "
              "partial-credit term lifts the arithmetic runs' reward 0.012 -> 0.082 with no correct answer)"),
    Threshold("early_clip_high", 0.2, "`policy/clipfrac` above this on any of the first steps", MEASURED,
              "tuning set (round 2): healthy runs clip at most 0.13 of the tokens on their first steps "
              "(reinforce_pp; GSPO's are not judged: `clip_range_min`), the sick learning rates 0.29 or more, "
              "but a 4x rate that learns 0.22 (dr_grpo): only with a flat reward"),
    Threshold("early_entropy_drop", 0.3, "an entropy that loses more than this share of its first step's value "
              "within the first steps", MEASURED,
              "tuning set (round 2): healthy runs lose at most 19 % of their entropy over the first 5 steps "
              "(cispo), the sick learning rates 39-100 %; only with a flat reward"),
    Threshold("early_ref_kl_high", 0.2, "`kl/value` (nats per token from the reference) above this on any of "
              "the first steps, with a flat reward: the first updates moved the policy far (what shows a step too "
              "big with one on-policy update a step, where approx-KL and the clip fraction are 0 by construction)",
              MEASURED,
              "tuning set (round 3: rounds 1 and 2, 230 runs): the healthy runs' largest `kl/value` on their first "
              "5 steps is 0.135 (reinforce_pp, arithmetic; RLOO's at most 0.017), every other sick family's 0.12 "
              "or less, RLOO and REINFORCE++ at `trainer.lr` 0.02-0.03 0.32-0.37; 0.2 is near the geometric mean "
              "of 0.135 and 0.32 (0.21). Above `kl_blowup` it is named without a flat reward"),
    Threshold("kl_share_high", 0.2, "`kl/grad_share` (the KL term's share of the pull on the sampled tokens' "
              "log-probs) above this (median over the run): the KL penalty holds the policy", MEASURED,
              "tuning half: GRPO's healthy runs (kl.coef 0.04) have medians 0.047-0.059, runs that learn with a "
              "too-short budget up to 0.12, `kl.coef` 3-30 0.40-0.90. Tuning set (round 2): healthy GRPO "
              "0.047-0.061, other sick runs up to 0.20 (`trainer.lr=0.05`, whose step check comes first), "
              "`kl.coef` 3-30 0.30-0.90. Round 4's tuning runs of a KL folded into the reward (its share of the "
              "advantages, `--set kl-in-reward`): presets whose reward rises 0.11-0.27, `kl.coef` 3-30 0.55-0.97, "
              "and four preset runs whose reward stays flat 0.33-0.51 (PPO's 0.2 on sort4 and arithmetic, RLOO's and "
              "ReMax's 0.05 on arithmetic): with the suggested coefficient each learns (reward/mean over the last 10 "
              "% 0.074 -> 0.559, 0.022 -> 0.087, 0.031 -> 0.074, 0.028 -> 0.060), so 0.2 stands for both placements"),
    Threshold("kl_share_target", 0.02, "the share a suggested `kl.coef` aims at (the coefficient is scaled by "
              "the ratio of the share's odds)", MEASURED,
              "tuning half: the healthy GRPO runs' share over their first window, while the policy is still near "
              "the reference (where a pinned run stays), is 0.017-0.047 (0.047-0.061 over the whole run); aiming "
              "at 0.05 turned `kl.coef=10` into 0.8, which learnt slowly (reward/mean 0.073 -> 0.112 in 100 "
              "steps), at 0.02 into 0.3 (docs/diagnostics.md)"),
    # ---- entropy
    Threshold("entropy_collapse_ratio", 0.25, "entropy has *collapsed* once its smoothed value is below this "
              "share of its first window's", MEASURED,
              "`trainer.lr=2e-3` falls below 0.25 of its start by step 147 (0.602 of 2.43) with reward/mean at 0.47 "
              "and stays there; the default run falls as low (0.17), after its reward passed 0.6 (the shape of "
              "Cui et al. 2025, arXiv:2505.22617: performance saturates as entropy is spent)"),
    Threshold("stall_rate", 0.1, "after an entropy collapse, a reward rising at under this share of its rate "
              "before the collapse has stalled", MEASURED,
              "after their entropy collapses `trainer.lr=2e-3` rises at 0.04 of its rate before (0.468 at step 147 "
              "-> 0.514 at 600), `trainer.lr=1e-3` (300 steps) at 0.28, the default run at 0.23 (0.635 at step 323 "
              "-> 0.896; re-run on 2026-11-27 at main 5e882cc, an earlier run gave 0.29 and 0.24). Tuning set "
              "(round 2): the healthy runs whose entropy collapses (3 CISPO, 1 dr_grpo of 300 steps), all before "
              "their reward reached half the success score, rise after it at 0.45-1.41 of their rate before, or "
              "(CISPO, arithmetic, seed 2) fall to 0; so a collapse is judged by this rate alone, not by how early "
              "it comes"),
    Threshold("stall_share", 0.05, "a reward gain below this share of the success score counts as none", CHOSEN,
              "not tuned (the KL, held-out and truncation checks)"),
    # ---- step size
    Threshold("approx_kl_high", 0.015, "`policy/approx_kl` (k1 KL from the rollout's policy to the updated one, "
              "mean over the step's optimizer steps) above this is a step too big", DOCS,
              "OpenAI Spinning Up's PPO: target_kl 0.01, updates stop at 1.5 x target_kl. Here the default run is "
              "above it on 34 % of its steps, `trainer.lr=5e-3` on 68 %. Tuning set (round 4: rounds 1-3, 338 runs): "
              "DAPO's 11 healthy runs (16 updates a rollout) have medians of 0.020-0.129 with clip fractions of "
              "0.042-0.096 and learn, and no sick run was named first by this check alone: above it with a clip "
              "fraction under `clipfrac_high` (the clip range holding the update) is a note, flat reward or not"),
    Threshold("clip_range_min", 0.01, "a policy loss clip range (`policy_loss.clip_low` / `clip_high`) below this "
              "is a sequence-level one whose clip fraction is high by design: not judged", PAPER,
              "GSPO (arXiv:2507.18071) reports clipping fractions two orders of magnitude above GRPO's with its "
              "range of 3e-4 / 4e-4; here the GSPO preset's healthy runs clip a median 0.35-0.38"),
    Threshold("trust_region_max", 1.0, "a policy loss clip range (`policy_loss.clip_low` / `clip_high`) above "
              "this caps importance weights instead of bounding the step: `approx_kl_high` and `clipfrac_high` "
              "do not judge it", MEASURED,
              "CISPO (MiniMax-M1, arXiv:2506.13585) clips a stop-gradient importance weight (the preset: weights "
              "up to 5, `clip_high` 4) and takes 16 updates a rollout. Tuning set (round 2): its 4 healthy runs "
              "have a median approx-KL of 0.008-0.084 a step (three of them 4-6x `approx_kl_high`) and learn "
              "(sort4: reward/mean 0.05 -> 0.35-0.47 in 150 steps); the PPO-style ranges of the presets are "
              "0.2-0.28"),
    Threshold("clipfrac_high", 0.1, "`policy/clipfrac` above this is a step too big", MEASURED,
              "the default run's median is 0.015 and above 0.1 on no step; `trainer.update_epochs=4 "
              "trainer.num_mini_batches=8` has median 0.22, above 0.1 on every step"),
    # ---- KL to the reference
    Threshold("kl_blowup", 0.5, "`kl/value` (nats per token) above this at the end, and still rising, is a "
              "blow-up", DEFINITION,
              "sampled tokens e^0.5 = 1.6x likelier under the policy than under the reference, on average; a floor "
              "only (a run learnt from a random initial policy sits near 1.5: the default run)"),
    Threshold("kl_rise", 0.2, "and a least-squares line through `kl/value`'s last half rises by more than this "
              "share of its value at the half's start, while the reward gained less than `stall_share`", MEASURED,
              "the default run's KL falls over its last half (1.76 -> 1.51); `trainer.lr=5e-3`'s (200 steps) grows 33 "
              "% over steps 100-200 while its reward gains 0.036. Tuning set (round 3: rounds 1 and 2): the four "
              "healthy GRPO runs on arithmetic plateau at 0.74-0.79 nats per token; one of them (seed 5) read "
              "+27 % from the smoothed window at the half to the last window (noise at the plateau), +7 % on the "
              "line (the line is the change: a rise judged by two windows of 8 steps read the noise). Tuning set "
              "(round 4: rounds 1-3 and the KL-in-the-reward runs, 356): of the runs whose reward gained less than "
              "`stall_share` over the last half with `kl/value` above 0.5, the healthy ones rise by at most 13 % "
              "(REINFORCE++ on arithmetic, seed 1, drifting 0.67 -> 0.75 at the partial-credit ceiling; GRPO's 7 %), "
              "the sick ones named by other checks by 31 % or more (`trainer.lr` 0.07, staleness 4, an adaptive "
              "target of 1.5; one at 11 %, named `kl_pinned`); 0.2 is near the geometric mean of 13 % and 31 %"),
    Threshold("kl_pin_band", 0.2, "`kl/sequence_sum` within this relative distance of the adaptive controller's "
              "target counts as *at* the target", PAPER,
              "the controller's own error clip ±0.2 (Ziegler et al. 2019, arXiv:1909.08593; TRL's "
              "AdaptiveKLController)"),
    Threshold("kl_coef_rise", 1.5, "β (`kl/coef`) grown by this factor means the controller is pushing back",
              CHOSEN, "not tuned: the preset's controller moves β by at most 2 % of its value per step (horizon "
              "10,000, 128 sequences), so 1.5x takes 20 steps or more at the clip"),
    # ---- rollout / trainer mismatch
    Threshold("mismatch_high", 1e-3, "`rollout/mismatch_k3` (nats per token from the rollout's sampling "
              "distribution to the trained policy's) above this, with no rollout correction", MEASURED,
              "float32 rollouts log ~1e-14 (the default run), bfloat16 rollouts of the tiny model 1e-6 -> 1e-4 "
              "(benchmarks/RESULTS.md); `rollout.staleness=4` 0.026 -> 0.105"),
    # ---- groups, lengths
    Threshold("zero_std_high", 0.5, "`reward/zero_std_frac` (groups whose rewards are all equal) above this: "
              "most of the batch gives a group-relative advantage no signal", PAPER,
              "DAPO (arXiv:2503.14476 §3.2): groups of all-correct or all-wrong answers carry no gradient; the "
              "value is the majority of the batch"),
    Threshold("truncation_high", 0.2, "`response_length/truncated_frac` above this at the end (a finding only "
              "when `reward/max` sits at a ceiling below the success score)", CHOSEN,
              "not tuned: `rollout.max_new_tokens=3` ends at 1.0 with reward/max stuck at 0.75, but so does the "
              "default run's truncation (its policy writes filler after the answer) with reward/max at 1.0"),
    Threshold("length_collapse_ratio", 0.25, "`response_length/mean` at the end below this share of its "
              "start has collapsed", CHOSEN, "not tuned: no run here collapsed (the default run's ends at 1.07x "
              "its start)"),
    # ---- gradients, losses, values
    Threshold("spike_sigmas", 7.0, "a `grad_norm` more than this many standard deviations above the mean of the "
              "preceding `spike_window` steps is a spike", PAPER,
              "OLMo 2 (arXiv:2501.00656): its spike score counts values 7 standard deviations from a rolling mean"),
    Threshold("spike_window", 50, "steps of that rolling window (OLMo 2's is 1,000, longer than these runs)",
              MEASURED, "windows of 10 steps flag the heavy-tailed batch-to-batch noise of every run here (1.3 % "
              "of the default run's steps)"),
    Threshold("spike_share", 0.02, "spikes on more than this share of the judged steps make a finding", MEASURED,
              "the runs of the gallery, sick or not, spike on 0-1.3 % of their steps (one up to 23x the median "
              "in the default run), and none of their pathologies came with more"),
    Threshold("zero_abs", 1e-8, "`|policy/loss|` and `grad_norm` below this are zero", DEFINITION,
              "float32 rounding of a mean of zero advantages"),
    Threshold("explained_var_low", 0.0, "`value/explained_var` below this (median of the last half): the critic "
              "predicts the returns worse than their mean", DOCS,
              "what explained variance means (verl's `critic/vf_explained_var`, stable-baselines3's "
              "`explained_variance`: 1 perfect, 0 the mean, below 0 worse). Here `trainer.critic_lr=1e-6` "
              "logs -0.0013, the PPO preset's critic 0.26 at step 300. Tuning set (round 2): it does not "
              "separate: critics at `trainer.critic_lr` 1e-6-1e-7 have medians -0.0028 to 0.020, healthy PPO "
              "runs 0.027-0.163 (`value_bias_high` does)"),
    Threshold("value_bias_high", 0.05, "the critic's predictions (`value/vpred_mean`) missing the returns "
              "(`value/returns_mean`) by more than this share of them, summed over the run: it does not track "
              "even the mean return", MEASURED,
              "tuning set (round 2): healthy PPO runs miss by 0.2-0.5 % (their critic reaches the mean return "
              "within the first 5 steps), critics at `trainer.critic_lr` 1e-6 by 34-80 %, at 1e-7 by 94-99 %; "
              "0.05 is 10x the healthy runs' largest, 7x below the sick runs' smallest"),
    # ---- held-out and gold rewards
    Threshold("heldout_sigmas", 2.0, "a fall of held-out accuracy from its peak larger than this many standard "
              "errors (binomial, `eval.size` prompts) is real", DEFINITION, "a two-sided 95 % test"),
    Threshold("heldout_min_drop", 0.05, "and at least this much accuracy", CHOSEN,
              "not tuned (with 128 prompts two standard errors are 0.08-0.12 already)"),
    Threshold("gold_flat", 0.05, "a gold reward gaining less than this share of the success score, or ending "
              "this much below its peak, while the proxy rose", MEASURED,
              "the phenomenon: Gao et al. 2022 (arXiv:2210.10760); the value: against a learned reward model "
              "`kl.coef=0` takes the gold reward 0.047 -> 0.000, `kl.coef=0.05` 0.039 -> 0.157"),
    # ---- learning-rate schedule
    Threshold("lr_reached", 0.99, "a warm-up that never brought `lr` to this share of `trainer.lr` never "
              "finished", DEFINITION, "the schedule's own peak"),
    Threshold("lr_decayed", 0.9, "a decaying schedule (`linear`, `cosine`) whose `lr` at the run's last step is "
              "above this share of its peak never decayed", DEFINITION, "the schedule's own end point (0)"),
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
