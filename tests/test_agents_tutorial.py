"""docs/agents.md's third-party package, followed verbatim: build `rlzoo-hilo` from the page's
``file=`` code blocks (an environment, a tool, their tests, ``pyproject.toml``), install it in
isolation, then list it, run its kit tests and train with the page's commands."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rlzoo.core.events import read_scalars
from test_plugins_tutorial import install_doc_package

pytestmark = pytest.mark.slow  # end-to-end: builds, installs and trains

DOC = Path(__file__).parents[1] / "docs" / "agents.md"
BLOCK = re.compile(r"```\w+ file=(\S+)\n(.*?)```", re.S)
FILES = {"pyproject.toml", "rlzoo_hilo/__init__.py", "rlzoo_hilo/convert.py", "rlzoo_hilo/tools.py",
         "tests/test_hilo.py", "tests/test_convert.py", "tests/test_convert_length.py"}
SHORT = ["trainer.total_steps=2", "rollout.prompts_per_step=2", "rollout.n=2", "eval.size=4",
         "model.hidden_size=32", "model.num_layers=1", "logging.progress=false"]
"""Appended to the page's train commands (later overrides win): two small steps."""


def run(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout}\n{done.stderr}"
    return done


def documented_commands() -> list[list[str]]:
    """The ``rlzoo`` commands of the page's packaging block (the bash block after ``pyproject.toml``)."""
    text = DOC.read_text()
    after = text[text.index("```toml file=pyproject.toml"):]
    block = re.search(r"```bash\n(.*?)```", after, re.S).group(1)
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.startswith("rlzoo ")]


def test_the_packaging_block_lists_tests_and_trains() -> None:
    commands = [" ".join(c[:3]) for c in documented_commands()]
    assert commands == ["rlzoo list --kind", "rlzoo list --kind", "rlzoo train env=hilo"], commands


def test_agents_package_builds_installs_lists_passes_the_kit_and_trains(tmp_path: Path) -> None:
    package = tmp_path / "rlzoo-hilo"
    env = install_doc_package(DOC, FILES, package, {**os.environ, "OMP_NUM_THREADS": "1"})

    listing = json.loads(run([sys.executable, "-m", "rlzoo", "list", "--json"], env, tmp_path).stdout)
    entries = {(e["kind"], e["name"]): e for e in listing["components"]}
    assert entries[("environment", "hilo")]["package"] == "rlzoo-hilo"
    assert entries[("environment", "convert")]["package"] == "rlzoo-hilo"
    assert entries[("tool", "convert_length")]["package"] == "rlzoo-hilo"
    listed = {}
    for command in documented_commands():
        if command[1] == "list":
            kind = command[command.index("--kind") + 1]
            listed[kind] = run([sys.executable, "-m", *command], env, tmp_path).stdout
    assert re.search(r"^\s*hilo\b.*rlzoo-hilo", listed["environment"], re.M), listed["environment"]
    assert re.search(r"^\s*convert\b.*rlzoo-hilo", listed["environment"], re.M), listed["environment"]
    assert re.search(r"^\s*convert_length\b.*rlzoo-hilo", listed["tool"], re.M), listed["tool"]

    tests = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], env, package)
    assert "4 passed" in tests.stdout, tests.stdout

    trained = 0
    for i, command in enumerate(documented_commands()):
        if command[1] != "train":
            continue
        run_dir = tmp_path / f"run{i}"
        run([sys.executable, "-m", *command, *SHORT, f"run_dir={run_dir}"], env, tmp_path)
        assert (run_dir / "checkpoints" / "step_000002").is_dir()
        turns = read_scalars(run_dir)["episode/turns"]  # it played episodes of hilo
        assert [step for step, _ in turns] == [1, 2] and all(1 <= n <= 4 for _, n in turns), turns
        trained += 1
    assert trained == 1
