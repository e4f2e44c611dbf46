"""Loss aggregation modes (kind ``loss_agg``, plugins/aggregation.py): hand-computed values,
a formula fixture, padding and empty rows, and global-batch equivalence under
micro-batching (value and gradient) for every mode; plus the docs page."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlzoo.core.batch import BatchCounts
from rlzoo.config.params import build_params
from rlzoo.core.errors import ConfigError
from rlzoo.api import check_component
import zoo
from zoo import builtin_names

DOC = Path(__file__).parents[1] / "docs" / "algorithms" / "aggregation.md"
MODES = builtin_names("loss_agg")
NAN = float("nan")


@pytest.fixture(scope="module")
def reg():
    return zoo.REGISTRY


def _counts(mask: torch.Tensor, max_response_length: int) -> BatchCounts:
    return BatchCounts(tokens=float(mask.sum()), sequences=float((mask.sum(-1) > 0).sum()),
                       max_response_length=max_response_length)


# Row sums over valid tokens: 6 (3 tokens), 10 (2 tokens), empty row, 5 (1 token).
# Padding holds NaN, which must never leak.
LOSS = torch.tensor([[1.0, 2.0, 3.0, NAN],
                     [4.0, 6.0, NAN, NAN],
                     [NAN, NAN, NAN, NAN],
                     [5.0, NAN, NAN, NAN]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0],
                     [1.0, 1.0, 0.0, 0.0],
                     [0.0, 0.0, 0.0, 0.0],
                     [1.0, 0.0, 0.0, 0.0]])
# tokens = 6, non-empty sequences B' = 3, width T = 4, Σ L·M = 21
HAND = {
    "token-mean": 21 / 6,                              # 3.5
    "token-sum": 21.0,
    "seq-mean-token-sum": 21 / 3,                      # 7
    "seq-mean-token-mean": (6 / 3 + 10 / 2 + 5 / 1) / 3,   # (2 + 5 + 5) / 3 = 4
    "seq-mean-token-sum-norm": 21 / (3 * 4),           # T_max = width 4 without counts: 1.75
}
# d result / d L at the valid tokens (0 at padding)
HAND_GRAD = {
    "token-mean": [[1 / 6] * 3 + [0], [1 / 6] * 2 + [0] * 2, [0] * 4, [1 / 6] + [0] * 3],
    "token-sum": [[1.0] * 3 + [0], [1.0] * 2 + [0] * 2, [0] * 4, [1.0] + [0] * 3],
    "seq-mean-token-sum": [[1 / 3] * 3 + [0], [1 / 3] * 2 + [0] * 2, [0] * 4, [1 / 3] + [0] * 3],
    # 1/(B'·|o_i|): 1/9 for row 0, 1/6 for row 1, 1/3 for row 3
    "seq-mean-token-mean": [[1 / 9] * 3 + [0], [1 / 6] * 2 + [0] * 2, [0] * 4, [1 / 3] + [0] * 3],
    "seq-mean-token-sum-norm": [[1 / 12] * 3 + [0], [1 / 12] * 2 + [0] * 2, [0] * 4, [1 / 12] + [0] * 3],
}


@pytest.mark.parametrize("mode", MODES)
def test_hand_computed_with_masks_empty_rows_and_nan_padding(mode, reg) -> None:
    loss = LOSS.clone().requires_grad_(True)
    result = reg.get("loss_agg", mode)(loss, MASK)
    assert result.item() == pytest.approx(HAND[mode])
    result.backward()
    assert torch.allclose(loss.grad, torch.tensor(HAND_GRAD[mode]), atol=1e-7)
    # the same with the global counts spelled out (T_max = 4 as well)
    assert reg.get("loss_agg", mode)(LOSS, MASK, counts=_counts(MASK, 4)).item() == pytest.approx(HAND[mode])


def test_norm_uses_the_configured_max_length(reg) -> None:
    norm = reg.get("loss_agg", "seq-mean-token-sum-norm")
    # T_max = 8 from the config, not the width 4: 21 / (3·8) = 0.875
    assert norm(LOSS, MASK, counts=_counts(MASK, 8)).item() == pytest.approx(0.875)


@pytest.mark.parametrize("mode", MODES)
def test_all_padding_rows_neither_contribute_nor_count(mode, reg) -> None:
    fn = reg.get("loss_agg", mode)
    without = fn(LOSS[[0, 1, 3]], MASK[[0, 1, 3]])
    for extra_rows in (1, 5):
        loss = torch.cat([LOSS, torch.full((extra_rows, 4), 123.0)])
        mask = torch.cat([MASK, torch.zeros(extra_rows, 4)])
        assert fn(loss, mask).item() == pytest.approx(without.item())


@pytest.mark.parametrize("mode", MODES)
def test_all_empty_batch_is_zero_not_nan(mode, reg) -> None:
    fn = reg.get("loss_agg", mode)
    for loss, mask in ((torch.full((3, 4), NAN), torch.zeros(3, 4)), (torch.zeros(2, 0), torch.zeros(2, 0))):
        loss = loss.clone().requires_grad_(True)
        result = fn(loss, mask)
        assert result.item() == 0.0
        result.backward()
        assert torch.equal(loss.grad, torch.zeros_like(loss))
    counts = BatchCounts(tokens=0.0, sequences=0.0, max_response_length=7)
    assert fn(torch.ones(2, 3), torch.zeros(2, 3), counts=counts).item() == 0.0


@pytest.mark.parametrize("mode", MODES)
def test_single_valid_token(mode, reg) -> None:
    loss = torch.tensor([[NAN, 7.5, NAN], [NAN, NAN, NAN]])
    mask = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    want = 7.5 / 3 if mode == "seq-mean-token-sum-norm" else 7.5     # width 3 = T_max
    assert reg.get("loss_agg", mode)(loss, mask).item() == pytest.approx(want)
    want_counted = 7.5 / 10 if mode == "seq-mean-token-sum-norm" else 7.5
    assert reg.get("loss_agg", mode)(loss, mask, counts=_counts(mask, 10)).item() == pytest.approx(want_counted)


@pytest.mark.parametrize("mode", MODES)
def test_padding_width_invariance_with_counts(mode, reg) -> None:
    fn = reg.get("loss_agg", mode)
    counts = _counts(MASK, 16)
    base = fn(LOSS, MASK, counts=counts)
    for extra, fill in ((1, 0.0), (6, 1e6), (12, NAN)):
        loss = torch.cat([LOSS, torch.full((4, extra), fill)], 1)
        mask = torch.cat([MASK, torch.zeros(4, extra)], 1)
        assert fn(loss, mask, counts=counts).item() == pytest.approx(base.item())
        if mode != "seq-mean-token-sum-norm":       # the only mode whose local T_max is the width
            assert fn(loss, mask).item() == pytest.approx(fn(LOSS, MASK).item())


def test_norm_without_counts_follows_the_width(reg) -> None:
    # documented: without counts T_max is the tensor width, so padding changes the value
    norm = reg.get("loss_agg", "seq-mean-token-sum-norm")
    wide = norm(torch.cat([LOSS, torch.zeros(4, 4)], 1), torch.cat([MASK, torch.zeros(4, 4)], 1))
    assert wide.item() == pytest.approx(21 / (3 * 8))


def _random_batch(seed: int, batch: int = 9, width: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, width + 1, (batch,), generator=gen)
    lengths[1] = 0                                   # at least one empty row
    lengths[2] = width                               # at least one full row
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    loss = torch.randn(batch, width, generator=gen, dtype=torch.float64)
    return torch.where(mask.bool(), loss, torch.full_like(loss, NAN)), mask.double()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("splits", [(3, 3, 3), (1, 4, 4), (2, 2, 2, 2, 1), (9,)])
def test_micro_batch_sum_with_global_counts_equals_the_whole_batch(mode, splits, reg) -> None:
    fn = reg.get("loss_agg", mode)
    loss, mask = _random_batch(seed=sum(splits) * 31 + len(splits))
    counts = _counts(mask, max_response_length=12)
    whole_loss = loss.clone().requires_grad_(True)
    whole = fn(whole_loss, mask, counts=counts)
    whole.backward()

    micro_loss = loss.clone().requires_grad_(True)
    total = torch.zeros((), dtype=torch.float64)
    start = 0
    for size in splits:
        rows = slice(start, start + size)
        part_mask = mask[rows]
        width = max(int(part_mask.sum(-1).max().item()), 1)   # each micro-batch trimmed to its own width
        total = total + fn(micro_loss[rows, :width], part_mask[:, :width], counts=counts)
        start += size
    total.backward()
    assert total.item() == pytest.approx(whole.item(), rel=1e-12, abs=1e-12)
    grad = torch.nan_to_num(micro_loss.grad)
    assert torch.allclose(grad, torch.nan_to_num(whole_loss.grad), atol=1e-14)
    assert torch.equal(grad * (1 - mask), torch.zeros_like(grad))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_local_normalisation_would_break_the_equivalence(mode, reg) -> None:
    # the reason counts exist: per-micro-batch normalisation is not the whole-batch mode
    fn = reg.get("loss_agg", mode)
    loss = torch.tensor([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0], [2.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    local = fn(loss[:1], mask[:1]) + fn(loss[1:], mask[1:])
    assert local.item() != pytest.approx(fn(loss, mask).item())


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@settings(max_examples=25, deadline=None)
@given(constant=st.floats(-1e4, 1e4), lengths=st.lists(st.integers(0, 6), min_size=1, max_size=6))
def test_mean_of_a_constant_loss_is_the_constant(mode, constant, lengths) -> None:
    from rlzoo_plugins import aggregation

    fn = {"token-mean": aggregation.token_mean, "seq-mean-token-mean": aggregation.seq_mean_token_mean}[mode]
    mask = (torch.arange(6)[None, :] < torch.tensor(lengths)[:, None]).double()
    loss = torch.where(mask.bool(), torch.full_like(mask, constant), torch.full_like(mask, NAN))
    want = constant if mask.sum() > 0 else 0.0
    assert fn(loss, mask).item() == pytest.approx(want, rel=1e-12, abs=1e-9)


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(0, 5), min_size=1, max_size=7), data=st.data())
def test_micro_batch_equivalence_property(lengths, data) -> None:
    from rlzoo_plugins import aggregation

    mask = (torch.arange(5)[None, :] < torch.tensor(lengths)[:, None]).double()
    gen = torch.Generator().manual_seed(len(lengths))
    loss = torch.randn(mask.shape, generator=gen, dtype=torch.float64)
    cut = data.draw(st.integers(0, len(lengths)))
    counts = _counts(mask, 5)
    for fn in (aggregation.token_mean, aggregation.token_sum, aggregation.seq_mean_token_sum,
               aggregation.seq_mean_token_mean, aggregation.seq_mean_token_sum_norm):
        parts = fn(loss[:cut], mask[:cut], counts=counts) + fn(loss[cut:], mask[cut:], counts=counts)
        assert parts.item() == pytest.approx(fn(loss, mask, counts=counts).item(), rel=1e-12, abs=1e-12)


def _expected(mode: str, loss: list[list[float]], mask: list[list[float]], t_max: int) -> float:
    """The ALGORITHMS.md formula with plain Python loops."""
    total, tokens, seqs, seq_means = 0.0, 0, 0, 0.0
    for row_loss, row_mask in zip(loss, mask):
        row_sum = sum(value for value, m in zip(row_loss, row_mask) if m)
        row_tokens = sum(1 for m in row_mask if m)
        total += row_sum
        tokens += row_tokens
        if row_tokens:
            seqs += 1
            seq_means += row_sum / row_tokens
    if mode == "token-mean":
        return total / tokens if tokens else 0.0
    if mode == "token-sum":
        return total
    if mode == "seq-mean-token-sum":
        return total / seqs if seqs else 0.0
    if mode == "seq-mean-token-mean":
        return seq_means / seqs if seqs else 0.0
    return total / seqs / t_max if seqs else 0.0


@pytest.mark.parametrize("mode", MODES)
def test_fixture_against_plain_loops(mode, reg) -> None:
    rng = random.Random(2024)
    fn = reg.get("loss_agg", mode)
    for _ in range(5):
        batch, width = rng.randint(1, 8), rng.randint(1, 9)
        mask = [[0.0] * width for _ in range(batch)]
        for row in mask:
            for t in range(rng.randint(0, width)):
                row[t] = 1.0
        loss = [[rng.gauss(0.0, 3.0) for _ in range(width)] for _ in range(batch)]
        t_max = width + rng.randint(0, 5)
        mask_t = torch.tensor(mask, dtype=torch.float64)
        loss_t = torch.tensor(loss, dtype=torch.float64)
        got = fn(loss_t, mask_t, counts=_counts(mask_t, t_max)).item()
        assert got == pytest.approx(_expected(mode, loss, mask, t_max), rel=1e-12, abs=1e-12)
        got_local = fn(loss_t, mask_t).item()             # local counts: T_max = width
        assert got_local == pytest.approx(_expected(mode, loss, mask, width), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_registry_and_invariants(mode, reg) -> None:
    component = reg.get("loss_agg", mode)
    assert component.params is None and component.needs == frozenset()
    check_component(component)
    with pytest.raises(ConfigError, match="takes no parameters"):
        build_params(component, {"eps": 1.0})


def test_doc_snippets_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks, "docs/algorithms/aggregation.md has no python snippet"
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {})


def test_doc_names_every_mode() -> None:
    text = DOC.read_text()
    for mode in MODES:
        assert f"`{mode}`" in text
