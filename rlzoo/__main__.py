"""``python -m rlzoo``: the same CLI as the ``rlzoo`` console script (used under torchrun)."""

from rlzoo.commands.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
