"""docs/plugins.md's tutorial, followed verbatim: build the package from the doc's code
blocks, install it in isolation, then list, test and train with it."""

from __future__ import annotations

import pytest

import json
import os
import re
import subprocess
import sys
from pathlib import Path

pytestmark = pytest.mark.slow  # end-to-end: trains, launches or installs

DOC = Path(__file__).parents[1] / "docs" / "plugins.md"
BLOCK = re.compile(r"```\w+ file=(\S+)\n(.*?)```", re.S)


def run(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout}\n{done.stderr}"
    return done


def install_doc_package(doc: Path, files: set[str], package: Path, env: dict[str, str]) -> dict[str, str]:
    """Write the ``file=`` code blocks of ``doc`` (exactly ``files``) into ``package``, build
    its wheel and install it into a folder of its own; ``env`` with that folder on PYTHONPATH."""
    blocks = BLOCK.findall(doc.read_text())
    assert {name for name, _ in blocks} == files
    for name, text in blocks:
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    dist, site = package.parent / "dist", package.parent / "site"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
         str(package)], env, package.parent)
    wheel = next(dist.glob("*.whl"))
    run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        env, package.parent)
    return {**env, "PYTHONPATH": os.pathsep.join([str(site), env.get("PYTHONPATH", "")])}


def test_tutorial_package_builds_installs_lists_tests_and_trains(tmp_path: Path) -> None:
    package = tmp_path / "rlzoo-minmax"
    env = install_doc_package(DOC, {"pyproject.toml", "rlzoo_minmax/__init__.py", "tests/test_minmax.py"}, package,
                              {**os.environ})

    listing = json.loads(run([sys.executable, "-m", "rlzoo", "list", "--json"], env, tmp_path).stdout)
    entries = {(e["kind"], e["name"]): e for e in listing["components"]}
    assert entries[("advantage", "minmax")]["package"] == "rlzoo-minmax"
    assert entries[("algorithm", "grpo_minmax")]["package"] == "rlzoo-minmax"

    tests = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], env, package)
    assert "2 passed" in tests.stdout

    run_dir = tmp_path / "run"
    run([sys.executable, "-m", "rlzoo", "train", "algo=grpo_minmax", "trainer.total_steps=2",
         "rollout.prompts_per_step=2", "rollout.n=4", "model.hidden_size=32", "model.num_layers=1",
         "logging.progress=false", f"run_dir={run_dir}"], env, tmp_path)
    assert (run_dir / "checkpoints" / "step_000002").is_dir()
