"""KL penalties (estimators of KL(π‖π_ref) per token) and KL coefficient controllers.

Formulas: ../docs/algorithms/kl.md (from ALGORITHMS.md "KL penalties", following verl
``core_algos.kl_penalty`` and ``AdaptiveKLController`` / ``FixedKLController``).
Notation: ``x = logp − ref_logp`` per sampled token, all tensors ``(B, T)``.

The estimators are elementwise, so a padded position can never influence a valid one; the
engine multiplies by the mask (reward path) or aggregates with it (loss path). Gradient
flows into the policy side only (``logp`` / ``logits``), never into the reference.
"The reference" is the KL's target: the frozen initial policy, or under ``kl.target=teacher``
the teacher model (on-policy distillation; the engine passes the teacher's log-probs and
logits as ``ref_logp`` / ``ref_logits``, the estimators are the same functions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from rlzoo.api import hookimpl
RLZOO_API_VERSION = "2"

SCHULMAN_KL_BLOG = "http://joschu.net/blog/kl-approx.html"


# ------------------------------------------------------------------ sampled-token estimators


def _log_ratio(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """x = logp − sg(ref_logp): the reference never receives a gradient."""
    return logp - ref_logp.detach()


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = x = logp − ref_logp; ``(B, T)`` -> ``(B, T)``.

    Unbiased estimate of KL(π‖π_ref) under samples of π, high variance, may be negative.
    Source: Schulman, "Approximating KL divergence" (2020); verl core_algos.kl_penalty
    ("kl"/"k1").
    """
    return _log_ratio(logp, ref_logp)


def kl_abs(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """|x| = |logp − ref_logp|; ``(B, T)`` -> ``(B, T)``. verl core_algos.kl_penalty ("abs")."""
    return _log_ratio(logp, ref_logp).abs()


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = ½·x²; ``(B, T)`` -> ``(B, T)``.

    Biased value, but its gradient ``x·∇logp`` is an unbiased estimate of ∇KL(π‖π_ref).
    Source: Schulman (2020); verl core_algos.kl_penalty ("mse"/"k2").
    """
    return 0.5 * _log_ratio(logp, ref_logp).square()


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = exp(−x) − (−x) − 1 (Schulman's low-variance estimator); ``(B, T)`` -> ``(B, T)``.

    Exactly verl core_algos.kl_penalty("low_var_kl"): the exponent −x = ref_logp − logp is
    clamped to [−20, 20] first and the result to [−10, 10] (the clamps zero the gradient
    outside those ranges). Non-negative, unbiased in value for on-policy samples.
    Source: Schulman (2020); GRPO (arXiv:2402.03300) eq. 4.
    """
    neg_x = torch.clamp(-_log_ratio(logp, ref_logp), min=-20.0, max=20.0)
    return torch.clamp(torch.exp(neg_x) - neg_x - 1.0, min=-10.0, max=10.0)


def _straight_through(
    value: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor
) -> torch.Tensor:
    """Value of ``value``, gradient of k2 = ½x²: ``k2 + sg(value − k2)``."""
    k2 = kl_k2(logp, ref_logp)
    return k2 + (value - k2).detach()


def kl_k1_plus(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1+: value of k1 (= x), gradient of k2 (= x·∇logp); ``(B, T)`` -> ``(B, T)``.

    Straight-through as in verl core_algos.kl_penalty for names ending in "+":
    ``backward_score − sg(backward_score) + sg(forward_score)`` with backward_score = k2.
    """
    return _straight_through(kl_k1(logp, ref_logp), logp, ref_logp)


def kl_k3_plus(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3+: value of k3 (clamped as in :func:`kl_k3`), gradient of k2; ``(B, T)`` -> ``(B, T)``.

    Straight-through as in verl core_algos.kl_penalty("k3+").
    """
    return _straight_through(kl_k3(logp, ref_logp), logp, ref_logp)


# ------------------------------------------------------------------ full-vocabulary KL


@dataclass
class FullKLParams:
    """Parameters of ``full``.

    :ivar chunk_size: rows (tokens) of the flattened ``(B·T, V)`` logits processed at a time.
    """

    chunk_size: int = 1024

    def __post_init__(self) -> None:
        if self.chunk_size <= 0:
            raise ValueError(f"chunk_size must be > 0, got {self.chunk_size}")


def _full_kl_rows(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """Σ_v π(v)·(log π(v) − log π_ref(v)) for each row of ``(N, V)`` logits -> ``(N,)``.

    Computed in at least float32 (bf16/fp16 logits are upcast, float64 stays float64).
    Where π(v) = 0 (a −inf logit) the term is 0 rather than 0·(−inf).
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)
    log_pi = torch.log_softmax(logits.to(dtype), dim=-1)
    log_ref = torch.log_softmax(ref_logits.to(dtype), dim=-1)
    pi = log_pi.exp()
    diff = torch.where(pi > 0, log_pi - log_ref, torch.zeros_like(log_pi))
    return (pi * diff).sum(-1)


def kl_full(
    logits: torch.Tensor,
    ref_logits: torch.Tensor,
    params: Optional[FullKLParams] = None,
) -> torch.Tensor:
    """Exact per-token KL(π‖π_ref) = Σ_v π(v)·(log π(v) − log π_ref(v)) over the vocabulary.

    :param logits: ``(B, T, V)`` policy logits (carry the gradient).
    :param ref_logits: ``(B, T, V)`` reference logits (detached: no gradient).
    :return: ``(B, T)`` KL per token, float32 (float64 for float64 logits).

    The logits are flattened to ``(B·T, V)`` and processed ``params.chunk_size`` rows at a
    time; with grad enabled each chunk runs under ``torch.utils.checkpoint`` (non-reentrant)
    so its (at least float32) log-softmaxes are recomputed in backward instead of being held: the
    extra memory is O(chunk_size·V), never a second ``B×T×V`` tensor.
    Source: the definition of KL; verl core_algos.kl_penalty declares "full" but raises
    NotImplementedError, so there is no reference implementation to follow.
    """
    params = params or FullKLParams()
    return _chunked_rows(_full_kl_rows, logits, ref_logits, params.chunk_size)


@dataclass
class ForwardTopKParams:
    """Parameters of ``forward_topk``.

    :ivar topk: K, how many of the reference's most likely tokens the sum runs over (verl's
        ``distillation_loss.topk``: 32); >= 1 (capped at the vocabulary size).
    :ivar chunk_size: rows (tokens) of the flattened ``(B·T, V)`` logits processed at a time.
    """

    topk: int = 32
    chunk_size: int = 1024

    def __post_init__(self) -> None:
        if self.topk < 1:
            raise ValueError(f"topk must be >= 1, got {self.topk}")
        if self.chunk_size <= 0:
            raise ValueError(f"chunk_size must be > 0, got {self.chunk_size}")


def _forward_topk_rows(logits: torch.Tensor, ref_logits: torch.Tensor, topk: int) -> torch.Tensor:
    """max(0, Σ_{v ∈ top-K of π_ref} π_ref(v)·(log π_ref(v) − log π(v))) per row of ``(N, V)``.

    Both log-softmaxes over the whole vocabulary, in at least float32; a top-K token with
    π_ref(v) = 0 (K above the reference's support) counts 0.
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)
    log_pi = torch.log_softmax(logits.to(dtype), dim=-1)
    log_ref = torch.log_softmax(ref_logits.to(dtype), dim=-1)
    top_ref, ids = log_ref.topk(min(topk, log_ref.shape[-1]), dim=-1)
    p_ref = top_ref.exp()
    diff = torch.where(p_ref > 0, top_ref - log_pi.gather(-1, ids), torch.zeros_like(top_ref))
    return (p_ref * diff).sum(-1).clamp_min(0.0)


def kl_forward_topk(
    logits: torch.Tensor,
    ref_logits: torch.Tensor,
    params: Optional[ForwardTopKParams] = None,
) -> torch.Tensor:
    """Forward KL(π_ref‖π) over the reference's top-K tokens, per position.

    Σ_{v ∈ top-K(π_ref)} π_ref(v)·(log π_ref(v) − log π(v)), clamped at 0 (the top-K mass
    is below 1, so the truncated sum can be negative), as verl's distillation loss
    ``forward_kl_topk`` (``compute_forward_kl_topk``; ``distillation_losses.clamp_min(0)``).
    Note the direction: the *reference's* distribution weights the terms (mass-covering),
    where ``full`` and the sampled-token estimators estimate KL(π‖π_ref). The gradient flows
    into ``logits`` through log π of the K tokens (a top-K token the policy gives zero
    probability makes it infinite, as it makes the true KL). Ties in the reference's top-K
    are broken by ``torch.topk``.

    :param logits: ``(B, T, V)`` policy logits (carry the gradient).
    :param ref_logits: ``(B, T, V)`` reference logits (detached).
    :return: ``(B, T)``, float32 (float64 for float64 logits).

    Chunked and checkpointed like :func:`kl_full`. Sources: GKD (Agarwal et al. 2024,
    arXiv:2306.13649) with the forward KL; verl ``trainer/distillation`` (verl 0.9.1). With
    ``kl.target=teacher`` ``ref_logits`` are the teacher's: verl's distillation loss itself
    (the teacher's top-K log-probs not renormalised, as verl; docs/algorithms/kl.md).
    """
    params = params or ForwardTopKParams()
    return _chunked_rows(_forward_topk_rows, logits, ref_logits, params.chunk_size, params.topk)


def _chunked_rows(fn: Callable[..., torch.Tensor], logits: torch.Tensor, ref_logits: torch.Tensor,
                  chunk_size: int, *args: Any) -> torch.Tensor:
    """``fn(chunk, chunk_ref, *args)`` over ``chunk_size`` rows of the flattened ``(B·T, V)``
    logits at a time, each chunk under non-reentrant ``torch.utils.checkpoint`` when grad is
    on (its log-softmaxes are recomputed in backward, never held for the whole batch).

    :return: ``(B, T)`` in at least float32.
    """
    batch, width, vocab = logits.shape
    flat = logits.reshape(batch * width, vocab)
    flat_ref = ref_logits.detach().reshape(batch * width, vocab)
    use_checkpoint = torch.is_grad_enabled() and flat.requires_grad
    rows = []
    for start in range(0, flat.shape[0], chunk_size):
        chunk, chunk_ref = flat[start:start + chunk_size], flat_ref[start:start + chunk_size]
        if use_checkpoint:
            rows.append(torch.utils.checkpoint.checkpoint(fn, chunk, chunk_ref, *args, use_reentrant=False))
        else:
            rows.append(fn(chunk, chunk_ref, *args))
    dtype = torch.promote_types(logits.dtype, torch.float32)
    if not rows:
        return torch.zeros(batch, width, dtype=dtype, device=logits.device)
    return torch.cat(rows).reshape(batch, width).to(dtype)


# ------------------------------------------------------------------ controllers


class FixedKLController:
    """β stays at its initial value. verl core_algos.FixedKLController.

    :param init_coef: β (``kl.coef``).
    :param params: unused (``fixed`` has no parameters).
    """

    def __init__(self, init_coef: float, params: Any = None) -> None:
        self.value: float = float(init_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


@dataclass
class AdaptiveKLParams:
    """Parameters of ``adaptive``.

    :ivar target: the KL (per sequence, as the engine measures it) β steers towards.
    :ivar horizon: samples over which a ±20 % error changes β by ±20 %.
    """

    target: float = 6.0
    horizon: int = 10000

    def __post_init__(self) -> None:
        if not self.target > 0:
            raise ValueError(f"target must be > 0, got {self.target}")
        if self.horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {self.horizon}")


class AdaptiveKLController:
    """Proportional controller of Ziegler et al. 2019 (arXiv:1909.08593, §2.2).

    e = clip(current_kl / target − 1, −0.2, 0.2);  β ← β·(1 + e·n_steps / horizon).
    Exactly verl core_algos.AdaptiveKLController (its ``np.clip`` of a finite float is the
    ``min``/``max`` here, without importing numpy for ``rlzoo list``; same update).

    :param init_coef: initial β (``kl.coef``).
    :param params: :class:`AdaptiveKLParams`.
    """

    def __init__(self, init_coef: float, params: Optional[AdaptiveKLParams] = None) -> None:
        params = params or AdaptiveKLParams()
        self.value: float = float(init_coef)
        self.target = float(params.target)
        self.horizon = int(params.horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Update β from the KL measured on the last batch of ``n_steps`` samples.

        :raises ValueError: ``current_kl`` is NaN or infinite (β would become NaN).
        """
        if not math.isfinite(float(current_kl)):
            raise ValueError(f"adaptive KL controller got a non-finite current_kl ({current_kl})")
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


# ------------------------------------------------------------------ registration


@hookimpl
def rlzoo_register_kl_estimators(register) -> None:
    register("k1", kl_k1, aliases=("kl",), paper=SCHULMAN_KL_BLOG,
             description="k1 = logp − ref_logp (unbiased, high variance)")
    register("abs", kl_abs, paper=SCHULMAN_KL_BLOG, description="|logp − ref_logp|")
    register("k2", kl_k2, aliases=("mse",), paper=SCHULMAN_KL_BLOG,
             description="k2 = ½(logp − ref_logp)² (unbiased gradient)")
    register("k3", kl_k3, aliases=("low_var_kl",), paper=SCHULMAN_KL_BLOG,
             description="k3 = exp(−x) + x − 1, clamped as verl low_var_kl (GRPO default)")
    register("k1+", kl_k1_plus, paper=SCHULMAN_KL_BLOG,
             description="value of k1, gradient of k2 (straight-through)")
    register("k3+", kl_k3_plus, paper=SCHULMAN_KL_BLOG,
             description="value of k3, gradient of k2 (straight-through)")
    register("full", kl_full, params=FullKLParams,
             description="exact KL over the vocabulary from both models' logits (chunked)")
    register("forward_topk", kl_forward_topk, params=ForwardTopKParams, paper="arXiv:2306.13649",
             description="forward KL(π_ref‖π) over the target's top-k tokens, clamped at 0 (verl's "
                         "forward_kl_topk; with kl.target=teacher: on-policy distillation, GKD)")


@hookimpl
def rlzoo_register_kl_controllers(register) -> None:
    register("fixed", FixedKLController, description="constant β = kl.coef")
    register("adaptive", AdaptiveKLController, params=AdaptiveKLParams, paper="arXiv:1909.08593",
             description="β tracks a target KL (Ziegler 2019 proportional controller)")
