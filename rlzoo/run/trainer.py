"""The trainer: builds a run from its plan and orchestrates the steps.

One step, data flowing downhill::

    sampler.sample ─▶ rlzoo_after_rollout ─▶ rlzoo_shape_rewards ─▶ learner.prepare
      ─▶ rlzoo_before_update ─▶ learner.update ─▶ backend.sync_weights ─▶ rlzoo_step_end

Where each concern lives: the plan (:mod:`rlzoo.plan.planner`), the models
(:func:`rlzoo.models.build.build_run_models`), sampling and scoring (:mod:`rlzoo.rollout.sampler`), the
losses and optimizer steps (:mod:`rlzoo.learn.learner`), the run directory and checkpoints
(:mod:`rlzoo.run.rundir`), the hook-facing context (:mod:`rlzoo.run.context`).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch

from rlzoo.core import distributed, processes
from rlzoo.run.async_generator import AsyncRollout, GeneratorSpec, to_bytes
from rlzoo.core.batch import RolloutBatch
from rlzoo.run.checkpoint import STATE_FILE, check_optimizer_fits, first_non_finite
from rlzoo.run.context import RunContext
from rlzoo.diagnostics.watch import Watch
from rlzoo.core.errors import ConfigError, TrainingError, say
from rlzoo.core.tags import Tag
from rlzoo.run.evaluation import Evaluator, eval_only
from rlzoo.core.events import read_scalars
from rlzoo.learn.learner import Learner
from rlzoo.learn.micro_batches import check_micro_batch_tokens
from rlzoo.models.build import build_run_models, build_tokenizer
from rlzoo.models.hf_output import transformers_output
from rlzoo.models.head import fast_paths
from rlzoo.models.model_check import report
from rlzoo.contract.loading import PluginManager
from rlzoo.rollout.staleness import RolloutQueue
from rlzoo.core.rng import global_rng_state, set_global_rng_state
from rlzoo.run.rundir import RunDirectory, in_sweep
from rlzoo.run.summary import next_steps, summary_line
from rlzoo.plan.run_input import RunInput
from rlzoo.run.parts import RunParts, device_type
from rlzoo.core.stopping import StopRequest
from rlzoo.tasks.answer_lengths import answer_token_lengths, check_budget
from rlzoo.tasks.prompts import PromptFormat
from rlzoo.tasks.task import Holdout, check_encodable, check_references, checked_examples
from rlzoo.run.tracking import Progress, Sample, Tracker, batch_metrics, group_samples

class Trainer:
    """One RL run: ``Trainer(run, pm).run()`` (``run``: :class:`rlzoo.plan.run_input.RunInput`); see :func:`train`.

    Construction claims the run directory (:class:`rlzoo.run.rundir.RunDirectory`: creates and
    locks it, or refuses it) and builds everything the plan asks for (with ``resume=``,
    loading the checkpoint); the run's files are written from :meth:`run` on.
    ``overwrite``: a new run may delete another run's files in its directory first.
    """

    def __init__(self, run: RunInput, pm: PluginManager, overwrite: bool = False) -> None:
        self.run_input, self.pm, self.plan = run, pm, run.plan
        device_kind = device_type(self.plan.compute)
        compute = self.plan.compute
        self.dist = distributed.init(compute.backend, device_kind, compute.timeout_s)
        self.device = (torch.device(device_kind, self.dist.local_rank) if device_kind == "cuda"
                       and self.dist.enabled else torch.device(device_kind))
        # other programs' load before this run computes (its own ranks would count as other work under torchrun)
        busy = (processes.busy_cores() if self.device.type == "cpu" and torch.get_num_threads() > 1
                and not self.dist.enabled else None)
        self.run_dir = RunDirectory(run.setup.run_dir, run.setup.resume, self.dist, overwrite)
        try:
            self._build(pm)
        except BaseException:
            self.run_dir.close()
            raise
        self.thread_record = None  # CPU runs share cores: warn when their threads oversubscribe them
        if self.device.type == "cpu":
            self.thread_record = processes.register(torch.get_num_threads())
            warning = processes.oversubscription(torch.get_num_threads())
            if warning is None:
                warning = processes.machine_busy(torch.get_num_threads(), busy)
            if warning and self.dist.is_main:
                say(f"rlzoo: warning: {warning}")

    def _build(self, pm: PluginManager) -> None:
        """Everything after the run directory is claimed: models, sampler, learner, state
        (the parts in :class:`rlzoo.run.parts.RunParts`' order)."""
        resume_state = self.run_dir.load_state() if self.run_dir.resume_from is not None else None
        if resume_state is not None and int(resume_state["world_size"]) != self.dist.world:
            raise ConfigError(f"{self.run_dir.resume_from} was written by {resume_state['world_size']} "
                              f"process(es); resume it with the same number (this job has {self.dist.world})")
        seed, components = self.run_input.setup.seed, self.run_input.components
        parts = RunParts(self.run_input, self.device, models=lambda task: build_run_models(
            self.plan, task, components.task.name, self.device, self.dist, self.run_dir.resume_from,
            self.run_dir.init_model))
        task = parts.task
        if self.plan.update.micro_batch_tokens is not None:  # before the models: refused, nothing is built
            self._check_micro_batch_tokens(task, parts.task_name)
        readers = [repr(bound.name) for bound, _ in components.rewards if "references" in bound.component.inputs]
        use = f"reward {' and '.join(readers)} compares completions with them (0 whatever the policy writes)"
        for warning in check_references(task, parts.task_name, use if readers else None):
            if self.dist.is_main:
                say(f"rlzoo: warning: {warning}")
        self.models = parts.models
        if self.dist.is_main:
            for name, check in self.models.checks.items():  # the embedded tiny model: nothing to say
                report(name, check, summary=bool(self.plan.model.path) or name != "policy")
        if self.dist.rank:
            torch.manual_seed(seed + 1_000_003 * self.dist.rank)  # distinct rollouts per rank
        # rank 0 draws the prompts a single process draws; other ranks their own streams
        self.sampler = parts.sampler(seed if self.dist.rank == 0 else f"{seed}/rank{self.dist.rank}")
        self.answer_tokens = [] if self.plan.episodes is not None else \
            answer_token_lengths(task, self.models.tokenizer, self.sampler.holdout)
        for warning in [*check_encodable(task, parts.task_name, self.models.tokenizer, self.sampler.holdout),
                        *check_budget(self.answer_tokens, self.plan.rollout.max_new_tokens, parts.task_name)]:
            if self.dist.is_main:
                say(f"rlzoo: warning: {warning}")
        self.evaluator = Evaluator.build(self.plan.eval, task, parts.task_name, self.sampler, self.dist)
        self.learner = Learner(self.plan, self.run_input.components, self.models, self.dist)
        self.generator: AsyncRollout | None = None  # rollout.mode=async: started by run()
        resample = self.sampler.sample if self.plan.rollout.mode == "sync" else _no_resample
        self.ctx = RunContext(cfg=self.run_input.setup.hook_config, plan=self.plan, run_dir=self.run_dir.path,
                              resample=resample, prompts=self.plan.rollout.prompts_per_process)
        self.extensions = [(extension.name, extension()) for extension in self.run_input.components.extensions]
        pm.register_run_extensions(self.extensions)
        self.queue = RolloutQueue(self.plan.rollout.staleness)
        self.step = 0
        self.last_samples: list[Sample] = []
        self.watch: Watch | None = None  # rank 0 with logging.doctor: set by run()
        if resume_state is not None:
            self._restore(resume_state)

    def _check_micro_batch_tokens(self, task: Any, task_name: str) -> None:
        """Refuse a ``trainer.micro_batch_tokens`` below the run's longest sequence: the
        longest prompt among the task's probe examples (:func:`rlzoo.tasks.task.checked_examples`)
        as the rollout encodes it, + ``rollout.max_new_tokens``."""
        tokenizer = build_tokenizer(self.plan.model, task, task_name)
        holdout = Holdout(self.plan.eval.holdout)
        lengths = [len(ids) for ids in PromptFormat.of(self.plan.prompt).encode(checked_examples(task, holdout),
                                                                                tokenizer)]
        check_micro_batch_tokens(self.plan.update.micro_batch_tokens, max(lengths, default=1),
                                 self.plan.rollout.max_new_tokens)

    # ---------------------------------------------------------------- one step

    def train_step(self) -> dict[str, float]:
        """Run one training step (rollout → update) and return its metrics; no logging,
        checkpointing or ``rlzoo_step_end`` (:meth:`run` does those)."""
        self.step += 1
        self.ctx.step = self.step
        self.ctx.metrics, self.ctx.counts = {}, {}
        start = time.perf_counter()
        if self.generator is None:
            with distributed.failing_together(self.dist):  # a reward or rollout failing on one rank stops them all
                batch, staleness = self.queue.next(self.step, self.plan.cadence.total_steps, self._produce)
            self.sampler.rewards.settle(lambda values: distributed.sum_floats(values, self.dist))  # once a step
        else:  # rollout.mode=async: one process (refused under torchrun)
            batch, staleness = self._receive()
        batch = batch.to(self.device)
        rollout_s = time.perf_counter() - start
        if self.plan.record:
            self.run_dir.record_rollout(self.step, batch)
        metrics = batch_metrics(batch, self.sampler.rewards.names, self.dist, self.sampler.rewards.weights.tolist())
        metrics.update(distributed.all_reduce_floats(self.sampler.rewards.metrics(), self.dist, op="mean"))
        self.last_samples = group_samples(batch)
        update_start = time.perf_counter()
        metrics.update(self.learn(batch))
        self._check_weights()
        sync_start = time.perf_counter()
        self.sampler.backend.sync_weights(self.models.policy_weights)
        sync_s = time.perf_counter() - sync_start
        if self.generator is not None and self.step % self.plan.rollout.weight_sync_every == 0:
            self.generator.publish(self.step, self.models.policy_weights())
        update_s = time.perf_counter() - update_start
        tokens = distributed.all_reduce_floats(
            {"tokens": float(batch.response_mask.sum() + batch.prompt_mask.sum())}, self.dist)["tokens"]
        metrics.setdefault("kl/value", 0.0)
        metrics["kl/coef"] = float(self.learner.kl_controller.value) if self.plan.kl else 0.0
        metrics["lr"] = float(self.learner.scheduler.get_last_lr()[0])
        metrics["rollout/staleness"] = float(staleness)
        metrics["timing/rollout_s"] = rollout_s
        metrics["timing/update_s"] = update_s
        metrics["timing/weight_sync_s"] = sync_s
        metrics["timing/step_s"] = time.perf_counter() - start
        metrics["throughput/tokens_per_s"] = tokens / max(metrics["timing/step_s"], 1e-9)
        metrics.update(distributed.all_reduce_floats(self.ctx.metrics, self.dist, op="mean"))
        metrics.update(distributed.all_reduce_floats(self.ctx.counts, self.dist, op="sum"))
        return metrics

    def _produce(self) -> RolloutBatch:
        """Generate and score one batch with the current policy, through the rollout
        lifecycle hooks (``rlzoo_after_rollout``, ``rlzoo_shape_rewards``): what the
        rollout queue holds (:mod:`rlzoo.rollout.staleness`)."""
        batch = self.sampler.sample(self.ctx.prompts)
        self.pm.hook.rlzoo_after_rollout(batch=batch, ctx=self.ctx)
        self.pm.hook.rlzoo_shape_rewards(batch=batch, ctx=self.ctx)
        return batch

    def _receive(self) -> tuple[RolloutBatch, int]:
        """rollout.mode=async: the generator's next batch within the version bound, through
        the rollout lifecycle hooks here (the extensions and their state live in the
        trainer); the sampler mirrors the generator's prompt position, for checkpoints."""
        received = self.generator.next(self.step)
        batch, staleness = received.batch, received.staleness
        self.sampler.load_state_dict(received.sampler_state)
        self.ctx.metrics["rollout/dropped"] = float(received.dropped)
        self.ctx.metrics["rollout/beyond_bound"] = float(staleness > self.plan.rollout.max_staleness)
        self.ctx.metrics["timing/generator_reload_s"] = received.reload_s
        self.pm.hook.rlzoo_after_rollout(batch=batch, ctx=self.ctx)
        self.pm.hook.rlzoo_shape_rewards(batch=batch, ctx=self.ctx)
        return batch, staleness

    def _start_generator(self) -> None:
        """rollout.mode=async: start the generator process from this step's weights and
        prompt position (a resume regenerates the batches that were waiting)."""
        if (self.plan.rollout.mode != "async" or self.generator is not None
                or self.step >= self.plan.cadence.total_steps):
            return
        if self.dist.enabled:
            raise ConfigError("rollout.mode=async is not supported under torchrun: use rollout.mode=sync")
        spec = GeneratorSpec(config_yaml=self.run_input.setup.config_yaml, device=str(self.device),
                             threads=torch.get_num_threads(), seed=self.run_input.setup.seed + 7919 * (self.step + 1),
                             sampler_state=to_bytes(self.sampler.state_dict()), parent=os.getpid(),
                             paths=fast_paths(self.models.policy), transformers_output=transformers_output())
        self.generator = AsyncRollout(self.plan.rollout, spec, self.models.policy_weights(), self.step)
        if self.dist.is_main:
            print(f"rlzoo: rollout generator process started (pid {self.generator.pid}, rollout.mode=async)",
                  flush=True)

    def learn(self, batch: RolloutBatch) -> dict[str, float]:
        """Everything after scoring on this process's share of the global batch: the plan's
        passes, KL, advantages, ``rlzoo_before_update``, the optimizer steps. Fills
        ``batch`` and returns the metrics (averaged over all ranks)."""
        metrics = self.learner.prepare(batch)
        self.pm.hook.rlzoo_before_update(batch=batch, ctx=self.ctx)
        metrics.update(self.learner.update(batch))
        return metrics

    def _check_weights(self) -> None:
        """:raises TrainingError: the update left a NaN or inf weight, or a rank's learner
        found a non-finite value the gradient check let through (on any rank: one all-reduce)."""
        trained = {"policy": self.models.policy, "critic": self.models.critic}
        bad = first_non_finite({name: model for name, model in trained.items() if model is not None})
        failure = self.learner.failure or (f"non-finite weights after the update of step {self.step} ({bad})"
                                           if bad is not None else None)
        if not self.dist.enabled and failure is not None:
            raise TrainingError(f"{failure}; the run stopped before any checkpoint of this step, the newest one stays "
                                "resumable")
        if distributed.all_reduce_floats({"bad": float(failure is not None)}, self.dist, "max")["bad"]:
            distributed.raise_failures(failure, self.dist)

    def evaluate(self, step: int) -> dict[str, float]:
        """Evaluate on the held-out prompts (a collective) and write the per-prompt record;
        returns the ``eval/...`` metrics."""
        metrics = self.evaluator.run(step)
        examples = self.evaluator.examples
        self.run_dir.record_evaluation(self.evaluator.record, [e.prompt for e in examples],
                                       [e.reference for e in examples])
        return metrics

    # ---------------------------------------------------------------- checkpoints

    def _state(self) -> dict[str, Any]:
        """Everything but the weights; a collective (every rank calls it)."""
        rng = {**global_rng_state(), "sampler": self.sampler.state_dict(), "ctx_state": dict(self.ctx.state),
               "queue": self.queue.state_dict()}
        return {"step": self.step, "world_size": self.dist.world,
                "ranks": distributed.gather_objects(rng, self.dist), "learner": self.learner.state_dict(),
                "extensions": {name: plugin.state_dict() for name, plugin in self.extensions
                               if hasattr(plugin, "state_dict")}}

    def _restore(self, state: dict[str, Any]) -> None:
        where = self.run_dir.resume_from / STATE_FILE
        try:
            self.step = int(state["step"])
            self.learner.load_state_dict(state["learner"])
            for optimizer in (self.learner.optimizer, self.learner.critic_optimizer):
                check_optimizer_fits(optimizer, where)
            rng = state["ranks"][self.dist.rank]
            set_global_rng_state(rng)
            self.sampler.load_state_dict(rng["sampler"])
            self.ctx.state.update(rng["ctx_state"])
            if "queue" in rng:
                self.queue.load_state_dict(rng["queue"])
            for name, plugin in self.extensions:
                if name in state["extensions"] and hasattr(plugin, "load_state_dict"):
                    plugin.load_state_dict(state["extensions"][name])
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
            raise ConfigError(f"{where} does not fit this run ({type(exc).__name__}: {exc}); was it written by "
                              "another run?") from exc
        if self.step > self.plan.cadence.total_steps:
            raise ConfigError(f"trainer.total_steps={self.plan.cadence.total_steps} is below the step of "
                              f"{self.run_dir.resume_from.name}; resume with trainer.total_steps >= {self.step}")

    def save(self) -> None:
        """Write a checkpoint of this step (a collective: every rank calls it; rank 0 writes)."""
        models, state = self.models.saveable(), self._state()
        self.run_dir.save_checkpoint(self.step, models, state, keep=self.plan.cadence.checkpoint_keep)

    # ---------------------------------------------------------------- the loop

    def run(self) -> dict[str, float]:
        """Train for ``trainer.total_steps`` steps; returns the last step's metrics."""
        cadence, setup, main = self.plan.cadence, self.run_input.setup, self.dist.is_main
        if self.run_dir.resume_from is None:
            with self.run_dir.starting():  # a start that fails leaves the directory as it was
                self.run_dir.start(setup.config_yaml, self.plan.render(), self.models.saveable_initial(),
                                   self.models.tokenizer)
                self.save()  # step 0: from here on, the run is resumable
        else:
            self.run_dir.record_resume(self.step, setup.resume_changes, self.plan.render())
        tracker = None
        if main:
            verb = f"resuming from step {self.step} in" if self.run_dir.resume_from is not None else "run directory"
            print(f"rlzoo: {verb} {self.run_dir.path} (tensorboard --logdir {self.run_dir.path})", flush=True)
            tracker = Tracker(str(self.run_dir.path), purge_step=self.step + 1 if self.run_dir.resume_from else None)
            if self.run_dir.resume_from is None:
                tracker.log_hparams(setup.hparams, self.plan, experiment=not in_sweep(self.run_dir.path))
                tracker.log_scalars(0, self._answer_metrics())
            if self.evaluator is not None:
                print(self.evaluator.describe(), flush=True)
        if self.evaluator is not None and self.evaluator.at_start and self.step == 0:
            start_metrics = self.evaluate(0)
            if tracker is not None:
                tracker.log_scalars(0, start_metrics)
                tracker.log_samples(0, self.evaluator.samples, tag="eval_samples")
                print("rlzoo: evaluation before the first step: " + ", ".join(
                    f"{tag} {value:.3f}" for tag, value in start_metrics.items() if tag.startswith("eval/")),
                    flush=True)
        stop = StopRequest(announce=main).__enter__()
        progress = Progress(cadence, self.step) if main else None
        self.watch = self._watch() if main and cadence.doctor else None
        status, metrics, failing = "failed", {}, False
        try:
            self._start_generator()
            while self.step < cadence.total_steps:
                metrics = self.train_step()
                last = self.step == cadence.total_steps
                if self.evaluator is not None and self.evaluator.due(self.step, last):
                    metrics.update(self.evaluate(self.step))
                failure = None
                try:
                    self._step_end(metrics, tracker, progress, last)
                except Exception as exc:  # noqa: BLE001 - under torchrun the ranks agree on it below
                    if not self.dist.enabled:
                        raise
                    failure = exc
                if self.dist.enabled:  # every rank stops at the same step (signals reach them apart), or fails
                    flag = distributed.all_reduce_floats({"stop": float(stop.requested),
                                                          "failed": float(failure is not None)}, self.dist, "max")
                    if flag["failed"]:
                        distributed.raise_failures(failure, self.dist)
                    stop.requested = flag["stop"] > 0
                every = cadence.checkpoint_every
                if stop.requested or (every and self.step % every == 0) or last:
                    if tracker is not None:
                        tracker.flush()
                    self.save()
                if stop.requested:
                    status = "interrupted"
                    break
            else:
                status = "completed"
        except BaseException:
            failing = True  # its error is what the user sees, not a status file that failed too
            stop.exiting = self.dist.enabled  # torchrun SIGTERMs the other ranks when one exits: finish exiting
            raise
        finally:
            if progress is not None:
                progress.close()
            if tracker is not None:
                tracker.close()
            stop.__exit__()
            self.pm.hook.rlzoo_run_end(ctx=self.ctx, status=status)
            self.run_dir.write_status(status, self.step, cadence.total_steps, quiet=failing)
            self.close()
        if main and status == "interrupted":
            print(f"rlzoo: checkpoint written at step {self.step}; continue with "
                  f"`rlzoo train resume={self.run_dir.path}`", flush=True)
        elif main and status == "completed":
            print(summary_line(self.run_dir.path), flush=True)
            print(next_steps(self.run_dir.path, self.step), flush=True)
        return metrics

    def _step_end(self, metrics: dict[str, float], tracker: Tracker | None, progress: Progress | None,
                  last: bool) -> None:
        """After a step: ``rlzoo_step_end`` and, on rank 0, the logs, the doctor's checks and the
        progress bar."""
        cadence = self.plan.cadence
        if tracker is not None and self.evaluator is not None and self.evaluator.due(self.step, last):
            tracker.log_samples(self.step, self.evaluator.samples, tag="eval_samples")
        self.pm.hook.rlzoo_step_end(step=self.step, metrics=metrics, ctx=self.ctx)
        logged = metrics if self.step % cadence.log_every == 0 or last else eval_only(metrics)
        if tracker is not None:
            tracker.log_scalars(self.step, logged)
        if self.watch is not None:
            self.watch.add(self.step, logged)
            lines = [line for line in [self.watch.check_start(self.step, metrics)] if line]
            for finding in self.watch.check(self.step, last):
                lines.append(Watch.line(self.step, finding))
                self.run_dir.record_finding(self.step, finding.code, finding.title, lines[-1])
            for line in lines:
                if progress is not None and progress.bar is not None:
                    progress.bar.write(line, file=sys.stderr)  # above the bar, not through it
                else:
                    say(line)
        if tracker is not None and cadence.sample_every and self.step % cadence.sample_every == 0:
            tracker.log_samples(self.step, self.last_samples)
        if progress is not None:
            progress.update(self.step, metrics)

    def _answer_metrics(self) -> dict[str, float]:
        """The reference answers' shortest and longest length in tokens (logged at step 0 of a
        fresh run, for the doctor's length-budget check); none for episodes."""
        if not self.answer_tokens:
            return {}
        return {Tag.ANSWER_TOKENS_MIN: float(min(self.answer_tokens)),
                Tag.ANSWER_TOKENS_MAX: float(max(self.answer_tokens))}

    def _watch(self) -> Watch:
        """The doctor's checks during the run (``logging.doctor``): every ``eval.every`` steps and
        after the last, on the curves logged so far (a resumed run's from its event files)."""
        before = {tag: [(0, value)] for tag, value in self._answer_metrics().items()}
        if self.run_dir.resume_from is not None:
            before = {tag: [(s, v) for s, v in points if s <= self.step]
                      for tag, points in read_scalars(self.run_dir.path).items()}
        return Watch(self.run_input.setup.config_yaml, self.plan.eval.every, before)

    def close(self) -> None:
        """Unregister the run's extensions and release the run directory (idempotent)."""
        if getattr(self, "generator", None) is not None:
            self.generator.close()
            self.generator = None
        backend_close = getattr(getattr(getattr(self, "sampler", None), "backend", None), "close", None)
        if backend_close is not None:  # a backend with a process of its own (vllm)
            backend_close()
        processes.unregister(getattr(self, "thread_record", None))
        self.thread_record = None
        for _, plugin in self.extensions:
            if self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
        self.run_dir.close()


def _no_resample(n_prompts: int) -> RolloutBatch:
    """``ctx.resample`` under rollout.mode=async: generation belongs to the generator."""
    raise TrainingError(f"ctx.resample({n_prompts}) cannot generate with rollout.mode=async: the generator process "
                        "owns generation (an extension that refills batches, such as dynamic_sampling, needs "
                        "rollout.mode=sync)")


def train(run: RunInput, pm: PluginManager, overwrite: bool = False) -> dict[str, float]:
    """Build a :class:`Trainer` of ``run`` and run it; returns the last step's metrics.

    Under ``torchrun`` every process calls this; the process group is left at the end.
    ``overwrite``: a new run may delete another run in its directory first (``--overwrite``).
    """
    try:
        metrics = Trainer(run, pm, overwrite).run()
    except RuntimeError as exc:
        distributed.check_collective_failure(exc)  # a dead peer: one line, not a traceback
        raise
    distributed.shutdown()  # on an error the process exits instead, and torchrun stops the others
    return metrics
