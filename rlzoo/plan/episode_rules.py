"""The run plan's part for multi-turn episodes (``env``): what an episode is and what cannot
work with one, decided before anything is built (:func:`rlzoo.plan.planner.build_plan` calls it).

An episode's response holds environment tokens the policy never sampled. Components that read
only the loss mask and one score per sequence work unchanged (every policy loss, aggregation,
rollout correction, KL as a loss term, group-relative estimators); those that would read
per-token quantities over the whole response, environment tokens included, are refused here
with the reason.
"""

from __future__ import annotations

from rlzoo.core.errors import ConfigError
from rlzoo.plan.records import EpisodePlan
from rlzoo.config.resolved import ResolvedConfig
from rlzoo.contract.tool_schema import registered_tools

REFUSED_NEEDS: dict[str, str] = {
    "critic": "a critic's values and value loss would cover the environment tokens of the response "
              "(GAE does not yet skip masked steps)",
    "greedy": "the greedy baseline is a single-turn rollout, not an episode",
    "teacher": "teacher log-probs would be taken over environment tokens the policy never sampled",
}
"""A need -> why no component of an episode run may have it."""

PER_TOKEN_INPUTS = ("old_logp", "ref_logp", "teacher_logp", "sum_pi_squared")
"""Advantage inputs that are per-token log-prob quantities over the whole response."""


def episode_plan(resolved: ResolvedConfig, needs: set[str], kl_on: bool, world: int = 1) -> EpisodePlan | None:
    """The episode plan of a run with ``env`` set (``None`` without) on ``world`` processes.

    :raises ConfigError: a component or setting that cannot work over episodes, naming it and why.
    """
    cfg = resolved.cfg
    env = resolved.components.get("env")
    if env is None:
        return None
    where = f"env={env.name!r}"
    for need, why in REFUSED_NEEDS.items():
        if need in needs:
            users = sorted(f"{c.kind} {c.name}" for c in resolved.components.values() if need in c.needs)
            raise ConfigError(f"{where} cannot run with {', '.join(users) or need}: {why}; choose another "
                              "component (e.g. advantage=grpo or rloo)")
    advantage = resolved.components["advantage"]
    per_token = [name for name in PER_TOKEN_INPUTS if name in advantage.inputs]
    if per_token:
        raise ConfigError(f"{where} cannot run with advantage {advantage.name!r}: it reads {', '.join(per_token)} "
                          "per token over the response, which holds environment tokens the policy never sampled; "
                          "use a sequence-score estimator (grpo, dr_grpo, rloo, reinforce_pp_baseline, ...)")
    if "reward_scores" in advantage.inputs and "token_rewards" not in advantage.inputs:
        raise ConfigError(f"{where} cannot run with advantage {advantage.name!r}: it reads each reward function's "
                          "raw scores and would ignore the environment's per-turn rewards")
    if kl_on and cfg.kl.apply == "reward":
        raise ConfigError(f"{where} cannot run with kl.apply=reward: the per-token KL would be added to the rewards "
                          "of environment tokens too; use kl.apply=loss (it counts the policy's tokens only)")
    if world > 1 and cfg.distributed.strategy == "fsdp":
        raise ConfigError(f"{where} cannot run with distributed.strategy=fsdp on {world} processes: each rank plays "
                          "its episodes for as many turns as they last, so the ranks would gather the sharded "
                          "policy's weights for generation (a collective) a different number of times; use "
                          "distributed.strategy=ddp")
    turns, turn_tokens = int(cfg.rollout.max_turns), int(cfg.rollout.max_turn_tokens)
    if turn_tokens > int(cfg.rollout.max_new_tokens):
        raise ConfigError(f"rollout.max_turn_tokens={turn_tokens} exceeds rollout.max_new_tokens="
                          f"{cfg.rollout.max_new_tokens}, the budget of a whole episode: raise max_new_tokens "
                          "(it bounds policy and environment tokens together)")
    check_builds(resolved)
    return EpisodePlan(env=env.name, max_turns=turns, max_turn_tokens=turn_tokens)


def check_builds(resolved: ResolvedConfig) -> None:
    """Build the run's environment once, with every registered tool and the ``plain``
    tool-call style, and drop it: a parameter only its constructor can check (a tool name
    that is not registered) is refused with the config, before any run directory exists.
    An environment is built per episode anyway, so this costs what one episode's start does.

    :raises ConfigError: what the constructor raised (a ``ValueError`` / ``OSError`` naming
        ``env`` and the environment).
    """
    resolved.build("env", tools=registered_tools(resolved.registry), tool_style="plain")

