"""``launcher.nproc=N``: ``rlzoo train`` re-runs itself under ``torchrun --standalone``.

The launcher is the process a terminal or a scheduler signals, so it owns stopping:

- torchrun runs in a session of its own, so a terminal's Ctrl-C reaches the launcher
  only, and (Linux) gets SIGTERM if the launcher dies, so it never trains on orphaned;
- a SIGINT or SIGTERM to the launcher is forwarded straight to the worker processes
  (not to torchrun, whose own handler would SIGKILL them 30 s later): every rank finishes
  its step, rank 0 writes a checkpoint and ``status.json``, the ranks exit 0 and so do
  torchrun and the launcher, as a single process does on Ctrl-C;
- a second SIGINT kills the workers and torchrun at once: one line, exit 130.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from rlzoo.core.errors import say
from rlzoo.core.stopping import die_with_parent, send_signal

EXIT_ABORTED = 130


def child_pids(pid: int) -> list[int]:
    """The direct children of ``pid`` (Linux ``/proc``; empty where it is not available)."""
    children: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children.update(int(child) for child in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return sorted(children)


def launch_torchrun(train_args: list[str], nproc: int, run_dir: Path, subcommand: str = "train") -> int:
    """Run ``rlzoo <subcommand> *train_args`` (``train`` or ``rm``) under ``torchrun
    --standalone --nproc_per_node=nproc`` and return its exit code (:data:`EXIT_ABORTED`
    after a second SIGINT). ``run_dir`` is the run's directory, named in the last line when
    the job fails."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "rlzoo", subcommand, *train_args]
    say("rlzoo: launching " + " ".join(command[1:]))
    torchrun = subprocess.Popen(command, start_new_session=True, preexec_fn=die_with_parent)
    received: list[int] = []

    def forward(signum: int, frame: object) -> None:
        workers = child_pids(torchrun.pid)
        if signum == signal.SIGINT and signal.SIGINT in received:
            send_signal([*workers, torchrun.pid], signal.SIGKILL)
            received.append(-1)  # aborted
            return
        if signum not in received or signum == signal.SIGINT:
            received.append(signum)
            send_signal(workers or [torchrun.pid], signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = torchrun.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    resume = f"the newest checkpoint stays resumable: `rlzoo {subcommand} resume={run_dir}`"
    if -1 in received:
        say(f"rlzoo: error: aborted by a second Ctrl-C; {resume}")
        return EXIT_ABORTED
    if code != 0:
        say(f"rlzoo: error: the torchrun job failed (exit {code}; the messages above name the rank and the "
            f"reason); {resume}")
    return code
