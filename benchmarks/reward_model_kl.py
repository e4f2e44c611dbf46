"""Proxy and gold reward against the KL from the initial policy, for runs trained on a
learned reward model with the true reward listed at weight 0 (docs/reward-models.md).

    python benchmarks/reward_model_kl.py OUT.png RUN_DIR [RUN_DIR ...]

Each run is one line per panel: ``reward/proxy`` (left) and ``reward/gold`` (right) against
``kl/value``, all three as 10-step moving averages; prints each run's gold peak.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from rlzoo.core.events import read_scalars  # noqa: E402

WINDOW = 10


def smooth(values: list[float]) -> np.ndarray:
    return np.convolve(values, np.ones(WINDOW) / WINDOW, mode="valid")


def main(out: str, runs: list[str]) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for run in runs:
        curves = read_scalars(Path(run))
        kl = smooth([v for _, v in curves["kl/value"]])
        proxy, gold = (smooth([v for _, v in curves[tag]]) for tag in ("reward/proxy", "reward/gold"))
        label = Path(run).name
        left.plot(kl, proxy, label=label)
        right.plot(kl, gold, label=label)
        peak = int(np.argmax(gold))
        print(f"{label}: gold peak {gold[peak]:.3f} at KL {kl[peak]:.3f} (steps {peak + 1}-{peak + WINDOW}); "
              f"last: proxy {proxy[-1]:.3f}, gold {gold[-1]:.3f}, KL {kl[-1]:.3f}")
    titles = ("proxy: reward/proxy (learned reward model)", "gold: reward/gold (true reward)")
    for axis, title in zip((left, right), titles):
        axis.set_xlabel(f"kl/value (nats per token, {WINDOW}-step mean)")
        axis.set_title(title)
        axis.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
