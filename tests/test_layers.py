"""The import graph of rlzoo/ follows the layers of docs/design.md: no cycle, no upward import,
no import hidden in a function to dodge one, and the engine never imports the zoo."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
ENGINE = ROOT / "rlzoo"

LAYERS: dict[str, int] = {
    # 0: foundations, importing no other rlzoo module but each other
    "errors": 0, "kinds": 0, "distributed": 0, "masked": 0, "rng": 0, "events": 0, "batch": 0, "stopping": 0,
    "processes": 0, "plots": 0, "yamlfile": 0, "sandbox": 0, "tools": 0,
    # 1: the plugin contract and its registry
    "contract": 1, "registry": 1, "hookspecs": 1, "__init__": 1, "plugins": 1,
    # 2: configuration and the run plan
    "schema": 2, "params": 2, "introspect": 2, "presets": 2, "resolved": 2, "planrecords": 2, "plan": 2, "config": 2,
    "episodeplan": 2,
    # 3: the engine's parts
    "head": 3, "rollout": 3, "logprobs": 3, "model_check": 3, "models": 3, "rewardmodel": 3, "tasks": 3,
    "prompts": 3, "scoring": 3, "sampler": 3, "recording": 3,
    "checkpoint": 3, "rundir": 3, "resume": 3, "tracking": 3, "evaluation": 3, "learner": 3, "context": 3,
    "rollout_queue": 3, "correcting": 3, "lora": 3, "async_rollout": 3, "environments": 3, "episodes": 3,
    "diagnostics": 3,
    # 4: what runs a job
    "trainer": 4, "sft": 4, "rm": 4, "golden": 4, "ab": 4, "sweep": 4, "compare": 4, "explain": 4, "launcher": 4,
    "export": 4, "doctor": 4,
    # 5: the interfaces
    "cli": 5, "testing": 5, "tool_checks": 5, "env_checks": 5, "__main__": 5,
}
"""Module of rlzoo/ -> its layer (docs/design.md, "Layers"). A module imports only modules of
lower layers or of its own; a new module is placed here. A package (a folder of rlzoo/ with an
``__init__.py``) is one entry: the imports of all its files together."""

LAZY_ALLOWED = {"cli"}
"""Modules that may import rlzoo modules inside functions: the CLI imports the module of the
subcommand it runs only (``rlzoo --help`` must not import torch)."""


FUNCTION, TYPING = "function", "typing"


def _imports(path: Path) -> list[tuple[str, str | None]]:
    """``(rlzoo module imported, where)`` for every import in ``path``: ``where`` is
    :data:`FUNCTION` inside a function, :data:`TYPING` in an ``if TYPE_CHECKING:`` block (for
    annotations only, never executed), ``None`` at module level."""
    tree = ast.parse(path.read_text())
    found: list[tuple[str, str | None]] = []

    def visit(node: ast.AST, where: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = FUNCTION
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                inner = TYPING
            if isinstance(child, ast.ImportFrom) and child.module:
                if child.module == "rlzoo":
                    found.extend((alias.name, where) for alias in child.names if alias.name in LAYERS)
                elif child.module.startswith("rlzoo."):
                    found.append((child.module.split(".")[1], where))
            elif isinstance(child, ast.Import):
                found.extend((alias.name.split(".")[1], where) for alias in child.names
                             if alias.name.startswith("rlzoo."))
            visit(child, inner)

    visit(tree, None)
    return found


def _units() -> dict[str, list[Path]]:
    """Module or package name -> its files: every ``*.py`` of rlzoo/, and every package folder."""
    units = {path.stem: [path] for path in sorted(ENGINE.glob("*.py"))}
    units.update({folder.name: sorted(folder.rglob("*.py")) for folder in sorted(ENGINE.iterdir())
                  if (folder / "__init__.py").is_file()})
    return units


GRAPH = {name: [found for path in paths for found in _imports(path)] for name, paths in _units().items()}


def test_every_module_has_a_layer() -> None:
    assert sorted(GRAPH) == sorted(LAYERS), "place new modules in LAYERS (and docs/design.md)"


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_go_down_the_layers(module: str) -> None:
    """Type-only imports (``if TYPE_CHECKING:``) may name a higher layer's class in an
    annotation (the hook contract names the run context it is passed); they still count
    for cycles."""
    upward = [f"{module} (layer {LAYERS[module]}) imports {target} (layer {LAYERS[target]})"
              for target, where in GRAPH[module]
              if target != module and LAYERS[target] > LAYERS[module] and where != TYPING]
    assert not upward


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_import_hides_in_a_function(module: str) -> None:
    hidden = sorted({target for target, where in GRAPH[module] if where == FUNCTION})
    assert not hidden or module in LAZY_ALLOWED, f"{module} imports {hidden} inside a function"


def test_the_import_graph_has_no_cycle() -> None:
    edges = {module: {target for target, _ in targets if target != module} for module, targets in GRAPH.items()}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(edges[module]):
            assert state.get(target) != 1, "import cycle: " + " -> ".join(path[path.index(target):] + [target])
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)


def test_the_engine_never_imports_the_zoo() -> None:
    """rlzoo/ knows no algorithm: the standard plugins come in through entry points only."""
    offenders = [path.name for path in ENGINE.rglob("*.py")
                 if any(isinstance(node, (ast.Import, ast.ImportFrom)) and "rlzoo_plugins" in ast.unparse(node)
                        for node in ast.walk(ast.parse(path.read_text())))]
    assert not offenders


def test_the_layering_test_sees_a_hidden_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nfrom rlzoo import errors\nif TYPE_CHECKING:\n"
                      "    from rlzoo.plan import RunPlan\n\ndef f():\n    from rlzoo.trainer import Trainer\n")
    assert _imports(module) == [("errors", None), ("plan", TYPING), ("trainer", FUNCTION)]
