"""Every registered component of a checked kind passes rlzoo.testing's shared invariants;
and the checks themselves catch broken components."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import zoo
from rlzoo.testing import component_checks as testing
from rlzoo.contract.kinds import KINDS
from rlzoo.api import (
    CHECKED_KINDS,
    check_advantage_estimator,
    check_component,
    check_kl_estimator,
    check_loss_aggregation,
    check_policy_loss,
    check_value_loss,
)

ROOT = Path(__file__).parents[1]
REGISTRY = zoo.REGISTRY
COMPONENTS = [c for kind in CHECKED_KINDS for c in REGISTRY.components(kind)]



TASK_PARAMS = {"reasoning_gym": {"dataset": "basic_arithmetic"}}
"""Parameters of the built-in tasks that have required ones (besides the file task's file)."""


def _inputs(component, tmp_path) -> dict:
    """What a component's checks need besides the defaults: a file for the file task, the
    required parameters of a task, the tools env's tools, a model directory for reward_model, the task whose
    default reward a reward is (its references or rows may not be strings)."""
    if component.kind == "task" and component.name == "file":
        (tmp_path / "d.jsonl").write_text("".join(f'{{"prompt": "{i}=", "answer": "{i}"}}\n' for i in range(20)))
        return {"params": {"path": str(tmp_path / "d.jsonl")}}
    if component.kind == "environment" and component.name == "tools":  # offers the tools it names
        return {"params": {"tools": ["calculator"]}}
    if component.kind == "task" and component.name in TASK_PARAMS:
        return {"params": TASK_PARAMS[component.name]}
    if component.kind == "reward" and component.name == "reward_model":  # scores with a model directory
        zoo.tiny_reward_model(tmp_path / "rm")
        return {"params": {"path": str(tmp_path / "rm")}}
    if component.kind == "reward":
        tasks = [t for t in REGISTRY.components("task") if t.meta.get("reward") == component.name and t.name != "file"]
        if not tasks:
            return {}
        params = tasks[0].params(**TASK_PARAMS.get(tasks[0].name, {})) if tasks[0].params else None
        return {"task": tasks[0].bind(params)()}
    return {}


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: f"{c.kind}:{c.name}")
def test_registered_component_keeps_the_invariants(component, tmp_path) -> None:
    check_component(component, **_inputs(component, tmp_path))


def test_every_kind_is_checked_here_or_named_with_where_it_is_tested() -> None:
    """A new kind in the contract fails this until it has invariant checks or a named test."""
    assert set(CHECKED_KINDS) == set(testing.KIND_CHECKS)
    for kind in KINDS.values():
        if kind.name not in CHECKED_KINDS:
            test_file = ROOT / kind.tested_in.split(" ")[0]
            assert test_file.is_file(), f"kind {kind.name}: {kind.tested_in} names no test file"
    for kind in CHECKED_KINDS:
        assert REGISTRY.components(kind), f"no registered {kind} to check"


def test_check_component_accepts_a_dict_of_params() -> None:
    check_component(REGISTRY.get("policy_loss", "ppo_clip"), {"clip_high": 0.28})
    with pytest.raises(Exception, match="clip_low"):
        check_component(REGISTRY.get("policy_loss", "ppo_clip"), {"clip_low": 2.0})


def _metrics():
    return {"clipfrac": torch.tensor(0.0), "approx_kl": torch.tensor(0.0)}


def test_checks_catch_a_loss_that_leaks_padding() -> None:
    def leaky(logp, old_logp, advantages, response_mask):
        return -advantages * logp + logp.sum(-1, keepdim=True) * 0.01, _metrics()   # row sum includes padding
    with pytest.raises(AssertionError, match="gradient at masked positions|masked positions change"):
        check_policy_loss(leaky, "leaky")


def test_checks_catch_gradient_into_advantages() -> None:
    def no_detach(logp, old_logp, advantages, response_mask):
        return -advantages * torch.exp(logp - old_logp.detach()), _metrics()
    with pytest.raises(AssertionError, match="gradient flows into advantages"):
        check_policy_loss(no_detach, "no_detach")


def test_checks_catch_nan_on_extreme_ratios() -> None:
    def unclamped(logp, old_logp, advantages, response_mask):
        ratio = torch.exp(2 * (logp - old_logp.detach()))   # exp(100) overflows float32
        return (torch.where(response_mask.bool(), -advantages.detach() * ratio, torch.zeros_like(ratio)),
                _metrics())
    with pytest.raises(AssertionError, match="non-finite"):
        check_policy_loss(unclamped, "unclamped")


def test_checks_catch_a_loss_of_the_wrong_shape_or_without_metrics() -> None:
    def per_sequence(logp, advantages, response_mask):
        return (-advantages * logp).sum(-1, keepdim=True), _metrics()          # (B, 1)
    with pytest.raises(AssertionError, match="loss shape"):
        check_policy_loss(per_sequence, "per_sequence")

    def no_metrics(logp, advantages, response_mask):
        return -advantages.detach() * logp * response_mask, {}
    with pytest.raises(AssertionError, match="clipfrac"):
        check_policy_loss(no_metrics, "no_metrics")


def test_checks_catch_per_micro_batch_normalisation() -> None:
    def local_mean(loss, mask, counts=None):
        return (loss * mask).sum() / mask.sum().clamp(min=1)               # ignores counts
    with pytest.raises(AssertionError, match="micro-batch sum"):
        check_loss_aggregation(local_mean, "local_mean")


def test_checks_catch_advantages_on_padding_and_nan_groups() -> None:
    def raw(token_rewards, response_mask):
        return token_rewards + 1.0, token_rewards
    with pytest.raises(AssertionError, match="padding"):
        check_advantage_estimator(raw, "raw")

    def nan_std(token_rewards, response_mask):
        scores = (token_rewards * response_mask).sum(-1)
        adv = (scores - scores.mean()) / scores.std()
        return adv[:, None] * response_mask, adv[:, None] * response_mask
    with pytest.raises(AssertionError, match="non-finite"):
        check_advantage_estimator(nan_std, "nan_std")


def test_checks_catch_kl_gradient_into_reference() -> None:
    with pytest.raises(AssertionError, match="ref_logp"):
        check_kl_estimator(lambda logp, ref_logp: (logp - ref_logp) ** 2, "sq")


def test_checks_catch_a_logits_kl_that_is_not_zero_or_leaks_into_the_reference() -> None:
    def l2(logits, ref_logits):
        return (logits - ref_logits).square().mean(-1) + 1e-3                # not 0 when equal
    with pytest.raises(AssertionError, match="identical policies"):
        check_kl_estimator(l2, "l2")

    def both_sides(logits, ref_logits):
        return (logits.softmax(-1) - ref_logits.softmax(-1)).square().sum(-1)
    with pytest.raises(AssertionError, match="ref_logits"):
        check_kl_estimator(both_sides, "both_sides")


def test_checks_catch_value_loss_faults() -> None:
    def offset(values, returns, response_mask):
        return (values - returns.detach()).square() + 0.01, {}
    with pytest.raises(AssertionError, match="values equal the returns"):
        check_value_loss(offset, "offset")

    def leaky(values, returns, response_mask):          # each row's loss sees the row's padded values
        return (values - returns.detach()).square() + 0.01 * (values - returns.detach()).sum(-1, keepdim=True), {}
    with pytest.raises(AssertionError, match="gradient at masked positions"):
        check_value_loss(leaky, "leaky")

    def into_returns(values, returns, response_mask):
        loss = (values - returns).square()
        return torch.where(response_mask.bool(), loss, torch.zeros_like(loss)), {}
    with pytest.raises(AssertionError, match="gradient flows into returns"):
        check_value_loss(into_returns, "into_returns")
