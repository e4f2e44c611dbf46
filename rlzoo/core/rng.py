"""The process-wide random number generators a run depends on, as checkpointable state.

torch (CPU and CUDA), Python's ``random`` and NumPy's legacy generator, captured as
tensors and plain values so the state loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed torch, Python's ``random`` and NumPy with ``seed``."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def global_rng_state() -> dict[str, Any]:
    """The current state of every global generator (tensors and plain values)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "python_rng": random.getstate(),
        "numpy_rng": {"name": str(name), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                      "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
    }


def set_global_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`global_rng_state` captured (a checkpoint may hold lists for tuples)."""
    torch.set_rng_state(state["torch_rng"])
    if state.get("cuda_rng") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    version, internal, gauss = state["python_rng"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = state["numpy_rng"]
    np.random.set_state((numpy_state["name"], numpy_state["keys"].numpy().astype(np.uint32), numpy_state["pos"],
                         numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
