"""Rollout corrections (kind ``rollout_correction``): hand-computed weights, the invariants,
the docs page, and their effect in a run whose rollout samples from a bf16 copy."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from rlzoo.config.params import build_params
from rlzoo.plan.run_input import engine_input
from rlzoo.plan.planner import load_config
from rlzoo.core.errors import ConfigError
from rlzoo.contract.loading import build_registry, make_plugin_manager, module_plugin
from rlzoo.api import check_component
from zoo import PM as REGISTRY_PM
from zoo import REGISTRY, builtin_names

DOC = Path(__file__).parents[1] / "docs" / "algorithms" / "corrections.md"
NAMES = builtin_names("rollout_correction")
LOG = math.log


def call(name: str, old, rollout, mask=None, logp=None, advantages=None, **params):
    mask = torch.ones_like(old) if mask is None else mask
    return REGISTRY.get("rollout_correction", name)(
        old_logp=old, rollout_logp=rollout, logp=old if logp is None else logp,
        advantages=torch.ones_like(old) if advantages is None else advantages, response_mask=mask, **params)


def test_tis_truncates_the_ratio_at_the_cap() -> None:
    # π_old/μ = 0.5, 1, 3 (and padding): w = min(r, 2)
    old = torch.tensor([[LOG(0.5), 0.0, LOG(3.0), 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    weights, metrics = call("tis", old, torch.zeros(1, 4), mask)
    assert weights.tolist() == [pytest.approx([0.5, 1.0, 2.0, 0.0])]
    assert metrics["truncated_frac"].item() == pytest.approx(1 / 3)
    assert metrics["weight_mean"].item() == pytest.approx(3.5 / 3) and metrics["dropped_frac"] == 0
    weights, _ = call("tis", old, torch.zeros(1, 4), mask, cap=5.0)
    assert weights[0, 2].item() == pytest.approx(3.0)


def test_icepop_keeps_the_ratio_inside_the_band_and_zeroes_the_rest() -> None:
    old = torch.tensor([[LOG(0.4), LOG(0.5), LOG(2.0), LOG(5.0), LOG(6.0)]])
    weights, metrics = call("icepop", old, torch.zeros(1, 5))
    assert weights.tolist() == [pytest.approx([0.0, 0.5, 2.0, 5.0, 0.0])]       # bounds inclusive
    assert metrics["dropped_frac"].item() == pytest.approx(0.4)


def test_seq_is_mask_drops_whole_sequences_by_geometric_or_product_ratio() -> None:
    # sequence 0: x = (0.0005, 0.0005) -> mean 5e-4 (geo 1.0005 inside [0.999, 1.001]), sum 1e-3
    # sequence 1: x = (0.002, 0.0)     -> mean 1e-3 (geo 1.001001 > 1.001: dropped), sum 2e-3
    # sequence 2: x = (1.0, -0.5)      -> sum 0.5 (product 1.65 inside [0.5, 2]), mean 0.25: dropped (geo)
    old = torch.tensor([[5e-4, 5e-4], [2e-3, 0.0], [1.0, -0.5]], dtype=torch.float64)
    rollout = torch.zeros_like(old)
    weights, metrics = call("seq_is_mask", old, rollout)
    assert weights.tolist() == [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    assert metrics["dropped_seq_frac"].item() == pytest.approx(2 / 3)
    weights, _ = call("seq_is_mask", old, rollout, aggregate="product")
    assert weights.tolist() == [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
    weights, _ = call("seq_is_mask", old, rollout, aggregate="product", high=1.5)
    assert weights.tolist() == [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]


def test_opmask_drops_negative_sequences_that_drifted_from_the_rollout() -> None:
    # mean log μ − log π: sequence 0: 0.3 (A < 0: dropped), 1: 0.3 (A > 0: kept), 2: 0 (kept)
    rollout = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    logp = torch.tensor([[-0.2, -0.4], [-0.2, -0.4], [0.0, 0.0]])
    advantages = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [-1.0, -1.0]])
    weights, metrics = call("opmask", rollout.clone(), rollout, logp=logp, advantages=advantages)
    assert weights.tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
    assert metrics["dropped_seq_frac"].item() == pytest.approx(1 / 3)
    weights, _ = call("opmask", rollout.clone(), rollout, logp=logp, advantages=advantages, delta=0.5)
    assert weights.sum().item() == 6.0


@pytest.mark.parametrize("name, given, fragment", [
    ("tis", {"cap": 0.0}, "cap must be > 0"),
    ("icepop", {"low": 2.0, "high": 1.0}, "need 0 < low < high"),
    ("seq_is_mask", {"aggregate": "mean"}, "aggregate must be one of geometric, product"),
    ("seq_is_mask", {"low": 1.5}, "need 0 < low < high"),
    ("opmask", {"delta": 0.0}, "delta must be > 0"),
])
def test_parameters_are_validated(name: str, given: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        build_params(REGISTRY.get("rollout_correction", name), given)


def test_the_plan_runs_old_log_probs_for_corrections_and_warns_when_there_is_no_gap() -> None:
    plan = load_config(REGISTRY, ["rollout_correction=tis", "trainer.num_mini_batches=1", "kl.coef=0"]).plan
    assert "old_logp" in plan.passes and "rollout_correction tis" in plan.passes["old_logp"]
    assert any("rollout.dtype=bfloat16" in w for w in plan.warnings)
    plan = load_config(REGISTRY, ["rollout_correction=tis", "rollout.dtype=bfloat16"]).plan
    assert not any("rollout_correction" in w for w in plan.warnings) and "rollout" in plan.models
    assert "1. tis: weights the per-token policy loss" in plan.render()


@pytest.mark.slow
def test_a_bf16_rollout_is_a_real_gap_that_the_corrections_see(tmp_path: Path) -> None:
    from rlzoo.run.trainer import Trainer

    resolved = load_config(REGISTRY, ["rollout.dtype=bfloat16", "rollout_correction={name: tis, cap: 1.001}",
                                      f"run_dir={tmp_path}", "logging.progress=false"])
    trainer = Trainer(engine_input(resolved), REGISTRY_PM)
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close()
    assert metrics["rollout/max_abs_log_ratio"] > 1e-4                       # bf16 vs float32 log-probs
    assert 0 < metrics["rollout_correction/tis/truncated_frac"] < 1          # some ratios above 1.001
    assert metrics["rollout_correction/tis/weight_mean"] != 1.0


def test_docs_page_names_every_correction_and_its_parameters() -> None:
    text = DOC.read_text()
    for name in NAMES:
        component = REGISTRY.get("rollout_correction", name)
        assert f"## `{name}`" in text, name
        for field in (component.params.__dataclass_fields__ if component.params else ()):
            assert f"`{field}`" in text, (name, field)



def test_the_docs_example_correction_registers_passes_the_checks_and_clips_both_sides() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    example = next(block for block in blocks if "def rlzoo_register_rollout_corrections" in block)
    namespace: dict = {}
    exec(compile(example, str(DOC), "exec"), namespace)
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(module_plugin(rlzoo_register_rollout_corrections=namespace["rlzoo_register_rollout_corrections"]),
                name="docs-example")
    component = build_registry(pm).get("rollout_correction", "clip_both")
    check_component(component)
    old = torch.tensor([[0.0, 2.0, -2.0, 0.1]])               # log π_old − log μ = each value (rollout 0)
    weights, _ = component.bind(None)(old_logp=old, rollout_logp=torch.zeros_like(old),
                                      response_mask=torch.tensor([[1.0, 1.0, 1.0, 0.0]]))
    torch.testing.assert_close(weights, torch.tensor([[1.0, 2.0, 0.5, 0.0]]))



def test_geo_mean_takes_the_weights_itself_and_the_plan_says_so() -> None:
    """A per-sequence loss (it names ``correction_weights``) folds the weights in itself."""
    plan = load_config(REGISTRY, ["rollout_correction=icepop", "policy_loss=geo_mean",
                                  "loss_agg=seq-mean-token-mean", "rollout.dtype=bfloat16"]).plan
    assert plan.correction_in_loss
    assert "the policy loss takes the weights itself" in plan.render()
    plan = load_config(REGISTRY, ["rollout_correction=icepop", "rollout.dtype=bfloat16"]).plan
    assert not plan.correction_in_loss and "the policy loss takes the weights itself" not in plan.render()


def _zero_weights(response_mask):
    return torch.zeros_like(response_mask, dtype=torch.float32), {}


def _reinforce_ignoring_weights(logp, old_logp, advantages, response_mask, correction_weights):
    valid = response_mask.bool()
    loss = torch.where(valid, -advantages.detach() * logp, torch.zeros_like(logp))
    zero = torch.zeros((), dtype=logp.dtype)
    return loss, {"clipfrac": zero, "approx_kl": zero}


@pytest.mark.slow
@pytest.mark.parametrize("loss, moves", [("vanilla_pg", False), ("probe_in_loss", True)])
def test_the_engine_multiplies_the_weights_only_into_losses_that_do_not_take_them(
        tmp_path: Path, loss: str, moves: bool) -> None:
    """Weights of 0 everywhere: multiplied into vanilla_pg's per-token loss they stop every
    gradient (the policy does not move); handed to a loss that names correction_weights
    (which here ignores them) they are not multiplied in, so the policy moves."""
    from rlzoo.run.trainer import Trainer
    from zoo import TINY

    def register_loss(register):
        register("probe_in_loss", _reinforce_ignoring_weights, paper="arXiv:0000.00000", description="probe")

    def register_correction(register):
        register("zero_weights", _zero_weights, description="probe: weight 0 on every token")

    plugin = module_plugin(rlzoo_register_policy_losses=register_loss,
                           rlzoo_register_rollout_corrections=register_correction)
    pm = make_plugin_manager()
    pm.register(plugin, name="probe")
    try:
        resolved = load_config(build_registry(pm), [*TINY, f"policy_loss={loss}", "rollout_correction=zero_weights",
                                                    "kl.coef=0", "eval.size=0", f"run_dir={tmp_path / loss}"])
        assert resolved.plan.correction_in_loss is moves
        trainer = Trainer(engine_input(resolved), pm)
        try:
            before = [p.detach().clone() for p in trainer.models.policy.parameters()]
            trainer.train_step()
            after = list(trainer.models.policy.parameters())
        finally:
            trainer.close()
    finally:
        pm.unregister(plugin)
    changed = any(not torch.equal(b, a.detach()) for b, a in zip(before, after))
    assert changed is moves
