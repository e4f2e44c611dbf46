"""Building a run's parts: one way, used by ``rlzoo train``, the asynchronous generator, ``rlzoo sft`` and ``rlzoo rm``.

A run is built from its :class:`rlzoo.plan.run_input.RunInput` in one order, the seed first::

    seed → task → models (the policy) → rollout backend → rewards → prompt format → sampler

:class:`RunParts` builds each part once, on first use, from the plan and the bound
components, and from the parts before it; a command takes the parts it needs (``rlzoo sft``:
the task, the policy and the prompt format; ``rlzoo rm``: the task and the reward
functions), and the order of the random draws is the same wherever a part is built.
The trainer supplies its own models (the policy with its reference, critic and teacher,
loaded from a checkpoint when resuming: :func:`rlzoo.models.build.build_run_models`).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Callable

import torch

from rlzoo.agents.environment import Environment
from rlzoo.agents.episodes import environment_factory
from rlzoo.contract.checks import BoundComponent, BuiltComponent, build_rewards
from rlzoo.core.errors import ConfigError
from rlzoo.core.rng import seed_everything
from rlzoo.models.build import RunModels, build_policy
from rlzoo.models.logprobs import ResponseForward
from rlzoo.plan.run_input import RunInput
from rlzoo.plan.settings import ComputePlan
from rlzoo.rollout.sampler import Sampler
from rlzoo.rollout.scoring import Rewards
from rlzoo.tasks.prompts import PromptFormat
from rlzoo.tasks.task import Task


def device_type(compute: ComputePlan) -> str:
    """The device type a run computes on (``trainer.device``; ``auto``: ``cuda`` when
    available), after setting torch's threads (``trainer.threads``, 0 keeps torch's choice).

    :raises ConfigError: ``cuda`` asked for and not available.
    """
    if compute.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA device is available")
    if compute.threads:
        torch.set_num_threads(compute.threads)
    if compute.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return compute.device


class RunParts:
    """The parts of the run ``run``, each built once, on first use (see the module docstring).

    :param run: the engine's input.
    :param device: where the models, the rollout and the batches live.
    :param seed: seeds every RNG before anything is built (default: the run's ``seed``).
    :param models: builds the run's models from the task (the trainer's); default: the
        policy alone (:func:`rlzoo.models.build.build_policy`), on ``device``.
    :param generator: the parts of ``rollout.mode=async``'s generator process (the backend's
        ``role`` input is then ``generator``).
    """

    def __init__(self, run: RunInput, device: torch.device, seed: int | None = None,
                 models: Callable[[Task], RunModels] | None = None, generator: bool = False) -> None:
        self.run, self.plan, self.device = run, run.plan, device
        self.generator = generator
        self._build_models = models
        seed_everything(run.setup.seed if seed is None else seed)

    @cached_property
    def task(self) -> Task:
        """The task, built from its bound component."""
        return self.run.components.task.construct()

    @property
    def task_name(self) -> str:
        """The task's name (``task.name``)."""
        return self.run.components.task.name

    @cached_property
    def models(self) -> RunModels:
        """The run's models: the policy and its tokenizer (and, for the trainer, the rest)."""
        if self._build_models is not None:
            return self._build_models(self.task)
        policy, tokenizer = build_policy(self.plan.model, self.task, self.task_name)
        policy.to(self.device)
        return RunModels(policy=policy, tokenizer=tokenizer, policy_forward=ResponseForward(policy))

    @cached_property
    def backend(self) -> Any:
        """The rollout backend the plan names, over the policy."""
        models, rollout = self.models, self.plan.rollout
        return rollout.backend.construct(policy=models.policy, tokenizer=models.tokenizer, device=self.device,
                                         dtype=rollout.dtype, generation_context=models.generation_context,
                                         role=self.role)

    @property
    def role(self) -> str:
        """What this process's rollout backend generates (the ``role`` input of kind ``rollout``)."""
        if self.plan.rollout.mode != "async":
            return "trainer"
        return "generator" if self.generator else "evaluator"

    def reward_functions(self, **setup: Any) -> list[tuple[BoundComponent | BuiltComponent, float]]:
        """The reward functions with their weights, scorer classes built from ``setup``
        (``rlzoo rm`` scores its pairs with them before it has a tokenizer)."""
        return build_rewards(list(self.run.components.rewards), **setup)

    @cached_property
    def rewards(self) -> Rewards:
        """The reward functions (scorers on the run's device, with the policy's tokenizer),
        the answer format and every registered one (for lenient scoring)."""
        return Rewards.of(self.run.components, device=self.device, tokenizer=self.models.tokenizer)

    @cached_property
    def prompt_format(self) -> PromptFormat:
        """How a prompt becomes the model's text (``plan.prompt``)."""
        return PromptFormat.of(self.plan.prompt)

    @cached_property
    def environment(self) -> Callable[[], Environment] | None:
        """Builds one environment per episode (``env``), or ``None``."""
        components = self.run.components
        return environment_factory(components.environment, components.tools, self.models.tokenizer,
                                   self.prompt_format)

    def sampler(self, stream: int | str) -> Sampler:
        """The sampler over the parts above; ``stream`` seeds its prompt RNG."""
        backend, rewards, prompt_format = self.backend, self.rewards, self.prompt_format
        return Sampler(self.task, rewards, self.models.tokenizer, backend, self.plan, self.device, stream,
                       prompt_format, self.environment)
