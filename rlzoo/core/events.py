"""Read a run's TensorBoard event files back: scalar curves and the recorded hparams."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c


@dataclass
class RunEvents:
    """What a run logged.

    :ivar scalars: ``tag -> [(step, value), ...]`` sorted by step.
    :ivar hparams: the effective hyperparameters the run recorded for TensorBoard's
        HParams (``None`` for runs that recorded none).
    :ivar problems: event file name -> what is wrong with it (:func:`event_file_problem`).
    """

    scalars: dict[str, list[tuple[int, float]]]
    hparams: dict[str, Any] | None
    problems: dict[str, str] = field(default_factory=dict)


RECORD_HEADER = 12
"""Bytes before a TFRecord's data: its length (uint64) and the masked CRC-32C of those 8 bytes."""


def event_file_problem(path: Path) -> str | None:
    """What is wrong with an event file's record framing, or ``None`` when every record is
    whole: empty; not an event file (its first record's header fails its checksum); damaged
    (a later header does); truncated (the last record is cut short, as by a killed writer).
    Reads the headers only (the data's own checksums are TensorBoard's to check)."""
    data = path.read_bytes()
    if not data:
        return "is empty (0 bytes)"
    offset = records = 0
    while offset < len(data):
        header = data[offset:offset + RECORD_HEADER]
        length, crc = struct.unpack("<QI", header) if len(header) == RECORD_HEADER else (None, None)
        if length is not None and masked_crc32c(header[:8]) != crc:
            return ("is not a TensorBoard event file (its first record's header fails its checksum)" if not records
                    else f"is damaged after {records} whole records (byte {offset} of {len(data)})")
        if length is None or offset + RECORD_HEADER + length + 4 > len(data):
            return f"is truncated: {records} whole records, then {len(data) - offset} bytes of a cut-off one"
        offset += RECORD_HEADER + length + 4
        records += 1
    return None


def read_events(run_dir: str | Path) -> RunEvents:
    """Everything :class:`RunEvents` holds, from all event files of ``run_dir`` (not its
    subdirectories). Later files win for a repeated step (resumed runs)."""
    from google.protobuf.json_format import MessageToDict
    from tensorboard.plugins.hparams import metadata

    curves: dict[str, dict[int, float]] = {}
    hparams = None
    problems = {}
    for path in sorted(Path(run_dir).glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime):
        problem = event_file_problem(path)
        if problem is not None:
            problems[path.name] = problem
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
    return RunEvents(scalars={tag: sorted(points.items()) for tag, points in curves.items()}, hparams=hparams,
                     problems=problems)


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """``tag -> [(step, value), ...]`` sorted by step (see :func:`read_events`)."""
    return read_events(run_dir).scalars
