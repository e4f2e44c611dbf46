"""rlzoo doctor on runs that never learn (rlzoo/diagnostics/flat_start.py), the metrics those
checks read (kl/grad_share, the answers' token lengths), the warning at the start of a run, the
post-mortem of damaged logs and configs, what became of findings printed during a run, and the
end-of-run summary line. Synthetic curves and run directories written here: no training."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from torch.utils.tensorboard import SummaryWriter

from rlzoo.commands.cli import main
from rlzoo.core.events import event_file_problem
from rlzoo.core.tags import Tag
from rlzoo.diagnostics import detectors, flat_start
from rlzoo.diagnostics.run_record import RunRecord
from rlzoo.diagnostics.watch import Watch
from rlzoo.learn.gradient_share import kl_advantage_share, kl_gradient_share
from rlzoo.run.summary import summary_line
from rlzoo.tasks.answer_lengths import answer_token_lengths, check_budget

STEPS = 100


def config(**sections: dict) -> dict:
    base = {"trainer": {"lr": 5e-4, "update_epochs": 1, "num_mini_batches": 4, "total_steps": STEPS,
                        "warmup_steps": 0, "lr_schedule": "constant", "max_grad_norm": 1.0},
            "rollout": {"n": 8, "max_new_tokens": 7, "temperature": 1.0, "top_p": 1.0, "staleness": 0},
            "kl": {"coef": 0.04, "controller": "fixed"}, "eval": {"threshold": 1.0, "size": 128},
            "rollout_correction": "none", "reward": None}
    for key, value in sections.items():
        base[key] = {**base[key], **value} if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return base


def record(cfg: dict | None = None, **curves) -> RunRecord:
    """Tag ``a/b`` (written ``a__b``) at steps 1..STEPS is ``curves[tag](s)``."""
    scalars = {tag.replace("__", "/"): [(s, float(f(s))) for s in range(1, STEPS + 1)] for tag, f in curves.items()}
    return RunRecord(scalars, cfg or config())


FLAT = dict(reward__mean=lambda s: 0.06, reward__std=lambda s: 0.08, reward__max=lambda s: 0.5,
            entropy=lambda s: 2.65, policy__approx_kl=lambda s: 0.004, policy__clipfrac=lambda s: 0.01,
            kl__value=lambda s: 0.01, kl__grad_share=lambda s: 0.02, reward__zero_std_frac=lambda s: 0.1,
            policy__loss=lambda s: 0.01, grad_norm=lambda s: 1.0, lr=lambda s: 5e-4)
"""A run whose reward never moves, with nothing else wrong: no finding."""
LEARNING = {**FLAT, "reward__mean": lambda s: 0.06 + 0.4 * s / STEPS}


def codes(run: RunRecord) -> list[str]:
    return [f.code for f in detectors.diagnose(run)]


def test_a_flat_run_with_no_setting_to_blame_and_a_learning_run_have_no_finding() -> None:
    assert codes(record(**FLAT)) == [] and codes(record(**LEARNING)) == []


def test_constant_reward_at_the_top_names_the_reward_and_no_achievement() -> None:
    same = {**FLAT, "reward__mean": lambda s: 1.0, "reward__std": lambda s: 0.0, "reward__zero_std_frac": lambda s: 1}
    run = record(config(reward="format"), **same)
    run.scalars[Tag.EVAL_ACCURACY] = [(50, 1.0), (100, 1.0)]
    (finding,) = detectors.diagnose(run)
    assert finding.code == "constant_reward" and finding.fixes[0][0] == "reward=null"
    assert "every completion scored 1" in finding.evidence and "no achievement" in finding.evidence
    assert "the reward (format) does not tell completions apart" in finding.cause
    # zero-variance groups and the loss at 0 are its symptoms: named, not reported
    assert "most groups have zero reward variance" in finding.cause


def test_constant_reward_at_zero_asks_for_partial_credit() -> None:
    zero = {**FLAT, "reward__mean": lambda s: 0.0, "reward__std": lambda s: 0.0, "reward__max": lambda s: 0.0}
    (finding,) = detectors.diagnose(record(**zero))
    assert finding.title == "nothing is learning: no completion ever scores"
    assert finding.fixes[0][0] == "reward=[exact_match, {name: length_match, weight: 0.1}]"
    # a reward with a spread on any of the first five steps is not constant
    spread = {**zero, "reward__std": lambda s: 0.1 if s == 5 else 0.0}
    assert flat_start.constant_reward(record(**spread)) is None


def test_no_variety_names_the_sampling_knob_that_was_set() -> None:
    greedy = {**FLAT, "entropy": lambda s: 0.0009, "reward__mean": lambda s: 0.0, "reward__std": lambda s: 0.0}
    (finding,) = detectors.diagnose(record(config(rollout={"temperature": 0.05}), **greedy))
    assert finding.code == "no_variety" and finding.fixes == (("rollout.temperature=1.0",
                                                                "sample from the policy's own distribution"),)
    assert "entropy 0.0009 on steps 1-5 (< 0.1 nats)" in finding.evidence
    # top-p: the logged entropy is the full distribution's; every group's samples score alike
    nucleus = {**FLAT, "reward__zero_std_frac": lambda s: 1.0}
    (finding,) = detectors.diagnose(record(config(rollout={"top_p": 0.05}), **nucleus))
    assert finding.code == "no_variety" and finding.fixes[0][0] == "rollout.top_p=1.0"
    # no sampling knob: the constant reward is the cause named
    assert codes(record(**greedy)) == ["constant_reward"]


def test_groups_that_agree_all_run_name_the_sampling_knob_though_the_reward_drifts_up() -> None:
    # round 4 (post hoc): GSPO at temperature 0.03 on sort3: every group's completions scored alike on every
    # step, the entropy 0.005, and the greedy completions drifted from reward 0 to 0.1 (not flat)
    drift = {**FLAT, "entropy": lambda s: 0.005, "reward__zero_std_frac": lambda s: 1.0,
             "reward__mean": lambda s: 0.1 * min(1.0, s / 50)}
    (finding,) = detectors.diagnose(record(config(rollout={"temperature": 0.03}), **drift))[:1]
    assert finding.code == "no_variety" and finding.fixes[0][0] == "rollout.temperature=1.0"
    assert "reward/zero_std_frac median 1.00 over the run" in finding.evidence
    # groups that disagree later in the run (it learns to explore again): the reward's rise is learning
    later = {**drift, "reward__zero_std_frac": lambda s: 1.0 if s <= 20 else 0.3}
    assert "no_variety" not in codes(record(config(rollout={"temperature": 0.03}), **later))


def test_a_nucleus_of_one_token_is_named_when_groups_hold_one_completion() -> None:
    # REINFORCE++ (one completion a prompt) at top_p 0.05 (round 2 of benchmarks/doctor_recall.py): no
    # group to compare, the full distribution's entropy (2.67), no completion ever scores; the sampler
    # is 1.14 nats per token from the policy: its nucleus holds e^-1.14 = 32 % of the policy's mass
    single = {**FLAT, "reward__mean": lambda s: 0.0, "reward__std": lambda s: 0.0, "reward__zero_std_frac":
              lambda s: 1.0, "entropy": lambda s: 2.67, "rollout__mismatch_k3": lambda s: 1.14}
    one = config(rollout={"top_p": 0.05, "n": 1})
    finding, *rest = detectors.diagnose(record(one, **single))
    assert finding.code == "no_variety" and finding.fixes[0][0] == "rollout.top_p=1.0"
    assert [f.code for f in rest] == ["rollout_mismatch"]   # what the nucleus does to the update, named after it
    assert "rollout/mismatch_k3 1.14 nats/token on steps 1-5 (> 0.5): the nucleus holds about 32% of the " \
           "policy's probability" in finding.evidence
    # a nucleus that holds most of the mass (top_p 0.9 can give at most -log 0.9 = 0.105): not this
    wide = {**single, "rollout__mismatch_k3": lambda s: 0.1}
    assert codes(record(config(rollout={"top_p": 0.9, "n": 1}), **wide))[0] == "constant_reward"
    # the same mismatch with no nucleus is no sampling knob's doing (a stale or mismatched engine)
    assert "no_variety" not in codes(record(config(rollout={"n": 1}), **single))


def test_first_updates_too_big_without_persistence() -> None:
    big = {**FLAT, "policy__approx_kl": lambda s: {1: 0.395, 2: 0.357, 3: 0.137}.get(s, 0.004)}
    (finding,) = detectors.diagnose(record(config(trainer={"lr": 0.05}), **big))
    assert finding.code == "step_too_big" and "0.395, 0.357, 0.137, 0.004, 0.004 on steps 1-5" in finding.evidence
    # 0.05 x sqrt(0.015 / 0.395) = 0.00974: one significant digit
    assert finding.fixes[0][0] == "trainer.lr=0.01"
    # one on-policy update a step (approx-KL 0): the entropy's fall shows the step; a fifth of the rate
    fall = {**FLAT, "policy__approx_kl": lambda s: 0.0, "policy__clipfrac": lambda s: 0.0,
            "entropy": lambda s: {1: 2.65, 2: 2.1, 3: 1.6, 4: 0.45}.get(s, 0.005)}
    (finding,) = detectors.diagnose(record(config(trainer={"lr": 0.1}), **fall))
    assert finding.code == "step_too_big" and finding.fixes[0][0] == "trainer.lr=0.02"
    assert "it lost more than 30%" in finding.evidence
    # the entropy's fall alone in a run that then learns: no finding of this kind
    assert "step_too_big" not in codes(record(config(trainer={"lr": 0.1}),
                                              **{**fall, "reward__mean": LEARNING["reward__mean"]}))


def test_an_approx_kl_far_above_any_healthy_run_is_named_while_a_partial_credit_term_rises() -> None:
    # GRPO on arithmetic at lr 0.05: approx-KL 0.48 on step 1, the length-match term lifts reward/mean
    # 0.012 -> 0.082 while exact_match stays 0 (benchmarks/doctor_recall.py's tuning set)
    rising = {**FLAT, "policy__approx_kl": lambda s: {1: 0.48, 2: 0.3}.get(s, 0.004),
              "reward__mean": lambda s: 0.012 + 0.07 * s / STEPS, "reward__exact_match": lambda s: 0.0,
              "entropy": lambda s: 2.6 if s < 20 else 0.3}
    (finding,) = detectors.diagnose(record(config(trainer={"lr": 0.05}), **rising))
    assert finding.code == "step_too_big" and finding.title == "the first updates were far too big"
    assert "policy/approx_kl 0.48, 0.3, 0.004, 0.004, 0.004 on steps 1-5 (> 0.2)" in finding.evidence
    # windows of 5 steps: the means at steps 3 and 98, 0.012 + 0.07 x 3 / 100 and 0.012 + 0.07 x 98 / 100
    assert "reward/mean 0.0141 -> 0.0806, reward/exact_match 0 -> 0 (first window to last)" in finding.evidence
    # 0.05 x sqrt(0.015 / 0.48) = 0.0088: one significant digit
    assert finding.fixes[0][0] == "trainer.lr=0.009"
    # the same KL from the reference (> kl_blowup) without approx-KL: named as well
    away = {**rising, "policy__approx_kl": lambda s: 0.0, "kl__value": lambda s: 1.3 if s <= 3 else 0.1}
    assert codes(record(config(trainer={"lr": 0.05}), **away))[0] == "step_too_big"
    # RLOO at lr 0.03 (one on-policy update a step: approx-KL and clip fraction 0): its first steps move it
    # 0.1-0.32 nats per token from the reference (> early_ref_kl_high 0.2), the reward stays flat
    drift = {**FLAT, "policy__approx_kl": lambda s: 0.0, "policy__clipfrac": lambda s: 0.0,
             "kl__value": lambda s: {1: 0.0, 2: 0.098, 3: 0.245, 4: 0.262, 5: 0.316}.get(s, 0.4)}
    (finding,) = detectors.diagnose(record(config(trainer={"lr": 0.03}), **drift))
    assert finding.code == "step_too_big" and finding.fixes[0][0] == "trainer.lr=0.006"
    assert "kl/value up to 0.316 nats/token from the reference on steps 1-5 (> 0.2)" in finding.evidence
    # as far from the reference while the reward rises: a run that learns fast, no finding of this kind
    assert "step_too_big" not in codes(record(config(trainer={"lr": 0.03}),
                                              **{**drift, "reward__mean": LEARNING["reward__mean"]}))
    # the healthy runs' largest (0.135 on step 5, REINFORCE++ on arithmetic) with a flat reward: none
    assert codes(record(**{**drift, "kl__value": lambda s: min(0.135, 0.03 * s)})) == []
    # a clip fraction of 0.22 on the first steps (a 4x rate that learns) needs a flat reward: only the
    # whole-run check's note (clipfrac above 0.1 on every step, the reward rising)
    clipped = {**rising, "policy__approx_kl": lambda s: 0.004, "policy__clipfrac": lambda s: 0.22}
    assert [(f.title, f.level) for f in detectors.diagnose(record(**clipped)) if f.code == "step_too_big"] == [
        ("update step too big (clip fraction / approx-KL high)", "note")]


def test_a_kl_coefficient_that_pins_the_policy() -> None:
    pinned = {**FLAT, "kl__grad_share": lambda s: 0.44, "kl__value": lambda s: 0.002}
    (finding,) = detectors.diagnose(record(config(kl={"coef": 10.0}), **pinned))
    # odds 0.44 / 0.56 = 0.786 down to 0.02 / 0.98 = 0.0204: 10 x 0.0204 / 0.786 = 0.260
    assert finding.code == "kl_pins_policy" and finding.fixes[0][0] == "kl.coef=0.3"
    assert "kl/grad_share median 0.44" in finding.evidence


def test_a_kl_share_is_not_the_cause_under_a_growing_adaptive_beta_or_beside_a_critic_that_tracks_nothing() -> None:
    # round 4 (post hoc): GRPO with a tight adaptive target, its beta grown 1e20x, and PPO with trainer.critic_lr
    # 2e-7 (its critic 97 % below the mean return) were named kl_pins_policy, with kl.coef as the fix
    pinned = {**FLAT, "kl__grad_share": lambda s: 0.9, "kl__value": lambda s: 0.16}
    adaptive = config(kl={"coef": 0.04, "apply": "reward", "controller": {"name": "adaptive", "target": 1.0,
                                                                           "horizon": 100}})
    assert flat_start.kl_pins_policy(record(adaptive, **pinned)) is not None              # beta never moved
    grown = flat_start.kl_pins_policy(record(adaptive, **pinned, kl__coef=lambda s: 0.04 * 1.1 ** s))
    assert grown is None
    critic = config(kl={"coef": 0.2, "apply": "reward"})
    blind = {**pinned, "value__vpred_mean": lambda s: 0.002, "value__returns_mean": lambda s: 0.07}
    assert flat_start.kl_pins_policy(record(critic, **blind)) is None
    assert [f.code for f in detectors.diagnose(record(critic, **blind, value__loss=lambda s: 0.008,
                                                      value__explained_var=lambda s: 0.0))][0] == "critic_lagging"
    tracking = {**blind, "value__vpred_mean": lambda s: 0.0699}
    assert flat_start.kl_pins_policy(record(critic, **tracking)).code == "kl_pins_policy"


def test_a_budget_below_every_answer() -> None:
    run = record(config(rollout={"max_new_tokens": 1}), **LEARNING)
    run.scalars[Tag.ANSWER_TOKENS_MIN] = [(0, 4.0)]
    run.scalars[Tag.ANSWER_TOKENS_MAX] = [(0, 4.0)]
    (finding,) = detectors.diagnose(run)       # no flat reward needed: no answer can be whole
    assert finding.code == "truncation" and finding.fixes[0][0] == "rollout.max_new_tokens=4"
    assert "every reference answer of the task takes 4 tokens" in finding.evidence
    # the ceiling check names the answers' length too, not twice the budget
    capped = {**LEARNING, "response_length__truncated_frac": lambda s: 1.0, "reward__max": lambda s: 0.75}
    run = record(config(rollout={"max_new_tokens": 3}), **capped)
    run.scalars[Tag.ANSWER_TOKENS_MIN] = [(0, 2.0)]
    run.scalars[Tag.ANSWER_TOKENS_MAX] = [(0, 4.0)]
    (finding,) = detectors.response_length(run)
    assert finding.fixes[0][0] == "rollout.max_new_tokens=4"


def test_kl_gradient_share_by_hand() -> None:
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    advantages = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
    policy = -(advantages * logp).sum() / 4               # d/dlogp: -A / 4: norm sqrt(1+1+4+4) / 4 = 0.7906
    kl = 0.5 * ((logp - (-1.0)) ** 2).sum()               # d/dlogp: logp + 1 = 0, -1, 0.5, -2: norm 2.2913
    assert kl_gradient_share(policy, kl, logp) == pytest.approx(2.2913 / (2.2913 + 0.7906), abs=1e-4)
    assert kl_gradient_share(policy, 0.0 * logp.sum(), logp) == 0.0
    assert logp.grad is None                              # nothing accumulates


def test_kl_advantage_share_by_hand() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    task = torch.tensor([[0.5, 0.5, 0.0], [-1.0, 0.0, 0.0]])
    # the KL's part of the advantages: -0.3, 0.1 on the first row, 0.4 on the second; padding ignored
    with_kl = task + torch.tensor([[-0.3, 0.1, 99.0], [0.4, 0.0, 0.0]])
    kl_norm, task_norm = math.sqrt(0.09 + 0.01 + 0.16), math.sqrt(0.25 + 0.25 + 1.0)   # 0.5099, 1.2247
    assert kl_advantage_share(with_kl, task, mask) == pytest.approx(kl_norm / (kl_norm + task_norm), abs=1e-6)
    assert kl_advantage_share(task, task, mask) == 0.0                              # no KL part
    assert kl_advantage_share(with_kl, torch.zeros_like(task), mask) == pytest.approx(1.0)
    assert kl_advantage_share(torch.zeros(2, 3), torch.zeros(2, 3), mask) == 0.0    # neither pulls


def test_a_kl_in_the_reward_logs_its_share_of_the_advantages(tmp_path: Path) -> None:
    # RLOO folds the KL into the reward: no KL term in the loss, so the share is read from the advantages
    from rlzoo.contract.loading import build_registry, make_plugin_manager
    from rlzoo.plan.run_input import load_run
    from rlzoo.run.trainer import Trainer

    pm = make_plugin_manager()
    registry = build_registry(pm)
    shares = {}
    for coef in (0.05, 10.0, 0.0):
        trainer = Trainer(load_run(registry, ["algo=rloo", f"kl.coef={coef}", f"run_dir={tmp_path / str(coef)}",
                                              "logging.progress=false", "seed=3"]), pm)
        with torch.no_grad():     # move the policy off the reference, so that the KL is not 0
            for parameter in trainer.models.policy.parameters():
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(1)))
        batch = trainer.sampler.sample(16)
        batch.scores = batch.rewards = torch.rand(len(batch), generator=torch.Generator().manual_seed(7))
        shares[coef] = trainer.learn(batch).get(Tag.KL_GRAD_SHARE)
        trainer.close()
    assert shares[0.0] is None                                   # no KL, nothing to share
    assert 0.0 < shares[0.05] < 0.2 < 0.5 < shares[10.0] < 1.0    # a coefficient 200x as large takes the pull


def test_answer_token_lengths_and_the_budget_warning() -> None:
    from rlzoo.models.build import build_char_tokenizer
    from rlzoo.tasks.task import Holdout
    from rlzoo_plugins.tasks import SortDigits, SortDigitsParams

    task = SortDigits(SortDigitsParams(num_digits=4))
    tokenizer = build_char_tokenizer(task.alphabet)
    lengths = answer_token_lengths(task, tokenizer, Holdout(0.1))
    assert set(lengths) == {4} and len(lengths) == 16 + 256
    assert check_budget(lengths, 4, "sort_digits") == []
    (warning,) = check_budget(lengths, 3, "sort_digits")
    assert warning == ("rollout.max_new_tokens=3 cannot hold any reference answer of task 'sort_digits' (they take 4 "
                       "tokens): no completion can be correct; rollout.max_new_tokens=4 holds every one")
    assert "they take 1 to 3 tokens" in check_budget([1, 3, 2], 0, "t")[0] and check_budget([], 0, "t") == []


def test_the_start_warning_when_every_completion_scores_alike() -> None:
    watch = Watch(config(), every=50)
    lines = [watch.check_start(s, {Tag.REWARD: 1.0, Tag.REWARD_STD: 0.0}) for s in range(1, 8)]
    assert lines[:4] == [None] * 4 and lines[5:] == [None, None]
    assert lines[4].startswith("rlzoo: warning: every scored completion of steps 1-5 scored 1 (reward/std 0): the "
                               "reward does not tell completions apart")
    watch = Watch(config(), every=50)
    assert all(watch.check_start(s, {Tag.REWARD: 0.2, Tag.REWARD_STD: 0.1 * (s == 3)}) is None for s in range(1, 8))


# ----------------------------------------------------------------------------- run directories

def write_run(run_dir: Path, curves: dict, cfg: dict | None = None, steps: int = 60) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(json.dumps(cfg or config()))
    writer = SummaryWriter(str(run_dir))
    for step in range(1, steps + 1):
        for tag, f in curves.items():
            writer.add_scalar(tag.replace("__", "/"), float(f(step)), step)
    writer.close()
    return run_dir


def test_event_files_that_cannot_be_read_whole(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", {"reward__mean": lambda s: 0.1})
    (events,) = run.glob("events.out.tfevents.*")
    assert event_file_problem(events) is None
    data = events.read_bytes()
    events.write_bytes(data[:-7])
    assert event_file_problem(events).startswith("is truncated: ")
    events.write_bytes(b"")
    assert event_file_problem(events) == "is empty (0 bytes)"
    events.write_bytes(os.urandom(4096))
    assert event_file_problem(events).startswith("is not a TensorBoard event file")


def test_doctor_names_unreadable_logs_and_paths_without_a_run(tmp_path: Path, capsys) -> None:
    good = write_run(tmp_path / "good", FLAT)
    assert main(["doctor", str(good)]) == 0
    bad = write_run(tmp_path / "bad", FLAT)
    (events,) = bad.glob("events.out.tfevents.*")
    events.write_bytes(os.urandom(2048))
    (tmp_path / "notes").mkdir()
    capsys.readouterr()
    assert main(["doctor", str(good), str(bad), str(tmp_path / "notes")]) == 2
    out = capsys.readouterr().out
    assert f"{good}: 60 steps logged; 0 findings" in out
    assert f"{bad}: {events.name} is not a TensorBoard event file" in out and "nothing to diagnose" in out
    assert f"{tmp_path / 'notes'}: is not a run directory" in out
    truncated = write_run(tmp_path / "cut", FLAT)
    (events,) = truncated.glob("events.out.tfevents.*")
    events.write_bytes(events.read_bytes()[:-5])
    assert main(["doctor", str(truncated)]) == 0
    assert "  logs: events.out.tfevents" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["!!python/object/apply:os.system ['echo pwned']\n", "a: [1, 2\n", "- a list\n"])
def test_a_damaged_or_python_tagged_config_is_one_line_for_doctor_and_compare(tmp_path: Path, capsys,
                                                                           text: str) -> None:
    run = write_run(tmp_path / "run", FLAT)
    (run / "config.yaml").write_text(text)
    for command in (["doctor", str(run)], ["compare", str(run), "--out", str(tmp_path / "out")]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"rlzoo: error: {run}: run config ")


def test_findings_printed_during_the_run_are_accounted_for(tmp_path: Path, capsys) -> None:
    run = write_run(tmp_path / "run", FLAT)
    writer = SummaryWriter(str(run))
    for step, value in ((10, 0.2), (20, 0.8), (40, 0.5), (60, 0.9)):    # fell by step 40, then recovered
        writer.add_scalar(Tag.EVAL_ACCURACY, value, step)
    writer.close()
    (run / "doctor.jsonl").write_text(json.dumps({"step": 40, "code": "heldout_fall", "line": "...",
                                                  "title": "held-out accuracy fell"}) + "\n{broken\n")
    assert main(["doctor", str(run)]) == 0
    out = capsys.readouterr().out
    assert "; 0 findings" in out
    assert ("printed during the run at step 40, no longer holds on all 60 steps: held-out accuracy fell while the "
            "training reward held: eval/greedy_accuracy peaked at 0.800 (step 20) and ends at 0.500 (step 40)") in out


def test_the_summary_line_names_the_heldout_accuracy_and_the_findings(tmp_path: Path) -> None:
    same = {**FLAT, "reward__mean": lambda s: 1.0, "reward__std": lambda s: 0.0, "reward__zero_std_frac": lambda s: 1,
            "timing__step_s": lambda s: 0.5}
    run = write_run(tmp_path / "run", {**same, "eval__greedy_accuracy": lambda s: 1.0},
                    config(reward="format"), steps=40)
    line = summary_line(run)
    assert ("rlzoo: 40 steps in 20 s of training; reward/mean 1.000 (first 10%) -> 1.000 (last 10%); held-out greedy "
            "accuracy 1.000 (step 40) - no achievement: every completion scored the same from the first step") in line
    assert f"doctor: 1 finding (rlzoo doctor {run}); logs:" in line
    healthy = write_run(tmp_path / "healthy", {**LEARNING, "timing__step_s": lambda s: 0.5}, steps=40)
    writer = SummaryWriter(str(healthy))
    for step, value in ((0, 0.1), (40, 0.5)):
        writer.add_scalar(Tag.EVAL_ACCURACY, value, step)
    writer.close()
    assert "held-out greedy accuracy 0.500 (step 40), from 0.100 at step 0; doctor: 0 findings; logs:" in \
        summary_line(healthy)


# ----------------------------------------------------------------------------- pre-flight and model paths

def test_a_run_that_cannot_fit_is_refused_before_its_directory_exists(tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "run"
    assert main(["train", "rollout.max_new_tokens=100000000", "trainer.threads=1", f"run_dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert "this run's estimated peak memory" in err and "is the largest response budget that fits" in err
    assert not run_dir.exists()


def test_largest_budget_is_the_edge_of_what_fits(registry) -> None:
    from rlzoo.diagnostics.preflight import Sizing, device_parts, largest_budget
    from rlzoo.diagnostics.roofline import ModelShapes
    from rlzoo.plan.planner import load_config

    resolved = load_config(registry, ["rollout.max_new_tokens=100000"])
    size = Sizing(ModelShapes(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=256, vocab=15), None, None,
                  5.0, 6, 100.0, "cpu")
    capacity = 50 * 2**20
    budget = largest_budget(resolved, size, capacity)
    peak = lambda n: sum(p.bytes for p in device_parts(resolved, size, n))  # noqa: E731
    assert 1 < budget < 100000 and peak(budget) <= capacity < peak(budget + 1)
    assert largest_budget(resolved, size, 10.0) is None


@pytest.mark.parametrize("kind", ["missing", "gguf", "run"])
def test_bad_model_paths_give_the_train_line_in_plan(tmp_path: Path, capsys, kind: str) -> None:
    from rlzoo.diagnostics.preflight import load_model_config
    from rlzoo.models.build import load_pretrained

    path = {"missing": tmp_path / "nothing", "gguf": tmp_path / "random.gguf", "run": tmp_path / "run"}[kind]
    if kind == "gguf":
        path.write_bytes(os.urandom(4096))
    if kind == "run":
        (path / "checkpoints" / "step_000010" / "policy").mkdir(parents=True)
        (path / "checkpoints" / "step_000010" / "policy" / "config.json").write_text("{}")
        (path / "config.yaml").write_text("seed: 0\n")
    with pytest.raises(Exception) as loaded:
        load_pretrained(path)
    with pytest.raises(Exception) as configured:
        load_model_config(path)
    assert str(loaded.value) == str(configured.value)
    if kind == "run":
        assert "a run directory: its policy is a model directory, e.g." in str(configured.value)
    assert main(["doctor", "--plan", f"model.path={path}", "trainer.threads=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"rlzoo: error: {configured.value}"]


def test_plan_of_an_absurd_shape_is_not_timed(registry) -> None:
    from rlzoo.diagnostics.preflight import estimate
    from rlzoo.plan.planner import load_config

    found = estimate(load_config(registry, ["model.hidden_size=1000000000", "trainer.threads=1"]))
    assert not found.fits and found.seconds == {}
    lines = found.lines()
    assert "DOES NOT FIT" in lines[0] and any(line.startswith("  step time: not estimated") for line in lines)
    assert any("no response budget fits" in line for line in lines)
    assert not any(math.isnan(part.bytes) for part in found.parts)


def test_the_stand_in_is_timed_at_bounded_shapes(registry) -> None:
    from rlzoo.diagnostics.steptime import TimedShapes
    from rlzoo.plan.planner import load_config

    plan = load_config(registry, []).plan                  # 16 prompts x 8: 128 sequences, 7 new tokens
    assert TimedShapes.of(plan, 6, 32) == TimedShapes(16, 8, 32, 7, 1.0, 1.0)
    plan = load_config(registry, ["rollout.n=1000", "rollout.max_new_tokens=100000"]).plan
    timed = TimedShapes.of(plan, 6, 32)
    # 512 of 16 x 1000 sequences; one micro-batch row of 6 + 8192 tokens for 32 rows of 6 + 100,000
    assert (timed.groups, timed.n, timed.micro, timed.new) == (1, 512, 1, 8192)
    assert timed.decode_scale == pytest.approx(16000 / 512)
    assert timed.train_scale == pytest.approx(32 * 100006 / 8198)


def test_a_layer_timed_below_the_timer_is_half_the_one_layer_time_not_zero(registry, monkeypatch) -> None:
    from rlzoo.diagnostics import steptime
    from rlzoo.diagnostics.roofline import ModelShapes
    from rlzoo.plan.planner import load_config

    times = iter([[1.0, 0.2, 3.0, 4.0, 0.5], [1.5, 0.1, 3.0, 5.0, 0.5]])   # one layer, two layers
    monkeypatch.setattr(steptime, "_time_layers", lambda *args: next(times))
    monkeypatch.setattr(steptime, "stand_in", lambda *args: None)
    shapes = ModelShapes(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=256, vocab=15)
    costs = steptime.measure(None, shapes, "qwen2", load_config(registry, []).plan, "float32", 6, 32, 1)
    assert (costs.prefill_call, costs.prefill_layer) == (0.5, 0.5)          # 1.5 - 1.0 a layer
    assert (costs.decode_call, costs.decode_layer) == (0.1, 0.1)            # 0.1 < 0.2: half of 0.2 each
    assert (costs.forward_call, costs.forward_layer) == (1.5, 1.5)          # equal: half of 3.0
    assert (costs.train_call, costs.train_layer) == (3.0, 1.0)
    assert costs.scaled == ""
