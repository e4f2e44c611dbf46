"""Module-level functions for the unsafe-tool tests of tests/test_tools.py: a child process
imports this module by name to call them, so it imports nothing heavy (no torch)."""

from __future__ import annotations

import os
import time


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def sleep(seconds: float) -> str:
    """Sleep, then say so.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "awake"


def allocate(megabytes: int) -> int:
    """Allocate a buffer and return its size.

    Args:
        megabytes: Its size in MiB.
    """
    return len(bytearray(megabytes * 2**20))


def exit_now(code: int) -> str:
    """End the process at once.

    Args:
        code: The exit code.
    """
    os._exit(code)


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a / b
