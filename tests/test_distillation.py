"""On-policy distillation (``advantage=opd``, ``teacher.path``): the plan loads a teacher
only when a component reads it, the formula, and runs against a teacher."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlzoo.commands.cli import main
from rlzoo.plan.run_input import load_run
from rlzoo.plan.planner import load_config
from rlzoo.core.errors import ConfigError
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


# ------------------------------------------------------------- kl.target=teacher: forward KL over the teacher's top-k

TOPK_TO_TEACHER = ["kl.coef=1.0", "kl.target=teacher", "kl.estimator={name: forward_topk, topk: 3}"]


def test_the_kl_target_teacher_plans_a_teacher_logits_pass_and_no_reference(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    plan = load_config(REGISTRY, [*TOPK_TO_TEACHER, f"teacher.path={tmp_path}"]).plan
    assert plan.kl.target == "teacher" and plan.kl.uses_logits and plan.kl.placement == "loss"
    assert "teacher" in plan.models and "reference" not in plan.models
    assert plan.runs("teacher_logits") and not plan.runs("teacher_logp") and not plan.runs("ref_logits")
    assert "kl_estimator forward_topk via its input ref_logits (kl.target=teacher)" in plan.models["teacher"]
    assert "towards the teacher" in plan.render()
    # a sampled-token estimator reads the teacher's log-probs of the sampled tokens, in the loss or the reward
    for apply in ("loss", "reward"):
        plan = load_config(REGISTRY, ["kl.coef=0.5", "kl.target=teacher", "kl.estimator=k3", f"kl.apply={apply}",
                                      f"teacher.path={tmp_path}"]).plan
        assert plan.runs("teacher_logp") and "reference" not in plan.models and not plan.runs("ref_logp")
    # the default stays the reference; the knob is refused without a teacher, named when KL is off
    assert load_config(REGISTRY, ["kl.coef=0.1"]).plan.kl.target == "reference"
    with pytest.raises(ConfigError, match=r"kl_estimator forward_topk via its input ref_logits \(kl.target=teacher\)"
                                          r" distil\(s\) from a teacher model: set teacher.path"):
        load_config(REGISTRY, TOPK_TO_TEACHER)
    with pytest.raises(ConfigError, match="kl.target"):
        load_config(REGISTRY, ["kl.coef=0.1", "kl.target=student"])
    plan = load_config(REGISTRY, ["kl.coef=0", "kl.target=teacher", f"teacher.path={tmp_path}"]).plan
    assert "teacher" not in plan.models and any("kl.target has no effect" in w for w in plan.warnings)
    # both at once: opd's reverse-KL advantage and the forward top-k KL term, one teacher and its two passes
    plan = load_config(REGISTRY, [*TOPK_TO_TEACHER, "advantage=opd", f"teacher.path={tmp_path}"]).plan
    assert plan.runs("teacher_logp") and plan.runs("teacher_logits") and list(plan.models).count("teacher") == 1


def test_explain_shows_the_kl_target_and_the_teacher(tmp_path: Path) -> None:
    from rlzoo.commands.explain import explain

    (tmp_path / "config.json").write_text("{}")
    text = explain(load_config(REGISTRY, [*TOPK_TO_TEACHER, f"teacher.path={tmp_path}"]), REGISTRY)
    assert any(line.split()[:3] == ["kl.target", "teacher", "[command"] for line in text.splitlines())
    assert "kl: forward_topk towards the teacher" in text and "teacher_logits: teacher logits" in text


def _forward_topk_by_hand(student: list[float], teacher: list[float], k: int) -> float:
    """max(0, Σ over the teacher's k most likely tokens of p_T·(log p_T − log p_S)), float64 loops."""
    def log_softmax(z: list[float]) -> list[float]:
        top = max(z)
        norm = top + math.log(sum(math.exp(x - top) for x in z))
        return [x - norm for x in z]

    log_s, log_t = log_softmax(student), log_softmax(teacher)
    top = sorted(range(len(log_t)), key=lambda v: -log_t[v])[:k]
    return max(0.0, sum(math.exp(log_t[v]) * (log_t[v] - log_s[v]) for v in top))


def _logits_alone(model, prompt: torch.Tensor, response: torch.Tensor) -> list[list[float]]:
    """The model's own logits predicting each response token, the sequence run alone (no padding)."""
    with torch.no_grad():
        logits = model(torch.cat([prompt, response])[None]).logits[0].double()
    return logits[len(prompt) - 1:len(prompt) - 1 + len(response)].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("topk", [1, 3, "vocab"])
def test_forward_topk_to_the_teacher_hand_computed_with_padding_and_an_empty_response(
        teacher_run: Path, tmp_path: Path, topk) -> None:
    from rlzoo.learn.learner import _WeightedMeans
    from rlzoo.run.trainer import Trainer

    trainer = Trainer(load_run(REGISTRY, [
        *TINY, "seed=1", f"run_dir={tmp_path / 'r'}", "kl.coef=1.0", "kl.target=teacher", "loss_agg=token-mean",
        f"kl.estimator={{name: forward_topk, topk: {10**6 if topk == 'vocab' else topk}}}",
        f"teacher.path={teacher_run / 'init_model'}"]), zoo.PM)
    try:
        learner = trainer.learner
        batch = trainer.sampler.sample(4)
        rows, width = len(batch), 4
        lengths = [[0, 2, 3, 1][row % 4] for row in range(rows)]          # empty responses, padding after
        mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
        gen = torch.Generator().manual_seed(0)
        batch.response_ids = torch.randint(0, 10, (rows, width), generator=gen)   # tokens after the mask: garbage
        batch.response_mask, batch.loss_mask = mask, mask.clone()
        batch.rollout_logp = torch.zeros(rows, width)
        learner.prepare(batch)
        counts = {"loss_mask": learner._counts(batch, "loss_mask")}
        means = _WeightedMeans()
        loss = learner._policy_loss(batch, counts, means)
        assert torch.isfinite(loss)
        kl_value = means.result(trainer.dist)["kl/value"]
        student, teacher = trainer.models.policy, trainer.models.teacher_forward.model
        vocab = student.config.vocab_size
        k = vocab if topk == "vocab" else topk
        want, full = [], []
        for row, length in enumerate(lengths):
            prompt = batch.prompt_ids[row][batch.prompt_mask[row].bool()]
            response = batch.response_ids[row, :length]
            for s, t in zip(_logits_alone(student, prompt, response), _logits_alone(teacher, prompt, response)):
                want.append(_forward_topk_by_hand(s, t, k))
                log_s, log_t = torch.tensor(s).log_softmax(-1), torch.tensor(t).log_softmax(-1)
                full.append(float((log_t.exp() * (log_t - log_s)).sum()))    # KL(π_T‖π) over the vocabulary
        assert len(want) == sum(lengths) > 0 and sum(want) > 0                   # the teacher is not the student
        assert kl_value == pytest.approx(sum(want) / len(want), rel=1e-4)
        if topk == "vocab":                                                  # K = V: the exact forward KL
            assert kl_value == pytest.approx(sum(full) / len(full), rel=1e-4)
    finally:
        trainer.close()


def _train(run: Path, *overrides: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Train ``run`` for 2 steps; its ``kl/value`` curve and final policy weights."""
    assert main(["train", *TINY, f"run_dir={run}", "trainer.total_steps=2", *overrides]) == 0
    acc = EventAccumulator(str(run))
    acc.Reload()
    weights = load_file(str(run / "checkpoints" / "step_000002" / "policy" / "model.safetensors"))
    return [e.value for e in acc.Scalars("kl/value")], weights


@pytest.mark.slow
def test_the_kl_target_changes_the_update_and_a_teacher_equal_to_the_reference_does_not(
        teacher_run: Path, tmp_path: Path) -> None:
    """Forward top-k KL towards a teacher: a student of another seed moves otherwise than with the
    reference as target; the teacher being the student's own initial model (seed 0, as the
    teacher run's init_model) reproduces the reference run bit for bit."""
    teacher = f"teacher.path={teacher_run / 'init_model'}"
    runs = {(seed, target): _train(tmp_path / f"{seed}_{target}", f"seed={seed}", *TOPK_TO_TEACHER,
                                   f"kl.target={target}", teacher)
            for seed in (0, 1) for target in ("reference", "teacher")}
    kl_ref, weights_ref = runs[(1, "reference")]
    kl_teacher, weights_teacher = runs[(1, "teacher")]
    assert min(kl_teacher) > 10 * max(kl_ref), (kl_teacher, kl_ref)  # the reference starts equal to the policy
    assert kl_teacher[1] < kl_teacher[0]                             # distillation closes the gap (0.0167 -> 0.0109)
    assert any(not torch.equal(weights_ref[k], weights_teacher[k]) for k in weights_ref)
    plan = (tmp_path / "1_teacher" / "plan.txt").read_text()
    assert "teacher_logits: teacher logits in each update micro-batch" in plan
    same_ref, same_teacher = runs[(0, "reference")], runs[(0, "teacher")]
    assert same_ref[0] == same_teacher[0]
    assert all(torch.equal(same_ref[1][k], same_teacher[1][k]) for k in same_ref[1])
