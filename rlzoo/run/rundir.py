"""A run's directory: the files a run writes and reads, who owns them, and what survives.

::

    runs/<run-name>/
      config.yaml                 the resolved config (also TensorBoard hparams)
      plan.txt                    the run plan (rlzoo.plan.planner)
      resumes.jsonl               one line per resume: step and the config changes it made
      events.out.tfevents.*       TensorBoard scalars, text samples, hparams
      init_model/                 the initial policy + tokenizer (the frozen reference)
      checkpoints/step_000100/    policy/, critic/, trainer_state.pt, manifest.json (rlzoo.run.checkpoint)
      eval_records/step_000100.npz  each held-out prompt's outcome at that evaluation (rlzoo.run.eval_records)
      status.json                 completed | interrupted | failed, step
      .lock                       the pid of the run using the directory

A directory belongs to one run. A new run refuses a directory that holds another run's
files (:data:`RUN_FILES`) unless told to start over (``rlzoo train --overwrite``, which
deletes exactly those files first). A run holds an exclusive ``flock`` on ``.lock`` from
before it reads or writes anything until it ends; the kernel drops the lock when its
process dies, so a lock left by a killed run is simply taken over.

Rank 0 decides and writes; every method is safe to call on every rank (the others wait,
and an error on rank 0 is raised on every rank, so no rank waits forever).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rlzoo.core import distributed
from rlzoo.run.checkpoint import (
    CHECKPOINT_DIR,
    WRITE_ERRORS,
    latest_checkpoint,
    load_state,
    newest_intact_checkpoint,
    remove_leftovers,
    save_checkpoint,
    set_aside,
    write_error,
)
from rlzoo.core.errors import ConfigError, RlzooError, TrainingError, say
from rlzoo.run.run_lock import LOCK_FILE, RunLock, in_use_error, lock_holder
from rlzoo.models.lora import ADAPTER_CONFIG
from rlzoo.run import eval_records
from rlzoo.run.eval_records import RECORDS_DIR, EvalRecord
from rlzoo.run.layout import (CONFIG_FILE, DOCTOR_FILE, INIT_MODEL_DIR, PLAN_FILE, RESUMES_FILE, RM_MODEL_DIR,
                              STATUS_FILE, SWEEP_FILE)
from rlzoo.run.recording import ROLLOUT_DIR, record

RUN_FILES = (CONFIG_FILE, PLAN_FILE, RESUMES_FILE, DOCTOR_FILE, STATUS_FILE, f".{STATUS_FILE}.tmp", INIT_MODEL_DIR,
             CHECKPOINT_DIR, ROLLOUT_DIR, RECORDS_DIR, RM_MODEL_DIR, "events.out.tfevents.*")
"""What a run writes into its directory (glob patterns): what ``--overwrite`` deletes.
Anything else there (``rlzoo sweep``'s ``train.log``, your notes) is left alone."""


def in_sweep(run_dir: Path) -> bool:
    """Whether ``run_dir`` lies directly in a sweep directory (its parent holds
    :data:`SWEEP_FILE`): such a run leaves the hparams experiment summary to the sweep."""
    return (Path(run_dir).resolve().parent / SWEEP_FILE).is_file()


# ----------------------------------------------------------------------------- ownership


def run_files(run_dir: Path) -> list[Path]:
    """The entries of ``run_dir`` that a run wrote (:data:`RUN_FILES`)."""
    if not run_dir.is_dir():
        return []
    return sorted({path for pattern in RUN_FILES for path in run_dir.glob(pattern)})


def delete_run_files(run_dir: Path) -> None:
    """Delete what a run wrote into ``run_dir`` (:data:`RUN_FILES`), nothing else."""
    for entry in run_files(run_dir):
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


def describe_run(run_dir: Path) -> str:
    """A few words on the run in ``run_dir``: its status and step, or its newest checkpoint."""
    status = read_status(run_dir)
    if status is not None:
        return f"{status['status']} at step {status['step']} of {status['total_steps']}"
    newest = latest_checkpoint(run_dir)
    return f"checkpoint {newest.name}" if newest is not None else "no checkpoint"


# ----------------------------------------------------------------------------- output directories


def check_output_dir(path: Path, flag: str) -> None:
    """Refuse ``path`` as a directory a command writes into (``rlzoo sweep --dir``,
    ``rlzoo compare --out``, a ``run_dir``) when it, or the nearest of its parents that
    exists, is a file, or that parent is not writable. Reads only.

    :param flag: how the message names the path (``--dir``, ``--out``, ``run_dir``).
    :raises ConfigError: naming the path and what is in the way.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {str(path)!r} is a file, not a directory; choose another {flag}")
    existing = next((p for p in [path, *path.parents] if p.exists()), Path("."))
    if not existing.is_dir():
        raise ConfigError(f"{flag} {str(path)!r} cannot be created: {str(existing)!r} is a file, not a directory; "
                          f"choose another {flag}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {str(path)!r} cannot be written: no permission to write in {str(existing)!r}")


def is_run(path: Path) -> bool:
    """A run directory as ``rlzoo compare`` finds them: ``config.yaml`` and TensorBoard events
    (not inside a checkpoint)."""
    path = Path(path)
    return (path / CONFIG_FILE).is_file() and any(path.glob("events.out.tfevents.*")) \
        and CHECKPOINT_DIR not in path.parts


def check_not_a_run(path: Path, flag: str, why: str) -> None:
    """Refuse ``path`` as a directory a command writes its own files into (``rlzoo compare
    --out``, ``rlzoo sweep --dir``) when it holds a run: its config, a checkpoint or its
    status (a sweep there would put its runs inside that run). Reads only.

    :param why: what the command writes where, completing the message.
    :raises ConfigError: naming the path and the run it holds.
    """
    path = Path(path)
    if is_run(path) or any((path / name).exists() for name in (CONFIG_FILE, CHECKPOINT_DIR, STATUS_FILE)):
        raise ConfigError(f"{flag} {str(path)!r} is a run directory ({describe_run(path)}); {why}")


def check_new_output_dir(path: Path, flag: str) -> None:
    """Refuse ``path`` as the new directory a command writes (``rlzoo export OUT``,
    ``rlzoo sft --out``, ``rlzoo ab --out``) unless it is absent or an empty directory: such
    a command never writes into, or over, what is there (another run's files least of all).
    Reads only.

    :raises ConfigError: what :func:`check_output_dir` refuses, or a non-empty directory
        (naming the run it holds, if any).
    """
    check_output_dir(path, flag)
    path = Path(path)
    if path.is_dir() and any(path.iterdir()):
        held = f" (it holds a run: {describe_run(path)})" if run_files(path) else ""
        raise ConfigError(f"{flag} {str(path)!r} exists and is not an empty directory{held}; write into a new "
                          "(or empty) one")


def check_new_run_dir(path: Path, overwrite: bool) -> None:
    """Refuse a new run in ``path`` when it is a file, is in use by a live run, or holds
    another run (unless ``overwrite``). Reads only; :class:`RunDirectory` repeats the last
    check under the lock.

    :raises ConfigError: naming the running pid, or ``resume=`` and ``--overwrite``.
    """
    check_output_dir(path, "run_dir")
    holder = lock_holder(path)
    if holder is not None:
        raise in_use_error(path, holder)
    if not overwrite:
        _refuse_another_run(path)


def check_run_dir(path: Path, resume: bool, overwrite: bool) -> None:
    """What :class:`RunDirectory` would refuse for ``path``, checked without writing anything
    (the launcher runs it before starting torchrun)."""
    if not resume:
        check_new_run_dir(path, overwrite)
    elif (holder := lock_holder(path)) is not None:
        raise in_use_error(path, holder)


def _refuse_another_run(path: Path) -> None:
    if not run_files(path):
        return
    if latest_checkpoint(path) is None:
        redo = (f"start it over with `rlzoo train resume={path}` (its own config), or "
                if cut_off_start(path) and (path / CONFIG_FILE).is_file() else "")
        raise ConfigError(f"run_dir {str(path)!r} holds another run that has no checkpoint; {redo}start over with "
                          "`rlzoo train --overwrite ...` (deletes it first), or choose another run_dir")
    raise ConfigError(f"run_dir {str(path)!r} holds another run ({describe_run(path)}); continue it with "
                      f"`rlzoo train resume={path}`, or start over with `rlzoo train --overwrite ...` "
                      "(deletes that run first), or choose another run_dir")


SHAPE_KEYS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "tie_word_embeddings")
"""``config.json`` keys that fix a model's parameter shapes."""


def _check_same_model(policy: Path, init_model: Path) -> None:
    """:raises ConfigError: the checkpoint's policy has other shapes than the run's
    ``init_model/`` (a checkpoint of another run copied in, or an edited config). A LoRA
    checkpoint's ``policy/`` holds adapters only: they are checked when loaded onto
    ``init_model/`` (:func:`rlzoo.models.lora.load_adapters`)."""
    if not (policy / "config.json").is_file() and (policy / ADAPTER_CONFIG).is_file():
        return
    try:
        got, want = (json.loads((folder / "config.json").read_text()) for folder in (policy, init_model))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the model config of {policy} or {init_model}: {exc}") from exc
    differ = [f"{key} {got.get(key)!r} vs {want.get(key)!r}" for key in SHAPE_KEYS if got.get(key) != want.get(key)]
    if differ:
        raise ConfigError(f"{policy} is not a checkpoint of this run's model ({'; '.join(differ)} in "
                          f"{init_model.name}/config.json)")


def cut_off_start(run_dir: Path) -> bool:
    """True when ``run_dir`` holds a run's first files but no checkpoint, logs or status:
    a start cut off before its first checkpoint (step 0), which ``resume=`` redoes."""
    written = {entry.name for entry in run_files(run_dir)}
    return bool(written) and latest_checkpoint(run_dir) is None and not written & {STATUS_FILE, RESUMES_FILE} \
        and not any(name.startswith("events.out.tfevents.") for name in written)


def _missing_ancestors(path: Path) -> list[Path]:
    """``path`` and its parents that do not exist yet, outermost first."""
    missing = []
    for candidate in [path, *path.parents]:
        if candidate.exists():
            break
        missing.append(candidate)
    return missing[::-1]


def _write_text(path: Path, text: str) -> None:
    """Write ``text`` atomically (a temporary file renamed over ``path``)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


class RunDirectory:
    """The directory of one run, owned (locked) by this process for the life of the run.

    :param path: the run's directory (:func:`rlzoo.plan.run_input.run_path`).
    :param resume: continue the run in ``path`` (``resume=``) rather than start one.
    :param dist: this process's place in the job (every rank gets rank 0's path).
    :param overwrite: a new run may delete another run's files in the directory first.
    :param trained: the name of the trained model in checkpoints (``policy``; ``reward_model``
        for ``rlzoo rm``): a resume checks it has the shapes of ``init_model/``.
    :raises ConfigError: the directory holds another run, is in use, cannot be created,
        or (resuming) has no intact checkpoint. Nothing is written then.
    """

    def __init__(self, path: Path, resume: bool, dist: distributed.DistInfo, overwrite: bool = False,
                 trained: str = "policy") -> None:
        self.dist, self.trained = dist, trained
        self._lock: RunLock | None = None
        self._created: list[Path] = []
        outcome: tuple[str, str | None, str | None] | None = None
        if dist.is_main:
            try:
                outcome = self._claim(Path(path), resume, overwrite)
            except (RlzooError, OSError) as exc:
                self.close()
                outcome = ("", None, str(exc) if isinstance(exc, RlzooError) else f"run directory: {exc}")
        path, resume_from, error = distributed.broadcast_object(outcome, dist)
        if error is not None:
            raise ConfigError(error)
        self.path = Path(path)
        self.resume_from = Path(resume_from) if resume_from is not None else None

    def _claim(self, path: Path, resume: bool, overwrite: bool) -> tuple[str, str | None, None]:
        """Rank 0: lock the directory and decide what the run starts from."""
        if not resume:
            if path.exists() and not path.is_dir():
                raise ConfigError(f"run_dir {str(path)!r} is a file, not a directory; choose another run_dir")
            missing = _missing_ancestors(path)
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"cannot create run_dir {str(path)!r}: {exc.strerror}") from exc
            self._created = missing
        elif not path.is_dir():
            raise ConfigError(f"resume={str(path)!r} is not a directory")
        self._lock = RunLock(path)
        self._lock.acquire()
        if not resume:
            if not overwrite:
                _refuse_another_run(path)
            elif run_files(path):
                _note(f"--overwrite: deleting the run in {path} ({describe_run(path)})")
                delete_run_files(path)
            return str(path), None, None
        if cut_off_start(path):
            _note(f"{path} has no checkpoint: its start was cut off; starting the run over from its config.yaml")
            delete_run_files(path)
            return str(path), None, None
        stale = remove_leftovers(path)
        status_tmp = path / f".{STATUS_FILE}.tmp"
        if status_tmp.exists():
            status_tmp.unlink()
            stale.append(status_tmp)
        if stale:
            _note(f"removed what interrupted writes left: {', '.join(p.name for p in stale)}")
        checkpoint, damaged = newest_intact_checkpoint(path)
        for bad, reason in damaged:
            aside = set_aside(bad)
            _note(f"warning: checkpoint {bad.name} is damaged ({reason}); set aside as {aside.name}"
                  + (f", resuming from {checkpoint.name}" if checkpoint is not None else ""))
        if checkpoint is None:
            raise ConfigError(f"resume={str(path)!r}: no intact checkpoint in {path / CHECKPOINT_DIR}")
        _check_same_model(checkpoint / self.trained, path / INIT_MODEL_DIR)
        return str(path), str(checkpoint), None

    @property
    def init_model(self) -> Path:
        return self.path / INIT_MODEL_DIR

    def load_state(self) -> dict[str, Any]:
        """The trainer state of the checkpoint resumed from (see :func:`load_state`)."""
        return load_state(self.resume_from)

    def on_main(self, action: Any) -> None:
        """Run ``action()`` on rank 0; when it raises, every rank raises (a user error as
        the same kind of error), so no rank waits forever for rank 0."""
        error: Exception | None = None
        if self.dist.is_main:
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - re-raised below, on every rank
                error = exc
        if self.dist.enabled:
            told = distributed.broadcast_object(None if error is None else
                                                (isinstance(error, RlzooError), str(error)), self.dist)
            if told is not None and error is None:
                raise TrainingError(told[1] if told[0] else f"rank 0 failed: {told[1]}")
        if error is not None:
            raise error

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """Around the start of a new run (its files and first checkpoint): if that fails,
        everything the run wrote is deleted again and the directory released, so it is as
        it was (a directory the run created is removed)."""
        try:
            yield
        except BaseException:
            if self.dist.is_main:
                with contextlib.suppress(OSError):
                    delete_run_files(self.path)
            self.close()
            raise

    def start(self, config_yaml: str, plan_text: str, initial_policy: Any, tokenizer: Any) -> None:
        """Create the files of a new run: ``plan.txt``, ``config.yaml`` (``config_yaml``: the
        resolved config with ``resume: null``, so a run redone by ``resume=`` records the
        config it started with), ``init_model/``."""
        def write() -> None:
            try:
                _write_text(self.path / PLAN_FILE, plan_text)
                _write_text(self.path / CONFIG_FILE, config_yaml)
                initial_policy.save_pretrained(str(self.init_model))
                tokenizer.save_pretrained(str(self.init_model))
            except WRITE_ERRORS as exc:
                raise TrainingError(f"cannot write the new run into {self.path}: {write_error(exc, self.path)}; "
                                    "nothing of it was kept") from exc

        self.on_main(write)

    def record_resume(self, step: int, changes: dict[str, tuple[Any, Any]], plan_text: str) -> None:
        """Append this resume to ``resumes.jsonl``; apply accepted ``changes`` to
        ``config.yaml`` and rewrite ``plan.txt`` if it changed, so both stay true; delete the
        evaluation records of steps after ``step`` (evaluated again, as the events are purged)."""
        def write() -> None:
            try:
                eval_records.purge_after(self.path, step)
                entry = {"time": datetime.now().isoformat(timespec="seconds"), "step": step,
                         "changes": {key: [old, new] for key, (old, new) in changes.items()}}
                with open(self.path / RESUMES_FILE, "a") as handle:
                    handle.write(json.dumps(entry) + "\n")
                if changes:
                    saved = OmegaConf.load(self.path / CONFIG_FILE)
                    for key, (_, new) in changes.items():
                        OmegaConf.update(saved, key, new, force_add=True)
                    _write_text(self.path / CONFIG_FILE, OmegaConf.to_yaml(saved))
                plan_file = self.path / PLAN_FILE
                if not plan_file.is_file() or plan_file.read_text() != plan_text:
                    _write_text(plan_file, plan_text)
            except OSError as exc:
                raise TrainingError(f"cannot record the resume in {self.path}: {write_error(exc, self.path)}") from exc

        self.on_main(write)

    def record_finding(self, step: int, code: str, title: str, line: str) -> None:
        """Append a finding the doctor printed at ``step`` to ``doctor.jsonl`` (rank 0; a failure
        to write is a warning: the line was printed)."""
        if self.dist.is_main:
            try:
                with open(self.path / DOCTOR_FILE, "a") as handle:
                    handle.write(json.dumps({"step": step, "code": code, "title": title, "line": line}) + "\n")
            except OSError as exc:
                _note(f"warning: cannot write {self.path / DOCTOR_FILE}: {exc.strerror}")

    def record_rollout(self, step: int, batch: Any) -> None:
        """Write ``batch`` as the recording of ``step`` (``rollout.record``; single process)."""
        if self.dist.is_main:
            try:
                record(self.path, step, batch)
            except OSError as exc:
                raise TrainingError(f"cannot record the rollout of step {step} in {self.path / ROLLOUT_DIR}: "
                                    f"{write_error(exc, self.path)}") from exc

    def record_evaluation(self, record: EvalRecord, prompts: list[str], references: list[Any]) -> None:
        """Write an evaluation's per-prompt record (rank 0; every rank holds the same record),
        and at the first one the held-out prompts' texts and references (a collective under
        torchrun: a failure on rank 0 is raised on every rank)."""
        def write() -> None:
            try:
                eval_records.write_prompts(self.path, record.prompt_id.tolist(), prompts, references)
                eval_records.write_record(self.path, record)
            except OSError as exc:
                raise TrainingError(f"cannot write the evaluation record of step {record.step} in "
                                    f"{self.path / RECORDS_DIR}: {write_error(exc, self.path)}") from exc

        self.on_main(write)

    def save_checkpoint(self, step: int, models: dict[str, Any], state: dict[str, Any], keep: int) -> None:
        """Write checkpoint ``step`` (rank 0; every rank calls this, the others wait).

        :raises CheckpointError: on every rank, when rank 0 could not write it.
        """
        self.on_main(lambda: save_checkpoint(self.path, step, models, state, keep=keep))

    def write_status(self, status: str, step: int, total_steps: int, quiet: bool = False) -> None:
        """Record how the run ended (``rlzoo sweep`` skips completed runs). A failure to
        write is a warning, or nothing with ``quiet`` (when another error is being raised)."""
        if self.dist.is_main:
            try:
                write_status(self.path, status, step, total_steps)
            except OSError as exc:
                if not quiet:
                    _note(f"warning: cannot write {self.path / STATUS_FILE}: {exc.strerror}")

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # also at interpreter exit, when modules may be gone
            self.close()

    def close(self) -> None:
        """Release the lock (idempotent). A directory this run created and left empty but
        for its lock (it failed before writing anything) is removed again."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None
            if self._created and not run_files(self._created[-1]):
                with contextlib.suppress(OSError):
                    (self._created[-1] / LOCK_FILE).unlink()
                    for folder in reversed(self._created):
                        folder.rmdir()
        self._created = []


def _note(message: str) -> None:
    say(f"rlzoo: {message}")


def write_status(run_dir: Path, status: str, step: int, total_steps: int) -> None:
    """Write ``status.json`` atomically: ``status``, ``step``, ``total_steps``, ``time``."""
    _write_text(Path(run_dir) / STATUS_FILE, json.dumps({"status": status, "step": step, "total_steps": total_steps,
                                                         "time": time.time()}))


def read_status(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``status.json`` (``status``, ``step``, ``total_steps``), or ``None``."""
    path = Path(run_dir) / STATUS_FILE
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None


def read_findings_log(run_dir: Path) -> list[dict[str, Any]]:
    """The findings the doctor printed during the run (``doctor.jsonl``), in order; lines that
    do not parse are skipped (a run killed mid-write)."""
    path = Path(run_dir) / DOCTOR_FILE
    entries = []
    if path.is_file():
        for text in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(text)
                if isinstance(entry, dict) and {"step", "code", "title"} <= set(entry):
                    entries.append(entry)
    return entries
