"""On-policy distillation (``advantage=opd``, ``teacher.path``): the plan loads a teacher
only when a component reads it, the formula, and runs against a teacher."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlzoo.cli import main
from rlzoo.config import load_config
from rlzoo.errors import ConfigError
import zoo
from zoo import REGISTRY

TINY = [*zoo.TINY, "eval.size=0", "kl.coef=0"]


def test_opd_hand_computed_with_and_without_the_task_reward() -> None:
    opd = REGISTRY.get("advantage", "opd")
    student = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, 7.0, 7.0]])
    teacher = torch.tensor([[-0.5, -3.0, -0.5], [-0.3, -9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0]])
    adv, ret = opd(teacher_logp=teacher, old_logp=student, response_mask=mask, token_rewards=rewards)
    assert torch.allclose(adv, torch.tensor([[0.5, -1.0, 0.0], [-0.2, 0.0, 0.0]])) and torch.equal(adv, ret)
    params = opd.params(coef=2.0, task_reward_weight=0.5)
    adv, _ = opd(teacher_logp=teacher, old_logp=student, response_mask=mask, token_rewards=rewards, params=params)
    assert torch.allclose(adv, torch.tensor([[1.5, -1.5, 0.5], [-0.15, 0.0, 0.0]]))


def test_the_plan_loads_a_teacher_only_for_a_component_that_reads_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="opd.*set teacher.path"):
        load_config(REGISTRY, ["advantage=opd"])
    with pytest.raises(ConfigError, match="not a local model directory"):
        load_config(REGISTRY, ["advantage=opd", f"teacher.path={tmp_path}"])
    (tmp_path / "config.json").write_text("{}")
    plan = load_config(REGISTRY, ["advantage=opd", f"teacher.path={tmp_path}"]).plan
    assert "teacher" in plan.models and plan.runs("teacher_logp") and plan.runs("old_logp")
    plan = load_config(REGISTRY, [f"teacher.path={tmp_path}"]).plan
    assert "teacher" not in plan.models and not plan.runs("teacher_logp")
    assert any("teacher.path is set but no component reads the teacher" in w for w in plan.warnings)
    with pytest.raises(ConfigError, match="coef must be > 0"):
        load_config(REGISTRY, ["advantage={name: opd, coef: 0}", f"teacher.path={tmp_path}"])


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("teacher") / "run"
    assert main(["train", *TINY, f"run_dir={run_dir}", "trainer.total_steps=1"]) == 0
    return run_dir


@pytest.mark.slow
def test_a_teacher_identical_to_the_student_gives_zero_advantage_and_no_update(teacher_run: Path,
                                                                               tmp_path: Path) -> None:
    """The student is built from the same seed and config as the teacher's initial model."""
    student = tmp_path / "student"
    assert main(["train", *TINY, "advantage=opd", f"teacher.path={teacher_run / 'init_model'}",
                 f"run_dir={student}", "trainer.total_steps=2"]) == 0
    acc = EventAccumulator(str(student))
    acc.Reload()
    assert [e.value for e in acc.Scalars("teacher/reverse_kl")] == [0.0, 0.0]
    assert [e.value for e in acc.Scalars("advantages/mean")] == [0.0, 0.0]
    before = load_file(str(teacher_run / "init_model" / "model.safetensors"))
    after = load_file(str(student / "checkpoints" / "step_000002" / "policy" / "model.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.slow
def test_another_teacher_moves_the_student(teacher_run: Path, tmp_path: Path) -> None:
    student = tmp_path / "student"
    assert main(["train", *TINY, "seed=1", "advantage=opd", f"teacher.path={teacher_run / 'init_model'}",
                 f"run_dir={student}", "trainer.total_steps=2"]) == 0
    acc = EventAccumulator(str(student))
    acc.Reload()
    assert all(e.value != 0.0 for e in acc.Scalars("teacher/reverse_kl"))
    plan = (student / "plan.txt").read_text()
    assert "teacher" in plan and "teacher_logp" in plan


@pytest.mark.slow
def test_a_teacher_with_another_tokenizer_is_refused(tmp_path: Path, capsys) -> None:
    other = tmp_path / "other"
    assert main(["train", *TINY, "task=arithmetic", f"run_dir={other}", "trainer.total_steps=1"]) == 0
    capsys.readouterr()
    code = main(["train", *TINY, "advantage=opd", f"teacher.path={other / 'init_model'}",
                 f"run_dir={tmp_path / 'student'}", "trainer.total_steps=1"])
    assert code == 2
    assert "has another tokenizer than the policy" in capsys.readouterr().err
