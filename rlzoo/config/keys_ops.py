"""The config keys of how a run is watched, evaluated, saved and spread over processes, and
of ``rlzoo rm`` (records: :mod:`rlzoo.config.key_record`; the whole table:
:mod:`rlzoo.config.keys`)."""

from __future__ import annotations

from typing import Optional

from rlzoo.config.key_record import Key, Section

LOGGING = Section("logging", (
    Key("log_every", int, 1, "steps between scalar logs", range="> 0"),
    Key("sample_every", int, 20, "log sample completions as text every N steps (0: never)", range=">= 0"),
    Key("progress", bool, True, "a progress bar on a terminal",
        "`false`, or output to a file or pipe: a plain line every tenth of the steps (what `rlzoo sweep` relays)"),
    Key("doctor", bool, True, "every eval.every steps, doctor's checks on the curves so far as one-line warnings "
        "(rlzoo doctor)", "the same detectors and thresholds as `rlzoo doctor RUN_DIR` "
        "([diagnostics.md](diagnostics.md)); `false` silences them", old=False),
), resumable=True, not_explained="what a run logs and prints, not what it computes")

EVAL = Section("eval", (
    Key("every", int, 100, "evaluate every N steps and after the last (0: only after the last)",
        "never changes training", range=">= 0"),
    Key("size", int, 128, "held-out prompts evaluated (0: no evaluation)", range=">= 0"),
    Key("n", int, 8, "sampled completions per prompt for pass@1 / pass@n (0: greedy only)", range=">= 0"),
    Key("threshold", float, 1.0, "a completion is correct when its score >= threshold",
        "partial credit below it shows only in the `*_score` tags"),
    Key("holdout", float, 0.1, "share of every task's prompts kept out of training (changes the training data)",
        "([tasks.md](tasks.md#held-out-prompts-every-task-is-split))", range="[0, 1)",
        why="the share of each task's prompts held out of training for evaluation"),
    Key("at_start", bool, False, "true: also evaluate before the first step (logged at step 0: before -> after)",
        old=False),
), doc="held-out evaluation; docs/tasks.md says how prompts are held out", explain=True)

CHECKPOINT = Section("checkpoint", (
    Key("every", int, 100, "steps between checkpoints (0: only at the end)", "one is also written on Ctrl-C",
        range=">= 0", resumable=True),
    Key("keep", int, 2, "checkpoints kept on disk", range="> 0", resumable=True),
), not_explained="what a run keeps on disk: a resume from any checkpoint is exact")

DISTRIBUTED = Section("distributed", (
    Key("strategy", str, "ddp", "ddp | fsdp (FSDP2 fully_shard: for a model that does not fit one device)",
        "([scaling](scaling.md))", choices=("ddp", "fsdp")),
    Key("backend", str, "auto", "auto (nccl on CUDA, gloo on CPU) | gloo | nccl", choices=("auto", "gloo", "nccl")),
    Key("timeout_s", float, 600, "a collective waiting longer fails the job (a dead or stuck rank)", range="> 0",
        resumable=True),
), doc="used under torchrun (WORLD_SIZE > 1); see docs/scaling.md",
    not_explained="how processes share the work: losses and batch statistics are the global batch's, as in one "
                  "process")

LAUNCHER = Section("launcher", (
    Key("nproc", int, 1, "> 1: `rlzoo train` (and `rlzoo rm`) runs itself under torchrun with this many processes",
        "it runs `torchrun --standalone`", range="> 0"),
), not_explained="how many processes share the work: losses and batch statistics are the global batch's, as in one "
                 "process")

RM = Section("rm", (
    Key("data", Optional[str], None,
        ".jsonl or .parquet: prompt, chosen, rejected (text or chat messages), optional margin; or task: pairs "
        "of answers to the task's training prompts ranked by its reward",
        "([reward-models.md](reward-models.md#training-one-rlzoo-rm))", old=None),
    Key("steps", int, 200, "optimizer steps of rm.batch_size pairs (trainer.lr, betas, max_grad_norm apply)",
        range="> 0", resumable=True, old=200),
    Key("batch_size", int, 32, "pairs per optimizer step", range="> 0", old=32),
    Key("eval_fraction", float, 0.1, "share of the pairs held out for pairwise accuracy (0: none)", range="[0, 1)",
        why="the share of rlzoo rm's preference pairs held out of training for evaluation", old=0.1),
    Key("eval_every", int, 50, "evaluate the held-out pairs every N steps and after the last (0: only after the last)",
        range=">= 0", resumable=True, old=50),
    Key("chat_template", Optional[bool], None,
        "null: render with the tokenizer's chat template when it has one; true | false", old=None),
    Key("task_pairs", int, 2000, "pairs generated with rm.data=task", range="> 0", old=2000),
), doc="`rlzoo rm`: a reward model from preference pairs (docs/reward-models.md)",
   not_explained="rlzoo rm's run, not rlzoo train's, which explain describes (an rm run's plan.txt lists these)")
