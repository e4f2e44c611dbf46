"""``rlzoo ab``: two learners trained on the identical, recorded rollouts.

A normal comparison of two algorithms mixes the effect of the update rule with sampling
noise: each run samples its own batches from its own policy. ``rlzoo ab RUN_DIR --a ...
--b ...`` removes the sampling: both learners start from the recorded run's initial
weights (``init_model/``) and learn, step by step, from exactly the batches the recorded
run learnt from (``rollout.record=true``), with the same mini-batch shuffles. Per step it
reports

- ``ab/cosine``: the cosine between the two learners' parameter updates of that step;
- ``ab/kl_a_b``: the exact KL(π_A ‖ π_B) per token, on the step's batch, after the update;
- ``ab/kl_recording_a`` / ``_b``: each learner's distance from the policy that sampled
  the batch, the k3 estimate of KL(μ ‖ π) with μ the recorded rollout log-probs (the
  off-policy gap rollout corrections address);
- ``ab/a/<metric>``, ``ab/b/<metric>``: each learner's own update metrics;

to TensorBoard (in the output directory) and a PNG. The recorded run is only read.
"""

from __future__ import annotations

import copy
import math
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from rlzoo.run import recording
from rlzoo.core.batch import RolloutBatch
from rlzoo.plan.planner import load_config
from rlzoo.plan.run_input import engine_input
from rlzoo.config.layers import parse_overrides, plugin_modules
from rlzoo.config.yamlfile import read_yaml
from rlzoo.core.errors import ConfigError, RlzooError
from rlzoo.models.logprobs import response_forward
from rlzoo.core.masked import masked_mean
from rlzoo.contract.loading import build_registry, make_plugin_manager
from rlzoo.run.rundir import check_new_output_dir
from rlzoo.run.trainer import Trainer

FORCED = ("resume=null", "rollout.record=false", "logging.progress=false", "launcher.nproc=1")
"""What every A/B learner sets, whatever the recorded run did."""


@dataclass
class ABResult:
    """Per-step measurements of an A/B replay.

    :ivar steps: the recorded steps replayed.
    :ivar series: tag -> one value per step.
    :ivar out_dir: where the TensorBoard events and ``ab.png`` were written.
    """

    steps: list[int]
    series: dict[str, list[float]]
    out_dir: Path


def _flat_parameters(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])


FROZEN = ("task", "reward", "rollout", "env", "seed", "eval", "model")
"""Config keys (and everything below them) that decide the batches or the initial weights:
fixed by the recording, refused in ``--a`` / ``--b``."""

LEARNER_MODEL_KEYS = ("model.dtype", "model.gradient_checkpointing")
"""Keys under ``model`` that change only how the learner computes."""


def _side(run_dir: Path, base: dict[str, Any], overrides: list[str], out: Path) -> Any:
    """A Trainer for one side: the recorded run's config, the side's overrides, the run's
    initial weights, its own plugin manager (so neither side's extensions hook the other)."""
    items = [*overrides, *FORCED, f"model.path={run_dir / 'init_model'}", f"run_dir={out}"]
    pm = make_plugin_manager(modules=plugin_modules(items, None, base=base))
    registry = build_registry(pm)
    resolved = load_config(registry, items, base=copy.deepcopy(base))
    return Trainer(engine_input(resolved), pm)


@torch.no_grad()
def _log_probs(trainer: Any, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp (B, T), log_softmax logits (B, T, V))`` of ``batch`` under the side's policy."""
    out = response_forward(trainer.models.policy, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                           batch.response_mask, with_logits=True, temperature=trainer.plan.logprob_temperature)
    return out.logp, torch.log_softmax(out.logits.float(), dim=-1)


def run_ab(run_dir: str | Path, a: list[str], b: list[str], out_dir: str | Path | None = None,
           steps: int | None = None) -> ABResult:
    """Replay the recorded rollouts of ``run_dir`` through learners A and B.

    :param a: overrides of side A (``key=value`` items) over the recorded run's config.
    :param b: overrides of side B.
    :param out_dir: where to write (default ``<run_dir>-ab-<timestamp>``, never inside
        the recorded run).
    :param steps: replay only the first ``steps`` recorded steps.
    :raises ConfigError: no recording, a bad override, a side that cannot run.
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{str(run_dir)!r} is not a run directory (no config.yaml)")
    recorded = recording.recorded_steps(run_dir)
    if not recorded:
        raise ConfigError(f"{run_dir} holds no recorded rollouts: record a run with rollout.record=true first")
    if steps is not None:
        recorded = recorded[:steps]
    for side in (a, b):
        parse_overrides(side)  # a malformed item fails before anything is built
        for item in side:
            key = item.split("=", 1)[0].strip()
            if any(key == p or key.startswith(p + ".") for p in FROZEN) and key not in LEARNER_MODEL_KEYS:
                raise ConfigError(f"{item!r}: {key} shapes the batches, which rlzoo ab replays as recorded, so it "
                                  f"cannot act here ({', '.join(FROZEN)} are frozen); A and B may change the "
                                  "learner: advantage, policy_loss, loss_agg, kl, trainer, ...")
    recording.check(run_dir, recorded)
    base = read_yaml(run_dir / "config.yaml", f"{run_dir}: run config")
    out = Path(out_dir) if out_dir else run_dir.with_name(f"{run_dir.name}-ab-{datetime.now():%Y%m%d-%H%M%S}")
    if out.resolve() == run_dir.resolve() or run_dir.resolve() in out.resolve().parents:
        raise ConfigError(f"--out {out} is inside the recorded run {run_dir}; rlzoo ab only reads that run")
    check_new_output_dir(out, "--out")
    created = not out.exists()
    try:
        learners = {"a": _side(run_dir, base, a, out / "a")}
        try:
            learners["b"] = _side(run_dir, base, b, out / "b")
            series = _replay(run_dir, recorded, learners, int(base.get("seed", 0)))
        finally:
            for learner in learners.values():
                learner.close()
        _write(out, recorded, series, labels={"a": " ".join(a) or "the recorded config",
                                              "b": " ".join(b) or "the recorded config"})
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)  # a failed replay leaves no half-written --out
        raise
    return ABResult(steps=recorded, series=series, out_dir=out)


def _replay(run_dir: Path, recorded: list[int], learners: dict[str, Any], seed: int) -> dict[str, list[float]]:
    series: dict[str, list[float]] = {}

    def add(tag: str, value: float) -> None:
        series.setdefault(tag, []).append(float(value))

    for step in recorded:
        batch = recording.load(run_dir, step)
        deltas, logps, log_dists = {}, {}, {}
        for name, learner in learners.items():
            before = _flat_parameters(learner.models.policy)
            torch.manual_seed(seed * 1_000_003 + step)  # both sides shuffle mini-batches alike
            learner.step = learner.ctx.step = step
            metrics = learner.learn(copy.deepcopy(batch).to(learner.device))
            deltas[name] = _flat_parameters(learner.models.policy) - before
            logps[name], log_dists[name] = _log_probs(learner, batch.to(learner.device))
            for key, value in metrics.items():
                add(f"ab/{name}/{key}", value)
        # the tokens the policy sampled: an episode's environment tokens have no rollout log-prob
        mask = getattr(batch, learners["a"].plan.sampled_mask).to(logps["a"].device)
        norms = deltas["a"].norm() * deltas["b"].norm()
        add("ab/cosine", float(deltas["a"] @ deltas["b"] / norms) if norms > 0 else math.nan)
        kl_ab = (log_dists["a"].exp() * (log_dists["a"] - log_dists["b"])).sum(-1)
        add("ab/kl_a_b", float(masked_mean(kl_ab, mask)))
        rollout_logp = batch.rollout_logp.to(mask.device)
        for name in learners:
            x = (logps[name] - rollout_logp).clamp(-20, 20)
            add(f"ab/kl_recording_{name}", float(masked_mean(torch.expm1(x) - x, mask)))
    return series


def _write(out: Path, steps: list[int], series: dict[str, list[float]], labels: dict[str, str]) -> None:
    from torch.utils.tensorboard import SummaryWriter

    out.mkdir(parents=True, exist_ok=True)
    writer = SummaryWriter(log_dir=str(out))
    for tag, values in series.items():
        for step, value in zip(steps, values):
            writer.add_scalar(tag, value, step)
    writer.add_text("ab/sides", f"A: {labels['a']}\n\nB: {labels['b']}", 0)
    writer.close()
    plot(out / "ab.png", steps, series, labels)


def plot(path: Path, steps: list[int], series: dict[str, list[float]], labels: dict[str, str]) -> Path:
    """Four panels: update cosine, KL(A‖B), distance from the recording policy, clipfrac."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RlzooError(f"rlzoo ab draws {path.name} with matplotlib, which cannot be imported ({exc})") from exc
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5), dpi=110)
    panels = [("cosine between the two updates", ["ab/cosine"]),
              ("KL(π_A ‖ π_B) per token", ["ab/kl_a_b"]),
              ("KL(μ_recording ‖ π) per token (k3)", ["ab/kl_recording_a", "ab/kl_recording_b"]),
              ("policy/clipfrac", ["ab/a/policy/clipfrac", "ab/b/policy/clipfrac"])]
    for ax, (title, tags) in zip(axes.flat, panels):
        for tag in tags:
            if tag in series:
                side = "A" if "/a/" in tag or tag.endswith("_a") else "B" if "/b/" in tag or tag.endswith("_b") else ""
                ax.plot(steps, series[tag], label=side or None, linewidth=1.5)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("recorded step")
        ax.grid(alpha=0.3)
        if len(tags) > 1:
            ax.legend(fontsize=8)
    fig.suptitle(f"A: {labels['a']}   vs   B: {labels['b']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
