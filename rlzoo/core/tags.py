"""The stable names of the scalars a run logs that rlzoo itself reads back."""

from __future__ import annotations


class Tag:
    """Stable scalar tag names that other modules read back (``rlzoo doctor``'s detectors,
    ``rlzoo compare``): one spelling, here. The module docstring lists every tag a run writes."""

    REWARD = "reward/mean"
    REWARD_STD = "reward/std"
    REWARD_MAX = "reward/max"
    ZERO_STD_GROUPS = "reward/zero_std_frac"
    PROXY = "reward/proxy"
    GOLD = "reward/gold"
    LENGTH = "response_length/mean"
    TRUNCATED = "response_length/truncated_frac"
    POLICY_LOSS = "policy/loss"
    CLIPFRAC = "policy/clipfrac"
    APPROX_KL = "policy/approx_kl"
    KL = "kl/value"
    KL_SEQUENCE = "kl/sequence_sum"
    KL_COEF = "kl/coef"
    KL_GRAD_SHARE = "kl/grad_share"
    ENTROPY = "entropy"
    GRAD_NORM = "grad_norm"
    LR = "lr"
    VALUE_LOSS = "value/loss"
    EXPLAINED_VAR = "value/explained_var"
    VALUE_PRED = "value/vpred_mean"
    RETURNS = "value/returns_mean"
    MISMATCH = "rollout/mismatch_k3"
    MAX_LOG_RATIO = "rollout/max_abs_log_ratio"
    EVAL_ACCURACY = "eval/greedy_accuracy"
    STEP_S = "timing/step_s"
    ANSWER_TOKENS_MIN = "task/answer_tokens_min"
    ANSWER_TOKENS_MAX = "task/answer_tokens_max"
