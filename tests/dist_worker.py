"""Run under torchrun by tests/test_distributed.py: one update on this rank's share.

Reads a JSON list of cases ``{"overrides": [...], "batch": PATH, "out": PATH}``; for each,
builds the trainer, takes this rank's contiguous share of the saved global batch (whole
groups), runs :meth:`Trainer.learn` once, and on rank 0 saves the parameters, gradients,
gathered advantages and metrics to ``out`` (whole tensors also under FSDP).
"""

import gc
import json
import sys

import torch
import torch.distributed as dist

from rlzoo.plan.run_input import load_run
from rlzoo.core.distributed import full_state_dict, is_sharded, local_value
from rlzoo.contract.loading import build_registry, make_plugin_manager
from rlzoo.run.trainer import Trainer


def main(spec_path: str) -> None:
    cases = json.loads(open(spec_path).read())
    pm = make_plugin_manager()
    registry = build_registry(pm)
    for case in cases:
        trainer = Trainer(load_run(registry, case["overrides"]), pm)
        batch = torch.load(case["batch"], weights_only=False)
        rank, world = trainer.dist.rank, trainer.dist.world
        share = len(batch) // world
        local = batch.select(list(range(rank * share, (rank + 1) * share)))
        metrics = trainer.learn(local)
        advantages = [None] * world
        dist.all_gather_object(advantages, local.advantages)
        # whole tensors on every rank (collectives when the models are sharded by FSDP)
        params = full_state_dict(trainer.models.policy_forward, "model.") if is_sharded(trainer.models.policy_forward) \
            else {k: v.detach() for k, v in trainer.models.policy.named_parameters()}
        grads = {k: local_value(v.grad) for k, v in trainer.models.policy.named_parameters() if v.grad is not None}
        critic = None
        if trainer.models.critic is not None:
            critic = full_state_dict(trainer.models.critic) if is_sharded(trainer.models.critic) \
                else {k: v.detach() for k, v in trainer.models.critic.named_parameters()}
        if rank == 0:
            torch.save({
                "params": {k: v.clone() for k, v in params.items()},
                "grads": {k: v.clone() for k, v in grads.items()},
                "critic": critic,
                "advantages": torch.cat(advantages),
                "metrics": metrics,
                "kl_coef": float(trainer.learner.kl_controller.value),
                "wrapper": type(trainer.models.policy_forward).__name__,
            }, case["out"])
        del trainer, local, params, grads, critic  # DDP/FSDP state goes while the group is alive
        gc.collect()
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
