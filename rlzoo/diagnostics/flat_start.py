"""Nothing is learning: a run whose reward stays flat from its first step, and which of its own
settings explains it.

The checks run in order of how certain their evidence is, and the first that holds is the
finding (its code names the cause, so the fix is the knob that caused it):

1. ``truncation``: ``rollout.max_new_tokens`` is below the length of every reference answer
   of the task (``task/answer_tokens_min``, logged at step 0): no completion can be correct,
   whatever the curves say.
2. ``no_variety``: a sampling knob (``rollout.temperature`` or ``rollout.top_p`` below 1) and
   the first steps' samples of a prompt are one completion (entropy below ``entropy_floor``,
   or ``reward/zero_std_frac`` at ``same_samples`` or more, or, with a nucleus, the sampler's
   ``rollout/mismatch_k3`` above ``nucleus_mismatch_high``: what shows it when a group holds one
   completion).
3. ``constant_reward``: every scored completion of the first steps got the same score
   (``reward/std`` 0 on each): the reward cannot tell completions apart (at the top: it does
   not read the answer; at 0: no completion ever scores, nothing gives partial credit).
4. ``step_too_big``: on the first steps, ``policy/approx_kl`` or ``policy/clipfrac`` far above
   any healthy run's (``early_kl_high``, ``early_clip_high``), or (what shows it with one
   on-policy update a step, where both are 0 by construction) the entropy losing
   ``early_entropy_drop`` of its first value, or ``kl/value`` above ``early_ref_kl_high``; no
   persistence asked: the first updates threw the policy away from anything the reward could
   guide.
5. ``kl_pins_policy``: ``kl/grad_share`` (the KL term's share of the pull on the sampled
   tokens' log-probs; with the KL folded into the reward, its share of the advantages) above
   ``kl_share_high`` over the run: the KL term holds the policy at the reference.

Checks 2-5 need a flat reward: ``reward/mean`` gaining less than ``stall_share`` of the
success score from its first window to its last; check 4 does not when its evidence is the
first steps' ``policy/approx_kl`` above ``early_kl_high`` or ``kl/value`` above ``kl_blowup``
(7-8x any healthy run's): a partial-credit reward term can rise while no answer is right. The first steps are the first
``first_steps`` logged steps.
"""

from __future__ import annotations

import math

import numpy as np

from rlzoo.core.tags import Tag
from rlzoo.diagnostics.run_record import Finding, RunRecord
from rlzoo.diagnostics.thresholds import limit


def _g(x: float) -> str:
    return f"{x:.3g}"


def _round(x: float) -> str:
    """``x`` to one significant digit, as a fix's value."""
    if x <= 0 or not math.isfinite(x):
        return f"{x:g}"
    return f"{float(f'{x:.1g}'):g}"


def clip_fraction_reads(run: RunRecord) -> bool:
    """Whether ``policy/clipfrac`` can be compared with the thresholds: the policy loss's clip
    range (``policy_loss.clip_low`` / ``clip_high``, as the run's config gives them) is at least
    ``clip_range_min``. A sequence-level ratio clipped to 3e-4 (GSPO) clips a large share of
    tokens by design (GSPO, arXiv:2507.18071, reports clipping fractions two orders of magnitude above
    GRPO's)."""
    ranges = _clip_ranges(run)
    return not ranges or max(ranges) >= limit("clip_range_min")


def _clip_ranges(run: RunRecord) -> list[float]:
    """``policy_loss.clip_low`` and ``clip_high`` as the run's config gives them (numbers only)."""
    return [float(value) for value in (run.setting("policy_loss.clip_low"), run.setting("policy_loss.clip_high"))
            if isinstance(value, (int, float))]


def trust_region(run: RunRecord, clipped: bool = False) -> bool:
    """Whether the policy loss's clip range (``policy_loss.clip_low`` / ``clip_high``) is at most
    ``trust_region_max``: a PPO-style trust region that ``policy/approx_kl`` is measured against.
    A wider one caps importance weights instead (CISPO's ``clip_high`` 4: weights up to 5), and
    its updates move the policy further by design. A loss with no clip range has none to exceed
    (``True``), unless ``clipped`` asks for a clip range that is a trust region and whose clip
    fraction can be read (:func:`clip_fraction_reads`)."""
    ranges = _clip_ranges(run)
    if clipped:
        return bool(ranges) and clip_fraction_reads(run) and max(ranges) <= limit("trust_region_max")
    return not ranges or max(ranges) <= limit("trust_region_max")


def first_values(run: RunRecord, tag: str) -> np.ndarray:
    """The finite values ``tag`` logged on the run's first ``first_steps`` training steps (step >= 1)."""
    points = [v for s, v in run.scalars.get(tag, []) if s >= 1 and math.isfinite(v)]
    return np.array(points[:int(limit("first_steps"))], dtype=float)


def logged_once(run: RunRecord, tag: str) -> float | None:
    """The last value of a tag logged once (at step 0), or ``None``."""
    points = [v for _, v in run.scalars.get(tag, []) if math.isfinite(v)]
    return points[-1] if points else None


def _span(run: RunRecord) -> tuple[int, int]:
    steps = [s for s, _ in run.scalars.get(Tag.REWARD, []) if s >= 1]
    return (steps[0], steps[-1]) if steps else (1, 1)


def reward_flat(run: RunRecord) -> str | None:
    """Evidence of a flat reward (its first and last window), or ``None`` when it rose by
    ``stall_share`` of the success score or more, or is too short to judge."""
    reward = run.curve(Tag.REWARD)
    if reward is None or reward.end - reward.start >= limit("stall_share") * run.success():
        return None
    return f"reward/mean {_g(reward.start)} over its first {reward.window} steps, {_g(reward.end)} over its last"


def _gain(run: RunRecord) -> str:
    """What ``reward/mean`` and each reward term's tag gained from the first window to the last."""
    parts = []
    for tag in [Tag.REWARD, *sorted(t for t in run.scalars if t.startswith("reward/") and t not in _NOT_TERMS)]:
        curve = run.curve(tag)
        if curve is not None:
            parts.append(f"{tag} {_g(curve.start)} -> {_g(curve.end)}")
    return ", ".join(parts) + " (first window to last)"


_NOT_TERMS = frozenset({Tag.REWARD, Tag.REWARD_STD, Tag.REWARD_MAX, Tag.ZERO_STD_GROUPS, Tag.PROXY, Tag.GOLD})


def budget_too_small(run: RunRecord) -> Finding | None:
    """Check 1 of the module docstring."""
    shortest, longest = logged_once(run, Tag.ANSWER_TOKENS_MIN), logged_once(run, Tag.ANSWER_TOKENS_MAX)
    budget = run.setting("rollout.max_new_tokens")
    if shortest is None or budget is None or int(budget) >= shortest:
        return None
    longest = int(longest if longest is not None else shortest)
    span = f"{int(shortest)}" if int(shortest) == longest else f"{int(shortest)} to {longest}"
    best = run.scalars.get(Tag.REWARD_MAX, [])
    top = max((v for _, v in best if math.isfinite(v)), default=None)
    return Finding(
        "truncation", "responses cut at max_new_tokens: the budget cannot hold any answer", _span(run),
        f"rollout.max_new_tokens={budget}, but every reference answer of the task takes {span} tokens "
        f"(task/answer_tokens_min, task/answer_tokens_max)"
        + (f"; the best completion of any step scored {_g(top)} (success is {run.success():g})" if top is not None
           else ""),
        "no completion can hold a whole answer, so none is ever correct: the reward can only credit fragments",
        ((f"rollout.max_new_tokens={longest}", f"room for every reference answer, {longest} tokens"),))


def sampling_knobs(run: RunRecord) -> list[tuple[str, float]]:
    """The sampling settings below 1 (``rollout.temperature``, ``rollout.top_p``) with their values."""
    return [(key, float(run.setting(key, 1.0))) for key in ("rollout.temperature", "rollout.top_p")
            if float(run.setting(key, 1.0)) < 1.0]


def samples_alike(run: RunRecord) -> tuple[bool, bool, bool]:
    """``(tiny, alike, narrow)`` on the first steps: an entropy below ``entropy_floor``; a
    ``reward/zero_std_frac`` at ``same_samples`` or more (with groups of two or more); with
    ``rollout.top_p`` below 1, ``rollout/mismatch_k3`` above ``nucleus_mismatch_high`` (the logged
    entropy is the policy's whole distribution's, not the nucleus's)."""
    entropy, same = first_values(run, Tag.ENTROPY), first_values(run, Tag.ZERO_STD_GROUPS)
    mismatch = first_values(run, Tag.MISMATCH)
    groups = int(run.setting("rollout.n", 2)) >= 2  # a group of one completion is alike by definition
    nucleus = float(run.setting("rollout.top_p", 1.0)) < 1.0
    return (bool(len(entropy)) and float(entropy.mean()) < limit("entropy_floor"),
            groups and bool(len(same)) and float(same.mean()) >= limit("same_samples"),
            nucleus and bool(len(mismatch)) and float(mismatch.mean()) > limit("nucleus_mismatch_high"))


def no_variety(run: RunRecord) -> Finding | None:
    """Check 2 of the module docstring."""
    knobs = sampling_knobs(run)
    entropy, same = first_values(run, Tag.ENTROPY), first_values(run, Tag.ZERO_STD_GROUPS)
    mismatch = first_values(run, Tag.MISMATCH)
    tiny, alike, narrow = samples_alike(run)
    flat = reward_flat(run)
    same_all = run.curve(Tag.ZERO_STD_GROUPS)
    if flat is None and alike and same_all is not None and float(np.median(same_all.values)) >= limit("same_samples"):
        flat = (f"reward/zero_std_frac median {float(np.median(same_all.values)):.2f} over the run: a group-relative "
                "advantage is 0 on nearly every group, whatever the reward's level")  # its rise is the greedy drift
    if not knobs or not (tiny or alike or narrow) or flat is None:
        return None
    steps = f"steps 1-{max(len(entropy), len(same), len(mismatch))}"
    evidence = [f"entropy {_g(float(entropy.mean()))} on {steps} (< {limit('entropy_floor'):g} nats)" if tiny else "",
                f"reward/zero_std_frac {float(same.mean()):.2f} on {steps}: every group's completions score alike"
                if alike else "",
                f"rollout/mismatch_k3 {_g(float(mismatch.mean()))} nats/token on {steps} (> "
                f"{limit('nucleus_mismatch_high'):g}): the nucleus holds about {math.exp(-float(mismatch.mean())):.0%} "
                "of the policy's probability, its top token or two" if narrow and not (tiny or alike) else "",
                flat]
    settings = " and ".join(f"{key}={value:g}" for key, value in knobs)
    return Finding(
        "no_variety", "nothing is learning: the samples of a prompt do not differ", _span(run),
        "; ".join(e for e in evidence if e),
        f"{settings} samples (nearly) the most likely token every time, so a group's completions are one "
        "completion: a group-relative advantage is 0 and nothing is explored",
        tuple((f"{key}=1.0", "sample from the policy's own distribution") for key, _ in knobs))


def constant_reward(run: RunRecord) -> Finding | None:
    """Check 3 of the module docstring."""
    std, mean = first_values(run, Tag.REWARD_STD), first_values(run, Tag.REWARD)
    flat = reward_flat(run)
    if not len(std) or float(np.abs(std).max()) > limit("zero_abs") or flat is None:
        return None
    level, success = float(mean.mean()), run.success()
    reward = run.setting("reward")
    evidence = f"reward/std 0 on each of steps 1-{len(std)}: every completion scored {_g(level)}; {flat}"
    accuracy = [v for s, v in run.scalars.get(Tag.EVAL_ACCURACY, []) if math.isfinite(v)]
    if level <= (1 - limit("success_share")) * success:
        return Finding(
            "constant_reward", "nothing is learning: no completion ever scores", _span(run), evidence,
            "the initial policy never writes a correct answer and the reward gives no partial credit: every "
            "group's completions score alike, so every advantage is 0", tuple(filter(None, (partial_credit(run),))))
    if accuracy and accuracy[-1] >= success * limit("success_share"):
        evidence += (f"; eval/greedy_accuracy {accuracy[-1]:.3f} is no achievement: a random policy scores it "
                     "(every completion does)")
    own = reward is None
    return Finding(
        "constant_reward", "nothing is learning: every completion scores the same", _span(run), evidence,
        ("the task's own reward gives every completion of the first steps the success score: any completion "
         "solves the task, so there is nothing to prefer (a harder task, or another reward)" if own else
         f"the reward ({_reward_name(reward)}) does not tell completions apart (it does not read whether the "
         "answer is right), so every advantage is 0"),
        () if own else (("reward=null", "the task's own reward, which compares the answer with the reference"),))


def partial_credit(run: RunRecord) -> tuple[str, str] | None:
    """An override that adds a partial-credit term to the run's reward (``length_match``, weight
    0.1), so that groups whose answers all fail still differ; ``None`` when the reward has one already."""
    reward = run.setting("reward")
    if isinstance(reward, list) and "length_match" in _reward_name(reward):
        return None
    name = reward.get("name") if isinstance(reward, dict) else reward if isinstance(reward, str) else None
    why = "a partial-credit term gives failing answers something to differ in"
    if name is None:
        return "reward=[exact_match, {name: length_match, weight: 0.1}]", why + " (an exact-match task's reward)"
    return f"reward=[{name}, {{name: length_match, weight: 0.1}}]", why


def _reward_name(reward: object) -> str:
    if isinstance(reward, dict):
        return str(reward.get("name"))
    if isinstance(reward, list):
        return "[" + ", ".join(str(r.get("name") if isinstance(r, dict) else r) for r in reward) + "]"
    return str(reward)


def early_step_too_big(run: RunRecord) -> Finding | None:
    """Check 4 of the module docstring."""
    kl, clip = first_values(run, Tag.APPROX_KL), first_values(run, Tag.CLIPFRAC)
    entropy, ref_kl = first_values(run, Tag.ENTROPY), first_values(run, Tag.KL)
    flat = reward_flat(run)
    high_kl = len(kl) and float(kl.max()) > limit("early_kl_high")
    high_clip = len(clip) and float(clip.max()) > limit("early_clip_high") and clip_fraction_reads(run)
    # with one on-policy update per step the ratio is 1 and approx-KL 0: the step shows in what it did
    fell = len(entropy) > 1 and entropy[0] > 0 and float(entropy.min()) < (1 - limit("early_entropy_drop")) * entropy[0]
    away = len(ref_kl) and float(ref_kl.max()) > limit("kl_blowup")
    drift = len(ref_kl) and float(ref_kl.max()) > limit("early_ref_kl_high")
    # approx-KL or the KL from the reference this far above any healthy run's needs no flat reward: a
    # partial-credit term can rise while nothing correct is learnt
    if not (high_kl or away) and (not (high_clip or fell or drift) or flat is None):
        return None
    lr = float(run.setting("trainer.lr", 0.0) or 0.0)
    steps = f"steps 1-{int(limit('first_steps'))}"
    shown = "; ".join(x for x in (
        f"policy/approx_kl {', '.join(_g(v) for v in kl)} on {steps} (> {limit('early_kl_high'):g})" if high_kl else "",
        f"policy/clipfrac {', '.join(f'{v:.2f}' for v in clip)} (> {limit('early_clip_high'):g})" if high_clip else "",
        f"entropy {', '.join(_g(v) for v in entropy)} on {steps} (it lost more than "
        f"{limit('early_entropy_drop'):.0%})" if fell else "",
        f"kl/value up to {_g(float(ref_kl.max()))} nats/token from the reference on {steps} (> "
        f"{limit('kl_blowup' if away else 'early_ref_kl_high'):g})" if drift else "",
        flat or _gain(run)) if x)
    # approx-KL grows with the square of a small step: scale the rate to bring the first steps' KL to
    # approx_kl_high, at least a fifth down
    factor = min(0.2, math.sqrt(limit("approx_kl_high") / float(kl.max()))) if high_kl else 0.2
    return Finding(
        "step_too_big", ("nothing is learning: " if flat else "") + "the first updates were far too big", _span(run),
        shown,
        f"the learning rate ({lr:g}) moves the policy far past the clip range from the first update; the policy "
        "it lands on samples nothing the reward can guide back",
        ((f"trainer.lr={_round(lr * factor)}", "steps that keep the first updates' approx-KL near "
                                               f"{limit('approx_kl_high'):g}"),))


def kl_pins_policy(run: RunRecord) -> Finding | None:
    """Check 5 of the module docstring. Not the finding when β is not the run's own setting to turn (an adaptive
    controller grew it by ``kl_coef_rise``: ``kl_pinned`` names the target) or when a critic that does not track
    even the mean return (``value_bias_high``) makes the advantages' task part its error (``critic_lagging``)."""
    share = run.curve(Tag.KL_GRAD_SHARE)
    coef = float(run.setting("kl.coef", 0.0) or 0.0)
    flat = reward_flat(run)
    if share is None or coef <= 0 or flat is None:
        return None
    beta = run.curve(Tag.KL_COEF)
    if run.setting("kl.controller.name") == "adaptive" and beta is not None and beta.end > limit(
            "kl_coef_rise") * beta.start:
        return None
    bias = run.shortfall(Tag.VALUE_PRED, Tag.RETURNS)
    if bias is not None and abs(bias) > limit("value_bias_high"):
        return None
    median = float(np.median(share.values))
    if median <= limit("kl_share_high"):
        return None
    kl = run.curve(Tag.KL)
    # the share's odds scale with beta at a given policy: aim at the healthy runs' share
    target = limit("kl_share_target")
    suggested = coef * (target / (1 - target)) / (median / max(1 - median, 1e-12))
    in_reward = run.setting("kl.apply") == "reward"      # the share is then the KL's part of the advantages
    return Finding(
        "kl_pins_policy", "nothing is learning: the KL penalty holds the policy at the reference", _span(run),
        f"kl/grad_share median {median:.2f} (> {limit('kl_share_high'):g}): the KL "
        + ("penalty in the reward makes that share of the advantages" if in_reward else
           "term pulls the sampled tokens' log-probs as hard as the advantages do")
        + (f"; kl/value {_g(kl.end)} nats/token at the end" if kl else "") + f"; {flat}",
        f"kl.coef={coef:g} makes the KL " + ("penalty outweigh the task reward in the advantages" if in_reward else
                                             "term's gradient outweigh the advantage term's")
        + ": each step undoes what the reward asks for",
        ((f"kl.coef={_round(suggested)}", f"a KL share near the healthy runs' {target:g}"),))


CHECKS = (budget_too_small, no_variety, constant_reward, early_step_too_big, kl_pins_policy)
"""The checks in order of certainty; the first that holds is the finding."""


def nothing_learning(run: RunRecord) -> list[Finding]:
    """The first of :data:`CHECKS` that holds, as a one-finding list (or none)."""
    for check in CHECKS:
        found = check(run)
        if found is not None:
            return [found]
    return []


def constant_at_start(run: RunRecord) -> str | None:
    """The line to warn with at the start of a run whose first ``first_steps`` steps gave every
    scored completion the same score (``reward/std`` 0 on each), or ``None``."""
    std, mean = first_values(run, Tag.REWARD_STD), first_values(run, Tag.REWARD)
    if len(std) < int(limit("first_steps")) or float(np.abs(std).max()) > limit("zero_abs"):
        return None
    level = float(mean.mean())
    knobs = sampling_knobs(run)
    if knobs and any(samples_alike(run)):
        settings = " and ".join(f"{key}={value:g}" for key, value in knobs)
        why = f"{settings} makes the samples of a prompt one completion"
    elif level <= (1 - limit("success_share")) * run.success():
        why = "no completion scores: nothing gives partial credit"
    else:
        why = ("the reward does not tell completions apart, and a random policy already scores this (a held-out "
               "accuracy it gets is no achievement)")
    return (f"every scored completion of steps 1-{len(std)} scored {_g(level)} (reward/std 0): {why}; nothing "
            "can be learnt from it (rlzoo doctor names the fix)")
