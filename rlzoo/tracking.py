"""TensorBoard logging with stable tag names, hparams and text samples.

Tags every run writes (so runs and algorithms compare side by side):
``reward/mean``, ``reward/std``, ``response_length/mean``, ``policy/loss``,
``policy/clipfrac``, ``policy/approx_kl``, ``kl/value``, ``kl/coef``, ``entropy``,
``value/loss`` (actor-critic runs), ``grad_norm``, ``lr``, ``timing/rollout_s``,
``timing/update_s``, ``throughput/tokens_per_s``; plus any metric a component or
extension adds under its own name.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

HPARAM_METRICS = ("reward/mean", "response_length/mean")


def flatten_config(cfg: DictConfig) -> dict[str, Any]:
    """Config as ``{"a.b": scalar}``; lists and None become strings (TensorBoard hparams)."""
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        elif isinstance(node, (bool, int, float, str)):
            out[prefix[:-1]] = node
        else:
            out[prefix[:-1]] = str(node)

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return out


class Tracker:
    """Writes scalars, text and hparams for one run (rank 0 only)."""

    def __init__(self, log_dir: str, purge_step: int | None = None) -> None:
        self.writer = SummaryWriter(log_dir=log_dir, purge_step=purge_step)

    def log_hparams(self, cfg: DictConfig) -> None:
        """Write the run's session summaries. No explicit experiment summary: TensorBoard
        then infers the experiment over all runs under its logdir, including which
        hyperparameters differ between them (what the HParams dashboard is for)."""
        _, session_start, session_end = hparams(flatten_config(cfg), {tag: 0.0 for tag in HPARAM_METRICS})
        for summary in (session_start, session_end):
            self.writer.file_writer.add_summary(summary)

    def log_scalars(self, step: int, metrics: dict[str, float]) -> None:
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value, step)

    def log_samples(self, step: int, rows: list[tuple[str, str, float]]) -> None:
        lines = ["| prompt | completion | score |", "|---|---|---|"]
        for prompt, completion, score in rows:
            clean = lambda s: s.replace("|", "\\|").replace("\n", "⏎")  # noqa: E731
            lines.append(f"| {clean(prompt)} | {clean(completion)} | {score:.3f} |")
        self.writer.add_text("samples", "\n".join(lines), step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
