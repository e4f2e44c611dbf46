"""Run under torchrun by tests/test_distributed.py: one update on this rank's share.

Reads a JSON list of cases ``{"overrides": [...], "batch": PATH, "out": PATH}``; for each,
builds the trainer, takes this rank's contiguous share of the saved global batch (whole
groups), runs :meth:`Trainer.learn` once, and on rank 0 saves the parameters, gradients,
gathered advantages and metrics to ``out``.
"""

import json
import sys

import torch
import torch.distributed as dist

from rlzoo.config import load_config
from rlzoo.plugins import build_registry, make_plugin_manager
from rlzoo.trainer import Trainer


def main(spec_path: str) -> None:
    cases = json.loads(open(spec_path).read())
    pm = make_plugin_manager()
    registry = build_registry(pm)
    for case in cases:
        trainer = Trainer(load_config(registry, case["overrides"]), registry, pm)
        batch = torch.load(case["batch"], weights_only=False)
        rank, world = trainer.dist.rank, trainer.dist.world
        share = len(batch) // world
        local = batch.select(list(range(rank * share, (rank + 1) * share)))
        metrics = trainer.learn(local)
        advantages = [None] * world
        dist.all_gather_object(advantages, local.advantages)
        if rank == 0:
            torch.save({
                "params": {k: v.detach().clone() for k, v in trainer.policy.named_parameters()},
                "grads": {k: v.grad.clone() for k, v in trainer.policy.named_parameters()
                          if v.grad is not None},
                "critic": ({k: v.detach().clone() for k, v in trainer.critic.named_parameters()}
                           if trainer.critic is not None else None),
                "advantages": torch.cat(advantages),
                "metrics": metrics,
                "kl_coef": float(trainer.kl_controller.value),
            }, case["out"])
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
