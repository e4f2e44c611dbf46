"""Shared fixtures: a fresh registry per test, plugin injection helpers."""

from __future__ import annotations

import os
import textwrap
import uuid
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from rlzoo.core.processes import share_cores_politely

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Before torch loads (the OpenMP runtime reads these once): waiting threads spin briefly, then
# sleep, as under the CLI; under pytest-xdist each worker, and each run it starts, takes its
# share of the cores rather than all of them (two workers with torch's default of every core
# each ran the golden replays up to 10x slower than alone).
share_cores_politely()
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _cores // _WORKERS)))

# Property tests run a fixed, reproducible set of examples (CI must not flip on a new
# random draw); set RLZOO_HYPOTHESIS_RANDOM=1 to explore fresh examples locally.
settings.register_profile("reproducible", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile("explore" if os.environ.get("RLZOO_HYPOTHESIS_RANDOM") else "reproducible")


@pytest.fixture
def registry():
    """The registry of every installed plugin, built afresh."""
    from rlzoo.contract.loading import build_registry, make_plugin_manager

    return build_registry(make_plugin_manager())


@pytest.fixture
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write a Python module into a temp dir on sys.path; returns its import name."""
    def write(source: str, name: str | None = None) -> str:
        name = name or f"rlzoo_test_plugin_{uuid.uuid4().hex[:12]}"   # unique: sys.modules caches
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        monkeypatch.syspath_prepend(str(tmp_path))
        return name

    return write


@pytest.fixture
def one_thread():
    """One torch thread for the test (model checks run outside a run here, which would set
    trainer.threads=1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
