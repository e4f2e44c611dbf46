"""KL penalties (kind ``kl_estimator``) and KL controllers (kind ``kl_controller``):
plugins/kl.py against hand-computed values, formula fixtures, invariants, the registry and
the docs page."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlzoo.config.params import build_params
from rlzoo.core.errors import ConfigError
from rlzoo.api import check_component
from rlzoo_plugins import kl as kl_module
import zoo
from zoo import REGISTRY, builtin_names

DOC = Path(__file__).parents[1] / "docs" / "algorithms" / "kl.md"
ESTIMATORS = tuple(name for name in builtin_names("kl_estimator")            # the sampled-token ones
                   if "logits" not in REGISTRY.get("kl_estimator", name).needs)
ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}


@pytest.fixture(scope="module")
def reg():
    return zoo.REGISTRY


def _grad(name: str, logp: torch.Tensor, ref: torch.Tensor, reg) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(value, d sum(value)/d logp, ref's grad) of estimator ``name``."""
    lp = logp.clone().requires_grad_(True)
    rf = ref.clone().requires_grad_(True)
    value = reg.get("kl_estimator", name)(lp, rf)
    value.sum().backward()
    return value.detach(), lp.grad, rf.grad


# ----------------------------------------------------------------------- hand-computed

# logp = [-1.0, -2.0, -0.5], ref = [-1.5, -1.0, -0.5]  ->  x = logp - ref = [0.5, -1.0, 0.0]
LOGP = torch.tensor([[-1.0, -2.0, -0.5]])
REF = torch.tensor([[-1.5, -1.0, -0.5]])
E_HALF = math.exp(-0.5)   # 0.60653066
E_ONE = math.e            # 2.71828183
HAND = {
    # name: (value, gradient wrt logp)
    "k1": ([0.5, -1.0, 0.0], [1.0, 1.0, 1.0]),                      # x; dx/dlogp = 1
    "abs": ([0.5, 1.0, 0.0], [1.0, -1.0, 0.0]),                     # |x|; sign(x) (0 at 0)
    "k2": ([0.125, 0.5, 0.0], [0.5, -1.0, 0.0]),                    # x²/2 ; x
    # k3 = e^{-x} + x - 1: 0.60653-0.5=0.10653, e-2=0.71828, 0 ; grad 1 - e^{-x}
    "k3": ([E_HALF - 0.5, E_ONE - 2.0, 0.0], [1 - E_HALF, 1 - E_ONE, 0.0]),
    "k1+": ([0.5, -1.0, 0.0], [0.5, -1.0, 0.0]),                    # value k1, gradient k2 (= x)
    "k3+": ([E_HALF - 0.5, E_ONE - 2.0, 0.0], [0.5, -1.0, 0.0]),    # value k3, gradient k2
}


@pytest.mark.parametrize("name", ESTIMATORS)
def test_estimator_hand_computed(name, reg) -> None:
    value, grad, ref_grad = _grad(name, LOGP, REF, reg)
    expected_value, expected_grad = HAND[name]
    assert torch.allclose(value, torch.tensor([expected_value]), atol=1e-6)
    assert torch.allclose(grad, torch.tensor([expected_grad]), atol=1e-6)
    assert ref_grad is None, "the reference must never receive a gradient"


def test_k3_clamps_exactly_like_verl_low_var_kl(reg) -> None:
    k3 = reg.get("kl_estimator", "k3")
    # x = -2: e^2 - 2 - 1 = 4.389056 (inside both clamps)
    # x = -3: e^3 - 3 - 1 = 16.0855 -> clamped to 10
    # x = 30: exponent -30 -> -20: e^-20 + 20 - 1 = 19.000000002 -> 10
    # x = -100: exponent 100 -> 20: e^20 - 21 -> 10 (and no inf/NaN in the gradient)
    x = torch.tensor([[-2.0, -3.0, 30.0, -100.0, 100.0]])
    logp = x.clone().requires_grad_(True)
    value = k3(logp, torch.zeros_like(x))
    assert torch.allclose(value.detach(), torch.tensor([[math.exp(2) - 3, 10.0, 10.0, 10.0, 10.0]]), atol=1e-5)
    value.sum().backward()
    # the clamps zero the gradient where they bind; 1 - e^{2} where they do not
    assert torch.allclose(logp.grad, torch.tensor([[1 - math.exp(2), 0.0, 0.0, 0.0, 0.0]]), atol=1e-5)


def test_aliases_resolve(reg) -> None:
    for alias, name in ALIASES.items():
        assert reg.get("kl_estimator", alias).name == name
    assert set(ESTIMATORS) | {"full"} <= set(reg.names("kl_estimator"))


# ----------------------------------------------------------------------- fixtures (seeded)


def _formula(name: str, x: float) -> tuple[float, float]:
    """(value, gradient wrt logp) from the formulas, scalar Python."""
    k2, k2_grad = 0.5 * x * x, x
    if name == "k1":
        return x, 1.0
    if name == "abs":
        return abs(x), (1.0 if x > 0 else -1.0 if x < 0 else 0.0)
    if name == "k2":
        return k2, k2_grad
    neg_x = min(max(-x, -20.0), 20.0)
    raw = math.exp(neg_x) - neg_x - 1.0
    k3 = min(max(raw, -10.0), 10.0)
    inside = -20.0 < -x < 20.0 and -10.0 < raw < 10.0
    k3_grad = (1.0 - math.exp(neg_x)) if inside else 0.0
    if name == "k3":
        return k3, k3_grad
    if name == "k1+":
        return x, k2_grad
    if name == "k3+":
        return k3, k2_grad
    raise KeyError(name)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_estimator_fixture(name, reg) -> None:
    gen = torch.Generator().manual_seed(11)
    ref = -torch.rand(4, 7, generator=gen, dtype=torch.float64) * 4
    logp = ref + torch.randn(4, 7, generator=gen, dtype=torch.float64) * 1.5
    value, grad, _ = _grad(name, logp, ref, reg)
    for i in range(4):
        for t in range(7):
            want_value, want_grad = _formula(name, float(logp[i, t] - ref[i, t]))
            assert value[i, t].item() == pytest.approx(want_value, abs=1e-9)
            assert grad[i, t].item() == pytest.approx(want_grad, abs=1e-9)


# ----------------------------------------------------------------------- properties


@pytest.mark.parametrize("name", ESTIMATORS)
def test_estimator_invariants(name, reg) -> None:
    check_component(reg.get("kl_estimator", name))


@pytest.mark.parametrize("name", ESTIMATORS)
def test_padding_garbage_and_width_do_not_change_valid_positions(name, reg) -> None:
    gen = torch.Generator().manual_seed(5)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
    ref = -torch.rand(3, 4, generator=gen) * 3
    logp = ref + torch.randn(3, 4, generator=gen)
    value, grad, _ = _grad(name, logp, ref, reg)
    for garbage in (float("nan"), float("inf"), -float("inf"), 1e30):
        lp_g = torch.where(mask.bool(), logp, torch.full_like(logp, garbage))
        rf_g = torch.where(mask.bool(), ref, torch.full_like(ref, -garbage))
        lp_g.requires_grad_(True)
        out = reg.get("kl_estimator", name)(lp_g, rf_g.requires_grad_(True))
        out.sum().backward()
        valid = mask.bool()
        assert torch.equal(out.detach()[valid], value[valid])
        assert torch.equal(lp_g.grad[valid], grad[valid])
    wide_value, wide_grad, _ = _grad(name, torch.cat([logp, torch.zeros(3, 5)], 1),
                                     torch.cat([ref, torch.full((3, 5), -7.0)], 1), reg)
    assert torch.equal(wide_value[:, :4], value) and torch.equal(wide_grad[:, :4], grad)


@settings(max_examples=40, deadline=None)
@given(x=st.floats(min_value=-60.0, max_value=60.0, allow_nan=False), base=st.floats(-10.0, 0.0))
def test_estimators_finite_and_signs(x: float, base: float) -> None:
    logp = torch.tensor([[base + x]], dtype=torch.float32, requires_grad=True)
    ref = torch.tensor([[base]], dtype=torch.float32)
    for fn in (kl_module.kl_k1, kl_module.kl_abs, kl_module.kl_k2, kl_module.kl_k3,
               kl_module.kl_k1_plus, kl_module.kl_k3_plus):
        logp.grad = None
        value = fn(logp, ref)
        value.sum().backward()
        assert torch.isfinite(value).all() and torch.isfinite(logp.grad).all()
    with torch.no_grad():
        assert float(kl_module.kl_abs(logp, ref)) >= 0
        assert float(kl_module.kl_k2(logp, ref)) >= 0
        assert -1e-6 <= float(kl_module.kl_k3(logp, ref)) <= 10   # >= 0 up to float32 rounding


@pytest.mark.parametrize("name", ESTIMATORS)
def test_zero_when_policies_agree(name, reg) -> None:
    ref = -torch.rand(3, 5) * 4
    value, grad, _ = _grad(name, ref.clone(), ref, reg)
    assert torch.equal(value, torch.zeros_like(value))
    if name != "k1":   # k1's gradient is 1 everywhere; the others are flat at x = 0
        assert torch.equal(grad, torch.zeros_like(grad))


# ----------------------------------------------------------------------- full


def _full_direct(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """Σ_v softmax(z)·(log_softmax(z) − log_softmax(z_ref)) in one unchunked shot."""
    log_pi = torch.log_softmax(logits, -1)
    return (log_pi.exp() * (log_pi - torch.log_softmax(ref_logits, -1))).sum(-1)


def test_full_hand_computed(reg) -> None:
    full = reg.get("kl_estimator", "full")
    # π = softmax([0, 0]) = [1/2, 1/2]; π_ref = softmax([0, ln 3]) = [1/4, 3/4]
    # KL = ½·ln(½ / ¼) + ½·ln(½ / ¾) = ½·ln 2 + ½·ln(2/3) = ½·ln(4/3) = 0.1438410
    # ∂KL/∂z_j = π_j·(d_j − KL), d = [ln 2, ln(2/3)]  ->  [+0.2746531, −0.2746531]
    # second token: identical distributions -> 0 with zero gradient
    logits = torch.tensor([[[0.0, 0.0], [1.0, 2.0]]], requires_grad=True)
    ref_logits = torch.tensor([[[0.0, math.log(3.0)], [1.0, 2.0]]], requires_grad=True)
    value = full(logits=logits, ref_logits=ref_logits)
    assert value.shape == (1, 2)
    assert torch.allclose(value.detach(), torch.tensor([[0.5 * math.log(4 / 3), 0.0]]), atol=1e-6)
    value.sum().backward()
    g = 0.5 * (math.log(2) - 0.5 * math.log(4 / 3))
    assert torch.allclose(logits.grad, torch.tensor([[[g, -g], [0.0, 0.0]]]), atol=1e-6)
    assert ref_logits.grad is None, "the reference logits must never receive a gradient"


def test_full_fixture_against_plain_loops(reg) -> None:
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64) * 2
    ref_logits = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64) * 2
    value = reg.get("kl_estimator", "full")(logits=logits, ref_logits=ref_logits, chunk_size=4)
    for i in range(2):
        for t in range(3):
            z = [float(v) for v in logits[i, t]]
            zr = [float(v) for v in ref_logits[i, t]]
            lse = math.log(sum(math.exp(v) for v in z))
            lse_r = math.log(sum(math.exp(v) for v in zr))
            want = sum(math.exp(a - lse) * ((a - lse) - (b - lse_r)) for a, b in zip(z, zr))
            assert value[i, t].item() == pytest.approx(want, abs=1e-9)


def test_full_is_the_expectation_of_k1_over_the_vocabulary(reg) -> None:
    # Σ_v π(v)·k1(v) with k1(v) = log π(v) − log π_ref(v) evaluated token by token
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 4, 6, generator=gen, dtype=torch.float64)
    ref_logits = torch.randn(2, 4, 6, generator=gen, dtype=torch.float64)
    log_pi, log_ref = torch.log_softmax(logits, -1), torch.log_softmax(ref_logits, -1)
    k1 = reg.get("kl_estimator", "k1")
    expectation = sum(log_pi[..., v].exp() * k1(log_pi[..., v], log_ref[..., v]) for v in range(6))
    value = reg.get("kl_estimator", "full")(logits=logits,
                                          ref_logits=ref_logits)
    assert torch.allclose(value, expectation, atol=1e-12)
    assert (value >= 0).all()


@pytest.mark.parametrize("chunk_size", [1, 2, 5, 7, 1024])
def test_full_chunk_size_changes_nothing(chunk_size, reg) -> None:
    gen = torch.Generator().manual_seed(9)
    base = torch.randn(3, 5, 11, generator=gen)
    ref_logits = torch.randn(3, 5, 11, generator=gen)
    weights = torch.randn(3, 5, generator=gen)
    logits = base.clone().requires_grad_(True)
    value = reg.get("kl_estimator", "full")(logits=logits,
                                          ref_logits=ref_logits, chunk_size=chunk_size)
    (value * weights).sum().backward()
    direct_logits = base.clone().requires_grad_(True)
    direct = _full_direct(direct_logits, ref_logits)
    (direct * weights).sum().backward()
    assert torch.allclose(value.detach(), direct.detach(), atol=1e-6)
    assert torch.allclose(logits.grad, direct_logits.grad, atol=1e-6)


def test_full_under_no_grad_and_dtype(reg) -> None:
    full = reg.get("kl_estimator", "full")
    logits = torch.randn(2, 3, 4, dtype=torch.bfloat16)
    ref_logits = torch.randn(2, 3, 4, dtype=torch.bfloat16)
    with torch.no_grad():
        value = full(logits=logits, ref_logits=ref_logits)
    assert value.dtype == torch.float32 and not value.requires_grad
    # computed in float32 internally
    assert torch.allclose(value, _full_direct(logits.float(), ref_logits.float()), atol=1e-6)
    empty = full(logits=torch.zeros(0, 3, 4), ref_logits=torch.zeros(0, 3, 4))
    assert empty.shape == (0, 3)


def test_full_holds_no_second_logits_sized_tensor_for_backward(reg) -> None:
    # Everything autograd saves outside the checkpointed chunks: with checkpointing only
    # views of the inputs (no new B×T×V float32 tensors) may be kept.
    B, T, V = 2, 64, 512
    logits = torch.randn(B, T, V, requires_grad=True)
    ref_logits = torch.randn(B, T, V)
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        value = reg.get("kl_estimator", "full")(logits=logits,
                                              ref_logits=ref_logits, chunk_size=16)
    new_bytes = sum(t.numel() * t.element_size() for t in saved
                    if t.untyped_storage().data_ptr() not in
                    {logits.untyped_storage().data_ptr(), ref_logits.untyped_storage().data_ptr()})
    assert new_bytes < B * T * V * 4 // 4
    value.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_full_edge_cases(reg) -> None:
    full = reg.get("kl_estimator", "full")
    # π(v) = 0 for a −inf logit: the term is 0 (not 0·−inf = NaN); π = [1, 0], π_ref = [½, ½] -> ln 2
    logits = torch.tensor([[[0.0, -float("inf")]]], requires_grad=True)
    value = full(logits=logits, ref_logits=torch.zeros(1, 1, 2))
    assert value.item() == pytest.approx(math.log(2), abs=1e-6)
    value.sum().backward()
    assert torch.isfinite(logits.grad).all()
    # extreme but finite logits: finite values and gradients
    logits = (torch.randn(2, 3, 7) * 50).requires_grad_(True)
    value = full(logits=logits, ref_logits=torch.randn(2, 3, 7) * 50)
    value.sum().backward()
    assert torch.isfinite(value).all() and torch.isfinite(logits.grad).all()


def test_full_padding_rows_do_not_touch_valid_rows(reg) -> None:
    gen = torch.Generator().manual_seed(4)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    base = torch.randn(2, 3, 6, generator=gen)
    ref_logits = torch.randn(2, 3, 6, generator=gen)

    def run(lg, rl):
        lg = lg.clone().requires_grad_(True)
        v = reg.get("kl_estimator", "full")(logits=lg, ref_logits=rl, chunk_size=2)
        torch.where(mask if v.shape[1] == 3 else torch.cat([mask, torch.zeros(2, v.shape[1] - 3, dtype=torch.bool)], 1),
                    v, torch.zeros_like(v)).sum().backward()
        return v.detach(), lg.grad

    value, grad = run(base, ref_logits)
    garbage = torch.where(mask[..., None], base, torch.full_like(base, float("nan")))
    value_g, grad_g = run(garbage, torch.where(mask[..., None], ref_logits, torch.full_like(ref_logits, 1e4)))
    assert torch.equal(value_g[mask], value[mask]) and torch.equal(grad_g[mask], grad[mask])
    wide = torch.cat([base, torch.randn(2, 4, 6, generator=gen)], 1)
    wide_ref = torch.cat([ref_logits, torch.randn(2, 4, 6, generator=gen)], 1)
    value_w, grad_w = run(wide, wide_ref)
    assert torch.allclose(value_w[:, :3][mask], value[mask]) and torch.allclose(grad_w[:, :3][mask], grad[mask])


def test_full_registration_and_params(reg) -> None:
    component = reg.get("kl_estimator", "full")
    assert component.needs == frozenset({"logits"})   # derived from its inputs: logits, ref_logits
    assert build_params(component, {}).chunk_size == 1024
    assert build_params(component, {"chunk_size": 8}).chunk_size == 8
    for bad in (0, -3):
        with pytest.raises(ConfigError, match="chunk_size must be > 0"):
            build_params(component, {"chunk_size": bad})
    with pytest.raises(ConfigError, match="chunk_size"):
        build_params(component, {"chunk_sise": 8})
    for name in ESTIMATORS:
        assert reg.get("kl_estimator", name).needs == frozenset({"reference"})   # from ref_logp
        with pytest.raises(ConfigError, match="takes no parameters"):
            build_params(reg.get("kl_estimator", name), {"chunk_size": 4})


# ----------------------------------------------------------------------- controllers


def test_fixed_controller(reg) -> None:
    cls = reg.get("kl_controller", "fixed").fn
    ctrl = cls(0.05, None)
    for kl, n in ((100.0, 64), (0.0, 64), (6.0, 1)):
        ctrl.update(kl, n)
        assert ctrl.value == 0.05
    assert ctrl.state_dict() == {"value": 0.05}
    other = cls(1.0)
    other.load_state_dict({"value": 0.3})
    assert other.value == 0.3
    assert reg.get("kl_controller", "fixed").params is None


def test_adaptive_controller_hand_computed(reg) -> None:
    ctrl = reg.get("kl_controller", "adaptive")(0.1)          # target 6, horizon 10000
    ctrl.update(9.0, 100)    # e = clip(9/6 − 1 = 0.5) = 0.2; β = 0.1·(1 + 0.2·100/10000) = 0.1002
    assert ctrl.value == pytest.approx(0.1002, abs=1e-12)
    ctrl.update(6.6, 100)    # e = 0.1; β = 0.1002·1.001 = 0.1003002
    assert ctrl.value == pytest.approx(0.1003002, abs=1e-12)
    ctrl.update(0.0, 1000)   # e = clip(−1) = −0.2; β = 0.1003002·(1 − 0.02) = 0.098294196
    assert ctrl.value == pytest.approx(0.098294196, abs=1e-12)
    ctrl.update(6.0, 5000)   # e = 0: unchanged
    assert ctrl.value == pytest.approx(0.098294196, abs=1e-12)

    custom = reg.get("kl_controller", "adaptive")(1.0, target=3.0, horizon=100)
    custom.update(3.3, 10)   # e = 0.1; β = 1·(1 + 0.1·10/100) = 1.01
    assert custom.value == pytest.approx(1.01, abs=1e-12)
    custom.update(2.4, 10)   # e = −0.2 (2.4/3 − 1 = −0.2 exactly); β = 1.01·0.98 = 0.9898
    assert custom.value == pytest.approx(0.9898, abs=1e-12)


def test_adaptive_controller_fixture_and_resume(reg) -> None:
    component = reg.get("kl_controller", "adaptive")
    params = build_params(component, {"target": 2.5, "horizon": 500})
    ctrl = component.fn(0.2, params)                 # how the engine builds it
    rng = random.Random(1234)
    steps = [(rng.uniform(0.0, 6.0), rng.randint(1, 64)) for _ in range(30)]
    expected = 0.2
    for i, (kl, n) in enumerate(steps):
        ctrl.update(kl, n)
        error = min(max(kl / 2.5 - 1.0, -0.2), 0.2)
        expected = expected * (1.0 + error * n / 500)
        assert ctrl.value == pytest.approx(expected, rel=1e-12)
        if i == 14:
            saved = ctrl.state_dict()
    resumed = component.fn(0.2, params)
    resumed.load_state_dict(saved)
    for kl, n in steps[15:]:
        resumed.update(kl, n)
    assert resumed.value == ctrl.value
    assert isinstance(ctrl.value, float)


def test_adaptive_controller_params_and_errors(reg) -> None:
    component = reg.get("kl_controller", "adaptive")
    assert component.paper == "arXiv:1909.08593"
    defaults = build_params(component, {})
    assert (defaults.target, defaults.horizon) == (6.0, 10000)
    for bad, message in (({"target": 0.0}, "target must be > 0"), ({"target": -1.0}, "target must be > 0"),
                         ({"horizon": 0}, "horizon must be > 0"), ({"horizon": -10}, "horizon must be > 0")):
        with pytest.raises(ConfigError, match=message):
            build_params(component, bad)
    with pytest.raises(ConfigError, match="horizon"):
        build_params(component, {"horizon": "soon"})
    ctrl = component.fn(0.1, defaults)
    with pytest.raises(ValueError, match="non-finite current_kl"):
        ctrl.update(float("nan"), 8)
    assert ctrl.value == 0.1


# ----------------------------------------------------------------------- docs


def test_doc_snippets_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks, "docs/algorithms/kl.md has no python snippet"
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {})


def test_doc_names_every_component(reg) -> None:
    text = DOC.read_text()
    for kind in ("kl_estimator", "kl_controller"):
        for component in reg.components(kind):
            if component.fn.__module__ != "rlzoo_plugins.kl":
                continue
            assert f"`{component.name}`" in text, component.name
    for key in ("kl.apply", "kl.coef", "kl.estimator", "kl.controller"):
        assert key in text


# ----------------------------------------------------------------------- forward_topk


def _forward_topk_loops(logits: torch.Tensor, ref_logits: torch.Tensor, k: int) -> torch.Tensor:
    """verl compute_forward_kl_topk (+ clamp_min(0)), one token at a time, in float64."""
    out = torch.zeros(logits.shape[:2], dtype=torch.float64)
    for i in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            z, r = logits[i, t].double(), ref_logits[i, t].double()
            log_pi = [x - math.log(sum(math.exp(y) for y in z.tolist())) for x in z.tolist()]
            log_ref = [x - math.log(sum(math.exp(y) for y in r.tolist())) for x in r.tolist()]
            top = sorted(range(len(log_ref)), key=lambda v: -log_ref[v])[:k]
            out[i, t] = max(0.0, sum(math.exp(log_ref[v]) * (log_ref[v] - log_pi[v]) for v in top))
    return out


def test_forward_topk_hand_computed(reg) -> None:
    # reference probs [0.5, 0.3, 0.2], policy probs [0.25, 0.25, 0.5]; K = 2 (tokens 0, 1):
    #   0.5·ln(0.5/0.25) + 0.3·ln(0.3/0.25) = 0.346574 + 0.054696 = 0.401270
    # K = 3 adds 0.2·ln(0.2/0.5) = -0.183258 -> the full forward KL 0.218012
    # policy = reference -> 0; a policy far above the reference on the top-K -> clamped at 0
    fwd = reg.get("kl_estimator", "forward_topk")
    ref = torch.tensor([0.5, 0.3, 0.2]).log().view(1, 1, 3)
    logits = torch.tensor([0.25, 0.25, 0.5], requires_grad=True)
    value = fwd(logits=logits.log().view(1, 1, 3), ref_logits=ref, topk=2)
    want = 0.5 * math.log(2) + 0.3 * math.log(1.2)
    assert value.item() == pytest.approx(want, rel=1e-6)
    assert fwd(logits=logits.log().view(1, 1, 3), ref_logits=ref, topk=3).item() == pytest.approx(
        want + 0.2 * math.log(0.4), rel=1e-6)
    assert fwd(logits=ref.clone(), ref_logits=ref, topk=2).item() == 0.0
    # policy [0.6, 0.39, 0.01]: 0.5·ln(0.5/0.6) + 0.3·ln(0.3/0.39) < 0 -> 0, no gradient
    z = torch.tensor([0.6, 0.39, 0.01]).log().view(1, 1, 3).requires_grad_(True)
    clamped = fwd(logits=z, ref_logits=ref, topk=2)
    clamped.sum().backward()
    assert clamped.item() == 0.0 and (z.grad == 0).all()
    # gradient wrt the policy logits z: d/dz_j [-Σ_{v∈K} p_ref(v)·log softmax(z)_v]
    #   = -p_ref(j)·[j∈K] + (Σ_{v∈K} p_ref(v))·π(j) = [-0.5 + 0.8·0.25, -0.3 + 0.8·0.25, 0.8·0.5]
    z = torch.tensor([0.25, 0.25, 0.5]).log().view(1, 1, 3).requires_grad_(True)
    fwd(logits=z, ref_logits=ref, topk=2).sum().backward()
    assert z.grad.view(-1).tolist() == pytest.approx([-0.3, -0.1, 0.4], rel=1e-5)


@pytest.mark.parametrize("k", [1, 3, 7, 50])
def test_forward_topk_matches_verls_formula_in_loops(k: int, reg) -> None:
    gen = torch.Generator().manual_seed(k)
    logits = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64) * 2
    ref_logits = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64) * 2
    value = reg.get("kl_estimator", "forward_topk")(logits=logits, ref_logits=ref_logits, topk=k, chunk_size=4)
    torch.testing.assert_close(value, _forward_topk_loops(logits, ref_logits, k))
    if k >= 7:                                     # the whole vocabulary: the exact forward KL, never < 0
        full_forward = reg.get("kl_estimator", "full")(logits=ref_logits, ref_logits=logits)
        torch.testing.assert_close(value, full_forward)


def test_forward_topk_invariants_edge_cases_and_params(reg) -> None:
    component = reg.get("kl_estimator", "forward_topk")
    assert component.needs == frozenset({"logits"})
    check_component(component)
    check_component(component, build_params(component, {"topk": 2, "chunk_size": 3}))
    fwd = component
    # a reference with -inf logits outside its support, K above the support: finite
    ref = torch.tensor([[[0.0, -math.inf, -math.inf, 1.0]]])
    value = fwd(logits=torch.zeros(1, 1, 4), ref_logits=ref, topk=4)
    assert torch.isfinite(value).all()
    p = torch.tensor([1.0, math.e]) / (1 + math.e)
    assert value.item() == pytest.approx(float((p * (p.log() - math.log(0.25))).sum()), rel=1e-6)
    assert fwd(logits=torch.zeros(0, 3, 4), ref_logits=torch.zeros(0, 3, 4)).shape == (0, 3)
    assert build_params(component, {}).topk == 32
    with pytest.raises(ConfigError, match="topk must be >= 1, got 0"):
        build_params(component, {"topk": 0})


def test_forward_topk_plans_like_full(reg) -> None:
    from rlzoo.plan.planner import load_config

    plan = load_config(reg, ["kl.coef=0.1", "kl.estimator={name: forward_topk, topk: 4}"]).plan
    assert plan.kl.uses_logits and plan.kl.placement == "loss" and "ref_logits" in plan.passes
    with pytest.raises(ConfigError):
        load_config(reg, ["kl.coef=0.1", "kl.estimator=forward_topk", "kl.apply=reward"])
