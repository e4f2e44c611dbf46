"""Advantage estimators (kind ``advantage``): plugins/{group_baselines,returns,distillation}.py against hand-computed
values, formula fixtures written independently in plain Python, invariants, the registry
and the docs page."""

from __future__ import annotations

import math
import random
import re
import statistics
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlzoo.config.params import build_params
from rlzoo.core.errors import ConfigError, TrainingError
from rlzoo.api import check_component
import zoo
from zoo import REGISTRY, builtin_names

DOC = Path(__file__).parents[1] / "docs" / "algorithms" / "advantages.md"
NAMES = builtin_names("advantage")
GROUP_BASED = tuple(name for name in NAMES if "groups" in REGISTRY.get("advantage", name).needs)
ALIASES = {"reinforce_plus_plus": "reinforce_pp",
           "reinforce_plus_plus_baseline": "reinforce_pp_baseline", "otb": "optimal_token_baseline"}
EPS = 1e-6
SETTINGS = settings(max_examples=30, deadline=None)


@pytest.fixture(scope="module")
def reg():
    return zoo.REGISTRY


def _outcome_batch(lengths, scores, width):
    """(token_rewards, mask) with score i on the last valid token of row i."""
    lengths = torch.as_tensor(lengths)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(len(lengths), width)
    for i, (n, s) in enumerate(zip(lengths.tolist(), scores)):
        if n > 0:
            rewards[i, n - 1] = s
    return rewards, mask


def _run(reg, name, rewards, mask, groups, values=None, baseline=None, **params):
    """Call the estimator as the engine does: by input name (those it does not name are dropped),
    with one reward function (``reward_scores`` the sequence scores, weight 1). An estimator
    for success rates (``nonnegative_rewards``) gets |rewards|."""
    component = reg.get("advantage", name)
    if component.meta.get("nonnegative_rewards"):
        rewards = rewards.abs()
    scores = torch.where(mask.bool(), rewards, torch.zeros_like(rewards)).sum(-1, keepdim=True)
    return component(token_rewards=rewards, response_mask=mask, group_ids=groups, values=values,
                     baseline_scores=baseline, reward_scores=scores, reward_weights=torch.ones(1),
                     old_logp=-0.5 * mask, teacher_logp=-0.9 * mask, sum_pi_squared=0.3 * mask, **params)


def _per_seq(adv, mask):
    """The per-sequence advantage of broadcast estimators (0 for empty rows)."""
    return (adv * mask).sum(-1) / mask.sum(-1).clamp(min=1)


# ---------------------------------------------------------------------- hand-computed
#
# Five sequences, T = 3, non-contiguous group ids [5, 2, 5, 2, 5]:
#   i  group  length  score
#   0    5      3      1
#   1    2      1      0
#   2    5      2      0
#   3    2      3      2
#   4    5      1      2
# group 5: scores {1, 0, 2}: mean 1, deviations {0, -1, 1}, unbiased var 2/2 = 1, std 1
# group 2: scores {0, 2}:    mean 1, deviations {-1, 1},    unbiased var 2/1 = 2, std √2

H_LENGTHS = [3, 1, 2, 3, 1]
H_SCORES = [1.0, 0.0, 0.0, 2.0, 2.0]
H_GROUPS = torch.tensor([5, 2, 5, 2, 5])
R2 = math.sqrt(2.0)
HAND_PER_SEQ = {
    # (s - mean) / (std + eps)
    "grpo": [0.0, -1 / (R2 + EPS), -1 / (1 + EPS), 1 / (R2 + EPS), 1 / (1 + EPS)],
    # s - mean
    "dr_grpo": [0.0, -1.0, -1.0, 1.0, 1.0],
    # s_i - mean of the others: i0: 1-(0+2)/2 = 0, i2: 0-(1+2)/2 = -1.5, i4: 2-(1+0)/2 = 1.5,
    # i1: 0-2 = -2, i3: 2-0 = 2
    "rloo": [0.0, -2.0, -1.5, 2.0, 1.5],
    # group 5: b = (3·1 + 2·0 + 1·2)/(3+2+1) = 5/6 ; group 2: b = (1·0 + 3·2)/(1+3) = 1.5
    "opo": [1 - 5 / 6, 0 - 1.5, 0 - 5 / 6, 2 - 1.5, 2 - 5 / 6],
    # group 5: best i4 (2), second 1 -> 1/(1+eps); group 2: best i3 (2), second 0 -> 2/(√2+eps)
    "grpo_passk": [0.0, 0.0, 0.0, 2 / (R2 + EPS), 1 / (1 + EPS)],
    # 3 non-zero scores of 5 -> alpha = 5/3; alpha·(s - mean)
    "gpg": [0.0, -5 / 3, -5 / 3, 5 / 3, 5 / 3],
}


@pytest.mark.parametrize("name", sorted(HAND_PER_SEQ))
def test_hand_computed_group_estimators(reg, name) -> None:
    rewards, mask = _outcome_batch(H_LENGTHS, H_SCORES, 3)
    adv, ret = _run(reg, name, rewards, mask, H_GROUPS)
    expected = torch.tensor(HAND_PER_SEQ[name])[:, None] * mask
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ret, adv)


def test_hand_computed_grpo_scales(reg) -> None:
    rewards, mask = _outcome_batch(H_LENGTHS, H_SCORES, 3)
    # batch: all five scores {1,0,0,2,2}: mean 1, deviations {0,-1,-1,1,1}, var 4/4 = 1;
    # the mean is still the group's: (s - mean_g) / (1 + eps)
    adv, _ = _run(reg, "grpo", rewards, mask, H_GROUPS, scale="batch")
    expected = torch.tensor([0.0, -1.0, -1.0, 1.0, 1.0]) / (1 + EPS)
    torch.testing.assert_close(adv, expected[:, None] * mask)
    # none: s - mean_g, exactly dr_grpo
    adv, _ = _run(reg, "grpo", rewards, mask, H_GROUPS, scale="none")
    torch.testing.assert_close(adv, torch.tensor(HAND_PER_SEQ["dr_grpo"])[:, None] * mask)
    # a larger epsilon shows up in the denominator: group 2 -> -1/(√2 + 0.5)
    adv, _ = _run(reg, "grpo", rewards, mask, H_GROUPS, epsilon=0.5)
    assert adv[1, 0].item() == pytest.approx(-1 / (R2 + 0.5))


def test_hand_computed_grpo_passk_without_std(reg) -> None:
    rewards, mask = _outcome_batch(H_LENGTHS, H_SCORES, 3)
    adv, _ = _run(reg, "grpo_passk", rewards, mask, H_GROUPS, norm_by_std=False)
    # r_max - r_second: group 2: 2 - 0 = 2 at i3; group 5: 2 - 1 = 1 at i4
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.0, 0.0, 2.0, 1.0])[:, None] * mask)


def test_hand_computed_grpo_passk_ties_go_to_the_first_index(reg) -> None:
    # one group {3, 1, 3}: max 3 at i0 and i2 (the first, i0, is "best"), second = 3 -> gap 0
    rewards, mask = _outcome_batch([1, 1, 1], [3.0, 1.0, 3.0], 1)
    adv, _ = _run(reg, "grpo_passk", rewards, mask, torch.tensor([0, 0, 0]), norm_by_std=False)
    assert adv.abs().max() == 0
    # {1, 3, 2}: best i1, second 2 -> 1; unbiased std of {1,3,2} = 1 -> 1/(1+eps)
    rewards, mask = _outcome_batch([1, 1, 1], [1.0, 3.0, 2.0], 1)
    adv, _ = _run(reg, "grpo_passk", rewards, mask, torch.tensor([4, 4, 4]))
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.0, 1 / (1 + EPS), 0.0]))


def test_hand_computed_reinforce_pp_baseline(reg) -> None:
    rewards, mask = _outcome_batch(H_LENGTHS, H_SCORES, 3)
    adv, ret = _run(reg, "reinforce_pp_baseline", rewards, mask, H_GROUPS)
    # s - mean_g = [0,-1,-1,1,1] on lengths [3,1,2,3,1]: tokens 0,0,0,-1,-1,-1,1,1,1,1
    # (10 tokens): mean 1/10 = 0.1; Σ(x - 0.1)² = 3·0.01 + 3·1.21 + 4·0.81 = 6.9;
    # unbiased var 6.9/9 -> A = (x - 0.1) / √(6.9/9)
    std = math.sqrt(6.9 / 9)
    expected = (torch.tensor([0.0, -1.0, -1.0, 1.0, 1.0])[:, None] - 0.1) / std * mask
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret, adv)


def test_hand_computed_reinforce_pp(reg) -> None:
    rewards, mask = _outcome_batch(H_LENGTHS, H_SCORES, 3)
    adv, ret = _run(reg, "reinforce_pp", rewards, mask, H_GROUPS)
    # γ = 1, outcome reward only: G_t = s on every valid token -> tokens 1,1,1,0,0,0,2,2,2,2
    # mean 11/10 = 1.1; Σ(x - 1.1)² = 3·0.01 + 3·1.21 + 4·0.81 = 6.9; unbiased var 6.9/9
    torch.testing.assert_close(ret, torch.tensor(H_SCORES)[:, None] * mask)
    std = math.sqrt(6.9 / 9)
    expected = (torch.tensor(H_SCORES)[:, None] - 1.1) / std * mask
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)


def test_hand_computed_reinforce_pp_discount_and_gap(reg) -> None:
    # dense rewards [1, 0, 2], γ = 0.5: G2 = 2, G1 = 0 + 0.5·2 = 1, G0 = 1 + 0.5·1 = 1.5
    rewards = torch.tensor([[1.0, 0.0, 2.0]])
    _, ret = _run(reg, "reinforce_pp", rewards, torch.ones(1, 3), torch.tensor([0]), gamma=0.5)
    torch.testing.assert_close(ret, torch.tensor([[1.5, 1.0, 2.0]]))
    # a masked step inside the response is skipped (its reward 9 ignored), the return
    # carried across it undiscounted: G3 = 2, G2 = 0 + 0.5·2 = 1, G1 -> 0, G0 = 1 + 0.5·1
    rewards = torch.tensor([[1.0, 9.0, 0.0, 2.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    _, ret = _run(reg, "reinforce_pp", rewards, mask, torch.tensor([0]), gamma=0.5)
    torch.testing.assert_close(ret, torch.tensor([[1.5, 0.0, 1.0, 2.0]]))


def test_hand_computed_remax(reg) -> None:
    rewards, mask = _outcome_batch(H_LENGTHS, H_SCORES, 3)
    baseline = torch.tensor([0.5, 0.5, 1.0, 1.0, 3.0])
    adv, ret = _run(reg, "remax", rewards, mask, H_GROUPS, baseline=baseline)
    # G_t = s on every valid token; A = s - b = [0.5, -0.5, -1, 1, -1]
    torch.testing.assert_close(ret, torch.tensor(H_SCORES)[:, None] * mask)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -1.0, 1.0, -1.0])[:, None] * mask)


def test_hand_computed_gae(reg) -> None:
    # rewards [0, 0, 1] + one padded column, V = [0.5, 0.2, 0.4], γ = 0.9, λ = 0.8, γλ = 0.72
    # t=2: δ = 1 + 0.9·0 - 0.4 = 0.6                  A2 = 0.6
    # t=1: δ = 0 + 0.9·0.4 - 0.2 = 0.16              A1 = 0.16 + 0.72·0.6 = 0.592
    # t=0: δ = 0 + 0.9·0.2 - 0.5 = -0.32             A0 = -0.32 + 0.72·0.592 = 0.10624
    # returns = A + V = [0.60624, 0.792, 1.0]
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.2, 0.4, 7.0]])
    adv, ret = _run(reg, "gae", rewards, mask, torch.tensor([0]), values, gamma=0.9, lam=0.8,
                    whiten=False)
    torch.testing.assert_close(adv, torch.tensor([[0.10624, 0.592, 0.6, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.60624, 0.792, 1.0, 0.0]]))


def test_hand_computed_gae_skips_masked_steps_and_whitens(reg) -> None:
    # mask [1, 0, 1]: the middle step (tool output) is skipped, V_{t'} and A_{t'} carried:
    # t=2: δ = 1 - 0.4 = 0.6, A2 = 0.6 ; t=0: δ = 0 + 0.9·0.4 - 0.5 = -0.14,
    # A0 = -0.14 + 0.72·0.6 = 0.292 ; returns [0.792, 0, 1.0]
    rewards = torch.tensor([[0.0, 5.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 99.0, 0.4]])
    adv, ret = _run(reg, "gae", rewards, mask, torch.tensor([0]), values, gamma=0.9, lam=0.8,
                    whiten=False)
    torch.testing.assert_close(adv, torch.tensor([[0.292, 0.0, 0.6]]))
    torch.testing.assert_close(ret, torch.tensor([[0.792, 0.0, 1.0]]))
    # whitened: two valid values -> ∓1/√2 (mean 0.446, unbiased std 0.308/√2);
    # returns unchanged
    adv_w, ret_w = _run(reg, "gae", rewards, mask, torch.tensor([0]), values, gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv_w, torch.tensor([[-1 / R2, 0.0, 1 / R2]]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret_w, ret)


# ----------------------------------------------------------- formula fixtures (plain Python)


def _random_batch(seed: int, batch: int = 12, width: int = 7, dense: bool = False):
    """Random lengths (one empty row), non-contiguous shuffled group ids, scores with ties
    and zeros; ``dense`` puts a reward on every valid token."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    lengths = [rng.randint(1, width) for _ in range(batch)]
    lengths[rng.randrange(batch)] = 0
    ids = [rng.choice([10, 3, 42, 7, -2]) for _ in range(batch)]
    ids[0] = 99  # a group of size 1
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()
    if dense:
        rewards = torch.randn(batch, width, generator=gen) * mask
    else:
        scores = [rng.choice([0.0, 1.0, 0.5, rng.uniform(-1, 2)]) for _ in range(batch)]
        rewards, mask = _outcome_batch(lengths, scores, width)
    values = torch.randn(batch, width, generator=gen) * mask
    baseline = torch.rand(batch, generator=gen)
    return rewards, mask, torch.tensor(ids), values, baseline


def _rows(x: torch.Tensor) -> list[list[float]]:
    return [[float(v) for v in row] for row in x.double()]


def _py_scores(rewards, mask):
    return [sum(r for r, m in zip(rr, mm) if m) for rr, mm in zip(_rows(rewards), _rows(mask))]


def _py_groups(ids):
    members = defaultdict(list)
    for i, g in enumerate(ids.tolist()):
        members[g].append(i)
    return [members[g] for g in ids.tolist()]


def _py_whiten(rows, mask_rows):
    flat = [x for row, m in zip(rows, mask_rows) for x, v in zip(row, m) if v]
    mean = sum(flat) / len(flat)
    var = statistics.variance(flat)                     # unbiased, as verl's masked_var
    return [[(x - mean) / math.sqrt(var + 1e-8) if v else 0.0 for x, v in zip(row, m)]
            for row, m in zip(rows, mask_rows)]


def _py_broadcast(per_seq, mask_rows):
    return [[a if v else 0.0 for v in m] for a, m in zip(per_seq, mask_rows)]


def _py_rtg(reward_rows, mask_rows, gamma):
    out = []
    for rr, mm in zip(reward_rows, mask_rows):
        running, row = 0.0, [0.0] * len(rr)
        for t in reversed(range(len(rr))):
            if mm[t]:
                running = rr[t] + gamma * running
                row[t] = running
        out.append(row)
    return out


def _py_mean_std(xs):
    if len(xs) == 1:
        return 0.0, 1.0
    return sum(xs) / len(xs), statistics.stdev(xs)


def _reference(name, rewards, mask, ids, values, baseline, **params):
    """Each estimator written from ALGORITHMS.md with Python lists: (advantages, returns)."""
    s = _py_scores(rewards, mask)
    groups = _py_groups(ids)
    m = _rows(mask)
    r = _rows(rewards)
    n_seq = len(s)
    if name == "gae":
        gamma, lam = params.get("gamma", 1.0), params.get("lam", 1.0)
        v = _rows(values)
        adv, ret = [], []
        for rr, vv, mm in zip(r, v, m):
            a_row, next_v, next_a = [0.0] * len(rr), 0.0, 0.0
            for t in reversed(range(len(rr))):
                if mm[t]:
                    next_a = rr[t] + gamma * next_v - vv[t] + gamma * lam * next_a
                    next_v = vv[t]
                    a_row[t] = next_a
            adv.append(a_row)
            ret.append([a + x if k else 0.0 for a, x, k in zip(a_row, vv, mm)])
        if params.get("whiten", True):
            adv = _py_whiten(adv, m)
        return adv, ret
    if name == "reinforce_pp":
        g = _py_rtg(r, m, params.get("gamma", 1.0))
        return _py_whiten(g, m), g
    if name == "remax":
        g = _py_rtg(r, m, 1.0)
        b = baseline.tolist()
        return [[x - b[i] if k else 0.0 for x, k in zip(g[i], m[i])] for i in range(n_seq)], g
    per_seq = []
    for i in range(n_seq):
        mine = [s[j] for j in groups[i]]
        mean, std = _py_mean_std(mine)
        if name == "grpo":
            scale = params.get("scale", "group")
            if scale == "batch" and len(mine) > 1:
                std = statistics.stdev(s)
            per_seq.append((s[i] - mean) / (std + EPS) if scale != "none" else s[i] - mean)
        elif name in ("dr_grpo", "reinforce_pp_baseline"):
            per_seq.append(s[i] - mean)
        elif name == "rloo":
            others = [s[j] for j in groups[i] if j != i]
            per_seq.append(s[i] - sum(others) / len(others) if others else s[i])
        elif name == "opo":
            lens = [sum(m[j]) for j in groups[i]]
            use = len(mine) > 1 and sum(lens) > 0
            b = sum(n * x for n, x in zip(lens, mine)) / sum(lens) if use else 0.0
            per_seq.append(s[i] - b)
        elif name == "grpo_passk":
            if len(mine) < 2:
                per_seq.append(0.0)
                continue
            order = sorted(groups[i], key=lambda j: (-s[j], j))  # best first, first index on ties
            gap = s[order[0]] - s[order[1]]
            if params.get("norm_by_std", True):
                gap /= statistics.stdev(mine) + EPS
            per_seq.append(gap if order[0] == i else 0.0)
        elif name == "gpg":
            nonzero = sum(1 for x in s if x != 0)
            alpha = n_seq / nonzero if nonzero else 1.0
            per_seq.append(alpha * (s[i] - mean))
    adv = _py_broadcast(per_seq, m)
    if name == "reinforce_pp_baseline":
        adv = _py_whiten(adv, m)
    return adv, adv


FIXTURE_CASES = [
    ("gae", {}), ("gae", {"gamma": 0.9, "lam": 0.95}), ("gae", {"whiten": False, "lam": 0.5}),
    ("grpo", {}), ("grpo", {"scale": "batch"}), ("grpo", {"scale": "none"}),
    ("dr_grpo", {}), ("rloo", {}), ("reinforce_pp", {}), ("reinforce_pp", {"gamma": 0.8}),
    ("reinforce_pp_baseline", {}), ("remax", {}), ("opo", {}), ("grpo_passk", {}),
    ("grpo_passk", {"norm_by_std": False}), ("gpg", {}),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name,params", FIXTURE_CASES, ids=lambda x: str(x))
def test_numerical_fixture(reg, name, params, seed) -> None:
    dense = name in ("gae", "reinforce_pp", "remax")
    rewards, mask, ids, values, baseline = _random_batch(seed, dense=dense)
    adv, ret = _run(reg, name, rewards, mask, ids, values, baseline, **params)
    exp_adv, exp_ret = _reference(name, rewards, mask, ids, values, baseline, **params)
    torch.testing.assert_close(adv, torch.tensor(exp_adv, dtype=adv.dtype), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(ret, torch.tensor(exp_ret, dtype=ret.dtype), atol=2e-5, rtol=2e-5)


def test_gae_matches_verl_loop_on_clean_inputs(reg) -> None:
    """verl compute_gae_advantage_return's loop (mask products; observation tokens skipped),
    transcribed, on inputs whose padding is clean, with masked steps inside responses."""
    gen = torch.Generator().manual_seed(5)
    batch, width, gamma, lam = 6, 9, 0.95, 0.9
    mask = (torch.rand(batch, width, generator=gen) > 0.3).float()
    mask[:, 6:] = 0.0
    mask[2] = 0.0
    rewards = torch.randn(batch, width, generator=gen) * mask
    values = torch.randn(batch, width, generator=gen) * mask
    next_values, last_gae, reversed_adv = 0, 0, []
    for t in reversed(range(width)):
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last_gae_ = delta + gamma * lam * last_gae
        next_values = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_values
        last_gae = last_gae_ * mask[:, t] + (1 - mask[:, t]) * last_gae
        reversed_adv.append(last_gae)
    verl_adv = torch.stack(reversed_adv[::-1], dim=1)
    verl_ret = verl_adv + values
    adv, ret = _run(reg, "gae", rewards, mask, torch.arange(batch), values, gamma=gamma, lam=lam,
                    whiten=False)
    # verl leaves the carried advantage on masked positions; rlzoo zeroes them
    torch.testing.assert_close(adv, verl_adv * mask)
    torch.testing.assert_close(ret, verl_ret * mask)


# --------------------------------------------------------------------------- properties


@pytest.mark.parametrize("name,params", [c for c in FIXTURE_CASES if c[1]], ids=lambda x: str(x))
def test_registered_invariants_with_params(reg, name, params) -> None:
    component = reg.get("advantage", name)
    check_component(component, build_params(component, params))


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), -1e6])
@pytest.mark.parametrize("name", NAMES)
def test_padding_values_never_leak(reg, name, garbage) -> None:
    rewards, mask, ids, values, baseline = _random_batch(3, dense=True)
    mask[1, 2] = 0.0  # a masked step inside a response too
    rewards, values = rewards * mask, values * mask
    adv, ret = _run(reg, name, rewards, mask, ids, values, baseline)
    fill = torch.full_like(rewards, garbage)
    dirty_r = torch.where(mask.bool(), rewards, fill)
    dirty_v = torch.where(mask.bool(), values, fill)
    adv_d, ret_d = _run(reg, name, dirty_r, mask, ids, dirty_v, baseline)
    torch.testing.assert_close(adv_d, adv)
    torch.testing.assert_close(ret_d, ret)


@pytest.mark.parametrize("name", NAMES)
def test_padding_width_never_changes_results(reg, name) -> None:
    rewards, mask, ids, values, baseline = _random_batch(4, dense=True)
    adv, ret = _run(reg, name, rewards, mask, ids, values, baseline)
    def pad(x: torch.Tensor, value: float) -> torch.Tensor:
        return torch.cat([x, torch.full((x.shape[0], 4), value)], 1)

    adv_p, ret_p = _run(reg, name, pad(rewards, 3.0), pad(mask, 0.0), ids, pad(values, 3.0),
                        baseline)
    torch.testing.assert_close(adv_p[:, :7], adv)
    torch.testing.assert_close(ret_p[:, :7], ret)
    assert adv_p[:, 7:].abs().max() == 0 and ret_p[:, 7:].abs().max() == 0


@pytest.mark.parametrize("name", NAMES)
def test_batch_order_and_group_labels_do_not_matter(reg, name) -> None:
    rewards, mask, ids, values, baseline = _random_batch(6)
    adv, ret = _run(reg, name, rewards, mask, ids, values, baseline)
    perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(0))
    relabelled = ids[perm] * 1000 - 7  # another injective labelling, still unsorted
    adv_p, ret_p = _run(reg, name, rewards[perm], mask[perm], relabelled, values[perm],
                        baseline[perm])
    torch.testing.assert_close(adv_p, adv[perm])
    torch.testing.assert_close(ret_p, ret[perm])


@pytest.mark.parametrize("name", NAMES)
def test_no_gradient_through_advantages(reg, name) -> None:
    rewards, mask, ids, values, baseline = _random_batch(7, dense=True)
    rewards.requires_grad_(True)
    values.requires_grad_(True)
    baseline.requires_grad_(True)
    with torch.enable_grad():
        adv, ret = _run(reg, name, rewards, mask, ids, values, baseline)
    assert not adv.requires_grad and not ret.requires_grad


@pytest.mark.parametrize("name", NAMES)
def test_zero_on_padding_and_output_dtype(reg, name) -> None:
    rewards, mask, ids, values, baseline = _random_batch(8, dense=True)
    adv, ret = _run(reg, name, rewards.double(), mask.double(), ids, values.double(),
                    baseline.double())
    assert adv.dtype == torch.float64 and ret.dtype == torch.float64
    assert (adv * (1 - mask.double())).abs().max() == 0
    assert (ret * (1 - mask.double())).abs().max() == 0


@pytest.mark.parametrize("name", GROUP_BASED)
def test_all_equal_rewards_give_zero_advantages(reg, name) -> None:
    """optimal_token_baseline: ε in the denominator leaves A = G·ε/(ΣW + ε) (as verl), and its
    zero tail gives the unique longest response of a group its raw return beyond the
    second-longest (row 3 here, positions 3..), so it runs without the tail and a relative bound."""
    params = {"zero_tail": False} if name == "optimal_token_baseline" else {}
    for value in (0.7, 0.0, -3.1, 1e4):
        rewards, mask = _outcome_batch([5, 3, 1, 4, 2, 5], [value] * 6, 5)
        ids = torch.tensor([1, 0, 1, 0, 0, 1])
        adv, ret = _run(reg, name, rewards, mask, ids, **params)
        assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
        atol = 1e-6 * max(1.0, abs(value)) if params else 1e-6
        torch.testing.assert_close(adv, torch.zeros_like(adv), atol=atol, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_empty_responses_give_zeros(reg, name) -> None:
    rewards, mask, ids, values, baseline = _random_batch(9, dense=True)
    mask[[2, 5]] = 0.0
    rewards, values = rewards * mask, values * mask
    adv, ret = _run(reg, name, rewards, mask, ids, values, baseline)
    assert adv[[2, 5]].abs().max() == 0 and ret[[2, 5]].abs().max() == 0
    # the whole batch empty
    zeros = torch.zeros(4, 3)
    adv, ret = _run(reg, name, zeros, zeros, torch.tensor([0, 0, 1, 1]), zeros,
                    torch.ones(4))
    assert adv.abs().max() == 0 and ret.abs().max() == 0


def test_groups_of_size_one(reg) -> None:
    scores = [0.5, -1.0, 2.0, 0.0]
    rewards, mask = _outcome_batch([2, 1, 3, 2], scores, 3)
    ids = torch.tensor([3, 1, 4, 9])  # every group has one member
    s = torch.tensor(scores)[:, None] * mask
    expected = {
        "grpo": s / (1 + EPS),   # mean 0, std 1
        "dr_grpo": s,            # mean 0
        "rloo": s,               # keeps its raw score
        "opo": s,                # baseline 0, as verl
        "grpo_passk": 0 * s,     # no second response: 0
        "gpg": 4 / 3 * s,        # mean 0; 3 non-zero scores of 4
    }
    for name, want in expected.items():
        adv, _ = _run(reg, name, rewards, mask, ids)
        torch.testing.assert_close(adv, want, msg=name)
    for scale in ("batch", "none"):
        adv, _ = _run(reg, "grpo", rewards, mask, ids, scale=scale)
        torch.testing.assert_close(adv, s / (1 + EPS) if scale == "batch" else s)
    # reinforce_pp_baseline: mean 0, so it whitens the raw scores over the batch's tokens
    adv, _ = _run(reg, "reinforce_pp_baseline", rewards, mask, ids)
    flat = s[mask.bool()]
    torch.testing.assert_close(adv, (s - flat.mean()) / flat.std() * mask, atol=1e-5, rtol=1e-5)


def test_gpg_all_zero_scores_are_finite(reg) -> None:
    rewards, mask = _outcome_batch([2, 2, 1], [0.0, 0.0, 0.0], 2)
    adv, _ = _run(reg, "gpg", rewards, mask, torch.tensor([0, 0, 0]))
    assert adv.abs().max() == 0


def test_missing_inputs_raise_naming_the_estimator(reg) -> None:
    rewards, mask = _outcome_batch([2, 1], [1.0, 0.0], 2)
    with pytest.raises(ValueError, match="gae.*values"):
        _run(reg, "gae", rewards, mask, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="remax.*baseline_scores"):
        _run(reg, "remax", rewards, mask, torch.tensor([0, 0]))


@st.composite
def _grouped_batches(draw, min_length=0):
    lengths = draw(st.lists(st.integers(min_length, 6), min_size=2, max_size=10))
    n = len(lengths)
    scores = draw(st.lists(st.sampled_from([0.0, 1.0, 0.5, -2.0, 3.25]), min_size=n, max_size=n))
    ids = draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n))
    rewards, mask = _outcome_batch(lengths, scores, 6)
    return rewards, mask, torch.tensor(ids)


def _group_sums(per_seq: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.stack([per_seq[ids == g].sum() for g in ids.unique()])


@SETTINGS
@given(_grouped_batches(min_length=1))
def test_group_advantages_sum_to_zero(reg, batch) -> None:
    """grpo, dr_grpo, rloo: Σ_g A_i = 0 for groups of ≥ 2; opo: Σ_g |o_i|·A_i = 0."""
    rewards, mask, ids = batch
    sizes = (ids[:, None] == ids[None, :]).sum(-1)
    multi = sizes > 1
    for name in ("grpo", "dr_grpo", "rloo"):
        adv, _ = _run(reg, name, rewards, mask, ids)
        per_seq = torch.where(multi, _per_seq(adv, mask), 0.0)
        assert _group_sums(per_seq, ids).abs().max() < 1e-4, name
    adv, _ = _run(reg, "opo", rewards, mask, ids)
    weighted = torch.where(multi, adv.sum(-1), 0.0)  # Σ_t A = |o_i|·A_i
    assert _group_sums(weighted, ids).abs().max() < 1e-4


@SETTINGS
@given(_grouped_batches(), st.sampled_from(GROUP_BASED))
def test_group_estimators_are_finite_and_zero_on_padding(reg, batch, name) -> None:
    rewards, mask, ids = batch
    adv, ret = _run(reg, name, rewards, mask, ids)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert (adv * (1 - mask)).abs().max() == 0


@st.composite
def _dense_batches(draw):
    rows = draw(st.integers(1, 5))
    width = draw(st.integers(1, 6))
    mask = torch.tensor(draw(st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=width,
                                                max_size=width), min_size=rows, max_size=rows)))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    rewards = torch.randn(rows, width, generator=gen, dtype=torch.float64) * mask
    values = torch.randn(rows, width, generator=gen, dtype=torch.float64) * mask
    return rewards, mask.double(), values


@SETTINGS
@given(_dense_batches(), st.sampled_from([1.0, 0.9, 0.0]))
def test_gae_lambda_one_zero_values_is_returns_to_go(reg, batch, gamma) -> None:
    """λ = 1, V = 0, no whitening: A = returns-to-go (reinforce_pp's returns), masked steps
    inside responses included; with λ = 1, returns = A + V are the returns-to-go for any V."""
    rewards, mask, values = batch
    ids = torch.arange(len(mask))
    _, rtg = _run(reg, "reinforce_pp", rewards, mask, ids, gamma=gamma)
    adv, ret = _run(reg, "gae", rewards, mask, ids, torch.zeros_like(values), gamma=gamma,
                    lam=1.0, whiten=False)
    torch.testing.assert_close(adv, rtg)
    torch.testing.assert_close(ret, rtg)
    _, ret_v = _run(reg, "gae", rewards, mask, ids, values, gamma=gamma, lam=1.0, whiten=False)
    torch.testing.assert_close(ret_v, rtg)


@SETTINGS
@given(_dense_batches())
def test_whitened_estimators_have_zero_mean_unit_std(reg, batch) -> None:
    rewards, mask, values = batch
    ids = torch.arange(len(mask))
    raw_gae, _ = _run(reg, "gae", rewards, mask, ids, values, whiten=False)
    _, raw_rtg = _run(reg, "reinforce_pp", rewards, mask, ids)
    for name, raw in (("gae", raw_gae), ("reinforce_pp", raw_rtg)):
        adv, _ = _run(reg, name, rewards, mask, ids, values)
        flat = adv[mask.bool()]
        if flat.numel() > 1 and raw[mask.bool()].std() > 1e-3:
            assert abs(flat.mean().item()) < 1e-6
            assert flat.std().item() == pytest.approx(1.0, abs=1e-4)


# ----------------------------------------------------------------------------- registry


def test_registry_names_aliases_and_needs(reg) -> None:
    assert set(NAMES) <= set(reg.names("advantage"))
    for alias, name in ALIASES.items():
        assert reg.get("advantage", alias) is reg.get("advantage", name)
    needs = {name: reg.get("advantage", name).needs for name in NAMES}
    assert needs["gae"] == {"critic"}
    assert needs["remax"] == {"greedy"}
    assert needs["reinforce_pp"] == frozenset()
    for name in GROUP_BASED:
        extra = {"old_logp", "sum_pi_squared"} if name == "optimal_token_baseline" else set()
        assert needs[name] == {"groups", *extra}, name
    for name in NAMES:
        component = reg.get("advantage", name)
        assert component.paper and component.paper.startswith("arXiv:")
        assert component.description


@pytest.mark.parametrize("name,given_params,param", [
    ("gae", {"gamma": 1.5}, "gamma"), ("gae", {"lam": -0.1}, "lam"),
    ("gae", {"gamma": float("nan")}, "gamma"),
    ("grpo", {"epsilon": 0.0}, "epsilon"), ("grpo", {"scale": "rank"}, "scale"),
    ("reinforce_pp", {"gamma": 2.0}, "gamma"), ("grpo_passk", {"epsilon": -1e-6}, "epsilon"),
    ("grpo", {"epsilonn": 1e-3}, "epsilonn"), ("rloo", {"gamma": 1.0}, "gamma"),
])
def test_param_validation_names_the_parameter(reg, name, given_params, param) -> None:
    with pytest.raises(ConfigError, match=param):
        build_params(reg.get("advantage", name), given_params)


def test_params_defaults(reg) -> None:
    gae_params = build_params(reg.get("advantage", "gae"), {})
    assert (gae_params.gamma, gae_params.lam, gae_params.whiten) == (1.0, 1.0, True)
    grpo_params = build_params(reg.get("advantage", "grpo"), {"scale": "batch"})
    assert (grpo_params.epsilon, grpo_params.scale) == (1e-6, "batch")
    passk = build_params(reg.get("advantage", "grpo_passk"), {})
    assert (passk.epsilon, passk.norm_by_std) == (1e-6, True)
    assert build_params(reg.get("advantage", "reinforce_pp"), {}).gamma == 1.0


# --------------------------------------------------------------------------------- docs


def test_doc_snippets_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= len(NAMES)
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {})


def test_doc_names_every_component() -> None:
    text = DOC.read_text()
    for name in NAMES:
        assert f"## `{name}`" in text, name


def test_hand_computed_maxrl_and_its_edge_cases(reg) -> None:
    maxrl = reg.get("advantage", "maxrl")
    rewards, mask = _outcome_batch([1, 1, 1, 1, 2, 1], [1.0, 0.0, 0.0, 0.0, 0.0, 0.7], 2)
    groups = torch.tensor([5, 5, 5, 5, 8, 9])            # group 5: mean 0.25; groups 8, 9: size 1 (raw score)
    adv, ret = maxrl(token_rewards=rewards, response_mask=mask, group_ids=groups)
    per_seq = _per_seq(adv, mask)
    expected = [0.75 / (0.25 + 1e-6), -0.25 / (0.25 + 1e-6), -0.25 / (0.25 + 1e-6), -0.25 / (0.25 + 1e-6),
                0.0, 0.7]
    assert per_seq.tolist() == pytest.approx(expected, rel=1e-6)
    assert torch.equal(adv, ret)
    negative, mask2 = _outcome_batch([1, 1], [-1.0, 0.5], 1)
    with pytest.raises(TrainingError, match=r"maxrl.*non-negative.*group 3 has mean score -0.25"):
        maxrl(token_rewards=negative, response_mask=mask2, group_ids=torch.tensor([3, 3]))


# ------------------------------------------------------------------ optimal token baseline


def _otb_verl(rewards, mask, ids, old_logp, sum_pi_sq, align="position", zero_tail=True, eps=1e-8):
    """verl compute_optimal_token_baseline_advantage (align="position") and
    compute_multi_turn_optimal_token_baseline_advantage (align="mask"), transcribed in loops."""
    b, width = mask.shape
    m = mask.tolist()
    r = (rewards * mask).tolist()
    w = (1 - 2 * old_logp.exp() + sum_pi_sq).tolist()
    g = [[sum(r[i][k] for k in range(t, width)) for t in range(width)] for i in range(b)]
    cum = [[sum(w[i][k] * m[i][k] for k in range(t + 1)) for t in range(width)] for i in range(b)]
    lengths = [int(sum(row)) for row in m]
    if align == "mask":      # each row's masked-in tokens, in order
        pos = [[t for t in range(width) if m[i][t]] for i in range(b)]
        g_ax = [[g[i][t] for t in pos[i]] + [0.0] * (width - len(pos[i])) for i in range(b)]
        w_ax = [[cum[i][t] for t in pos[i]] + [0.0] * (width - len(pos[i])) for i in range(b)]
        on = [[1.0 if k < lengths[i] else 0.0 for k in range(width)] for i in range(b)]
        members = [i for i in range(b) if lengths[i] > 0]
    else:
        g_ax, w_ax, on, members = g, cum, m, list(range(b))
    base = [[0.0] * width for _ in range(b)]
    for gid in sorted({ids[i].item() for i in members}):
        idx = [i for i in members if ids[i].item() == gid]
        if len(idx) == 1:
            continue
        for k in range(width):
            num = sum(g_ax[i][k] * w_ax[i][k] * on[i][k] for i in idx)
            den = sum(w_ax[i][k] * on[i][k] for i in idx) + eps
            for i in idx:
                base[i][k] = num / den
        if zero_tail:
            lens = sorted(lengths[i] for i in idx)
            longest = [i for i in idx if lengths[i] == lens[-1]]
            if len(longest) == 1 and lens[-1] > lens[-2]:
                for k in range(lens[-2], width):
                    base[longest[0]][k] = 0.0
    adv = [[0.0] * width for _ in range(b)]
    for i in range(b):
        if align == "mask":
            for k, t in enumerate(pos[i]):
                adv[i][t] = g_ax[i][k] - base[i][k]
        else:
            for t in range(width):
                adv[i][t] = (g[i][t] - base[i][t]) * m[i][t]
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(g, dtype=torch.float64) * mask


def _otb(reg, rewards, mask, ids, old_logp, sum_pi_sq, **params):
    return reg.get("advantage", "optimal_token_baseline")(
        token_rewards=rewards, response_mask=mask, group_ids=ids, old_logp=old_logp, sum_pi_squared=sum_pi_sq,
        **params)


def test_optimal_token_baseline_hand_computed(reg) -> None:
    # one group, two responses of lengths 2 and 3, scores 1 and 0 (outcome on the last token);
    # π_old(y) = 0.5 everywhere, Σπ² = 0.5 -> w = 1 - 1 + 0.5 = 0.5, W = [0.5, 1.0, 1.5]
    #   G: row 0 = [1, 1, 0], row 1 = [0, 0, 0]
    #   t0: B = (1·0.5 + 0·0.5)/(0.5 + 0.5) = 0.5;  t1: B = (1·1 + 0·1)/(1 + 1) = 0.5
    #   t2: only row 1 -> B = 0·1.5/1.5 = 0, and the zero tail (row 1 is the unique longest,
    #       second-longest 2) sets it to 0 anyway
    #   A: row 0 = [0.5, 0.5, 0], row 1 = [-0.5, -0.5, 0]
    rewards, mask = _outcome_batch([2, 3], [1.0, 0.0], 3)
    rewards = rewards.double()
    mask = mask.double()
    old = torch.full((2, 3), math.log(0.5), dtype=torch.float64)
    sq = torch.full((2, 3), 0.5, dtype=torch.float64) * mask
    adv, ret = _otb(reg, rewards, mask, torch.tensor([0, 0]), old, sq)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.0], [-0.5, -0.5, 0.0]], dtype=torch.float64),
                               atol=1e-7, rtol=0)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64))
    # weights differ per row: row 0's π(y) = 0.9, Σπ² = 0.82 -> w = 0.02; row 1 keeps 0.5
    #   t0: B = (1·0.02)/(0.02 + 0.5) = 0.0384615;  t1: B = (1·0.04)/(0.04 + 1.0) = 0.0384615
    old2 = old.clone()
    old2[0] = math.log(0.9)
    sq2 = sq.clone()
    sq2[0, :2] = 0.82
    adv, _ = _otb(reg, rewards, mask, torch.tensor([0, 0]), old2, sq2)
    b = 0.02 / 0.52
    torch.testing.assert_close(adv, torch.tensor([[1 - b, 1 - b, 0.0], [-b, -b, 0.0]], dtype=torch.float64),
                               atol=1e-7, rtol=0)


def test_optimal_token_baseline_zero_tail(reg) -> None:
    # group of 2: lengths 1 and 3, scores 0 and 1; w = 0.5: W_row1 = [0.5, 1, 1.5]
    #   t0: B = (0·0.5 + 1·0.5)/1 = 0.5 -> row 0: -0.5, row 1: 0.5
    #   t1, t2: row 1 alone. Zero tail (second-longest 1): B = 0 -> A = G = 1;
    #   without it B = 1·W/(W + ε) ≈ 1 -> A ≈ 0
    rewards, mask = _outcome_batch([1, 3], [0.0, 1.0], 3)
    old = torch.full((2, 3), math.log(0.5))
    sq = torch.full((2, 3), 0.5) * mask
    adv, _ = _otb(reg, rewards, mask, torch.tensor([7, 7]), old, sq)
    torch.testing.assert_close(adv, torch.tensor([[-0.5, 0.0, 0.0], [0.5, 1.0, 1.0]]), atol=1e-6, rtol=0)
    adv, _ = _otb(reg, rewards, mask, torch.tensor([7, 7]), old, sq, zero_tail=False)
    torch.testing.assert_close(adv, torch.tensor([[-0.5, 0.0, 0.0], [0.5, 0.0, 0.0]]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("align", ["position", "mask"])
@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_optimal_token_baseline_matches_verl_loops(reg, align, zero_tail, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    b, width = 9, 7
    lengths = torch.randint(0, width + 1, (b,), generator=gen)
    lengths[0] = width                                        # a unique longest in some groups
    mask = (torch.arange(width)[None, :] < lengths[:, None]).double()
    mask[1, 1] = 0.0                                          # holes: tool output inside responses
    mask[3, 0] = 0.0
    rewards = torch.randn(b, width, generator=gen, dtype=torch.float64) * mask
    old = -torch.rand(b, width, generator=gen, dtype=torch.float64) * 3
    sq = torch.rand(b, width, generator=gen, dtype=torch.float64) * 0.5 * mask
    ids = torch.tensor([4, 4, 4, 1, 1, 9, 4, 1, 2])           # a group of size 1 (9, 2)
    adv, ret = _otb(reg, rewards, mask, ids, old, sq, align=align, zero_tail=zero_tail)
    want_adv, want_ret = _otb_verl(rewards, mask, ids, old, sq, align, zero_tail)
    torch.testing.assert_close(adv, want_adv, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(ret, want_ret)


def test_optimal_token_baseline_alignments_agree_without_holes_or_empty_rows(reg) -> None:
    rewards, mask, ids, _, _ = _random_batch(4)
    mask[mask.sum(-1) == 0, 0] = 1.0                          # no empty row
    gen = torch.Generator().manual_seed(4)
    old = -torch.rand(mask.shape, generator=gen)
    sq = torch.rand(mask.shape, generator=gen) * 0.3 * mask
    by_position, _ = _otb(reg, rewards, mask, ids, old, sq)
    by_mask, _ = _otb(reg, rewards, mask, ids, old, sq, align="mask")
    torch.testing.assert_close(by_position, by_mask)


def test_optimal_token_baseline_params_and_plan(reg, tmp_path) -> None:
    from rlzoo.plan.planner import load_config

    component = reg.get("advantage", "optimal_token_baseline")
    assert reg.get("advantage", "otb") is component
    assert component.needs == {"groups", "old_logp", "sum_pi_squared"}
    assert component.default_params() == component.params(align="position", zero_tail=True, epsilon=1e-8)
    with pytest.raises(ConfigError, match="align must be one of position, mask, got 'turn'"):
        build_params(component, {"align": "turn"})
    plan = load_config(reg, ["advantage=optimal_token_baseline"]).plan
    assert plan.runs("old_logp") and plan.runs("old_sum_pi_squared")
    assert "Σπ² read by advantage optimal_token_baseline" in plan.passes["old_logp"]
    assert not load_config(reg, []).plan.runs("old_sum_pi_squared")


def test_sum_of_squared_probs_hand_computed() -> None:
    from rlzoo.models.logprobs import sum_of_squared_probs

    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -math.inf, -math.inf], [50.0, 0.0, 0.0, 0.0]])
    # uniform over 4: 1/4; probs [1/4, 3/4]: 1/16 + 9/16 = 10/16; near one-hot: ≈ 1
    torch.testing.assert_close(sum_of_squared_probs(logits), torch.tensor([0.25, 0.625, 1.0]))
    z = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0)) * 4
    torch.testing.assert_close(sum_of_squared_probs(z), z.softmax(-1).square().sum(-1))


@pytest.mark.slow
def test_optimal_token_baseline_trains_with_the_sum_pi_squared_pass(tmp_path) -> None:
    from rlzoo.commands.cli import main

    run_dir = tmp_path / "otb"
    assert main(["train", *zoo.TINY, "advantage=otb", "kl.coef=0", "eval.size=0", "trainer.total_steps=2",
                 f"run_dir={run_dir}"]) == 0
    plan = (run_dir / "plan.txt").read_text()
    assert "old_sum_pi_squared: with old_logp" in plan
