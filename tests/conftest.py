"""Shared fixtures: a fresh registry per test, plugin injection helpers."""

from __future__ import annotations

import os
import textwrap
import uuid
from pathlib import Path

import pytest
from hypothesis import settings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

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
