"""Algorithm presets (``algo=NAME``): compositions of components, no code.

Each preset is a card in ``configs/algo/<name>.yaml`` (installed as ``rlzoo_configs/algo``):
its description, paper, the config keys it sets and, for every key, the source it comes
from and any deviation (see :mod:`rlzoo.config.preset_cards`). Every card in that folder is registered
here, under its file name, through the same hook a third-party package uses: adding a
built-in preset is adding its card.
"""

from __future__ import annotations

from importlib import resources

from rlzoo.api import hookimpl, read_card_file

RLZOO_API_VERSION = "2"


@hookimpl
def rlzoo_register_algorithms(register) -> None:
    folder = resources.files("rlzoo_configs").joinpath("algo")
    for card in sorted(folder.iterdir(), key=lambda entry: entry.name):
        if card.name.endswith(".yaml"):
            path = str(card)
            register(card.name.removesuffix(".yaml"), path, **read_card_file(path))
