"""TensorBoard logging: scalars with stable tag names, text samples, the hparams record and
the layout that puts reward and evaluation first.

Tags every run writes (so runs and algorithms compare side by side):
``reward/mean``, ``reward/std``, ``response_length/mean``, ``policy/loss``,
``policy/clipfrac``, ``policy/approx_kl``, ``kl/value``, ``kl/coef``, ``entropy``,
``value/loss`` (actor-critic runs), ``grad_norm``, ``lr``, ``timing/rollout_s``,
``timing/update_s``, ``throughput/tokens_per_s``, ``reward/zero_std_frac``; ``eval/...`` and ``timing/eval_s``
when evaluation runs (:mod:`rlzoo.run.evaluation`); plus any metric a component or extension
adds under its own name.

**HParams.** Each run records its *effective* hyperparameters (decided with the plan:
:func:`rlzoo.plan.hparams.effective_hparams`, every config key but the ones that place or log
a run, with the knobs that cannot act under the run plan written as ``off``, so KL knobs of
a run without KL do not show as differing) and an experiment summary that
names the metrics, evaluation and reward first. TensorBoard reads one experiment summary
per log directory; a sweep writes one for all its runs (:func:`write_experiment`, with
``differs`` set on the swept keys and the :data:`ALGORITHM_KEYS` whose values differ), and
runs inside a sweep directory leave it to the sweep.

**Layout.** TensorBoard's Time Series tab groups tags by prefix in alphabetical order; the
custom-scalars layout every run writes (tab CUSTOM SCALARS) shows reward and evaluation
first, then policy, KL, lengths and time, one chart per tag with every run overlaid.
"""

from __future__ import annotations

import math
import sys

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

from rlzoo.core import distributed
from rlzoo.core.tags import Tag
from rlzoo.core.batch import RolloutBatch
from rlzoo.agents.episodes import COUNT_COLUMNS
from rlzoo.plan.hparams import matches
from rlzoo.plan.records import RunPlan
from rlzoo.plan.settings import CadencePlan, EvalPlan
from rlzoo.run.eval_records import eval_metric_tags

LAYOUT: list[tuple[str, list[str]]] = [
    ("reward and evaluation", ["reward/mean", "eval/greedy_accuracy", "eval/pass@1", "eval/pass@N",
                               "eval/greedy_score", "eval/sampled_score", "eval/greedy_turns", "reward/std",
                               "reward/max", "reward/zero_std_frac"]),
    ("policy", ["policy/loss", "policy/clipfrac", "policy/approx_kl", "entropy", "advantages/mean", "grad_norm",
                "lr"]),
    ("kl and critic", ["kl/value", "kl/coef", "value/loss", "value/explained_var", "value/vf_clipfrac",
                       "value/grad_norm"]),
    ("lengths", ["response_length/mean", "response_length/truncated_frac"]),
    ("time", ["timing/step_s", "timing/rollout_s", "timing/update_s", "timing/eval_s", "throughput/tokens_per_s"]),
]
"""Custom-scalars categories in display order: (title, tags, one chart each). ``eval/pass@N``
stands for the run's ``eval/pass@<eval.n>``."""


@dataclass(frozen=True)
class Sample:
    """One completion as the text logs show it."""

    prompt: str
    reference: Any
    completion: str
    score: float


def _eval_tags(evaluation: EvalPlan) -> list[str]:
    """The ``eval/...`` tags a run with this evaluation logs (none without evaluation)."""
    return eval_metric_tags(evaluation.n, evaluation.episodes) if evaluation.size > 0 else []


def hparam_metrics(plan: RunPlan) -> list[str]:
    """The metrics the HParams dashboard lists for a run, most important first (it shows
    the first five): evaluation and reward, then lengths and time."""
    evals = _eval_tags(plan.eval)
    head = [t for t in evals if t == "eval/greedy_accuracy" or t.startswith("eval/pass@")]
    return head + ["reward/mean"] + [t for t in evals if t not in head] + [
        "response_length/mean", "kl/value", "timing/step_s", "throughput/tokens_per_s"]


ALGORITHM_KEYS = ("algo", "task.name", "reward.name", "advantage.name", "policy_loss.name", "loss_agg.name",
                  "kl.coef")
"""The hyperparameters that say which algorithm ran: a sweep's HParams marks them when they
differ, with the swept keys (the rest that differs follows from them)."""


def experiment_summary(runs: list[dict[str, Any]], metrics: list[str], shown: tuple[str, ...] | None = None) -> Any:
    """The hparams experiment summary for runs with these effective hparams: every key
    any run has, typed, without domains (so no run is filtered out); ``metrics`` in display
    order. ``differs`` marks the keys whose values differ between the runs (a key missing
    from some runs differs) and, when ``shown`` is given, that match one of its patterns
    (:func:`matches`): TensorBoard shows marked keys first, and only five at first."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams.api_pb2 import DataType, Experiment, HParamInfo, MetricInfo, MetricName
    from tensorboard.plugins.hparams.metadata import EXPERIMENT_TAG, PLUGIN_DATA_VERSION, PLUGIN_NAME
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    infos = []
    for key in sorted({key for run in runs for key in run}):
        values = [run.get(key) for run in runs]
        present = [v for v in values if v is not None]
        kind = ("DATA_TYPE_STRING" if any(isinstance(v, str) for v in present)
                else "DATA_TYPE_BOOL" if all(isinstance(v, bool) for v in present) else "DATA_TYPE_FLOAT64")
        differs = len({repr(v) for v in values}) > 1 and (shown is None or matches(key, shown))
        infos.append(HParamInfo(name=key, type=DataType.Value(kind), differs=differs))
    experiment = Experiment(hparam_infos=infos, metric_infos=[MetricInfo(name=MetricName(tag=m)) for m in metrics])
    content = HParamsPluginData(experiment=experiment, version=PLUGIN_DATA_VERSION).SerializeToString()
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name=PLUGIN_NAME, content=content))
    return Summary(value=[Summary.Value(tag=EXPERIMENT_TAG, metadata=metadata)])


EXPERIMENT_SUFFIX = ".rlzoo-experiment"


def write_experiment(log_dir: Path, runs: list[dict[str, Any]], metrics: list[str],
                     shown: tuple[str, ...] | None = None) -> None:
    """Write (or replace) the experiment summary of ``log_dir`` covering ``runs`` (their
    effective hparams; see :func:`experiment_summary`). Only the event file this function
    wrote before is replaced."""
    for old in Path(log_dir).glob(f"events.out.tfevents.*{EXPERIMENT_SUFFIX}"):
        old.unlink()
    writer = SummaryWriter(log_dir=str(log_dir), filename_suffix=EXPERIMENT_SUFFIX)
    writer.file_writer.add_summary(experiment_summary(runs, metrics, shown))
    writer.close()


def batch_metrics(batch: RolloutBatch, reward_names: list[str], dist: distributed.DistInfo,
                  reward_weights: list[float] | None = None) -> dict[str, float]:
    """Reward and length statistics of the global batch (all ranks): ``reward/mean`` (the
    weighted sum of the reward functions), ``/std``, ``/max``, ``reward/zero_std_frac`` (the
    share of groups whose rewards are all equal: a group-relative advantage is 0 for each of
    their completions), ``reward/shaped_mean`` when shaping changed the rewards,
    ``reward/<name>`` per function when there are several, ``response_length/mean`` and
    ``/truncated_frac``. When exactly one function has weight 0 and another does not (a gold
    reward monitored beside a learned one), also ``reward/proxy`` (the weighted sum trained
    on) and ``reward/gold`` (that function's mean)."""
    per_reward = batch.reward_scores if batch.reward_scores is not None else batch.scores[:, None]
    local = (batch.scores.cpu(), batch.rewards.cpu(), batch.response_lengths.cpu(), batch.truncated.cpu(),
             per_reward.cpu(), torch.tensor(zero_std_groups(batch.rewards.cpu(), batch.group_ids.cpu())))
    parts = distributed.gather_objects(local, dist)
    scores, rewards, lengths, truncated, per_reward = (torch.cat([part[i] for part in parts]) for i in range(5))
    zero_std, groups = sum(part[5] for part in parts).tolist()
    metrics = {Tag.REWARD: float(scores.mean()), Tag.REWARD_STD: float(scores.std()) if len(scores) > 1 else 0.0,
               Tag.REWARD_MAX: float(scores.max()), Tag.ZERO_STD_GROUPS: zero_std / max(groups, 1),
               Tag.LENGTH: float(lengths.mean()), Tag.TRUNCATED: float(truncated.float().mean())}
    if not torch.equal(rewards, scores):
        metrics["reward/shaped_mean"] = float(rewards.mean())
    if batch.episode_counts is not None:
        metrics.update(episode_metrics(batch, dist))
    if len(reward_names) > 1:
        metrics.update({f"reward/{name}": float(column.mean()) for name, column in zip(reward_names, per_reward.T)})
        zero = [k for k, w in enumerate(reward_weights or []) if w == 0]
        if len(zero) == 1 and len(zero) < len(reward_weights or []):
            metrics[Tag.PROXY] = metrics[Tag.REWARD]
            metrics[Tag.GOLD] = float(per_reward[:, zero[0]].mean())
    return metrics


def zero_std_groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[int, int]:
    """``(groups whose rewards are all equal, groups)`` of one process's batch; ``rewards``
    and ``group_ids`` are ``(B,)``. A group of one completion counts as all equal."""
    if len(rewards) == 0:
        return 0, 0
    _, group = torch.unique(group_ids, return_inverse=True)
    count = int(group.max()) + 1
    values = rewards.double()
    high = torch.full((count,), -math.inf, dtype=torch.float64).scatter_reduce(0, group, values, "amax")
    low = torch.full((count,), math.inf, dtype=torch.float64).scatter_reduce(0, group, values, "amin")
    return int((high == low).sum()), count


def episode_metrics(batch: RolloutBatch, dist: distributed.DistInfo) -> dict[str, float]:
    """Per-episode means over the global batch of a multi-turn run: ``episode/turns``,
    ``/tool_calls``, ``/tool_errors``, ``/template_drift`` (share of episodes ended by
    retokenisation drift), ``/turn_reward`` (summed per-turn rewards), ``/truncated_frac``
    (stopped by a bound), ``/policy_tokens`` and ``/env_tokens``: ``response_length`` counts
    both, the losses only the policy's."""
    local = torch.cat([batch.episode_counts.cpu(), batch.truncated.cpu().float()[:, None],
                       batch.loss_mask.sum(-1).cpu()[:, None],
                       (batch.response_mask - batch.loss_mask).sum(-1).cpu()[:, None]], 1)
    rows = torch.cat(distributed.gather_objects(local, dist))
    names = (*COUNT_COLUMNS, "truncated_frac", "policy_tokens", "env_tokens")
    return {f"episode/{name}": float(column.mean()) for name, column in zip(names, rows.T)}


def group_samples(batch: RolloutBatch, groups: int = 4, per_group: int = 4) -> list[Sample]:
    """Up to ``per_group`` completions of each of the first ``groups`` prompts of ``batch``."""
    seen: dict[int, int] = {}
    out = []
    for i, group in enumerate(batch.group_ids.tolist()):
        if group not in seen and len(seen) == groups:
            continue
        seen[group] = seen.get(group, 0) + 1
        if seen[group] <= per_group:
            text = batch.transcripts[i] if batch.transcripts is not None else batch.completions[i]
            out.append(Sample(batch.prompts[i], batch.references[i], text, float(batch.scores[i])))
    return out


def custom_scalars_layout(plan: RunPlan) -> dict[str, dict[str, list[Any]]]:
    """:data:`LAYOUT` as ``add_custom_scalars`` takes it, without the tags this run never
    writes (evaluation when it is off, the critic's without a critic)."""
    evals = set(_eval_tags(plan.eval))
    layout: dict[str, dict[str, list[Any]]] = {}
    for title, tags in LAYOUT:
        charts = {}
        for tag in tags:
            tag = tag.replace("pass@N", f"pass@{plan.eval.n}")
            if (tag.startswith("eval/") and tag not in evals) or (tag == "timing/eval_s" and not evals) or \
                    (tag.startswith("value/") and "critic" not in plan.models):
                continue
            charts[tag] = ["Multiline", [f"^{tag}$"]]
        layout[title] = charts
    return layout


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", "⏎")


class Progress:
    """How a run shows its progress on rank 0: a tqdm bar on stderr (``logging.progress=true``
    and stderr a terminal), or else a plain line every tenth of the run (what ``rlzoo sweep``
    relays per run, and what a log file gets: a bar redrawn with carriage returns would make
    it one huge line)."""

    def __init__(self, cadence: CadencePlan, start_step: int) -> None:
        self.total = cadence.total_steps
        self.every = max(1, self.total // 10)
        self.bar = None
        if cadence.progress and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, initial=start_step, desc="rlzoo train", dynamic_ncols=True)

    def update(self, step: int, metrics: dict[str, float]) -> None:
        """Report that ``step`` finished with ``metrics``."""
        shown = {"reward": f"{metrics['reward/mean']:.3f}"}
        if "eval/greedy_accuracy" in metrics:
            shown["eval_acc"] = f"{metrics['eval/greedy_accuracy']:.3f}"
        shown["step_s"] = f"{metrics['timing/step_s']:.2f}"
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(shown)
        elif step % self.every == 0 or step == self.total:
            print(f"rlzoo: step {step}/{self.total} " + " ".join(f"{k} {v}" for k, v in shown.items()), flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Tracker:
    """Writes scalars, text and hparams for one run (rank 0 only)."""

    def __init__(self, log_dir: str, purge_step: int | None = None) -> None:
        self.writer = SummaryWriter(log_dir=log_dir, purge_step=purge_step)

    def log_hparams(self, values: dict[str, Any], plan: RunPlan, experiment: bool = True) -> None:
        """Record the run's effective hyperparameters ``values`` (session start and end) and
        the custom-scalars layout of ``plan``; with ``experiment``, also an experiment summary
        of this run alone (runs in a sweep directory leave that to the sweep)."""
        _, session_start, session_end = hparams(values, {})
        for summary in (session_start, session_end):
            self.writer.file_writer.add_summary(summary)
        if experiment:
            self.writer.file_writer.add_summary(experiment_summary([values], hparam_metrics(plan)))
        self.writer.add_custom_scalars(custom_scalars_layout(plan))

    def log_scalars(self, step: int, metrics: dict[str, float]) -> None:
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value, step)

    def log_samples(self, step: int, samples: list[Sample], tag: str = "samples") -> None:
        """A Markdown table of completions: prompt, reference, completion, score."""
        lines = ["| prompt | reference | completion | score |", "|---|---|---|---|"]
        lines += [f"| {_cell(s.prompt)} | {_cell(s.reference)} | {_cell(s.completion)} | {s.score:.3f} |"
                  for s in samples]
        self.writer.add_text(tag, "\n".join(lines), step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
