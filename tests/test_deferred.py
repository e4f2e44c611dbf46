"""Deferred imports (rlzoo.core.deferred): the quick commands (list, config, explain, diff)
answer without loading torch, and print exactly what they print with torch loaded.

Each check runs in a fresh interpreter: deferral acts only on packages not yet imported, and
pytest's own process has imported torch.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DRIVER = textwrap.dedent(
    """
    import contextlib, io, json, sys
    if sys.argv[1] == "eager":
        import torch  # noqa: F401  (loaded before the CLI runs: nothing is deferred)
    from rlzoo.commands.cli import main
    from rlzoo.core.deferred import loaded
    results = []
    for argv in json.loads(sys.argv[2]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's refusals
                code = exc.code
        results.append({"argv": argv, "code": code, "out": out.getvalue(), "err": err.getvalue(),
                        "torch": loaded("torch")})
    print(json.dumps(results))
    """
)
"""Runs ``rlzoo`` commands one after another in one interpreter, ``eager`` (torch imported
first, as every command did before deferral) or ``deferred`` (as ``rlzoo`` runs them);
prints each one's exit code, stdout, stderr and whether torch is loaded after it."""


def _env(path: Path) -> dict[str, str]:
    """This environment without rlzoo's plugin variables, with ``path`` on ``PYTHONPATH``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("RLZOO_")}, "PYTHONPATH": str(path)}


def run_commands(mode: str, commands: list[list[str]], cwd: Path) -> list[dict]:
    """:data:`DRIVER`'s results for ``commands`` run in ``cwd`` (also on the import path)."""
    result = subprocess.run([sys.executable, "-c", DRIVER, mode, json.dumps(commands)], capture_output=True,
                            text=True, cwd=cwd, env=_env(cwd), check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


LIGHT_PLUGIN = '''
"""A config-file plugin as rlzoo's are written: torch imported at the top, used in functions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from rlzoo.api import hookimpl, masked_mean


@dataclass
class ScaledParams:
    scale: float = 1.0
    """Multiplies the loss; > 0."""

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise ValueError(f"scale must be > 0, got {self.scale}")


def scaled_pg(logp: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor,
              params: Optional[ScaledParams] = None) -> tuple[torch.Tensor, dict]:
    params = params or ScaledParams()
    return -params.scale * advantages * logp, {"scale": masked_mean(logp * 0 + params.scale, response_mask)}


@hookimpl
def rlzoo_register_policy_losses(register):
    register("scaled_pg", scaled_pg, params=ScaledParams, description="a test loss")
'''

EAGER_PLUGIN = '''
"""A plugin that uses torch when imported: the command loads torch there, as it must
(so would annotations evaluated at import, without ``from __future__ import annotations``)."""
import torch
import torch.nn.functional as F

from rlzoo.api import hookimpl

EPS = torch.finfo(torch.float32).eps


@torch.no_grad()
def softmax_baseline(token_rewards, response_mask):
    advantages = F.softmax(token_rewards, dim=-1) * response_mask + EPS * 0
    return advantages, advantages


@hookimpl
def rlzoo_register_advantage_estimators(register):
    register("softmax_baseline", softmax_baseline, description="a test estimator")
'''


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("deferred")
    (root / "light_plugin_mod.py").write_text(LIGHT_PLUGIN)
    (root / "eager_plugin_mod.py").write_text(EAGER_PLUGIN)
    (root / "light.yaml").write_text("plugins: [light_plugin_mod]\npolicy_loss: {name: scaled_pg, scale: 2.0}\n")
    (root / "eager.yaml").write_text("plugins: [eager_plugin_mod]\nadvantage: softmax_baseline\n")
    try:
        importlib.metadata.distribution("rlzoo-example")
    except importlib.metadata.PackageNotFoundError:  # README's test command installs only rlzoo: install it here
        example = Path(__file__).resolve().parents[1] / "plugins" / "rlzoo-example"
        shutil.copytree(example / "rlzoo_example", root / "rlzoo_example")
        info = root / "rlzoo_example-0.2.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rlzoo-example\nVersion: 0.2.0\n")
        (info / "entry_points.txt").write_text("[rlzoo]\nexample = rlzoo_example\n")
    return root


TORCH_FREE = [
    ["list"], ["list", "--json"], ["list", "--kind", "advantage"],
    ["config"], ["config", "algo=ppo"], ["config", "algo=rank_ppo"],
    ["explain", "algo=dapo"], ["explain", "--presets-markdown"],
    ["diff", "algo=ppo", "algo=grpo"], ["diff", "--b", "policy_loss=ppo_penalty"],
    ["config", "--config", "light.yaml"], ["explain", "--config", "light.yaml"],
    ["config", "policy_loss={name: scaled_pg, scale: -1}", "plugins=[light_plugin_mod]"],
    ["config", "algo=no_such_algo"],
]
"""Quick commands that load no torch: rlzoo's own plugins, the installed third-party
rlzoo-example (its ``rank_ppo`` preset and ``ppo_penalty`` loss), a plugin named in a config
file's ``plugins:`` key, and bad input (the errors print the same)."""

TORCH_AT_IMPORT = [["config", "--config", "eager.yaml"], ["explain", "--config", "eager.yaml"], ["list"]]
"""A plugin that uses torch at import time (``import torch.nn.functional``,
``@torch.no_grad()``, ``torch.finfo``): torch loads there."""


def test_the_quick_commands_print_the_same_with_torch_deferred_and_load_none(workspace: Path) -> None:
    commands = TORCH_FREE + TORCH_AT_IMPORT
    eager = run_commands("eager", commands, workspace)
    deferred = run_commands("deferred", commands, workspace)
    for before, after in zip(eager, deferred, strict=True):
        assert (after["code"], after["out"], after["err"]) == (before["code"], before["out"], before["err"]), \
            after["argv"]
    ran = {" ".join(r["argv"]): r for r in deferred}
    assert [argv for argv, r in ran.items() if r["code"]] == [
        "config policy_loss={name: scaled_pg, scale: -1} plugins=[light_plugin_mod]",
        "config algo=no_such_algo"]
    assert "rank_ppo" in ran["list"]["out"]
    assert "ppo_penalty" in ran["diff --b policy_loss=ppo_penalty"]["out"]
    assert "scaled_pg" in ran["config --config light.yaml"]["out"]
    refused = ran["config policy_loss={name: scaled_pg, scale: -1} plugins=[light_plugin_mod]"]
    assert "scale must be > 0" in refused["err"]
    assert "softmax_baseline" in ran["config --config eager.yaml"]["out"]
    loaded = [r["torch"] for r in deferred]
    assert loaded == [False] * len(TORCH_FREE) + [True] * len(TORCH_AT_IMPORT), list(zip(commands, loaded))


def run_python(code: str, cwd: Path) -> str:
    """The stdout of ``code`` run by a fresh interpreter in ``cwd`` (also on the import path)."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=cwd,
                            env=_env(cwd), check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


RUN_LOG = """
import pathlib
_log = pathlib.Path(__file__).parent.parent / "runs.txt"
_log.write_text((_log.read_text() if _log.exists() else "") + {letter!r})
"""
"""Appends ``letter`` to ``runs.txt`` beside the package each time the module runs."""


@pytest.fixture()
def package(tmp_path: Path) -> Path:
    """A package ``defer_me`` whose imports are observable (each module writes its letter
    to ``runs.txt`` when it runs: ``p`` the package, ``i`` and ``o`` its submodules): it
    imports its submodule ``inner`` itself and leaves ``outer`` to be imported."""
    pkg = tmp_path / "defer_me"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(RUN_LOG.format(letter="p") + "from defer_me import inner\nVALUE = 42\n")
    (pkg / "inner.py").write_text(RUN_LOG.format(letter="i") + "import defer_me\nINNER = 'inner'\n")
    (pkg / "outer.py").write_text(RUN_LOG.format(letter="o") + "import defer_me\nOUTER = defer_me.VALUE + 1\n")
    (tmp_path / "failing.py").write_text(textwrap.dedent("""
        import pathlib
        _flag = pathlib.Path(__file__).parent / "fail.txt"
        if _flag.exists():
            raise RuntimeError("boom")
        OK = True
    """))
    return tmp_path


def test_a_deferred_package_runs_once_on_first_use(package: Path) -> None:
    out = run_python("""
        import pathlib, sys
        from rlzoo.core.deferred import defer_imports, loaded
        defer_imports(["defer_me"])
        import defer_me
        import defer_me as again
        runs = pathlib.Path("runs.txt")
        print(loaded("defer_me"), runs.exists(), again is defer_me, defer_me.__name__, defer_me.__spec__.name)
        print(defer_me.VALUE, loaded("defer_me"), runs.read_text(), sys.modules["defer_me"] is defer_me)
        import defer_me
        print(defer_me.inner.INNER, runs.read_text(), hasattr(defer_me, "__path__"))
    """, package)
    assert out.splitlines() == ["False False True defer_me defer_me", "42 True pi True", "inner pi True"]


@pytest.mark.parametrize("statement, expression", [
    ("import defer_me.inner as m", "m.INNER"),       # a submodule the package imports itself
    ("from defer_me import inner as m", "m.INNER"),
    ("import defer_me.outer as m", "m.OUTER"),       # one it does not
    ("from defer_me.outer import OUTER as m", "m"),
])
def test_importing_a_submodule_runs_the_package_first_and_each_module_once(
        package: Path, statement: str, expression: str) -> None:
    out = run_python(f"""
        import pathlib, sys
        from rlzoo.core.deferred import defer_imports, loaded
        defer_imports(["defer_me"])
        import defer_me
        {statement}
        print({expression}, loaded("defer_me"), pathlib.Path("runs.txt").read_text(),
              sys.modules["defer_me.inner"] is defer_me.inner, defer_me.inner.__spec__.name)
    """, package)
    value, runs = ("inner", "pi") if "inner" in statement else ("43", "pio")
    assert out.split() == [value, "True", runs, "True", "defer_me.inner"]


def test_a_deferred_import_that_fails_raises_on_use_and_is_retried(package: Path) -> None:
    (package / "fail.txt").write_text("")
    out = run_python("""
        import pathlib, sys
        from rlzoo.core.deferred import defer_imports
        defer_imports(["failing"])
        import failing
        try:
            failing.OK
        except RuntimeError as exc:
            print("raised", exc, "failing" in sys.modules)
        pathlib.Path("fail.txt").unlink()
        import failing
        print(failing.OK)
    """, package)
    assert out.splitlines() == ["raised boom False", "True"]


def test_an_absent_or_already_imported_package_is_not_deferred(package: Path) -> None:
    out = run_python("""
        import defer_me
        from rlzoo.core.deferred import defer_imports, loaded
        defer_imports(["defer_me", "no_such_package_here"])
        print(loaded("defer_me"))
        try:
            import no_such_package_here
        except ModuleNotFoundError as exc:
            print(exc.name)
    """, package)
    assert out.split() == ["True", "no_such_package_here"]


def test_no_grad_leaves_torch_unloaded_until_the_first_call_and_then_acts_as_torch_s(tmp_path: Path) -> None:
    out = run_python("""
        import inspect
        from rlzoo.core.deferred import defer_imports, loaded, no_grad
        defer_imports()
        import torch

        @no_grad
        def double(x: "torch.Tensor", *, by: int = 2) -> "torch.Tensor":
            '''Doubles.'''
            return x * by

        @no_grad
        def steps(x):
            for _ in range(2):
                yield torch.is_grad_enabled(), x * 2

        print(loaded("torch"), double.__name__, double.__doc__, inspect.signature(double))
        x = torch.ones(2, requires_grad=True)
        y = double(x)
        print(loaded("torch"), y.requires_grad, torch.is_grad_enabled(), y.tolist())
        print([(enabled, z.requires_grad) for enabled, z in steps(x)], torch.is_grad_enabled())
    """, tmp_path)
    assert out.splitlines() == [
        "False double Doubles. (x: 'torch.Tensor', *, by: int = 2) -> 'torch.Tensor'",
        "True False True [2.0, 2.0]",
        "[(False, False), (False, False)] True",
    ]
