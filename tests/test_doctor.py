"""rlzoo doctor: every detector on synthetic curves (a sick series finds, a healthy one does
not), the metrics it reads, the threshold table, the pre-flight estimate's arithmetic, and
one short end-to-end run of the command and the in-training warnings."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from rlzoo.diagnostics import detectors, thresholds
from rlzoo.diagnostics.run_record import RunRecord, window_size
from rlzoo.diagnostics.watch import Watch
from rlzoo.learn.learner import explained_variance
from rlzoo.core.tags import Tag
from rlzoo.run.tracking import zero_std_groups

ROOT = Path(__file__).parents[1]
STEPS = 200


def config(**sections: dict) -> dict:
    """A run config with the keys the detectors read, sections replaced by ``sections``."""
    base = {"trainer": {"lr": 5e-4, "update_epochs": 1, "num_mini_batches": 4, "critic_lr": 1e-3,
                        "max_grad_norm": 1.0, "warmup_steps": 0, "lr_schedule": "constant", "total_steps": STEPS},
            "rollout": {"n": 8, "max_new_tokens": 7, "staleness": 0, "mode": "sync", "dtype": None},
            "kl": {"coef": 0.04, "controller": "fixed"}, "eval": {"threshold": 1.0, "size": 128},
            "rollout_correction": "none"}
    for key, value in sections.items():
        base[key] = {**base[key], **value} if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return base


def record(cfg: dict | None = None, steps: int = STEPS, **curves) -> RunRecord:
    """A run whose tag ``a/b`` (written ``a__b``) at step s (1..steps) is ``curves[tag](s)``."""
    scalars = {tag.replace("__", "/"): [(s, float(f(s))) for s in range(1, steps + 1)] for tag, f in curves.items()}
    return RunRecord(scalars, cfg or config())


def codes(run: RunRecord) -> list[str]:
    return [f.code for f in detectors.diagnose(run)]


def ramp(a: float, b: float, until: int = STEPS):
    """``a`` at step 1 to ``b`` at ``until``, then ``b``."""
    return lambda s: a + (b - a) * min(1.0, (s - 1) / max(1, until - 1))


HEALTHY = dict(reward__mean=ramp(0.1, 0.95, 120), entropy=ramp(2.4, 0.8, 150), policy__clipfrac=lambda s: 0.02,
               policy__approx_kl=lambda s: 0.005, kl__value=ramp(0.0, 0.2), grad_norm=lambda s: 1 + 0.01 * (s % 3),
               response_length__mean=ramp(7, 5), response_length__truncated_frac=ramp(0.9, 0.0, 100),
               reward__max=lambda s: 1.0, reward__zero_std_frac=lambda s: 0.2, policy__loss=lambda s: 0.01,
               lr=lambda s: 5e-4)


# ----------------------------------------------------------------------------- the metrics doctor reads

def test_zero_std_groups_counts_groups_whose_rewards_are_all_equal() -> None:
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.5, 2.0, 2.0, 0.3])
    groups = torch.tensor([0, 0, 1, 1, 5, 5, 9])        # ids need not be contiguous; 9 is a group of one
    assert zero_std_groups(rewards, groups) == (3, 4)   # groups 0, 5 and the single 9
    assert zero_std_groups(torch.zeros(0), torch.zeros(0, dtype=torch.long)) == (0, 0)
    assert zero_std_groups(torch.tensor([1.0, 1.0 + 1e-6]), torch.tensor([3, 3])) == (0, 1)   # any difference counts


def test_explained_variance_by_hand() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    returns = torch.tensor([[1.0, 3.0, 1e6], [5.0, 7.0, -1e6]])      # padding is never read
    # Var(returns) over 1, 3, 5, 7 (n - 1): 20 / 3
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    values = torch.tensor([[0.0, 4.0, 9.0], [4.0, 8.0, 9.0]])        # residuals 1, -1, 1, -1: variance 4 / 3
    assert explained_variance(values, returns, mask) == pytest.approx(1 - (4 / 3) / (20 / 3 + 1e-5))
    worse = torch.tensor([[7.0, 5.0, 0.0], [3.0, 1.0, 0.0]])         # residuals -6, -2, 2, 6: variance 80 / 3
    assert explained_variance(worse, returns, mask) == pytest.approx(1 - (80 / 3) / (20 / 3 + 1e-5))
    assert explained_variance(worse, returns, mask) < 0


# ----------------------------------------------------------------------------- reading curves

def test_windows_and_curves() -> None:
    assert window_size(200) == 10 and window_size(40) == 5 and window_size(1000) == 50
    run = record(steps=19, x=lambda s: s)
    assert run.curve("x") is None                        # fewer than four windows of 5
    curve = record(steps=20, x=lambda s: s).curve("x")
    assert curve.start == 3.0 and curve.end == 18.0      # means of 1..5 and 16..20
    assert curve.smooth[0] == 3.0 and len(curve.smooth) == 16
    run = RunRecord({"x": [(s, math.nan if s == 3 else float(s)) for s in range(1, 22)]}, {})
    assert run.curve("x").steps[2] == 4                  # non-finite points are left out
    assert run.setting("kl.controller.name", "x") == "x"
    assert RunRecord({}, {"kl": {"controller": "adaptive"}}).setting("kl.controller.name") == "adaptive"
    assert RunRecord({}, {"kl": {"controller": {"name": "adaptive", "target": 6}}}).setting("kl.controller.target") == 6


def test_a_healthy_run_has_no_finding() -> None:
    assert codes(record(**HEALTHY)) == []


# ----------------------------------------------------------------------------- each detector

def test_entropy_collapse_with_the_reward_stalled_far_from_success() -> None:
    sick = {**HEALTHY, "entropy": ramp(2.0, 0.2, 30), "reward__mean": ramp(0.1, 0.45, 30)}
    (finding,) = detectors.entropy_collapse(record(**sick))
    # start: the mean of steps 1-10, 2 - 1.8 x 4.5 / 29 = 1.7207; steps 22-31 are the first window
    # below 0.25 x 1.7207 = 0.4302 (steps 22-30 average 2 - 1.8 x 25 / 29 = 0.4483, step 31 is 0.2: 0.4234)
    assert finding.steps[0] == 31
    # reward/mean there: steps 22-30 average 0.1 + 0.35 x 25 / 29 = 0.4017, step 31 is 0.45: 0.4066;
    # from the start (0.1 + 0.35 x 4.5 / 29 = 0.1543) 0.0084 a step over 30 steps, after it
    # (0.45 - 0.4066) / 169 = 0.00026 a step: 3 % of that, under 10 %
    assert "reward/mean 0.154 -> 0.407 up to then, 0.45 at the end: 3% of its rate before" in finding.evidence
    assert "reward/mean" in finding.evidence and finding.fixes[0][0] == "trainer.lr=0.000125"
    # the same entropy curve while the reward goes on to the success score: convergence, no finding
    assert detectors.entropy_collapse(record(**{**sick, "reward__mean": ramp(0.1, 0.95, 150)})) == []
    # an early collapse (the reward at 0.24 of success) while the reward goes on rising at 47 % of its rate
    # before (CISPO, sort4, seed 2 of benchmarks/doctor_recall.py's tuning set): no finding
    rising = {**HEALTHY, "entropy": ramp(2.0, 0.2, 30), "reward__mean": lambda s: 0.05 + 0.0065 * min(s, 30)
              + 0.0065 * 0.47 * max(0, s - 30)}
    assert detectors.entropy_collapse(record(steps=150, **rising)) == []
    # the same collapse with the reward falling after it to 0 (CISPO, arithmetic, seed 2): a finding
    falling = {**rising, "reward__mean": lambda s: 0.05 + 0.0065 * min(s, 30) - 0.0024 * max(0, s - 30)}
    (finding,) = detectors.entropy_collapse(record(steps=150, **falling))
    assert finding.fixes[0][0] == "trainer.lr=0.000125"


def test_step_too_big_from_clip_fraction_or_approx_kl() -> None:
    cfg = config(trainer={"update_epochs": 4, "num_mini_batches": 8})
    (finding,) = detectors.step_too_big(record(cfg, **{**HEALTHY, "policy__clipfrac": lambda s: 0.3}))
    assert "policy/clipfrac above 0.1 on 100% of the steps (median 0.3)" in finding.evidence
    assert finding.fixes[0][0] == "trainer.update_epochs=1"
    (finding,) = detectors.step_too_big(record(**{**HEALTHY, "policy__approx_kl": lambda s: 0.02 if s % 3 else 0}))
    assert "policy/approx_kl above 0.015 on 67% of the steps" in finding.evidence   # 134 of 200
    assert detectors.step_too_big(record(**{**HEALTHY, "policy__approx_kl": lambda s: 0.02 if s % 3 == 0 else 0})) == []


def test_step_too_big_does_not_judge_an_importance_weight_cap() -> None:
    # CISPO's clip range is a cap on a stop-gradient importance weight (1 + 4 = 5), no trust region:
    # its 16 updates a rollout keep approx-KL at 0.05-0.08 while the run learns
    high = {**HEALTHY, "policy__approx_kl": lambda s: 0.07, "reward__mean": lambda s: 0.03}
    cispo = config(policy_loss={"name": "cispo", "clip_low": 1.0, "clip_high": 4.0},
                   trainer={"num_mini_batches": 16})
    assert detectors.step_too_big(record(cispo, **high)) == []
    ppo = config(policy_loss={"name": "ppo_clip", "clip_low": 0.2, "clip_high": 0.28}, trainer={"num_mini_batches": 16})
    (finding,) = detectors.step_too_big(record(ppo, **{**high, "policy__clipfrac": lambda s: 0.15}))
    assert finding.level == "warning"                    # a flat reward, and the clip range overrun


def test_approx_kl_alone_under_a_clip_range_that_holds_is_a_note() -> None:
    # DAPO on arithmetic (round 3, seed 9): 16 updates a rollout, approx-KL median 0.054 (above 0.015 on 81 % of
    # the steps) with its clip fraction at a median 0.06, and a reward that gains 0.047 (< stall_share): its
    # other 10 healthy runs show approx-KL medians 0.020-0.129 with clip fractions 0.042-0.096, learning
    dapo = config(policy_loss={"name": "ppo_clip", "clip_low": 0.2, "clip_high": 0.28},
                  trainer={"num_mini_batches": 16})
    flat = {**HEALTHY, "policy__approx_kl": lambda s: 0.054, "policy__clipfrac": lambda s: 0.06 + 0.05 * (s % 5 == 0),
            "reward__mean": lambda s: 0.03}
    (finding,) = detectors.step_too_big(record(dapo, **flat))
    assert finding.level == "note" and "policy/clipfrac stays under 0.1: the clip range holds the update" in \
        finding.evidence
    # the clip fraction overrun on most steps as well: a warning
    (finding,) = detectors.step_too_big(record(dapo, **{**flat, "policy__clipfrac": lambda s: 0.11 + 0.1 * (s % 2)}))
    assert finding.level == "warning" and "policy/clipfrac above 0.1 on 100% of the steps" in finding.evidence
    # no clip range (a REINFORCE-style loss) holds nothing: approx-KL alone with a flat reward is a warning
    plain = config(policy_loss={"name": "vanilla"}, trainer={"num_mini_batches": 16})
    (finding,) = detectors.step_too_big(record(plain, **flat))
    assert finding.level == "warning"
    # nor does a clip range whose fraction is not read (GSPO's 3e-4)
    gspo = config(policy_loss={"name": "gspo", "clip_low": 3e-4, "clip_high": 4e-4}, trainer={"num_mini_batches": 16})
    (finding,) = detectors.step_too_big(record(gspo, **flat))
    assert finding.level == "warning"


def test_kl_blowup_and_kl_pinned_at_the_adaptive_target() -> None:
    stalled = {**HEALTHY, "kl__value": ramp(0.0, 2.0), "reward__mean": ramp(0.1, 0.5, 60)}
    (finding,) = detectors.kl_blowup(record(**stalled))
    # end 2 x 194.5 / 199 = 1.95; the line through steps 101-200 is the ramp itself: 2 x 100 / 199 = 1.005 at
    # step 101, 2 at step 200, so up 99 %
    assert finding.code == "kl_blowup" and "1.95 nats/token at the end (> 0.5), up 99% over the last half" in \
        finding.evidence
    assert finding.fixes[0][0] == "kl.coef=0.2"
    assert detectors.kl_blowup(record(config(kl={"coef": 0.0}), **stalled)) == []          # no KL
    assert detectors.kl_blowup(record(**{**stalled, "kl__value": ramp(0.0, 2.0, 90)})) == []   # levelled off
    assert detectors.kl_blowup(record(**{**stalled, "reward__mean": ramp(0.1, 0.9)})) == []    # bought reward
    # a plateau whose noise puts its last window 25 % above the window at the half: no rise on the line
    # (GRPO on arithmetic, seed 5, round 2: 0.60 at the half, 0.77 at the end of a plateau at 0.78)
    plateau = {**stalled, "kl__value": lambda s: 0.2 + 0.6 * min(s, 80) / 80 + (0.0 if s <= 100 else 0.06 * (
        -1) ** (s // 7)) - (0.2 if 95 <= s <= 101 else 0.0)}
    run = record(**plateau)
    assert run.curve("kl/value").end > 1.1 * run.curve("kl/value").at(101)
    assert run.curve("kl/value").late_rise() < 0.1 and detectors.kl_blowup(run) == []
    # a drift of 13 % over the last half at the partial-credit ceiling (REINFORCE++ on arithmetic, round 4's tuning
    # set: 0.67 -> 0.75) is no blow-up; 31 % (GRPO at lr 0.07 on sort5) is
    for rise, found in ((0.13, False), (0.31, True)):
        drift = {**stalled, "kl__value": lambda s, r=rise: 0.67 * (1 + r * max(0, s - 101) / 99)}
        assert bool(detectors.kl_blowup(record(**drift))) is found, rise
    adaptive = config(kl={"coef": 0.2, "controller": {"name": "adaptive", "target": 6.0, "horizon": 10000}})
    pinned = {**HEALTHY, "kl__sequence_sum": ramp(0.0, 6.0, 80), "kl__coef": ramp(0.2, 0.5)}
    (finding,) = detectors.kl_blowup(record(adaptive, **pinned))
    assert finding.code == "kl_pinned" and "grew 2.4x" in finding.evidence
    assert finding.fixes[0][0] == "kl.controller.target=18"
    assert detectors.kl_blowup(record(adaptive, **{**pinned, "kl__coef": lambda s: 0.2})) == []   # beta not pushing
    # pinned at the target while the per-token KL climbs: the controller holds it, one finding, not a blow-up
    # whose kl.coef fix the controller would override (round 2's GRPO on arithmetic at target 1.5)
    both = {**pinned, "kl__value": ramp(0.0, 2.0), "reward__mean": ramp(0.1, 0.5, 60)}
    assert [f.code for f in detectors.kl_blowup(record(adaptive, **both))] == ["kl_pinned"]
    # a blow-up under the adaptive controller, not at its target: the fix is the target, not kl.coef
    (finding,) = detectors.kl_blowup(record(adaptive, **{**both, "kl__coef": lambda s: 0.2}))
    assert finding.code == "kl_blowup" and finding.fixes[0][0] == "kl.controller.target=3"


def test_rollout_mismatch_uncorrected() -> None:
    stale = config(rollout={"staleness": 4})
    (finding,) = detectors.rollout_mismatch(record(stale, **{**HEALTHY, "rollout__mismatch_k3": ramp(1e-4, 1e-2)}))
    assert "rollout.staleness=4" in finding.cause and ("rollout.staleness=0", "train on fresh samples") in finding.fixes
    assert detectors.rollout_mismatch(record(config(rollout={"staleness": 4}, rollout_correction={"name": "none"}),
                                             **{**HEALTHY, "rollout__mismatch_k3": ramp(1e-4, 1e-2)}))  # as saved
    for corrected in ("tis", {"name": "tis", "cap": 2.0}, [{"name": "rejection"}, "tis"]):
        cfg = config(rollout={"staleness": 4}, rollout_correction=corrected)
        assert detectors.rollout_mismatch(record(cfg, **{**HEALTHY, "rollout__mismatch_k3": ramp(1e-4, 1e-2)})) == []
    assert detectors.rollout_mismatch(record(stale, **{**HEALTHY, "rollout__mismatch_k3": lambda s: 1e-14})) == []


def test_zero_variance_groups_names_easy_or_hard() -> None:
    easy = {**HEALTHY, "reward__zero_std_frac": lambda s: 0.8}
    (finding,) = detectors.zero_variance_groups(record(**easy))
    assert "groups are solved" in finding.cause and finding.fixes[0][0] == "extensions=[dynamic_sampling]"
    (finding,) = detectors.zero_variance_groups(record(**{**easy, "reward__mean": lambda s: 0.02}))
    assert "too hard" in finding.cause and finding.fixes[1][0] == "rollout.n=16"
    assert finding.fixes[0][0] == "reward=[exact_match, {name: length_match, weight: 0.1}]"   # reward: null
    (finding,) = detectors.zero_variance_groups(record(config(reward={"name": "numeric_match"}),
                                                       **{**easy, "reward__mean": lambda s: 0.02}))
    assert finding.fixes[0][0] == "reward=[numeric_match, {name: length_match, weight: 0.1}]"
    # a reward that has its partial-credit term already is not offered it again (round 4: Dr. GRPO on arithmetic)
    credited = config(reward=["exact_match", {"name": "length_match", "weight": 0.1}])
    (finding,) = detectors.zero_variance_groups(record(credited, **{**easy, "reward__mean": lambda s: 0.02}))
    assert [fix for fix, _ in finding.fixes] == ["rollout.n=16", "extensions=[dynamic_sampling]"]
    collapsed = {**easy, "reward__mean": lambda s: 0.5, "entropy": ramp(2.0, 0.1, 50)}
    (finding,) = detectors.zero_variance_groups(record(**collapsed))
    assert "the policy collapsed (entropy 1.83 -> 0.1)" in finding.cause     # start 2 - 1.9 x 4.5 / 49
    (finding,) = detectors.zero_variance_groups(record(**{**easy, "reward__mean": lambda s: 0.5}))
    assert finding.cause == "groups of 8 completions too often agree"
    learned = {**collapsed, "reward__mean": lambda s: 1.7, "reward__proxy": lambda s: 1.7}
    (finding,) = detectors.zero_variance_groups(record(**learned))   # a learned reward's level says nothing
    assert "the policy collapsed" in finding.cause and "(success" not in finding.evidence
    assert detectors.zero_variance_groups(record(**{**easy, "reward__zero_std_frac": lambda s: 0.5})) == []


def test_truncation_only_when_no_completion_reaches_success() -> None:
    cut = {**HEALTHY, "response_length__truncated_frac": lambda s: 1.0, "reward__max": lambda s: 0.75,
           "reward__mean": ramp(0.1, 0.45, 100)}
    (finding,) = detectors.response_length(record(**cut))
    assert "reward/max stuck at 0.75 on 100% of its steps" in finding.evidence
    assert finding.fixes[0][0] == "rollout.max_new_tokens=14"
    # every response cut at the budget, but some completion scores 1.0: the cut costs nothing
    assert detectors.response_length(record(**{**cut, "reward__max": lambda s: 1.0})) == []
    # the best completion varies from step to step below 1 (a policy still searching): no ceiling
    assert detectors.response_length(record(**{**cut, "reward__max": lambda s: 0.5 + 0.1 * (s % 4)})) == []


def test_length_collapse() -> None:
    (finding,) = detectors.response_length(record(**{**HEALTHY, "response_length__mean": ramp(6.0, 1.0, 100)}))
    # start: 6 - 5 x 4.5 / 99 = 5.77
    assert finding.code == "length_collapse" and "5.77 at the start, 1 at the end" in finding.evidence


def test_grad_norm_spikes_past_seven_sigma() -> None:
    # each spike 10x the last, so none hides in the deviation the ones before it add to the window
    sizes = {60: 10.0, 70: 100.0, 80: 1e3, 90: 1e4, 100: 1e5}
    spiky = {**HEALTHY, "grad_norm": lambda s: sizes.get(s, 1 + 0.01 * (s % 3))}
    (finding,) = detectors.grad_norm_spikes(record(**spiky))
    assert finding.steps == (60, 100) and "5 spikes on 150 steps" in finding.evidence   # steps 51-200 judged
    rare = {**HEALTHY, "grad_norm": lambda s: {60: 10.0, 120: 10.0, 180: 10.0}.get(s, 1 + 0.01 * (s % 3))}
    assert detectors.grad_norm_spikes(record(**rare)) == []      # 3 of 150 steps: not above 2 %


def test_non_finite_values() -> None:
    (finding,) = detectors.non_finite(record(**{**HEALTHY, "policy__loss": lambda s: math.nan if s >= 7 else 0.1}))
    assert "policy/loss (first at step 7, 194 steps)" in finding.evidence


def test_loss_at_zero_needs_a_dead_gradient_or_all_groups_equal() -> None:
    dead = {**HEALTHY, "policy__loss": lambda s: 0.0, "grad_norm": lambda s: 0.0}
    (finding,) = detectors.loss_at_zero(record(**dead))
    assert "100% of the last half" in finding.evidence
    equal = {**HEALTHY, "policy__loss": lambda s: 0.0, "reward__zero_std_frac": lambda s: 1.0}
    assert [f.code for f in detectors.loss_at_zero(record(**equal))] == ["loss_at_zero"]
    # on-policy GRPO's loss is 0 by construction while its gradient is not: no finding
    assert detectors.loss_at_zero(record(**{**HEALTHY, "policy__loss": lambda s: 0.0})) == []


def test_critic_lagging() -> None:
    lagging = {**HEALTHY, "value__loss": lambda s: 0.5, "value__explained_var": lambda s: -0.4}
    (finding,) = detectors.critic_lagging(record(**lagging))
    assert "median -0.4 over the last half" in finding.evidence and "value/loss 0.5 over the first" in finding.evidence
    assert finding.fixes[0][0] == "trainer.critic_lr=0.01"
    learning = {**HEALTHY, "value__loss": lambda s: 0.5, "value__explained_var": ramp(0.0, 0.8)}
    assert detectors.critic_lagging(record(**learning)) == []     # a flat loss alone is no finding: returns move
    assert detectors.critic_lagging(record(**{**HEALTHY, "value__explained_var": lambda s: -0.4})) == []  # no critic


def test_critic_lagging_behind_the_mean_return() -> None:
    # a critic that barely moves from 0 explains ~0 of the variance (a positive median, 0.001) but
    # predicts 0.002 where the returns average 0.07: it misses 97 % of them (trainer.critic_lr=1e-7)
    slow = {**HEALTHY, "value__loss": lambda s: 0.007, "value__explained_var": lambda s: 0.001,
            "value__returns_mean": lambda s: 0.07, "value__vpred_mean": lambda s: 0.002 * min(1.0, s / 100)}
    (finding,) = detectors.critic_lagging(record(**slow))
    # Σ(returns - values) / Σ|returns| over 200 steps: values average 0.002 x (5050 / 100 + 100) / 200 = 0.0015050
    assert "value/vpred_mean below value/returns_mean by 98% of the returns over the run (> 5%)" in finding.evidence
    assert "worse than predicting" not in finding.evidence
    assert finding.fixes[0][0] == "trainer.critic_lr=0.01"
    bias = record(**slow).shortfall("value/vpred_mean", "value/returns_mean")
    assert bias == pytest.approx((0.07 - 0.0015050) / 0.07)
    # a healthy critic reaches the mean return in its first steps: 0.5 % off, no finding
    tracking = {**slow, "value__explained_var": lambda s: 0.03,
                "value__vpred_mean": lambda s: 0.07 * (0.5 if s <= 2 else 1.0)}
    assert record(**tracking).shortfall("value/vpred_mean", "value/returns_mean") == pytest.approx(
        0.035 * 2 / (0.07 * 200))
    assert detectors.critic_lagging(record(**tracking)) == []
    # returns that sum to 0 (no reward yet) give no bias to judge
    assert record(**{**slow, "value__returns_mean": lambda s: 0.0}).shortfall("value/vpred_mean",
                                                                             "value/returns_mean") is None


def test_heldout_fall_by_standard_errors() -> None:
    run = record(**HEALTHY)
    run.scalars[Tag.EVAL_ACCURACY] = [(100, 0.2), (140, 0.805), (200, 0.625)]
    (finding,) = detectors.heldout_fall(run)
    # SE = sqrt((0.805 x 0.195 + 0.625 x 0.375) / 128) = 0.0553: a fall of 0.180 is 3.3 of them
    assert "peaked at 0.805 (step 140) and ends at 0.625 (step 200): -0.180, 3.3 standard errors" in finding.evidence
    assert finding.fixes[1][0] == "trainer.total_steps=140"
    run.scalars[Tag.EVAL_ACCURACY] = [(100, 0.2), (140, 0.53), (200, 0.47)]   # SE 0.0625: 0.06 < 2 SE
    assert detectors.heldout_fall(run) == []
    big = record(config(eval={"size": 10000}), **HEALTHY)                   # SE 0.00707: 0.06 > 2 SE
    big.scalars[Tag.EVAL_ACCURACY] = [(100, 0.2), (140, 0.53), (200, 0.47)]
    assert [f.code for f in detectors.heldout_fall(big)] == ["heldout_fall"]


def test_proxy_up_gold_down() -> None:
    over = {**HEALTHY, "reward__proxy": ramp(-1.5, 2.5), "reward__gold": lambda s: 0.1 - 0.0003 * s}
    (finding,) = detectors.proxy_over_optimised(record(**over))
    assert "reward/proxy -1.41 -> 2.41" in finding.evidence     # -1.5 + 4 x 4.5 / 199, -1.5 + 4 x 194.5 / 199
    assert finding.fixes[1][0] == "trainer.total_steps=10"     # the gold reward's best window: steps 1-10
    assert detectors.proxy_over_optimised(record(**{**over, "reward__gold": ramp(0.1, 0.6)})) == []


def test_learning_rate_schedules_that_never_act() -> None:
    cfg = config(trainer={"warmup_steps": 1000, "lr_schedule": "cosine"})
    (finding,) = detectors.lr_schedule_inert(record(cfg, **{**HEALTHY, "lr": lambda s: 5e-4 * s / 1000}))
    assert finding.code == "warmup_unfinished" and "20% of trainer.lr=0.0005" in finding.evidence
    assert finding.fixes == (("trainer.warmup_steps=20", "a tenth of the run"),)
    cosine = config(trainer={"lr_schedule": "cosine"})        # at its last step a cosine schedule is at 0
    (finding,) = detectors.lr_schedule_inert(record(cosine, **HEALTHY))
    assert finding.code == "decay_inert"
    unfinished = config(trainer={"lr_schedule": "cosine", "total_steps": 10000})
    assert detectors.lr_schedule_inert(record(unfinished, **HEALTHY)) == []   # 200 of 10,000 steps: not judged
    assert detectors.lr_schedule_inert(record(**HEALTHY)) == []


# ----------------------------------------------------------------------------- during training

def test_watch_reports_each_finding_once_at_due_steps() -> None:
    run = record(**{**HEALTHY, "policy__clipfrac": lambda s: 0.3})
    watch = Watch(run.config, every=50)
    lines = []
    for step in range(1, STEPS + 1):
        watch.add(step, {tag: points[step - 1][1] for tag, points in run.scalars.items()})
        lines += [(step, Watch.line(step, finding)) for finding in watch.check(step, last=step == STEPS)]
    assert [step for step, _ in lines] == [50]
    # the reward rises all the same: a note; with a flat reward the same steps are a warning
    assert lines[0][1].startswith("rlzoo: doctor: step 50: note: update step too big")
    (finding,) = detectors.step_too_big(record(**{**HEALTHY, "policy__clipfrac": lambda s: 0.3,
                                                  "reward__mean": lambda s: 0.1}))
    assert finding.level == "warning" and Watch.line(50, finding).startswith("rlzoo: doctor: step 50: update step")


def test_the_threshold_table_is_the_docs_table() -> None:
    page = (ROOT / "docs" / "diagnostics.md").read_text()
    assert thresholds.markdown() in page
    kinds = (thresholds.PAPER, thresholds.DOCS, thresholds.MEASURED, thresholds.DEFINITION, thresholds.CHOSEN)
    assert all(t.kind in kinds and t.source for t in thresholds.TABLE)
    used = set(re.findall(r"""limit\(["'](\w+)["']\)""", "".join(
        (ROOT / "rlzoo/diagnostics" / name).read_text() for name in ("detectors.py", "run_record.py", "flat_start.py",
                                                                      "watch.py"))))
    assert used == set(thresholds.BY_NAME)          # every threshold is used, every used one is in the table


DOC_EVIDENCE = {
    r"policy/approx_kl [\d., e-]+ on steps 1-\d+ \(> ([\d.e-]+)\)": "early_kl_high",
    r"policy/clipfrac [\d., ]+ \(> ([\d.e-]+)\)": "early_clip_high",
    r"\(it lost more than (\d+)%\)": "early_entropy_drop",
    r"kl/value up to [\d.e-]+ nats/token from the reference on steps 1-\d+ \(> ([\d.e-]+)\)": "kl_blowup",
    r"kl/grad_share median [\d.]+ \(> ([\d.e-]+)\)": "kl_share_high",
    r"entropy [\d.e-]+ on steps 1-\d+ \(< ([\d.e-]+) nats\)": "entropy_floor",
    r"reward/zero_std_frac [\d.]+ over the last half \(> ([\d.e-]+)\)": "zero_std_high",
    r"rollout/mismatch_k3 [^(]*\(> ([\d.e-]+) on": "mismatch_high",
    r"by step \d+ \(< ([\d.]+) of the start\)": "entropy_collapse_ratio",
    r"a KL share near the healthy runs' ([\d.]+)\)": "kl_share_target",
}
"""Threshold values that doctor's transcripts in docs/diagnostics.md print, and the threshold each is."""


def test_the_docs_transcripts_print_the_thresholds_of_the_code() -> None:
    page = (ROOT / "docs" / "diagnostics.md").read_text()
    seen = {}
    for pattern, name in DOC_EVIDENCE.items():
        values = [float(v) for v in re.findall(pattern, page)]
        scale = 100 if name == "early_entropy_drop" else 1
        seen[name] = values
        assert values and all(v == thresholds.BY_NAME[name].value * scale for v in values), (name, values)
    # the list of the flat-start checks names the same values in words
    words = page.split("## Nothing is learning")[1].split("The five runs below")[0]
    for phrase, name in (("`policy/approx_kl` above\n   {}", "early_kl_high"),
                         ("`policy/clipfrac` above {}", "early_clip_high"),
                         ("an entropy below {} nats", "entropy_floor"), ("above {} over the run", "kl_share_high"),
                         ("near its start ({})", "kl_share_target")):
        assert phrase.format(f"{thresholds.BY_NAME[name].value:g}") in words, (name, phrase)


# ----------------------------------------------------------------------------- pre-flight

def test_memory_terms_of_the_default_run_by_hand(registry) -> None:
    from rlzoo.plan.planner import load_config
    from rlzoo.diagnostics.preflight import activation_bytes, memory_parts
    from rlzoo.diagnostics.roofline import ModelShapes

    resolved = load_config(registry, [])             # grpo: KL 0.04 (a reference copy), 4 mini-batches of 32
    shapes = ModelShapes(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=256, vocab=15)
    # tied embedding 64 x 15 = 960; layers 2 x (2·64·64 + 2·64·32 + 3·64·256) = 122,880; norms 5 x 64 = 320
    n = 960 + 122_880 + 320
    parts = {p.name: p.bytes for p in memory_parts(resolved, shapes, prompt_max=6, baseline=100.0)}
    assert parts["baseline"] == 100.0
    assert parts["policy weights"] == parts["gradients"] == parts["reference"] == 4 * n
    assert parts["optimizer"] == 3 * 4 * n
    assert parts["KV cache"] == 2 * 2 * 32 * 128 * (6 + 7) * 4      # 2 L k B (P + T) e
    # micro-batch min(64, 128 / 4) = 32 sequences x 13 tokens = 416; per layer 416 x (4·64 + 5·64 + 4·256) x 4
    layer = 416 * 1600 * 4
    head = 32 * 7 * 15 * 4                    # kept log-softmax of the 224 response tokens
    chunk = 224 * 15 * 4 * 2                  # one chunk's logits and log-softmax
    mask = 416**2                             # a packed micro-batch's attention mask, a byte per pair
    assert activation_bytes(resolved, shapes, 6) == 2 * layer + head + chunk + mask == parts["activations"]
    assert "critic" not in parts and "rollout copy" not in parts
    ppo = {p.name: p.bytes for p in memory_parts(load_config(registry, ["algo=ppo"]), shapes, 6, 0.0)}
    assert ppo["critic"] == 4 * (n + 64) * 4                  # weights, gradients, two moments; a d -> 1 head
    lora = {p.name: p.bytes for p in memory_parts(load_config(registry, ["model.lora.rank=8"]), shapes, 6, 0.0)}
    # rank 8 on q, k, v, o, gate, up, down: 8 x ((64+64) + (64+32) x 2 + (64+64) + (64+256) x 3) per layer
    adapters = 2 * 8 * (128 + 192 + 128 + 960)
    assert lora["gradients"] == 4 * adapters and "reference" not in lora


@pytest.mark.slow
def test_doctor_during_and_after_a_short_run(tmp_path: Path, capsys) -> None:
    """One short run with a warm-up longer than the run: silent with logging.doctor=false,
    reported once when resumed with it on (the resumed run's earlier curves included); then
    `rlzoo doctor` on the run, --strict, `rlzoo compare`'s column, and --plan."""
    from rlzoo.commands.cli import main
    from rlzoo.commands.compare import compare

    run = tmp_path / "run"
    small = ["trainer.warmup_steps=100", "eval.size=0", "eval.every=10", "trainer.threads=1", "checkpoint.every=0",
             "logging.progress=false", "rollout.prompts_per_step=4", "model.hidden_size=32",
             "model.intermediate_size=64"]
    assert main(["train", *small, "trainer.total_steps=20", f"run_dir={run}", "logging.doctor=false"]) == 0
    assert "rlzoo: doctor:" not in capsys.readouterr().err
    assert main(["train", f"resume={run}", "trainer.total_steps=40", "logging.doctor=true"]) == 0
    captured = capsys.readouterr()
    # the run's last line names the findings; each finding printed is recorded in doctor.jsonl
    assert "; doctor: 1 finding (rlzoo doctor " in captured.out
    assert [json.loads(line)["code"] for line in (run / "doctor.jsonl").read_text().splitlines()] == \
        ["warmup_unfinished"]
    lines = [line for line in captured.err.splitlines() if line.startswith("rlzoo: doctor:")]
    # at step 30 the lr curve has 30 points (20 of them from before the resume): long enough to judge
    assert any(line.startswith("rlzoo: doctor: step 30: the warm-up never finished") for line in lines)
    assert len({line.split(": ")[3].split(" (")[0] for line in lines}) == len(lines)     # each finding once

    assert main(["doctor", str(run)]) == 0
    out = capsys.readouterr().out
    assert "40 steps logged, completed at step 40;" in out and "[warmup_unfinished]" in out
    assert "fix: trainer.warmup_steps=4" in out               # a tenth of the run's 40 steps
    assert main(["doctor", "--strict", str(run)]) == 2
    capsys.readouterr()
    text = compare([run], tmp_path / "compare").text
    row = [line for line in text.splitlines() if line.startswith("| run ")][0]
    assert row.rstrip(" |").endswith(f"| {out.count('  evidence:')}")     # the doctor column: its finding count

    assert main(["doctor"]) == 2
    assert "rlzoo doctor needs run directories" in capsys.readouterr().err
    assert main(["doctor", "--plan", "--strict", "trainer.threads=1"]) == 0
    assert "fits in this machine's available memory" in capsys.readouterr().out
    assert main(["doctor", "--plan", "--strict", "trainer.threads=1", "model.num_layers=100000"]) == 2
    assert "DOES NOT FIT" in capsys.readouterr().out
