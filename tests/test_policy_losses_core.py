"""Policy losses against hand-computed values and per-element formulas (ALGORITHMS.md).

Expected values are computed here, element by element in plain Python, never by calling
the plugin; the shared invariants (masks, padding width, ±50 log-ratios, gradient flow)
run for every loss in tests/test_invariants.py.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from rlzoo.config import build_params
from rlzoo.errors import ConfigError
from rlzoo.plugins import build_registry, make_plugin_manager

REG = build_registry(make_plugin_manager())


def loss_of(name: str, logp, old, adv, mask=None, **params):
    mask = torch.ones_like(logp) if mask is None else mask
    return REG.get("policy_loss", name)(logp, old, adv, mask, **params)


def ratio_py(lp: float, old: float) -> float:
    return math.exp(max(-20.0, min(20.0, lp - old)))


def ppo_py(lp, old, a, lo=0.2, hi=0.2, delta=None) -> float:
    r = ratio_py(lp, old)
    unclipped_r = min(r, delta) if (delta is not None and a < 0) else r
    return max(-a * unclipped_r, -a * min(max(r, 1 - lo), 1 + hi))


def sapo_py(lp, old, a, tau_pos, tau_neg) -> float:
    tau = tau_pos if a > 0 else tau_neg
    return -a * (4 / tau) / (1 + math.exp(-tau * (ratio_py(lp, old) - 1)))


def random_inputs(seed: int, b: int = 5, t: int = 7):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 3
    logp = old + torch.randn(b, t, generator=gen, dtype=torch.float64) * 0.4
    adv = torch.randn(b, t, generator=gen, dtype=torch.float64)
    mask = (torch.rand(b, t, generator=gen) > 0.25).double()
    return logp, old, adv, mask


# ------------------------------------------------------------------------------ hand-computed


def test_ppo_clip_hand_computed_and_metrics() -> None:
    # ratios: 1, e^0.5 = 1.6487 (clipped to 1.2 for A>0), e^-0.5 = 0.6065 (clip 0.8 for A<0)
    logp = torch.tensor([[0.0, 0.5, -0.5, 0.5]])
    old = torch.zeros(1, 4)
    adv = torch.tensor([[2.0, 1.0, -1.0, -1.0]])
    loss, metrics = loss_of("ppo_clip", logp, old, adv)
    expected = [-2.0, -1.2, 0.8, math.exp(0.5)]   # last: A<0, ratio 1.65: max(1.65, 1.2) = 1.65
    assert loss[0].tolist() == pytest.approx(expected, rel=1e-6)
    assert metrics["clipfrac"].item() == pytest.approx(0.5)          # tokens 2 and 3
    assert metrics["approx_kl"].item() == pytest.approx(-(0.5 - 0.5 + 0.5) / 4)


def test_ppo_clip_with_ratio_one_is_minus_advantage() -> None:
    logp, _, adv, mask = random_inputs(0)
    loss, metrics = loss_of("ppo_clip", logp, logp.clone(), adv, mask)
    assert torch.allclose(loss, -adv * mask)
    assert metrics["clipfrac"].item() == 0 and metrics["approx_kl"].item() == 0


def test_clip_higher_is_asymmetric() -> None:
    logp = torch.tensor([[math.log(1.25), math.log(0.75)]])
    loss, _ = loss_of("ppo_clip", logp, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]),
                      clip_low=0.2, clip_high=0.28)
    assert loss[0].tolist() == pytest.approx([-1.25, 0.8])     # 1.25 < 1.28: not clipped


def test_ppo_clip_delta_bounds_negative_advantages() -> None:
    logp = torch.tensor([[3.0, 3.0]])                          # ratio e^3 = 20.1
    adv = torch.tensor([[-1.0, 1.0]])
    plain, _ = loss_of("ppo_clip", logp, torch.zeros(1, 2), adv)
    bounded, _ = loss_of("ppo_clip", logp, torch.zeros(1, 2), adv, delta=4.0)
    assert plain[0, 0].item() == pytest.approx(math.exp(3))
    assert bounded[0].tolist() == pytest.approx([4.0, -1.2])   # A>0 unaffected
    with pytest.raises(ConfigError, match=re.escape("delta must be > 1 + clip_high")):
        build_params(REG.get("policy_loss", "ppo_clip"), {"delta": 1.1})


def test_dual_clip_hand_computed() -> None:
    logp = torch.tensor([[2.0, 2.0, 0.1]])                    # ratios 7.39, 7.39, 1.105
    adv = torch.tensor([[-1.0, 1.0, -2.0]])
    loss, metrics = loss_of("dual_clip", logp, torch.zeros(1, 3), adv, clip_ratio_c=3.0)
    assert loss[0].tolist() == pytest.approx([3.0, -1.2, 2 * math.exp(0.1)], rel=1e-6)
    assert metrics["clipfrac_lower"].item() == pytest.approx(1 / 3)


def test_dual_clip_equals_ppo_clip_for_non_negative_advantages() -> None:
    logp, old, adv, mask = random_inputs(1)
    adv = adv.abs()
    a, _ = loss_of("dual_clip", logp, old, adv, mask)
    b, _ = loss_of("ppo_clip", logp, old, adv, mask)
    assert torch.equal(a, b)


@pytest.mark.parametrize("c", [1.0, 0.5])
def test_dual_clip_rejects_c_not_above_one(c: float) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"clip_ratio_c must be > 1, got {c}")):
        build_params(REG.get("policy_loss", "dual_clip"), {"clip_ratio_c": c})


def test_vanilla_pg_is_minus_a_logp_and_its_gradient() -> None:
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = loss_of("vanilla_pg", logp, torch.zeros(1, 2), torch.tensor([[0.5, -1.0]]))
    assert loss[0].tolist() == pytest.approx([0.5, -2.0])
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.5, 1.0])


def test_cispo_gradient_is_clipped_weight_times_advantage() -> None:
    old = torch.zeros(1, 3)
    logp = torch.tensor([[0.1, 1.0, -0.3]], requires_grad=True)      # ratios 1.105, 2.718, 0.741
    adv = torch.tensor([[1.0, 2.0, -1.0]])
    loss, metrics = loss_of("cispo", logp, old, adv, clip_low=1.0, clip_high=0.28)
    weights = [math.exp(0.1), 1.28, math.exp(-0.3)]
    assert loss[0].tolist() == pytest.approx([-w * a * lp for w, a, lp in
                                              zip(weights, [1.0, 2.0, -1.0], [0.1, 1.0, -0.3])], rel=1e-6)
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-w * a for w, a in zip(weights, [1.0, 2.0, -1.0])], rel=1e-6)
    assert metrics["clipfrac"].item() == pytest.approx(1 / 3)


def test_gspo_value_is_the_sequence_ratio_and_gradient_per_token() -> None:
    old = torch.zeros(2, 3)
    logp = torch.tensor([[1e-4, 2e-4, 9.0], [5e-4, 5e-4, 5e-4]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    loss, metrics = loss_of("gspo", logp, old, adv, mask)
    s0, s1 = math.exp(1.5e-4), math.exp(5e-4)                 # row 1 clipped at 1 + 4e-4
    assert loss[0, :2].tolist() == pytest.approx([-s0, -s0], rel=1e-6)
    assert loss[1].tolist() == pytest.approx([-min(s1, 1.0004)] * 3, rel=1e-6)
    assert loss[0, 2].item() == 0
    (loss * mask).sum().backward()
    assert logp.grad[0, :2].tolist() == pytest.approx([-s0, -s0], rel=1e-5)   # d/dlogp_t = -A*s_i
    assert logp.grad[1].abs().sum() == 0                                       # clipped branch
    assert metrics["clipfrac"].item() == pytest.approx(3 / 5)
    assert REG.get("policy_loss", "gspo").meta["loss_agg"] == "seq-mean-token-mean"


def test_geo_mean_hand_computed() -> None:
    old = torch.zeros(2, 2)
    logp = torch.tensor([[0.2, 0.6], [-0.2, -0.6]])
    adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
    loss, metrics = loss_of("geo_mean", logp, old, adv)
    # A>0: clipped at +0.4 -> mean(0.2, 0.4) = 0.3; A<0: clipped at -0.4 -> mean(-0.2, -0.4) = -0.3
    assert loss[0].tolist() == pytest.approx([-math.exp(0.3)] * 2, rel=1e-6)
    assert loss[1].tolist() == pytest.approx([2 * math.exp(-0.3)] * 2, rel=1e-6)
    assert metrics["clipfrac"].item() == pytest.approx(0.5)


def test_sapo_gate_matches_formula_and_pg_gradient_at_ratio_one() -> None:
    logp = torch.zeros(1, 2, requires_grad=True)
    adv = torch.tensor([[1.0, -1.0]])
    loss, _ = loss_of("sapo", logp, torch.zeros(1, 2), adv, tau_pos=1.0, tau_neg=1.05)
    assert loss[0].tolist() == pytest.approx([-4 * 0.5, 4 / 1.05 * 0.5])
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.0, 1.0])     # = -A at ratio 1


def test_kl_cov_penalises_the_top_covariance_token() -> None:
    old = torch.zeros(1, 4)
    logp = torch.tensor([[-0.1, -0.2, -3.0, 0.3]])
    adv = torch.tensor([[1.0, -1.0, 0.0, 2.0]])
    loss, metrics = loss_of("kl_cov", logp, old, adv, kl_cov_ratio=0.25, ppo_kl_coef=1.0)
    # cov = (A - 0.5) * (logp + 0.75): [0.325, -0.825, 1.125, 1.575] -> token 3 (index 3)
    base = [-a * math.exp(lp) for a, lp in zip([1.0, -1.0, 0.0, 2.0], [-0.1, -0.2, -3.0, 0.3])]
    base[3] += 0.3
    assert loss[0].tolist() == pytest.approx(base, rel=1e-6)
    assert metrics["clipfrac"].item() == pytest.approx(0.25)


def test_clip_cov_detaches_only_covariance_candidates() -> None:
    torch.manual_seed(0)
    logp = torch.tensor([[-2.5, 0.0, 0.0, 0.0, 0.0, 0.0]], requires_grad=True)
    old = logp.detach().clone()                                   # ratio 1: nothing PPO-clipped
    adv = torch.tensor([[-2.0, 1.0, 1.0, 0.0, 0.0, 0.0]])
    loss, metrics = loss_of("clip_cov", logp, old, adv, clip_ratio=0.34, clip_cov_lb=1.0, clip_cov_ub=5.0)
    # mean A = 0, mean logp = -2.5/6; cov = A * (logp + 0.4167): token 0 = 4.167 in (1, 5),
    # tokens 1, 2 = 0.4167, the rest 0 -> only token 0 is a candidate (k = int(0.34 * 6) = 2)
    loss.sum().backward()
    assert loss[0, 0].item() == 0 and logp.grad[0, 0].item() == 0
    assert logp.grad[0, 1:3].tolist() == pytest.approx([-1.0, -1.0])
    assert metrics["cov_detached_frac"].item() == pytest.approx(1 / 6)
    assert metrics["clipfrac"].item() == 0


# ------------------------------------------------------------------------------ fixtures


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name, params, formula", [
    ("ppo_clip", {}, lambda lp, o, a: ppo_py(lp, o, a)),
    ("ppo_clip", {"clip_low": 0.1, "clip_high": 0.3}, lambda lp, o, a: ppo_py(lp, o, a, 0.1, 0.3)),
    ("ppo_clip", {"delta": 1.5}, lambda lp, o, a: ppo_py(lp, o, a, delta=1.5)),
    ("dual_clip", {"clip_ratio_c": 2.0},
     lambda lp, o, a: min(ppo_py(lp, o, a), -2.0 * a) if a < 0 else ppo_py(lp, o, a)),
    ("cispo", {"clip_low": 0.5, "clip_high": 0.2},
     lambda lp, o, a: -min(max(ratio_py(lp, o), 0.5), 1.2) * a * lp),
    ("vanilla_pg", {}, lambda lp, o, a: -a * lp),
    ("sapo", {"tau_pos": 1.0, "tau_neg": 2.0}, lambda lp, o, a: sapo_py(lp, o, a, 1.0, 2.0)),
])
def test_token_losses_match_per_element_formula(seed: int, name: str, params: dict, formula) -> None:
    logp, old, adv, mask = random_inputs(seed)
    loss, _ = loss_of(name, logp, old, adv, mask, **params)
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            want = formula(logp[i, t].item(), old[i, t].item(), adv[i, t].item()) if mask[i, t] else 0.0
            assert loss[i, t].item() == pytest.approx(want, rel=1e-9, abs=1e-12), (i, t)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sequence_losses_match_per_sequence_formula(seed: int) -> None:
    logp, old, adv, mask = random_inputs(seed)
    adv = adv[:, :1].expand_as(adv).contiguous()              # outcome advantages: constant per row
    gspo_loss, _ = loss_of("gspo", logp, old, adv, mask, clip_low=0.05, clip_high=0.1)
    geo_loss, _ = loss_of("geo_mean", logp, old, adv, mask)
    for i in range(logp.shape[0]):
        valid = [t for t in range(logp.shape[1]) if mask[i, t]]
        if not valid:
            continue
        a = adv[i, 0].item()
        s = math.exp(sum(logp[i, t].item() - old[i, t].item() for t in valid) / len(valid))
        gspo_want = max(-a * s, -a * min(max(s, 0.95), 1.1))
        clipped = []
        for t in valid:
            r = logp[i, t].item() - old[i, t].item()
            rc = min(max(r, -0.4), 0.4)
            sgn = (a > 0) - (a < 0)
            clipped.append(sgn * min(sgn * r, sgn * rc))
        geo_want = -a * math.exp(sum(clipped) / len(valid))
        for t in valid:
            assert gspo_loss[i, t].item() == pytest.approx(gspo_want, rel=1e-9)
            assert geo_loss[i, t].item() == pytest.approx(geo_want, rel=1e-9)


def test_every_loss_reports_clipfrac_and_approx_kl() -> None:
    logp, old, adv, mask = random_inputs(3)
    for name in REG.names("policy_loss"):
        component = REG.get("policy_loss", name)
        if component.package != "rlzoo":
            continue
        _, metrics = component(logp, old, adv, mask)
        assert {"clipfrac", "approx_kl"} <= set(metrics), name
        if name not in ("vanilla_pg",):
            want = sum((old[i, t] - logp[i, t]).item() for i in range(5) for t in range(7) if mask[i, t]) \
                / mask.sum().item()
            assert metrics["approx_kl"].item() == pytest.approx(want, rel=1e-9), name


@pytest.mark.parametrize("name, params, fragment", [
    ("ppo_clip", {"clip_low": 0.0}, "clip_low must be in (0, 1]"),
    ("ppo_clip", {"clip_high": -0.1}, "clip_high must be > 0"),
    ("geo_mean", {"clip_low": 0.0}, "clip_low and clip_high must be > 0"),
    ("sapo", {"tau_neg": 0.0}, "tau_pos and tau_neg must be > 0"),
    ("clip_cov", {"clip_ratio": 0.0}, "clip_ratio must be in (0, 1]"),
    ("kl_cov", {"ppo_kl_coef": -1.0}, "ppo_kl_coef must be >= 0"),
])
def test_parameter_ranges_are_enforced(name: str, params: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        build_params(REG.get("policy_loss", name), params)


def test_doc_snippets_run() -> None:
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "algorithms" / "policy_losses.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "policy_losses.md", "exec"), {})
