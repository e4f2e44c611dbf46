"""Policy losses (kind ``policy_loss``): plugins/{clip,sequence,reinforce}_losses.py against hand-computed
values, per-element formula fixtures written here in plain Python, property tests (masks,
padding width, edge cases, gradient flow), the registry and the docs page.

Expected values never come from the plugin: the fixtures re-implement each formula
element by element (ALGORITHMS.md "Policy losses", verl core_algos.py).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlzoo.config.params import build_params
from rlzoo.core.errors import ConfigError
from rlzoo.api import check_component
from rlzoo_plugins import clip_losses, loss_parts, reinforce_losses, sequence_losses
import zoo
from zoo import builtin_names

DOC = Path(__file__).parents[1] / "docs" / "algorithms" / "policy_losses.md"
REG = zoo.REGISTRY
NAMES = builtin_names("policy_loss")     # every registered loss; each needs a VARIANTS entry below
ALIASES = {"ppo": "ppo_clip", "gpg": "vanilla_pg", "gmpo": "geo_mean"}
# non-default parameters that exercise every branch (delta, clip-higher, wide cov window)
VARIANTS = {
    "ppo_clip": {"clip_low": 0.1, "clip_high": 0.3, "delta": 1.5},
    "dual_clip": {"clip_low": 0.15, "clip_high": 0.25, "clip_ratio_c": 2.0},
    "gspo": {"clip_low": 0.05, "clip_high": 0.1},
    "cispo": {"clip_low": 0.5, "clip_high": 0.2},
    "vanilla_pg": {},
    "geo_mean": {"clip_low": 0.1, "clip_high": 0.2},
    "sapo": {"tau_pos": 1.0, "tau_neg": 2.0},
    "clip_cov": {"clip_ratio": 0.2, "clip_cov_lb": 0.2, "clip_cov_ub": 3.0},
    "kl_cov": {"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.5},
    "luspo": {"clip_low": 0.05, "clip_high": 0.1},
    "vespo": {"k_pos": 1.0, "lam_pos": 2.0, "k_neg": 2.0, "lam_neg": 1.0},
    "dppo": {"divergence": "kl", "anchor": "old", "cap": 3.0},
    "dro": {"beta": 0.3},
}


def test_every_registered_loss_has_a_variant_and_a_reference_in_this_file() -> None:
    assert set(VARIANTS) == set(NAMES)


def call(name: str, logp, old, adv, mask=None, seed: int = 0, rollout=None, **params):
    """The registered loss called as the engine calls it, by input name (rollout log-probs
    default to the old ones); torch's global RNG seeded first (clip_cov draws from it)."""
    mask = torch.ones_like(logp) if mask is None else mask
    rollout = old.detach() if rollout is None else rollout
    torch.manual_seed(seed)
    return REG.get("policy_loss", name)(logp=logp, old_logp=old, advantages=adv, response_mask=mask,
                                        rollout_logp=rollout, **params)


def random_inputs(seed: int, b: int = 6, t: int = 7, adv_scale: float = 1.0, dtype=torch.float64):
    """Log-probs ≤ 0, log-ratios ~ N(0, 0.4²), a random mask with one empty row."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=gen, dtype=dtype) * 3
    logp = old + torch.randn(b, t, generator=gen, dtype=dtype) * 0.4
    adv = torch.randn(b, t, generator=gen, dtype=dtype) * adv_scale
    mask = (torch.rand(b, t, generator=gen) > 0.25).to(dtype)
    mask[-1] = 0
    return logp, old, adv, mask


# ------------------------------------------------------------------ per-element formulas


def rho(lp: float, old: float) -> float:
    return math.exp(min(max(lp - old, -20.0), 20.0))


def clip(x: float, low: float, high: float) -> float:
    return min(max(x, low), high)


def ppo_ref(lp, old, a, lo=0.2, hi=0.2, delta=None) -> float:
    r = rho(lp, old)
    r_unclipped = min(r, delta) if (delta is not None and a < 0) else r
    return max(-a * r_unclipped, -a * clip(r, 1 - lo, 1 + hi))


def dual_ref(lp, old, a, lo=0.2, hi=0.2, c=3.0) -> float:
    loss = ppo_ref(lp, old, a, lo, hi)
    return min(loss, -c * a) if a < 0 else loss


def cispo_ref(lp, old, a, lo=1.0, hi=4.0) -> float:
    return -clip(rho(lp, old), 1 - lo, 1 + hi) * a * lp


def sapo_ref(lp, old, a, tau_pos=1.0, tau_neg=1.05) -> float:
    tau = tau_pos if a > 0 else tau_neg
    return -a * (4 / tau) / (1 + math.exp(-tau * (rho(lp, old) - 1)))


def valid_positions(mask) -> list[tuple[int, int]]:
    return [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]


def gspo_ref(logp, old, adv, mask, lo=3e-4, hi=4e-4) -> dict:
    out = {}
    for i in range(logp.shape[0]):
        ts = [t for t in range(logp.shape[1]) if mask[i, t]]
        if not ts:
            continue
        log_s = sum(logp[i, t].item() - old[i, t].item() for t in ts) / len(ts)
        s = math.exp(clip(log_s, -20, 20))
        for t in ts:
            a = adv[i, t].item()
            out[i, t] = max(-a * s, -a * clip(s, 1 - lo, 1 + hi))
    return out


def geo_ref(logp, old, adv, mask, lo=0.4, hi=0.4) -> dict:
    out = {}
    for i in range(logp.shape[0]):
        ts = [t for t in range(logp.shape[1]) if mask[i, t]]
        if not ts:
            continue
        pessimistic = []
        for t in ts:
            r, a = logp[i, t].item() - old[i, t].item(), adv[i, t].item()
            pessimistic.append(min(r, hi) if a > 0 else max(r, -lo) if a < 0 else 0.0)
        ratio = math.exp(clip(sum(pessimistic) / len(ts), -20, 20))
        a_bar = sum(adv[i, t].item() for t in ts) / len(ts)
        for t in ts:
            out[i, t] = -a_bar * ratio
    return out


def covariances(logp, adv, mask) -> dict:
    pos = valid_positions(mask)
    mean_a = sum(adv[p].item() for p in pos) / len(pos)
    mean_l = sum(logp[p].item() for p in pos) / len(pos)
    return {p: (adv[p].item() - mean_a) * (logp[p].item() - mean_l) for p in pos}


def clip_cov_ref(logp, old, adv, mask, seed, lo=0.2, hi=0.2, ratio=2e-4, lb=1.0, ub=5.0):
    """verl's algorithm in loops; the pick is the documented contract: first k of
    torch.randperm(n_candidates) on the seeded global RNG, candidates in row-major order."""
    pos = valid_positions(mask)
    cov = covariances(logp, adv, mask)
    loss, candidates = {}, []
    for p in pos:
        lp, o, a = logp[p].item(), old[p].item(), adv[p].item()
        r = rho(lp, o)
        unclipped, clipped = -a * r, -a * clip(r, 1 - lo, 1 + hi)
        loss[p] = max(unclipped, clipped)
        if not clipped > unclipped and lb < cov[p] < ub:
            candidates.append(p)
    k = max(int(ratio * len(pos)), 1)
    torch.manual_seed(seed)
    chosen = [candidates[j] for j in torch.randperm(len(candidates)).tolist()[:k]] if candidates else []
    for p in chosen:
        loss[p] = 0.0
    return loss, chosen, candidates


def kl_cov_ref(logp, old, adv, mask, ratio=2e-4, coef=0.1):
    pos = valid_positions(mask)
    cov = covariances(logp, adv, mask)
    k = max(int(ratio * len(pos)), 1)
    top = sorted(pos, key=lambda p: -cov[p])[:k]
    loss = {p: -adv[p].item() * rho(logp[p].item(), old[p].item()) for p in pos}
    for p in top:
        loss[p] += coef * abs(logp[p].item() - old[p].item())
    return loss, top


def dppo_ref(lp, anchor, a, divergence="tv", low=None, high=None, cap=10.0) -> float:
    p, q = min(math.exp(lp), 1.0), min(math.exp(anchor), 1.0)        # probabilities (inputs may exceed 0)
    low = {"tv": 0.15, "kl": 0.05}[divergence] if low is None else low
    high = {"tv": 0.15, "kl": 0.05}[divergence] if high is None else high
    if divergence == "tv":
        up, down = p - q > high, q - p > low
    else:
        shift = q * (math.log(q) - math.log(p)) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))
        up, down = shift > high and p > q, shift > low and p < q
    masked = (a > 0 and up) or (a <= 0 and down)
    return 0.0 if masked else -min(math.exp(min(lp - anchor, 20.0)), cap) * a * lp


def vespo_ref(logp, old, adv, mask, k_pos=2.0, lam_pos=3.0, k_neg=3.0, lam_neg=2.0) -> dict:
    out = {}
    for i in range(logp.shape[0]):
        ts = [t for t in range(logp.shape[1]) if mask[i, t]]
        if not ts:
            continue
        log_w = clip(sum(clip(logp[i, t].item() - old[i, t].item(), -20, 20) for t in ts), -20, 20)
        positive = sum(adv[i, t].item() for t in ts) / len(ts) >= 0
        k, lam = (k_pos, lam_pos) if positive else (k_neg, lam_neg)
        phi = math.exp(lam + k * log_w - lam * math.exp(log_w))
        for t in ts:
            out[i, t] = -phi * adv[i, t].item() * logp[i, t].item()
    return out


def token_refs(name: str, params: dict):
    """Per-element reference of the token-level losses with the given params."""
    return {
        "ppo_clip": lambda lp, o, a: ppo_ref(lp, o, a, params.get("clip_low", 0.2),
                                             params.get("clip_high", 0.2), params.get("delta")),
        "dual_clip": lambda lp, o, a: dual_ref(lp, o, a, params.get("clip_low", 0.2),
                                               params.get("clip_high", 0.2), params.get("clip_ratio_c", 3.0)),
        "cispo": lambda lp, o, a: cispo_ref(lp, o, a, params.get("clip_low", 1.0), params.get("clip_high", 4.0)),
        "vanilla_pg": lambda lp, o, a: -a * lp,
        "sapo": lambda lp, o, a: sapo_ref(lp, o, a, params.get("tau_pos", 1.0), params.get("tau_neg", 1.05)),
        "dppo": lambda lp, o, a: dppo_ref(lp, o, a, params.get("divergence", "tv"), params.get("delta_low"),
                                          params.get("delta_high"), params.get("cap", 10.0)),
        "dro": lambda lp, o, a: -(a * lp - 0.5 * params.get("beta", 0.05) * (lp - o) ** 2),
    }[name]


def assert_loss_matches(loss, expected: dict, mask, rel: float = 1e-9) -> None:
    """Valid entries equal ``expected`` ({(i, t): value}); every padded entry is exactly 0."""
    for i in range(loss.shape[0]):
        for t in range(loss.shape[1]):
            if mask[i, t]:
                assert loss[i, t].item() == pytest.approx(expected[i, t], rel=rel, abs=1e-12), (i, t)
            else:
                assert loss[i, t].item() == 0.0, (i, t)


# ============================================================== hand-computed, per component


def test_ppo_clip_hand_computed_with_clipfrac_and_approx_kl() -> None:
    # old = 0, logp = [0, .5, -.5, .5, -.3, (pad)] -> ratios [1, 1.6487, 0.6065, 1.6487, 0.7408]
    # A = [2, 1, -1, -1, 1]:
    #   t0: -2·1 = -2
    #   t1: A>0, 1.6487 > 1.2: max(-1.6487, -1.2) = -1.2            (clipped)
    #   t2: A<0, 0.6065 < 0.8: max(0.6065, 0.8) = 0.8               (clipped)
    #   t3: A<0, 1.6487: max(1.6487, 1.2) = 1.6487                  (not clipped)
    #   t4: A>0, 0.7408: max(-0.7408, -0.8) = -0.7408               (not clipped)
    # clipfrac = 2/5; approx_kl = mean(old - logp) = -(0 + .5 - .5 + .5 - .3)/5 = -0.04
    logp = torch.tensor([[0.0, 0.5, -0.5, 0.5, -0.3, 7.0]])
    old = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, -9.0]])
    adv = torch.tensor([[2.0, 1.0, -1.0, -1.0, 1.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    loss, metrics = call("ppo_clip", logp, old, adv, mask)
    assert loss[0].tolist() == pytest.approx([-2.0, -1.2, 0.8, math.exp(0.5), -math.exp(-0.3), 0.0], rel=1e-6)
    assert metrics["clipfrac"].item() == pytest.approx(2 / 5)
    assert metrics["approx_kl"].item() == pytest.approx(-0.04, abs=1e-7)
    assert "clipfrac_delta" not in metrics


def test_ppo_clip_with_ratio_one_is_minus_advantage() -> None:
    logp, _, adv, mask = random_inputs(0)
    lp = logp.clone().requires_grad_(True)
    loss, metrics = call("ppo_clip", lp, logp.clone(), adv, mask)
    assert torch.equal(loss.detach(), -adv * mask)
    loss.sum().backward()
    assert torch.allclose(lp.grad, -adv * mask)                 # d(-A·ρ)/dlogp = -A·ρ = -A
    assert metrics["clipfrac"].item() == 0 and metrics["approx_kl"].item() == 0


def test_ppo_clip_clip_higher_is_asymmetric() -> None:
    # ratios 1.25 (A>0) and 0.75 (A<0); clip range [0.8, 1.28]: 1.25 unclipped, 0.75 -> 0.8
    logp = torch.tensor([[math.log(1.25), math.log(0.75)]], dtype=torch.float64)
    loss, metrics = call("ppo_clip", logp, torch.zeros_like(logp), torch.tensor([[1.0, -1.0]], dtype=torch.float64),
                         clip_low=0.2, clip_high=0.28)
    assert loss[0].tolist() == pytest.approx([-1.25, 0.8])
    assert metrics["clipfrac"].item() == pytest.approx(0.5)


def test_ppo_clip_delta_caps_only_negative_advantages() -> None:
    # ratios e^3 = 20.09, e^3, e^1 = 2.718; A = [-1, 1, -1]; delta = 4
    # plain:  [20.09, max(-20.09, -1.2) = -1.2, 2.718]
    # delta:  [min(20.09, 4) = 4 -> max(4, 1.2) = 4, -1.2 (A>0 unaffected), 2.718 < 4 unaffected]
    logp = torch.tensor([[3.0, 3.0, 1.0]], requires_grad=True)
    adv = torch.tensor([[-1.0, 1.0, -1.0]])
    plain, plain_metrics = call("ppo_clip", logp, torch.zeros(1, 3), adv)
    capped, metrics = call("ppo_clip", logp, torch.zeros(1, 3), adv, delta=4.0)
    assert plain[0].tolist() == pytest.approx([math.exp(3), -1.2, math.e], rel=1e-6)
    assert capped[0].tolist() == pytest.approx([4.0, -1.2, math.e], rel=1e-6)
    assert metrics["clipfrac_delta"].item() == pytest.approx(1 / 3)
    assert metrics["clipfrac"].item() == pytest.approx(plain_metrics["clipfrac"].item()) == pytest.approx(1 / 3)
    (grad,) = torch.autograd.grad(capped.sum(), logp)
    # capped token: constant -> no gradient; A>0 clipped -> none; t2: -A·ρ = e
    assert grad[0].tolist() == pytest.approx([0.0, 0.0, math.e], rel=1e-6)
    # delta equals dual clip with c = delta
    dual, _ = call("dual_clip", logp, torch.zeros(1, 3), adv, clip_ratio_c=4.0)
    assert torch.allclose(dual, capped)


def test_ppo_clip_delta_must_exceed_one_plus_clip_high() -> None:
    ppo = REG.get("policy_loss", "ppo_clip")
    with pytest.raises(ConfigError, match=re.escape("delta must be > 1 + clip_high = 1.28, got 1.2")):
        build_params(ppo, {"clip_high": 0.28, "delta": 1.2})
    assert build_params(ppo, {"delta": 1.5}).delta == 1.5


def test_dual_clip_hand_computed() -> None:
    # ratios e^2 = 7.389, 7.389, e^0.1 = 1.105, e^-0.5 = 0.6065; A = [-1, 1, -2, -1]; c = 3
    #   t0: A<0: ppo = max(7.389, 1.2) = 7.389; -cA = 3 -> 3      (lower bound active)
    #   t1: A>0: max(-7.389, -1.2) = -1.2                         (clipped)
    #   t2: A<0: ppo = 2·1.105 = 2.2103 (inside the range); -cA = 6 -> 2.2103
    #   t3: A<0: ppo = max(0.6065, 0.8) = 0.8 (clipped); -cA = 3 -> 0.8
    # clipfrac = 2/4, clipfrac_lower = 1/4
    logp = torch.tensor([[2.0, 2.0, 0.1, -0.5]])
    adv = torch.tensor([[-1.0, 1.0, -2.0, -1.0]])
    loss, metrics = call("dual_clip", logp, torch.zeros(1, 4), adv)
    assert loss[0].tolist() == pytest.approx([3.0, -1.2, 2 * math.exp(0.1), 0.8], rel=1e-6)
    assert metrics["clipfrac"].item() == pytest.approx(0.5)
    assert metrics["clipfrac_lower"].item() == pytest.approx(0.25)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dual_clip_equals_ppo_clip_for_non_negative_advantages(seed: int) -> None:
    logp, old, adv, mask = random_inputs(seed)
    logp = logp + torch.randn_like(logp)                         # wide ratios: both clips reachable
    adv = adv.abs()
    adv[0, :3] = 0.0
    dual, dual_metrics = call("dual_clip", logp, old, adv, mask)
    ppo, ppo_metrics = call("ppo_clip", logp, old, adv, mask)
    assert torch.equal(dual, ppo)
    assert dual_metrics["clipfrac_lower"].item() == 0
    assert dual_metrics["clipfrac"].item() == ppo_metrics["clipfrac"].item()


@pytest.mark.parametrize("c", [1.0, 0.5, -2.0])
def test_dual_clip_rejects_c_not_above_one(c: float) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"clip_ratio_c must be > 1, got {c}")):
        build_params(REG.get("policy_loss", "dual_clip"), {"clip_ratio_c": c})


def test_gspo_hand_computed_value_gradient_and_metrics() -> None:
    # row 0: valid log-ratios [0.2, -0.1] -> log s = 0.05, s = 1.05127; A = 1; range [0.9, 1.1]
    #        -> not clipped: L = -1.05127 on both tokens
    # row 1: log-ratios [-0.3]*3 -> s = 0.74082; A = -2: max(2·0.7408, 2·0.9) = 1.8 (clipped)
    # clipfrac = 3/5; approx_kl = -(0.2 - 0.1 - 0.9)/5 = 0.16
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.2, -0.1, 9.0], [-0.3, -0.3, -0.3]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
    loss, metrics = call("gspo", logp, old, adv, mask, clip_low=0.1, clip_high=0.1)
    s0 = math.exp(0.05)
    assert loss[0].tolist() == pytest.approx([-s0, -s0, 0.0], rel=1e-6)
    assert loss[1].tolist() == pytest.approx([1.8] * 3, rel=1e-6)
    assert metrics["clipfrac"].item() == pytest.approx(3 / 5)
    assert metrics["approx_kl"].item() == pytest.approx(0.16, rel=1e-5)
    # with the registered aggregation: d/dlogp_t = -A·s/|y| for unclipped rows, 0 if clipped
    agg = REG.get("loss_agg", REG.get("policy_loss", "gspo").meta["loss_agg"])
    agg(loss, mask).backward()
    assert logp.grad[0].tolist() == pytest.approx([-s0 / 2 / 2, -s0 / 2 / 2, 0.0], rel=1e-5)   # B' = 2
    assert logp.grad[1].abs().sum().item() == 0


def test_gspo_stop_gradient_each_token_gets_its_own_gradient() -> None:
    # token-varying advantages tell GSPO-token (sg on the sequence ratio) apart from a plain
    # sequence ratio: d loss[i, t]/d logp[i, t'] = -A_t·s·[t == t'] (a diagonal Jacobian)
    logp, old, adv, mask = random_inputs(4, b=3, t=4)
    mask = torch.ones_like(mask)
    lp = logp.clone().requires_grad_(True)
    ol = old.clone().requires_grad_(True)
    ad = adv.clone().requires_grad_(True)
    params = {"clip_low": 0.9, "clip_high": 10.0}                # nothing clipped
    loss, _ = call("gspo", lp, ol, ad, mask, **params)
    s = torch.exp((logp - old).mean(-1, keepdim=True))
    for i, t in [(0, 0), (1, 2), (2, 3)]:
        (grad,) = torch.autograd.grad(loss[i, t], lp, retain_graph=True)
        expected = torch.zeros_like(grad)
        expected[i, t] = -adv[i, t] * s[i, 0]
        assert torch.allclose(grad, expected, rtol=1e-10, atol=1e-12)
    loss.sum().backward()
    assert ol.grad is None and ad.grad is None
    assert torch.allclose(lp.grad, -adv * s)


def test_cispo_hand_computed_and_stop_gradient() -> None:
    # params ε_low = 0.2, ε_high = 0.28: weight range [0.8, 1.28]
    # ratios e^0.1 = 1.10517, e^1 = 2.718 -> 1.28, e^-0.3 = 0.7408 -> 0.8, e^-2 = 0.1353 -> 0.8
    # A = [1, 2, -1, 1]; L = -w·A·logp:
    #   t0: -1.10517·1·0.1 = -0.110517   t1: -1.28·2·1 = -2.56
    #   t2: -0.8·(-1)·(-0.3) = -0.24      t3: -0.8·1·(-2) = 1.6
    # gradient (w detached): -w·A = [-1.10517, -2.56, 0.8, -0.8]; clipfrac 3/4
    old = torch.zeros(1, 4, requires_grad=True)
    logp = torch.tensor([[0.1, 1.0, -0.3, -2.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 2.0, -1.0, 1.0]], requires_grad=True)
    loss, metrics = call("cispo", logp, old, adv, clip_low=0.2, clip_high=0.28)
    assert loss[0].tolist() == pytest.approx([-0.1 * math.exp(0.1), -2.56, -0.24, 1.6], rel=1e-6)
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-math.exp(0.1), -2.56, 0.8, -0.8], rel=1e-6)
    assert old.grad is None and adv.grad is None
    assert metrics["clipfrac"].item() == pytest.approx(0.75)


def test_cispo_defaults_no_lower_bound_and_cap_five() -> None:
    assert REG.get("policy_loss", "cispo").default_params() == reinforce_losses.CISPOParams(clip_low=1.0, clip_high=4.0)
    # ratios e^-5 = 0.0067 (kept: no lower bound), e^2 = 7.389 -> capped at 5
    logp = torch.tensor([[-5.0, 2.0]], requires_grad=True)
    loss, metrics = call("cispo", logp, torch.zeros(1, 2), torch.ones(1, 2))
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-math.exp(-5), -5.0], rel=1e-6)
    assert metrics["clipfrac"].item() == pytest.approx(0.5)


def test_vanilla_pg_hand_computed_and_gradient() -> None:
    # L = -A·logp = [-(0.5)(-1), -(-1)(-2)] = [0.5, -2]; dL/dlogp = -A = [-0.5, 1]
    # approx_kl = mean(old - logp) = ((-0.5 + 1) + (-1.5 + 2))/2 = 0.5
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, metrics = call("vanilla_pg", logp, torch.tensor([[-0.5, -1.5]]), torch.tensor([[0.5, -1.0]]))
    assert loss[0].tolist() == pytest.approx([0.5, -2.0])
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.5, 1.0])
    assert metrics["clipfrac"].item() == 0
    assert metrics["approx_kl"].item() == pytest.approx(0.5)


def test_geo_mean_hand_computed() -> None:
    # ε = 0.4 in log space, old = 0
    # row 0, A = 1:  r = [0.2, 0.6] -> min(r, 0.4) = [0.2, 0.4] -> mean 0.3 -> L = -e^0.3 = -1.34986
    # row 1, A = -2: r = [-0.2, -0.6] -> max(r, -0.4) = [-0.2, -0.4] -> mean -0.3 -> L = 2·e^-0.3 = 1.48164
    # row 2, A = 1:  r = [-0.8, 0.1] -> A>0 only caps above: [-0.8, 0.1] -> mean -0.35 -> L = -e^-0.35
    # clipfrac = 2/6 (row 0 t1, row 1 t1; row 2's -0.8 is out of range but on the safe side)
    old = torch.zeros(3, 2)
    logp = torch.tensor([[0.2, 0.6], [-0.2, -0.6], [-0.8, 0.1]])
    adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0], [1.0, 1.0]])
    loss, metrics = call("geo_mean", logp, old, adv)
    assert loss[0].tolist() == pytest.approx([-math.exp(0.3)] * 2, rel=1e-6)
    assert loss[1].tolist() == pytest.approx([2 * math.exp(-0.3)] * 2, rel=1e-6)
    assert loss[2].tolist() == pytest.approx([-math.exp(-0.35)] * 2, rel=1e-6)
    assert metrics["clipfrac"].item() == pytest.approx(2 / 6)
    # the registered aggregation gives the mean of the per-sequence losses
    component = REG.get("policy_loss", "geo_mean")
    agg = REG.get("loss_agg", component.meta["loss_agg"])
    want = (-math.exp(0.3) + 2 * math.exp(-0.3) - math.exp(-0.35)) / 3
    assert agg(loss, torch.ones(3, 2)).item() == pytest.approx(want, rel=1e-6)


def test_geo_mean_gradient_flows_through_unclipped_tokens_only() -> None:
    # row A = 1, r = [0.2, 0.6], |y| = 2: ratio = e^0.3; dL/dr_0 = -A·ratio/2; r_1 clipped -> 0
    logp = torch.tensor([[0.2, 0.6]], requires_grad=True)
    loss, _ = call("geo_mean", logp, torch.zeros(1, 2), torch.ones(1, 2))
    loss[0, 0].backward()                                          # L_i itself
    assert logp.grad[0].tolist() == pytest.approx([-math.exp(0.3) / 2, 0.0], rel=1e-6)


def test_geo_mean_folds_correction_weights_in_as_a_geometric_mean() -> None:
    # A = 1, old = 0, r = [0.2, 0.1, -0.3] (no clip), weights w = [0.5, 2.0, 1.0]:
    # ratio = e^{(0.2 + 0.1 - 0.3)/3} = 1; geometric mean of w = (0.5·2·1)^(1/3) = 1 -> L = -1
    # (the arithmetic mean, 7/6, is what multiplying each token's copy by its weight gave)
    logp = torch.tensor([[0.2, 0.1, -0.3]], dtype=torch.float64)
    weights = torch.tensor([[0.5, 2.0, 1.0]], dtype=torch.float64)
    loss, _ = call("geo_mean", logp, torch.zeros_like(logp), torch.ones_like(logp), correction_weights=weights)
    assert loss[0].tolist() == pytest.approx([-1.0] * 3, rel=1e-12)
    # w = [0.5, 0.5, 4]: geometric mean 1 as well; w = [2, 2, 2]: 2 -> L = -2
    loss, _ = call("geo_mean", logp, torch.zeros_like(logp), torch.ones_like(logp),
                   correction_weights=torch.full_like(logp, 2.0))
    assert loss[0].tolist() == pytest.approx([-2.0] * 3, rel=1e-12)


def test_geo_mean_weight_zero_token_gets_no_gradient() -> None:
    """The issue-23 bug: a token icepop drops (weight 0) must get no gradient through the
    sequence ratio, and the kept tokens carry the geometric mean of their own weights."""
    # A = 1, old = 0, r = [0.2, 0.1, -0.3], w = [0.5, 0, 2]: kept tokens 0 and 2;
    # ratio = e^{(0.2 - 0.3)/2} = e^-0.05; weight = sqrt(0.5·2) = 1 -> L = -e^-0.05;
    # dL/dr_0 = dL/dr_2 = -e^-0.05 / 2, dL/dr_1 = 0
    logp = torch.tensor([[0.2, 0.1, -0.3]], dtype=torch.float64, requires_grad=True)
    weights = torch.tensor([[0.5, 0.0, 2.0]], dtype=torch.float64)
    loss, _ = call("geo_mean", logp, torch.zeros(1, 3, dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64),
                   correction_weights=weights)
    assert loss[0].tolist() == pytest.approx([-math.exp(-0.05)] * 3, rel=1e-12)
    agg = REG.get("loss_agg", "seq-mean-token-mean")
    agg(loss, torch.ones(1, 3)).backward()
    assert logp.grad[0, 1].item() == 0.0
    assert logp.grad[0].tolist() == pytest.approx([-math.exp(-0.05) / 2, 0.0, -math.exp(-0.05) / 2], rel=1e-12)
    # every token dropped: the sequence's loss and gradient are 0; it still counts in B'
    logp.grad = None
    loss, _ = call("geo_mean", logp, torch.zeros(1, 3, dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64),
                   correction_weights=torch.zeros(1, 3, dtype=torch.float64))
    assert (loss == 0).all()
    agg(loss, torch.ones(1, 3)).backward()
    assert (logp.grad == 0).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_geo_mean_with_weights_matches_per_sequence_formula(seed: int) -> None:
    logp, old, adv, mask = random_inputs(seed)
    adv = adv[:, :1].expand_as(adv).contiguous()
    gen = torch.Generator().manual_seed(50 + seed)
    weights = torch.rand(logp.shape, generator=gen, dtype=logp.dtype) * 2
    weights[weights < 0.4] = 0.0                                   # some tokens dropped
    loss, _ = call("geo_mean", logp, old, adv, mask, correction_weights=weights)
    kept = mask * (weights > 0)
    want = geo_ref(logp, old, adv, kept)
    expected = {}
    for i in range(logp.shape[0]):
        ts = [t for t in range(logp.shape[1]) if kept[i, t]]
        g = math.exp(sum(math.log(weights[i, t].item()) for t in ts) / len(ts)) if ts else 0.0
        for t in range(logp.shape[1]):
            if mask[i, t]:
                expected[i, t] = want[i, ts[0]] * g if ts else 0.0
    assert_loss_matches(loss, expected, mask)
    # weights of 1 change nothing, bit for bit
    plain, _ = call("geo_mean", logp, old, adv, mask)
    ones, _ = call("geo_mean", logp, old, adv, mask, correction_weights=mask.clone())
    assert torch.equal(plain, ones)


def test_dro_hand_computed_value_and_gradient() -> None:
    # β = 0.5, old = [-1, -1], logp = [-0.5, -2], A = [1, -2]:
    #   t0: -(1·-0.5 - 0.25·0.25) = 0.5625;  t1: -(-2·-2 - 0.25·1) = -3.75
    #   dL/dlogp = -A + β·(logp - old) = [-1 + 0.25, 2 - 0.5] = [-0.75, 1.5]
    logp = torch.tensor([[-0.5, -2.0, 3.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = call("dro", logp, old, torch.tensor([[1.0, -2.0, 7.0]]), mask, beta=0.5)
    assert loss[0].tolist() == pytest.approx([0.5625, -3.75, 0.0], rel=1e-6)
    assert metrics["penalty"].item() == pytest.approx((0.125 + 0.5) / 2, rel=1e-6)
    assert metrics["clipfrac"].item() == 0
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.75, 1.5, 0.0], rel=1e-6)
    # on-policy (logp = old) it is REINFORCE: value -A·logp, gradient -A
    lp = torch.tensor([[-0.5, -2.0]], requires_grad=True)
    on, _ = call("dro", lp, lp.detach().clone(), torch.tensor([[1.0, -2.0]]))
    assert torch.equal(on.detach(), torch.tensor([[0.5, -4.0]]))


def test_sapo_hand_computed_gate_and_gradient() -> None:
    # ratios [1, 1, 2, 0.5]; A = [1, -1, 1, -1]; τ = [1, 1.05, 1, 1.05]
    #   t0: -1·4·σ(0) = -2                 t1: (4/1.05)·σ(0) = 1.904762
    #   t2: -4·σ(1) = -4·0.731059 = -2.924234
    #   t3: (4/1.05)·σ(-0.525) = 3.809524·0.371684 = 1.415939
    # dL/dlogp = -A·4σ(1-σ)·ρ: t0 = -1, t1 = +1 (the plain policy gradient at ρ = 1)
    logp = torch.tensor([[0.0, 0.0, math.log(2.0), math.log(0.5)]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]], dtype=torch.float64)
    loss, metrics = call("sapo", logp, torch.zeros_like(adv), adv)

    def sig(x: float) -> float:
        return 1 / (1 + math.exp(-x))

    assert loss[0].tolist() == pytest.approx([-2.0, 2 / 1.05, -4 * sig(1.0), 4 / 1.05 * sig(-0.525)], rel=1e-12)
    assert loss[0, 2].item() == pytest.approx(-2.924234, rel=1e-6)
    assert loss[0, 3].item() == pytest.approx(1.415939, rel=1e-5)
    loss.sum().backward()
    w2, w3 = 4 * sig(1.0) * (1 - sig(1.0)), 4 * sig(-0.525) * (1 - sig(-0.525))
    assert logp.grad[0].tolist() == pytest.approx([-1.0, 1.0, -w2 * 2, w3 * 0.5], rel=1e-12)
    assert metrics["clipfrac"].item() == 0
    assert metrics["gate_weight"].item() == pytest.approx((1 + 1 + w2 + w3) / 4, rel=1e-12)


def test_clip_cov_hand_computed() -> None:
    # old = logp: ratio 1, nothing PPO-clipped. mean A = 0, mean logp = -2.5/6 = -0.41667
    # cov = A·(logp + 0.41667) = [4.1667, 0.41667, 0.41667, 0, 0, 0] -> only token 0 in (1, 5)
    # k = max(int(0.34·6), 1) = 2 but only one candidate -> token 0 cut (loss 0, no gradient)
    logp = torch.tensor([[-2.5, 0.0, 0.0, 0.0, 0.0, 0.0]], requires_grad=True)
    adv = torch.tensor([[-2.0, 1.0, 1.0, 0.0, 0.0, 0.0]])
    loss, metrics = call("clip_cov", logp, logp.detach().clone(), adv, clip_ratio=0.34)
    assert loss[0].tolist() == pytest.approx([0.0, -1.0, -1.0, 0.0, 0.0, 0.0])
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -1.0, -1.0, 0.0, 0.0, 0.0])
    assert metrics["cov_detached_frac"].item() == pytest.approx(1 / 6)
    assert metrics["clipfrac"].item() == 0


def test_clip_cov_never_cuts_ppo_clipped_tokens_and_is_seed_deterministic() -> None:
    # tokens 0-3: cov = A·(logp - mean) in (1, 5) for all four; token 0 is PPO-clipped
    # (A > 0, ratio e^1 > 1.2) so only 1-3 are candidates; k = max(int(0.5·4), 1) = 2
    logp = torch.tensor([[1.0, -1.0, 1.5, -1.5]])
    old = torch.tensor([[0.0, -1.0, 1.5, -1.5]])                 # ratios e, 1, 1, 1
    adv = torch.tensor([[2.0, -2.0, 2.0, -2.0]])                 # mean 0; mean logp = 0
    # cov = [2, 2, 3, 3]
    cuts = []
    for seed in range(8):
        loss, metrics = call("clip_cov", logp, old, adv, seed=seed, clip_ratio=0.5)
        again, _ = call("clip_cov", logp, old, adv, seed=seed, clip_ratio=0.5)
        assert torch.equal(loss, again)                           # same seed, same pick
        cut = tuple((loss[0] == 0).nonzero().flatten().tolist())
        assert len(cut) == 2 and 0 not in cut
        assert metrics["cov_detached_frac"].item() == pytest.approx(0.5)
        assert metrics["clipfrac"].item() == pytest.approx(0.25)
        torch.manual_seed(seed)
        assert cut == tuple(sorted([1, 2, 3][j] for j in torch.randperm(3)[:2].tolist()))
        cuts.append(cut)
    assert len(set(cuts)) > 1                                     # the pick is random across seeds


def test_kl_cov_hand_computed() -> None:
    # mean A = 0.5, mean logp = -0.75; cov = (A - 0.5)·(logp + 0.75) = [0.325, -0.825, 1.125, 1.575]
    # k = max(int(0.25·4), 1) = 1 -> token 3 penalised: -2·e^0.3 + 0.1·|0.3| (ppo_kl_coef 0.1, verl's)
    # with k = 2 (ratio 0.5) tokens 3 and 2: token 2 gets + |−3| = 3
    logp = torch.tensor([[-0.1, -0.2, -3.0, 0.3]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 0.0, 2.0]])
    base = [-a * math.exp(lp) for a, lp in zip([1.0, -1.0, 0.0, 2.0], [-0.1, -0.2, -3.0, 0.3])]
    loss, metrics = call("kl_cov", logp, torch.zeros(1, 4), adv, kl_cov_ratio=0.25)
    assert loss[0].tolist() == pytest.approx(base[:3] + [base[3] + 0.03], rel=1e-6)
    assert metrics["clipfrac"].item() == pytest.approx(0.25)
    loss.sum().backward()
    # d/dlogp_3 of (-A·e^r + 0.1·|r|) = -2·e^0.3 + 0.1
    assert logp.grad[0, 3].item() == pytest.approx(-2 * math.exp(0.3) + 0.1, rel=1e-6)
    loss2, _ = call("kl_cov", logp, torch.zeros(1, 4), adv, kl_cov_ratio=0.5, ppo_kl_coef=2.0)
    assert loss2[0].tolist() == pytest.approx(base[:2] + [base[2] + 6.0, base[3] + 0.6], rel=1e-6)


# ============================================================== numerical fixtures


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", ["ppo_clip", "dual_clip", "cispo", "vanilla_pg", "sapo", "dppo", "dro"])
@pytest.mark.parametrize("variant", ["default", "variant"])
def test_token_losses_match_per_element_formula(seed: int, name: str, variant: str) -> None:
    logp, old, adv, mask = random_inputs(seed)
    logp = old + (logp - old) * 2                                 # log-ratios ~ N(0, 0.8²): clips active
    params = VARIANTS[name] if variant == "variant" else {}
    loss, metrics = call(name, logp, old, adv, mask, **params)
    formula = token_refs(name, params)
    pos = valid_positions(mask)
    assert_loss_matches(loss, {p: formula(logp[p].item(), old[p].item(), adv[p].item()) for p in pos}, mask)
    kl = sum(old[p].item() - logp[p].item() for p in pos) / len(pos)
    assert metrics["approx_kl"].item() == pytest.approx(kl, rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ppo_clipfrac_matches_a_count_by_hand(seed: int) -> None:
    logp, old, adv, mask = random_inputs(seed)
    logp = old + (logp - old) * 2
    _, metrics = call("ppo_clip", logp, old, adv, mask)
    pos = valid_positions(mask)
    count = 0
    for p in pos:
        r, a = rho(logp[p].item(), old[p].item()), adv[p].item()
        count += -a * clip(r, 0.8, 1.2) > -a * r
    assert count > 0
    assert metrics["clipfrac"].item() == pytest.approx(count / len(pos), rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("outcome", [True, False], ids=["outcome-adv", "token-adv"])
def test_sequence_losses_match_per_sequence_formula(seed: int, outcome: bool) -> None:
    logp, old, adv, mask = random_inputs(seed)
    if outcome:
        adv = adv[:, :1].expand_as(adv).contiguous()
    gspo_params = VARIANTS["gspo"]
    loss, _ = call("gspo", logp, old, adv, mask, **gspo_params)
    assert_loss_matches(loss, gspo_ref(logp, old, adv, mask, gspo_params["clip_low"], gspo_params["clip_high"]), mask)
    loss, _ = call("gspo", logp, old, adv, mask)
    assert_loss_matches(loss, gspo_ref(logp, old, adv, mask), mask)
    for params in ({}, VARIANTS["luspo"]):       # luspo is gspo's per-token loss (its aggregation differs)
        loss, _ = call("luspo", logp, old, adv, mask, **params)
        expected = gspo_ref(logp, old, adv, mask, params.get("clip_low", 2e-3), params.get("clip_high", 2.5e-3))
        assert_loss_matches(loss, expected, mask)
    for params in ({}, VARIANTS["vespo"]):
        loss, _ = call("vespo", logp, old, adv, mask, **params)
        assert_loss_matches(loss, vespo_ref(logp, old, adv, mask, **params), mask)
    for params in ({}, VARIANTS["geo_mean"]):
        loss, metrics = call("geo_mean", logp, old, adv, mask, **params)
        lo, hi = params.get("clip_low", 0.4), params.get("clip_high", 0.4)
        assert_loss_matches(loss, geo_ref(logp, old, adv, mask, lo, hi), mask)
        pos = valid_positions(mask)
        clipped = sum((adv[p] > 0 and logp[p] - old[p] > hi) or (adv[p] < 0 and logp[p] - old[p] < -lo)
                      for p in pos)
        assert metrics["clipfrac"].item() == pytest.approx(float(clipped) / len(pos), rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_clip_cov_matches_verl_algorithm_in_loops(seed: int) -> None:
    logp, old, adv, mask = random_inputs(seed, b=6, t=9, adv_scale=2.0)
    params = {"clip_ratio": 0.1, "clip_cov_lb": 0.5, "clip_cov_ub": 3.0}
    loss, metrics = call("clip_cov", logp, old, adv, mask, seed=100 + seed, **params)
    want, chosen, candidates = clip_cov_ref(logp, old, adv, mask, 100 + seed, ratio=0.1, lb=0.5, ub=3.0)
    assert len(candidates) > len(chosen) > 1                     # a real random pick happened
    assert_loss_matches(loss, want, mask)
    n_valid = len(valid_positions(mask))
    assert metrics["cov_detached_frac"].item() == pytest.approx(len(chosen) / n_valid, rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kl_cov_matches_verl_algorithm_in_loops(seed: int) -> None:
    logp, old, adv, mask = random_inputs(seed, b=6, t=9)
    loss, metrics = call("kl_cov", logp, old, adv, mask, kl_cov_ratio=0.2, ppo_kl_coef=0.5)
    want, top = kl_cov_ref(logp, old, adv, mask, ratio=0.2, coef=0.5)
    assert len(top) > 1
    assert_loss_matches(loss, want, mask)
    assert metrics["clipfrac"].item() == pytest.approx(len(top) / len(valid_positions(mask)), rel=1e-12)
    # default ratio: k = max(int(2e-4·N), 1) = 1
    loss, _ = call("kl_cov", logp, old, adv, mask)
    want, top = kl_cov_ref(logp, old, adv, mask)
    assert len(top) == 1
    assert_loss_matches(loss, want, mask)


# ============================================================== properties, every component


def _run(name: str, params: dict, logp, old, adv, mask, seed: int = 0):
    """Loss, metrics and the gradients of sum(loss) wrt (logp, old, adv) (None = no graph)."""
    lp = logp.clone().requires_grad_(True)
    ol = old.clone().requires_grad_(True)
    ad = adv.clone().requires_grad_(True)
    loss, metrics = call(name, lp, ol, ad, mask, seed=seed, **params)
    loss.sum().backward()
    return loss.detach(), metrics, lp.grad, ol.grad, ad.grad


CASES = [(name, kind) for name in NAMES for kind in ("default", "variant")]


def _params(name: str, kind: str) -> dict:
    return VARIANTS[name] if kind == "variant" else {}


@pytest.mark.parametrize("name, kind", CASES)
def test_shapes_metrics_and_gradient_flow(name: str, kind: str) -> None:
    logp, old, adv, mask = random_inputs(5, dtype=torch.float32)
    loss, metrics, g_logp, g_old, g_adv = _run(name, _params(name, kind), logp, old, adv, mask)
    assert loss.shape == logp.shape and loss.dtype == logp.dtype
    assert {"clipfrac", "approx_kl"} <= set(metrics)
    for key, value in metrics.items():
        assert isinstance(value, torch.Tensor) and value.dim() == 0, key
        assert not value.requires_grad and torch.isfinite(value), key
    assert 0 <= metrics["clipfrac"].item() <= 1
    assert g_old is None and g_adv is None, "gradient must not reach old_logp or advantages"
    assert g_logp is not None and torch.isfinite(g_logp).all()
    assert (g_logp[mask == 0] == 0).all(), "gradient at padded positions"
    assert (g_logp[mask == 1] != 0).any()
    assert (loss[mask == 0] == 0).all()


@pytest.mark.parametrize("name, kind", CASES)
@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), -1e4])
def test_padding_contents_never_matter(name: str, kind: str, garbage: float) -> None:
    logp, old, adv, mask = random_inputs(6)
    clean = _run(name, _params(name, kind), logp, old, adv, mask)
    dirty_inputs = [torch.where(mask.bool(), x, torch.full_like(x, garbage)) for x in (logp, old, adv)]
    dirty = _run(name, _params(name, kind), *dirty_inputs, mask)
    assert torch.equal(clean[0], dirty[0])
    assert torch.equal(clean[2], dirty[2])                         # gradients too (0 on padding)
    assert clean[1].keys() == dirty[1].keys()
    for key in clean[1]:
        assert torch.equal(clean[1][key], dirty[1][key]), key


@pytest.mark.parametrize("name, kind", CASES)
def test_padding_width_never_changes_results(name: str, kind: str) -> None:
    logp, old, adv, mask = random_inputs(7)
    base = _run(name, _params(name, kind), logp, old, adv, mask)

    def pad(x: torch.Tensor, value: float) -> torch.Tensor:
        return torch.cat([x, torch.full((x.shape[0], 4), value, dtype=x.dtype)], dim=1)

    wide = _run(name, _params(name, kind), pad(logp, 3.0), pad(old, -3.0), pad(adv, 9.0), pad(mask, 0.0))
    width = logp.shape[1]
    assert torch.allclose(base[0], wide[0][:, :width], rtol=1e-12, atol=1e-12)
    assert (wide[0][:, width:] == 0).all()
    assert torch.allclose(base[2], wide[2][:, :width], rtol=1e-12, atol=1e-12)
    for key in base[1]:
        assert torch.allclose(base[1][key], wide[1][key], rtol=1e-12, atol=1e-12), key


@pytest.mark.parametrize("name, kind", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_edge_cases_are_finite(name: str, kind: str, dtype: torch.dtype) -> None:
    logp, old, adv, mask = random_inputs(8, dtype=dtype)
    params = _params(name, kind)
    cases = {
        "log-ratio +50": (old + 50, old, adv, mask),
        "log-ratio -50": (old - 50, old, adv, mask),
        "all-equal rewards (zero advantages)": (logp, old, torch.zeros_like(adv), mask),
        "empty batch": (logp, old, adv, torch.zeros_like(mask)),
        "single token rows": (logp, old, adv, torch.eye(*mask.shape, dtype=dtype)),
    }
    for label, inputs in cases.items():
        loss, metrics, g_logp, _, _ = _run(name, params, *inputs)
        assert torch.isfinite(loss).all(), label
        assert torch.isfinite(g_logp).all(), label
        for key, value in metrics.items():
            assert torch.isfinite(value), (label, key)
    loss, metrics, _, _, _ = _run(name, params, *cases["empty batch"])
    assert (loss == 0).all() and all(v.item() == 0 for v in metrics.values())


@pytest.mark.parametrize("name, kind", CASES)
def test_bool_and_float_masks_agree(name: str, kind: str) -> None:
    logp, old, adv, mask = random_inputs(9)
    as_float = _run(name, _params(name, kind), logp, old, adv, mask)
    as_bool = _run(name, _params(name, kind), logp, old, adv, mask.bool())
    assert torch.equal(as_float[0], as_bool[0]) and torch.equal(as_float[2], as_bool[2])


@pytest.mark.parametrize("name, kind", CASES)
def test_rlzoo_testing_invariants_with_these_params(name: str, kind: str) -> None:
    component = REG.get("policy_loss", name)
    params = build_params(component, _params(name, kind))
    check_component(component, params)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_masked_positions_never_affect_valid_ones_property(name: str, data) -> None:
    b = data.draw(st.integers(1, 4), label="B")
    t = data.draw(st.integers(1, 6), label="T")
    bits = data.draw(st.lists(st.booleans(), min_size=b * t, max_size=b * t), label="mask")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    garbage = data.draw(st.sampled_from([float("nan"), float("-inf"), 1e6, -1e6]), label="garbage")
    scale = data.draw(st.sampled_from([0.1, 1.0, 30.0]), label="log-ratio scale")
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 3
    logp = old + torch.randn(b, t, generator=gen, dtype=torch.float64) * scale
    adv = torch.randn(b, t, generator=gen, dtype=torch.float64)
    mask = torch.tensor(bits, dtype=torch.float64).view(b, t)
    clean = _run(name, VARIANTS[name], logp, old, adv, mask, seed=seed)
    dirty = _run(name, VARIANTS[name], *[torch.where(mask.bool(), x, torch.full_like(x, garbage))
                                        for x in (logp, old, adv)], mask, seed=seed)
    assert torch.equal(clean[0], dirty[0]) and torch.equal(clean[2], dirty[2])
    assert torch.isfinite(clean[0]).all() and torch.isfinite(clean[2]).all()
    assert (clean[0][mask == 0] == 0).all() and (clean[2][mask == 0] == 0).all()
    for key in clean[1]:
        assert torch.equal(clean[1][key], dirty[1][key]) and torch.isfinite(clean[1][key]), key


# ============================================================== registry and parameters


@pytest.mark.parametrize("name", NAMES)
def test_registered_with_paper_and_description(name: str) -> None:
    component = REG.get("policy_loss", name)
    fn_name = "gspo" if name == "luspo" else name                                 # luspo: gspo's loss
    assert component.fn in {getattr(m, fn_name, None) for m in (clip_losses, sequence_losses, reinforce_losses)}
    assert component.plugin and component.description and component.paper.startswith("arXiv:")
    assert component.needs == frozenset()
    expected_agg = {"gspo": "seq-mean-token-mean", "geo_mean": "seq-mean-token-mean",
                    "luspo": "seq-mean-token-sum"}.get(name)
    assert component.meta.get("loss_agg") == expected_agg


@pytest.mark.parametrize("alias, name", sorted(ALIASES.items()))
def test_aliases_resolve(alias: str, name: str) -> None:
    assert REG.get("policy_loss", alias) is REG.get("policy_loss", name)


def test_retired_alias_vanilla_names_its_replacement() -> None:
    from rlzoo.core.errors import UnknownComponentError

    with pytest.raises(UnknownComponentError, match=r"policy_loss 'vanilla' was retired: use 'ppo_clip'.*vanilla_pg"):
        REG.get("policy_loss", "vanilla")


def test_documented_defaults() -> None:
    defaults = {name: REG.get("policy_loss", name).default_params() for name in NAMES}
    assert defaults["ppo_clip"] == clip_losses.PPOClipParams(0.2, 0.2, None)
    assert defaults["dual_clip"] == clip_losses.DualClipParams(0.2, 0.2, 3.0)
    assert defaults["gspo"] == sequence_losses.GSPOParams(3e-4, 4e-4)
    assert defaults["geo_mean"] == sequence_losses.GeoMeanParams(0.4, 0.4)
    assert defaults["sapo"] == clip_losses.SAPOParams(1.0, 1.05)
    assert defaults["clip_cov"] == clip_losses.ClipCovParams(0.2, 0.2, 2e-4, 1.0, 5.0)
    assert defaults["kl_cov"] == clip_losses.KLCovParams(2e-4, 0.1)          # verl's policy_loss.ppo_kl_coef
    assert defaults["dro"] == reinforce_losses.DROParams(0.05)
    assert defaults["vanilla_pg"] is None
    assert defaults["luspo"] == sequence_losses.LUSPOParams(2e-3, 2.5e-3)
    assert defaults["vespo"] == sequence_losses.VESPOParams(2.0, 3.0, 3.0, 2.0)
    assert defaults["dppo"] == reinforce_losses.DPPOParams("tv", None, None, 10.0, "rollout")


@pytest.mark.parametrize("name, given, fragment", [
    ("ppo_clip", {"clip_low": 0.0}, "clip_low must be in (0, 1), got 0.0"),
    ("ppo_clip", {"clip_low": 1.0}, "clip_low must be in (0, 1), got 1.0"),
    ("ppo_clip", {"clip_high": 0.0}, "clip_high must be > 0, got 0.0"),
    ("ppo_clip", {"delta": 1.1}, "delta must be > 1 + clip_high = 1.2, got 1.1"),
    ("dual_clip", {"clip_low": -0.1}, "clip_low must be in (0, 1), got -0.1"),
    ("dual_clip", {"clip_ratio_c": 0.9}, "clip_ratio_c must be > 1, got 0.9"),
    ("gspo", {"clip_high": -1e-4}, "clip_high must be > 0, got -0.0001"),
    ("cispo", {"clip_low": 1.5}, "clip_low must be in [0, 1], got 1.5"),
    ("cispo", {"clip_high": 0.0}, "clip_high must be > 0, got 0.0"),
    ("geo_mean", {"clip_low": 0.0}, "clip_low must be > 0 (a log-ratio bound), got 0.0"),
    ("geo_mean", {"clip_high": -0.4}, "clip_high must be > 0 (a log-ratio bound), got -0.4"),
    ("sapo", {"tau_pos": 0.0}, "tau_pos must be > 0, got 0.0"),
    ("sapo", {"tau_neg": -1.0}, "tau_neg must be > 0, got -1.0"),
    ("clip_cov", {"clip_ratio": 0.0}, "clip_ratio must be in (0, 1], got 0.0"),
    ("clip_cov", {"clip_cov_ub": 1.0}, "clip_cov_ub must be > clip_cov_lb = 1.0, got 1.0"),
    ("clip_cov", {"clip_high": 0.0}, "clip_high must be > 0, got 0.0"),
    ("kl_cov", {"kl_cov_ratio": 1.5}, "kl_cov_ratio must be in (0, 1], got 1.5"),
    ("kl_cov", {"ppo_kl_coef": -1.0}, "ppo_kl_coef must be >= 0, got -1.0"),
    ("dro", {"beta": 0.0}, "beta must be > 0, got 0.0"),
    ("dro", {"beta": -0.1}, "beta must be > 0, got -0.1"),
    ("vespo", {"lam_pos": 0.0}, "lam_pos must be > 0, got 0.0"),
    ("vespo", {"k_neg": -1.0}, "k_neg must be >= 0, got -1.0"),
    ("dppo", {"divergence": "js"}, "divergence must be one of tv, kl, got 'js'"),
    ("dppo", {"anchor": "ref"}, "anchor must be 'rollout' or 'old', got 'ref'"),
    ("dppo", {"delta_low": 0.0}, "delta_low must be > 0, got 0.0"),
    ("luspo", {"clip_low": 1.0}, "clip_low must be in (0, 1), got 1.0"),
])
def test_out_of_range_parameters_are_rejected_by_name(name: str, given: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        build_params(REG.get("policy_loss", name), given)


def test_nan_parameters_are_rejected() -> None:
    for name, key in [("ppo_clip", "clip_high"), ("dual_clip", "clip_ratio_c"), ("sapo", "tau_pos"),
                      ("kl_cov", "ppo_kl_coef"), ("geo_mean", "clip_low")]:
        with pytest.raises(ConfigError, match=key):
            build_params(REG.get("policy_loss", name), {key: float("nan")})


def test_unknown_parameter_and_parameterless_loss() -> None:
    with pytest.raises(ConfigError, match="Did you mean 'clip_ratio_c'"):
        build_params(REG.get("policy_loss", "dual_clip"), {"clip_ratio_cc": 2.0})
    with pytest.raises(ConfigError, match="takes no parameters"):
        build_params(REG.get("policy_loss", "vanilla_pg"), {"clip_low": 0.1})


def test_keyword_params_and_bound_params_agree() -> None:
    logp, old, adv, mask = random_inputs(10)
    component = REG.get("policy_loss", "dual_clip")
    by_keyword, _ = component(logp, old, adv, mask, clip_ratio_c=2.0)
    bound = component.bind(build_params(component, {"clip_ratio_c": 2.0}))
    by_bound, _ = bound(logp=logp, old_logp=old, advantages=adv, response_mask=mask)
    assert torch.equal(by_keyword, by_bound)


def test_one_ratio_helper_clamps_at_twenty() -> None:
    log_ratio = torch.tensor([-50.0, -20.0, 0.0, 20.0, 50.0], requires_grad=True)
    ratio = loss_parts.importance_ratio(log_ratio)
    assert ratio.tolist() == pytest.approx([math.exp(-20), math.exp(-20), 1.0, math.exp(20), math.exp(20)], rel=1e-6)
    ratio.sum().backward()
    assert log_ratio.grad[0] == 0 and log_ratio.grad[-1] == 0    # flat outside the clamp


# ============================================================== docs


def test_doc_snippets_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= len(NAMES)
    for number, block in enumerate(blocks):
        exec(compile(block, f"{DOC.name}[block {number}]", "exec"), {})


def test_doc_covers_every_component_and_parameter() -> None:
    text = DOC.read_text()
    for name in NAMES:
        component = REG.get("policy_loss", name)
        assert f"## `{name}`" in text, name
        assert component.paper.removeprefix("arXiv:") in text, name
        for alias in component.aliases:
            assert f"`{alias}`" in text, alias
        if component.params is not None:
            for field in component.params.__dataclass_fields__:
                assert f"`{field}`" in text, (name, field)


# ============================================================== luspo, vespo, dppo by hand


def test_luspo_is_gspo_times_the_length_under_its_aggregation() -> None:
    """luspo's per-token loss is gspo's; it registers seq-mean-token-sum, so one sequence of
    |y| tokens contributes |y|·L_i where gspo (seq-mean-token-mean) contributes L_i."""
    logp = torch.tensor([[0.0, -0.1, -0.2], [-0.3, 0.0, 0.0]], dtype=torch.float64)
    old = torch.zeros_like(logp)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    params = {"clip_low": 0.5, "clip_high": 0.5}
    luspo_loss, _ = call("luspo", logp, old, adv, mask, **params)
    gspo_loss, _ = call("gspo", logp, old, adv, mask, **params)
    assert torch.equal(luspo_loss, gspo_loss)
    assert REG.get("policy_loss", "luspo").meta["loss_agg"] == "seq-mean-token-sum"
    agg = {m: REG.get("loss_agg", m) for m in ("seq-mean-token-sum", "seq-mean-token-mean")}
    # sequence 0: s = exp(-0.1) = 0.904837 inside [0.5, 1.5]: L = -s; sequence 1: s = exp(-0.15), L = +s
    s0, s1 = math.exp(-0.1), math.exp(-0.15)
    assert float(agg["seq-mean-token-sum"](loss=luspo_loss, mask=mask)) == pytest.approx((3 * -s0 + 2 * s1) / 2)
    assert float(agg["seq-mean-token-mean"](loss=gspo_loss, mask=mask)) == pytest.approx((-s0 + s1) / 2)


def test_vespo_hand_computed_weight_and_gradient() -> None:
    # one positive sequence: log w = 0.2 + 0.1 = 0.3; φ = exp(3 + 2·0.3 − 3·e^0.3) (k 2, λ 3)
    logp = torch.tensor([[-0.8, -0.9]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    adv = torch.tensor([[2.0, 2.0]], dtype=torch.float64)
    loss, metrics = call("vespo", logp, old, adv, torch.ones(1, 2, dtype=torch.float64))
    phi = math.exp(3 + 2 * 0.3 - 3 * math.exp(0.3))
    assert loss.detach().flatten().tolist() == pytest.approx([-phi * 2 * -0.8, -phi * 2 * -0.9])
    assert metrics["weight_mean"].item() == pytest.approx(phi) and metrics["clipfrac"].item() == 0.0
    loss.sum().backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-2 * phi, -2 * phi])    # φ is a stop-gradient weight
    on_policy, metrics = call("vespo", old.clone(), old, adv, torch.ones(1, 2, dtype=torch.float64))
    assert metrics["weight_mean"].item() == pytest.approx(1.0)                    # φ(1) = 1: REINFORCE


def test_dppo_masks_tokens_that_moved_past_delta_in_the_advantages_direction() -> None:
    # anchor (rollout) probabilities 0.5; current 0.7 (+0.2), 0.6 (+0.1), 0.3 (−0.2), 0.45 (−0.05)
    p = torch.tensor([[0.7, 0.6, 0.3, 0.45]], dtype=torch.float64)
    logp = p.log().requires_grad_(True)
    rollout = torch.full_like(p, math.log(0.5))
    old = logp.detach().clone()                                   # π_old = π: only μ differs
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    loss, metrics = call("dppo", logp, old, adv, torch.ones_like(p), rollout=rollout)
    # tv, δ 0.15: token 0 (+0.2 with A > 0) and token 2 (−0.2 with A ≤ 0) are masked
    w1, w3 = 0.6 / 0.5, 0.45 / 0.5
    assert loss.detach().flatten().tolist() == pytest.approx([0.0, -w1 * math.log(0.6), 0.0, w3 * math.log(0.45)])
    assert metrics["clipfrac"].item() == 0.5 and metrics["clipfrac_lower"].item() == 0.25
    loss.sum().backward()
    assert logp.grad.flatten().tolist() == pytest.approx([0.0, -w1, 0.0, w3])     # no gradient through w
    # anchored at π_old instead nothing moved, so nothing is masked
    _, metrics = call("dppo", logp.detach(), old, adv, torch.ones_like(p), rollout=rollout, anchor="old")
    assert metrics["clipfrac"].item() == 0.0
