"""Stopping a run cleanly on SIGINT / SIGTERM: finish the step, checkpoint, exit.

The first SIGINT or SIGTERM asks for a stop after the current step; a second SIGINT
aborts (``KeyboardInterrupt``, no checkpoint). More SIGTERMs change nothing: a scheduler
may signal every process of a job.
"""

from __future__ import annotations

import signal
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """While installed (``with StopRequest(announce) as stop:``), :data:`STOP_SIGNALS` set
    ``stop.requested`` instead of killing the process; the previous handlers come back on
    exit. Outside the main thread (where signals cannot be caught) it does nothing.

    :param announce: print the notice (rank 0 only, under torchrun).
    """

    def __init__(self, announce: bool) -> None:
        self.announce = announce
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopRequest":
        for sig in STOP_SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                break
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        self.requested = True
        if self.announce:
            print(f"\nrlzoo: {signal.Signals(signum).name} received; finishing this step and writing a "
                  "checkpoint (Ctrl-C again aborts without one)", flush=True)
