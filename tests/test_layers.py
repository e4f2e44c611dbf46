"""The house's shape, read from the code: rlzoo/'s layers are folders (docs/design.md,
"Layers"), imports go down them, nothing hides an import in a function to dodge one, the
engine never imports the zoo, plugins import rlzoo only through ``rlzoo.api``, no file name
occurs twice, and no file grows past 500 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
ENGINE = ROOT / "rlzoo"
PLUGINS = ROOT / "plugins"

LAYERS: tuple[str, ...] = (
    "core",       # errors, masked reductions, batches, token helpers, processes, signals
    "contract",   # component kinds, hook specifications, registry, checks, plugin loading
    "config",     # schema, layers, presets, component parameters, the resolved config
    "plan",       # the run plan: what a run is, decided before any model is built
    "tasks",      # prompts and reference answers; how a prompt becomes the model's text
    "agents",     # environments, tool calls, the sandbox, episodes
    "models",     # building, heads, log-probs, the decode loop, the load-time check, LoRA, reward models
    "rollout",    # the sampler, scoring, staleness, the asynchronous generator
    "learn",      # the update: passes, KL, advantages, losses, corrections, optimizers
    "diagnostics",  # rlzoo doctor's detectors and thresholds, the pre-flight memory and time estimate
    "run",        # run directory, checkpoints, resume, tracking, evaluation, the trainer
    "commands",   # the CLI and its subcommands
    "testing",    # the plugin test kit
)
"""The folders of rlzoo/, lowest first. A module imports only from its own folder or a
lower one. The package root's modules (``__init__``, ``compat``, ``api``) sit below every
folder: they import nothing of rlzoo's folders at module level (``api`` resolves each public name
by its module path on first use, ``compat`` an old path the same way, from ``api``'s table);
``__main__`` sits above all."""

TOP = {"__init__": -1, "compat": -1, "api": -1, "__main__": len(LAYERS)}
"""Modules at rlzoo/'s top level and their layer (-1: below every folder)."""

LAZY_ALLOWED = {"commands/cli.py"}
"""Modules that import rlzoo modules inside functions: the CLI imports the module of the
subcommand it runs only (``rlzoo --help`` must not import torch)."""

MAX_LINES = 500

FUNCTION, TYPING = "function", "typing"


def _imports(path: Path) -> list[tuple[str, str | None]]:
    """``(rlzoo module imported, where)`` for every import in ``path``: ``where`` is
    :data:`FUNCTION` inside a function, :data:`TYPING` in an ``if TYPE_CHECKING:`` block (for
    annotations only, never executed), ``None`` at module level. Modules are dotted paths
    below ``rlzoo`` (``core.errors``); ``from rlzoo.core import errors`` names ``core.errors``."""
    tree = ast.parse(path.read_text())
    found: list[tuple[str, str | None]] = []

    def visit(node: ast.AST, where: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = FUNCTION
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                inner = TYPING
            if isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                if child.module == "rlzoo" or child.module.startswith("rlzoo."):
                    base = child.module[len("rlzoo."):] if child.module != "rlzoo" else ""
                    for alias in child.names:
                        sub = f"{base}.{alias.name}".lstrip(".")
                        found.append((sub if _is_module(sub) else base or "__init__", where))
            elif isinstance(child, ast.Import):
                found.extend((alias.name[len("rlzoo."):], where) for alias in child.names
                             if alias.name.startswith("rlzoo."))
            visit(child, inner)

    visit(tree, None)
    return found


def _is_module(dotted: str) -> bool:
    path = ENGINE.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _name(path: Path) -> str:
    """``core/errors.py`` -> ``core.errors``; ``testing/__init__.py`` -> ``testing``."""
    parts = path.relative_to(ENGINE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def _layer(module: str) -> int:
    head = module.split(".")[0]
    return TOP[head] if head in TOP else LAYERS.index(head)


MODULES = {_name(path): path for path in sorted(ENGINE.rglob("*.py"))}
GRAPH = {name: _imports(path) for name, path in MODULES.items()}


def test_every_folder_is_a_layer_and_the_top_level_is_small() -> None:
    folders = sorted(p.name for p in ENGINE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(LAYERS), "a new folder of rlzoo/ is a layer: place it in LAYERS (and docs/design.md)"
    top = sorted(p.stem for p in ENGINE.glob("*.py"))
    assert top == sorted(TOP) and len(top) <= 8
    assert not [p for p in ENGINE.rglob("*.py") if len(p.relative_to(ENGINE).parts) > 2], "one folder deep"


def test_every_layer_is_installed() -> None:
    """A layer missing from pyproject's package list works in an editable install and is
    absent from a wheel."""
    import tomllib

    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert sorted(p for p in packages if p.startswith("rlzoo.")) == sorted(f"rlzoo.{layer}" for layer in LAYERS)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_go_down_the_layers(module: str) -> None:
    """Type-only imports (``if TYPE_CHECKING:``) may name a higher layer's class in an
    annotation (the hook contract names the run context it is passed); they still count
    for cycles."""
    upward = [f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)})"
              for target, where in GRAPH[module]
              if target.split(".")[0] != module.split(".")[0] and _layer(target) > _layer(module) and where != TYPING]
    assert not upward


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_import_hides_in_a_function(module: str) -> None:
    hidden = sorted({target for target, where in GRAPH[module] if where == FUNCTION})
    relative = MODULES[module].relative_to(ENGINE).as_posix()
    assert not hidden or relative in LAZY_ALLOWED, f"{module} imports {hidden} inside a function"


def test_the_import_graph_has_no_cycle() -> None:
    edges = {module: {target for target, _ in targets if target != module and target in GRAPH}
             for module, targets in GRAPH.items()}
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


def test_the_engine_never_imports_the_zoo_nor_its_own_facade() -> None:
    """rlzoo/ knows no algorithm: the standard plugins come in through entry points only;
    ``rlzoo.api`` is for plugins, never for the engine itself."""
    offenders = [name for name, path in MODULES.items()
                 if any(isinstance(node, (ast.Import, ast.ImportFrom)) and "rlzoo_plugins" in ast.unparse(node)
                        for node in ast.walk(ast.parse(path.read_text())))]
    assert not offenders
    facade = [name for name, imports in GRAPH.items() if name.split(".")[0] in LAYERS
              and any(target == "api" for target, _ in imports)]
    assert not facade


def _plugin_modules() -> list[Path]:
    return sorted([*PLUGINS.glob("*.py"), *(PLUGINS / "rlzoo-example" / "rlzoo_example").glob("*.py")])


@pytest.mark.parametrize("path", _plugin_modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_plugins_import_rlzoo_only_through_its_api(path: Path) -> None:
    """The standard plugins are written as a third-party package would be: ``rlzoo.api`` is
    the one surface (docs/plugins.md); anything else may move between releases. ``from rlzoo
    import api`` is the same door, for names a plugin looks up when it runs (``api.generate``)."""
    other = sorted({ast.unparse(node) for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                    and (node.module == "rlzoo" or node.module.startswith("rlzoo.")) and node.module != "rlzoo.api"
                    and not (node.module == "rlzoo" and [a.name for a in node.names] == ["api"])}
                   | {ast.unparse(node) for node in ast.walk(ast.parse(path.read_text()))
                      if isinstance(node, ast.Import) and any(a.name.startswith("rlzoo.") and a.name != "rlzoo.api"
                                                              for a in node.names)})
    assert not other


def test_no_file_name_occurs_twice() -> None:
    """A name says what the file holds, so it names one file: across rlzoo/ and plugins/
    (package faces ``__init__.py`` aside)."""
    names: dict[str, list[str]] = {}
    for path in [*ENGINE.rglob("*.py"), *PLUGINS.glob("*.py")]:
        if path.name != "__init__.py":
            names.setdefault(path.name, []).append(path.relative_to(ROOT).as_posix())
    assert {name: places for name, places in names.items() if len(places) > 1} == {}


def test_no_file_is_over_500_lines() -> None:
    long = {path.relative_to(ROOT).as_posix(): n for path in [*ENGINE.rglob("*.py"), *PLUGINS.rglob("*.py")]
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_layering_test_sees_a_hidden_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nfrom rlzoo.core import errors\nif TYPE_CHECKING:\n"
                      "    from rlzoo.plan.records import RunPlan\n\n"
                      "def f():\n    from rlzoo.run.trainer import Trainer\n")
    assert _imports(module) == [("core.errors", None), ("plan.records", TYPING), ("run.trainer", FUNCTION)]
    assert _layer("plan.records") > _layer("core.errors") and _layer("run.trainer") > _layer("plan.records")
