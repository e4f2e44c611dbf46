"""Algorithm presets (``algo=NAME``): compositions of components, no code.

Each preset is a card in ``configs/algo/<name>.yaml`` (installed as ``rlzoo_configs/algo``):
its description, paper, the config keys it sets and, for every key, the source it comes
from and any deviation (see :mod:`rlzoo.presets`). They are registered here through the
same hook a third-party package uses.
"""

from __future__ import annotations

from importlib import resources

from rlzoo import hookimpl
from rlzoo.presets import read_card_file

RLZOO_API_VERSION = "2"

PRESETS = ("ppo", "grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "remax", "gspo", "cispo")


@hookimpl
def rlzoo_register_algorithms(register) -> None:
    folder = resources.files("rlzoo_configs").joinpath("algo")
    for name in PRESETS:
        path = str(folder.joinpath(f"{name}.yaml"))
        register(name, path, **read_card_file(path))
