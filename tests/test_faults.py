"""Fault suite (issue 12): what a hostile or unlucky user can hand rlzoo, and what it does."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from rlzoo.checkpoint import check_plain, list_checkpoints
from rlzoo.cli import main

pytestmark = pytest.mark.slow  # end-to-end: trains, launches or installs

TINY = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
    "model.num_heads=2", "model.num_kv_heads=1", "task.num_digits=3",
    "rollout.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=5",
    "logging.progress=false", "trainer.threads=1",
]


class _Payload:
    """Unpickling this calls ``Path.touch(marker)``: what a crafted checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_that_would_run_code_is_refused_and_never_executed(capsys, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert main(["train", *TINY, f"run_dir={run_dir}", "trainer.total_steps=1"]) == 0
    capsys.readouterr()
    (_, checkpoint), = list_checkpoints(run_dir)
    marker = tmp_path / "PWNED"
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=True)
    state["step"] = _Payload(marker)
    with open(checkpoint / "trainer_state.pt", "wb") as handle:
        pickle.dump(state, handle)                  # torch.load reads a plain pickle too

    code = main(["train", f"resume={run_dir}", "trainer.total_steps=2"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not marker.exists(), "unpickling the checkpoint ran code"
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("rlzoo: error:")]
    assert len(lines) == 1 and "refusing to load" in lines[0] and "trainer_state.pt" in lines[0]


def test_trainer_state_holds_only_plain_values(tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "run"
    assert main(["train", *TINY, f"run_dir={run_dir}", "trainer.total_steps=1", "algo=ppo"]) == 0
    (_, checkpoint), = list_checkpoints(run_dir)
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=True)   # would raise otherwise
    check_plain(state, "state")


def test_check_plain_names_the_offending_path() -> None:
    import numpy as np

    with pytest.raises(TypeError, match=r"state\['ext'\]\[1\] is a numpy.ndarray"):
        check_plain({"ext": [1, np.zeros(2)]}, "state")


def test_no_unsafe_load_in_the_package() -> None:
    root = Path(__file__).resolve().parents[1]
    offenders = []
    for folder in ("rlzoo", "plugins"):
        for path in (root / folder).rglob("*.py"):
            for lineno, line in enumerate(path.read_text().splitlines(), 1):
                if ("torch.load(" in line and "weights_only=True" not in line) or "pickle.load" in line:
                    offenders.append(f"{path.relative_to(root)}:{lineno}: {line.strip()}")
    assert offenders == []
