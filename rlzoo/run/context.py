"""What lifecycle hooks see of a run: :class:`RunContext`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from rlzoo.core.batch import RolloutBatch
    from rlzoo.plan.records import RunPlan


@dataclass
class RunContext:
    """The run as lifecycle hooks see it (``ctx`` in :mod:`rlzoo.contract.hookspecs`).

    :ivar cfg: the resolved config (OmegaConf).
    :ivar plan: the run plan (:class:`rlzoo.plan.records.RunPlan`).
    :ivar run_dir: where logs and checkpoints go.
    :ivar step: the current step (1-based once training starts).
    :ivar resample: ``resample(n_prompts) -> RolloutBatch``: generate and score groups for
        ``n_prompts`` fresh prompts (:meth:`rlzoo.rollout.sampler.Sampler.sample`; dynamic sampling
        refills a batch with it).
    :ivar state: per-run scratch space for extensions, saved in checkpoints: its values
        must be tensors, str, int, float, bool, None, or dicts / lists / tuples of them.
    :ivar metrics: this step's extra metrics; hooks add ``name -> float`` to log them
        (under torchrun: averaged over the processes).
    :ivar counts: this step's extra metrics that count things in the batch (summed over
        the processes under torchrun, so they equal a single process's count).
    :ivar prompts: prompts (groups) this process generates per step:
        ``rollout.prompts_per_step`` divided by the number of processes.
    """

    cfg: Any
    plan: "RunPlan"
    run_dir: Path
    resample: Callable[[int], "RolloutBatch"]
    prompts: int
    step: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)
