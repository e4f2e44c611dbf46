"""``rlzoo compare``: a table, a reward-curve PNG and a Markdown report over run groups.

Runs are found under the given directories (a run is a directory holding TensorBoard
event files and a ``config.yaml``). Runs whose configs differ only in ``seed`` (and the
run name and directory) form one group; a group's label lists the config keys that
differ between groups. Per group, over its seeds (mean ± std):

- final reward: mean of the last 10% of steps' ``reward/mean``;
- best reward: the maximum of the smoothed curve;
- steps to threshold: the first step where the smoothed curve reaches ``--threshold``
  (runs that never reach it are counted as not reached: "n/N" shows how many did);
- wall time: sum of ``timing/step_s``; tokens/s: mean of ``throughput/tokens_per_s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rlzoo.errors import RlzooError
from rlzoo.events import read_scalars
from rlzoo.plots import smooth

IGNORED_KEYS = {"seed", "run_name", "run_dir", "resume", "logging.progress"}


@dataclass
class RunSummary:
    run_dir: Path
    config: dict[str, Any]
    steps: np.ndarray
    rewards: np.ndarray
    final_reward: float
    best_reward: float
    steps_to_threshold: float | None
    wall_s: float
    tokens_per_s: float


@dataclass
class Group:
    label: str
    runs: list[RunSummary]


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run directories at or under ``paths`` (sorted, unique)."""
    found: set[Path] = set()
    for path in map(Path, paths):
        if not path.exists():
            raise RlzooError(f"{str(path)!r} does not exist")
        for config in [path / "config.yaml", *path.rglob("config.yaml")]:
            run = config.parent
            if config.is_file() and any(run.glob("events.out.tfevents.*")) \
                    and "checkpoints" not in run.parts:
                found.add(run)
    if not found:
        raise RlzooError(f"no runs (config.yaml + TensorBoard events) under {', '.join(map(str, paths))}")
    return sorted(found)


def summarise(run_dir: Path, threshold: float, window: int, tag: str = "reward/mean") -> RunSummary:
    curves = read_scalars(run_dir)
    if tag not in curves:
        raise RlzooError(f"run {str(run_dir)!r} has no scalar {tag!r}")
    steps = np.array([s for s, _ in curves[tag]], dtype=float)
    rewards = np.array([v for _, v in curves[tag]], dtype=float)
    smoothed = smooth(rewards, window)
    tail = max(1, len(rewards) // 10)
    reached = np.nonzero(smoothed >= threshold)[0]
    config = flatten_config_dict(yaml.safe_load((run_dir / "config.yaml").read_text()))
    return RunSummary(
        run_dir=run_dir, config=config, steps=steps, rewards=rewards,
        final_reward=float(rewards[-tail:].mean()), best_reward=float(smoothed.max()),
        steps_to_threshold=float(steps[reached[0]]) if len(reached) else None,
        wall_s=float(sum(v for _, v in curves.get("timing/step_s", []))),
        tokens_per_s=float(np.mean([v for _, v in curves.get("throughput/tokens_per_s", [(0, 0.0)])])),
    )


def flatten_config_dict(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A saved ``config.yaml`` as ``{"a.b": scalar}`` (lists and None as strings), exactly as
    saved: a ``${...}`` left in it (rlzoo 0.1 stored them) is shown as written, never
    resolved in the environment of whoever runs ``rlzoo compare``."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(flatten_config_dict(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return out


def group_runs(summaries: list[RunSummary]) -> list[Group]:
    """Group by config minus seed; label by the keys that differ between groups."""
    keyed: dict[tuple, list[RunSummary]] = {}
    for summary in summaries:
        key = tuple(sorted((k, str(v)) for k, v in summary.config.items() if k not in IGNORED_KEYS))
        keyed.setdefault(key, []).append(summary)
    keys = [dict(key) for key in keyed]
    all_names = sorted({name for key in keys for name in key})
    differing = [name for name in all_names if len({key.get(name) for key in keys}) > 1]
    if "algo" in differing:
        # keys a preset sets follow from `algo`; show only what varies beyond it
        def implied(name: str) -> bool:
            seen: dict[Any, Any] = {}
            return all(seen.setdefault(key.get("algo"), key.get(name)) == key.get(name) for key in keys)

        differing = ["algo"] + [name for name in differing if name != "algo" and not implied(name)]
    groups = []
    for key, members in zip(keys, keyed.values()):
        label = ", ".join(f"{name}={key.get(name)}" for name in differing) or members[0].run_dir.name
        groups.append(Group(label=label, runs=members))
    return sorted(groups, key=lambda g: g.label)


def _mean_std(values: list[float]) -> str:
    if not values:
        return "—"
    arr = np.array(values)
    return f"{arr.mean():.3f} ± {arr.std():.3f}" if len(arr) > 1 else f"{arr.mean():.3f}"


def table(groups: list[Group], threshold: float) -> str:
    """The comparison as a Markdown table."""
    header = ("| group | seeds | final reward | best reward | steps to "
              f"{threshold:g} | wall time (s) | tokens/s |")
    lines = [header, "|---|---|---|---|---|---|---|"]
    for group in groups:
        reached = [r.steps_to_threshold for r in group.runs if r.steps_to_threshold is not None]
        steps = f"{np.mean(reached):.0f} ({len(reached)}/{len(group.runs)})" if reached else \
            f"not reached (0/{len(group.runs)})"
        lines.append(
            f"| {group.label} | {len(group.runs)} | {_mean_std([r.final_reward for r in group.runs])} | "
            f"{_mean_std([r.best_reward for r in group.runs])} | {steps} | "
            f"{np.mean([r.wall_s for r in group.runs]):.0f} | "
            f"{np.mean([r.tokens_per_s for r in group.runs]):.0f} |"
        )
    return "\n".join(lines)


def plot(groups: list[Group], out: Path, window: int, title: str) -> Path:
    """Mean smoothed reward per group with a ±1 std band over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for group in groups:
        length = min(len(r.rewards) for r in group.runs)
        steps = group.runs[0].steps[:length]
        curves = np.stack([smooth(r.rewards[:length], window) for r in group.runs])
        mean, std = curves.mean(0), curves.std(0)
        line, = ax.plot(steps, mean, label=f"{group.label} (n={len(group.runs)})", linewidth=2)
        if len(group.runs) > 1:
            ax.fill_between(steps, mean - std, mean + std, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("step")
    ax.set_ylabel(f"reward/mean (moving average, {window} steps)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def compare(paths: list[str | Path], out_dir: str | Path | None = None, threshold: float = 0.5,
            window: int = 25) -> tuple[str, Path, Path]:
    """Summarise runs; write ``compare.png`` and ``compare.md`` into ``out_dir`` (default:
    the first path). Returns ``(table, png, report)``."""
    runs = find_runs(paths)
    groups = group_runs([summarise(run, threshold, window) for run in runs])
    out = Path(out_dir or paths[0])
    text = table(groups, threshold)
    title = f"reward/mean over {len(runs)} runs"
    png = plot(groups, out / "compare.png", window, title)
    report = out / "compare.md"
    run_list = "\n".join(f"- `{r}`" for r in runs)
    report.write_text(
        f"# Comparison\n\n{text}\n\n![reward curves](compare.png)\n\n"
        f"Final reward: mean of the last 10% of steps; best: max of the {window}-step moving "
        f"average; steps to {threshold:g}: first step the moving average reaches it (runs that "
        f"reached it / runs). Mean ± std over seeds.\n\nRuns:\n{run_list}\n"
    )
    return text, png, report
