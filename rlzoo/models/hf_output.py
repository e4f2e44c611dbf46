"""What transformers prints in a process: its logging verbosity and its progress bars.

The CLI runs with errors only and no progress bars (:func:`quiet_transformers`: rlzoo prints
its own lines, and transformers' ``Loading weights: ...`` bar on every model load says
nothing a run's user acts on). A process rlzoo spawns (the asynchronous generator) starts a
fresh interpreter with transformers' defaults, so it takes its parent's settings
(:func:`transformers_output` there, :func:`set_transformers_output` in the child).
"""

from __future__ import annotations

from transformers.utils import logging as hf_logging


def transformers_output() -> tuple[int, bool]:
    """This process's transformers verbosity and whether its progress bars show."""
    return hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()


def set_transformers_output(output: tuple[int, bool]) -> None:
    """Print what :func:`transformers_output` read (in another process)."""
    verbosity, progress = output
    hf_logging.set_verbosity(verbosity)
    if progress:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()


def quiet_transformers() -> None:
    """Errors only, no progress bars: what every ``rlzoo`` command that loads models runs with."""
    set_transformers_output((hf_logging.ERROR, False))
