"""The plugin contract of rlzoo: every hook a plugin can implement.

rlzoo's engine knows no algorithm. Advantage estimators, policy losses, KL penalties and
controllers, loss aggregations, value losses, reward functions, tasks, algorithm presets
and batch extensions are all contributed by plugins through the *registration hooks*
below, the built-in ones exactly like a third-party package's: both are found through the
``rlzoo`` entry-point group.

A registration hook receives a ``register`` callback and calls it once per component::

    from rlzoo import hookimpl

    @hookimpl
    def rlzoo_register_advantage_estimators(register):
        register("my_adv", my_adv, params=MyAdvParams,
                 description="...", paper="arXiv:2501.00000")

``register(name, fn, *, params=None, needs=(), description="", paper=None, aliases=(),
**meta)`` -- see :meth:`rlzoo.registry.Registry.add` for every argument. Two plugins
registering one name (or alias) of the same kind is an error that names both plugins.

The *lifecycle hooks* (``rlzoo_after_rollout`` ... ``rlzoo_run_end``) are called by the
engine on every plugin registered with the run's plugin manager. Standard lifecycle
behaviour (DAPO dynamic sampling, overlong shaping, ...) is packaged as *extensions*:
plugin objects registered by name and enabled per run from the config
(``extensions=[dynamic_sampling]``), so installing a package never changes a run that
did not ask for it.

``API_VERSION`` is the version of this contract. A plugin module may declare
``RLZOO_API_VERSION = "1"``; a plugin whose major version differs is refused at load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import pluggy

if TYPE_CHECKING:
    from rlzoo.batch import RolloutBatch
    from rlzoo.context import RunContext

PROJECT_NAME = "rlzoo"
API_VERSION = "1"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

Register = Callable[..., None]


# ---------------------------------------------------------------------------------------
# Registration hooks. Called once, when the registry is built (``rlzoo.plugins.
# build_registry``), in plugin registration order. Return value: ignored.
# ---------------------------------------------------------------------------------------


@hookspec
def rlzoo_register_advantage_estimators(register: Register) -> None:
    """Register advantage estimators (kind ``advantage``), e.g. ``gae``, ``grpo``.

    :param register: call ``register(name, fn, ...)`` once per estimator.

    The engine calls ``fn(token_rewards, response_mask, group_ids, values,
    baseline_scores, params=...)`` with

    - ``token_rewards``: ``(B, T)`` float, per-token rewards (outcome reward on the last
      valid token, KL-in-reward already folded in), zero on padding;
    - ``response_mask``: ``(B, T)`` float in {0, 1};
    - ``group_ids``: ``(B,)`` long, the prompt each sequence was sampled from;
    - ``values``: ``(B, T)`` critic values, or ``None`` unless ``needs`` has ``critic``;
    - ``baseline_scores``: ``(B,)`` score of the greedy completion of the same prompt, or
      ``None`` unless ``needs`` has ``greedy``;
    - ``params``: the component's parameter dataclass instance (when it declares one).

    It must return ``(advantages, returns)``, both ``(B, T)``, zero on padding.
    Estimators are pure tensor functions: no gradient flows through them.
    """


@hookspec
def rlzoo_register_policy_losses(register: Register) -> None:
    """Register policy losses (kind ``policy_loss``), e.g. ``ppo_clip``.

    :param register: call ``register(name, fn, ...)`` once per loss.

    The engine calls ``fn(logp, old_logp, advantages, response_mask, params=...)``,
    all ``(B, T)``; ``logp`` carries the gradient. It returns ``(loss, metrics)``: the
    per-token loss ``(B, T)`` (the engine aggregates it with the run's ``loss_agg``) and
    a dict of scalar tensors (at least ``clipfrac`` and ``approx_kl``).

    A loss whose formula only holds under one aggregation (GSPO, GMPO) registers with
    ``loss_agg="<mode>"``; the engine then uses that mode for it.
    """


@hookspec
def rlzoo_register_kl_penalties(register: Register) -> None:
    """Register KL estimators (kind ``kl_penalty``), e.g. ``k1``, ``k3``.

    :param register: call ``register(name, fn, ...)`` once per estimator.

    The engine calls ``fn(logp, ref_logp, params=...)`` with ``(B, T)`` log-probs of the
    sampled tokens and gets the per-token KL estimate ``(B, T)``. An estimator that needs
    the full distributions registers with ``needs=("logits",)`` and is called as
    ``fn(logp, ref_logp, logits=..., ref_logits=..., params=...)`` with ``(B, T, V)``
    logits.
    """


@hookspec
def rlzoo_register_kl_controllers(register: Register) -> None:
    """Register KL coefficient controllers (kind ``kl_controller``): ``fixed``, ``adaptive``.

    :param register: call ``register(name, cls, ...)``; ``cls(params)`` builds a
        controller with attribute ``value`` (current β), ``update(current_kl: float,
        n_steps: int) -> None`` and ``state_dict()`` / ``load_state_dict()`` for resume.
    """


@hookspec
def rlzoo_register_loss_aggregations(register: Register) -> None:
    """Register loss aggregation modes (kind ``loss_agg``), e.g. ``token-mean``.

    :param register: call ``register(name, fn, ...)`` once per mode.

    The engine calls ``fn(loss, mask, counts=..., params=...)`` with ``(B, T)`` tensors and
    gets a scalar. ``counts`` is a :class:`rlzoo.batch.BatchCounts` of the *global* batch
    (valid tokens, non-empty sequences, the configured max response length) so the sum of
    the results over micro-batches (and ranks) equals the mode computed on the whole
    batch; with ``counts=None`` the mode normalises by the given tensors alone.
    """


@hookspec
def rlzoo_register_value_losses(register: Register) -> None:
    """Register critic losses (kind ``value_loss``), e.g. ``clipped``.

    :param register: call ``register(name, fn, ...)``. The engine calls ``fn(values,
        old_values, returns, response_mask, params=...)`` (all ``(B, T)``) and gets
        ``(loss, metrics)``: per-token loss ``(B, T)`` and scalar-tensor metrics.
    """


@hookspec
def rlzoo_register_reward_functions(register: Register) -> None:
    """Register reward functions (kind ``reward``), e.g. ``sorted_digits``.

    :param register: call ``register(name, fn, ...)``. The engine calls ``fn(prompts,
        completions, references, params=...)`` with three lists of equal length ``B``
        (prompt text, decoded completion text, the task's reference answer) and expects
        ``B`` finite floats (a list or a ``(B,)`` tensor).
    """


@hookspec
def rlzoo_register_tasks(register: Register) -> None:
    """Register tasks (kind ``task``): prompt sources with their default reward.

    :param register: call ``register(name, factory, ...)``; ``factory(params)`` returns a
        :class:`rlzoo.tasks.Task`. Pass ``reward="<reward name>"`` as meta to name the
        task's default reward function.
    """


@hookspec
def rlzoo_register_algorithms(register: Register) -> None:
    """Register algorithm presets (kind ``algorithm``), chosen with ``algo=NAME``.

    :param register: call ``register(name, preset, ...)`` where ``preset`` is a mapping
        (or a path to a YAML file) of config keys; it is merged over the defaults and
        under the user's ``--config`` file and CLI overrides.
    """


@hookspec
def rlzoo_register_extensions(register: Register) -> None:
    """Register extensions (kind ``extension``): lifecycle plugins enabled per run.

    :param register: call ``register(name, cls, ...)``. When a run lists the name in
        ``extensions``, the engine builds ``cls(params)`` and registers that object with
        the run's plugin manager, so its lifecycle hook implementations are called.
    """


# ---------------------------------------------------------------------------------------
# Lifecycle hooks, called by the trainer on every registered plugin, every step.
# ---------------------------------------------------------------------------------------


@hookspec
def rlzoo_after_rollout(batch: "RolloutBatch", ctx: "RunContext") -> "RolloutBatch | None":
    """Called after generation and scoring, before KL, reference or critic passes.

    :param batch: the scored rollout (``batch.scores`` holds the raw task scores).
    :param ctx: the run context (config, step, a ``resample`` callable for refills,
        ``ctx.metrics`` to add metrics to this step's log).
    :return: a replacement batch (filtered or reshaped), or ``None`` to keep it. Each
        implementation receives the previous one's result.
    """


@hookspec
def rlzoo_shape_rewards(batch: "RolloutBatch", ctx: "RunContext") -> None:
    """Called once the batch is final (after every ``rlzoo_after_rollout``), before the
    reference, critic and KL passes and the advantages.

    :param batch: modify ``batch.rewards`` ``(B,)`` in place (e.g. DAPO's overlong
        penalty). ``batch.scores`` keeps the raw task scores, which filters and logging use.
    :param ctx: the run context.
    """


@hookspec
def rlzoo_before_update(batch: "RolloutBatch", ctx: "RunContext") -> None:
    """Called after advantages are computed, just before the update epochs.

    :param batch: the batch with advantages and returns; may be modified in place
        (e.g. ``batch.loss_mask`` to exclude tokens from the policy loss).
    :param ctx: the run context.
    """


@hookspec
def rlzoo_step_end(step: int, metrics: dict[str, float], ctx: "RunContext") -> None:
    """Called at the end of every training step, before logging.

    :param step: the step just finished (1-based).
    :param metrics: the step's metrics; add entries to log them under their key.
    :param ctx: the run context.
    """


@hookspec
def rlzoo_run_end(ctx: "RunContext", status: str) -> None:
    """Called once when the run ends.

    :param ctx: the run context.
    :param status: ``"completed"``, ``"interrupted"`` or ``"failed"``.
    """


REGISTRATION_HOOKS: dict[str, str] = {
    "advantage": "rlzoo_register_advantage_estimators",
    "policy_loss": "rlzoo_register_policy_losses",
    "kl_penalty": "rlzoo_register_kl_penalties",
    "kl_controller": "rlzoo_register_kl_controllers",
    "loss_agg": "rlzoo_register_loss_aggregations",
    "value_loss": "rlzoo_register_value_losses",
    "reward": "rlzoo_register_reward_functions",
    "task": "rlzoo_register_tasks",
    "algorithm": "rlzoo_register_algorithms",
    "extension": "rlzoo_register_extensions",
}
"""Component kind -> the registration hook that contributes it."""

KIND_TITLES: dict[str, str] = {
    "advantage": "Advantage estimators",
    "policy_loss": "Policy losses",
    "kl_penalty": "KL penalties",
    "kl_controller": "KL controllers",
    "loss_agg": "Loss aggregations",
    "value_loss": "Value losses",
    "reward": "Reward functions",
    "task": "Tasks",
    "algorithm": "Algorithm presets",
    "extension": "Extensions",
}

