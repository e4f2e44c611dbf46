"""The component kinds: one record per kind, the single source every kind-keyed table derives from.

A *kind* is an axis along which algorithms differ (advantage estimators, policy losses,
...). Its :class:`Kind` record says everything rlzoo needs to know about it: the
registration hook that contributes components of the kind, its title in ``rlzoo list``,
the config key that chooses one, the inputs the engine passes (by name), the shape of its
output (checked at every call by :mod:`rlzoo.contract.checks`), the metrics that output must hold,
the docs page listing every component of the kind, and where its contract is tested.

Adding a kind is one record here, one hook specification in :mod:`rlzoo.contract.hookspecs` and,
if the kind has invariants a plugin author can check, one entry in :mod:`rlzoo.testing`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class Input(NamedTuple):
    """One input the engine passes to components of a kind.

    :ivar need: the need naming this input implies (what the engine must build or run to
        provide it), or ``None`` when it is always available.
    :ivar doc: what it is: shape, dtype, units.
    """

    need: str | None
    doc: str


OUTPUTS = ("advantages_returns", "loss_metrics", "weights_metrics", "kl", "scalar")
"""The output contracts :mod:`rlzoo.contract.checks` checks: ``(advantages, returns)``, ``(per-token
loss, metrics)``, ``(per-token weights, metrics)``, a per-token KL, a scalar."""


@dataclass(frozen=True)
class ListRules:
    """How a config key lists several components of one kind (``reward=[a, {name: b, weight:
    0.5}]``, ``extensions=[...]``): :mod:`rlzoo.config.layers` resolves every such list by
    these rules, one path for every kind.

    :ivar path: the config key that holds the list.
    :ivar noun: what one item is, in messages (``"reward function"``).
    :ivar nonempty: ``[]`` is refused (a run needs at least one).
    :ivar skip_null: a ``null`` item is skipped (else refused).
    :ivar weighted: an item may carry ``weight`` (1.0 unless given; finite, not all 0),
        recorded beside its parameters; a single choice given a weight is refused.
    :ivar none_name: the component that means "none of these": alone it lists nothing, beside
        others it is refused (``""``: no such component).
    :ivar reserved: names refused because rlzoo logs its own metrics as ``<path>/<name>``.
    :ivar once: why a component may be listed only once (``""``: it may repeat).
    """

    path: str
    noun: str
    nonempty: bool = False
    skip_null: bool = False
    weighted: bool = False
    none_name: str = ""
    reserved: tuple[str, ...] = ()
    once: str = ""


@dataclass(frozen=True)
class Kind:
    """A component kind.

    :ivar name: the kind's name (``rlzoo list --kind NAME``, ``Component.kind``).
    :ivar hook: the registration hook that contributes components of this kind.
    :ivar title: its heading in ``rlzoo list``.
    :ivar config_path: the config key that chooses one component of this kind (a name or a
        mapping with ``name`` and parameters), or ``None`` when the config chooses them
        otherwise (``algo=`` for presets, ``extensions=[...]``).
    :ivar inputs: input name -> :class:`Input`: every keyword the engine passes to a
        component of the kind (besides ``params``, its parameter dataclass instance).
    :ivar output: the output contract checked at every call (one of :data:`OUTPUTS`), or
        ``None`` when the kind returns objects the engine uses directly (tasks, backends).
    :ivar required_metrics: metric keys the output's metrics dict must hold.
    :ivar listing: how the config lists several components of the kind (:class:`ListRules`),
        or ``None`` when it chooses one at most.
    :ivar setup_inputs: input name -> :class:`Input` for a component registered as a *class*
        (a stateful scorer): its constructor may name these and ``params``; it is built once
        per run, and its instances are called with :attr:`inputs` (empty: the kind takes no
        classes of that sort).
    :ivar docs: the docs page that lists every built-in component of the kind.
    :ivar tested_in: where the kind's contract is exercised: ``rlzoo.testing`` (its
        invariant checks, which plugin authors run too) or the test module that does.
    """

    name: str
    hook: str
    title: str
    config_path: str | None
    output: str | None
    docs: str
    tested_in: str
    inputs: dict[str, Input] = field(default_factory=dict)
    required_metrics: tuple[str, ...] = ()
    listing: ListRules | None = None
    setup_inputs: dict[str, Input] = field(default_factory=dict)

    @property
    def takes_list(self) -> bool:
        """``config_path`` also takes a list of choices (``reward=[a, b]``)."""
        return self.listing is not None and self.listing.path == self.config_path


_MASK = "(B, T) float in {0, 1}: 1 on the tokens the loss covers (the batch's loss_mask)"

KINDS: dict[str, Kind] = {kind.name: kind for kind in (
    Kind(
        name='advantage', hook='rlzoo_register_advantage_estimators', title='Advantage estimators',
        config_path='advantage', output='advantages_returns',
        docs='docs/algorithms/advantages.md', tested_in='rlzoo.testing',
        inputs={
            "token_rewards": Input(None, "(B, T) float: per-token rewards, the outcome reward on the last "
                                         "valid token, KL-in-reward already folded in; 0 on padding"),
            "response_mask": Input(None, "(B, T) float in {0, 1}: 1 on the response tokens"),
            "group_ids": Input(None, "(B,) long: the prompt each sequence was sampled from (any values)"),
            "values": Input("critic", "(B, T) float: critic values of the rollout, 0 on padding"),
            "baseline_scores": Input("greedy", "(B,) float: score of the greedy completion of the same prompt"),
            "old_logp": Input("old_logp", "(B, T) float: log-probs of the sampled tokens under the policy "
                                          "before this step's update (tempered like the sampler)"),
            "ref_logp": Input("reference", "(B, T) float: log-probs of the sampled tokens under the frozen "
                                           "reference model"),
            "reward_scores": Input(None, "(B, K) float: each reward function's raw score (column k is reward[k]; "
                                         "K = 1 with one function), before weighting, shaping and KL; an "
                                         "estimator that reads it instead of token_rewards refuses KL in the "
                                         "reward and reward shaping"),
            "reward_weights": Input(None, "(K,) float: the weights of the reward functions (reward[k].weight)"),
            "teacher_logp": Input("teacher", "(B, T) float: log-probs of the sampled tokens under the teacher model "
                                             "(teacher.path; tempered like the sampler)"),
            "sum_pi_squared": Input("sum_pi_squared", "(B, T) float: Σ_v π_old(v)² over the vocabulary at each "
                                                      "response position (π_old tempered like the sampler), 0 on "
                                                      "padding"),
        }),
    Kind(
        name='policy_loss', hook='rlzoo_register_policy_losses', title='Policy losses',
        config_path='policy_loss', output='loss_metrics', required_metrics=('clipfrac', 'approx_kl'),
        docs='docs/algorithms/policy_losses.md', tested_in='rlzoo.testing',
        inputs={
            "logp": Input(None, "(B, T) float: log-probs of the sampled tokens under the policy being "
                                "trained; carries the gradient"),
            "old_logp": Input(None, "(B, T) float: log-probs under the policy before this step's update "
                                    "(the detached logp when the plan runs one on-policy update)"),
            "advantages": Input(None, "(B, T) float: the advantage estimator's output"),
            "response_mask": Input(None, _MASK),
            "rollout_logp": Input(None, "(B, T) float: log-probs of the sampled tokens under the "
                                        "distribution the rollout backend actually sampled from "
                                        "(after temperature and top-p)"),
            "ref_logp": Input("reference", "(B, T) float: log-probs under the frozen reference model"),
            "correction_weights": Input(None, "(B, T) float >= 0, detached: the product of the rollout "
                                              "corrections' per-token weights, or None without a correction. A loss "
                                              "that names this input folds them into its own formula (a "
                                              "per-sequence loss: geo_mean) and the engine does not multiply its "
                                              "per-token loss by them"),
        }),
    Kind(
        name='rollout_correction', hook='rlzoo_register_rollout_corrections', title='Rollout corrections',
        config_path='rollout_correction', output='weights_metrics',
        listing=ListRules('rollout_correction', 'correction', none_name='none',
                          once="each correction's metrics are logged as rollout_correction/<name>/..., so list "
                               "each once"),
        docs='docs/algorithms/corrections.md', tested_in='rlzoo.testing',
        inputs={
            "old_logp": Input("old_logp", "(B, T) float: log-probs under π_old, the trained policy before this "
                                          "step's update (the plan runs the old-log-prob pass); with "
                                          "trainer.old_logp=rollout (bypass) the current policy's, detached, in "
                                          "each update micro-batch"),
            "rollout_logp": Input(None, "(B, T) float: log-probs under μ, the distribution the rollout backend "
                                        "sampled from"),
            "logp": Input(None, "(B, T) float: log-probs under the policy being trained, detached"),
            "advantages": Input(None, "(B, T) float: the advantage estimator's output"),
            "response_mask": Input(None, _MASK),
        }),
    Kind(
        name='kl_estimator', hook='rlzoo_register_kl_estimators', title='KL estimators',
        config_path='kl.estimator', output='kl',
        docs='docs/algorithms/kl.md', tested_in='rlzoo.testing',
        inputs={
            "logp": Input(None, "(B, T) float: log-probs of the sampled tokens under the policy (the "
                                "policy being trained, or the rollout-time policy for KL in the reward)"),
            "ref_logp": Input("reference", "(B, T) float: log-probs under the frozen reference model"),
            "logits": Input("logits", "(B, T, V) float: the policy's tempered logits at the response "
                                      "positions (only with kl.apply=loss)"),
            "ref_logits": Input("logits", "(B, T, V) float: the reference model's tempered logits"),
        }),
    Kind(
        name='kl_controller', hook='rlzoo_register_kl_controllers', title='KL controllers',
        config_path='kl.controller', output=None,
        docs='docs/algorithms/kl.md', tested_in='tests/test_kl.py (hand-computed controllers, resume)',
        inputs={
            "init_coef": Input(None, "float: the initial coefficient beta (kl.coef)"),
        }),
    Kind(
        name='loss_agg', hook='rlzoo_register_loss_aggregations', title='Loss aggregations',
        config_path='loss_agg', output='scalar',
        docs='docs/algorithms/aggregation.md', tested_in='rlzoo.testing',
        inputs={
            "loss": Input(None, "(B, T) float: a per-token loss"),
            "mask": Input(None, _MASK),
            "counts": Input(None, "rlzoo.core.batch.BatchCounts of the global (mini-)batch: valid tokens, "
                                  "non-empty sequences, the configured max response length"),
        }),
    Kind(
        name='value_loss', hook='rlzoo_register_value_losses', title='Value losses',
        config_path='value_loss', output='loss_metrics',
        docs='docs/algorithms/value.md', tested_in='rlzoo.testing',
        inputs={
            "values": Input(None, "(B, T) float: current critic values; carry the gradient"),
            "old_values": Input(None, "(B, T) float: critic values at rollout time"),
            "returns": Input(None, "(B, T) float: the advantage estimator's returns (value targets)"),
            "response_mask": Input(None, "(B, T) float in {0, 1}: 1 on the response tokens"),
        }),
    Kind(
        name='reward', hook='rlzoo_register_reward_functions', title='Reward functions',
        config_path='reward', output=None,
        listing=ListRules('reward', 'reward function', nonempty=True, weighted=True,
                          reserved=('mean', 'std', 'max', 'shaped_mean'),
                          once="each reward function is logged as reward/<name>, so list each once (register a "
                               "second function for other parameters)"),
        docs='docs/tasks.md', tested_in='rlzoo.testing',
        inputs={
            "prompts": Input(None, "list[str] of B prompts (as the task wrote them)"),
            "completions": Input(None, "list[str] of B decoded completions"),
            "references": Input(None, "list of B reference answers (the task's Example.reference)"),
            "rows": Input(None, "list of B dicts: the rest of each example's data row (Example.row; a file "
                                "task's whole row, every column; {} for the generated built-in tasks)"),
            "answers": Input(None, "list of B: the answer the run's answer_format finds in each completion "
                                   "(str), None where it finds none; the completion itself under the "
                                   "default answer_format=plain"),
        },
        setup_inputs={
            "device": Input(None, "torch.device the run's models live on (a scorer class's model goes there)"),
            "tokenizer": Input(None, "the policy's tokenizer (a reward model reads decoded text with its own)"),
        }),
    Kind(
        name='answer_format', hook='rlzoo_register_answer_formats', title='Answer formats',
        config_path='answer_format', output=None,
        docs='docs/tasks.md', tested_in='tests/test_answers.py (hand-written completions, strict and lenient)',
        inputs={
            "text": Input(None, "str: one decoded completion; returns list[str], every answer-like span in "
                                "order (the answer is the last)"),
        }),
    Kind(
        name='task', hook='rlzoo_register_tasks', title='Tasks',
        config_path='task', output=None,
        docs='docs/tasks.md', tested_in='rlzoo.testing',
        inputs={}),
    Kind(
        name='environment', hook='rlzoo_register_environments', title='Environments (multi-turn)',
        config_path='env', output=None,
        docs='docs/agents.md', tested_in='rlzoo.testing',
        inputs={
            "tools": Input(None, "dict[str, rlzoo.api.Tool]: every registered tool (kind tool) by name; an "
                                 "environment offers the ones its parameters name"),
            "tool_style": Input(None, "str: the tool-call format the run's rendering teaches, for "
                                      "rlzoo.api.parse_tool_calls: 'hermes' (a chat template with <tool_call>) "
                                      "or 'plain' (no chat template, or one without that tool format)"),
        }),
    Kind(
        name='rollout', hook='rlzoo_register_rollout_backends', title='Rollout backends',
        config_path='rollout.backend', output=None,
        docs='docs/design.md', tested_in='tests/test_engine_units.py (log-probs of the sampled tokens, masks, sync)',
        inputs={
            "policy": Input(None, "the policy being trained (a transformers causal LM, unwrapped)"),
            "tokenizer": Input(None, "the policy's tokenizer"),
            "device": Input(None, "torch.device the policy lives on"),
            "dtype": Input(None, "str: rollout.dtype, the precision to generate in ('float32', ...)"),
            "generation_context": Input(None, "callable returning a context manager within which the "
                                              "policy's weights are whole (a no-op unless FSDP shards them)"),
            "role": Input(None, "str: what this process's backend generates: 'trainer' (rollout.mode=sync: the "
                                "training batches, between updates), 'generator' (rollout.mode=async's generator "
                                "process: the training batches, while the trainer updates) or 'evaluator' (the "
                                "trainer under rollout.mode=async: evaluation only)"),
        }),
    Kind(
        name='tool', hook='rlzoo_register_tools', title='Tools',
        config_path=None, output=None,
        docs='docs/agents.md', tested_in='rlzoo.testing',
        inputs={}),
    Kind(
        name='algorithm', hook='rlzoo_register_algorithms', title='Algorithm presets',
        config_path=None, output=None,
        docs='docs/algorithms/presets.md', tested_in='rlzoo.testing',
        inputs={}),
    Kind(
        name='extension', hook='rlzoo_register_extensions', title='Extensions',
        config_path=None, output=None, listing=ListRules('extensions', 'extension', skip_null=True),
        docs='docs/algorithms/extensions.md', tested_in='tests/test_extensions.py',
        inputs={}),
)}
"""Kind name -> :class:`Kind`, in ``rlzoo list`` order."""

COMPONENT_FIELDS: dict[str, str] = {kind.config_path: kind.name for kind in KINDS.values() if kind.config_path}
"""Config path -> component kind, for every config key that chooses a component."""

LIST_FIELDS: tuple[str, ...] = tuple(kind.config_path for kind in KINDS.values() if kind.takes_list)
"""Component paths that also take a list of choices (``reward=[{name: a, weight: 1.0}, ...]``)."""

LISTS: dict[str, Kind] = {kind.listing.path: kind for kind in KINDS.values() if kind.listing is not None}
"""Config key holding a list of components -> their kind: the keys that also take a single
choice (:data:`LIST_FIELDS`) and ``extensions``, which takes only a list."""
