"""Value losses (kind ``value_loss``): plugins/value.py against hand-computed values, a
formula fixture, padding/gradient invariants, the registry and the docs page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import zoo
from rlzoo.config.params import build_params
from rlzoo.core.errors import ConfigError

DOC = Path(__file__).parents[1] / "docs" / "algorithms" / "value.md"
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def reg():
    return zoo.REGISTRY


def _run(reg, values, old_values, returns, mask, **params):
    """(loss, metrics, values.grad, old_values.grad, returns.grad) with loss·mask summed."""
    v = values.clone().requires_grad_(True)
    vo = old_values.clone().requires_grad_(True)
    r = returns.clone().requires_grad_(True)
    loss, metrics = reg.get("value_loss", "clipped")(v, vo, r, mask, **params)
    (loss * mask).sum().backward()
    return loss.detach(), metrics, v.grad, vo.grad, r.grad


# ε = 0.2. Row 0 has 3 valid tokens (the 4th is padding holding garbage), row 1 has 2.
VALUES = torch.tensor([[1.0, 0.0, 2.0, NAN], [1.0, -1.0, 5.0, 5.0]])
OLD = torch.tensor([[0.5, 0.0, 2.0, INF], [0.5, 0.0, -5.0, 5.0]])
RETURNS = torch.tensor([[2.0, 1.0, 1.0, -INF], [0.0, -2.0, NAN, 5.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])


def test_clipped_hand_computed(reg) -> None:
    loss, metrics, grad, old_grad, ret_grad = _run(reg, VALUES, OLD, RETURNS, MASK)
    # (0,0): V−V_old = 0.5 → clip 0.2 → V_clip = 0.7; (V−R)² = 1, (V_clip−R)² = 1.69
    #        → L = ½·1.69 = 0.845, clipped branch strictly larger; its gradient is 0 (clamp binds)
    # (0,1): V = V_old = 0 → V_clip = 0; both (0−1)² = 1 → L = 0.5, a tie (not counted); grad V−R = −1
    # (0,2): V = V_old = 2; (2−1)² = 1 → L = 0.5; grad V−R = 1
    # (1,0): V_clip = 0.7; (1−0)² = 1 > 0.49 → L = 0.5, unclipped branch; grad V−R = 1
    # (1,1): V−V_old = −1 → clip −0.2 → V_clip = −0.2; (−1+2)² = 1, (−0.2+2)² = 3.24
    #        → L = 1.62, clipped branch; grad 0
    # padding → 0
    assert torch.allclose(loss, torch.tensor([[0.845, 0.5, 0.5, 0.0], [0.5, 1.62, 0.0, 0.0]]), atol=1e-6)
    assert torch.allclose(grad, torch.tensor([[0.0, -1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]), atol=1e-6)
    # vf_clipfrac = 2 clipped of 5 valid = 0.4; vpred_mean = (1 + 0 + 2 + 1 − 1) / 5 = 0.6
    assert metrics["vf_clipfrac"].item() == pytest.approx(0.4)
    assert metrics["vpred_mean"].item() == pytest.approx(0.6)
    for value in metrics.values():
        assert value.dim() == 0 and not value.requires_grad
    assert old_grad is None or old_grad.abs().max() == 0
    assert ret_grad is None or ret_grad.abs().max() == 0


def test_clip_range_parameter(reg) -> None:
    # ε = 1: (0,0) V−V_old = 0.5 within range → V_clip = V → L = ½·(1−2)² = 0.5
    #        (1,1) V−V_old = −1 within range → L = ½·(−1+2)² = 0.5; nothing clipped
    loss, metrics, *_ = _run(reg, VALUES, OLD, RETURNS, MASK, clip_range=1.0)
    assert torch.allclose(loss, torch.tensor([[0.5, 0.5, 0.5, 0.0], [0.5, 0.5, 0.0, 0.0]]), atol=1e-6)
    assert metrics["vf_clipfrac"].item() == 0.0


def test_clipped_fixture_against_plain_loops(reg) -> None:
    gen = torch.Generator().manual_seed(21)
    B, T, eps = 4, 6, 0.3
    lengths = [6, 3, 0, 1]
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(T)] for n in lengths], dtype=torch.float64)
    values = torch.randn(B, T, generator=gen, dtype=torch.float64)
    old = values + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.4
    returns = torch.randn(B, T, generator=gen, dtype=torch.float64)
    loss, metrics, grad, *_ = _run(reg, values, old, returns, mask, clip_range=eps)
    clipped, valid, vsum = 0, 0, 0.0
    for i in range(B):
        for t in range(T):
            if not mask[i, t]:
                assert loss[i, t].item() == 0.0 and grad[i, t].item() == 0.0
                continue
            v, vo, r = values[i, t].item(), old[i, t].item(), returns[i, t].item()
            delta = v - vo
            v_clip = vo + min(max(delta, -eps), eps)
            unclipped, clipped_sq = (v - r) ** 2, (v_clip - r) ** 2
            assert loss[i, t].item() == pytest.approx(0.5 * max(unclipped, clipped_sq), abs=1e-12)
            if clipped_sq > unclipped:
                want_grad = (v_clip - r) if -eps < delta < eps else 0.0
            elif clipped_sq < unclipped:
                want_grad = v - r
            else:                       # tie: both branches equal; V_clip = V unless the clamp binds
                want_grad = (v - r) if -eps < delta < eps else 0.5 * (v - r)
            assert grad[i, t].item() == pytest.approx(want_grad, abs=1e-12)
            clipped += clipped_sq > unclipped
            valid += 1
            vsum += v
    assert metrics["vf_clipfrac"].item() == pytest.approx(clipped / valid, abs=1e-12)
    assert metrics["vpred_mean"].item() == pytest.approx(vsum / valid, abs=1e-12)


def test_padding_garbage_and_width_change_nothing(reg) -> None:
    gen = torch.Generator().manual_seed(2)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.float32)
    values, old, returns = (torch.randn(3, 5, generator=gen) for _ in range(3))
    ref = _run(reg, values, old, returns, mask)

    def garbage(x, fill):
        return torch.where(mask.bool(), x, torch.full_like(x, fill))

    for fill in (NAN, INF, -INF, 1e30):
        out = _run(reg, garbage(values, fill), garbage(old, -fill), garbage(returns, fill), mask)
        assert torch.equal(out[0], ref[0]) and torch.equal(out[2], ref[2])
        assert all(torch.equal(out[1][k], ref[1][k]) for k in ref[1])
        assert torch.isfinite(out[0]).all() and torch.isfinite(out[2]).all()

    def pad(x, fill=3.0):
        return torch.cat([x, torch.full((3, 4), fill)], 1)

    wide = _run(reg, pad(values), pad(old, -3.0), pad(returns), pad(mask, 0.0))
    assert torch.equal(wide[0][:, :5], ref[0]) and torch.equal(wide[2][:, :5], ref[2])
    assert (wide[0][:, 5:] == 0).all()
    assert all(torch.allclose(wide[1][k], ref[1][k]) for k in ref[1])


def test_empty_batch_is_finite(reg) -> None:
    zeros = torch.zeros(2, 3)
    loss, metrics, grad, *_ = _run(reg, torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3), zeros)
    assert (loss == 0).all() and (grad == 0).all()
    assert metrics["vf_clipfrac"].item() == 0.0 and metrics["vpred_mean"].item() == 0.0


@settings(max_examples=40, deadline=None)
@given(v=st.floats(-1e3, 1e3), vo=st.floats(-1e3, 1e3), r=st.floats(-1e3, 1e3),
       eps=st.floats(1e-4, 10.0))
def test_loss_bounds(v: float, vo: float, r: float, eps: float) -> None:
    from rlzoo_plugins.value import ClippedValueParams, clipped_value_loss

    values = torch.tensor([[v]], dtype=torch.float64, requires_grad=True)
    loss, metrics = clipped_value_loss(values, torch.tensor([[vo]], dtype=torch.float64),
                                       torch.tensor([[r]], dtype=torch.float64), torch.ones(1, 1),
                                       params=ClippedValueParams(clip_range=eps))
    loss.sum().backward()
    # the loss is never below the unclipped ½(V−R)², and equals it when |V − V_old| ≤ ε
    assert loss.item() >= 0.5 * (v - r) ** 2 - 1e-9 * max(1.0, (v - r) ** 2)
    if abs(v - vo) <= eps:
        assert loss.item() == pytest.approx(0.5 * (v - r) ** 2, rel=1e-9, abs=1e-12)
        assert metrics["vf_clipfrac"].item() == 0.0
    assert torch.isfinite(values.grad).all()
    assert metrics["vf_clipfrac"].item() in (0.0, 1.0)


def test_registry_params_and_needs(reg) -> None:
    component = reg.get("value_loss", "clipped")
    assert component.needs == frozenset()        # the engine decides about the critic
    assert component.paper == "arXiv:1707.06347"
    assert build_params(component, {}).clip_range == 0.2
    assert build_params(component, {"clip_range": 0.5}).clip_range == 0.5
    for bad in (0.0, -0.1):
        with pytest.raises(ConfigError, match="clip_range must be > 0"):
            build_params(component, {"clip_range": bad})
    with pytest.raises(ConfigError, match="clip_rang"):
        build_params(component, {"clip_rang": 0.1})


def test_engine_style_aggregation_matches_verl(reg) -> None:
    # verl: vf_loss = 0.5 * agg_loss(max(l1, l2)); here the ½ is per token, so agg(loss) equals it
    loss, *_ = _run(reg, VALUES, OLD, RETURNS, MASK)
    token_mean = reg.get("loss_agg", "token-mean")(loss, MASK)
    assert token_mean.item() == pytest.approx((0.845 + 0.5 + 0.5 + 0.5 + 1.62) / 5)


def test_doc_snippets_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks, "docs/algorithms/value.md has no python snippet"
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {})
