"""On-policy distillation (``advantage=opd``, ``teacher.path``): the plan loads a teacher
only when a component reads it, the formula, and runs against a teacher."""

from __future__ import annotations

import math
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


def _reverse_kl_estimate(estimator: str, student: float, teacher: float) -> float:
    """verl kl_penalty(logprob=student, ref_logprob=teacher), written out per element."""
    x = student - teacher
    if estimator == "k1":
        return x
    if estimator == "abs":
        return abs(x)
    if estimator == "k2":
        return 0.5 * x * x
    neg_x = min(max(-x, -20.0), 20.0)
    return min(max(math.exp(neg_x) - neg_x - 1.0, -10.0), 10.0)


def test_opd_estimators_hand_computed() -> None:
    # x = log π_old − log π_T = [-0.5, 1.0, 0.0 (pad)]
    #   abs: A = -[0.5, 1.0];  k2: A = -[0.125, 0.5]
    #   k3: e^{-x} + x - 1 = [e^0.5 - 1.5, e^-1 + 0] -> A = -[0.148721, 0.367879]
    opd = REGISTRY.get("advantage", "opd")
    student = torch.tensor([[-1.0, -2.0, 5.0]])
    teacher = torch.tensor([[-0.5, -3.0, -5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    rewards = torch.zeros(1, 3)
    want = {"abs": [-0.5, -1.0], "k2": [-0.125, -0.5], "k3": [-(math.exp(0.5) - 1.5), -math.exp(-1.0)]}
    for estimator, expected in want.items():
        adv, ret = opd(teacher_logp=teacher, old_logp=student, response_mask=mask, token_rewards=rewards,
                       params=opd.params(estimator=estimator))
        assert adv[0].tolist() == pytest.approx([*expected, 0.0], rel=1e-6), estimator
        assert torch.equal(adv, ret)
    # coef and the task reward act as with k1
    adv, _ = opd(teacher_logp=teacher, old_logp=student, response_mask=mask, token_rewards=torch.tensor([[0, 1.0, 0]]),
                 params=opd.params(estimator="k2", coef=2.0, task_reward_weight=0.5))
    assert adv[0].tolist() == pytest.approx([-0.25 + 0.5, -1.0 + 0.5, 0.0], rel=1e-6)


@pytest.mark.parametrize("estimator", ["k1", "abs", "k2", "k3"])
def test_opd_estimators_match_verls_formulas_elementwise_and_edge_cases(estimator: str) -> None:
    opd = REGISTRY.get("advantage", "opd")
    gen = torch.Generator().manual_seed(3)
    student = -torch.rand(4, 6, generator=gen) * 4
    teacher = -torch.rand(4, 6, generator=gen) * 4
    teacher[0, 0], student[1, 1] = -60.0, -60.0                      # extreme log-ratios: k3's clamps act
    mask = (torch.rand(4, 6, generator=gen) > 0.2).float()
    mask[3] = 0                                                      # an empty response
    adv, _ = opd(teacher_logp=teacher, old_logp=student, response_mask=mask, token_rewards=torch.zeros(4, 6),
                 params=opd.params(estimator=estimator))
    for i in range(4):
        for t in range(6):
            want = -_reverse_kl_estimate(estimator, student[i, t].item(), teacher[i, t].item()) if mask[i, t] else 0.0
            assert adv[i, t].item() == pytest.approx(want, rel=1e-5, abs=1e-6), (i, t)
    same, _ = opd(teacher_logp=student, old_logp=student, response_mask=mask, token_rewards=torch.zeros(4, 6),
                  params=opd.params(estimator=estimator))
    assert (same == 0).all()                                         # a teacher equal to the student: A = 0
    assert (adv <= 0).all() or estimator == "k1"                     # abs, k2, k3 >= 0: never a positive push


def test_opd_default_estimator_is_k1_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    opd = REGISTRY.get("advantage", "opd")
    assert opd.default_params().estimator == "k1"
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="estimator must be one of k1, abs, k2, k3, got 'k4'"):
        load_config(REGISTRY, ["advantage={name: opd, estimator: k4}", f"teacher.path={tmp_path}"])


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
