"""Golden learning curves: a regression net for presets.

A preset's *reward gain* over a short replay (mean ``reward/mean`` of the last
``window`` steps minus that of the first ``window``) is measured for several seeds by
``benchmarks/golden.py`` and stored, with the full-budget curve, in
``benchmarks/golden/<preset>.json``. The band is the seeds' mean ± :data:`BAND_SIGMAS`
standard deviations. ``tests/test_golden.py`` replays every preset for one
seed and fails when the gain leaves its band: a broken estimator, loss or aggregation
(a flipped advantage sign, a wrong normaliser) shows up as a curve that no longer learns
as it did.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlzoo.plan.planner import load_config
from rlzoo.plan.run_input import engine_input
from rlzoo.contract.loading import PluginManager
from rlzoo.contract.registry import Registry
from rlzoo.run.trainer import Trainer

BAND_SIGMAS = 4.0
"""The band is the seeds' mean gain ± k·s, s = max(their sample standard deviation, MIN_STD).

With 8 seeds, a fresh seed (or any change that only reshuffles the random draws, such as a
new sampler drawing the same distribution) falls outside with probability ≈ 0.7 % per
preset (Student's t, 7 degrees of freedom, at 4/√(1 + 1/8)). The first bands (issue 13)
were the range of 4 seeds widened by half of it: at grpo's, seeds 4–7 of the same code
fell outside 3 times out of 4."""

MIN_STD = 0.01
"""A floor on the seeds' spread, so a band never collapses to a point."""

QUIET = ["logging.progress=false", "trainer.threads=2"]


@dataclass(frozen=True)
class Curve:
    """Per-step metrics of one run.

    :ivar rewards: ``reward/mean`` per step.
    :ivar clipfrac: ``policy/clipfrac`` per step.
    :ivar seconds: wall time of the steps (no start-up).
    """

    rewards: list[float]
    clipfrac: list[float]
    seconds: float


def run_curve(registry: Registry, pm: PluginManager, overrides: list[str], steps: int, seed: int,
              run_dir: Path) -> Curve:
    """Train ``steps`` steps in this process (no files but the run directory's) and return
    the curve. ``overrides`` select the preset (``algo=...``) and anything else."""
    resolved = load_config(registry, [*overrides, *QUIET, f"seed={seed}", f"trainer.total_steps={steps}",
                                      f"run_dir={run_dir}"])
    trainer = Trainer(engine_input(resolved), pm)
    rewards, clipfrac = [], []
    start = time.perf_counter()
    try:
        for _ in range(steps):
            metrics = trainer.train_step()
            rewards.append(metrics["reward/mean"])
            clipfrac.append(metrics.get("policy/clipfrac", 0.0))
    finally:
        trainer.close()
    return Curve(rewards=rewards, clipfrac=clipfrac, seconds=time.perf_counter() - start)


def gain(rewards: list[float], window: int) -> float:
    """Mean of the last ``window`` rewards minus the mean of the first ``window``."""
    return float(np.mean(rewards[-window:]) - np.mean(rewards[:window]))


def band(gains: list[float]) -> tuple[float, float]:
    """The accepted range of a replay's gain, from the seeds' gains (at least 2)."""
    if len(gains) < 2:
        raise ValueError(f"a band needs the gains of at least 2 seeds, got {len(gains)}")
    mean, std = float(np.mean(gains)), max(float(np.std(gains, ddof=1)), MIN_STD)
    return mean - BAND_SIGMAS * std, mean + BAND_SIGMAS * std


def load(path: Path) -> dict[str, Any]:
    """A stored golden record (see ``benchmarks/golden.py`` for its fields)."""
    return json.loads(Path(path).read_text())
