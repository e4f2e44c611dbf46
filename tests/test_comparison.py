"""rlzoo compare's comparison on run summaries made here (no training): intervals from the
per-prompt records, pairing by prompt id, differences, verdicts, the notes said once, the
table and the JSON (rlzoo/analysis/comparison.py, measures.py, report.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from rlzoo.analysis.comparison import as_dict, compare_groups, parse_baseline
from rlzoo.analysis.figures import forest, plot
from rlzoo.analysis.intervals import paired_contrast, unpaired_contrast
from rlzoo.analysis.measures import Metric, area_under, prompt_values, run_value
from rlzoo.analysis.report import differences, interval_text, table
from rlzoo.analysis.runs import RunSummary, group_runs, stopped_early
from rlzoo.core.errors import ConfigError
from rlzoo.run.eval_records import EvalRecord
from rlzoo.run.rundir import write_status
from rlzoo.tasks.task import prompt_id

PROMPTS = [f"{i:04d}=" for i in range(40)]


def _record(step: int, correct: np.ndarray, prompts: list[str] = PROMPTS) -> EvalRecord:
    score = correct.astype(float)
    return EvalRecord(step=step, threshold=1.0, prompt_id=np.array([prompt_id(p) for p in prompts], dtype=np.uint64),
                      greedy_score=score, greedy_correct=correct, strict_correct=correct, lenient_correct=correct,
                      sampled_scores=np.zeros((len(prompts), 0)))


def _run(name: str, algo: str, seed: int, correct: np.ndarray | None, reward: float = 0.5,
         reached: float | None = 100.0, prompts: list[str] = PROMPTS, early: np.ndarray | None = None) -> RunSummary:
    """A run whose last evaluation (step 200) got ``correct`` per prompt (no records: None)
    and, with ``early``, an evaluation at step 100."""
    records, curve = {}, (np.array([200.0]), np.array([0.0]))
    if correct is not None:
        records = {200: _record(200, correct, prompts)}
        curve = (np.array([200.0]), np.array([correct.mean()]))
        if early is not None:
            records[100] = _record(100, early, prompts)
            curve = (np.array([100.0, 200.0]), np.array([early.mean(), correct.mean()]))
    return RunSummary(run_dir=Path(name), hparams={"algo": algo, "seed": seed}, steps=np.arange(1.0, 5.0),
                      smoothed=np.full(4, reward), reward_final=reward, reward_best=reward + 0.1,
                      steps_to_threshold=reached, train_s=1.0, eval_s=0.0, tokens_per_s=1.0,
                      eval_curves={"eval/greedy_accuracy": curve}, records=records)


def _tables(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """3 seeds × 40 prompts: b right on about 30%, a on those and 40% of the rest."""
    rng = np.random.default_rng(seed)
    b = rng.random((3, 40)) < 0.3
    return b | (rng.random((3, 40)) < 0.4), b


def _groups(a: np.ndarray, b: np.ndarray, **kwargs) -> list:
    runs = [_run(f"a{s}", "a", s, a[s], **kwargs) for s in range(len(a))]
    runs += [_run(f"b{s}", "b", s, b[s], reward=0.4) for s in range(len(b))]
    return group_runs(runs)


def test_a_difference_is_paired_by_prompt_and_its_verdict_says_better() -> None:
    a, b = _tables()
    comparison = compare_groups(_groups(a, b), baseline=["algo=b"])
    assert comparison.baseline.label == "algo=b" and not comparison.notes
    diff = next(d for d in comparison.differences if d.metric.name == "eval acc")
    expected = paired_contrast([a.astype(float), b.astype(float)], [1.0, -1.0]).interval()
    assert diff.paired and diff.interval == expected and diff.interval.value == pytest.approx(a.mean() - b.mean())
    assert diff.resolved and diff.verdict == "better" and diff.improvement[0] == 1.0
    worse = next(d for d in compare_groups(_groups(a, b), baseline=["algo=a"]).differences
                 if d.metric.name == "eval acc")
    assert worse.verdict == "worse" and worse.interval.value == pytest.approx(b.mean() - a.mean())


def test_several_groups_against_the_baseline_get_a_family_wise_verdict() -> None:
    a, b = _tables()
    c = b | (np.random.default_rng(7).random((3, 40)) < 0.12)   # c a little better than b: 0.075
    runs = [_run(f"{name}{s}", name, s, table[s]) for name, table in (("a", a), ("b", b), ("c", c)) for s in range(3)]
    comparison = compare_groups(group_runs(runs), baseline=["algo=b"])
    assert comparison.family_level == pytest.approx(0.975)        # 1 - 0.05 / 2 groups against the baseline
    final = {d.group.label: d for d in comparison.differences if d.metric.name == "eval acc"}
    expected = paired_contrast([c.astype(float), b.astype(float)], [1.0, -1.0]).interval(0.975)
    assert final["algo=c"].familywise == expected and final["algo=c"].familywise.value == pytest.approx(0.075)
    # resolved alone at 95 % ([0.015, 0.135]), not at 97.5 % ([-0.004, 0.154]): the family line says so
    assert final["algo=c"].resolved and not final["algo=c"].familywise.excludes_zero
    assert final["algo=a"].familywise.excludes_zero
    assert all(d.familywise is None for d in comparison.differences if d.metric.name != "eval acc")
    text = differences(comparison)
    assert "Family-wise (2 groups against the baseline in eval acc; Bonferroni: each interval at 97.5%" in text
    assert "  - algo=c: not resolved family-wise, 97.5% CI [−0.004, 0.154] (resolved alone at 95%)" in text
    assert "  - algo=a: better, 97.5% CI [0.121, 0.495]" in text
    assert as_dict(comparison)["differences"][0]["familywise_interval"]["level"] == pytest.approx(0.975)
    # two groups: one comparison, nothing to correct
    two = compare_groups(_groups(a, b), baseline=["algo=b"])
    assert two.family_level is None and "Family-wise" not in differences(two)


def test_without_a_baseline_the_best_group_is_it() -> None:
    a, b = _tables()
    assert compare_groups(_groups(a, b)).baseline.label == "algo=a"


def test_a_baseline_that_names_no_group_or_several_lists_the_groups() -> None:
    a, b = _tables()
    groups = _groups(a, b)
    with pytest.raises(ConfigError, match=r"--baseline algo=c names no group; the groups are: algo=a; algo=b"):
        parse_baseline(groups, ["algo=c"])
    with pytest.raises(ConfigError, match="is not KEY=VALUE"):
        parse_baseline(groups, ["grpo"])


def test_an_unresolved_difference_says_how_many_seeds_would_resolve_it() -> None:
    rng = np.random.default_rng(3)
    easy = rng.random(40) < 0.5
    a = np.stack([easy ^ (rng.random(40) < 0.15) for _ in range(3)])
    b = np.stack([easy ^ (rng.random(40) < 0.15) for _ in range(3)])
    diff = next(d for d in compare_groups(_groups(a, b), baseline=["algo=b"], min_effect=0.2).differences
                if d.metric.name == "eval acc")
    assert not diff.resolved and abs(diff.interval.value) < 0.05
    found = re.fullmatch(r"not resolved; about (\d+) seeds per group would resolve a difference this size; "
                         r"(\d+) seeds per group resolve a difference of 0.2", diff.verdict)
    assert found, diff.verdict
    observed, wanted = int(found.group(1)), int(found.group(2))
    assert (observed, wanted) == (diff.seeds_observed, diff.seeds_min_effect) and observed > 100 > wanted


def test_runs_on_other_held_out_sets_are_compared_unpaired_with_one_line() -> None:
    a, b = _tables()
    other = [f"x{i}=" for i in range(40)]
    runs = [_run(f"a{s}", "a", s, a[s], prompts=other) for s in range(3)]
    runs += [_run(f"b{s}", "b", s, b[s]) for s in range(3)]
    comparison = compare_groups(group_runs(runs), baseline=["algo=b"])
    assert comparison.notes == ["held-out sets differ (prompt ids): pairing refused for algo=a (a0, a1, a2) against "
                                "algo=b; unpaired intervals given"]
    diff = next(d for d in comparison.differences if d.metric.name == "eval acc")
    assert not diff.paired
    assert diff.interval == unpaired_contrast([a.astype(float), b.astype(float)], [1.0, -1.0]).interval()
    assert "(unpaired;" in differences(comparison)


def test_one_run_and_runs_without_records_are_said_once() -> None:
    a, b = _tables()
    runs = [_run("a0", "a", 0, a[0])] + [_run(f"b{s}", "b", s, None) for s in range(3)]
    comparison = compare_groups(group_runs(runs), baseline=["algo=b"])
    assert len(comparison.notes) == 2
    assert comparison.notes[0].startswith("3 run(s) have no per-prompt records of eval/greedy_accuracy")
    assert comparison.notes[1] == "one run in algo=a: its interval covers the held-out prompts only, not seeds"
    row = next(line for line in table(comparison, 0.5).splitlines() if line.startswith("| algo=a "))
    assert "| 1 (prompts only) |" in row
    assert comparison.estimates["eval acc"][0].interval.method == "prompts only"
    assert comparison.estimates["eval acc"][1].interval.method == "seeds only"    # from the logged values
    diff = next(d for d in comparison.differences if d.metric.name == "eval acc")
    assert "(one run of algo=a: seed noise not counted)" in diff.verdict


def test_steps_to_the_threshold_are_not_differenced_when_a_run_never_reached_it() -> None:
    a, b = _tables()
    runs = [_run(f"a{s}", "a", s, a[s], reached=None if s == 0 else 80.0) for s in range(3)]
    runs += [_run(f"b{s}", "b", s, b[s]) for s in range(3)]
    comparison = compare_groups(group_runs(runs), baseline=["algo=b"])
    steps = next(d for d in comparison.differences if d.metric.name == "steps to T")
    assert steps.interval is None and steps.verdict == "not computed: some runs never reached the threshold"
    cell = next(line for line in table(comparison, 0.5).splitlines() if line.startswith("| algo=a ")).split(" | ")[11]
    assert cell.endswith("(2/3)") and cell.startswith("80")


def test_the_auc_and_the_best_so_far_read_every_evaluation() -> None:
    """AUC: trapezoids over the steps divided by the span; best: the highest accuracy of a run."""
    assert area_under(np.array([0.0, 10.0, 30.0]), np.array([0.0, 1.0, 0.5])) == pytest.approx((5 + 15) / 30)
    assert area_under(np.array([7.0]), np.array([0.25])) == 0.25
    early = np.zeros(40, dtype=bool)
    early[:30] = True
    late = np.zeros(40, dtype=bool)
    late[:10] = True
    run = _run("r", "a", 0, late, early=early)
    ids, per = prompt_values(run, Metric("eval acc AUC", "eval/greedy_accuracy", "auc"))
    assert per.shape == (40,) and per.mean() == pytest.approx((0.75 + 0.25) / 2)
    assert list(ids) == sorted(ids)                                   # prompts in id order
    assert run_value(run, Metric("eval acc best", "eval/greedy_accuracy", "best")) == 0.75
    assert run_value(run, Metric("eval acc", "eval/greedy_accuracy", "final")) == 0.25


def test_the_table_the_json_and_the_figures(tmp_path: Path) -> None:
    a, b = _tables()
    runs = [_run(f"a{s}", "a", s, a[s % 3]) for s in range(4)] + [_run(f"b{s}", "b", s, b[s]) for s in range(3)]
    comparison = compare_groups(group_runs(runs), baseline=["algo=b"])
    lines = table(comparison, 0.5).splitlines()
    assert lines[0].split(" | ")[8] == "IQM eval acc"
    row_a, row_b = lines[2].split(" | "), lines[3].split(" | ")
    assert row_b[0] == "| algo=b (baseline)" and row_a[8] != "—" and row_b[8] == "—"   # the IQM from 4 runs
    estimate = comparison.estimates["eval acc"][0].interval
    assert row_a[2] == interval_text(estimate) and row_a[2].count("[") == 1
    data = json.loads(json.dumps(as_dict(comparison)))
    assert data["baseline"] == "algo=b" and len(data["groups"]) == 2
    first = data["differences"][0]
    assert first["metric"] == "eval acc" and first["paired"] and first["interval"]["method"] == "seeds × prompts"
    assert set(first["p_improvement"]) == {"value", "low", "high"}
    assert plot(comparison, tmp_path / "c.png", 2, "t").read_bytes()[:4] == b"\x89PNG"
    assert forest(comparison, tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"


def test_min_effect_and_metric_are_checked() -> None:
    a, b = _tables()
    for bad in (0.0, -0.1, 1.0):
        with pytest.raises(ConfigError, match="--min-effect must be > 0 and < 1"):
            compare_groups(_groups(a, b), min_effect=bad)
    with pytest.raises(ConfigError, match="--metric 'eval/acc' is not a metric"):
        compare_groups(_groups(a, b), primary="eval/acc")


def test_runs_without_evaluation_are_compared_on_their_training_reward() -> None:
    runs = [_run(f"a{s}", "a", s, None, reward=0.6 + 0.01 * s) for s in range(3)]
    runs += [_run(f"b{s}", "b", s, None, reward=0.3 + 0.01 * s) for s in range(3)]
    for run in runs:
        run.eval_curves.clear()
    comparison = compare_groups(group_runs(runs))
    assert comparison.primary == "reward/mean" and comparison.baseline.label == "algo=a"
    assert [d.metric.name for d in comparison.differences] == ["reward final", "reward best", "steps to T"]
    final = comparison.differences[0]
    assert final.interval.method == "seeds only" and final.interval.value == pytest.approx(-0.3)
    assert final.verdict == "worse"
    assert comparison.estimates["eval acc"][0].interval is None
    row = table(comparison, 0.5).splitlines()[2].split(" | ")
    assert row[2:8] == ["—"] * 6 and row[9].startswith("0.610 [")


def test_min_effect_applies_to_the_chosen_metric() -> None:
    """``--metric eval/greedy_score --min-effect 0.2``: the seeds for 0.2 are said for the
    greedy score (not a share, so any positive DELTA), not for the table's accuracy."""
    rng = np.random.default_rng(3)
    easy = rng.random(40) < 0.5
    a = np.stack([easy ^ (rng.random(40) < 0.15) for _ in range(3)])
    b = np.stack([easy ^ (rng.random(40) < 0.15) for _ in range(3)])
    comparison = compare_groups(_groups(a, b), primary="eval/greedy_score", baseline=["algo=b"], min_effect=0.2)
    score = next(d for d in comparison.differences if d.metric.name == "eval/greedy_score")
    assert score.seeds_min_effect is not None and "resolve a difference of 0.2" in score.verdict
    assert [d.metric.name for d in comparison.differences] == [
        "eval/greedy_score", "eval/greedy_score best", "eval/greedy_score AUC", "steps to T"]


def test_a_run_that_did_not_finish_is_said_so(tmp_path: Path) -> None:
    """An interrupted run's last evaluation is not its end's: status.json says how it stands;
    without one, a last logged step short of trainer.total_steps does; a completed one (also
    one whose last logged step is short of it: logging.log_every > 1) says nothing."""
    assert stopped_early(tmp_path, 40, 28) == "not finished at step 28 of 40"
    assert stopped_early(tmp_path, 40, 40) is None and stopped_early(tmp_path, None, 28) is None
    write_status(tmp_path, "interrupted", 31, 40)
    assert stopped_early(tmp_path, 40, 28) == "interrupted at step 31 of 40"
    write_status(tmp_path, "completed", 40, 40)
    assert stopped_early(tmp_path, 40, 30) is None
    a, b = _tables()
    runs = [_run(f"a{s}", "a", s, a[s]) for s in range(3)] + [_run(f"b{s}", "b", s, b[s]) for s in range(3)]
    runs[1].stopped = "interrupted at step 31 of 40"
    comparison = compare_groups(group_runs(runs), baseline=["algo=b"])
    assert comparison.notes == ["1 run(s) did not finish (a1 interrupted at step 31 of 40): their values are "
                                "those of their last logged step and evaluation, not of the end of training"]
    assert differences(comparison).endswith(f"Note: {comparison.notes[0]}")
    alone = compare_groups(group_runs(runs[:3]))     # one group: no differences, the note still printed
    assert differences(alone).splitlines() == [f"One group ({alone.baseline.label}): no differences to report.",
                                               f"Note: {comparison.notes[0]}"]
