"""The names of the files and folders of a run directory (:mod:`rlzoo.run.rundir`), apart
from the module that reads and writes them: reading a run's saved config (``resume=``)
needs the names only, and :mod:`rlzoo.run.rundir` loads torch (``rlzoo config`` defers it,
:mod:`rlzoo.core.deferred`)."""

from __future__ import annotations

INIT_MODEL_DIR = "init_model"
STATUS_FILE = "status.json"
CONFIG_FILE = "config.yaml"
PLAN_FILE = "plan.txt"
RESUMES_FILE = "resumes.jsonl"
DOCTOR_FILE = "doctor.jsonl"
"""The findings the doctor printed during the run (``logging.doctor``), one JSON object a line:
``step``, ``code``, ``title``, ``line``; ``rlzoo doctor`` says what became of each."""
RM_MODEL_DIR = "reward_model"
"""Where ``rlzoo rm`` writes the trained reward model (what ``reward=reward_model`` loads)."""

SWEEP_FILE = "sweep.txt"
"""Written into a sweep directory (the sweep's overrides): marks it as one."""
