"""What TensorBoard and `rlzoo compare` are given: effective hparams, the experiment summary,
the custom-scalars layout, sample tables, progress lines, the compare columns."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata

from rlzoo.analysis.runs import windows
from rlzoo.plan.planner import load_config
from rlzoo.commands.sweep import write_sweep_experiment
from rlzoo.plan.hparams import OFF, effective_hparams
from rlzoo.run.tracking import Progress, Tracker, custom_scalars_layout, group_samples


def _resolve(registry, *overrides: str):
    return load_config(registry, list(overrides))


def test_knobs_that_cannot_act_are_recorded_as_off(registry) -> None:
    off = effective_hparams(*_attrs(_resolve(registry, "algo=grpo", "kl.coef=0", "kl.estimator=k1")))
    assert off["kl.estimator.name"] == off["kl.apply"] == off["kl.controller.name"] == OFF and off["kl.coef"] == 0
    assert off["value_loss.name"] == off["trainer.critic_lr"] == OFF
    assert not any(key.startswith("kl.controller.") and key != "kl.controller.name" for key in off)
    assert "run_dir" not in off and "logging.progress" not in off and off["loss_agg.name"] == "seq-mean-token-mean"
    ppo = effective_hparams(*_attrs(_resolve(registry, "algo=ppo")))
    assert ppo["kl.estimator.name"] == "k1" and ppo["value_loss.name"] == "clipped"


def _attrs(resolved):
    return resolved.cfg, resolved.plan


def _experiment(log_dir: Path):
    [path] = list(log_dir.glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(path))
    acc.Reload()
    content = acc.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.EXPERIMENT_TAG]
    return metadata.parse_experiment_plugin_data(content)


def test_the_sweep_experiment_marks_what_differs_and_lists_eval_and_reward_first(registry, tmp_path: Path) -> None:
    runs = [_resolve(registry, "algo=grpo", "kl.coef=0", f"kl.estimator={k}", f"seed={s}")
            for k in ("k1", "k3") for s in (0, 1)]
    runs.append(_resolve(registry, "algo=ppo"))
    swept = ["algo", "seed", "kl.estimator"]
    write_sweep_experiment(tmp_path, runs, swept)
    write_sweep_experiment(tmp_path, runs, swept)   # re-running replaces its own file only
    experiment = _experiment(tmp_path)
    differs = {info.name: info.differs for info in experiment.hparam_infos}
    assert differs["seed"] and differs["algo"] and differs["loss_agg.name"] and differs["advantage.name"]
    assert differs["kl.coef"]                       # ppo has KL: a real difference, and it says which algorithm
    assert not differs["trainer.lr"] and not differs["trainer.update_epochs"]   # the same / follows from algo
    assert not differs["advantage.gamma"]           # a parameter of the differing estimator (gae's)
    assert differs["kl.estimator.name"]             # swept, and off vs ppo's k1
    grpo_only = _experiment_of(registry, tmp_path / "grpo", runs[:4], swept)
    assert not grpo_only["kl.estimator.name"]       # k1 vs k3 with KL off is no difference
    shown = [info.name for info in sorted(experiment.hparam_infos, key=lambda i: (not i.differs, i.name))][:5]
    assert shown == ["advantage.name", "algo", "kl.coef", "kl.estimator.name", "loss_agg.name"]
    metrics = [info.name.tag for info in experiment.metric_infos]
    assert metrics[:4] == ["eval/greedy_accuracy", "eval/pass@1", "eval/pass@8", "reward/mean"]


def _experiment_of(registry, log_dir: Path, runs, swept) -> dict[str, bool]:
    log_dir.mkdir()
    write_sweep_experiment(log_dir, runs, swept)
    return {info.name: info.differs for info in _experiment(log_dir).hparam_infos}


def test_a_run_writes_its_hparams_layout_and_sample_tables(registry, tmp_path: Path) -> None:
    resolved = _resolve(registry, "algo=grpo", "eval.n=4")
    tracker = Tracker(str(tmp_path))
    tracker.log_hparams(effective_hparams(resolved.cfg, resolved.plan), resolved.plan)
    batch = type("Batch", (), {})()
    batch.group_ids = torch.arange(6).repeat_interleave(5)
    batch.prompts = [f"p{g}" for g in batch.group_ids.tolist()]
    batch.references = [f"r{g}" for g in batch.group_ids.tolist()]
    batch.completions = [f"c{i}" for i in range(30)]
    batch.scores = torch.linspace(0, 1, 30)
    batch.transcripts = [f"t{i}" for i in range(30)]                # episodes: whole conversations are shown
    assert group_samples(batch)[5].completion == "t6"
    batch.transcripts = None                                        # single completions
    samples = group_samples(batch)
    assert [s.prompt for s in samples] == [f"p{g}" for g in range(4) for _ in range(4)]
    assert samples[0].reference == "r0" and samples[5].completion == "c6"
    tracker.log_samples(3, samples)
    tracker.close()
    acc = EventAccumulator(str(next(tmp_path.glob("events.out.tfevents.*"))))
    acc.Reload()
    text = acc.Tensors("samples/text_summary")[0].tensor_proto.string_val[0].decode()
    assert text.splitlines()[0] == "| prompt | reference | completion | score |" and "| p3 | r3 | c16 |" in text
    assert metadata.EXPERIMENT_TAG in acc.PluginTagToContent(metadata.PLUGIN_NAME)
    layout = custom_scalars_layout(resolved.plan)
    assert list(layout)[0] == "reward and evaluation"
    assert list(layout["reward and evaluation"])[:4] == ["reward/mean", "eval/greedy_accuracy", "eval/pass@1",
                                                        "eval/pass@4"]
    assert not any(tag.startswith("value/") for charts in layout.values() for tag in charts)   # no critic
    assert {"entropy", "grad_norm", "lr"} <= set(layout["policy"])


def test_progress_lines_when_there_is_no_bar(registry, capsys) -> None:
    cadence = _resolve(registry, "logging.progress=false", "trainer.total_steps=20").plan.cadence
    progress = Progress(cadence, 0)
    for step in range(1, 21):
        progress.update(step, {"reward/mean": 0.5, "timing/step_s": 0.1, **(
            {"eval/greedy_accuracy": 0.25} if step == 20 else {})})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 10 and lines[0] == "rlzoo: step 2/20 reward 0.500 step_s 0.10"
    assert lines[-1] == "rlzoo: step 20/20 reward 0.500 eval_acc 0.250 step_s 0.10"


@pytest.mark.parametrize("tty", [False, True])
def test_progress_bar_only_on_a_terminal(registry, capsys, monkeypatch, tty: bool) -> None:
    # written to a file, a tqdm bar is one huge line of carriage returns: print plain lines instead
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    cadence = _resolve(registry, "logging.progress=true", "trainer.total_steps=20").plan.cadence
    progress = Progress(cadence, 0)
    for step in range(1, 21):
        progress.update(step, {"reward/mean": 0.5, "timing/step_s": 0.1})
    progress.close()
    out, err = capsys.readouterr()
    assert (progress.bar is not None) == tty
    assert len(out.splitlines()) == (0 if tty else 10)
    assert ("\r" in err) == tty


def test_best_is_never_below_final() -> None:
    # the case: the old "final" (mean of the last 10 %) beat the old "best"
    # (max of a 25-step moving average) on a curve like this one
    values = np.array([0.0] * 360 + [1.0] * 15 + [0.0] * 10 + [1.0] * 15)
    smoothed = windows(values, 25)
    assert len(smoothed) == len(values) - 24 and smoothed[-1] == pytest.approx(15 / 25)
    assert smoothed.max() >= smoothed[-1]
    assert values[-40:].mean() > smoothed.max()   # the old definitions contradicted each other here
    assert list(windows(np.array([1.0, 2.0, 3.0]), 25)) == [2.0]   # fewer steps than the window: one mean


def test_the_compare_tutorial_shows_the_legend_compare_prints() -> None:
    from rlzoo.analysis.report import legend

    text = (Path(__file__).parents[1] / "docs" / "compare.md").read_text()
    for line in legend(0.5, 25).splitlines():
        assert line in text, line


def test_compare_without_matplotlib_is_one_clear_error(monkeypatch) -> None:
    import sys

    from rlzoo.analysis.figures import pyplot as _pyplot
    from rlzoo.core.errors import RlzooError

    monkeypatch.setitem(sys.modules, "matplotlib", None)   # what an environment without it looks like
    with pytest.raises(RlzooError, match="pip install matplotlib"):
        _pyplot()
