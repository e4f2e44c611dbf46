"""Algorithm presets (``algo=NAME``): compositions of components, no code.

Each preset is a YAML file in ``configs/algo/`` (installed as ``rlzoo_configs/algo``),
registered here through the same hook a third-party package uses.
"""

from __future__ import annotations

from importlib import resources

from rlzoo import hookimpl

RLZOO_API_VERSION = "2"

PRESETS: dict[str, tuple[str, str]] = {
    "ppo": ("PPO: critic + GAE, clipped surrogate, adaptive KL in the reward",
            "arXiv:1707.06347"),
    "grpo": ("GRPO: group-normalised advantages, no critic", "arXiv:2402.03300"),
    "dr_grpo": ("Dr. GRPO: no std division, constant length normaliser", "arXiv:2503.20783"),
    "dapo": ("DAPO: clip-higher, token-mean, dynamic sampling, overlong shaping",
             "arXiv:2503.14476"),
    "rloo": ("RLOO: leave-one-out baseline, k1 KL in the reward", "arXiv:2402.14740"),
    "reinforce_pp": ("REINFORCE++: whitened returns, k2 KL in the reward", "arXiv:2501.03262"),
    "remax": ("ReMax: greedy-rollout baseline", "arXiv:2310.10505"),
    "gspo": ("GSPO: sequence-level ratio and clipping", "arXiv:2507.18071"),
    "cispo": ("CISPO: clipped stop-gradient importance weights", "arXiv:2506.13585"),
}


@hookimpl
def rlzoo_register_algorithms(register) -> None:
    folder = resources.files("rlzoo_configs").joinpath("algo")
    for name, (description, paper) in PRESETS.items():
        register(name, str(folder.joinpath(f"{name}.yaml")), description=description,
                 paper=paper)
