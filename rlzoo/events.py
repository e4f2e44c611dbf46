"""Read scalar curves back from a run's TensorBoard event files."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """``tag -> [(step, value), ...]`` sorted by step, from all event files of ``run_dir``
    (not its subdirectories). Later files win for a repeated step (resumed runs)."""
    curves: dict[str, dict[int, float]] = {}
    for path in sorted(Path(run_dir).glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            for event in acc.Scalars(tag):
                curves.setdefault(tag, {})[event.step] = event.value
    return {tag: sorted(points.items()) for tag, points in curves.items()}
