"""Run under torchrun by tests/test_distributed.py: the reward model's normalisation
statistics over ranks.

``python rm_moments_worker.py RM_DIR OUT_DIR``: for two steps, rank ``r`` scores ``r + 1 +
step`` training batches of texts of its own (so the ranks score different numbers of batches,
as a rank that resamples would), then settles once, as the trainer does each step; saves the
texts it scored, its statistics after each settle, and the scores it returned to
``OUT_DIR/rank<r>.pt``.
"""

import sys
from pathlib import Path

import torch

from rlzoo.core import distributed
from rlzoo.rollout.scoring import Rewards
from zoo import REGISTRY


def main(rm_dir: str, out_dir: str) -> None:
    info = distributed.init("gloo", "cpu", 60)
    component = REGISTRY.get("reward", "reward_model")
    scorer = component.bind(component.params(path=rm_dir, normalize=True)).build(device=torch.device("cpu"),
                                                                                  tokenizer=None)
    rewards = Rewards([(scorer, 1.0)])
    texts: list[tuple[str, str]] = []
    states, returned = [], []
    for step in range(2):
        for batch in range(info.rank + 1 + step):
            prompts = [f"{info.rank}{step}{batch}{i}=" for i in range(3)]
            completions = [str(37 * i + 11 * batch + 5 * info.rank + step) for i in range(3)]
            texts += zip(prompts, completions)
            returned.append(rewards.score(prompts, completions, [None] * 3, [{}] * 3, training=True)[0])
        rewards.settle(lambda values: distributed.sum_floats(values, info))
        states.append(rewards.state_dict())
    torch.save({"texts": texts, "states": states, "returned": returned}, Path(out_dir) / f"rank{info.rank}.pt")
    distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
