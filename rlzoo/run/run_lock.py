"""One run per directory: an exclusive ``flock`` on ``<run_dir>/.lock`` holding the owner's pid."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from rlzoo.core.errors import ConfigError

LOCK_FILE = ".lock"


def in_use_error(path: Path, holder: int | None) -> ConfigError:
    who = "this process: close() its other Trainer first" if holder == os.getpid() else "wait for it to end or stop it"
    return ConfigError(f"run directory {str(path)!r} is in use by another rlzoo run (pid "
                       f"{holder if holder and holder > 0 else '?'}); {who}")


class RunLock:
    """An exclusive ``flock`` on ``<run_dir>/.lock`` holding the owner's pid."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.fd: int | None = None

    def acquire(self) -> None:
        """:raises ConfigError: another live process holds the lock (its pid named), or
        the file cannot be created."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError(f"cannot write in run directory {str(self.path.parent)!r}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            raise in_use_error(self.path.parent, holder) from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None


def lock_holder(run_dir: Path) -> int | None:
    """The pid of the live process holding ``run_dir``'s lock, or ``None`` (writes nothing)."""
    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _read_pid(fd) or -1
    finally:
        os.close(fd)  # closing drops a lock this probe took
    return None
