"""Read a run's TensorBoard event files back: scalar curves and the recorded hparams."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


@dataclass
class RunEvents:
    """What a run logged.

    :ivar scalars: ``tag -> [(step, value), ...]`` sorted by step.
    :ivar hparams: the effective hyperparameters the run recorded for TensorBoard's
        HParams (``None`` for runs that recorded none).
    """

    scalars: dict[str, list[tuple[int, float]]]
    hparams: dict[str, Any] | None


def read_events(run_dir: str | Path) -> RunEvents:
    """Everything :class:`RunEvents` holds, from all event files of ``run_dir`` (not its
    subdirectories). Later files win for a repeated step (resumed runs)."""
    from google.protobuf.json_format import MessageToDict
    from tensorboard.plugins.hparams import metadata

    curves: dict[str, dict[int, float]] = {}
    hparams = None
    for path in sorted(Path(run_dir).glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            for event in acc.Scalars(tag):
                curves.setdefault(tag, {})[event.step] = event.value
        try:
            content = acc.PluginTagToContent(metadata.PLUGIN_NAME).get(metadata.SESSION_START_INFO_TAG)
        except KeyError:  # this file holds no hparams (a resumed run's later file)
            content = None
        if content is not None:
            start = metadata.parse_session_start_info_plugin_data(content)
            hparams = {key: MessageToDict(value) for key, value in start.hparams.items()}
    return RunEvents(scalars={tag: sorted(points.items()) for tag, points in curves.items()}, hparams=hparams)


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """``tag -> [(step, value), ...]`` sorted by step (see :func:`read_events`)."""
    return read_events(run_dir).scalars
