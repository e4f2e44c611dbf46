"""Lifecycle extensions: dynamic sampling, overlong shaping and filtering, top-entropy tokens."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from rlzoo.core.batch import RolloutBatch
from rlzoo.config.params import build_params
from rlzoo.core.errors import ConfigError
from rlzoo_plugins.extensions import (
    DynamicSampling,
    DynamicSamplingParams,
    EntropyTopTokens,
    EntropyTopTokensParams,
    OverlongFilter,
    OverlongShaping,
    OverlongShapingParams,
)


def make_batch(scores: list[float], groups: list[int], lengths: list[int], width: int = 6,
               truncated: list[bool] | None = None) -> RolloutBatch:
    n = len(scores)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()
    return RolloutBatch(
        prompt_ids=torch.ones(n, 2, dtype=torch.long), prompt_mask=torch.ones(n, 2),
        response_ids=torch.ones(n, width, dtype=torch.long), response_mask=mask,
        group_ids=torch.tensor(groups), scores=torch.tensor(scores, dtype=torch.float32),
        truncated=torch.tensor(truncated or [False] * n), prompts=[""] * n, completions=[""] * n,
        references=[None] * n,
    )


def ctx(max_new_tokens: int = 6, prompts_per_step: int = 2, resample=None) -> SimpleNamespace:
    cfg = OmegaConf.create({"rollout": {"max_new_tokens": max_new_tokens,
                                        "prompts_per_step": prompts_per_step}})
    return SimpleNamespace(cfg=cfg, metrics={}, counts={}, resample=resample, state={}, prompts=prompts_per_step)


def test_dynamic_sampling_drops_constant_groups_and_refills() -> None:
    batch = make_batch([1, 1, 0, 1, 0, 0], [0, 0, 1, 1, 2, 2], [3] * 6)
    refills = iter([make_batch([0.5, 0.5, 1, 0], [3, 3, 4, 4], [2] * 4)])
    c = ctx(prompts_per_step=2, resample=lambda n: next(refills))
    assert DynamicSampling(DynamicSamplingParams(max_rounds=2)).rlzoo_after_rollout(batch, c) is None
    assert batch.group_ids.tolist() == [1, 1, 4, 4]     # in place: groups 0, 2, 3 constant, dropped
    assert batch.scores.tolist() == [0, 1, 1, 0]
    assert c.counts == {"dynamic_sampling/kept_groups": 1.0, "dynamic_sampling/short_groups": 0.0}
    assert c.metrics == {"dynamic_sampling/rounds": 1.0}


def test_dynamic_sampling_without_rounds_only_filters_and_never_empties() -> None:
    batch = make_batch([1, 1, 0, 0], [0, 0, 1, 1], [3] * 4)
    c = ctx(resample=lambda n: pytest.fail("no refill allowed"))
    DynamicSampling(DynamicSamplingParams(max_rounds=0)).rlzoo_after_rollout(batch, c)
    assert batch.group_ids.tolist() == [0, 0, 1, 1]      # all constant: the batch is kept


def test_overlong_shaping_matches_dapo_formula() -> None:
    # L_max = 8, L_cache = 4: no penalty up to 4 tokens, then -(len-4)/4
    batch = make_batch([1.0] * 5, [0, 0, 1, 1, 2], [2, 4, 5, 6, 8], width=8)
    OverlongShaping(OverlongShapingParams(buffer_length=4, penalty_factor=1.0)).rlzoo_shape_rewards(
        batch, ctx(max_new_tokens=8))
    assert batch.rewards.tolist() == pytest.approx([1.0, 1.0, 0.75, 0.5, 0.0])
    assert batch.scores.tolist() == [1.0] * 5            # raw scores untouched


def test_overlong_shaping_default_buffer_is_dapos_fifth_of_the_budget() -> None:
    # L_max = 10: L_cache = 0.2 * 10 = 2 (DAPO: 4,096 of 20,480): free up to 8 tokens
    batch = make_batch([0.0, 0.0, 0.0], [0, 0, 0], [8, 9, 10], width=10)
    OverlongShaping().rlzoo_shape_rewards(batch, ctx(max_new_tokens=10))
    assert batch.rewards.tolist() == pytest.approx([0.0, -0.5, -1.0])
    # L_max = 7 (the default task): 1.4 rounds to a 1-token buffer
    assert OverlongShapingParams().buffer(7) == 1 and OverlongShapingParams(buffer_length=3).buffer(7) == 3


def test_dynamic_sampling_counts_the_groups_it_could_not_fill() -> None:
    batch = make_batch([1, 1, 0, 1], [0, 0, 1, 1], [3] * 4)
    refills = iter([make_batch([0, 0], [2, 2], [2, 2])] * 3)          # always constant
    c = ctx(prompts_per_step=2, resample=lambda n: next(refills))
    DynamicSampling(DynamicSamplingParams(max_rounds=3)).rlzoo_after_rollout(batch, c)
    assert batch.group_ids.tolist() == [1, 1]
    assert c.counts["dynamic_sampling/short_groups"] == 1.0 and c.metrics["dynamic_sampling/rounds"] == 3.0


def test_overlong_filter_masks_truncated_sequences() -> None:
    batch = make_batch([1.0, 0.0], [0, 0], [3, 6], truncated=[False, True])
    c = ctx()
    OverlongFilter().rlzoo_before_update(batch, c)
    assert batch.loss_mask[0].tolist() == [1, 1, 1, 0, 0, 0]
    assert batch.loss_mask[1].sum() == 0
    assert batch.response_mask[1].sum() == 6
    assert c.metrics["overlong/filtered_frac"] == 0.5


def test_entropy_top_tokens_keeps_the_highest_entropy_share() -> None:
    batch = make_batch([1.0, 0.0], [0, 0], [5, 5], width=6)
    batch.old_entropy = torch.tensor([[0.1, 0.9, 0.2, 0.8, 0.3, 5.0],
                                      [0.4, 0.5, 0.6, 0.7, 1.0, 9.0]])   # last column is padding
    EntropyTopTokens(EntropyTopTokensParams(top_ratio=0.2)).rlzoo_before_update(batch, ctx())
    kept = batch.loss_mask.nonzero().tolist()
    assert kept == [[0, 1], [1, 4]]                      # top 20% of 10 valid tokens


@pytest.mark.parametrize("name, params, fragment", [
    ("dynamic_sampling", {"max_rounds": -1}, "max_rounds must be >= 0"),
    ("overlong_shaping", {"buffer_length": 0}, "buffer_length must be >= 1"),
    ("entropy_top_tokens", {"top_ratio": 1.5}, "top_ratio must be in (0, 1]"),
])
def test_extension_parameters_are_validated(registry, name: str, params: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        build_params(registry.get("extension", name), params)


def test_dapo_preset_trains_with_its_extensions(capsys, tmp_path) -> None:
    from rlzoo.commands.cli import main
    from rlzoo.core.events import read_scalars

    code = main(["train", "algo=dapo", "extensions=[dynamic_sampling, overlong_shaping, overlong_filter,"
                 " entropy_top_tokens]", f"run_dir={tmp_path / 'r'}", "trainer.total_steps=2",
                 "model.hidden_size=32", "model.num_layers=1", "rollout.prompts_per_step=4",
                 "rollout.n=4", "logging.progress=false"])
    assert code == 0, capsys.readouterr().err
    tags = set(read_scalars(tmp_path / "r"))
    assert {"dynamic_sampling/kept_groups", "overlong/penalty_mean", "overlong/filtered_frac",
            "entropy_top/kept_frac"} <= tags
