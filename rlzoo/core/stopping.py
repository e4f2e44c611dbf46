"""Stopping a run cleanly on SIGINT / SIGTERM: finish the step, checkpoint, exit.

The first SIGINT or SIGTERM asks for a stop after the current step; a second SIGINT
aborts (``KeyboardInterrupt``, no checkpoint). More SIGTERMs change nothing, up to the
end of the process: a scheduler may signal every process of a job, or signal it again
while it writes its checkpoint or exits.

Processes that run other rlzoo processes (``rlzoo sweep``, the torchrun launcher) start
them with :func:`die_with_parent` and forward signals with :func:`send_signal`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
PR_SET_PDEATHSIG = 1


def write_now(text: str) -> None:
    """Write ``text`` to stdout with one ``write`` system call: safe inside a signal handler,
    where ``print`` may interrupt another ``print`` (a re-entrant call raises)."""
    try:
        os.write(sys.stdout.fileno(), text.encode())
    except (OSError, ValueError, AttributeError):  # no file descriptor (captured) or closed
        pass


class StopRequest:
    """While installed (``with StopRequest(announce) as stop:``), :data:`STOP_SIGNALS` set
    ``stop.requested`` instead of killing the process. On exit the previous handlers come
    back, except that SIGTERM stays ignored once a stop was requested (the process is
    stopping; a later SIGTERM must not kill it mid-exit). Outside the main thread (where
    signals cannot be caught) it does nothing.

    :param announce: print the notice (rank 0 only, under torchrun).
    :ivar exiting: set when the run is ending with an error under torchrun: SIGTERM stays
        ignored after the exit too, as after a stop (torchrun sends it to every rank once
        the first one exits, while the others are still writing their error and status).
    """

    def __init__(self, announce: bool) -> None:
        self.announce = announce
        self.requested = False
        self.exiting = False
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
            keep_ignored = (self.requested or self.exiting) and sig == signal.SIGTERM
            signal.signal(sig, signal.SIG_IGN if keep_ignored else handler)
        self._previous = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        self.requested = True
        if self.announce:
            write_now(f"\nrlzoo: {signal.Signals(signum).name} received; finishing this step and writing a "
                 "checkpoint (Ctrl-C again aborts without one)\n")


def die_with_parent(signum: int = signal.SIGTERM) -> None:  # pragma: no cover - runs in a child
    """``preexec_fn`` of a child process (or called first thing in one): ask the kernel to
    send it ``signum`` when its parent dies (Linux; elsewhere nothing), so it never trains
    on unwatched. A child that ignores SIGTERM (the async generator) asks for SIGKILL."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum))


def send_signal(pids: list[int], signum: int) -> None:
    """Send ``signum`` to each of ``pids``, skipping those that have already exited."""
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
