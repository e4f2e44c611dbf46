"""Algorithm presets (``algo=NAME``): compositions of components, no code.

Each preset is a card in ``configs/algo/<name>.yaml`` (installed as ``rlzoo_configs/algo``):
its description, paper, the config keys it sets and, for every key, the source it comes
from and any deviation (see :mod:`rlzoo.config.preset_cards`). Every card in that folder is registered
here, under its file name, through the same hook a third-party package uses: adding a
built-in preset is adding its card.

verl's bypass presets (``bypass_pg_is``, ``bypass_ppo_clip_k3_rs``, ...) are one table here
instead of eight near-identical cards: each is registered as a mapping with its card
(docs/algorithms/corrections.md, "Bypass").
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from rlzoo.api import hookimpl, read_card_file

RLZOO_API_VERSION = "2"


VERL_BYPASS_SOURCE = ("verl RolloutCorrectionConfig.{name}() (verl/trainer/config/algorithm.py): bypass_mode=True, "
                      "loss_type={loss_type}")
GEOMETRIC_RS = {"name": "seq_is_mask", "aggregate": "geometric", "low": 1 / 1.001, "high": 1 / 0.999}
"""verl's Geo-RS, rollout_rs=seq_mean_k1 "0.999_1.001": a sequence is kept when the mean over its
tokens of log(μ/π) lies in [log 0.999, log 1.001]; seq_is_mask bounds exp(mean log(π/μ)), so
verl's bounds enter as their reciprocals, [1/1.001, 1/0.999]."""
GEOMETRIC_RS_CARD = ("Geo-RS: rollout_rs=seq_mean_k1, rollout_rs_threshold \"0.999_1.001\" (verl "
                     "compute_rollout_rejection_mask: keep a sequence when mean_t log(μ/π) ∈ [log 0.999, log 1.001]); "
                     "seq_is_mask bounds exp(mean_t log(π/μ)), so the bounds are verl's reciprocals 1/1.001, 1/0.999 "
                     "(the same sequences kept)")
SEQ_TIS_CARD = ("rollout_is=sequence, rollout_is_threshold 2.0 (verl compute_rollout_correction_weights: "
                "min(exp(clamp(Σ_t log(π/μ), ±20)), 2) on every token of the sequence)")
TOKEN_TIS_CARD = ("rollout_is=token, rollout_is_threshold 2.0 (verl compute_rollout_correction_weights: "
                  "min(exp(clamp(log(π/μ), ±20)), 2) per token)")
WEIGHT_MODE = ("; rlzoo's mode=weight: verl rejects inside the policy loss, after the mini-batch's token and "
               "sequence counts were taken, so a rejected sequence stays in the denominators")
VERL_BYPASS_PRESETS: dict[str, tuple[str, str, Any, str]] = {
    # name: (description, loss_type, rollout_correction, its card entry)
    "bypass_ppo_clip": ("verl bypass: PPO-clip against the rollout's μ, no old-log-prob pass, no correction",
                        "ppo_clip", "none", "rollout_is=None, rollout_rs=None: no IS weight, no rejection"),
    "bypass_ppo_clip_geo_rs": ("verl bypass: PPO-clip against μ with geometric sequence rejection (Geo-RS)",
                               "ppo_clip", GEOMETRIC_RS, GEOMETRIC_RS_CARD + WEIGHT_MODE),
    "bypass_ppo_clip_k3_rs": ("verl bypass: PPO-clip against μ with K3 sequence rejection (K3-RS, 0.01)",
                              "ppo_clip", {"name": "rejection", "estimator": "k3", "level": "mean", "threshold": 0.01},
                              "K3-RS: rollout_rs=seq_mean_k3, rollout_rs_threshold 0.01 (verl "
                              "compute_rollout_rejection_mask: keep a sequence when mean_t (r − 1 − log r) ≤ 0.01, "
                              "r = π/μ)" + WEIGHT_MODE),
    "bypass_pg_is": ("verl bypass: REINFORCE with sequence-level truncated IS weights π/μ (cap 2)",
                     "reinforce", {"name": "seq_tis", "cap": 2.0}, SEQ_TIS_CARD),
    "bypass_pg_token_icepop": ("verl bypass: REINFORCE with token IcePop weights π/μ in [0.5, 5], else 0",
                               "reinforce", {"name": "icepop", "low": 0.5, "high": 5.0},
                               "rollout_is=token, rollout_is_threshold \"0.5_5.0\" (verl "
                               "compute_rollout_correction_weights, IcePop branch: π/μ inside [0.5, 5], 0 outside; "
                               "response_mask unchanged)"),
    "bypass_pg_geo_rs": ("verl bypass: REINFORCE with geometric sequence rejection (Geo-RS), no IS weight",
                         "reinforce", GEOMETRIC_RS, GEOMETRIC_RS_CARD + WEIGHT_MODE),
    "bypass_pg_geo_rs_seq_tis": ("verl bypass: REINFORCE with sequence TIS (cap 2) and Geo-RS",
                                 "reinforce", [{"name": "seq_tis", "cap": 2.0}, GEOMETRIC_RS],
                                 "verl computes the IS weights and the rejection mask side by side over the same "
                                 "mask: " + SEQ_TIS_CARD + ", then " + GEOMETRIC_RS_CARD + WEIGHT_MODE),
    "bypass_pg_geo_rs_token_tis": ("verl bypass: REINFORCE with token TIS (cap 2) and Geo-RS",
                                   "reinforce", [{"name": "tis", "cap": 2.0}, GEOMETRIC_RS],
                                   "verl computes the IS weights and the rejection mask side by side over the same "
                                   "mask: " + TOKEN_TIS_CARD + ", then " + GEOMETRIC_RS_CARD + WEIGHT_MODE),
}
"""verl's bypass presets (``RolloutCorrectionConfig.bypass_*``) as algorithm presets. Each sets
what verl's preset sets (the old log-probs, the loss type, the corrections) and the update
structure of verl's rollout-correction example; everything else is rlzoo's default."""
LOSSES = {
    "ppo_clip": ({"name": "dual_clip", "clip_low": 0.2, "clip_high": 0.2, "clip_ratio_c": 3.0},
                 "loss_type=ppo_clip calls compute_policy_loss_vanilla with the rollout's log-probs as old: "
                 "verl's vanilla loss is dual-clip PPO (clip_ratio 0.2, clip_ratio_c 3.0, its defaults), rlzoo's "
                 "dual_clip; no IS weight multiplies it"),
    "reinforce": ("vanilla_pg",
                  "loss_type=reinforce calls compute_policy_loss_reinforce: −w·A·log π, w the detached IS weights "
                  "(1 without); rlzoo's vanilla_pg, −A·log π, which the engine multiplies by the corrections' "
                  "weights"),
}


def _bypass_preset(name: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """Config, card and description of verl preset ``name``."""
    description, loss_type, correction, correction_card = VERL_BYPASS_PRESETS[name]
    loss, loss_card = LOSSES[loss_type]
    source = VERL_BYPASS_SOURCE.format(name=name, loss_type=loss_type)
    config = {"policy_loss": loss, "rollout_correction": correction,
              "trainer": {"old_logp": "rollout", "num_mini_batches": 4}}
    card = {
        "policy_loss": f"{source}: {loss_card}",
        "rollout_correction": f"{source}: {correction_card}",
        "trainer.old_logp": (f"{source}: apply_bypass_mode sets old_log_probs = rollout_log_probs and the "
                             "old-log-prob pass (compute_log_prob) is skipped; the corrections compare the current "
                             "policy π (detached) with μ in each micro-batch (compute_policy_loss_bypass_mode)"),
        "trainer.num_mini_batches": ("verl examples/rollout_correction/run_qwen2_5_7b_fsdp.sh (a bypass REINFORCE "
                                     "run): train_batch_size 128 / ppo_mini_batch_size 32 = 4 optimizer steps per "
                                     "rollout; verl's presets leave the update structure to the run"),
    }
    return config, card, description


@hookimpl
def rlzoo_register_algorithms(register) -> None:
    folder = resources.files("rlzoo_configs").joinpath("algo")
    for card in sorted(folder.iterdir(), key=lambda entry: entry.name):
        if card.name.endswith(".yaml"):
            path = str(card)
            register(card.name.removesuffix(".yaml"), path, **read_card_file(path))
    for name in VERL_BYPASS_PRESETS:
        config, card, description = _bypass_preset(name)
        register(name, config, card=card, description=description,
                 paper="verl RolloutCorrectionConfig; Liu et al. 2025, When Speed Kills Stability")
