"""A test set for ``rlzoo doctor`` that its thresholds were not chosen on: sick runs made on
purpose, family by family, and healthy runs of every preset; split into a tuning half and a
held-out half by a seeded hash before any threshold was changed (the split is committed in
``benchmarks/doctor_recall_split.txt``, written by ``split`` below).

    python benchmarks/doctor_recall.py split > benchmarks/doctor_recall_split.txt   # the committed split
    python benchmarks/doctor_recall.py run runs/recall --jobs 2          # train every run (~30 min)
    python benchmarks/doctor_recall.py evaluate runs/recall --half tuning
    python benchmarks/doctor_recall.py evaluate runs/recall --half held-out --markdown

Every run is the embedded tiny model at ``trainer.threads=1`` (about 0.1 s a step on this
2-core CPU), a few hundred steps long, with a small held-out evaluation (32 prompts every 50
steps). A *family* breaks one knob at several magnitudes on several tasks, algorithms and
seeds; its runs are sick by construction. A sick run counts as *named* when ``rlzoo doctor``'s
first finding is one of the family's findings and that finding's first fix turns the broken knob
the right way (:data:`FAMILIES`). A healthy run (a preset's own settings) counts as a *false
alarm* when doctor reports any warning-level finding for it.

Seeds 1-3 only: the issue's five runs (seed 0, 100 steps) stay outside the set.

Round 2 (``--set round2``): the first set's 132 runs, both halves, became the tuning set of a
second round of thresholds; once those were frozen (committed), a fresh held-out set was listed
(``benchmarks/doctor_recall_round2.txt``, committed before any of its runs was trained): seeds
4-6, the same families at new magnitudes, tasks and algorithms, and ``lr_too_high`` redefined
(:data:`LR_TOO_HIGH_CRITERION`). It is evaluated once, whole:

    python benchmarks/doctor_recall.py split --set round2 > benchmarks/doctor_recall_round2.txt
    python benchmarks/doctor_recall.py run runs/round2 --set round2 --jobs 2   # 62 min, under load
    python benchmarks/doctor_recall.py evaluate runs/round2 --set round2 --markdown

Round 3 (``--set round3``): rounds 1 and 2, 230 runs, became the tuning set of a third round of
thresholds; once those were frozen (committed), a fresh held-out set was listed
(``benchmarks/doctor_recall_round3.txt``, committed before any of its runs was trained): seeds
7-9, every family at new magnitudes, tasks and algorithms, and 46 healthy runs. It is evaluated
once, whole:

    python benchmarks/doctor_recall.py split --set round3 > benchmarks/doctor_recall_round3.txt
    python benchmarks/doctor_recall.py run runs/round3 --set round3 --jobs 2
    python benchmarks/doctor_recall.py evaluate runs/round3 --set round3 --markdown

Round 4 (``--set round4``): rounds 1-3 and 18 new tuning runs of a KL folded into the reward (``--set
kl-in-reward``, seeds 1-3: that placement logs its share of the advantages as ``kl/grad_share`` since round
4), 356 runs, were the tuning set; once its thresholds were frozen (committed), a fresh held-out set was listed
(``benchmarks/doctor_recall_round4.txt``, committed before any of its runs was trained): seeds 10-12, every
family at new magnitudes, GSPO and ReMax among the algorithms, and 117 runs of the presets' own settings,
judged by outcome criteria written with them (:data:`HEALTHY_GAIN`, :data:`HEALTHY_KEPT`, :data:`FIX_GAIN`):

    python benchmarks/doctor_recall.py run runs/kl-in-reward --set kl-in-reward --jobs 2   # tuning, 18 runs
    python benchmarks/doctor_recall.py split --set round4 > benchmarks/doctor_recall_round4.txt
    python benchmarks/doctor_recall.py run runs/round4 --set round4 --jobs 2
    python benchmarks/doctor_recall.py fixes runs/round4 --set round4 --jobs 2     # the warned preset runs, fixed
    python benchmarks/doctor_recall.py evaluate runs/round4 --set round4 --markdown

Round 5 (``--set round5``): rounds 1-4 and the KL-in-the-reward runs (535) were its tuning set (three changes,
made after reading round 4's held-out result); seeds 13-15, judged as round 4:

    python benchmarks/doctor_recall.py split --set round5 > benchmarks/doctor_recall_round5.txt
    python benchmarks/doctor_recall.py run runs/round5 --set round5 --jobs 2
    python benchmarks/doctor_recall.py fixes runs/round5 --set round5 --jobs 2
    python benchmarks/doctor_recall.py evaluate runs/round5 --set round5 --markdown
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlzoo.commands.doctor import examine
from rlzoo.core.tags import Tag
from rlzoo.diagnostics.run_record import load_run

SPLIT_SEED = "rlzoo-doctor-recall-45"
"""The hash key of the split: fixed before any run was made or any threshold changed."""

COMMON = ("trainer.threads=1", "eval.size=32", "eval.every=50", "checkpoint.every=0", "logging.progress=false",
          "logging.sample_every=0")
"""Overrides of every run: one thread, a small evaluation, no intermediate checkpoints."""

TASKS: dict[str, tuple[str, ...]] = {
    "sort4": (),                                                           # the default: 4 digits, budget 7
    "sort3": ("task.num_digits=3", "rollout.max_new_tokens=5"),
    "arith": ("task=arithmetic", "reward=[exact_match, {name: length_match, weight: 0.1}]"),
    "sort5": ("task.num_digits=5", "rollout.max_new_tokens=8"),                # round 2 only
}
"""Tasks a run may use, as overrides: the default, a shorter sort, and two-operand arithmetic
with a partial-credit term (exact match alone never scores from a random policy)."""

ANSWER_TOKENS = {"sort4": 4, "sort3": 3, "sort5": 5, "sort6": 6}
"""Tokens of every reference answer of the sorting tasks (one character a token)."""


@dataclass(frozen=True)
class Run:
    """One run of the set: its name, family (``healthy`` for the healthy runs), magnitude and
    ``rlzoo train`` overrides (:data:`COMMON` and ``run_dir`` added when it runs)."""

    name: str
    family: str
    overrides: tuple[str, ...]

    def setting(self, key: str) -> str | None:
        """The value this run's overrides give ``key`` (the last one), or ``None``."""
        values = [item.split("=", 1)[1] for item in self.overrides if item.split("=", 1)[0] == key]
        return values[-1] if values else None


def _runs(family: str, grid: list[tuple[str, str, str, int, tuple[str, ...]]]) -> list[Run]:
    """Runs of ``family`` from ``(task, algo, magnitude label, seed, overrides)`` rows."""
    out = []
    for task, algo, label, seed, extra in grid:
        task_overrides = TASKS.get(task, ())
        name = f"{family}-{task}-{algo}-{label}-s{seed}"
        out.append(Run(name, family, (f"algo={algo}", *task_overrides, f"seed={seed}", *extra)))
    return out


def _steps(n: int) -> tuple[str, ...]:
    return (f"trainer.total_steps={n}",)


def _learning_rates(family: str, steps: int, rows: list[tuple[str, str, float, int]]) -> list[Run]:
    """Runs of ``family`` from ``(task, algo, trainer.lr, seed)`` rows, ``steps`` long."""
    return _runs(family, [(task, algo, f"lr{lr}", seed, (f"trainer.lr={lr}", *_steps(steps)))
                          for task, algo, lr, seed in rows])


def build() -> list[Run]:
    """Every run of the set, sick and healthy, in a fixed order."""
    runs: list[Run] = []
    # a reward that gives every completion one score: at the top (format: every completion has an answer)
    # or at 0 (exact match of an answer a random policy never writes)
    runs += _runs("constant_reward", [
        (task, algo, "format", seed, ("reward=format", *_steps(150)))
        for task, algo, seed in [("sort4", "grpo", 1), ("sort4", "rloo", 1), ("sort4", "dr_grpo", 2),
                                 ("arith", "grpo", 1), ("arith", "rloo", 2), ("arith", "dr_grpo", 1),
                                 ("sort3", "grpo", 2), ("sort3", "rloo", 1)]])
    runs += _runs("constant_reward", [
        ("sort6", algo, "exact", seed, ("task.num_digits=6", "rollout.max_new_tokens=9", "reward=exact_match",
                                        *_steps(150))) for algo, seed in [("grpo", 1), ("rloo", 2)]])
    runs += _runs("constant_reward", [
        ("arithbig", algo, "exact", seed, ("task=arithmetic", "task.max_operand=99999", *_steps(150)))
        for algo, seed in [("grpo", 2), ("rloo", 1)]])
    # a learning rate 100-200x the default: the first updates throw the policy far away
    runs += _learning_rates("lr_far_too_high", 150, [("sort4", "grpo", 0.05, 1), ("sort4", "rloo", 0.05, 2),
                                     ("sort4", "grpo", 0.1, 2), ("sort4", "rloo", 0.1, 1),
                                     ("arith", "grpo", 0.05, 2), ("arith", "rloo", 0.1, 1),
                                     ("arith", "grpo", 0.1, 1), ("sort3", "grpo", 0.05, 1),
                                     ("sort4", "dr_grpo", 0.05, 1), ("sort3", "dr_grpo", 0.1, 2)])
    # a KL coefficient that holds the policy at the reference
    runs += _runs("kl_coef_pins", [
        (task, algo, f"kl{coef}", seed, (f"kl.coef={coef}", *_steps(150)))
        for task, algo, coef, seed in [("sort4", "grpo", 3, 1), ("sort4", "grpo", 10, 2),
                                       ("sort4", "dr_grpo", 10, 1), ("sort4", "dr_grpo", 30, 2),
                                       ("arith", "grpo", 10, 1), ("arith", "dr_grpo", 3, 2),
                                       ("arith", "grpo", 30, 2), ("sort3", "grpo", 10, 1),
                                       ("sort4", "grpo", 30, 3)]])
    # sampling with no variety: a temperature or nucleus that makes every sample greedy
    runs += _runs("no_variety", [
        (task, algo, f"{key.split('.')[1]}{value}", seed, (f"{key}={value}", *_steps(150)))
        for task, algo, key, value, seed in [
            ("sort4", "grpo", "rollout.temperature", 0.05, 1), ("sort4", "rloo", "rollout.temperature", 0.02, 2),
            ("sort4", "grpo", "rollout.top_p", 0.05, 2), ("sort4", "rloo", "rollout.top_p", 0.02, 1),
            ("arith", "grpo", "rollout.temperature", 0.02, 1), ("arith", "rloo", "rollout.top_p", 0.05, 2),
            ("sort3", "grpo", "rollout.temperature", 0.05, 2), ("sort3", "dr_grpo", "rollout.top_p", 0.02, 1),
            ("arith", "dr_grpo", "rollout.temperature", 0.05, 1)]])
    # a response budget shorter than every reference answer
    runs += _runs("budget", [
        (task, algo, f"mnt{budget}", seed, (*extra, f"rollout.max_new_tokens={budget}", *_steps(150)))
        for task, extra, algo, budget, seed in [
            ("sort4", (), "grpo", 1, 1), ("sort4", (), "rloo", 2, 2), ("sort4", (), "grpo", 3, 2),
            ("sort4", (), "dr_grpo", 1, 2), ("sort4", (), "rloo", 3, 1),
            ("sort6", ("task.num_digits=6",), "grpo", 2, 1), ("sort6", ("task.num_digits=6",), "rloo", 4, 2),
            ("sort3", (), "grpo", 1, 2), ("sort3", (), "rloo", 2, 1), ("sort3", (), "dr_grpo", 2, 3)]])
    # a learning rate 4-6x the default: the policy turns deterministic before it solves the task
    runs += _learning_rates("lr_too_high", 300, [("sort4", "grpo", 0.002, 1), ("sort4", "grpo", 0.003, 2),
                                     ("sort4", "rloo", 0.002, 2), ("sort4", "rloo", 0.003, 1),
                                     ("sort4", "dr_grpo", 0.002, 1), ("sort4", "grpo", 0.002, 3),
                                     ("arith", "grpo", 0.003, 1), ("arith", "rloo", 0.002, 2)])
    # stale rollouts with no correction
    runs += _runs("stale_rollouts", [
        (task, algo, f"stale{k}", seed, (f"rollout.staleness={k}", *_steps(200)))
        for task, algo, k, seed in [("sort4", "grpo", 4, 1), ("sort4", "rloo", 8, 2), ("sort4", "grpo", 8, 2),
                                    ("arith", "grpo", 4, 2), ("arith", "rloo", 4, 1), ("sort3", "grpo", 8, 1),
                                    ("sort4", "dr_grpo", 4, 3), ("arith", "dr_grpo", 8, 1)]])
    # a critic that barely learns
    runs += _runs("critic_slow", [
        (task, "ppo", f"clr{lr}", seed, (f"trainer.critic_lr={lr}", *_steps(200)))
        for task, lr, seed in [("sort4", 1e-6, 1), ("sort4", 1e-7, 2), ("sort4", 1e-6, 2), ("arith", 1e-6, 1),
                               ("arith", 1e-7, 2), ("sort3", 1e-6, 1), ("sort3", 1e-7, 2), ("sort4", 1e-7, 3)]])
    # a warm-up longer than the run
    runs += _runs("warmup_too_long", [
        (task, algo, f"wu{factor}x", seed, (f"trainer.warmup_steps={150 * factor}", *_steps(150)))
        for task, algo, factor, seed in [("sort4", "grpo", 2, 1), ("sort4", "rloo", 5, 2), ("arith", "grpo", 5, 1),
                                         ("arith", "rloo", 2, 2), ("sort3", "grpo", 2, 2), ("sort3", "dr_grpo", 5, 1),
                                         ("sort4", "dr_grpo", 2, 3), ("arith", "dr_grpo", 2, 3)]])
    # an adaptive KL controller whose target is too tight
    runs += _runs("kl_target_tight", [
        (task, "grpo", f"target{target}", seed,
         ("kl.apply=reward", f"kl.controller={{name: adaptive, target: {target}, horizon: 100}}", *_steps(300)))
        for task, target, seed in [("sort4", 1.0, 1), ("sort4", 2.0, 2), ("sort4", 1.0, 2), ("sort4", 2.0, 3),
                                   ("arith", 2.0, 1), ("arith", 1.0, 2)]])
    # healthy: each preset's own settings on three tasks and several seeds
    presets = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "gspo", "cispo", "dapo", "ppo", "remax")
    runs += _runs("healthy", [(task, algo, "preset", seed, _steps(150))
                              for algo in presets for task in ("sort4", "arith") for seed in (1, 2)])
    runs += _runs("healthy", [("sort3", algo, "preset", 1, _steps(150))
                              for algo in ("grpo", "rloo", "dr_grpo", "reinforce_pp")])
    runs += _runs("healthy", [("sort4", algo, "long", 3, _steps(300))
                              for algo in ("grpo", "dr_grpo", "reinforce_pp", "ppo")])
    names = [run.name for run in runs]
    assert len(set(names)) == len(names), "run names must be unique"
    return runs


def build_round2() -> list[Run]:
    """The fresh held-out set of round 2 (seeds 4-6, listed after round 2's thresholds were frozen):
    every family again at other magnitudes, tasks and algorithms, 150 steps a run (the adaptive KL
    controller's 300), and healthy runs of every preset."""
    runs: list[Run] = []
    runs += _runs("constant_reward", [
        (task, algo, "format", seed, ("reward=format", *_steps(150)))
        for task, algo, seed in [("sort4", "reinforce_pp", 4), ("sort5", "grpo", 5), ("arith", "dr_grpo", 6),
                                 ("sort3", "dr_grpo", 4), ("arith", "reinforce_pp", 5)]])
    runs += _runs("constant_reward", [
        ("sort6", "dr_grpo", "exact", 6, ("task.num_digits=6", "rollout.max_new_tokens=9", "reward=exact_match",
                                          *_steps(150))),
        ("arithbig", "grpo", "exact", 4, ("task=arithmetic", "task.max_operand=99999", *_steps(150)))])
    runs += _learning_rates("lr_far_too_high", 150, [("sort5", "grpo", 0.07, 4), ("sort4", "reinforce_pp", 0.05, 5),
                                                     ("arith", "dr_grpo", 0.07, 6), ("sort3", "rloo", 0.05, 4),
                                                     ("arith", "grpo", 0.1, 5), ("sort4", "dr_grpo", 0.07, 6),
                                                     ("sort4", "grpo", 0.05, 4)])
    runs += _runs("kl_coef_pins", [
        (task, algo, f"kl{coef}", seed, (f"kl.coef={coef}", *_steps(150)))
        for task, algo, coef, seed in [("sort5", "grpo", 5, 4), ("sort4", "grpo", 20, 5), ("arith", "dr_grpo", 20, 6),
                                       ("sort3", "dr_grpo", 5, 5), ("sort4", "dr_grpo", 3, 4), ("arith", "grpo", 5, 4),
                                       ("sort3", "grpo", 30, 6)]])
    runs += _runs("no_variety", [
        (task, algo, f"{key.split('.')[1]}{value}", seed, (f"{key}={value}", *_steps(150)))
        for task, algo, key, value, seed in [
            ("sort5", "grpo", "rollout.temperature", 0.03, 4), ("sort4", "dr_grpo", "rollout.temperature", 0.03, 5),
            ("arith", "rloo", "rollout.temperature", 0.05, 6), ("sort3", "rloo", "rollout.top_p", 0.03, 4),
            ("sort4", "reinforce_pp", "rollout.top_p", 0.05, 5), ("arith", "grpo", "rollout.top_p", 0.03, 4),
            ("sort4", "grpo", "rollout.temperature", 0.02, 6)]])
    runs += _runs("budget", [
        (task, algo, f"mnt{budget}", seed, (*extra, f"rollout.max_new_tokens={budget}", *_steps(150)))
        for task, extra, algo, budget, seed in [
            ("sort5", ("task.num_digits=5",), "grpo", 3, 4), ("sort5", ("task.num_digits=5",), "rloo", 4, 5),
            ("sort4", (), "reinforce_pp", 2, 6), ("sort4", (), "dr_grpo", 3, 4),
            ("sort6", ("task.num_digits=6",), "dr_grpo", 5, 5), ("sort3", (), "grpo", 2, 6),
            ("sort6", ("task.num_digits=6",), "grpo", 3, 4)]])
    runs += _runs("stale_rollouts", [
        (task, algo, f"stale{k}", seed, (f"rollout.staleness={k}", *_steps(150)))
        for task, algo, k, seed in [("sort4", "grpo", 6, 4), ("sort5", "grpo", 4, 5), ("sort3", "dr_grpo", 6, 6),
                                    ("sort4", "reinforce_pp", 4, 5), ("arith", "grpo", 8, 4), ("sort4", "rloo", 6, 6),
                                    ("sort3", "grpo", 4, 4)]])
    runs += _runs("critic_slow", [
        (task, "ppo", f"clr{lr}", seed, (f"trainer.critic_lr={lr}", *_steps(150)))
        for task, lr, seed in [("sort4", 3e-7, 4), ("sort5", 1e-6, 5), ("arith", 3e-7, 6), ("sort3", 3e-7, 4),
                               ("sort4", 1e-6, 6), ("sort5", 1e-7, 4), ("arith", 1e-6, 5)]])
    runs += _runs("warmup_too_long", [
        (task, algo, f"wu{factor}x", seed, (f"trainer.warmup_steps={150 * factor}", *_steps(150)))
        for task, algo, factor, seed in [("sort5", "grpo", 3, 4), ("sort4", "reinforce_pp", 3, 5),
                                         ("arith", "rloo", 4, 6), ("sort3", "rloo", 3, 5), ("sort4", "grpo", 4, 6),
                                         ("arith", "dr_grpo", 3, 4), ("sort4", "dr_grpo", 5, 5)]])
    runs += _runs("kl_target_tight", [
        (task, "grpo", f"target{target}", seed,
         ("kl.apply=reward", f"kl.controller={{name: adaptive, target: {target}, horizon: 100}}", *_steps(300)))
        for task, target, seed in [("sort4", 1.5, 4), ("sort5", 1.0, 5), ("sort3", 2.0, 6), ("arith", 1.5, 5),
                                   ("sort4", 1.0, 6), ("sort3", 1.0, 4)]])
    # a learning rate 40-60x the default, judged by LR_TOO_HIGH_CRITERION against the healthy run of the same
    # algorithm, task and seed (each row here has one below)
    runs += _learning_rates("lr_too_high", 150, [("sort4", "grpo", 0.02, 4), ("sort4", "grpo", 0.03, 4),
                                                 ("sort4", "dr_grpo", 0.02, 5), ("sort4", "rloo", 0.03, 6),
                                                 ("arith", "grpo", 0.03, 5), ("arith", "dr_grpo", 0.02, 4),
                                                 ("sort4", "reinforce_pp", 0.02, 5), ("sort3", "grpo", 0.03, 6)])
    presets = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "gspo", "cispo", "dapo", "ppo", "remax")
    healthy = [("sort4", "grpo", 4), ("sort4", "dr_grpo", 5), ("sort4", "rloo", 6), ("sort4", "reinforce_pp", 5),
               ("arith", "grpo", 5), ("arith", "dr_grpo", 4), ("sort3", "grpo", 6)]
    healthy += [(task, algo, seed) for algo, seed in zip(presets, (6, 4, 5, 6, 4, 5, 6, 4, 5))
                for task in ("sort4", "arith") if (task, algo, seed) not in healthy]
    healthy += [("sort5", "grpo", 6), ("sort5", "dapo", 5), ("sort5", "cispo", 4), ("sort3", "reinforce_pp", 4)]
    runs += _runs("healthy", [(task, algo, "preset", seed, _steps(150)) for task, algo, seed in healthy])
    names = [run.name for run in runs]
    assert len(set(names)) == len(names), "run names must be unique"
    return runs


def build_round3() -> list[Run]:
    """The fresh held-out set of round 3 (seeds 7-9, listed after round 3's thresholds were frozen;
    rounds 1 and 2, 230 runs, were its tuning set): every family again at other magnitudes, tasks
    and algorithms (sort6 in six families, REINFORCE++ in seven), 150 steps a run (the adaptive KL
    controller's 300), and more healthy runs than round 2 (46: 9 presets on 3-4 tasks), so that one
    false alarm is 2 %, not 4 %."""
    six = ("task.num_digits=6", "rollout.max_new_tokens=9")
    runs: list[Run] = []
    runs += _runs("constant_reward", [
        (task, algo, "format", seed, ("reward=format", *_steps(150)))
        for task, algo, seed in [("sort5", "rloo", 7), ("sort3", "reinforce_pp", 8), ("arith", "grpo", 9),
                                 ("sort4", "dr_grpo", 8)]])
    runs += _runs("constant_reward", [
        ("sort6", "reinforce_pp", "exact", 7, (*six, "reward=exact_match", *_steps(150))),
        ("arithbig", "dr_grpo", "exact", 9, ("task=arithmetic", "task.max_operand=99999", *_steps(150)))])
    runs += _learning_rates("lr_far_too_high", 150, [("sort5", "rloo", 0.07, 7), ("sort3", "reinforce_pp", 0.1, 8),
                                                     ("arith", "rloo", 0.05, 9), ("sort4", "grpo", 0.08, 8),
                                                     ("sort5", "dr_grpo", 0.05, 9), ("sort4", "reinforce_pp", 0.08, 7)])
    runs += _runs("kl_coef_pins", [
        (task, algo, f"kl{coef}", seed, (*extra, f"kl.coef={coef}", *_steps(150)))
        for task, extra, algo, coef, seed in [
            ("sort5", (), "dr_grpo", 8, 7), ("sort4", (), "grpo", 4, 8), ("arith", (), "grpo", 15, 9),
            ("sort3", (), "dr_grpo", 50, 8), ("sort6", six, "grpo", 8, 9), ("sort4", (), "dr_grpo", 15, 7)]])
    runs += _runs("no_variety", [
        (task, algo, f"{key.split('.')[1]}{value}", seed, (f"{key}={value}", *_steps(150)))
        for task, algo, key, value, seed in [
            ("sort5", "rloo", "rollout.top_p", 0.04, 7), ("sort4", "reinforce_pp", "rollout.temperature", 0.04, 8),
            ("arith", "dr_grpo", "rollout.top_p", 0.04, 9), ("sort3", "grpo", "rollout.top_p", 0.02, 7),
            ("sort3", "reinforce_pp", "rollout.top_p", 0.03, 9), ("sort4", "grpo", "rollout.temperature", 0.04, 9)]])
    runs += _runs("budget", [
        (task, algo, f"mnt{budget}", seed, (*extra, f"rollout.max_new_tokens={budget}", *_steps(150)))
        for task, extra, algo, budget, seed in [
            ("sort5", ("task.num_digits=5",), "dr_grpo", 2, 7), ("sort5", ("task.num_digits=5",), "reinforce_pp", 4, 8),
            ("sort6", ("task.num_digits=6",), "rloo", 3, 9), ("sort4", (), "grpo", 2, 7),
            ("sort3", (), "reinforce_pp", 1, 8), ("sort6", ("task.num_digits=6",), "dr_grpo", 4, 8)]])
    runs += _runs("stale_rollouts", [
        (task, algo, f"stale{k}", seed, (*extra, f"rollout.staleness={k}", *_steps(150)))
        for task, extra, algo, k, seed in [
            ("sort4", (), "grpo", 5, 7), ("sort5", (), "rloo", 7, 8), ("arith", (), "dr_grpo", 5, 9),
            ("sort3", (), "reinforce_pp", 7, 7), ("sort4", (), "dr_grpo", 3, 8), ("sort6", six, "grpo", 5, 9)]])
    runs += _runs("critic_slow", [
        (task, "ppo", f"clr{lr}", seed, (*extra, f"trainer.critic_lr={lr}", *_steps(150)))
        for task, extra, lr, seed in [("sort6", six, 1e-6, 7), ("sort5", (), 3e-7, 8), ("arith", (), 1e-7, 9),
                                      ("sort3", (), 1e-6, 8), ("sort4", (), 5e-7, 9), ("sort5", (), 5e-7, 7)]])
    runs += _runs("warmup_too_long", [
        (task, algo, f"wu{factor}x", seed, (*extra, f"trainer.warmup_steps={int(150 * factor)}", *_steps(150)))
        for task, extra, algo, factor, seed in [
            ("sort5", (), "rloo", 4, 7), ("sort3", (), "reinforce_pp", 6, 8), ("arith", (), "grpo", 4, 9),
            ("sort6", six, "dr_grpo", 2.5, 7), ("sort4", (), "rloo", 6, 8), ("sort5", (), "dr_grpo", 2.5, 9)]])
    runs += _runs("kl_target_tight", [
        (task, "grpo", f"target{target}", seed,
         (*extra, "kl.apply=reward", f"kl.controller={{name: adaptive, target: {target}, horizon: 100}}",
          *_steps(300)))
        for task, extra, target, seed in [("sort5", (), 1.2, 7), ("sort4", (), 0.8, 8), ("arith", (), 1.2, 9),
                                          ("sort6", six, 1.8, 7), ("sort3", (), 1.5, 9), ("arith", (), 0.8, 7)]])
    # judged by LR_TOO_HIGH_CRITERION against the healthy run of the same algorithm, task and seed (below)
    runs += _learning_rates("lr_too_high", 150, [("sort4", "rloo", 0.025, 7), ("sort5", "grpo", 0.03, 8),
                                                 ("sort4", "reinforce_pp", 0.03, 9), ("arith", "rloo", 0.025, 8),
                                                 ("sort3", "dr_grpo", 0.03, 7), ("sort5", "reinforce_pp", 0.02, 9),
                                                 ("sort4", "grpo", 0.025, 9), ("sort3", "rloo", 0.03, 8)])
    presets = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "gspo", "cispo", "dapo", "ppo", "remax")
    healthy = [(task, algo, seed) for algo in presets for task, seed in (("sort4", 7), ("arith", 8), ("sort5", 9))]
    healthy += [("sort3", algo, 8) for algo in presets]
    healthy += [("arith", algo, 9) for algo in ("grpo", "gspo", "cispo", "dapo", "ppo", "remax")]
    twins = [("sort5", "grpo", 8), ("sort4", "reinforce_pp", 9), ("sort3", "dr_grpo", 7), ("sort4", "grpo", 9)]
    healthy += [twin for twin in twins if twin not in healthy]
    runs += _runs("healthy", [(task, algo, "preset", seed, _steps(150)) for task, algo, seed in healthy])
    names = [run.name for run in runs]
    assert len(set(names)) == len(names), "run names must be unique"
    return runs


def build_round4() -> list[Run]:
    """The fresh held-out set of round 4 (seeds 10-12, listed after round 4's thresholds were frozen; rounds
    1-3 and :func:`build_kl_in_reward`, 356 runs, were its tuning set): every family again at other
    magnitudes, tasks and algorithms (GSPO and ReMax among them; a KL in the reward in ``kl_coef_pins``), and
    117 runs of the presets' own settings (9 presets on sort3-5 and arithmetic, 3 seeds, and on sort6), judged
    by :data:`HEALTHY_GAIN`, :data:`HEALTHY_KEPT` and :data:`FIX_GAIN`, written before any of them was trained."""
    six = ("task.num_digits=6", "rollout.max_new_tokens=9")
    runs: list[Run] = []
    runs += _runs("constant_reward", [
        (task, algo, "format", seed, (*extra, "reward=format", *_steps(150)))
        for task, extra, algo, seed in [("sort4", (), "gspo", 10), ("sort6", six, "grpo", 11),
                                        ("arith", (), "rloo", 12), ("sort3", (), "remax", 10)]])
    runs += _runs("constant_reward", [
        ("sort6", "dr_grpo", "exact", 12, (*six, "reward=exact_match", *_steps(150))),
        ("arithbig", "rloo", "exact", 11, ("task=arithmetic", "task.max_operand=99999", *_steps(150)))])
    runs += _learning_rates("lr_far_too_high", 150, [
        ("sort4", "gspo", 0.06, 10), ("sort5", "grpo", 0.09, 11), ("arith", "reinforce_pp", 0.06, 12),
        ("sort3", "dr_grpo", 0.09, 12), ("sort4", "remax", 0.12, 11), ("sort5", "rloo", 0.12, 10)])
    runs += _runs("kl_coef_pins", [
        (task, algo, f"kl{coef}", seed, (*extra, f"kl.coef={coef}", *_steps(150)))
        for task, extra, algo, coef, seed in [
            ("sort4", (), "grpo", 6, 10), ("sort5", (), "dr_grpo", 12, 11), ("sort3", (), "grpo", 100, 12),
            ("sort6", six, "dr_grpo", 25, 10), ("sort4", (), "rloo", 6, 11), ("arith", (), "reinforce_pp", 12, 12)]])
    runs += _runs("no_variety", [
        (task, algo, f"{key.split('.')[1]}{value}", seed, (*extra, f"{key}={value}", *_steps(150)))
        for task, extra, algo, key, value, seed in [
            ("sort4", (), "rloo", "rollout.temperature", 0.01, 10),
            ("sort5", (), "dr_grpo", "rollout.top_p", 0.035, 11),
            ("sort6", six, "grpo", "rollout.temperature", 0.035, 12),
            ("arith", (), "reinforce_pp", "rollout.top_p", 0.01, 10),
            ("sort3", (), "gspo", "rollout.temperature", 0.03, 11),
            ("sort4", (), "remax", "rollout.top_p", 0.03, 12)]])
    runs += _runs("budget", [
        (task, algo, f"mnt{budget}", seed, (*extra, f"rollout.max_new_tokens={budget}", *_steps(150)))
        for task, extra, algo, budget, seed in [
            ("sort6", ("task.num_digits=6",), "grpo", 5, 10), ("sort5", ("task.num_digits=5",), "rloo", 1, 11),
            ("sort4", (), "gspo", 3, 12), ("sort3", (), "remax", 2, 10),
            ("sort6", ("task.num_digits=6",), "reinforce_pp", 2, 11),
            ("sort5", ("task.num_digits=5",), "dr_grpo", 3, 12)]])
    runs += _runs("stale_rollouts", [
        (task, algo, f"stale{k}", seed, (*extra, f"rollout.staleness={k}", *_steps(150)))
        for task, extra, algo, k, seed in [
            ("sort4", (), "rloo", 2, 10), ("sort5", (), "reinforce_pp", 6, 11), ("arith", (), "grpo", 9, 12),
            ("sort3", (), "dr_grpo", 2, 11), ("sort6", six, "rloo", 6, 10), ("sort4", (), "gspo", 4, 12)]])
    runs += _runs("critic_slow", [
        (task, "ppo", f"clr{lr}", seed, (*extra, f"trainer.critic_lr={lr}", *_steps(150)))
        for task, extra, lr, seed in [("sort4", (), 2e-7, 10), ("sort3", (), 7e-7, 11), ("sort6", six, 2e-7, 12),
                                      ("arith", (), 7e-7, 10), ("sort5", (), 1e-6, 12), ("sort4", (), 7e-7, 11)]])
    runs += _runs("warmup_too_long", [
        (task, algo, f"wu{factor}x", seed, (*extra, f"trainer.warmup_steps={int(150 * factor)}", *_steps(150)))
        for task, extra, algo, factor, seed in [
            ("sort4", (), "gspo", 3.5, 10), ("sort5", (), "grpo", 1.5, 11), ("arith", (), "reinforce_pp", 8, 12),
            ("sort3", (), "remax", 3.5, 11), ("sort6", six, "rloo", 1.5, 10), ("sort4", (), "dr_grpo", 8, 12)]])
    runs += _runs("kl_target_tight", [
        (task, algo, f"target{target}", seed,
         (*extra, "kl.apply=reward", f"kl.controller={{name: adaptive, target: {target}, horizon: 100}}",
          *_steps(300)))
        for task, extra, algo, target, seed in [
            ("sort4", (), "grpo", 0.6, 10), ("sort5", (), "grpo", 1.4, 11), ("sort6", (*six, "kl.coef=0.04"), "dr_grpo",
                                                                          1.0, 12),
            ("arith", (), "grpo", 2.2, 10), ("sort3", ("kl.coef=0.04",), "dr_grpo", 0.6, 12),
            ("sort4", (), "grpo", 2.2, 11)]])   # dr_grpo has no KL of its own: GRPO's starting beta
    # judged by LR_TOO_HIGH_CRITERION against the healthy run of the same algorithm, task and seed (below)
    runs += _learning_rates("lr_too_high", 150, [("sort4", "grpo", 0.028, 10), ("sort5", "rloo", 0.022, 11),
                                                 ("sort3", "reinforce_pp", 0.028, 12), ("sort4", "dr_grpo", 0.022, 11),
                                                 ("arith", "grpo", 0.022, 10), ("sort5", "dr_grpo", 0.028, 10),
                                                 ("sort3", "grpo", 0.022, 11), ("sort4", "rloo", 0.028, 12)])
    presets = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "gspo", "cispo", "dapo", "ppo", "remax")
    healthy = [(task, algo, seed) for algo in presets for task in ("sort3", "sort4", "sort5", "arith")
               for seed in (10, 11, 12)]
    runs += _runs("healthy", [(task, algo, "preset", seed, _steps(150)) for task, algo, seed in healthy])
    runs += _runs("healthy", [("sort6", algo, "preset", 10, (*six, *_steps(150))) for algo in presets])
    names = [run.name for run in runs]
    assert len(set(names)) == len(names), "run names must be unique"
    return runs


HEALTHY_GAIN, HEALTHY_KEPT, FIX_GAIN = 0.1, 0.8, 1.5
"""Round 4's outcome criteria, written with its runs before any of them was trained (rounds 1-3 called every run
of a preset's own settings healthy). A preset run is *healthy* when its reward/mean over its last 10 % of logged
steps is at least ``HEALTHY_GAIN`` of the success score (``eval.threshold``) above that over its first 10 % (it
learnt a tenth of the way) and at least ``HEALTHY_KEPT`` of the highest mean of any 10 % window (it kept what it
learnt); a warning on a healthy run is a false alarm. A preset run that is not healthy and gets a warning is
re-trained with that finding's first fix (``fixes``); the warning is *confirmed* when the fixed run's reward/mean
over its last 10 % is at least ``FIX_GAIN`` times the original's, *wrong* otherwise."""


def build_kl_in_reward() -> list[Run]:
    """Tuning runs added to round 4's tuning set (seeds 1-3, like round 1's): a KL folded into the reward
    (RLOO, REINFORCE++, PPO, ReMax) logs its share of the advantages as ``kl/grad_share`` since round 4, and
    no run of rounds 1-3 had it: the presets' own coefficients, and ``kl.coef`` 3-30 that pin the policy."""
    healthy = [("sort4", "rloo", 1), ("sort4", "reinforce_pp", 2), ("sort4", "ppo", 3), ("sort4", "remax", 1),
               ("arith", "rloo", 2), ("arith", "reinforce_pp", 1), ("arith", "ppo", 2), ("arith", "remax", 3),
               ("sort3", "rloo", 3), ("sort5", "reinforce_pp", 3)]
    runs = _runs("healthy", [(task, algo, "preset", seed, _steps(150)) for task, algo, seed in healthy])
    runs += _runs("kl_coef_pins", [
        (task, algo, f"kl{coef}", seed, (f"kl.coef={coef}", *_steps(150)))
        for task, algo, coef, seed in [("sort4", "rloo", 3, 1), ("sort4", "reinforce_pp", 10, 2),
                                       ("sort4", "ppo", 3, 3), ("sort4", "remax", 30, 1), ("arith", "rloo", 10, 2),
                                       ("arith", "reinforce_pp", 30, 3), ("arith", "ppo", 10, 1),
                                       ("sort3", "remax", 3, 2)]])
    return runs


def build_round5() -> list[Run]:
    """The fresh held-out set of round 5 (seeds 13-15, listed after round 5's thresholds were frozen; rounds 1-4
    and :func:`build_kl_in_reward`, 535 runs, were its tuning set): every family again at other magnitudes, tasks
    and algorithms (CISPO among them), and 63 runs of the presets' own settings (9 presets on sort3-5, 2 seeds,
    and on arithmetic), judged by round 4's outcome criteria (:data:`HEALTHY_GAIN`, :data:`HEALTHY_KEPT`,
    :data:`FIX_GAIN`)."""
    six = ("task.num_digits=6", "rollout.max_new_tokens=9")
    runs: list[Run] = []
    runs += _runs("constant_reward", [
        (task, algo, "format", seed, ("reward=format", *_steps(150)))
        for task, algo, seed in [("sort4", "cispo", 13), ("sort3", "grpo", 14), ("sort5", "reinforce_pp", 15),
                                 ("arith", "gspo", 13)]])
    runs += _runs("constant_reward", [
        ("sort6", "rloo", "exact", 14, (*six, "reward=exact_match", *_steps(150))),
        ("arithbig", "grpo", "exact", 15, ("task=arithmetic", "task.max_operand=99999", *_steps(150)))])
    runs += _runs("lr_far_too_high", [
        (task, algo, f"lr{lr}", seed, (*extra, f"trainer.lr={lr}", *_steps(150)))
        for task, extra, algo, lr, seed in [
            ("sort4", (), "cispo", 0.04, 13), ("sort5", (), "dr_grpo", 0.15, 14), ("arith", (), "grpo", 0.07, 15),
            ("sort3", (), "rloo", 0.04, 15), ("sort6", six, "reinforce_pp", 0.07, 13),
            ("sort4", (), "gspo", 0.15, 14)]])
    runs += _runs("kl_coef_pins", [
        (task, algo, f"kl{coef}", seed, (*extra, f"kl.coef={coef}", *_steps(150)))
        for task, extra, algo, coef, seed in [
            ("sort4", (), "grpo", 2, 13), ("sort3", (), "dr_grpo", 40, 14), ("sort5", (), "grpo", 9, 15),
            ("sort6", six, "reinforce_pp", 20, 13), ("arith", (), "dr_grpo", 7, 14), ("sort4", (), "remax", 5, 15)]])
    runs += _runs("no_variety", [
        (task, algo, f"{key.split('.')[1]}{value}", seed, (*extra, f"{key}={value}", *_steps(150)))
        for task, extra, algo, key, value, seed in [
            ("sort4", (), "dr_grpo", "rollout.temperature", 0.025, 13),
            ("sort5", (), "grpo", "rollout.top_p", 0.025, 14),
            ("sort3", (), "rloo", "rollout.temperature", 0.045, 15),
            ("sort6", six, "gspo", "rollout.top_p", 0.045, 13),
            ("arith", (), "grpo", "rollout.temperature", 0.015, 14),
            ("sort4", (), "reinforce_pp", "rollout.top_p", 0.015, 15)]])
    runs += _runs("budget", [
        (task, algo, f"mnt{budget}", seed, (*extra, f"rollout.max_new_tokens={budget}", *_steps(150)))
        for task, extra, algo, budget, seed in [
            ("sort5", (), "grpo", 4, 13), ("sort6", ("task.num_digits=6",), "dr_grpo", 1, 14),
            ("sort3", (), "gspo", 1, 15), ("sort4", (), "rloo", 1, 13), ("sort5", (), "remax", 2, 14),
            ("sort6", ("task.num_digits=6",), "cispo", 3, 15)]])
    runs += _runs("stale_rollouts", [
        (task, algo, f"stale{k}", seed, (*extra, f"rollout.staleness={k}", *_steps(150)))
        for task, extra, algo, k, seed in [
            ("sort4", (), "grpo", 3, 13), ("sort5", (), "dr_grpo", 5, 14), ("sort3", (), "reinforce_pp", 8, 15),
            ("sort6", six, "grpo", 8, 13), ("arith", (), "dr_grpo", 3, 14), ("sort4", (), "reinforce_pp", 5, 15)]])
    runs += _runs("critic_slow", [
        (task, "ppo", f"clr{lr}", seed, (*extra, f"trainer.critic_lr={lr}", *_steps(150)))
        for task, extra, lr, seed in [("sort4", (), 4e-7, 13), ("sort5", (), 3e-7, 14), ("sort3", (), 1.5e-7, 15),
                                      ("sort6", six, 4e-7, 14), ("arith", (), 1.5e-7, 13), ("sort4", (), 8e-7, 15)]])
    runs += _runs("warmup_too_long", [
        (task, algo, f"wu{factor}x", seed, (*extra, f"trainer.warmup_steps={int(150 * factor)}", *_steps(150)))
        for task, extra, algo, factor, seed in [
            ("sort4", (), "grpo", 4.5, 13), ("sort5", (), "dr_grpo", 2, 14), ("sort3", (), "reinforce_pp", 7, 15),
            ("sort6", six, "gspo", 4.5, 13), ("arith", (), "rloo", 2, 14), ("sort4", (), "cispo", 7, 15)]])
    runs += _runs("kl_target_tight", [
        (task, algo, f"target{target}", seed,
         (*extra, "kl.apply=reward", f"kl.controller={{name: adaptive, target: {target}, horizon: 100}}",
          *_steps(300)))
        for task, extra, algo, target, seed in [
            ("sort4", (), "grpo", 1.1, 13), ("sort5", (), "grpo", 0.7, 14), ("sort3", (), "grpo", 1.6, 15),
            ("sort6", six, "grpo", 2.5, 13), ("arith", (), "grpo", 0.7, 15),
            ("sort4", ("kl.coef=0.04",), "dr_grpo", 1.6, 14)]])   # dr_grpo has no KL of its own: GRPO's beta
    # judged by LR_TOO_HIGH_CRITERION against the healthy run of the same algorithm, task and seed (below)
    runs += _learning_rates("lr_too_high", 150, [("sort4", "grpo", 0.024, 13), ("sort5", "dr_grpo", 0.032, 14),
                                                 ("sort3", "reinforce_pp", 0.024, 13), ("sort4", "gspo", 0.032, 14),
                                                 ("sort5", "grpo", 0.018, 13), ("sort3", "dr_grpo", 0.018, 14),
                                                 ("sort4", "reinforce_pp", 0.032, 13), ("arith", "grpo", 0.024, 15)])
    presets = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "gspo", "cispo", "dapo", "ppo", "remax")
    healthy = [(task, algo, seed) for algo in presets for task in ("sort3", "sort4", "sort5") for seed in (13, 14)]
    healthy += [("arith", algo, 15) for algo in presets]
    runs += _runs("healthy", [(task, algo, "preset", seed, _steps(150)) for task, algo, seed in healthy])
    names = [run.name for run in runs]
    assert len(set(names)) == len(names), "run names must be unique"
    return runs



OUTCOME_ROUNDS = ("round4", "round5")
"""The rounds whose preset runs are judged by the outcome criteria (:data:`HEALTHY_GAIN`, ...)."""


ROUNDS: dict[str, Callable[[], list[Run]]] = {"round1": build, "round2": build_round2, "round3": build_round3,
                                              "kl-in-reward": build_kl_in_reward, "round4": build_round4,
                                              "round5": build_round5}
"""Each round's set: round 1 split into halves; rounds 2-5 fresh held-out sets, evaluated whole;
``kl-in-reward`` tuning runs of round 4."""


LR_TOO_HIGH_CRITERION = 0.5
"""Round 2's ``lr_too_high`` run is sick when its reward/mean over its last 10 % of steps is below
this share of the healthy run's of the same algorithm, task and seed (the learning rate cost at
least half of what the preset's own rate learns); a run that is not is left out of the recall and
counted apart. Written, with the runs, before any of them was trained."""


def _number(fix: str) -> float | None:
    """The number a ``key=value`` fix sets, or ``None``."""
    try:
        return float(fix.split("=", 1)[1])
    except (IndexError, ValueError):
        return None


def _lower(key: str) -> Callable[[Run, str], bool]:
    """A fix that sets ``key`` below the run's value."""
    return lambda run, fix: (fix.startswith(f"{key}=") and _number(fix) is not None
                             and _number(fix) < float(run.setting(key) or 0))


def _budget_fix(run: Run, fix: str) -> bool:
    task = next((t for t in ANSWER_TOKENS if f"-{t}-" in run.name), None)
    value = _number(fix) if fix.startswith("rollout.max_new_tokens=") else None
    return value is not None and task is not None and value >= ANSWER_TOKENS[task]


def _sampling_fix(run: Run, fix: str) -> bool:
    key = "rollout.temperature" if run.setting("rollout.temperature") else "rollout.top_p"
    value = _number(fix) if fix.startswith(f"{key}=") else None
    return value is not None and value >= 0.5


@dataclass(frozen=True)
class Family:
    """What names a family's runs right: the findings that name its cause (the first finding
    must be one of them) and whether that finding's first fix turns the broken knob the right way."""

    codes: tuple[str, ...]
    fix: Callable[[Run, str], bool]
    broken: str


FAMILIES: dict[str, Family] = {
    "constant_reward": Family(("constant_reward",), lambda run, fix: fix.startswith("reward="),
                              "a reward that scores every completion alike (`reward=format`; exact match of "
                              "answers a random policy never writes)"),
    "lr_far_too_high": Family(("step_too_big",), _lower("trainer.lr"), "`trainer.lr` 0.05-0.1 (100-200x)"),
    "kl_coef_pins": Family(("kl_pins_policy",), _lower("kl.coef"), "`kl.coef` 3-30"),
    "no_variety": Family(("no_variety",), _sampling_fix, "`rollout.temperature` 0.02-0.05 or `rollout.top_p` "
                                                         "0.02-0.05"),
    "budget": Family(("truncation",), _budget_fix, "`rollout.max_new_tokens` below the answers' length"),
    "lr_too_high": Family(("entropy_collapse", "step_too_big"), _lower("trainer.lr"),
                          "`trainer.lr` 0.002-0.003 (4-6x), 300 steps"),
    "stale_rollouts": Family(("rollout_mismatch",),
                             lambda run, fix: fix.startswith("rollout_correction=") or fix == "rollout.staleness=0",
                             "`rollout.staleness` 4-8, no correction"),
    "critic_slow": Family(("critic_lagging",),
                          lambda run, fix: fix.startswith("trainer.critic_lr=") and
                          (_number(fix) or 0) > float(run.setting("trainer.critic_lr") or 0),
                          "PPO's `trainer.critic_lr` 1e-6-1e-7"),
    "warmup_too_long": Family(("warmup_unfinished",), _lower("trainer.warmup_steps"),
                              "`trainer.warmup_steps` 2-5x the run"),
    "kl_target_tight": Family(("kl_pinned",),
                              lambda run, fix: fix == "kl.controller=fixed" or (
                                  fix.startswith("kl.controller.target=") and (_number(fix) or 0) > float(
                                      re.search(r"target: ([\d.]+)", " ".join(run.overrides)).group(1))),
                              "an adaptive KL controller's target 1-2 nats a sequence, horizon 100"),
}
"""Every sick family: the findings that name its cause, the check of the first fix, and what
it breaks."""


ROUND2_BROKEN = {
    "constant_reward": "`reward=format` on 4 tasks; exact match of answers a random policy never writes",
    "lr_far_too_high": "`trainer.lr` 0.05-0.1, with reinforce_pp and on sort5 too",
    "kl_coef_pins": "`kl.coef` 3-30 (5 and 20 new)",
    "no_variety": "`rollout.temperature` or `rollout.top_p` 0.02-0.05 (0.03 new)",
    "budget": "`rollout.max_new_tokens` below the answers' length (sort5, sort6 at 3-5)",
    "lr_too_high": f"`trainer.lr` 0.02-0.03 (40-60x), sick when its final reward is below "
                   f"{LR_TOO_HIGH_CRITERION:g}x its healthy twin's",
    "stale_rollouts": "`rollout.staleness` 4-8 (6 new), no correction",
    "critic_slow": "PPO's `trainer.critic_lr` 1e-7-1e-6 (3e-7 new), 150 steps",
    "warmup_too_long": "`trainer.warmup_steps` 3-5x the run",
    "kl_target_tight": "an adaptive KL controller's target 1-2 nats a sequence (1.5 new), horizon 100",
}
"""What round 2 breaks in each family."""

ROUND3_BROKEN = {
    "constant_reward": "`reward=format` on 4 tasks; exact match of answers a random policy never writes (sort6, "
                       "5-digit sums)",
    "lr_far_too_high": "`trainer.lr` 0.05-0.1 (0.08 new), RLOO, REINFORCE++ and dr_grpo on sort5 and sort3 too",
    "kl_coef_pins": "`kl.coef` 4-50 (4, 8, 15, 50 new), on sort6 too",
    "no_variety": "`rollout.temperature` or `rollout.top_p` 0.02-0.04 (0.04 new), REINFORCE++'s groups of one too",
    "budget": "`rollout.max_new_tokens` below the answers' length (sort3-6 at 1-4)",
    "lr_too_high": f"`trainer.lr` 0.02-0.03 (0.025 new), sick when its final reward is below "
                   f"{LR_TOO_HIGH_CRITERION:g}x its healthy twin's",
    "stale_rollouts": "`rollout.staleness` 3-7 (3, 5, 7 new), no correction",
    "critic_slow": "PPO's `trainer.critic_lr` 1e-7-1e-6 (5e-7 new), on sort6 too",
    "warmup_too_long": "`trainer.warmup_steps` 2.5-6x the run (2.5 and 6 new)",
    "kl_target_tight": "an adaptive KL controller's target 0.8-1.8 nats a sequence (0.8, 1.2, 1.8 new), horizon 100",
}
"""What round 3 breaks in each family."""

ROUND4_BROKEN = {
    "constant_reward": "`reward=format` on 4 tasks (GSPO, ReMax); exact match of answers a random policy never "
                       "writes (sort6, 5-digit sums)",
    "lr_far_too_high": "`trainer.lr` 0.06-0.12 (0.06, 0.09, 0.12 new), GSPO and ReMax too",
    "kl_coef_pins": "`kl.coef` 6-100 (6, 12, 25, 100 new); a KL in the reward (RLOO, REINFORCE++) new",
    "no_variety": "`rollout.temperature` or `rollout.top_p` 0.01-0.035 (0.01, 0.035 new), GSPO and ReMax too",
    "budget": "`rollout.max_new_tokens` below the answers' length (sort3-6 at 1-5), GSPO and ReMax too",
    "lr_too_high": f"`trainer.lr` 0.022 and 0.028 (new), sick when its final reward is below "
                   f"{LR_TOO_HIGH_CRITERION:g}x its healthy twin's",
    "stale_rollouts": "`rollout.staleness` 2-9 (2, 9 new), no correction, GSPO too",
    "critic_slow": "PPO's `trainer.critic_lr` 2e-7-1e-6 (2e-7, 7e-7 new)",
    "warmup_too_long": "`trainer.warmup_steps` 1.5-8x the run (1.5, 3.5, 8 new)",
    "kl_target_tight": "an adaptive KL controller's target 0.6-2.2 nats a sequence (0.6, 1.4, 2.2 new), dr_grpo "
                       "too, horizon 100",
}
"""What round 4 breaks in each family."""

ROUND5_BROKEN = {
    "constant_reward": "`reward=format` on 4 tasks (CISPO, GSPO); exact match of answers a random policy never writes",
    "lr_far_too_high": "`trainer.lr` 0.04-0.15 (0.04, 0.15 new), CISPO too",
    "kl_coef_pins": "`kl.coef` 2-40 (2, 7, 9, 20, 40 new); a KL in the reward (REINFORCE++, ReMax)",
    "no_variety": "`rollout.temperature` or `rollout.top_p` 0.015-0.045 (all new)",
    "budget": "`rollout.max_new_tokens` below the answers' length (sort3-6 at 1-4), CISPO too",
    "lr_too_high": f"`trainer.lr` 0.018-0.032 (0.018, 0.024, 0.032 new), sick when its final reward is below "
                   f"{LR_TOO_HIGH_CRITERION:g}x its healthy twin's",
    "stale_rollouts": "`rollout.staleness` 3-8, no correction (no RLOO: one update a step)",
    "critic_slow": "PPO's `trainer.critic_lr` 1.5e-7-8e-7 (1.5e-7, 4e-7, 8e-7 new)",
    "warmup_too_long": "`trainer.warmup_steps` 2-7x the run (4.5, 7 new), CISPO too",
    "kl_target_tight": "an adaptive KL controller's target 0.7-2.5 nats a sequence (0.7, 1.1, 1.6, 2.5 new), "
                       "horizon 100",
}
"""What round 5 breaks in each family."""


def _windows(run_dir: Path) -> tuple[list[float], float]:
    """reward/mean's means over windows of 10 % of a run's logged steps, one a step, and its success score."""
    record = load_run(run_dir)
    points = [v for s, v in record.scalars.get(Tag.REWARD, []) if s >= 1]
    width = max(1, len(points) // 10)
    return [sum(points[i:i + width]) / width for i in range(len(points) - width + 1)], record.success()


def outcome(run_dir: Path) -> tuple[bool, str]:
    """Round 4's outcome criterion (:data:`HEALTHY_GAIN`, :data:`HEALTHY_KEPT`) on one run: whether it holds,
    and the figures."""
    windows, success = _windows(run_dir)
    first, last, best = windows[0], windows[-1], max(windows)
    ok = last - first >= HEALTHY_GAIN * success and last >= HEALTHY_KEPT * best
    return ok, f"reward/mean {first:.3f} -> {last:.3f} (first 10 % to last), best window {best:.3f}"


def first_warning_fix(run_dir: Path) -> tuple[str, str] | None:
    """``(finding code, its first fix)`` of the run's first warning-level finding that has a fix, or ``None``."""
    (result,) = examine([run_dir])
    found = next((f for f in result.findings if f.level == "warning" and f.fixes), None)
    return (found.code, found.fixes[0][0]) if found else None


def _fix_candidates(out: Path, runs: list[Run]) -> list[tuple[Run, str, str]]:
    """The preset runs of round 4 that are not healthy by :func:`outcome` and get a warning with a fix."""
    found = []
    for run in runs:
        if run.family == "healthy" and '"completed"' in _status(out / run.name) and not outcome(out / run.name)[0]:
            warned = first_warning_fix(out / run.name)
            if warned:
                found.append((run, *warned))
    return found


def fixed_run(run: Run, fix: str) -> Run:
    """``run`` with ``fix`` (a ``key=value`` override) applied last."""
    return Run(f"{run.name}-fixed", run.family, (*run.overrides, fix))


def fix_report(out: Path, runs: list[Run]) -> list[str]:
    """One line per warned preset run that is not healthy: its warning, the fix, and whether it was confirmed."""
    lines = []
    for run, code, fix in _fix_candidates(out, runs):
        fixed = out / "fixed" / fixed_run(run, fix).name
        if '"completed"' not in _status(fixed):
            lines.append(f"{run.name}: {code}, fix {fix}: not trained")
            continue
        before, after = _windows(out / run.name)[0][-1], _windows(fixed)[0][-1]
        verdict = "confirmed" if after >= FIX_GAIN * before else "wrong"
        lines.append(f"{run.name}: {code}, fix {fix}: reward/mean over the last 10 % {before:.3f} -> {after:.3f} "
                     f"({verdict})")
    return lines


def half(run: Run, runs: list[Run]) -> str:
    """``tuning`` or ``held-out``: within the run's family, the runs ordered by a keyed hash of
    their names (:data:`SPLIT_SEED`) alternate between the halves, tuning first."""
    def key(r: Run) -> str:
        return hashlib.blake2b(f"{SPLIT_SEED}/{r.name}".encode(), digest_size=8).hexdigest()

    family = sorted((r for r in runs if r.family == run.family), key=key)
    return "tuning" if family.index(run) % 2 == 0 else "held-out"


def split_text(runs: list[Run], which: str = "round1") -> str:
    """The split as committed: one line per run, ``half family name overrides`` (round 2: every
    run ``held-out``)."""
    if which == "round1":
        lines = [f"# python benchmarks/doctor_recall.py split  (key {SPLIT_SEED!r}; {len(runs)} runs)"]
    else:
        lines = [f"# python benchmarks/doctor_recall.py split --set {which}  ({len(runs)} runs, all held-out; "
                 f"lr_too_high judged sick by LR_TOO_HIGH_CRITERION = {LR_TOO_HIGH_CRITERION:g})"]
    label = "tuning" if which == "kl-in-reward" else "held-out"
    lines += [f"{half(run, runs) if which == 'round1' else label:8s} {run.family:16s} {run.name} "
              f"{' '.join(run.overrides)}" for run in runs]
    return "\n".join(lines) + "\n"


def counterpart(run: Run, runs: list[Run]) -> Run | None:
    """The healthy run of ``run``'s algorithm, task and seed (and length), or ``None``."""
    key = (run.setting("algo"), run.name.split("-")[1], run.setting("seed"), run.setting("trainer.total_steps"))
    return next((r for r in runs if r.family == "healthy" and (r.setting("algo"), r.name.split("-")[1],
                                                               r.setting("seed"), r.setting("trainer.total_steps"))
                 == key), None)


def final_reward(run_dir: Path) -> float:
    """reward/mean over the last 10 % of a run's logged steps."""
    points = [v for s, v in load_run(run_dir).scalars.get(Tag.REWARD, []) if s >= 1]
    tail = points[-max(1, len(points) // 10):]
    return sum(tail) / len(tail)


def train(run: Run, out: Path) -> str:
    """Train ``run`` into ``out/<name>`` (skipped when it completed before); returns a line."""
    run_dir = out / run.name
    if '"completed"' in _status(run_dir):
        return f"{run.name}: done before"
    command = [sys.executable, "-m", "rlzoo", "train", *run.overrides, *COMMON, f"run_dir={run_dir}", "--overwrite"]
    with open(out / f"{run.name}.log", "w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    return f"{run.name}: exit {code}"


def _status(run_dir: Path) -> str:
    path = run_dir / "status.json"
    return path.read_text() if path.is_file() else ""


def evaluate(out: Path, which: str, markdown: bool, round_set: str = "round1") -> None:
    """Doctor on every run of the half ``which`` (``tuning``, ``held-out`` or ``all``; round 2:
    every run): recall per family and false alarms, then one line per run that missed. Round 2's
    ``lr_too_high`` runs that :data:`LR_TOO_HIGH_CRITERION` does not call sick are left out and listed."""
    runs = ROUNDS[round_set]()
    chosen = [run for run in runs if round_set != "round1" or which == "all" or half(run, runs) == which]
    done = [run for run in chosen if '"completed"' in _status(out / run.name)]
    if len(done) < len(chosen):
        print(f"({len(chosen) - len(done)} of the {len(chosen)} runs have not completed: left out)")
    rows: dict[str, list[int]] = {}
    misses, not_sick, not_healthy, apart = [], [], [], []
    for run in done:
        if round_set != "round1" and run.family == "lr_too_high":
            healthy = counterpart(run, runs)
            if healthy is None or '"completed"' not in _status(out / healthy.name):
                not_sick.append(f"{run.name}: its healthy run has not completed")
                continue
            mine, theirs = final_reward(out / run.name), final_reward(out / healthy.name)
            if mine >= LR_TOO_HIGH_CRITERION * theirs:
                not_sick.append(f"{run.name}: reward/mean {mine:.3f} over its last 10 %, the healthy run's "
                                f"{theirs:.3f}: not sick by the criterion")
                continue
        (result,) = examine([out / run.name])
        warnings = [f for f in result.findings if f.level == "warning"]
        first = result.findings[0] if result.findings else None
        if run.family == "healthy" and round_set in OUTCOME_ROUNDS and not outcome(out / run.name)[0]:
            apart.append(not warnings)
            not_healthy.append(f"{run.name}: {outcome(out / run.name)[1]}; "
                               f"{', '.join(f.code for f in warnings) or 'no warning'}")
            continue
        if run.family == "healthy":
            ok = not warnings
            shown = ", ".join(f.code for f in warnings)
        else:
            family = FAMILIES[run.family]
            ok = first is not None and first.code in family.codes and bool(first.fixes) and \
                family.fix(run, first.fixes[0][0])
            shown = f"{first.code}: {first.fixes[0][0] if first.fixes else 'no fix'}" if first else "no findings"
        rows.setdefault(run.family, []).append(ok)
        if not ok:
            misses.append(f"{run.name}: {shown}")
    sick = [ok for family, oks in rows.items() if family != "healthy" for ok in oks]
    healthy = rows.get("healthy", [])
    if markdown:
        shown = which if round_set == "round1" else round_set.replace("round", "round ")
        print(f"| family (what is broken) | runs ({shown}) | named with the right cause first |\n|---|---|---|")
        for name, family in FAMILIES.items():
            oks = rows.get(name, [])
            broken = {"round1": family.broken, "round2": ROUND2_BROKEN[name], "round3": ROUND3_BROKEN[name],
                      "round4": ROUND4_BROKEN[name], "round5": ROUND5_BROKEN[name]}.get(round_set, family.broken)
            print(f"| `{name}`: {broken} | {len(oks)} | {sum(oks)} ({sum(oks) / max(1, len(oks)):.0%}) |")
        print(f"| **all sick runs** | {len(sick)} | **{sum(sick)} ({sum(sick) / max(1, len(sick)):.0%})** |")
        alarms = len(healthy) - sum(healthy)
        judged = " (by the outcome criterion)" if round_set in OUTCOME_ROUNDS else ""
        print(f"| healthy runs{judged} with a warning-level finding | {len(healthy)} | **{alarms} "
              f"({alarms / max(1, len(healthy)):.0%})** false alarms |")
        if round_set in OUTCOME_ROUNDS:
            print(f"| the presets' runs the criterion does not call healthy, with a warning-level finding | "
                  f"{len(apart)} | {len(apart) - sum(apart)} |")
    else:
        for name, oks in rows.items():
            print(f"{name:16s} {sum(oks)}/{len(oks)}")
        print(f"recall {sum(sick)}/{len(sick)} = {sum(sick) / max(1, len(sick)):.1%}; false alarms "
              f"{len(healthy) - sum(healthy)}/{len(healthy)}" + (f"; not healthy by the outcome criterion "
                                                                 f"{len(apart)}, with a warning "
                                                                 f"{len(apart) - sum(apart)}" if apart else ""))
    for line in misses:
        print(f"missed: {line}" if markdown is False else f"<!-- missed: {line} -->")
    for line in not_sick:
        print(f"left out: {line}" if markdown is False else f"<!-- left out: {line} -->")
    for line in not_healthy:
        print(f"not healthy: {line}" if markdown is False else f"<!-- not healthy: {line} -->")
    if round_set in OUTCOME_ROUNDS:
        report = fix_report(out, runs)
        confirmed = sum(line.endswith("(confirmed)") for line in report)
        print(f"warnings on preset runs that are not healthy: {len(report)}; confirmed by their fix: {confirmed}")
        for line in report:
            print(f"fix check: {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    split = sub.add_parser("split", help="print the split (one line per run)")
    run = sub.add_parser("run", help="train the runs (skips completed ones)")
    run.add_argument("out", type=Path)
    run.add_argument("--jobs", type=int, default=2)
    run.add_argument("--only", help="a regular expression the run names must match")
    run.add_argument("--half", choices=("tuning", "held-out", "all"), default="all",
                     help="these runs only (all: the tuning half first)")
    fixes = sub.add_parser("fixes", help="round 4: re-train each warned preset run that is not healthy with its "
                                          "first fix (into OUT/fixed)")
    fixes.add_argument("out", type=Path)
    fixes.add_argument("--jobs", type=int, default=2)
    ev = sub.add_parser("evaluate", help="doctor's recall and false alarms on a half")
    ev.add_argument("out", type=Path)
    ev.add_argument("--half", choices=("tuning", "held-out", "all"), default="tuning")
    ev.add_argument("--markdown", action="store_true")
    for command in (split, run, ev, fixes):
        command.add_argument("--set", dest="round_set", choices=tuple(ROUNDS), default="round1",
                             help="round1: the first set (its halves); round2-round4: fresh held-out sets; "
                                  "kl-in-reward: round 4's added tuning runs")
    args = parser.parse_args()
    runs = ROUNDS[args.round_set]()
    if args.command == "split":
        sys.stdout.write(split_text(runs, args.round_set))
    elif args.command == "run":
        args.out.mkdir(parents=True, exist_ok=True)
        chosen = [r for r in runs if (not args.only or re.search(args.only, r.name))
                  and (args.round_set != "round1" or args.half in ("all", half(r, runs)))]
        if args.round_set == "round1":
            chosen.sort(key=lambda r: half(r, runs) != "tuning")
        with ThreadPoolExecutor(max_workers=max(1, min(args.jobs, 2))) as pool:
            for line in pool.map(lambda r: train(r, args.out), chosen):
                print(line, flush=True)
    elif args.command == "fixes":
        (args.out / "fixed").mkdir(parents=True, exist_ok=True)
        chosen = [fixed_run(run, fix) for run, _, fix in _fix_candidates(args.out, runs)]
        with ThreadPoolExecutor(max_workers=max(1, min(args.jobs, 2))) as pool:
            for line in pool.map(lambda r: train(r, args.out / "fixed"), chosen):
                print(line, flush=True)
    else:
        evaluate(args.out, args.half, args.markdown, args.round_set)


if __name__ == "__main__":
    main()
