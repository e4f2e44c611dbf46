"""The plugin contract of rlzoo: every hook a plugin can implement.

rlzoo's engine knows no algorithm. Advantage estimators, policy losses, KL estimators and
controllers, loss aggregations, value losses, reward functions, tasks, rollout backends,
algorithm presets, tools and batch extensions are all contributed by plugins through the
*registration hooks* below, the built-in ones exactly like a third-party package's: both
are found through the ``rlzoo`` entry-point group.

A registration hook receives a ``register`` callback and calls it once per component::

    from rlzoo.api import hookimpl
    @hookimpl
    def rlzoo_register_advantage_estimators(register):
        register("my_adv", my_adv, params=MyAdvParams,
                 description="...", paper="arXiv:2501.00000")

``register(name, fn, *, params=None, needs=(), description="", paper=None, aliases=(),
retired_aliases=None, **meta)``: see :meth:`rlzoo.contract.registry.Registry.add`. A ``params``
dataclass may define ``warnings(self) -> list[str]``: lines the run plan lists as warnings
for values it accepts but that likely mislead. Two plugins
registering one name (or alias) of the same kind is an error that names both plugins.

**Inputs are passed by name.** The engine calls every component with keyword arguments
and passes exactly the inputs its function (or class) names, the way pluggy calls hook
implementations: ``def grpo(token_rewards, response_mask, group_ids, params)`` receives
those four. :data:`INPUTS` lists, per kind, every input the engine provides. Naming an
input is how a component asks for it: an advantage estimator that names ``values`` makes
the run build a critic, one that names ``baseline_scores`` a greedy rollout, a loss that
names ``ref_logp`` a reference model (the *needs* derived from the signature; see
``rlzoo list``). The signature is checked when the component registers: a parameter that
is not an input of its kind (and has no default, or has one but is named like an input:
``group_id``), ``*args`` / ``**kwargs``, or a declared ``needs`` entry whose inputs the
function never takes is an error naming the plugin, and a did-you-mean for a misspelt input.
Such a component is *refused*: it is not registered (the plugin's other components are),
and :func:`rlzoo.contract.loading.build_registry` raises
:class:`rlzoo.core.errors.RefusedComponentError`, so no run starts until it is fixed or its
plugin is skipped (docs/plugins.md, "Loading, and how to control it").
Outputs are checked on every call: a wrong shape or a missing required metric stops the
run with the component and its package named.

The *lifecycle hooks* (``rlzoo_after_rollout`` ... ``rlzoo_run_end``) are called through
pluggy on every plugin registered with the run's plugin manager (``RLZOO_TRACE_HOOKS=1``
shows each call). Several implementations of one lifecycle hook run in pluggy's order:
``tryfirst`` ones first, ``trylast`` ones last, otherwise the most recently registered
plugin first. The engine registers a run's extensions after every other plugin and in
reverse list order, so extensions run first, in the order ``extensions=[...]`` lists them;
then the ``plugins=[...]`` modules (the last listed first); then installed entry-point
plugins. Lifecycle hooks return nothing: they modify the batch (or the metrics) in place,
so each implementation sees what the previous ones did.

Standard lifecycle behaviour (DAPO dynamic sampling, overlong shaping, ...) is packaged as
*extensions*: plugin objects registered by name and enabled per run from the config
(``extensions=[dynamic_sampling]``), so installing a package never changes a run that did
not ask for it.

The ``rlzoo_`` prefix is reserved for hook implementations: a plugin with a function or
method of that name that matches no hook below, or one not marked ``@hookimpl``, is
refused with the plugin named (a misspelt hook would otherwise be ignored silently).

``API_VERSION`` is the version of this contract and of the import surface plugins use
(:mod:`rlzoo.api`). A plugin module may declare ``RLZOO_API_VERSION = "2"``; a plugin whose
major version differs is refused at load. Version 2.1 (rlzoo's modules in layer folders):
plugins import from :mod:`rlzoo.api` only; the 2.0 import paths still work with a
deprecation warning until version 3 (:mod:`rlzoo.compat`).
Version 2 (rlzoo 0.2): inputs by name; ``rlzoo_after_rollout`` modifies the batch in
place instead of returning a replacement; rollout backends; rollout log-probs
(``rollout_logp``) for policy losses; the ``kl_estimator`` config key is ``kl.estimator``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import pluggy

from rlzoo.contract.kinds import KINDS, Input

if TYPE_CHECKING:
    from rlzoo.core.batch import RolloutBatch
    from rlzoo.run.context import RunContext

PROJECT_NAME = "rlzoo"
API_VERSION = "2.1"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

Register = Callable[..., None]


INPUTS: dict[str, dict[str, Input]] = {kind.name: kind.inputs for kind in KINDS.values()}
"""Kind -> input name -> :class:`rlzoo.contract.kinds.Input`: every keyword the engine passes to a
component of that kind (besides ``params``, the component's parameter dataclass instance);
derived from :data:`rlzoo.contract.kinds.KINDS`, where each kind's inputs are documented."""


# ---------------------------------------------------------------------------------------
# Registration hooks. Called once, when the registry is built (``rlzoo.contract.loading.
# build_registry``), plugin by plugin in registration order. Return value: ignored.
# ---------------------------------------------------------------------------------------


@hookspec
def rlzoo_register_advantage_estimators(register: Register) -> None:
    """Register advantage estimators (kind ``advantage``), e.g. ``gae``, ``grpo``.

    :param register: call ``register(name, fn, ...)`` once per estimator.

    The engine calls ``fn(**inputs, params=...)`` with the inputs ``fn`` names from
    ``INPUTS["advantage"]``: ``token_rewards``, ``response_mask``, ``group_ids``,
    ``values`` (a critic), ``baseline_scores`` (a greedy rollout), ``old_logp``,
    ``ref_logp``, ``reward_scores`` / ``reward_weights`` (each reward function's scores and
    weight, e.g. ``gdpo``), ``teacher_logp`` (a teacher model, e.g. ``opd``),
    ``sum_pi_squared`` (Σ_v π_old(v)² per token, e.g. ``optimal_token_baseline``). It must
    return ``(advantages, returns)``, both ``(B, T)`` float, zero on padding. Estimators
    are pure tensor functions: no gradient flows through them, and no state is kept between
    calls (with a KL folded into the reward the engine calls one a second time a step, on the
    task reward alone, to log the KL's share of the advantages: ``kl/grad_share``). Under
    torchrun they see this process's whole groups and run inside
    ``rlzoo.core.distributed.batch_statistics()``.
    """


@hookspec
def rlzoo_register_policy_losses(register: Register) -> None:
    """Register policy losses (kind ``policy_loss``), e.g. ``ppo_clip``.

    :param register: call ``register(name, fn, ...)`` once per loss.

    The engine calls ``fn(**inputs, params=...)`` with the inputs ``fn`` names from
    ``INPUTS["policy_loss"]``: ``logp`` (carries the gradient), ``old_logp``,
    ``advantages``, ``response_mask``, ``rollout_logp``, ``ref_logp``,
    ``correction_weights``; all ``(B, T)``. The engine multiplies the per-token loss by the
    rollout correction's weights, unless the loss names ``correction_weights`` and folds
    them in itself (a per-sequence loss: ``geo_mean`` takes their geometric mean).
    It returns ``(loss, metrics)``: the per-token loss ``(B, T)`` (the engine aggregates
    it with the run's ``loss_agg``) and a dict of detached scalar tensors with at least
    ``clipfrac`` and ``approx_kl``.

    A loss whose formula is defined under one aggregation only (GSPO, GMPO) registers with
    ``loss_agg="<mode>"``; a run that configures another ``loss_agg`` is refused.
    """


@hookspec
def rlzoo_register_rollout_corrections(register: Register) -> None:
    """Register rollout corrections (kind ``rollout_correction``), e.g. ``tis``, ``icepop``.

    :param register: call ``register(name, fn, ...)`` once per correction.

    A correction reweights the per-token policy loss for the gap between μ, the
    distribution the rollout backend sampled from, and the trained policy. The engine calls
    ``fn(**inputs, params=...)`` with the inputs ``fn`` names from
    ``INPUTS["rollout_correction"]`` (``old_logp``, ``rollout_logp``, ``logp`` (detached),
    ``advantages``, ``response_mask``; all ``(B, T)``) and gets ``(weights, metrics)``:
    ``weights`` ``(B, T)`` multiply the per-token policy loss (detached; 0 drops a token,
    and it stays in the aggregation's denominator), and ``metrics`` is a dict of detached
    scalars logged as ``rollout_correction/<name>/<key>``: exactly the ones it returns (rlzoo
    computes no metric for it, and it receives no other correction's). A correction that names ``logp``
    is called in every update micro-batch, and so is one that names ``old_logp`` under
    ``trainer.old_logp=rollout`` (verl's bypass: it gets the current policy's log-probs,
    detached, as ``old_logp``); any other once per step over the whole batch
    before the mini-batches (its full reductions, e.g. ``rlzoo.core.masked.masked_mean``, are
    over every process's batch). ``response_mask`` is the loss mask the earlier corrections
    of ``rollout_correction=[...]`` left. A parameter dataclass with a field ``mode`` set to
    ``"mask"`` asks the engine to remove the tokens it weights 0 from the loss mask
    (verl's rejection), which changes the aggregation's denominators.
    """


@hookspec
def rlzoo_register_kl_estimators(register: Register) -> None:
    """Register KL estimators (kind ``kl_estimator``, config key ``kl.estimator``), e.g. ``k3``.

    :param register: call ``register(name, fn, ...)`` once per estimator.

    The engine calls ``fn(**inputs, params=...)`` with the inputs ``fn`` names from
    ``INPUTS["kl_estimator"]``: ``logp``, ``ref_logp`` (``(B, T)`` log-probs of the sampled
    tokens), or ``logits`` and ``ref_logits`` (``(B, T, V)``, only for ``kl.apply=loss``),
    and gets the per-token KL estimate ``(B, T)``.
    """


@hookspec
def rlzoo_register_kl_controllers(register: Register) -> None:
    """Register KL coefficient controllers (kind ``kl_controller``): ``fixed``, ``adaptive``.

    :param register: call ``register(name, cls, ...)``. The engine builds
        ``cls(init_coef=kl.coef, params=...)`` (each if named): an object with attribute
        ``value`` (the current beta), ``update(current_kl: float, n_steps: int) -> None``
        (called once per step with the batch's mean per-sequence KL sum and the global
        number of sequences, only for ``kl.apply=reward``) and ``state_dict()`` /
        ``load_state_dict(state)`` of plain values for resume.
    """


@hookspec
def rlzoo_register_loss_aggregations(register: Register) -> None:
    """Register loss aggregation modes (kind ``loss_agg``), e.g. ``token-mean``.

    :param register: call ``register(name, fn, ...)`` once per mode.

    The engine calls ``fn(loss=..., mask=..., counts=..., params=...)`` (the ones ``fn``
    names) once per update micro-batch with its ``(B, T)`` tensors (the mask is ``loss_mask``,
    or ``response_mask`` for the value loss) and sums the scalars. ``counts`` is a
    :class:`rlzoo.core.batch.BatchCounts` of the whole mini-batch over every micro-batch and
    rank, and all the mode learns of it: the mask's valid tokens, its non-empty sequences and
    ``max_response_length``, the *configured* ``rollout.max_new_tokens`` (not the longest
    response); no other batch-wide number is passed or computable here
    (``rlzoo.core.distributed.batch_sum`` is local in the update). So the sum of the results
    equals the mode computed on the whole mini-batch; with ``counts=None`` the mode
    normalises by the given tensors alone.
    """


@hookspec
def rlzoo_register_value_losses(register: Register) -> None:
    """Register critic losses (kind ``value_loss``), e.g. ``clipped``.

    :param register: call ``register(name, fn, ...)``. The engine calls ``fn(values=...,
        old_values=..., returns=..., response_mask=..., params=...)`` (all ``(B, T)``;
        those ``fn`` names) and gets ``(loss, metrics)``: per-token loss ``(B, T)`` and a
        dict of detached scalar tensors.
    """


@hookspec
def rlzoo_register_reward_functions(register: Register) -> None:
    """Register reward functions (kind ``reward``), e.g. ``sorted_digits``.

    :param register: call ``register(name, fn, ...)``. The engine calls ``fn(prompts=...,
        completions=..., references=..., rows=..., params=...)`` (those ``fn`` names) with
        lists of equal length ``B`` (prompt text, decoded completion text, the task's
        reference answer, the example's data row as a dict) and expects ``B`` finite floats
        (a list or a ``(B,)`` tensor). Evaluation calls it the same way on held-out prompts.

        ``fn`` may be a *scorer class* (a learned reward model, a judge): its constructor
        may name ``params`` and the setup inputs ``device`` and ``tokenizer``
        (:attr:`rlzoo.contract.kinds.Kind.setup_inputs`); the engine builds it once per run and calls
        the instance as above. Optional: ``describe(params) -> str`` (static; the plan's line,
        its ``ValueError`` refuses the config), ``state_dict()`` / ``load_state_dict()``
        (checkpointed), ``metrics()`` (logged each step), a ``training`` attribute the
        engine sets (``False`` for evaluation and greedy baselines).

        A function that names ``answers`` also gets the answer the run's ``answer_format``
        finds in each completion (``None`` where it finds none).
    """


@hookspec
def rlzoo_register_answer_formats(register: Register) -> None:
    """Register answer formats (kind ``answer_format``), e.g. ``answer_tag``.

    :param register: call ``register(name, fn, hint="...", ...)``. The engine calls
        ``fn(text=completion)`` and expects ``list[str]``: every answer-like span of the
        completion in order of appearance (the run's answer is the last; none found: ``[]``).
        ``hint`` is the sentence ``{format}`` stands for in ``task.instruction``.
    """


@hookspec
def rlzoo_register_tasks(register: Register) -> None:
    """Register tasks (kind ``task``): prompt sources with their default reward.

    :param register: call ``register(name, factory, ...)``; ``factory(params=...)`` (or
        ``factory()`` without parameters) returns a :class:`rlzoo.tasks.task.Task`: it implements
        ``sample(n, rng) -> list[Example]`` drawing only from ``rng`` (a ``random.Random``);
        the engine holds out a share of its prompts for evaluation (``Task.sample_train``,
        ``Task.eval_set``; docs/tasks.md). Pass ``reward="<reward name>"`` as meta to name
        the task's default reward function.
    """


@hookspec
def rlzoo_register_environments(register: Register) -> None:
    """Register environments (kind ``environment``, config key ``env``): the other side of
    multi-turn episodes (docs/agents.md).

    :param register: call ``register(name, factory, params=..., ...)``. The engine builds
        ``factory(params=..., **inputs)`` once per episode, with the inputs it names from
        ``INPUTS["environment"]`` (``tools``: a ``dict[str, rlzoo.api.Tool]``, every registered
        tool by name; ``tool_style``: the tool-call format of the run's rendering, ``hermes`` or
        ``plain``), and gets an :class:`rlzoo.api.Environment`: ``reset(example) -> list[message]``
        (the first messages), ``step(completion) -> rlzoo.api.StepResult`` (observations, a
        per-turn reward or ``None``, ``done``, tool-call counts) and the attribute ``tools`` (the
        ``Tool`` objects whose schemas the chat template shows; ``()`` by default). The engine
        owns tokens and masks: environment tokens never enter a loss.
    """


@hookspec
def rlzoo_register_rollout_backends(register: Register) -> None:
    """Register rollout backends (kind ``rollout``, config key ``rollout.backend``).

    :param register: call ``register(name, factory, ...)``. The engine builds
        ``factory(**inputs, params=...)`` with the inputs it names from
        ``INPUTS["rollout"]`` (``policy``, ``tokenizer``, ``device``, ``dtype``,
        ``generation_context``, ``role``) and gets a backend with

        - ``generate(prompt_ids, *, num_samples, max_new_tokens, temperature, top_p,
          greedy=False) -> rlzoo.core.batch.Generation``: ``prompt_ids`` is a list of token-id
          lists (one per prompt, unpadded, chat template already applied); the result holds
          ``num_samples`` completions per prompt, prompt-major: ``response_ids`` and
          ``response_mask`` ``(B·n, T)`` right-padded (the mask covers EOS), ``logp``
          ``(B·n, T)`` float32, the log-prob of each sampled token under the distribution
          actually sampled from (after temperature and top-p; 0 on padding), and
          ``truncated`` ``(B·n,)`` bool (no EOS within the budget). Sampling must draw
          from torch's global RNG or its own seeded one, so runs are reproducible;
        - ``sync_weights(named_weights) -> None``: called after each update (the last
          optimizer step of a training step; nothing generates in between) with a callable
          returning ``(name, tensor)`` pairs of the policy's current weights (gathered
          whole under FSDP only when called); the trainer logs its time as
          ``timing/weight_sync_s``;
        - optionally ``close() -> None``: release what the backend holds beyond the run's
          models (an engine process); the trainer calls it when the run ends.

        ``role`` says what the backend generates in its process: ``trainer`` (rollout.mode=sync),
        ``generator`` (rollout.mode=async's generator process, while the trainer updates) or
        ``evaluator`` (the trainer under rollout.mode=async: evaluation only).

        ``register(..., plan=fn)`` lets a backend describe itself in the run plan:
        ``fn(cfg, params, world) -> str`` is called when the config is checked, returns the
        plan's ``models: rollout`` line and raises ``ConfigError`` for what it cannot run
        (the ``vllm`` backend: docs/design.md, "Rollout backends").
    """


@hookspec
def rlzoo_register_tools(register: Register) -> None:
    """Register tools (kind ``tool``): Python callables a policy calls by name in a
    multi-turn episode, e.g. ``calculator``.

    :param register: call ``register(name, fn, *, unsafe=False, timeout_s=5.0,
        memory_mb=512, examples=(), description="")``. ``fn``'s parameters are the tool's
        arguments, written by the model: each needs a type hint (``int``, ``float``,
        ``str``, ``bool``, ``list[...]``, ``dict[str, ...]``, ``Literal[...]``,
        ``Optional[...]``), and its Google-style docstring gives the description (first
        paragraph) and each argument's (``Args:``). The OpenAI function schema is built from
        them when the tool registers (:func:`rlzoo.contract.tool_schema.tool_from_callable`; a hint JSON
        cannot express is an error naming the plugin); ``fn`` may also be a ready
        :class:`rlzoo.contract.tool_schema.Tool` with a hand-written schema. ``fn`` returns the
        observation: a ``str``, or a value shown as JSON. An exception, a timeout
        (``timeout_s``) or arguments that do not fit the schema become an error observation
        the model reads. ``unsafe=True`` (code execution, anything that can hang or exhaust
        memory) runs each call in a child process, killed after ``timeout_s`` seconds, whose
        address space may grow by ``memory_mb`` MiB; ``fn`` must then be a module-level
        function. ``examples`` are argument dicts the testing kit calls the tool with
        (:func:`rlzoo.api.check_component`).
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
        ``extensions``, the engine builds ``cls(params=...)`` (or ``cls()``) and registers
        that object with the run's plugin manager, so its ``@hookimpl`` methods are called
        for that run only. ``needs`` declares what the extension reads from the batch
        (``entropy``: ``batch.old_entropy``; ``reference``: ``batch.ref_logp``; ...).
        Optional ``state_dict()`` / ``load_state_dict(state)`` of plain values are saved in
        checkpoints.
    """


# ---------------------------------------------------------------------------------------
# Lifecycle hooks, called through pluggy on every registered plugin, every step, in this
# order. The order of several implementations of one hook: see the module docstring.
# ---------------------------------------------------------------------------------------


@hookspec
def rlzoo_after_rollout(batch: "RolloutBatch", ctx: "RunContext") -> None:
    """Called after generation and scoring, before KL, reference or critic passes.

    :param batch: the scored rollout (``batch.scores`` holds the raw task scores). Filter
        or refill it in place: ``batch.keep(rows)``, ``batch.extend(other)`` (e.g. with
        ``ctx.resample(n_prompts)``), or ``batch.copy_from(other)``; the next
        implementation sees the result.
    :param ctx: the run context (config, plan, step, ``resample``, ``metrics``, ...).
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


REGISTRATION_HOOKS: dict[str, str] = {kind.name: kind.hook for kind in KINDS.values()}
"""Component kind -> the registration hook that contributes it (from :data:`rlzoo.contract.kinds.KINDS`)."""

LIFECYCLE_HOOKS: tuple[str, ...] = (
    "rlzoo_after_rollout", "rlzoo_shape_rewards", "rlzoo_before_update", "rlzoo_step_end", "rlzoo_run_end",
)
"""The lifecycle hooks, in the order a step calls them."""

KIND_TITLES: dict[str, str] = {kind.name: kind.title for kind in KINDS.values()}
"""Component kind -> its heading in ``rlzoo list`` (from :data:`rlzoo.contract.kinds.KINDS`)."""
