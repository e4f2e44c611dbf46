"""The dtypes a config may name (``model.dtype``, ``rollout.dtype``, a reward model's
``dtype``), by name."""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""Config name -> torch dtype."""
