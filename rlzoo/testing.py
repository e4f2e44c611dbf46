"""Invariant checks every component of a kind must pass; for plugin authors' test suites.

::

    from rlzoo.testing import check_component
    from rlzoo.plugins import build_registry, make_plugin_manager

    def test_my_loss_keeps_the_invariants():
        registry = build_registry(make_plugin_manager())
        check_component(registry.get("policy_loss", "my_loss"))

Each ``check_*`` raises ``AssertionError`` with a message naming the broken invariant:

- masked (padded) positions never influence valid ones, whatever values they hold;
- the padding width (extra all-padding columns) never changes the result;
- no NaN/inf on edge cases: all-equal rewards, groups of size 1, empty responses
  (all-zero mask rows), log-ratios of ±50;
- gradients flow to ``logp`` only at valid positions and never into ``old_logp``,
  ``ref_logp`` or advantages.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from rlzoo.batch import BatchCounts
from rlzoo.registry import Component

B, T = 6, 5


def _mask(batch: int = B, width: int = T, empty_row: bool = True) -> torch.Tensor:
    lengths = torch.tensor([width, 3, 1, width - 1, 2, 0 if empty_row else 1])[:batch]
    return (torch.arange(width)[None, :] < lengths[:, None]).float()


def _pad(x: torch.Tensor, extra: int, value: float = 0.0) -> torch.Tensor:
    return torch.cat([x, torch.full((x.shape[0], extra), value, dtype=x.dtype)], 1)


def _garbage_where(x: torch.Tensor, mask: torch.Tensor, value: float) -> torch.Tensor:
    return torch.where(mask.bool(), x, torch.full_like(x, value))


def _assert_finite(name: str, what: str, *tensors: torch.Tensor) -> None:
    for tensor in tensors:
        assert torch.isfinite(tensor).all(), f"{name}: non-finite output on {what}"


def _close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5) -> bool:
    return torch.allclose(a, b, atol=atol, rtol=1e-5)


def check_policy_loss(fn: Callable[..., Any], name: str = "policy_loss") -> None:
    """Invariants of ``fn(logp, old_logp, advantages, mask) -> (loss (B, T), metrics)``."""
    gen = torch.Generator().manual_seed(0)
    mask = _mask()
    old = -torch.rand(B, T, generator=gen) * 3
    logp = old + torch.randn(B, T, generator=gen) * 0.3
    adv = torch.randn(B, T, generator=gen)

    def run(lp, ol, ad, m):
        lp = lp.clone().requires_grad_(True)
        ol = ol.clone().requires_grad_(True)
        ad = ad.clone().requires_grad_(True)
        torch.manual_seed(0)
        loss, metrics = fn(lp, ol, ad, m)
        return lp, ol, ad, loss, metrics

    lp, ol, ad, loss, metrics = run(logp, old, adv, mask)
    assert loss.shape == (B, T), f"{name}: loss shape {tuple(loss.shape)}, expected {(B, T)}"
    for key in ("clipfrac", "approx_kl"):
        assert key in metrics, f"{name}: metric {key!r} missing"
    for key, value in metrics.items():
        value = torch.as_tensor(value)
        assert value.dim() == 0 and torch.isfinite(value), f"{name}: metric {key!r} is not a finite scalar"
        assert not value.requires_grad, f"{name}: metric {key!r} is not detached"
    _assert_finite(name, "random inputs", loss)

    (loss * mask).sum().backward()
    assert lp.grad is not None, f"{name}: no gradient reaches logp"
    assert (lp.grad * (1 - mask)).abs().max() == 0, f"{name}: gradient at masked positions"
    for other, label in ((ol, "old_logp"), (ad, "advantages")):
        assert other.grad is None or other.grad.abs().max() == 0, f"{name}: gradient flows into {label}"

    # masked positions hold garbage: valid outputs unchanged
    _, _, _, loss_g, _ = run(_garbage_where(logp, mask, 40.0), _garbage_where(old, mask, -40.0),
                             _garbage_where(adv, mask, 1e4), mask)
    assert _close(loss * mask, loss_g * mask), f"{name}: masked positions change valid losses"
    _assert_finite(name, "garbage in padding", loss_g * mask)

    # padding width
    _, _, _, loss_p, _ = run(_pad(logp, 3), _pad(old, 3), _pad(adv, 3), _pad(mask, 3))
    assert _close(loss * mask, (loss_p * _pad(mask, 3))[:, :T]), f"{name}: padding width changes the loss"

    # extreme log-ratios and all-zero advantages
    for shift, label in ((50.0, "log-ratio +50"), (-50.0, "log-ratio -50")):
        _, _, _, extreme, ext_metrics = run(old + shift, old, adv, mask)
        _assert_finite(name, label, extreme * mask, *[torch.as_tensor(v) for v in ext_metrics.values()])
    _, _, _, zero_adv, _ = run(logp, old, torch.zeros_like(adv), mask)
    _assert_finite(name, "zero advantages", zero_adv * mask)
    _, _, _, empty, _ = run(logp, old, adv, torch.zeros_like(mask))
    _assert_finite(name, "an all-empty batch", empty)


def check_advantage_estimator(fn: Callable[..., Any], name: str = "advantage",
                              needs: frozenset[str] = frozenset()) -> None:
    """Invariants of ``fn(token_rewards, mask, group_ids, values, baseline_scores) ->
    (advantages, returns)``."""
    gen = torch.Generator().manual_seed(1)
    mask = _mask()
    lengths = mask.sum(-1).long()
    scores = torch.rand(B, generator=gen)
    token_rewards = torch.zeros(B, T)
    rows = lengths > 0
    token_rewards[rows, lengths[rows] - 1] = scores[rows]
    group_ids = torch.tensor([0, 0, 0, 1, 1, 1])
    values = torch.randn(B, T, generator=gen) * mask if "critic" in needs else None
    baseline = torch.rand(B, generator=gen) if "greedy" in needs else None

    def run(r, m, g, v, b):
        with torch.enable_grad():
            adv, ret = fn(r, m, g, v, b)
        return adv, ret

    adv, ret = run(token_rewards, mask, group_ids, values, baseline)
    assert adv.shape == (B, T) and ret.shape == (B, T), f"{name}: outputs must be (B, T)"
    assert not adv.requires_grad, f"{name}: advantages carry a gradient"
    _assert_finite(name, "random inputs", adv, ret)
    assert (adv * (1 - mask)).abs().max() == 0, f"{name}: non-zero advantages on padding"

    garbage_r = _garbage_where(token_rewards, mask, 1e3)
    garbage_v = None if values is None else _garbage_where(values, mask, -1e3)
    adv_g, ret_g = run(garbage_r, mask, group_ids, garbage_v, baseline)
    assert _close(adv, adv_g), f"{name}: masked positions change advantages"

    adv_p, _ = run(_pad(token_rewards, 2), _pad(mask, 2), group_ids,
                   None if values is None else _pad(values, 2), baseline)
    assert _close(adv, adv_p[:, :T]), f"{name}: padding width changes advantages"

    same = torch.where(mask.bool(), torch.zeros_like(token_rewards), token_rewards)
    same[rows, lengths[rows] - 1] = 0.7
    for label, g in (("all-equal rewards", group_ids), ("groups of size 1", torch.arange(B))):
        a, r = run(same, mask, g, values, baseline)
        _assert_finite(name, label, a, r)
    a, r = run(torch.zeros(B, T), torch.zeros(B, T), group_ids,
               None if values is None else torch.zeros(B, T), baseline)
    _assert_finite(name, "empty responses", a, r)


def check_kl_penalty(fn: Callable[..., Any], name: str = "kl_penalty") -> None:
    """Invariants of ``fn(logp, ref_logp) -> (B, T)``: zero at logp == ref, finite at ±50,
    gradient only into ``logp``."""
    gen = torch.Generator().manual_seed(2)
    ref = -torch.rand(B, T, generator=gen) * 3
    assert _close(fn(ref.clone(), ref), torch.zeros(B, T)), f"{name}: KL of identical policies is not 0"
    for shift in (50.0, -50.0):
        logp = (ref + shift).requires_grad_(True)
        ref_g = ref.clone().requires_grad_(True)
        kl = fn(logp, ref_g)
        _assert_finite(name, f"log-ratio {shift:+.0f}", kl)
        kl.sum().backward()
        _assert_finite(name, f"gradient at log-ratio {shift:+.0f}", logp.grad)
        assert ref_g.grad is None or ref_g.grad.abs().max() == 0, f"{name}: gradient flows into ref_logp"


def check_loss_aggregation(fn: Callable[..., Any], name: str = "loss_agg") -> None:
    """Invariants of ``fn(loss, mask, counts=None)``: padding ignored, empty rows harmless,
    micro-batch sums with global counts equal the whole batch."""
    gen = torch.Generator().manual_seed(3)
    mask = _mask()
    loss = torch.randn(B, T, generator=gen)
    whole = fn(loss, mask)
    _assert_finite(name, "random inputs", whole)
    assert _close(whole, fn(_garbage_where(loss, mask, 1e6), mask)), f"{name}: padding changes the result"
    assert torch.isfinite(fn(loss, torch.zeros_like(mask))), f"{name}: NaN on an all-empty batch"
    counts = BatchCounts(tokens=float(mask.sum()), sequences=float((mask.sum(-1) > 0).sum()),
                         max_response_length=T)
    parts = sum(fn(loss[i:i + 2], mask[i:i + 2], counts=counts) for i in range(0, B, 2))
    assert _close(parts, fn(loss, mask, counts=counts)), f"{name}: micro-batch sum != whole batch"
    wide = fn(_pad(loss, 3, 7.0), _pad(mask, 3), counts=counts)
    assert _close(wide, fn(loss, mask, counts=counts)), f"{name}: padding width changes the result"


_CHECKS = {
    "policy_loss": check_policy_loss,
    "advantage": check_advantage_estimator,
    "kl_penalty": check_kl_penalty,
    "loss_agg": check_loss_aggregation,
}


def check_component(component: Component, params: Any = None) -> None:
    """Run the invariant checks of the component's kind (with default or given params)."""
    if component.kind not in _CHECKS:
        raise ValueError(f"no invariant checks for kind {component.kind!r}; "
                         f"kinds with checks: {', '.join(_CHECKS)}")
    fn = component.bind(params)
    if component.kind == "kl_penalty" and "logits" in component.needs:
        return  # needs full logits; checked by its own tests
    label = f"{component.kind} {component.name!r}"
    if component.kind == "advantage":
        check_advantage_estimator(fn, label, component.needs)
    else:
        _CHECKS[component.kind](fn, label)
