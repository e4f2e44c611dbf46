"""Invariant checks every component of a kind must pass; for plugin authors' test suites, which
import them from :mod:`rlzoo.api`::

    from rlzoo.api import build_registry, check_component, make_plugin_manager

    def test_my_loss_keeps_the_invariants():
        registry = build_registry(make_plugin_manager())
        check_component(registry.get("policy_loss", "my_loss"))
        check_component(registry.get("policy_loss", "my_loss"), {"clip_high": 0.28})

Kinds with checks: :data:`CHECKED_KINDS`. Components are called the way the engine calls
them: with keyword inputs (those the function names) and the output contract enforced
(:mod:`rlzoo.contract.checks`). Each ``check_*`` also takes a plain function whose parameters are
named as the kind's inputs (:data:`rlzoo.contract.hookspecs.INPUTS`) and raises ``AssertionError``
with a message naming the broken invariant:

- masked (padded) positions never influence valid ones, whatever values they hold;
- the padding width (extra all-padding columns) never changes the result;
- no NaN/inf on edge cases: all-equal rewards, groups of size 1, empty responses
  (all-zero mask rows), log-ratios of ±50;
- gradients flow to ``logp`` only at valid positions and never into ``old_logp``,
  ``ref_logp`` or advantages;
- tasks (:func:`check_task`) draw only from the RNG they are given, return ``Example``
  objects, cover their ``alphabet``, and never train on their evaluation prompts;
- reward functions (:func:`check_reward`) return one finite float per completion, for
  empty and odd completions too, the same for the same input, and leave their inputs
  alone;
- tools (:func:`check_tool`, :mod:`rlzoo.testing.tool_checks`) have a valid OpenAI function
  schema, answer schema-conforming arguments with an observation (never an exception), the
  same one twice, succeed on their registered ``examples`` and refuse bad arguments;
- environments (:func:`check_environment`, :mod:`rlzoo.testing.env_checks`) return chat messages and
  well-formed step results, answer the same turns the same way, and keep an episode's
  tokens right (policy tokens as sampled, environment tokens out of the loss mask);
- presets (:func:`check_preset`) resolve into a run plan: every key and component they
  name exists and the combination is consistent.
"""

from __future__ import annotations

import copy
import inspect
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import torch

from rlzoo.core.batch import BatchCounts
from rlzoo.run.checkpoint import check_plain
from rlzoo.plan.planner import load_config
from rlzoo.config.preset_cards import load_preset
from rlzoo.contract.checks import BoundComponent, BuiltComponent
from rlzoo.core.errors import ConfigError, TrainingError
from rlzoo.contract.kinds import KINDS
from rlzoo.config.params import build_params
from rlzoo.contract.loading import load_registry
from rlzoo.contract.registry import Component, Registry
from rlzoo.tasks.task import Example, Holdout
from rlzoo.testing.env_checks import check_environment

from rlzoo.testing.tool_checks import check_tool
from rlzoo.contract.tool_schema import registered_tools, tool_from_component

B, T = 6, 5


def _call(fn: Callable[..., Any], **inputs: Any) -> Any:
    """Call ``fn`` as the engine does: keyword inputs it names; contract breaches as
    ``AssertionError``."""
    if not isinstance(fn, (BoundComponent, BuiltComponent)):
        names = inspect.signature(fn).parameters
        inputs = {k: v for k, v in inputs.items() if k in names}
    try:
        return fn(**inputs)
    except TrainingError as exc:
        raise AssertionError(str(exc)) from exc


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
    """Invariants of ``fn(logp=, old_logp=, advantages=, response_mask=, rollout_logp=)
    -> (loss (B, T), metrics)``."""
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
        loss, metrics = _call(fn, logp=lp, old_logp=ol, advantages=ad, response_mask=m,
                              rollout_logp=ol.detach())
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
    """Invariants of ``fn(token_rewards=, response_mask=, group_ids=, values=,
    baseline_scores=, old_logp=, ref_logp=, teacher_logp=, sum_pi_squared=, reward_scores=,
    reward_weights=) -> (advantages, returns)`` (two reward functions, weights 1 and 0.5)."""
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
        score = torch.where(m.bool(), r, torch.zeros_like(r)).sum(-1)
        per_reward = torch.stack([score, (1 - score).abs()], dim=1)  # two reward functions, as reward=[a, b]
        with torch.enable_grad():  # log-probs of the mask's shape, like the engine's
            adv, ret = _call(fn, token_rewards=r, response_mask=m, group_ids=g, values=v, baseline_scores=b,
                             old_logp=-0.5 * m, ref_logp=-0.7 * m, teacher_logp=-0.9 * m, sum_pi_squared=0.3 * m,
                             reward_scores=per_reward, reward_weights=torch.tensor([1.0, 0.5]))
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


def check_kl_estimator(fn: Callable[..., Any], name: str = "kl_estimator") -> None:
    """Invariants of ``fn(logp=, ref_logp=)`` or ``fn(logits=, ref_logits=)`` ``-> (B, T)``:
    zero when the policies agree, finite for log-ratios of ±50 (logit gaps of ±50), the
    gradient only into the policy side."""
    gen = torch.Generator().manual_seed(2)
    ref = -torch.rand(B, T, generator=gen) * 3
    ref_logits = torch.randn(B, T, 7, generator=gen)
    same = _call(fn, logp=ref.clone(), ref_logp=ref, logits=ref_logits.clone(), ref_logits=ref_logits)
    assert _close(same, torch.zeros(B, T)), f"{name}: KL of identical policies is not 0"
    for shift in (50.0, -50.0):
        logp = (ref + shift).requires_grad_(True)
        ref_g = ref.clone().requires_grad_(True)
        logits = ref_logits.clone()
        logits[..., 0] += shift                      # one token's log-prob moves by about ±50
        logits.requires_grad_(True)
        ref_logits_g = ref_logits.clone().requires_grad_(True)
        kl = _call(fn, logp=logp, ref_logp=ref_g, logits=logits, ref_logits=ref_logits_g)
        _assert_finite(name, f"log-ratio {shift:+.0f}", kl)
        assert kl.shape == (B, T), f"{name}: KL shape {tuple(kl.shape)}, expected {(B, T)}"
        kl.sum().backward()
        policy_grads = [g for g in (logp.grad, logits.grad) if g is not None]
        assert policy_grads, f"{name}: no gradient reaches logp or logits"
        _assert_finite(name, f"gradient at log-ratio {shift:+.0f}", *policy_grads)
        for other, label in ((ref_g, "ref_logp"), (ref_logits_g, "ref_logits")):
            assert other.grad is None or other.grad.abs().max() == 0, f"{name}: gradient flows into {label}"


def check_loss_aggregation(fn: Callable[..., Any], name: str = "loss_agg") -> None:
    """Invariants of ``fn(loss=, mask=, counts=)``: padding ignored, empty rows harmless,
    micro-batch sums with global counts equal the whole batch."""
    gen = torch.Generator().manual_seed(3)
    mask = _mask()
    loss = torch.randn(B, T, generator=gen)

    def agg(lo: torch.Tensor, m: torch.Tensor, counts: BatchCounts | None = None) -> torch.Tensor:
        return _call(fn, loss=lo, mask=m, counts=counts)

    whole = agg(loss, mask)
    _assert_finite(name, "random inputs", whole)
    assert _close(whole, agg(_garbage_where(loss, mask, 1e6), mask)), f"{name}: padding changes the result"
    assert torch.isfinite(agg(loss, torch.zeros_like(mask))), f"{name}: NaN on an all-empty batch"
    counts = BatchCounts(tokens=float(mask.sum()), sequences=float((mask.sum(-1) > 0).sum()),
                         max_response_length=T)
    parts = sum(agg(loss[i:i + 2], mask[i:i + 2], counts) for i in range(0, B, 2))
    assert _close(parts, agg(loss, mask, counts)), f"{name}: micro-batch sum != whole batch"
    wide = agg(_pad(loss, 3, 7.0), _pad(mask, 3), counts)
    assert _close(wide, agg(loss, mask, counts)), f"{name}: padding width changes the result"


def check_value_loss(fn: Callable[..., Any], name: str = "value_loss") -> None:
    """Invariants of ``fn(values=, old_values=, returns=, response_mask=) -> (loss (B, T),
    metrics)``: padding never leaks, zero loss where values equal the returns, gradient only
    into ``values`` and only at valid positions, finite for large errors."""
    gen = torch.Generator().manual_seed(4)
    mask = _mask()
    returns = torch.randn(B, T, generator=gen)
    old = returns + 0.1 * torch.randn(B, T, generator=gen)
    values = old + 0.3 * torch.randn(B, T, generator=gen)

    def run(v, o, r, m):
        v = v.clone().requires_grad_(True)
        o = o.clone().requires_grad_(True)
        r = r.clone().requires_grad_(True)
        loss, metrics = _call(fn, values=v, old_values=o, returns=r, response_mask=m)
        return v, o, r, loss, metrics

    v, o, r, loss, metrics = run(values, old, returns, mask)
    assert loss.shape == (B, T), f"{name}: loss shape {tuple(loss.shape)}, expected {(B, T)}"
    _assert_finite(name, "random inputs", loss)
    (loss * mask).sum().backward()
    assert v.grad is not None and (v.grad * (1 - mask)).abs().max() == 0, f"{name}: gradient at masked positions"
    for other, label in ((o, "old_values"), (r, "returns")):
        assert other.grad is None or other.grad.abs().max() == 0, f"{name}: gradient flows into {label}"
    _, _, _, loss_g, _ = run(_garbage_where(values, mask, 1e4), _garbage_where(old, mask, -1e4),
                             _garbage_where(returns, mask, 1e4), mask)
    assert _close(loss * mask, loss_g * mask), f"{name}: masked positions change valid losses"
    _, _, _, exact, _ = run(returns, returns, returns, mask)
    assert _close(exact * mask, torch.zeros(B, T)), f"{name}: non-zero loss where values equal the returns"
    _, _, _, big, _ = run(returns + 1e4, returns, returns, mask)
    _assert_finite(name, "errors of 1e4", big * mask)


def check_rollout_correction(fn: Callable[..., Any], name: str = "rollout_correction") -> None:
    """Invariants of ``fn(old_logp=, rollout_logp=, logp=, advantages=, response_mask=) ->
    (weights (B, T), metrics)``: weight 1 on every valid token when μ = π_old = π, 0 on
    padding, padding never changes a valid weight, finite for log-ratios of ±50, no
    gradient into any input."""
    gen = torch.Generator().manual_seed(5)
    mask = _mask()
    old = -torch.rand(B, T, generator=gen) * 3
    adv = torch.randn(B, T, generator=gen)

    def run(o, r, lp, a, m):
        o, r, lp = (t.clone().requires_grad_(True) for t in (o, r, lp))
        weights, metrics = _call(fn, old_logp=o, rollout_logp=r, logp=lp, advantages=a, response_mask=m)
        return weights, metrics, (o, r, lp)

    weights, metrics, _ = run(old, old, old, adv, mask)
    assert weights.shape == (B, T), f"{name}: weights shape {tuple(weights.shape)}, expected {(B, T)}"
    assert _close(weights * mask, mask), f"{name}: weights are not 1 where μ = π_old = π"
    assert (weights * (1 - mask)).abs().max() == 0, f"{name}: non-zero weight on padding"
    for key, value in metrics.items():
        value = torch.as_tensor(value)
        assert value.dim() == 0 and torch.isfinite(value), f"{name}: metric {key!r} is not a finite scalar"
    rollout = old + 0.3 * torch.randn(B, T, generator=gen)
    base, _, inputs = run(old, rollout, old + 0.1, adv, mask)
    assert not base.requires_grad and all(t.grad is None for t in inputs), f"{name}: weights carry a gradient"
    garbage, _, _ = run(_garbage_where(old, mask, 40.0), _garbage_where(rollout, mask, -40.0),
                        _garbage_where(old + 0.1, mask, 40.0), _garbage_where(adv, mask, 1e4), mask)
    assert _close(base * mask, garbage * mask), f"{name}: masked positions change valid weights"
    for shift in (50.0, -50.0):
        extreme, extreme_metrics, _ = run(old + shift, old, old, adv, mask)
        values = [torch.as_tensor(v) for v in extreme_metrics.values()]
        _assert_finite(name, f"log-ratio {shift:+.0f}", extreme, *values)
    empty, _, _ = run(old, rollout, old, adv, torch.zeros_like(mask))
    _assert_finite(name, "an all-empty batch", empty)


def check_task(task: Any, name: str = "task", holdout: float = 0.1) -> None:
    """Invariants of a :class:`rlzoo.tasks.task.Task` instance: ``sample(n, rng)`` returns
    ``n`` :class:`rlzoo.tasks.task.Example` with non-empty ``str`` prompts and a ``dict``-like
    ``row``, depends only on ``rng`` (same seed, same examples; the global ``random`` state
    is irrelevant), its ``alphabet`` (when set) covers every prompt and answer, the
    evaluation set is non-empty and held out, training draws never hold an evaluation
    prompt, ``answer_text`` is a ``str`` and ``state_dict`` is plain values."""
    split = Holdout(holdout)
    state = random.getstate()
    random.seed(1)  # the global RNG must not matter: two different global states, one seed
    first = task.sample(16, random.Random(0))
    assert isinstance(first, list) and len(first) == 16, f"{name}: sample(16, rng) returned {type(first).__name__} " \
        f"of length {len(first) if hasattr(first, '__len__') else '?'}, expected a list of 16 Examples"
    for example in first:
        assert isinstance(example, Example), f"{name}: sample returned a {type(example).__name__}, not an Example"
        assert isinstance(example.prompt, str) and example.prompt, f"{name}: a prompt is not a non-empty str"
        assert isinstance(example.row, Mapping), f"{name}: Example.row is a {type(example.row).__name__}"
        assert isinstance(task.answer_text(example), str), f"{name}: answer_text did not return a str"
    random.seed(2)
    again = task.sample(16, random.Random(0))
    random.setstate(state)
    assert [e.prompt for e in again] == [e.prompt for e in first], \
        f"{name}: sample(n, rng) with the same seed gave other prompts: draw only from rng"
    if task.alphabet is not None:
        for example in first:
            text = example.prompt + task.answer_text(example)
            missing = sorted(set(text) - set(task.alphabet))
            assert not missing, f"{name}: alphabet lacks {''.join(missing)!r} used by {text!r}"
    evals = task.eval_set(8, split)
    assert evals, f"{name}: no evaluation prompts with eval.holdout={holdout} (the prompt space is too small?)"
    held = {e.prompt for e in evals}
    train = task.sample_train(64, random.Random(1), split)
    assert len(train) == 64, f"{name}: sample_train(64, ...) returned {len(train)} examples"
    leaked = sorted(held & {e.prompt for e in train})
    assert not leaked, f"{name}: training drew evaluation prompts {leaked[:3]}"
    try:
        check_plain(task.state_dict(), f"{name}.state_dict()")
    except TypeError as exc:
        raise AssertionError(str(exc)) from exc


def check_reward(fn: Callable[..., Any], name: str = "reward", task: Any = None) -> None:
    """Invariants of a reward function ``fn(prompts=, completions=, references=, rows=,
    answers=)``: one finite float per completion (a list or a ``(B,)`` tensor) for
    ordinary, empty, very long and non-ASCII completions and a missing answer (``None``); the
    same scores for the same inputs; inputs not modified. With ``task`` (a
    :class:`rlzoo.tasks.task.Task`) the prompts, references and rows are that task's, and its
    perfect answers (``answer_text``) are among the completions; without, references are
    strings (pass the task when your reward expects others)."""
    if task is not None:
        examples = task.sample(4, random.Random(0))
    else:
        examples = [Example(f"prompt {i}", f"answer {i}", {"id": i}) for i in range(4)]
    answers = [task.answer_text(e) if task is not None else str(e.reference) for e in examples]
    odd = ["", "x" * 5000, "ünïcødé ✓ 数字", " \n\t"]
    completions = answers + odd
    prompts = [e.prompt for e in examples] * 2
    references = [e.reference for e in examples] * 2
    rows = [dict(e.row) for e in examples] * 2
    # answers as the default answer_format (plain) gives them, plus a completion without one
    answers: list[str | None] = [*completions[:-1], None]
    inputs = {"prompts": prompts, "completions": completions, "references": references, "rows": rows,
              "answers": answers}
    before = copy.deepcopy(inputs)

    def scores() -> torch.Tensor:
        raw = _call(fn, **inputs)
        try:
            out = torch.as_tensor(raw, dtype=torch.float64)
        except (TypeError, ValueError) as exc:
            raise AssertionError(f"{name}: returned {type(raw).__name__}, not B floats") from exc
        assert out.shape == (len(completions),), \
            f"{name}: returned shape {tuple(out.shape)} for {len(completions)} completions"
        bad = (~torch.isfinite(out)).nonzero().flatten().tolist()
        assert not bad, f"{name}: non-finite score {float(out[bad[0]])} for completion {completions[bad[0]]!r}"
        return out

    first = scores()
    assert inputs == before, f"{name}: modified its inputs"
    assert torch.equal(first, scores()), f"{name}: different scores for the same inputs"


def check_preset(component: Component, registry: Registry) -> None:
    """A preset (kind ``algorithm``) resolves, over the defaults, into a run plan: every
    key, component and parameter it names exists and the combination passes the plan's
    checks (``rlzoo config algo=<name> --plan`` would succeed); every card entry is well
    formed and covers a key the preset sets. Every problem is named, a line each."""
    try:
        load_config(registry, [f"algo={component.name}"])
        problems = load_preset(component).stale_card_entries()
    except ConfigError as exc:
        problems = getattr(exc, "problems", None) or [str(exc)]  # several: listed by the config check
    if problems:
        raise AssertionError(f"algorithm preset {component.name!r} does not resolve: "
                             + (problems[0] if len(problems) == 1 else "\n  - " + "\n  - ".join(problems)))


@dataclass(frozen=True)
class KitCall:
    """What :func:`check_component` hands the check of a kind: the component, the
    parameters it was given, the registry (presets, environments) and the task (rewards,
    environments)."""

    component: Component
    params: Any = None
    registry: Registry | None = None
    task: Any = None

    @property
    def label(self) -> str:
        """``<kind> '<name>'``, what an assertion message starts with."""
        return f"{self.component.kind} {self.component.name!r}"

    def bound(self) -> BoundComponent:
        """The component bound with its parameters (a dict validated as the config would)."""
        params = build_params(self.component, self.params) if isinstance(self.params, dict) else self.params
        return self.component.bind(params)

    def installed_registry(self) -> Registry:
        """The registry given, or one of every installed plugin."""
        return self.registry if self.registry is not None else load_registry()[1]


def _environment(call: KitCall) -> None:
    """An environment is built as a run builds it, once per episode, in the plain format."""
    fn, tools = call.bound(), registered_tools(call.installed_registry())
    examples = call.task.sample(3, random.Random(0)) if call.task is not None else ()
    check_environment(lambda: fn(tools=tools, tool_style="plain"), call.label, examples)


KIND_CHECKS: dict[str, Callable[[KitCall], None]] = {
    "advantage": lambda call: check_advantage_estimator(call.bound(), call.label, call.component.needs),
    "policy_loss": lambda call: check_policy_loss(call.bound(), call.label),
    "rollout_correction": lambda call: check_rollout_correction(call.bound(), call.label),
    "kl_estimator": lambda call: check_kl_estimator(call.bound(), call.label),
    "loss_agg": lambda call: check_loss_aggregation(call.bound(), call.label),
    "value_loss": lambda call: check_value_loss(call.bound(), call.label),
    "reward": lambda call: check_reward(call.bound().build(device=torch.device("cpu"), tokenizer=None), call.label,
                                        call.task),
    "task": lambda call: check_task(call.bound()(), call.label),
    "environment": _environment,
    "tool": lambda call: check_tool(tool_from_component(call.component), call.label,  # a tool takes no params:
                                    call.component.meta.get("examples", ())),       # its registered examples
    "algorithm": lambda call: check_preset(call.component, call.installed_registry()),
}
"""Kind name -> its invariant check, called with a :class:`KitCall`: one entry for every
kind whose :attr:`rlzoo.contract.kinds.Kind.tested_in` is ``rlzoo.testing`` (the kit is a
higher layer than the contract, so the table is keyed by the kind's name;
``tests/test_invariants.py`` checks it covers exactly those kinds)."""
CHECKED_KINDS = tuple(kind.name for kind in KINDS.values() if kind.tested_in == "rlzoo.testing")
"""The component kinds :func:`check_component` has invariant checks for (the kinds whose
:attr:`rlzoo.contract.kinds.Kind.tested_in` is ``rlzoo.testing``)."""


def check_component(component: Component, params: Any = None, *, registry: Registry | None = None,
                    task: Any = None) -> None:
    """Run the invariant checks of the component's kind (:data:`CHECKED_KINDS`).

    :param params: the component's parameter dataclass instance, or a dict of parameters
        (validated as the config would), or ``None`` for the defaults.
    :param registry: for presets: the registry to resolve them in (default: every
        installed plugin).
    :param task: for rewards: a task instance whose examples to score (default: plain
        strings).
    :raises AssertionError: naming the component and the broken invariant.
    :raises ValueError: no checks exist for the component's kind.
    """
    check = KIND_CHECKS.get(component.kind)
    if check is None:
        raise ValueError(f"no invariant checks for kind {component.kind!r}; "
                         f"kinds with checks: {', '.join(KIND_CHECKS)}")
    check(KitCall(component, params, registry, task))
