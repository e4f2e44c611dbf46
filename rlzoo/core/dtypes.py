"""The dtypes a config may name (``model.dtype``, ``rollout.dtype``, a reward model's
``dtype``), by name."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch


class _DtypesByName(Mapping[str, "torch.dtype"]):
    """Config name -> torch dtype; the dtype is read from torch on lookup, so importing this
    module (every plugin does, through ``rlzoo.api``) does not load a deferred torch
    (:mod:`rlzoo.core.deferred`)."""

    NAMES = ("float32", "bfloat16", "float16")
    """The names, each torch's own attribute name of the dtype."""

    def __getitem__(self, name: str) -> torch.dtype:
        if name not in self.NAMES:
            raise KeyError(name)
        return getattr(torch, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.NAMES)

    def __len__(self) -> int:
        return len(self.NAMES)


DTYPES: Mapping[str, torch.dtype] = _DtypesByName()
"""Config name -> torch dtype."""
