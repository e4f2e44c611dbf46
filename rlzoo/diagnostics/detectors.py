"""Detectors: read a run's logged curves and name what went wrong.

Each detector takes a :class:`RunRecord` (the scalars a run logged, under the tag names of
:class:`rlzoo.run.tracking.Tag`, and its resolved config) and returns :class:`Finding` s: the
pathology, the steps and values that show it, the likely cause, and the overrides to try.
They compare with :mod:`rlzoo.diagnostics.thresholds` only. :func:`diagnose` runs them all;
the same call serves ``rlzoo doctor`` after a run, the trainer during one and ``rlzoo
compare``'s ``doctor`` column.

A curve is judged on moving means over windows of ``window_share`` of its points (at least
``min_window``) and only when it has four such windows; "start" is its first window, "end"
its last.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from rlzoo.diagnostics.flat_start import (clip_fraction_reads, logged_once, nothing_learning, partial_credit,
                                          reward_flat, trust_region)
from rlzoo.diagnostics.run_record import Curve, Finding, RunRecord
from rlzoo.diagnostics.thresholds import limit
from rlzoo.core.tags import Tag


def _g(x: float) -> str:
    """A value as findings print it: 3 significant digits."""
    return f"{x:.3g}"


def _scaled(setting: Any, factor: float) -> str:
    """``setting × factor`` as an override value."""
    return f"{float(setting) * factor:g}"


# ----------------------------------------------------------------------------- the detectors

def entropy_collapse(run: RunRecord) -> list[Finding]:
    """The policy's entropy fell below ``entropy_collapse_ratio`` of its start, from there to the
    end the reward rose at under ``stall_rate`` of its rate before (or not at all, if it had not
    risen), and it ends short of the success score (``success_share`` of ``eval.threshold``): a
    collapse while the reward goes on rising is none, however early (CISPO's). Judged once four
    windows have passed since the collapse."""
    entropy, reward = run.curve(Tag.ENTROPY), run.curve(Tag.REWARD)
    if entropy is None or reward is None or entropy.start <= 0:
        return []
    below = np.nonzero(entropy.smooth < limit("entropy_collapse_ratio") * entropy.start)[0]
    if not len(below):
        return []
    step = entropy.smooth_step(int(below[0]))
    first, last = int(reward.steps[0]), int(reward.steps[-1])
    if int(np.sum(reward.steps > step)) < 4 * reward.window or step <= first:
        return []
    success = run.success()
    at_collapse, final = reward.at(step), reward.end
    before, after = (at_collapse - reward.start) / (step - first), (final - at_collapse) / (last - step)
    stalled = after < limit("stall_rate") * before if before > 0 else after <= 0
    if not stalled or final >= limit("success_share") * success:
        return []
    lr = run.setting("trainer.lr", 0.0)
    return [Finding(
        "entropy_collapse", "entropy collapse", (step, last),
        f"entropy {_g(entropy.start)} at the start, {_g(entropy.at(step))} by step {step} "
        f"(< {limit('entropy_collapse_ratio'):g} of the start); reward/mean {_g(reward.start)} -> {_g(at_collapse)} "
        f"up to then, {_g(final)} at the end: {after / before if before > 0 else 0:.0%} of its rate before "
        f"(success is {success:g})",
        "the policy turned near-deterministic before it solved the task, so its samples stopped exploring "
        "(updates too large for the reward's guidance sharpen it fastest)",
        ((f"trainer.lr={_scaled(lr, 0.25)}", "smaller steps sharpen the policy more slowly"),
         ("policy_loss.clip_high=0.28", "DAPO's clip-higher lets low-probability tokens grow"),
         ("trainer.entropy_coef=0.001", "an entropy bonus in the loss")))]


def step_too_big(run: RunRecord) -> list[Finding]:
    """``policy/clipfrac`` above ``clipfrac_high`` or ``policy/approx_kl`` above
    ``approx_kl_high`` on ``persist_share`` of the steps: each rollout's optimizer steps move
    the policy further than the clip range (or a KL target) allows. The clip fraction of a clip
    range below ``clip_range_min`` (GSPO's) is not judged, nor a run whose clip range is wider than
    ``trust_region_max`` (CISPO's importance-weight cap: no trust region). A note while the reward rises (many
    optimizer steps a rollout can learn faster: DAPO's 16), or while a clip fraction that can be read stays under
    ``clipfrac_high`` (the clip range holds the update: approx-KL alone is DAPO's norm); a warning when it is flat
    (:func:`rlzoo.diagnostics.flat_start.reward_flat`; an entropy collapse it causes is a finding of its own)."""
    found = []
    if not trust_region(run):
        return []
    for tag, high in ((Tag.CLIPFRAC, limit("clipfrac_high")), (Tag.APPROX_KL, limit("approx_kl_high"))):
        if tag == Tag.CLIPFRAC and not clip_fraction_reads(run):
            continue
        curve = run.curve(tag)
        if curve is not None and np.mean(curve.values > high) >= limit("persist_share"):
            found.append((tag, curve, high))
    if not found:
        return []
    lr = run.setting("trainer.lr", 0.0)
    epochs, minis = int(run.setting("trainer.update_epochs", 1)), int(run.setting("trainer.num_mini_batches", 1))
    evidence = "; ".join(f"{tag} above {high:g} on {np.mean(c.values > high):.0%} of the steps (median "
                         f"{_g(float(np.median(c.values)))})" for tag, c, high in found)
    fixes = [(f"trainer.lr={_scaled(lr, 0.2)}", "a smaller step per optimizer step")]
    if epochs * minis > 4:
        fewer = ("trainer.update_epochs=1" if epochs > 1 else f"trainer.num_mini_batches={max(1, minis // 4)}")
        fixes.insert(0, (fewer, f"{epochs} x {minis} optimizer steps on each rollout drift far from the policy "
                                "that sampled it"))
    held = [t for t, _, _ in found] == [Tag.APPROX_KL] and trust_region(run, True) and Tag.CLIPFRAC in run.scalars
    curve, costly = found[0][1], reward_flat(run) is not None and not held
    evidence += ("; the reward rises all the same" if reward_flat(run) is None else f"; {Tag.CLIPFRAC} stays under "
                 f"{limit('clipfrac_high'):g}: the clip range holds the update" if held else "")
    return [Finding("step_too_big", "update step too big (clip fraction / approx-KL high)",
                    (int(curve.steps[0]), int(curve.steps[-1])), evidence,
                    f"the learning rate ({lr:g}) or the optimizer steps per rollout ({epochs} epoch(s) x "
                    f"{minis} mini-batch(es)) move the policy past the clip range within one update",
                    tuple(fixes), "warning" if costly else "note")]


def kl_blowup(run: RunRecord) -> list[Finding]:
    """KL to the reference above ``kl_blowup`` nats per token at the end, still rising (a least-squares line
    through its last half up by more than ``kl_rise``, :meth:`Curve.late_rise`) while the reward gained less than
    ``stall_share`` over that half: the policy moves away without getting better; or, with the adaptive
    controller, the sequence KL at its target or above (no more than ``kl_pin_band`` below it) on ``persist_share``
    of the last half while β grew by ``kl_coef_rise``: the KL budget, not the reward, sets the pace, and that is
    the one finding (a blow-up's fix is then the target: ``kl.coef`` is only β's start)."""
    if float(run.setting("kl.coef", 0.0) or 0.0) <= 0:
        return []
    adaptive, target = run.setting("kl.controller.name") == "adaptive", run.setting("kl.controller.target")
    found, kl, reward = [], run.curve(Tag.KL), run.curve(Tag.REWARD)
    if kl is not None and reward is not None and kl.end > limit("kl_blowup"):
        rise, gain = kl.late_rise(), reward.end - reward.at(int(kl.steps[len(kl.steps) // 2]))
        if rise > limit("kl_rise") and gain < limit("stall_share") * run.success():
            fixes = (((f"kl.controller.target={_scaled(target, 0.5)}", "the controller aims beta at a smaller KL"),)
                     if adaptive and target else
                     ((f"kl.coef={_scaled(run.setting('kl.coef'), 5)}", "a stronger pull towards the reference"),))
            found.append(Finding(
                "kl_blowup", "KL to the reference blowing up", (int(kl.steps[0]), int(kl.steps[-1])),
                f"kl/value {_g(kl.start)} at the start, {_g(kl.end)} nats/token at the end (> "
                f"{limit('kl_blowup'):g}), up {rise:.0%} over the last half (a least-squares line through it) while "
                f"reward/mean moved {gain:+.3g}",
                "the adaptive controller's target lets the KL grow faster than beta can pull it back" if adaptive
                else "the penalty (kl.coef) is too weak for the step size and the reward's pull",
                fixes + ((f"trainer.lr={_scaled(run.setting('trainer.lr', 0.0), 0.25)}", "smaller steps"),)))
    sequence, coef_curve = run.curve(Tag.KL_SEQUENCE), run.curve(Tag.KL_COEF)
    if adaptive and target and sequence is not None and coef_curve is not None:
        late = sequence.after(0.5)
        pinned = np.mean(late / float(target) - 1 >= -limit("kl_pin_band"))
        rise = coef_curve.end / max(coef_curve.start, 1e-12)
        if pinned >= limit("persist_share") and rise >= limit("kl_coef_rise"):
            return [Finding(
                "kl_pinned", "KL pinned at the controller's target", (int(sequence.steps[len(sequence.steps) // 2]),
                                                                       int(sequence.steps[-1])),
                f"kl/sequence_sum at the target {float(target):g} or above it (within {limit('kl_pin_band'):.0%} "
                f"below it or higher) on {pinned:.0%} of the last half (median {_g(float(np.median(late)))}), "
                f"while kl/coef grew {rise:.2g}x ({_g(coef_curve.start)} -> {_g(coef_curve.end)})",
                "the adaptive controller raises beta to hold the KL at its target: the KL budget, not the "
                "reward, limits how far the policy moves",
                ((f"kl.controller.target={_scaled(target, 3)}", "a larger KL budget"),
                 ("kl.controller=fixed", "a fixed beta")))]
    return found


def rollout_mismatch(run: RunRecord) -> list[Finding]:
    """``rollout/mismatch_k3`` above ``mismatch_high`` on ``persist_share`` of the last half
    with no rollout correction: the batches come from a distribution the loss treats as the
    trained policy's."""
    curve = run.curve(Tag.MISMATCH)
    correction = run.setting("rollout_correction", "none")
    names = [c.get("name") if isinstance(c, dict) else c for c in
             (correction if isinstance(correction, list) else [correction])]
    if curve is None or any(name not in ("none", None) for name in names):
        return []
    late = curve.after(0.5)
    if np.mean(late > limit("mismatch_high")) < limit("persist_share"):
        return []
    staleness = int(run.setting("rollout.staleness", 0) or 0)
    causes = []
    if staleness:
        causes.append(f"rollout.staleness={staleness} trains on older policies' samples")
    if run.setting("rollout.mode") == "async":
        causes.append("rollout.mode=async generates with a lagging copy")
    if run.setting("rollout.dtype"):
        causes.append(f"rollout.dtype={run.setting('rollout.dtype')} samples from a rounded copy")
    peak = run.curve(Tag.MAX_LOG_RATIO)
    return [Finding(
        "rollout_mismatch", "rollout / trainer mismatch drifting", (int(curve.steps[0]), int(curve.steps[-1])),
        f"rollout/mismatch_k3 {_g(curve.start)} at the start, {_g(curve.end)} at the end (> "
        f"{limit('mismatch_high'):g} on {np.mean(late > limit('mismatch_high')):.0%} of the last half)"
        + (f"; rollout/max_abs_log_ratio up to {_g(float(peak.values.max()))}" if peak is not None else ""),
        ("; ".join(causes) or "the rollout backend samples from a distribution other than the trained "
         "policy's") + "; nothing corrects for it (rollout_correction=none)",
        (("rollout_correction=tis", "truncated importance weights correct the gap"),
         *((("rollout.staleness=0", "train on fresh samples"),) if staleness else ())))]


def zero_variance_groups(run: RunRecord) -> list[Finding]:
    """``reward/zero_std_frac`` above ``zero_std_high`` over the last half: most groups'
    completions score alike, so a group-relative advantage gives them no signal. The cause
    named: groups solved (reward at ``success_share`` of the success score or above), groups
    failing alike (at ``1 - success_share`` or below), or a collapsed policy whose samples of a
    prompt are the same completion (entropy below ``entropy_collapse_ratio`` of its start);
    with a learned reward (``reward/proxy``) the reward's level says nothing of success. Solved
    groups are a note: the run learnt the task."""
    curve, reward, entropy = run.curve(Tag.ZERO_STD_GROUPS), run.curve(Tag.REWARD), run.curve(Tag.ENTROPY)
    if curve is None or reward is None or int(run.setting("rollout.n", 2)) < 2:
        return []  # a group of one completion has no variance to lose (reinforce_pp's batch baseline)
    late = float(curve.after(0.5).mean())
    if late <= limit("zero_std_high"):
        return []
    n, success = int(run.setting("rollout.n", 1)), run.success()
    level = float(reward.after(0.5).mean())
    learned = Tag.PROXY in run.scalars
    collapsed = entropy is not None and entropy.end < limit("entropy_collapse_ratio") * entropy.start
    sample_more = (f"rollout.n={2 * n}", "larger groups disagree more often")
    refill = ("extensions=[dynamic_sampling]", "refill the batch with groups that disagree (DAPO)")
    solved = not learned and level >= limit("success_share") * success
    if solved:
        why = "the groups are solved: all their completions score the same (the task is easy for the policy now)"
        fixes = (refill, ("task.num_digits=6", "for sort_digits: a harder task"))
    elif not learned and level <= (1 - limit("success_share")) * success:
        why = "the task is too hard for the policy: whole groups fail alike"
        fixes = tuple(filter(None, (partial_credit(run), sample_more, refill)))
    elif collapsed:
        why = (f"the policy collapsed (entropy {_g(entropy.start)} -> {_g(entropy.end)}): its {n} samples of a "
               "prompt are mostly one completion")
        fixes = (("policy_loss.clip_high=0.28", "DAPO's clip-higher keeps exploring"), refill)
    else:
        why = f"groups of {n} completions too often agree"
        fixes = (sample_more, refill)
    return [Finding(
        "zero_variance_groups", "most groups have zero reward variance",
        (int(curve.steps[len(curve.steps) // 2]), int(curve.steps[-1])),
        f"reward/zero_std_frac {late:.2f} over the last half (> {limit('zero_std_high'):g}); reward/mean "
        f"{_g(level)} there" + ("" if learned else f" (success {success:g})"), why, fixes,
        "note" if solved else "warning")]


def response_length(run: RunRecord) -> list[Finding]:
    """Truncation: ``response_length/truncated_frac`` above ``truncation_high`` at the end while
    the best completion of most of the last half's steps scores exactly the same value below
    the task's success score (``reward/max`` at a ceiling: the budget caps the answer; without
    that tag, while the reward is not rising). Collapse: ``response_length/mean`` at the end below
    ``length_collapse_ratio`` of its start."""
    found = []
    truncated, reward, length = run.curve(Tag.TRUNCATED), run.curve(Tag.REWARD), run.curve(Tag.LENGTH)
    best, success = run.curve(Tag.REWARD_MAX), run.success()
    budget = run.setting("rollout.max_new_tokens")
    if truncated is not None and reward is not None and truncated.end > limit("truncation_high"):
        if best is not None:  # a ceiling: most steps' best completion scores exactly the half's best, below success
            late = best.after(0.5)
            shown = float(late.max())
            capped = shown < success and float(np.median(late)) == shown
            evidence = (f"no completion of the last half reached {success:g}: reward/max stuck at {_g(shown)} on "
                        f"{np.mean(late == shown):.0%} of its steps")
        else:
            middle = reward.at(int(reward.steps[len(reward.steps) // 2]))
            capped = reward.end - middle < limit("stall_share") * success
            evidence = f"reward/mean flat at {_g(reward.end)}"
        longest = logged_once(run, Tag.ANSWER_TOKENS_MAX)
        short = budget is not None and longest is not None and int(budget) < longest
        if capped and (longest is None or short):
            room = int(longest) if short else 2 * int(budget or 0)
            found.append(Finding(
                "truncation", "responses cut at max_new_tokens", (int(truncated.steps[0]), int(truncated.steps[-1])),
                f"response_length/truncated_frac {truncated.end:.2f} at the end (> {limit('truncation_high'):g})"
                + (f", response_length/mean {_g(length.end)} of {budget} tokens" if length is not None else "")
                + (f"; the longest reference answers take {int(longest)} tokens" if short else "")
                + f"; {evidence}",
                f"the response budget (rollout.max_new_tokens={budget}) is too small for a whole answer, or the "
                "policy never learnt to stop: cut responses are scored unfinished",
                ((f"rollout.max_new_tokens={room}", "room for every reference answer" if short else
                  "room for a whole answer"),) if budget else ()))
    if length is not None and length.start > 0 and length.end < limit("length_collapse_ratio") * length.start:
        found.append(Finding(
            "length_collapse", "response length collapsed", (int(length.steps[0]), int(length.steps[-1])),
            f"response_length/mean {_g(length.start)} at the start, {_g(length.end)} at the end (< "
            f"{limit('length_collapse_ratio'):g} of the start)",
            "the policy learnt that stopping early scores best (a reward or length shaping that favours short "
            "answers, or a loss aggregation that weights short sequences more)",
            (("loss_agg=seq-mean-token-sum-norm", "Dr. GRPO's length-unbiased aggregation"),
             (f"trainer.lr={_scaled(run.setting('trainer.lr', 0.0), 0.25)}", "smaller steps"))))
    return found


def grad_norm_spikes(run: RunRecord) -> list[Finding]:
    """``grad_norm`` more than ``spike_sigmas`` standard deviations above the mean of the
    preceding ``spike_window`` steps, on more than ``spike_share`` of the steps after the first
    window (judged from two windows on). A note when ``trainer.max_grad_norm`` clips them."""
    curve = run.curve(Tag.GRAD_NORM)
    w = int(limit("spike_window"))
    if curve is None or len(curve.values) < 2 * w:
        return []
    values = curve.values
    spikes = []
    for i in range(w, len(values)):
        before = values[i - w:i]
        if values[i] > before.mean() + limit("spike_sigmas") * max(before.std(), 1e-12):
            spikes.append(i)
    if len(spikes) <= limit("spike_share") * (len(values) - w):
        return []
    worst = sorted(spikes, key=lambda i: -values[i] / max(float(np.median(values[i - w:i])), 1e-12))[:3]
    shown = ", ".join(f"{_g(values[i])} at step {int(curve.steps[i])} (median before "
                      f"{_g(float(np.median(values[i - w:i])))})" for i in sorted(worst))
    clip = run.setting("trainer.max_grad_norm")
    fixes = [] if clip is not None else [("trainer.max_grad_norm=1.0", "clip the spikes")]
    fixes.append((f"trainer.lr={_scaled(run.setting('trainer.lr', 0.0), 0.25)}", "smaller steps"))
    return [Finding(
        "grad_norm_spikes", "gradient-norm spikes", (int(curve.steps[spikes[0]]), int(curve.steps[spikes[-1]])),
        f"{len(spikes)} spikes on {len(values) - w} steps (> {limit('spike_sigmas'):g} sd above the preceding "
        f"{w} steps): {shown}",
        "rare batches with outsized gradients (large advantages on few tokens, or a learning rate near "
        "instability); " + ("max_grad_norm clips the step, the spike shows the pressure"
                           if clip is not None else "nothing clips them (trainer.max_grad_norm=null)"),
        tuple(fixes), "note" if clip is not None else "warning")]


def non_finite(run: RunRecord) -> list[Finding]:
    """A NaN or infinity in any logged scalar."""
    bad = {tag: [s for s, v in points if not math.isfinite(v)] for tag, points in run.scalars.items()}
    bad = {tag: steps for tag, steps in bad.items() if steps}
    if not bad:
        return []
    first = min(steps[0] for steps in bad.values())
    last = max(steps[-1] for steps in bad.values())
    shown = ", ".join(f"{tag} (first at step {steps[0]}, {len(steps)} steps)" for tag, steps in sorted(bad.items())[:4])
    return [Finding(
        "non_finite", "non-finite values logged", (first, last), shown,
        "an overflow in the loss, the rewards or the statistics (a learning rate near divergence, bf16 "
        "ranges, a reward function returning NaN)",
        ((f"trainer.lr={_scaled(run.setting('trainer.lr', 0.0), 0.25)}", "smaller steps"),
         ("trainer.precision=fp32", "float32 compute"), ("trainer.max_grad_norm=1.0", "clip gradients")))]


def loss_at_zero(run: RunRecord) -> list[Finding]:
    """``|policy/loss|`` below ``zero_abs`` on ``persist_share`` of the last half, with a zero
    gradient or every group's rewards equal on those steps: there is nothing to learn from."""
    loss, grad, zero = run.curve(Tag.POLICY_LOSS), run.curve(Tag.GRAD_NORM), run.curve(Tag.ZERO_STD_GROUPS)
    if loss is None:
        return []
    half = len(loss.values) // 2
    flat = np.abs(loss.values[half:]) < limit("zero_abs")
    steps = loss.steps[half:]

    def on(curve: Curve | None, test: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        if curve is None:
            return np.zeros(len(steps), dtype=bool)
        index = {int(s): v for s, v in zip(curve.steps, curve.values)}
        return np.array([bool(test(np.array(index.get(int(s), np.nan)))) for s in steps])

    dead = flat & (on(grad, lambda v: v < limit("zero_abs")) | on(zero, lambda v: v >= 1.0))
    if np.mean(dead) < limit("persist_share"):
        return []
    return [Finding(
        "loss_at_zero", "policy loss stuck at 0", (int(steps[0]), int(steps[-1])),
        f"|policy/loss| < {limit('zero_abs'):g} with a zero gradient or all groups' rewards equal on "
        f"{np.mean(dead):.0%} of the last half",
        "every advantage is 0: each group's completions score the same (too easy or too hard a task, or a "
        "reward that cannot tell them apart)",
        tuple(filter(None, (partial_credit(run), (f"rollout.n={2 * int(run.setting('rollout.n', 1))}", "larger groups"),
                            ("extensions=[dynamic_sampling]", "train only on groups that disagree")))))]


def critic_lagging(run: RunRecord) -> list[Finding]:
    """For a run with a critic: ``value/vpred_mean`` short of ``value/returns_mean`` by more than
    ``value_bias_high`` of the returns over the run (:meth:`RunRecord.shortfall`: it does not track
    even the mean return), or ``value/explained_var`` below ``explained_var_low`` over the last
    half (median: worse than the mean). The evidence adds ``value/loss`` over the first and last quarter."""
    loss, explained = run.curve(Tag.VALUE_LOSS), run.curve(Tag.EXPLAINED_VAR)
    if loss is None or explained is None:
        return []
    median, bias = float(np.median(explained.after(0.5))), run.shortfall(Tag.VALUE_PRED, Tag.RETURNS)
    lagging = bias is not None and abs(bias) > limit("value_bias_high")
    if median >= limit("explained_var_low") and not lagging:
        return []
    quarter = max(1, len(loss.values) // 4)
    first, last = float(loss.values[:quarter].mean()), float(loss.values[-quarter:].mean())
    critic_lr = run.setting("trainer.critic_lr", 0.0)
    shown = (f"value/vpred_mean {'below' if bias > 0 else 'above'} value/returns_mean by {abs(bias):.0%} of the "
             f"returns over the run (> {limit('value_bias_high'):.0%}): the critic does not track the mean return; "
             if lagging else "") + f"value/explained_var median {_g(median)} over the last half"
    worse = median < limit("explained_var_low")
    return [Finding(
        "critic_lagging", "critic lagging behind the returns", (int(explained.steps[len(explained.steps) // 2]),
                                                                int(explained.steps[-1])),
        shown + (f" (< {limit('explained_var_low'):g}: worse than predicting the mean return)" if worse else "")
        + f"; value/loss {_g(first)} over the first quarter, {_g(last)} over the last",
        f"the critic (trainer.critic_lr={critic_lr:g}) does not track the returns of the changing policy, so "
        "GAE's advantages are mostly its error",
        ((f"trainer.critic_lr={_scaled(critic_lr, 10)}", "a critic that learns faster"),
         ("advantage=grpo", "a critic-free baseline")))]


def heldout_fall(run: RunRecord) -> list[Finding]:
    """Held-out greedy accuracy fell from its peak by more than ``heldout_sigmas`` binomial
    standard errors (over ``eval.size`` prompts) and ``heldout_min_drop``, while the training
    reward at the end is at least its value at the peak."""
    points = [(s, v) for s, v in run.scalars.get(Tag.EVAL_ACCURACY, []) if math.isfinite(v)]
    reward = run.curve(Tag.REWARD)
    if len(points) < 3 or reward is None:
        return []
    peak_index = int(np.argmax([v for _, v in points]))
    (peak_step, peak), (last_step, last) = points[peak_index], points[-1]
    n = max(1, int(run.setting("eval.size", 128) or 128))
    error = math.sqrt((peak * (1 - peak) + last * (1 - last)) / n)
    drop = peak - last
    if peak_index == len(points) - 1 or drop < limit("heldout_min_drop") or drop <= limit("heldout_sigmas") * error:
        return []
    at_peak, final = reward.at(peak_step), reward.end
    if final < at_peak - limit("stall_share") * run.success():
        return []
    return [Finding(
        "heldout_fall", "held-out accuracy fell while the training reward held", (peak_step, last_step),
        f"eval/greedy_accuracy peaked at {peak:.3f} (step {peak_step}) and ends at {last:.3f} (step {last_step}): "
        f"-{drop:.3f}, {drop / max(error, 1e-12):.1f} standard errors over {n} prompts; reward/mean {_g(at_peak)} "
        f"-> {_g(final)} over the same steps",
        "the policy keeps fitting the training prompts at the held-out prompts' expense: training went on past "
        "its best point",
        (("trainer.lr_schedule=cosine", "a decaying learning rate moves the policy less late in the run"),
         (f"trainer.total_steps={peak_step}", "stop where held-out accuracy peaked")))]


def proxy_over_optimised(run: RunRecord) -> list[Finding]:
    """``reward/proxy`` rose while ``reward/gold`` gained less than ``gold_flat`` of the
    success score or ended ``gold_flat`` below its peak (Gao et al. 2022)."""
    proxy, gold = run.curve(Tag.PROXY), run.curve(Tag.GOLD)
    if proxy is None or gold is None:
        return []
    success, smoothed = run.success(), gold.smooth
    peak = int(np.argmax(smoothed))
    gain, from_peak = gold.end - gold.start, float(smoothed[peak]) - gold.end
    if proxy.end <= proxy.start or (gain >= limit("gold_flat") * success and from_peak < limit("gold_flat") * success):
        return []
    return [Finding(
        "proxy_over_optimised", "proxy reward up, gold reward flat or down",
        (int(proxy.steps[0]), int(proxy.steps[-1])),
        f"reward/proxy {_g(proxy.start)} -> {_g(proxy.end)}; reward/gold {_g(gold.start)} -> {_g(gold.end)} "
        f"(peak {_g(float(smoothed[peak]))} at step {gold.smooth_step(peak)})",
        "the policy exploits the learned reward's errors: what it optimises is not what the gold reward "
        "measures (over-optimisation)",
        ((f"kl.coef={max(0.05, 5 * float(run.setting('kl.coef', 0.0) or 0.0)):g}", "hold the policy near the "
                                                                                    "reference"),
         (f"trainer.total_steps={gold.smooth_step(peak)}", "stop where the gold reward peaked")))]


def lr_schedule_inert(run: RunRecord) -> list[Finding]:
    """A warm-up whose ``lr`` never reached ``lr_reached`` of ``trainer.lr``, or a decaying
    schedule whose ``lr`` at the run's last step (``trainer.total_steps``) is still above
    ``lr_decayed`` of its peak."""
    curve, peak_lr = run.curve(Tag.LR), float(run.setting("trainer.lr", 0.0) or 0.0)
    if curve is None or peak_lr <= 0:
        return []
    found: list[Finding] = []
    warmup, total = int(run.setting("trainer.warmup_steps", 0) or 0), int(run.setting("trainer.total_steps", 0) or 0)
    schedule, top = run.setting("trainer.lr_schedule", "constant"), float(curve.values.max())
    if warmup and top < limit("lr_reached") * peak_lr:
        found.append(Finding(
            "warmup_unfinished", "the warm-up never finished", (int(curve.steps[0]), int(curve.steps[-1])),
            f"lr peaked at {_g(top)} (step {int(curve.steps[int(np.argmax(curve.values))])}), "
            f"{top / peak_lr:.0%} of trainer.lr={peak_lr:g}",
            f"trainer.warmup_steps={warmup} is not shorter than the run (trainer.total_steps={total}): the "
            "learning rate never reached its value, and the schedule never decayed",
            ((f"trainer.warmup_steps={max(1, total // 10)}", "a tenth of the run"),)))
    elif schedule in ("linear", "cosine") and int(curve.steps[-1]) >= total and \
            float(curve.values[-1]) > limit("lr_decayed") * top:
        found.append(Finding(
            "decay_inert", "the learning-rate decay never acted", (int(curve.steps[0]), int(curve.steps[-1])),
            f"lr {_g(float(curve.values[-1]))} at step {int(curve.steps[-1])}, {float(curve.values[-1]) / top:.0%} "
            f"of its peak {_g(top)} (trainer.lr_schedule={schedule})",
            "the schedule's horizon is not the run's (trainer.total_steps changed on a resume)",
            ((f"trainer.total_steps={int(curve.steps[-1])}", "a schedule as long as the run"),)))
    return found


DETECTORS: tuple[Callable[[RunRecord], list[Finding]], ...] = (
    non_finite, nothing_learning, lr_schedule_inert, rollout_mismatch, critic_lagging, kl_blowup,
    proxy_over_optimised, entropy_collapse, step_too_big, zero_variance_groups, loss_at_zero, response_length,
    grad_norm_spikes, heldout_fall)
"""Every detector, in the order findings are reported: a setting that explains a run (its
schedule, its rollouts, its critic, its KL, its reward) before the symptoms it causes."""

SYMPTOMS = frozenset({"entropy_collapse", "step_too_big", "kl_blowup", "zero_variance_groups", "loss_at_zero",
                      "truncation", "length_collapse", "grad_norm_spikes", "heldout_fall"})
"""Findings that follow from a run that never learnt (:func:`rlzoo.diagnostics.flat_start.nothing_learning`):
beside its finding they are named, not reported with fixes of their own."""


def diagnose(run: RunRecord) -> list[Finding]:
    """Every detector's findings for ``run``, in :data:`DETECTORS` order; when nothing is learning,
    its finding names the :data:`SYMPTOMS` findings it explains instead of reporting them."""
    root = nothing_learning(run)
    findings = [finding for detector in DETECTORS if detector is not nothing_learning for finding in detector(run)]
    if not root:
        return findings
    explained = [f for f in findings if f.code in SYMPTOMS and f.code != root[0].code]
    kept = [f for f in findings if f not in explained and f.code != root[0].code]
    if explained:
        names = ", ".join(dict.fromkeys(f.title for f in explained))
        root = [replace(root[0], cause=f"{root[0].cause} (it also explains what the other checks see: {names})")]
    first = [f for f in kept if f.code == "non_finite"]
    return first + root + [f for f in kept if f.code != "non_finite"]
