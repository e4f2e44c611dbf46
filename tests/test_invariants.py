"""Every registered estimator, loss, KL estimator and aggregation passes rlzoo.testing's
shared invariants; and the checks themselves catch broken components."""

from __future__ import annotations

import pytest
import torch

from rlzoo.plugins import build_registry, make_plugin_manager
from rlzoo.testing import (
    check_advantage_estimator,
    check_component,
    check_kl_penalty,
    check_loss_aggregation,
    check_policy_loss,
)

REGISTRY = build_registry(make_plugin_manager())
COMPONENTS = [c for kind in ("advantage", "policy_loss", "kl_penalty", "loss_agg")
              for c in REGISTRY.components(kind)]


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: f"{c.kind}:{c.name}")
def test_registered_component_keeps_the_invariants(component) -> None:
    check_component(component)


def test_every_family_is_covered() -> None:
    kinds = {c.kind for c in COMPONENTS}
    assert kinds == {"advantage", "policy_loss", "kl_penalty", "loss_agg"}


def _metrics():
    return {"clipfrac": torch.tensor(0.0), "approx_kl": torch.tensor(0.0)}


def test_checks_catch_a_loss_that_leaks_padding() -> None:
    def leaky(logp, old, adv, mask):
        return -adv * logp + logp.sum(-1, keepdim=True) * 0.01, _metrics()   # row sum includes padding
    with pytest.raises(AssertionError, match="gradient at masked positions|masked positions change"):
        check_policy_loss(leaky, "leaky")


def test_checks_catch_gradient_into_advantages() -> None:
    def no_detach(logp, old, adv, mask):
        return -adv * torch.exp(logp - old.detach()), _metrics()
    with pytest.raises(AssertionError, match="gradient flows into advantages"):
        check_policy_loss(no_detach, "no_detach")


def test_checks_catch_nan_on_extreme_ratios() -> None:
    def unclamped(logp, old, adv, mask):
        ratio = torch.exp(2 * (logp - old.detach()))   # exp(100) overflows float32
        return torch.where(mask.bool(), -adv.detach() * ratio, torch.zeros_like(ratio)), _metrics()
    with pytest.raises(AssertionError, match="non-finite"):
        check_policy_loss(unclamped, "unclamped")


def test_checks_catch_per_micro_batch_normalisation() -> None:
    def local_mean(loss, mask, counts=None):
        return (loss * mask).sum() / mask.sum().clamp(min=1)               # ignores counts
    with pytest.raises(AssertionError, match="micro-batch sum"):
        check_loss_aggregation(local_mean, "local_mean")


def test_checks_catch_advantages_on_padding_and_nan_groups() -> None:
    def raw(token_rewards, mask, group_ids, values, baseline):
        return token_rewards + 1.0, token_rewards
    with pytest.raises(AssertionError, match="padding"):
        check_advantage_estimator(raw, "raw")

    def nan_std(token_rewards, mask, group_ids, values, baseline):
        scores = (token_rewards * mask).sum(-1)
        adv = (scores - scores.mean()) / scores.std()
        return adv[:, None] * mask, adv[:, None] * mask
    with pytest.raises(AssertionError, match="non-finite"):
        check_advantage_estimator(nan_std, "nan_std")


def test_checks_catch_kl_gradient_into_reference() -> None:
    with pytest.raises(AssertionError, match="ref_logp"):
        check_kl_penalty(lambda logp, ref: (logp - ref) ** 2, "sq")
