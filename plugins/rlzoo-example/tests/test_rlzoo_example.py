"""Tests of the example plugin: hand-computed values plus rlzoo's shared invariants."""

import pytest
import torch

from rlzoo.api import build_params, build_registry, check_component, ConfigError, make_plugin_manager

REGISTRY = build_registry(make_plugin_manager())


@pytest.mark.parametrize("kind, name", [("advantage", "rank_grpo"), ("policy_loss", "ppo_penalty")])
def test_shared_invariants(kind, name):
    component = REGISTRY.get(kind, name)
    assert component.package == "rlzoo-example"
    check_component(component)


def test_rank_grpo_hand_computed():
    rank_grpo = REGISTRY.get("advantage", "rank_grpo")
    rewards = torch.tensor([[0.0, 1.0], [0.0, 3.0], [0.0, 1.0], [0.0, 5.0]])
    mask = torch.ones(4, 2)
    adv, _ = rank_grpo(token_rewards=rewards, response_mask=mask, group_ids=torch.tensor([0, 0, 0, 1]))
    # group 0 scores 1, 3, 1: ranks 0.5, 2, 0.5 of n=3 -> 2*rank/2 - 1 = -0.5, 1, -0.5
    assert adv[:, 0].tolist() == [-0.5, 1.0, -0.5, 0.0]


def test_ppo_penalty_hand_computed_and_validated():
    loss_fn = REGISTRY.get("policy_loss", "ppo_penalty")
    logp = torch.tensor([[0.0, 0.0]])
    old = torch.tensor([[0.0, -1.0]])                 # ratios 1 and e
    adv = torch.tensor([[2.0, 1.0]])
    loss, _ = loss_fn(logp, old, adv, torch.ones(1, 2), beta=0.5)
    e = torch.e
    assert loss[0, 0].item() == pytest.approx(-2.0)
    assert loss[0, 1].item() == pytest.approx(-e + 0.5 * (e - 1 - 1))
    with pytest.raises(ConfigError, match="beta must be >= 0"):
        build_params(loss_fn, {"beta": -1})
