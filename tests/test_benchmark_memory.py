"""Every benchmark reads a process's peak memory one way (benchmarks/peak_rss.py, issue 47 item 17):
a child started by a parent that holds 800 MB reads its own peak. ``ru_maxrss`` would read the
parent's: Linux carries the parent's resident size at the fork into the child across ``exec``."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


@pytest.fixture
def ballast():
    """800 MB resident in this (the parent) process while the child runs."""
    if not Path("/proc/self/status").is_file():
        pytest.skip("VmHWM is Linux's")
    held = bytearray(800 * 2**20)
    held[::4096] = b"\x01" * len(held[::4096])   # touch every page: resident
    yield held
    assert len(held) == 800 * 2**20


@pytest.fixture
def benchmarks(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return lambda name: importlib.import_module(name)


def test_lora_memorys_child_reads_its_own_peak(ballast, benchmarks) -> None:
    peak = benchmarks("lora_memory").peak_rss_mib([])  # imports rlzoo, torch and transformers: ~230 MiB
    assert 50 < peak < 600, peak


def test_preflight_checks_child_reads_its_own_peak(ballast, benchmarks) -> None:
    out, peak = benchmarks("preflight_check").rlzoo(["list", "--kind", "loss_agg"])
    assert "token-mean" in out and 10 < peak < 600, peak


def test_the_readers_are_one(benchmarks) -> None:
    """compare_trl.py's workers read the shared one."""
    assert benchmarks("compare_trl").peak_rss_mb is benchmarks("peak_rss").peak_rss_mb
    assert benchmarks("peak_rss").peak_rss_mb() > 10
    assert sys.modules["peak_rss"].__file__ == str(BENCHMARKS / "peak_rss.py")
