"""Per-prompt evaluation records: each held-out prompt's outcome at every evaluation.

Every evaluation (:mod:`rlzoo.run.evaluation`) writes one file,
``<run_dir>/eval_records/step_000100.npz``, and the first one also
``eval_records/prompts.json`` (each prompt's id, text and reference answer). A record is a
NumPy ``.npz`` archive (compressed; read with ``np.load(path)``, which never unpickles:
every array is numeric or boolean):

================== ============== ==========================================================
array              dtype, shape   meaning
================== ============== ==========================================================
``step``           int64, ()      the training step evaluated after (0: before the first)
``threshold``      float64, ()    ``eval.threshold``: a completion is correct when its score
                                  is at least this
``prompt_id``      uint64, (N,)   each held-out prompt's :func:`rlzoo.tasks.task.prompt_id`,
                                  in evaluation order (the same in every run of the task)
``greedy_score``   float64, (N,)  the score of the greedy completion
``greedy_correct`` bool, (N,)     ``greedy_score >= threshold``
``strict_correct`` bool, (N,)     correct with the answer where ``answer_format`` says
``lenient_correct`` bool, (N,)    the right answer anywhere in the greedy completion
``sampled_scores`` float64, (N, n) the scores of the ``eval.n`` samples (n = 0: none)
``greedy_turns``   int64, (N,)    with an environment only: the greedy episode's turns
================== ============== ==========================================================

Every ``eval/...`` scalar a run logs is the mean over prompts of one per-prompt value
(:data:`PER_PROMPT`, :func:`per_prompt`), computed from the record, so the records and
the logged curves cannot disagree. A resume deletes the records of steps after the
checkpoint it continues from (:func:`purge_after`), as TensorBoard's events are purged, and
evaluation repeats exactly (its own seed per step), so a resumed run's records equal an
uninterrupted run's. :func:`read_records` is the loader for ``rlzoo compare``, ``rlzoo
doctor`` and a notebook.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlzoo.core.errors import ConfigError
from rlzoo.run.recording import json_safe

RECORDS_DIR = "eval_records"
PROMPTS_FILE = "prompts.json"
_STEP_FILE = re.compile(r"^step_(\d+)\.npz$")


def pass_at_k(n: int, correct: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``correct`` are correct:
    1 − C(n − c, k) / C(n, k) (Chen et al. 2021, arXiv:2107.03374)."""
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def eval_metric_tags(n: int, episodes: bool = False) -> list[str]:
    """The ``eval/...`` tags a run with ``eval.n = n`` logs, most important first
    (``episodes``: a run with an environment)."""
    tags = ["eval/greedy_accuracy", "eval/greedy_score", "eval/strict_accuracy", "eval/lenient_accuracy"]
    if n >= 1:
        tags += ["eval/pass@1"] + ([f"eval/pass@{n}"] if n > 1 else []) + ["eval/sampled_score"]
    return tags + (["eval/greedy_turns"] if episodes else [])


@dataclass(frozen=True)
class EvalRecord:
    """One evaluation's per-prompt outcomes (the arrays of the module docstring)."""

    step: int
    threshold: float
    prompt_id: np.ndarray
    greedy_score: np.ndarray
    greedy_correct: np.ndarray
    strict_correct: np.ndarray
    lenient_correct: np.ndarray
    sampled_scores: np.ndarray
    greedy_turns: np.ndarray | None = None

    @property
    def samples(self) -> int:
        """``eval.n``: sampled completions per prompt."""
        return int(self.sampled_scores.shape[1])

    def tags(self) -> list[str]:
        """The ``eval/...`` tags this record defines per prompt (:func:`eval_metric_tags`)."""
        return eval_metric_tags(self.samples, self.greedy_turns is not None)


def per_prompt(record: EvalRecord, tag: str) -> np.ndarray:
    """The per-prompt values (float64, shape (N,)) whose mean is the logged ``tag``.

    :raises KeyError: a tag the record does not define (:meth:`EvalRecord.tags`).
    """
    if tag not in record.tags():
        raise KeyError(f"{tag!r} is not recorded per prompt; recorded: {', '.join(record.tags())}")
    if tag == "eval/greedy_accuracy":
        return record.greedy_correct.astype(np.float64)
    if tag == "eval/greedy_score":
        return record.greedy_score.astype(np.float64)
    if tag == "eval/strict_accuracy":
        return record.strict_correct.astype(np.float64)
    if tag == "eval/lenient_accuracy":
        return record.lenient_correct.astype(np.float64)
    if tag == "eval/greedy_turns":
        return record.greedy_turns.astype(np.float64)
    if tag == "eval/sampled_score":
        return record.sampled_scores.mean(1)
    n = record.samples
    correct = (record.sampled_scores >= record.threshold).sum(1)
    k = int(tag.removeprefix("eval/pass@"))
    return np.array([pass_at_k(n, int(c), k) for c in correct], dtype=np.float64)


def metrics(record: EvalRecord) -> dict[str, float]:
    """Every ``eval/...`` metric of the record: the mean of :func:`per_prompt` over prompts."""
    return {tag: float(per_prompt(record, tag).mean()) for tag in record.tags()}


def record_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / RECORDS_DIR / f"step_{step:06d}.npz"


def write_record(run_dir: Path, record: EvalRecord) -> Path:
    """Write ``record`` into ``run_dir`` atomically (a temporary file renamed into place)."""
    path = record_path(run_dir, record.step)
    path.parent.mkdir(exist_ok=True)
    arrays: dict[str, np.ndarray] = {
        "step": np.int64(record.step), "threshold": np.float64(record.threshold),
        "prompt_id": np.asarray(record.prompt_id, dtype=np.uint64),
        "greedy_score": np.asarray(record.greedy_score, dtype=np.float64),
        "greedy_correct": np.asarray(record.greedy_correct, dtype=bool),
        "strict_correct": np.asarray(record.strict_correct, dtype=bool),
        "lenient_correct": np.asarray(record.lenient_correct, dtype=bool),
        "sampled_scores": np.asarray(record.sampled_scores, dtype=np.float64).reshape(len(record.prompt_id), -1)}
    if record.greedy_turns is not None:
        arrays["greedy_turns"] = np.asarray(record.greedy_turns, dtype=np.int64)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as handle:
            np.savez_compressed(handle, **arrays)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_prompts(run_dir: Path, ids: list[int], prompts: list[str], references: list[Any]) -> Path | None:
    """Write ``prompts.json`` (id, prompt text and reference of each held-out prompt) once;
    ``None`` when it exists."""
    path = Path(run_dir) / RECORDS_DIR / PROMPTS_FILE
    if path.exists():
        return None
    path.parent.mkdir(exist_ok=True)
    rows = [{"id": int(i), "prompt": p, "reference": json_safe(r)} for i, p, r in zip(ids, prompts, references)]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(rows))
    os.replace(tmp, path)
    return path


def recorded_steps(run_dir: Path) -> list[int]:
    """The steps with a record in ``run_dir``, in order."""
    folder = Path(run_dir) / RECORDS_DIR
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STEP_FILE.match(p.name)))


def read_record(path: Path) -> EvalRecord:
    """One record file.

    :raises ConfigError: the file is unreadable or lacks an array of the schema.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
        return EvalRecord(step=int(arrays["step"]), threshold=float(arrays["threshold"]),
                          prompt_id=arrays["prompt_id"].astype(np.uint64), greedy_score=arrays["greedy_score"],
                          greedy_correct=arrays["greedy_correct"].astype(bool),
                          strict_correct=arrays["strict_correct"].astype(bool),
                          lenient_correct=arrays["lenient_correct"].astype(bool),
                          sampled_scores=arrays["sampled_scores"].reshape(len(arrays["prompt_id"]), -1),
                          greedy_turns=arrays.get("greedy_turns"))
    except (OSError, ValueError, KeyError, EOFError) as exc:
        raise ConfigError(f"cannot read the evaluation record {path} ({type(exc).__name__}: {exc})") from exc


def read_records(run_dir: Path) -> dict[int, EvalRecord]:
    """Every evaluation record of a run, by step (empty for a run written before records
    existed, or without evaluation).

    :raises ConfigError: an unreadable record (named).
    """
    return {step: read_record(record_path(run_dir, step)) for step in recorded_steps(run_dir)}


def purge_after(run_dir: Path, step: int) -> list[Path]:
    """Delete the records of steps after ``step`` (a resume from ``step``'s checkpoint
    evaluates them again); returns what was deleted."""
    gone = [record_path(run_dir, s) for s in recorded_steps(run_dir) if s > step]
    for path in gone:
        path.unlink()
    return gone
