"""Rollout corrections composed (``rollout_correction=[a, b]``), the corrections verl and TRL
have beside rlzoo's (sequence TIS, k2/k3 rejection, two-sided and batch-normalised TIS),
rejection that leaves the loss mask, the bypass mode and the off-policy diagnostics:
hand-computed values, the config, the plan, ``rlzoo explain`` and one run."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlzoo.core import distributed
from rlzoo.plan.run_input import engine_input, load_run
from rlzoo.plan.planner import load_config
from rlzoo.learn.correcting import Corrections, offpolicy_metrics
from rlzoo.core.errors import ConfigError
from rlzoo.commands.explain import explain
from zoo import PM, REGISTRY, TINY

LOG = math.log


def call(name: str, old, rollout=None, mask=None, **params):
    rollout = torch.zeros_like(old) if rollout is None else rollout
    mask = torch.ones_like(old) if mask is None else mask
    return REGISTRY.get("rollout_correction", name)(
        old_logp=old, rollout_logp=rollout, logp=old, advantages=torch.ones_like(old), response_mask=mask, **params)


def k3(x: float) -> float:
    return math.exp(x) - 1 - x


# ------------------------------------------------------------------ the formulas, by hand


def test_seq_tis_truncates_the_product_of_the_ratios_per_sequence() -> None:
    # ρ: 0.5·3 = 1.5 (kept), 3·2 = 6 (truncated at 2), 0.25 (one valid token; padding is garbage), empty
    old = torch.tensor([[LOG(0.5), LOG(3.0)], [LOG(3.0), LOG(2.0)], [LOG(0.25), 40.0], [7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    weights, metrics = call("seq_tis", old, mask=mask)
    torch.testing.assert_close(weights, torch.tensor([[1.5, 1.5], [2.0, 2.0], [0.25, 0.0], [0.0, 0.0]]))
    assert metrics["truncated_seq_frac"].item() == pytest.approx(1 / 3)      # of the 3 non-empty sequences
    weights, metrics = call("seq_tis", old, mask=mask, clip_min=0.5)         # two-sided (TRL)
    torch.testing.assert_close(weights[:3, 0], torch.tensor([1.5, 2.0, 0.5]))
    assert metrics["raised_seq_frac"].item() == pytest.approx(1 / 3)
    weights, metrics = call("seq_tis", old, mask=mask, normalize=True)       # verl: / mean over sequences
    mean = (1.5 + 2.0 + 0.25) / 3
    torch.testing.assert_close(weights[:3, 0], torch.tensor([1.5, 2.0, 0.25]) / mean)
    assert metrics["norm_factor"].item() == pytest.approx(mean)


def test_seq_tis_sums_the_log_ratios_before_clamping_the_sum() -> None:
    # log-ratios +30 and -25: verl sums first (ρ = e^5 -> 2); clamping each token first would give e^0 = 1
    old = torch.tensor([[30.0, -25.0], [30.0, 30.0], [-30.0, -30.0]])
    weights, _ = call("seq_tis", old, cap=1000.0)
    assert weights[0, 0].item() == pytest.approx(math.exp(5.0), rel=1e-5)
    assert weights[1, 0].item() == 1000.0                                     # e^60 clamped to e^20, then C
    assert weights[2, 0].item() == pytest.approx(math.exp(-20.0), rel=1e-5)   # finite, positive


def test_tis_two_sided_and_batch_normalised() -> None:
    old = torch.tensor([[LOG(0.5), 0.0, LOG(3.0), 5.0]])                      # ratios 0.5, 1, 3 (+ padding)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    weights, metrics = call("tis", old, mask=mask, clip_min=0.8)
    torch.testing.assert_close(weights, torch.tensor([[0.8, 1.0, 2.0, 0.0]]))
    assert metrics["raised_frac"].item() == pytest.approx(1 / 3)
    weights, metrics = call("tis", old, mask=mask, normalize=True)
    torch.testing.assert_close(weights, torch.tensor([[0.5, 1.0, 2.0, 0.0]]) / (3.5 / 3))
    assert metrics["norm_factor"].item() == pytest.approx(3.5 / 3)
    assert metrics["weight_mean"].item() == pytest.approx(3.5 / 3)            # before normalising


def test_token_rejection_by_k2_and_k3() -> None:
    old = torch.tensor([[0.0, 0.2, -0.3, 9.0]])                               # last: padding
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    # k2 = x²/2 = 0, 0.02, 0.045
    weights, metrics = call("rejection", old, mask=mask, estimator="k2", level="token", threshold=0.03)
    assert weights.tolist() == [[1.0, 1.0, 0.0, 0.0]]
    assert metrics["dropped_frac"].item() == pytest.approx(1 / 3)
    assert metrics["statistic_mean"].item() == pytest.approx((0.02 + 0.045) / 3, rel=1e-5)
    # k3 = e^x − 1 − x = 0, 0.021403, 0.040818
    weights, _ = call("rejection", old, mask=mask, estimator="k3", level="token", threshold=0.021)
    assert weights.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    weights, _ = call("rejection", old, mask=mask, estimator="k3", level="token", threshold=0.0215)
    assert weights.tolist() == [[1.0, 1.0, 0.0, 0.0]]


@pytest.mark.parametrize("level, threshold, keep", [
    # per-sequence k3 of A = (0.1, 0.1) and B = (0, 0.15):
    # sum A 0.010342, B 0.011834; mean A 0.005171, B 0.005917; max A 0.005171, B 0.011834
    ("sum", 0.011, [1.0, 0.0]),
    ("sum", 0.012, [1.0, 1.0]),
    ("mean", 0.011, [1.0, 1.0]),
    ("mean", 0.0055, [1.0, 0.0]),
    ("max", 0.011, [1.0, 0.0]),
    ("max", 0.005, [0.0, 0.0]),
])
def test_sequence_rejection_by_sum_mean_and_max(level: str, threshold: float, keep: list[float]) -> None:
    assert k3(0.1) * 2 == pytest.approx(0.010342, abs=1e-6) and k3(0.15) == pytest.approx(0.011834, abs=1e-6)
    old = torch.tensor([[0.1, 0.1, 0.0], [0.0, 0.15, -30.0]])                 # last column padding
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    weights, metrics = call("rejection", old, mask=mask, level=level, threshold=threshold)
    assert weights.tolist() == [[keep[0]] * 2 + [0.0], [keep[1]] * 2 + [0.0]]
    assert metrics["dropped_seq_frac"].item() == pytest.approx(keep.count(0.0) / 2)


def test_rejection_keeps_empty_sequences_finite_and_refuses_bad_parameters() -> None:
    weights, metrics = call("rejection", torch.zeros(2, 3), mask=torch.zeros(2, 3), level="max")
    assert weights.sum() == 0 and all(torch.isfinite(v) for v in metrics.values())
    from rlzoo.config.params import build_params
    for given, fragment in (({"estimator": "k1"}, "estimator must be one of k2, k3"),
                            ({"level": "min"}, "level must be one of token, sum, mean, max"),
                            ({"threshold": 0.0}, "threshold must be > 0"),
                            ({"mode": "drop"}, "mode must be one of weight, mask")):
        with pytest.raises(ConfigError, match=re.escape(fragment)):
            build_params(REGISTRY.get("rollout_correction", "rejection"), given)
    with pytest.raises(ConfigError, match=re.escape("need 0 <= clip_min < cap")):
        build_params(REGISTRY.get("rollout_correction", "seq_tis"), {"clip_min": 3.0})


def test_offpolicy_metrics_by_hand() -> None:
    # two sequences; x = log π_old − log μ = (0.2, -0.1) and (0.3, padding)
    old = torch.tensor([[-1.0, -2.0], [-0.5, -9.0]])
    rollout = torch.tensor([[-1.2, -1.9], [-0.8, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    found = {k: float(v) for k, v in offpolicy_metrics(old, rollout, mask).items()}
    xs = [0.2, -0.1, 0.3]
    assert found["chi2_token"] == pytest.approx(sum(math.exp(2 * x) for x in xs) / 3 - 1, rel=1e-5)
    assert found["chi2_seq"] == pytest.approx((math.exp(2 * 0.1) + math.exp(2 * 0.3)) / 2 - 1, rel=1e-5)
    assert found["training_ppl"] == pytest.approx((math.exp(1.5) + math.exp(0.5)) / 2, rel=1e-5)
    assert found["rollout_ppl"] == pytest.approx((math.exp(1.55) + math.exp(0.8)) / 2, rel=1e-5)
    assert found["log_ppl_diff"] == pytest.approx(((-1.55 + 1.5) + (-0.8 + 0.5)) / 2, rel=1e-5)
    assert found["log_ppl_abs_diff"] == pytest.approx((0.05 + 0.3) / 2, rel=1e-5)
    assert found["kl"] == pytest.approx(-sum(xs) / 3, rel=1e-5)
    extreme = offpolicy_metrics(old + 100.0, rollout, mask)                 # exp overflow: clamped at ±20
    assert all(math.isfinite(float(v)) for v in extreme.values())


def test_offpolicy_metrics_of_only_empty_responses_are_zero() -> None:
    # the χ² were mean(ρ²) − 1 = −1 here: a divergence below its minimum, 0
    found = offpolicy_metrics(torch.full((2, 3), -1.0), torch.full((2, 3), -3.0), torch.zeros(2, 3))
    assert {k: float(v) for k, v in found.items()} == {k: 0.0 for k in found}


# ------------------------------------------------------------------ composition, in order


def _batch(x: list[list[float]], mask: list[list[float]]) -> SimpleNamespace:
    old = torch.tensor(x)
    m = torch.tensor(mask)
    return SimpleNamespace(old_logp=old, rollout_logp=torch.zeros_like(old), advantages=torch.ones_like(old),
                           loss_mask=m.clone(), response_mask=m.clone(), correction_weights=None)


def _apply(corrections: str, batch: SimpleNamespace) -> dict[str, float]:
    resolved = load_config(REGISTRY, [f"rollout_correction={corrections}", "rollout.dtype=bfloat16"])
    return Corrections(resolved.plan.corrections, distributed.DistInfo()).apply_to_batch(batch)


ROW = [[LOG(3.0), 0.2, -0.3, 0.0, 5.0]]                                       # k2: 0.603, 0.02, 0.045, 0 (+ pad)
MASK = [[1.0, 1.0, 1.0, 1.0, 0.0]]
REJECT = "{name: rejection, estimator: k2, level: token, threshold: 0.03, mode: mask}"


def test_rejection_then_normalised_tis_sees_the_mask_the_rejection_left() -> None:
    batch = _batch(ROW, MASK)
    metrics = _apply(f"[{REJECT}, {{name: tis, normalize: true}}]", batch)
    assert batch.loss_mask.tolist() == [[0.0, 1.0, 0.0, 1.0, 0.0]]            # removed from the loss mask
    mean = (math.exp(0.2) + 1.0) / 2                                          # over the 2 kept tokens
    torch.testing.assert_close(batch.correction_weights,
                               torch.tensor([[0.0, math.exp(0.2) / mean, 0.0, 1.0 / mean, 0.0]]))
    assert metrics["rollout_correction/rejection/dropped_frac"] == pytest.approx(0.5)
    assert metrics["rollout_correction/tis/norm_factor"] == pytest.approx(mean)
    assert metrics["rollout_correction/loss_mask_frac"] == pytest.approx(0.5)


def test_normalised_tis_then_rejection_is_verls_order() -> None:
    batch = _batch(ROW, MASK)
    metrics = _apply(f"[{{name: tis, normalize: true}}, {REJECT}]", batch)    # tis normalises over all 4 tokens
    mean = (2.0 + math.exp(0.2) + math.exp(-0.3) + 1.0) / 4
    torch.testing.assert_close(batch.correction_weights,
                               torch.tensor([[0.0, math.exp(0.2) / mean, 0.0, 1.0 / mean, 0.0]]))
    assert metrics["rollout_correction/tis/norm_factor"] == pytest.approx(mean)


def test_weight_mode_multiplies_and_keeps_the_mask() -> None:
    batch = _batch(ROW, MASK)
    _apply("[{name: rejection, estimator: k2, level: token, threshold: 0.03}, {name: tis, cap: 2.5}]", batch)
    assert batch.loss_mask.tolist() == MASK                                   # weight 0 stays in the denominators
    torch.testing.assert_close(batch.correction_weights, torch.tensor([[0.0, math.exp(0.2), 0.0, 1.0, 0.0]]))


# ------------------------------------------------------------------ config, plan, explain


def test_a_list_of_corrections_resolves_in_order_with_sources() -> None:
    resolved = load_config(REGISTRY, ["rollout_correction=[icepop, {name: rejection, threshold: 0.05}, opmask]",
                                      "rollout.dtype=bfloat16"])
    assert [c.name for c, _ in resolved.corrections] == ["icepop", "rejection", "opmask"]
    assert resolved.corrections[1][1].threshold == 0.05
    assert resolved.sources["rollout_correction[1].threshold"] == "command line"
    assert resolved.sources["rollout_correction[1].level"] == "default of rollout_correction rejection"
    steps = resolved.plan.corrections
    assert [(s.name, s.stage, s.mode) for s in steps] == [
        ("icepop", "batch", "weight"), ("rejection", "batch", "weight"), ("opmask", "update", "weight")]
    text = resolved.plan.render()
    assert "1. icepop:" in text and "2. rejection:" in text and "3. opmask:" in text and "micro-batch" in text
    assert "changes the aggregation denominators" not in text


def test_single_choice_empty_list_and_bad_lists() -> None:
    assert [c.name for c, _ in load_config(REGISTRY, ["rollout_correction=tis"]).corrections] == ["tis"]
    assert load_config(REGISTRY, ["rollout_correction=[]"]).corrections == []
    # [] is documented as none (docs/config.md), as extensions=[] is no extension: the same plan
    assert load_config(REGISTRY, ["rollout_correction=[]"]).plan.render() == \
        load_config(REGISTRY, ["rollout_correction=none"]).plan.render()
    assert load_config(REGISTRY, []).corrections == [] and load_config(REGISTRY, []).plan.corrections == ()
    with pytest.raises(ConfigError, match="names tis more than once"):
        load_config(REGISTRY, ["rollout_correction=[tis, tis]"])
    with pytest.raises(ConfigError, match="none is no correction"):
        load_config(REGISTRY, ["rollout_correction=[none, tis]"])
    with pytest.raises(ConfigError, match=re.escape("rollout_correction[1]")):
        load_config(REGISTRY, ["rollout_correction=[tis, nope]"])


def test_mask_mode_is_stated_in_the_plan() -> None:
    plan = load_config(REGISTRY, [f"rollout_correction=[{REJECT}]", "rollout.dtype=bfloat16",
                                  "trainer.entropy_coef=0.01"]).plan
    assert plan.corrections[0].mode == "mask"
    assert "changes the aggregation denominators: policy, kl, entropy count only" in plan.render()


def test_explain_lists_each_correction_parameter_and_the_eval_keys_with_sources() -> None:
    resolved = load_config(REGISTRY, ["rollout_correction=[icepop, {name: rejection, threshold: 0.05}]",
                                      "eval.size=0"])
    text = explain(resolved, REGISTRY)
    rows = {line.split()[0]: line for line in text.splitlines() if line and not line.startswith("#")}
    assert "[command line]" in rows["rollout_correction[1].threshold"]
    assert "0.05" in rows["rollout_correction[1].threshold"]
    assert "[default of rollout_correction rejection]" in rows["rollout_correction[1].level"]
    assert "[command line]" in rows["rollout_correction[0].name"]
    assert "[default of rollout_correction icepop]" in rows["rollout_correction[0].high"]
    assert "eval.every" in rows and "(unused: eval.size = 0: no evaluation)" in rows["eval.every"]
    single = explain(load_config(REGISTRY, ["rollout_correction={name: tis, cap: 3}"]), REGISTRY)
    assert re.search(r"^rollout_correction\.cap\s+3\.0\s+\[command line\]", single, flags=re.M)


def test_bypass_drops_the_old_log_prob_pass() -> None:
    plan = load_config(REGISTRY, ["trainer.old_logp=rollout", "rollout.dtype=bfloat16"]).plan
    assert plan.bypass and "old_logp" not in plan.passes and not plan.update.on_policy
    assert "old log-probs: the rollout's (trainer.old_logp=rollout, bypass)" in plan.render()
    assert "old_logp" in load_config(REGISTRY, ["rollout.dtype=bfloat16"]).plan.passes
    on_policy = load_config(REGISTRY, ["trainer.old_logp=rollout", "rollout.dtype=bfloat16",
                                       "trainer.num_mini_batches=1"]).plan
    assert not any("exactly 1" in w for w in on_policy.warnings)             # the ratio is π/μ
    load_config(REGISTRY, ["trainer.old_logp=rollout", "rollout_correction=opmask"])   # reads π, not π_old
    # a correction that reads π_old compares π with μ instead: tests/test_bypass.py
    with pytest.raises(ConfigError, match="invalid value for trainer.old_logp"):
        load_config(REGISTRY, ["trainer.old_logp=fresh"])


# ------------------------------------------------------------------ a run


@pytest.mark.slow
def test_a_composed_run_logs_each_correction_and_the_offpolicy_metrics(tmp_path: Path) -> None:
    from rlzoo.run.trainer import Trainer

    resolved = load_config(REGISTRY, [*TINY, "rollout.dtype=bfloat16", f"run_dir={tmp_path}", "eval.size=0",
                                      "rollout_correction=[{name: icepop, low: 0.999, high: 1.001}, "
                                      "{name: rejection, level: token, threshold: 1e-7, mode: mask}, opmask]"])
    trainer = Trainer(engine_input(resolved), PM)
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close()
    for key in ("icepop/dropped_frac", "rejection/dropped_frac", "opmask/dropped_seq_frac", "loss_mask_frac"):
        assert f"rollout_correction/{key}" in metrics, key
    assert 0 < metrics["rollout_correction/rejection/dropped_frac"] < 1
    assert metrics["rollout_correction/loss_mask_frac"] == pytest.approx(
        1 - metrics["rollout_correction/rejection/dropped_frac"], abs=1e-6)
    for key in ("chi2_token", "chi2_seq", "training_ppl", "rollout_ppl", "log_ppl_diff"):
        assert math.isfinite(metrics[f"rollout/{key}"]), key
    assert metrics["rollout/chi2_token"] > 0


@pytest.mark.slow
def test_a_bypass_run_takes_the_rollout_log_probs_as_old(tmp_path: Path) -> None:
    from rlzoo.run.trainer import Trainer

    resolved = load_config(REGISTRY, [*TINY, "rollout.dtype=bfloat16", f"run_dir={tmp_path}", "eval.size=0",
                                      "trainer.old_logp=rollout", "trainer.num_mini_batches=2", "kl.coef=0"])
    trainer = Trainer(engine_input(resolved), PM)
    try:
        batch = trainer.sampler.sample(trainer.ctx.prompts)
        metrics = trainer.learn(batch)
    finally:
        trainer.close()
    assert batch.old_logp is batch.rollout_logp and "rollout/mismatch_k3" not in metrics
    assert metrics["policy/approx_kl"] != 0.0                                  # π (fp32) vs μ (bf16) from step one


def test_a_run_saved_before_trainer_old_logp_existed_resumes_unchanged(tmp_path: Path) -> None:
    import yaml
    from omegaconf import OmegaConf

    from rlzoo.run.resume import load_run_config
    from rlzoo.run.rundir import CONFIG_FILE, PLAN_FILE

    saved = OmegaConf.to_container(load_config(REGISTRY, [f"run_dir={tmp_path}"]).cfg)
    del saved["trainer"]["old_logp"]
    (tmp_path / CONFIG_FILE).write_text(yaml.safe_dump(saved))
    (tmp_path / PLAN_FILE).write_text("# run plan\n")
    resolved = load_run_config(REGISTRY, [f"resume={tmp_path}"])
    assert resolved.cfg.trainer.old_logp == "compute" and resolved.resume_changes == {}


@pytest.mark.slow
def test_two_ranks_normalise_and_reject_over_the_global_batch(tmp_path: Path) -> None:
    """The batch-stage corrections' reductions (tis's batch normalisation, the rejection's
    loss-mask narrowing and its metrics) under DDP equal one process on the whole batch."""
    import json
    import os
    import subprocess
    import sys

    from rlzoo.run.trainer import Trainer

    args = ["task.num_digits=3", "rollout.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=5",
            "trainer.micro_batch_size=3", "trainer.num_mini_batches=1", "trainer.lr=0.001", "logging.progress=false",
            "model.hidden_size=32", "model.intermediate_size=64", "loss_agg=seq-mean-token-mean", "eval.size=0",
            "rollout.dtype=bfloat16", "rollout_correction=[{name: tis, normalize: true, cap: 1.0005}, "
            "{name: rejection, level: token, threshold: 1e-7, mode: mask}]"]
    trainer = Trainer(load_run(REGISTRY, [*args, f"run_dir={tmp_path / 'one'}"]), PM)
    batch = trainer.sampler.sample(4)
    scores = torch.rand(len(batch), generator=torch.Generator().manual_seed(7))
    batch.scores, batch.rewards = scores, scores.clone()
    torch.save(batch, tmp_path / "batch.pt")
    want = trainer.learn(batch)
    params = {k: v.detach().clone() for k, v in trainer.models.policy.named_parameters()}
    trainer.close()
    assert 0 < want["rollout_correction/rejection/dropped_frac"] < 1 and want["rollout_correction/tis/norm_factor"] != 1
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps([{"overrides": [*args, f"run_dir={tmp_path / 'dp'}"],
                                 "batch": str(tmp_path / "batch.pt"), "out": str(tmp_path / "dp.out")}]))
    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"} | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(Path(__file__).with_name("dist_worker.py")), str(spec)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    got = torch.load(tmp_path / "dp.out", weights_only=False)
    for key, value in want.items():
        if key.startswith("rollout_correction/"):
            assert got["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    for key, param in params.items():
        assert (got["params"][key] - param).abs().max() <= 1e-5, key
