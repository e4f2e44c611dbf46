"""rlzoo compare's group labels and its --x figure, on run summaries made here (no training)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlzoo.analysis.figures import plot_against
from rlzoo.analysis.runs import RunSummary, group_runs
from rlzoo.core.errors import RlzooError

COMPOSED = ("[{'name': 'rejection', 'estimator': 'k3', 'level': 'mean', 'threshold': 0.01, 'mode': 'weight'}, "
            "{'name': 'tis', 'cap': 2.0, 'clip_min': None, 'normalize': False}]")


def _run(name: str, reward: float, accuracy: float, **hparams: object) -> RunSummary:
    steps = np.arange(1.0, 5.0)
    return RunSummary(run_dir=Path(name), hparams={"kl.coef": 0.04, **hparams}, steps=steps,
                      smoothed=np.full(4, reward), reward_final=reward, reward_best=reward, steps_to_threshold=None,
                      train_s=1.0, eval_s=0.0, tokens_per_s=1.0,
                      eval_curves={"eval/greedy_accuracy": (np.array([4.0]), np.array([accuracy]))})


def _sweep() -> list[RunSummary]:
    """A staleness × correction sweep as its runs' hparams record it: a single correction is
    ``rollout_correction.name`` plus its parameters, a composition the list itself."""
    runs = []
    for k in (0, 2, 10):
        for seed in (0, 1):
            runs.append(_run(f"tis{k}{seed}", 0.5 - 0.01 * k, 0.3, seed=seed, **{
                "rollout.staleness": k, "rollout_correction.name": "tis", "rollout_correction.cap": 2}))
            runs.append(_run(f"ice{k}{seed}", 0.6 - 0.01 * k, 0.4, seed=seed, **{
                "rollout.staleness": k, "rollout_correction.name": "icepop", "rollout_correction.low": 0.5,
                "rollout_correction.high": 5}))
            runs.append(_run(f"comp{k}{seed}", 0.4, 0.1, seed=seed, **{
                "rollout.staleness": k, "rollout_correction": COMPOSED}))
    return runs


def test_a_component_is_labelled_by_its_name_and_a_composition_by_its_items() -> None:
    labels = [g.label for g in group_runs(_sweep())]
    # staleness in numeric order (10 after 2); a component's own parameters follow from its name
    assert labels == [f"rollout.staleness={k}, rollout_correction={c}"
                      for k in (0, 2, 10) for c in ("[rejection, tis]", "icepop", "tis")]
    assert all(len(g.runs) == 2 for g in group_runs(_sweep()))


def test_a_parameter_swept_within_one_component_stays_in_the_label() -> None:
    runs = [_run(f"r{cap}{seed}", 0.5, 0.2, seed=seed, **{"rollout_correction.name": "tis",
                                                             "rollout_correction.cap": cap})
            for cap in (2, 5) for seed in (0, 1)]
    assert [g.label for g in group_runs(runs)] == ["rollout_correction.cap=2", "rollout_correction.cap=5"]


def test_x_plots_final_numbers_against_a_numeric_key(tmp_path: Path) -> None:
    out = plot_against(group_runs(_sweep()), "rollout.staleness", tmp_path / "x.png", "t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_x_refuses_a_key_that_does_not_separate_groups_or_is_not_a_number(tmp_path: Path) -> None:
    groups = group_runs(_sweep())
    with pytest.raises(RlzooError, match=r"'kl.coef' is not a key that separates the groups; they differ in: "
                                         r"rollout.staleness, rollout_correction"):
        plot_against(groups, "kl.coef", tmp_path / "x.png", "t")
    with pytest.raises(RlzooError, match=r"--x 'rollout_correction' needs numbers; group .* has '\[rejection, tis\]'"):
        plot_against(groups, "rollout_correction", tmp_path / "x.png", "t")


def test_one_group_of_seeds_is_labelled_by_the_directory_they_share_not_by_one_seed() -> None:
    seeds = [_run(f"runs/smollm2-arith/seed-{seed}", 0.4, 0.3, seed=seed) for seed in (0, 1, 2)]
    assert [g.label for g in group_runs(seeds)] == ["smollm2-arith"]
    assert [g.label for g in group_runs(seeds[:1])] == ["seed-0"]  # one run: its own name
    apart = [_run(f"a/seed-{seed}", 0.4, 0.3, seed=seed) for seed in (0, 1)] + [_run("b/seed-2", 0.4, 0.3, seed=2)]
    assert [g.label for g in group_runs(apart)] == ["all runs"]


def test_the_figure_title_counts_in_the_singular_and_plural() -> None:
    from rlzoo.commands.compare import _count

    assert [_count(1, "group"), _count(3, "group"), _count(0, "run")] == ["1 group", "3 groups", "0 runs"]
