"""The one module plugin authors import: rlzoo's public surface for plugins.

Everything a plugin module, a plugin's tests or the guides (docs/plugins.md,
docs/agents.md, docs/reward-models.md, docs/tasks.md) need is importable from here::

    from rlzoo.api import hookimpl, masked_mean, RolloutBatch, Task, Example

The surface is versioned with the plugin API (:data:`API_VERSION`): a name listed here
keeps its meaning within a major version; where rlzoo's modules live behind it is not part
of the contract and may change in any release. The standard plugins in ``plugins/`` import
rlzoo only through this module (``tests/test_layers.py`` fails otherwise), exactly as a
third-party package does.

Names are resolved on first use, so ``import rlzoo.api`` costs nothing until a name is
taken: ``from rlzoo.api import hookimpl`` imports the hook contract only, not torch.
"""

from __future__ import annotations

import importlib
from typing import Any

SURFACE: dict[str, tuple[str, ...]] = {
    # the hook contract
    "rlzoo.contract.hookspecs": ("hookimpl", "hookspec", "API_VERSION", "INPUTS", "KIND_TITLES",
                                 "REGISTRATION_HOOKS"),
    "rlzoo.contract.kinds": ("KINDS", "Kind", "Input"),
    "rlzoo.contract.loading": ("make_plugin_manager", "build_registry", "load_registry", "module_plugin",
                               "PluginManager"),
    "rlzoo.contract.registry": ("Registry", "Component"),
    "rlzoo.config.params": ("build_params",),
    "rlzoo.config.preset_cards": ("read_card_file",),
    # errors
    "rlzoo.core.errors": ("RlzooError", "ConfigError", "UnknownComponentError", "PluginError",
                          "DuplicateComponentError", "RefusedComponentError", "TrainingError", "did_you_mean"),
    # tensors: masked reductions, ratios, batches, tokens, data parallelism
    "rlzoo.core.masked": ("masked_sum", "masked_mean", "masked_var", "masked_whiten"),
    "rlzoo.core.ratios": ("LOG_RATIO_CLAMP", "clamped_exp"),
    "rlzoo.core.batch": ("RolloutBatch", "BatchCounts", "Generation"),
    "rlzoo.core.tokens": ("left_pad", "position_ids_from_mask"),
    "rlzoo.core.distributed": ("batch_sum", "batch_statistics"),
    "rlzoo.core.dtypes": ("DTYPES",),
    # torch's no-grad decorator, without importing torch when the plugin is (rlzoo list stays fast)
    "rlzoo.core.deferred": ("no_grad",),
    # child processes a plugin spawns (the vllm rollout engine): stop signals, dying with the parent
    "rlzoo.core.stopping": ("STOP_SIGNALS", "die_with_parent"),
    # tasks
    "rlzoo.tasks.task": ("Task", "Example", "Holdout", "FileTask"),
    # agents: environments, tools, episodes
    "rlzoo.agents.environment": ("Environment", "StepResult"),
    "rlzoo.contract.tool_schema": ("Tool", "tool_from_callable", "function_schema"),
    "rlzoo.agents.tool_calls": ("ToolCall", "call_tool", "parse_tool_calls", "tool_call_style", "STYLES"),
    "rlzoo.agents.episodes": ("replay", "COUNT_COLUMNS"),
    # models: the decode loop rollout backends share, dtypes, reward models
    "rlzoo.models.decode": ("generate",),
    "rlzoo.models.reward_model": ("Reduce", "RunningMoments", "encode", "is_reward_model_dir", "load_reward_model",
                                  "reward_text", "score_ids", "uses_chat_template", "context_length", "cut_warning",
                                  "fit_context", "tokenizer_dir"),
    # what lifecycle hooks are passed
    "rlzoo.run.context": ("RunContext",),
    # the plugin test kit
    "rlzoo.testing.component_checks": ("check_component", "check_policy_loss", "check_advantage_estimator",
                                       "check_kl_estimator", "check_loss_aggregation", "check_value_loss",
                                       "check_rollout_correction", "check_task", "check_reward", "check_preset",
                                       "CHECKED_KINDS"),
    "rlzoo.testing.tool_checks": ("check_tool",),
    "rlzoo.testing.env_checks": ("check_environment",),
}
"""Module -> the public names it provides. One table: ``__all__``, name lookup and the
deprecated old import paths (:mod:`rlzoo.compat`) all read it."""

HOME: dict[str, str] = {name: module for module, names in SURFACE.items() for name in names}
"""Public name -> the module it lives in."""

__all__ = sorted(HOME)


def __getattr__(name: str) -> Any:
    """Import the public ``name`` from its module on first use (PEP 562)."""
    module = HOME.get(name)
    if module is None:
        raise AttributeError(f"rlzoo.api has no name {name!r}; the public surface: {', '.join(__all__)}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
