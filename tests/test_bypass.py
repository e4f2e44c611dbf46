"""verl's bypass mode (``trainer.old_logp=rollout``): the rollout's log-probs μ are π_old, no
old-log-prob pass runs, and the corrections compare the current policy π with μ in each
micro-batch. Each ``algo=bypass_*`` preset's weights and loss against hand-computed values
of verl's formulas (verl-project/verl ``rollout_corr_helper.compute_rollout_correction_weights``,
``compute_rollout_rejection_mask``, ``core_algos.compute_policy_loss_bypass_mode``,
``compute_policy_loss_reinforce``, ``compute_policy_loss_vanilla``), the plan, and a run."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlzoo.commands.cli import main
from rlzoo.core import distributed
from rlzoo.core.errors import ConfigError
from rlzoo.core.events import read_scalars
from rlzoo.learn.correcting import Corrections
from rlzoo.plan.planner import load_config
from zoo import REGISTRY, TINY

LOG = math.log
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0],
                     [1.0, 1.0, 0.0, 0.0],
                     [1.0, 1.0, 0.0, 0.0],
                     [0.0, 0.0, 0.0, 0.0]])                              # row 3: an empty response
"""Four responses of at most four tokens; the last is empty."""
ROLLOUT = torch.tensor([[-1.0, -2.0, -0.5, -7.0],
                        [-60.0, -1.0, -3.0, -3.0],
                        [-1.0, -1.0, -4.0, -4.0],
                        [-2.0, -2.0, -2.0, -2.0]])
"""μ: the rollout's log-probs (padding values are garbage the weights must ignore)."""
LOG_RATIO = torch.tensor([[LOG(0.4), LOG(2.0), LOG(6.0), 9.0],
                          [50.0, -50.0, 3.0, -3.0],                    # extreme log-ratios ±50
                          [0.1, -0.1, 5.0, 5.0],
                          [0.3, 0.3, 0.3, 0.3]])
"""log(π/μ) per token (the last column and the empty row are padding)."""
CURRENT = ROLLOUT + LOG_RATIO
"""π: the current policy's log-probs."""
ADVANTAGES = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, -1.0, -1.0], [0.5, 0.5, 0.5, 0.5], [2.0, 2.0, 2.0, 2.0]])


def preset_weights(preset: str, logp: torch.Tensor = CURRENT, rollout: torch.Tensor = ROLLOUT,
                   mask: torch.Tensor = MASK) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The correction weights the engine multiplies into a micro-batch's per-token loss under
    ``algo=preset``: the plan's corrections, called as the learner calls them with π_old = μ."""
    plan = load_config(REGISTRY, [f"algo={preset}"]).plan
    assert plan.bypass and "old_logp" not in plan.passes
    corrections = Corrections(plan.corrections, distributed.DistInfo())
    metrics: dict[str, float] = {}
    mb = SimpleNamespace(correction_weights=None, rollout_logp=rollout, advantages=ADVANTAGES)
    logp = logp.clone().requires_grad_(True)
    weights = corrections.weights(mb, rollout, logp, mask, metrics.__setitem__)   # old_logp = μ (bypass)
    assert weights is None or not weights.requires_grad
    return weights, metrics


def by_row(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows)


# ------------------------------------------------------------------ each preset's weights, by hand


def test_bypass_pg_token_icepop_keeps_pi_over_mu_inside_half_to_five() -> None:
    """verl ``compute_rollout_correction_weights(rollout_is="token", threshold "0.5_5.0")``
    with ``old_log_prob=log_prob`` (the bypass call): w = π/μ inside [0.5, 5], else 0; a
    log-ratio of ±50 is clamped to ±20 first (e^20 > 5: dropped)."""
    weights, metrics = preset_weights("bypass_pg_token_icepop")
    expected = by_row([[0.0, 2.0, 0.0, 0.0],
                       [0.0, 0.0, 0.0, 0.0],
                       [math.exp(0.1), math.exp(-0.1), 0.0, 0.0],
                       [0.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(weights, expected, atol=1e-6)
    assert metrics["rollout_correction/icepop/dropped_frac"] == pytest.approx(4 / 7)


def test_bypass_pg_is_truncates_the_sequence_product_at_two() -> None:
    """verl ``compute_rollout_correction_weights(rollout_is="sequence", threshold 2.0)``: the
    per-token log-ratios are summed unclamped, the sum clamped to ±20, exp, min(·, 2), on
    every token: row 0 Π = 0.4·2·6 = 4.8 → 2; row 1 e^(50−50) = 1; row 2 e^0 = 1."""
    weights, metrics = preset_weights("bypass_pg_is")
    expected = by_row([[2.0, 2.0, 2.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(weights, expected, atol=1e-6)
    assert metrics["rollout_correction/seq_tis/truncated_seq_frac"] == pytest.approx(1 / 3)


def geo_kept(log_ratios: list[float]) -> bool:
    """verl's seq_mean_k1 "0.999_1.001": keep when mean_t log(μ/π) ∈ [log 0.999, log 1.001]."""
    statistic = -sum(log_ratios) / len(log_ratios)
    return LOG(0.999) <= statistic <= LOG(1.001)


def test_geometric_rejection_keeps_what_verls_seq_mean_k1_keeps_at_its_bounds() -> None:
    """verl ``compute_rollout_rejection_mask(rollout_rs="seq_mean_k1", "0.999_1.001")`` bounds
    mean log(μ/π); seq_is_mask bounds mean log(π/μ), so the preset takes verl's bounds as
    reciprocals. Row 0's mean log(π/μ) is 0.0010002, inside verl's upper bound −log 0.999 =
    0.0010005 but outside log 1.001 = 0.0009995 (seq_is_mask's own default rejects it)."""
    rows = [[0.0010002, 0.0010002], [-0.0010002, -0.0010002], [-0.0009990, -0.0009990], [0.0004, -0.0002],
            [0.0010010, 0.0010010], [50.0, -50.0]]
    log_ratio = torch.tensor(rows)
    mask = torch.ones_like(log_ratio)
    rollout = torch.full_like(log_ratio, -1.0)
    weights, _ = preset_weights("bypass_pg_geo_rs", logp=rollout + log_ratio, rollout=rollout, mask=mask)
    kept = [geo_kept(row) for row in rows]
    assert kept == [True, False, True, True, False, True]            # row 5: ±50 clamp to ±20, mean 0
    assert weights[:, 0].tolist() == [float(k) for k in kept]
    assert torch.equal(weights[:, 0], weights[:, 1])
    naive = REGISTRY.get("rollout_correction", "seq_is_mask")(old_logp=rollout + log_ratio, rollout_logp=rollout,
                                                              response_mask=mask)[0]
    assert naive[0, 0] == 0.0                                            # bounds not reciprocal-symmetric


def test_bypass_pg_geo_rs_drops_whole_sequences_and_keeps_no_weight() -> None:
    """Row 0's mean log(π/μ) is log(4.8)/3 (dropped); row 1's ±50 clamp to ±20, mean 0 (kept,
    as verl clamps before the mean); row 2's mean is 0 (kept). Kept tokens weigh 1."""
    weights, metrics = preset_weights("bypass_pg_geo_rs")
    assert torch.equal(weights, by_row([[0.0] * 4, [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0] * 4]))
    assert metrics["rollout_correction/seq_is_mask/dropped_seq_frac"] == pytest.approx(1 / 3)
    drifted = CURRENT.clone()
    drifted[2, :2] = ROLLOUT[2, :2] + torch.tensor([0.0004, 0.0020])     # mean 0.0012 > -log 0.999
    assert not geo_kept([0.0004, 0.0020])
    weights, _ = preset_weights("bypass_pg_geo_rs", logp=drifted)
    assert torch.equal(weights[2], torch.zeros(4)) and torch.equal(weights[1], torch.tensor([1.0, 1.0, 0.0, 0.0]))


NEAR = CURRENT.clone()
NEAR[2, :2] = ROLLOUT[2, :2] + torch.tensor([0.0004, -0.0002])
"""π with row 2's log-ratios (0.0004, −0.0002): inside Geo-RS's band."""


def test_the_geo_rs_tis_presets_multiply_the_is_weights_by_the_rejection() -> None:
    """verl computes the IS weights and the rejection mask side by side over the same mask;
    the loss is weighted by w and aggregated over the rejection-narrowed mask, i.e. w·keep.
    Row 1 (±50, kept by Geo-RS): sequence TIS e^(50−50) = 1, token TIS min(e^20, 2) = 2 and
    e^−20."""
    seq, _ = preset_weights("bypass_pg_geo_rs_seq_tis", logp=NEAR)
    assert torch.allclose(seq, by_row([[0.0] * 4, [1.0, 1.0, 0.0, 0.0], [math.exp(0.0002)] * 2 + [0.0] * 2,
                                       [0.0] * 4]), atol=1e-6)
    token, _ = preset_weights("bypass_pg_geo_rs_token_tis", logp=NEAR)
    assert torch.allclose(token, by_row([[0.0] * 4, [2.0, math.exp(-20.0), 0.0, 0.0],
                                         [math.exp(0.0004), math.exp(-0.0002), 0.0, 0.0], [0.0] * 4]), atol=1e-6)
    assert 0 < token[1, 1] < 1e-8


def k3(x: float) -> float:
    x = max(-20.0, min(20.0, x))
    return math.exp(x) - 1 - x


def test_bypass_ppo_clip_k3_rs_rejects_sequences_whose_mean_k3_exceeds_a_hundredth() -> None:
    """verl ``compute_rollout_rejection_mask(rollout_rs="seq_mean_k3", 0.01)``: per token
    r − 1 − log r, r = π/μ (log r clamped to ±20), meaned over the sequence."""
    weights, metrics = preset_weights("bypass_ppo_clip_k3_rs")
    statistics = [sum(k3(x) for x in row) / len(row) for row in ([LOG(0.4), LOG(2.0), LOG(6.0)], [50.0, -50.0],
                                                                 [0.1, -0.1])]
    assert statistics[2] == pytest.approx(0.0050042, abs=1e-6) and statistics[1] > 1e8
    expected = [float(s <= 0.01) for s in statistics]
    assert expected == [0.0, 0.0, 1.0]
    assert torch.equal(weights, by_row([[0.0] * 4, [0.0] * 4, [1.0, 1.0, 0.0, 0.0], [0.0] * 4]))
    assert metrics["rollout_correction/rejection/dropped_seq_frac"] == pytest.approx(2 / 3)
    assert math.isfinite(metrics["rollout_correction/rejection/statistic_mean"])
    shifted = ROLLOUT.clone()
    shifted[2, :2] += torch.tensor([-0.1, 0.2])                          # x = (0.2, -0.3)
    weights, _ = preset_weights("bypass_ppo_clip_k3_rs", rollout=shifted)
    assert (k3(0.2) + k3(-0.3)) / 2 == pytest.approx(0.031110, abs=1e-6) and weights.sum() == 0


def test_bypass_ppo_clip_weights_nothing() -> None:
    assert preset_weights("bypass_ppo_clip")[0] is None


def test_padding_and_the_empty_response_never_change_a_weight() -> None:
    garbage_logp, garbage_rollout = CURRENT.clone(), ROLLOUT.clone()
    garbage_logp[MASK == 0] = 1e4
    garbage_rollout[MASK == 0] = -1e4
    for preset in ("bypass_pg_is", "bypass_pg_token_icepop", "bypass_pg_geo_rs_token_tis", "bypass_ppo_clip_k3_rs"):
        clean, _ = preset_weights(preset)
        dirty, metrics = preset_weights(preset, logp=garbage_logp, rollout=garbage_rollout)
        assert torch.equal(clean, dirty) and (clean[MASK == 0] == 0).all(), preset
        assert all(math.isfinite(v) for v in metrics.values()), preset


# ------------------------------------------------------------------ the losses


def test_bypass_pg_loss_is_verls_reinforce_with_is_weights() -> None:
    """verl ``compute_policy_loss_reinforce``: −A·log π·w per token, aggregated over the
    (rejection-narrowed) mask; the gradient is −A·w·∇log π (w detached). Under
    bypass_pg_token_icepop with token-mean over the 7 valid tokens by hand: tokens (0,1),
    (2,0), (2,1) carry weight."""
    weights, _ = preset_weights("bypass_pg_token_icepop")
    resolved = load_config(REGISTRY, ["algo=bypass_pg_token_icepop"])
    assert resolved.components["policy_loss"].name == "vanilla_pg"
    loss_fn = resolved.bound("policy_loss")
    logp = CURRENT.clone().requires_grad_(True)
    token_loss, _ = loss_fn(logp=logp, old_logp=ROLLOUT, advantages=ADVANTAGES, response_mask=MASK,
                            rollout_logp=ROLLOUT, ref_logp=None, correction_weights=weights)
    loss = (token_loss * weights * MASK).sum() / MASK.sum()
    by_hand = -(1.0 * CURRENT[0, 1] * 2.0 + 0.5 * CURRENT[2, 0] * math.exp(0.1)
                + 0.5 * CURRENT[2, 1] * math.exp(-0.1)) / 7
    assert loss.item() == pytest.approx(float(by_hand), rel=1e-6)
    loss.backward()
    expected_grad = torch.zeros_like(MASK)
    expected_grad[0, 1], expected_grad[2, 0], expected_grad[2, 1] = -2.0 / 7, -0.5 * math.exp(0.1) / 7, \
        -0.5 * math.exp(-0.1) / 7
    assert torch.allclose(logp.grad, expected_grad, atol=1e-7)


def test_bypass_ppo_clip_loss_is_verls_dual_clip_against_mu() -> None:
    """verl ``compute_policy_loss_vanilla`` with old = rollout log-probs: max(−A·r, −A·clip(r,
    0.8, 1.2)), and for A < 0 at most −3·A (dual clip, clip_ratio_c 3)."""
    resolved = load_config(REGISTRY, ["algo=bypass_ppo_clip"])
    loss_fn = resolved.bound("policy_loss")
    rollout = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])
    ratios = [5.0, 1.1, 0.5, 5.0]
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    token_loss, _ = loss_fn(logp=rollout + torch.log(torch.tensor([ratios])), old_logp=rollout,
                            advantages=advantages, response_mask=torch.ones(1, 4), rollout_logp=rollout,
                            ref_logp=None, correction_weights=None)
    # A=1, r=5: max(−5, −1.2) = −1.2; A=1, r=1.1: −1.1; A=−1, r=0.5: max(0.5, 0.8) = 0.8;
    # A=−1, r=5: min(max(5, 1.2), 3) = 3 (the dual clip)
    assert torch.allclose(token_loss, torch.tensor([[-1.2, -1.1, 0.8, 3.0]]), atol=1e-6)


# ------------------------------------------------------------------ the config and the plan


def test_bypass_plan_says_which_pass_it_skips_and_what_the_corrections_compare() -> None:
    plan = load_config(REGISTRY, ["trainer.old_logp=rollout", "rollout_correction=[tis, opmask]",
                                  "policy_loss=vanilla_pg", "rollout.dtype=bfloat16"]).plan
    text = plan.render()
    assert "old-log-prob pass (a forward of the policy over the batch before the update) is skipped" in text
    assert "1. tis: weights the per-token policy loss" in text
    assert "comparing the current policy pi (detached) with the rollout's mu where pi_old would be" in text
    assert [(s.name, s.stage, s.current_as_old) for s in plan.corrections] == [("tis", "update", True),
                                                                              ("opmask", "update", False)]
    assert not plan.warnings
    computed = load_config(REGISTRY, ["rollout_correction=tis", "rollout.dtype=bfloat16"]).plan
    assert [(s.stage, s.current_as_old) for s in computed.corrections] == [("batch", False)]


def test_bypass_warns_where_an_is_weight_multiplies_a_ratio_already_pi_over_mu() -> None:
    warned = load_config(REGISTRY, ["trainer.old_logp=rollout", "rollout_correction=[tis]",
                                    "rollout.dtype=bfloat16"]).plan.warnings
    assert any("makes ppo_clip's ratio pi/mu already, and rollout_correction tis" in w for w in warned)
    masks_only = load_config(REGISTRY, ["algo=bypass_ppo_clip_k3_rs", "rollout.dtype=bfloat16"]).plan.warnings
    assert masks_only == []


def test_bypass_refuses_only_a_rejection_that_would_narrow_the_mask_inside_a_micro_batch() -> None:
    with pytest.raises(ConfigError, match=r"rollout_correction\[0\] 'rejection' has mode=mask but with "
                                          r"trainer.old_logp=rollout compares the current policy"):
        load_config(REGISTRY, ["trainer.old_logp=rollout", "rollout_correction={name: rejection, mode: mask}"])
    load_config(REGISTRY, ["rollout_correction={name: rejection, mode: mask}"])   # π_old vs μ: once per step
    for name in ("tis", "seq_tis", "icepop", "seq_is_mask", "rejection", "opmask"):
        load_config(REGISTRY, ["trainer.old_logp=rollout", f"rollout_correction={name}"])


def test_an_on_policy_bypass_run_without_a_gap_warns_its_corrections_are_inert() -> None:
    warned = load_config(REGISTRY, ["trainer.old_logp=rollout", "rollout_correction=tis", "policy_loss=vanilla_pg",
                                    "trainer.num_mini_batches=1"]).plan.warnings
    assert any("rollout_correction tis corrects for μ ≠ π, but the hf backend" in w for w in warned)
    moving = load_config(REGISTRY, ["trainer.old_logp=rollout", "rollout_correction=tis", "policy_loss=vanilla_pg",
                                    "trainer.num_mini_batches=2"]).plan.warnings
    assert not any("corrects for" in w for w in moving)                  # π moves away from μ after step one


# ------------------------------------------------------------------ a run


@pytest.mark.slow
def test_rlzoo_train_bypass_with_tis_weights_pi_over_mu(tmp_path: Path) -> None:
    """``rlzoo train trainer.old_logp=rollout rollout_correction=[tis]``: with a bf16 rollout
    beside the float32 policy the weights π/μ are not 1, and the update differs from the
    same run without the correction."""
    common = [*TINY, "rollout.dtype=bfloat16", "trainer.old_logp=rollout", "trainer.total_steps=2", "eval.size=0"]
    assert main(["train", *common, "rollout_correction=[tis]", f"run_dir={tmp_path / 'tis'}"]) == 0
    assert main(["train", *common, f"run_dir={tmp_path / 'none'}"]) == 0
    tis, none = read_scalars(tmp_path / "tis"), read_scalars(tmp_path / "none")
    assert "rollout/mismatch_k3" not in tis                              # no old-log-prob pass ran
    weight_means = [value for _, value in tis["rollout_correction/tis/weight_mean"]]
    assert len(weight_means) == 2 and all(math.isfinite(v) and v != 1.0 for v in weight_means)
    assert tis["reward/mean"][0] == none["reward/mean"][0]               # the same first rollout
    assert tis["policy/loss"][0] != none["policy/loss"][0]               # weighted differently
    assert "old-log-prob pass" in (tmp_path / "tis" / "plan.txt").read_text()
