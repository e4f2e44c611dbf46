"""Golden learning curves of every built-in preset on the embedded default task.

    python benchmarks/golden.py                      # every preset: full curve + replay band
    python benchmarks/golden.py --presets grpo ppo   # some of them
    python benchmarks/golden.py --replay-only        # keep the full curves, redo the bands
    python benchmarks/golden.py --grid-only          # redraw the PNG from the stored JSON

For each preset (``algo=NAME`` on the default config, nothing else changed) it stores in
``benchmarks/golden/<preset>.json``:

- ``full``: the ``reward/mean`` curve of one seed over the default budget
  (``trainer.total_steps`` of configs/default.yaml), the mean ``policy/clipfrac`` and the
  wall time of the steps;
- ``replay``: the reward gain (rlzoo.commands.golden.gain) of a short replay for ``--seeds``
  seeds and the band derived from them (rlzoo.commands.golden.band), which tests/test_golden.py
  checks a one-seed replay against. The replay is as long as the preset needs to gain
  ``MIN_GAIN`` on its full curve (a preset that learns slowly early, like PPO with its
  β = 0.2 KL, gets a longer one), so a formula that stops learning leaves the band;

and draws all full curves into ``benchmarks/golden/curves.png``. Runs alternate nothing and
take a few minutes per preset on a 2-core CPU; run it alone.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent / "golden"


def main() -> None:
    import torch
    from omegaconf import OmegaConf

    from rlzoo.commands import golden
    from rlzoo.config.layers import default_config_path
    from rlzoo.contract.loading import build_registry, make_plugin_manager

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="*", help="default: every built-in preset")
    parser.add_argument("--replay-steps", type=int, help="default: per preset, the first step by which its full "
                        "curve gained MIN_GAIN (rounded up to 20, within [100, 400])")
    parser.add_argument("--window", type=int, default=20, help="steps averaged at each end of a replay")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    parser.add_argument("--full-seed", type=int, default=0)
    parser.add_argument("--grid-only", action="store_true")
    parser.add_argument("--replay-only", action="store_true", help="keep the stored full curves, redo the replays")
    args = parser.parse_args()
    pm = make_plugin_manager()
    registry = build_registry(pm)
    names = args.presets or [c.name for c in registry.components("algorithm") if c.package == "rlzoo"]
    ROOT.mkdir(exist_ok=True)
    if not args.grid_only:
        budget = int(OmegaConf.load(default_config_path()).trainer.total_steps)
        for name in names:
            overrides = [f"algo={name}"]
            path = ROOT / f"{name}.json"
            with tempfile.TemporaryDirectory() as tmp:
                if args.replay_only:
                    full_record = json.loads(path.read_text())["full"]
                else:
                    full = golden.run_curve(registry, pm, overrides, budget, args.full_seed, Path(tmp) / "full")
                    full_record = {"steps": budget, "seed": args.full_seed, "seconds": round(full.seconds, 1),
                                   "rewards": [round(r, 5) for r in full.rewards],
                                   "clipfrac_mean": float(np.mean(full.clipfrac)),
                                   "reward_first_10pct": float(np.mean(full.rewards[: budget // 10])),
                                   "reward_last_10pct": float(np.mean(full.rewards[-(budget // 10):]))}
                print(f"{name}: full {budget} steps in {full_record['seconds']:.0f} s, reward "
                      f"{full_record['reward_first_10pct']:.3f} -> {full_record['reward_last_10pct']:.3f}",
                      file=sys.stderr, flush=True)
                steps = args.replay_steps or replay_steps(full_record["rewards"], args.window)
                gains = []
                for seed in args.seeds:
                    curve = golden.run_curve(registry, pm, overrides, steps, seed, Path(tmp) / f"r{seed}")
                    gains.append(golden.gain(curve.rewards, args.window))
                    print(f"  replay {steps} steps, seed {seed}: gain {gains[-1]:+.3f} in {curve.seconds:.0f} s",
                          file=sys.stderr, flush=True)
            low, high = golden.band(gains)
            record = {
                "preset": name, "overrides": overrides,
                "measured": {"date": date.today().isoformat(), "machine": platform.machine(),
                             "torch": torch.__version__},
                "full": full_record,
                "replay": {"steps": steps, "window": args.window, "seeds": args.seeds,
                           "gains": [round(g, 5) for g in gains], "band": [round(low, 5), round(high, 5)]},
            }
            path.write_text(json.dumps(record, indent=1) + "\n")
    draw_grid(sorted(ROOT.glob("*.json")), ROOT / "curves.png")


MIN_GAIN = 0.06
"""A replay must be long enough for the preset to gain this much reward (on its full curve),
so a broken formula (which stops the gain) falls outside the band."""


def replay_steps(rewards: list[float], window: int) -> int:
    """The first step by which the full curve's gain (rlzoo.commands.golden.gain over that prefix)
    reaches :data:`MIN_GAIN`, rounded up to 20, within [100, 400]."""
    from rlzoo.commands import golden
    for end in range(100, min(400, len(rewards)) + 1, 20):
        if golden.gain(rewards[:end], window) >= MIN_GAIN:
            return end
    return 400


def draw_grid(paths: list[Path], out: Path) -> None:
    """One panel per preset: the full-budget reward curve (raw and 25-step mean)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from plots import smooth

    records = [json.loads(p.read_text()) for p in paths]
    cols = 3
    rows = (len(records) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.8 * rows), dpi=100, sharex=True, sharey=True,
                             squeeze=False)
    for ax in axes.flat[len(records):]:
        ax.axis("off")
    for ax, record in zip(axes.flat, records):
        rewards = np.array(record["full"]["rewards"])
        steps = np.arange(1, len(rewards) + 1)
        ax.plot(steps, rewards, alpha=0.25, linewidth=0.8)
        ax.plot(steps, smooth(rewards, 25), linewidth=2)
        ax.set_title(f"{record['preset']}  ({record['full']['seconds']:.0f} s, clipfrac "
                     f"{record['full']['clipfrac_mean']:.3f})", fontsize=9)
        ax.grid(alpha=0.3)
        ax.set_ylim(0, 1)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    for ax in axes[:, 0]:
        ax.set_ylabel("reward/mean")
    fig.suptitle("Golden curves: every preset on the default task (4-digit sorting), seed 0", fontsize=11)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


if __name__ == "__main__":
    main()
