"""The ``rlzoo`` command line: train, sft, sweep, compare, config, list.

Every user error (:class:`rlzoo.errors.RlzooError`) prints one line ``rlzoo: error: ...``
and exits with code 2, before any model is built.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from rlzoo.errors import RlzooError
from rlzoo.hookspecs import KIND_TITLES, REGISTRATION_HOOKS

EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlzoo",
        description="A plugin-based zoo of RL algorithms for language models.",
        epilog="Config overrides are key=value items, e.g. "
        "`rlzoo train algo=grpo loss_agg=seq-mean-token-mean trainer.lr=1e-3`.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", metavar="FILE", help="a YAML file of config keys")
        p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                       help="config overrides (dot-list), applied last")

    train = sub.add_parser("train", help="train a policy with RL (the main job)",
                           description="Train a policy with RL. With no arguments: the "
                           "embedded default (tiny model, built-in task) on the CPU.")
    with_config(train)
    sft = sub.add_parser("sft", help="supervised warm-up on a task's reference answers",
                         description="Supervised fine-tuning on the task's reference "
                         "answers; writes a model directory usable as model.path=.")
    with_config(sft)
    sft.add_argument("--steps", type=int, default=100, help="optimizer steps (default 100)")
    sft.add_argument("--out", metavar="DIR", help="where to save the model (default "
                     "runs/<run_name or sft>-<task>/model)")
    sft.add_argument("--target", choices=("answer", "format"), default="answer",
                     help="train on reference answers, or on well-formed unsolved completions "
                     "(a format-only warm-up that leaves the skill to RL)")
    sft.add_argument("--batch-size", type=int, default=64, help="examples per step")

    sweep = sub.add_parser("sweep", help="run the cartesian product of comma-separated values",
                           description="Run one training per combination of comma-separated "
                           "override values (e.g. algo=grpo,rloo seed=0,1,2), each in "
                           "runs/<sweep-name>/<run-name>/. Completed runs are skipped and "
                           "interrupted ones resumed when the sweep is run again.")
    with_config(sweep)
    sweep.add_argument("--name", help="sweep name (default: sweep-<timestamp>)")
    sweep.add_argument("--dir", metavar="DIR", help="sweep directory (default: runs/<name>)")
    sweep.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")

    compare = sub.add_parser("compare", help="table + reward-curve PNG + Markdown report of runs",
                             description="Compare runs (a sweep directory or run directories): "
                             "runs differing only in seed form a group; prints a table and "
                             "writes compare.png and compare.md.")
    compare.add_argument("paths", nargs="+", metavar="DIR", help="sweep or run directories")
    compare.add_argument("--threshold", type=float, default=0.5,
                         help="reward level for 'steps to threshold' (default 0.5)")
    compare.add_argument("--window", type=int, default=25, help="moving-average window (steps)")
    compare.add_argument("--out", metavar="DIR", help="where to write compare.png/.md "
                         "(default: the first path)")

    config = sub.add_parser("config", help="print the fully resolved config (or its run plan) and exit",
                            description="Resolve and check the config exactly as `rlzoo train` would, "
                            "print it and exit; --plan prints the run plan instead (models, passes, "
                            "KL placement, aggregation, update structure, warnings).")
    with_config(config)
    config.add_argument("--plan", action="store_true", help="print the run plan instead of the config")

    listing = sub.add_parser("list", help="list registered components by kind")
    listing.add_argument("--json", action="store_true", help="print JSON instead of text")
    listing.add_argument("--kind", choices=sorted(REGISTRATION_HOOKS), help="only this kind")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlzoo`` console script; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return _COMMANDS[args.command](args)
    except RlzooError as exc:
        print(f"rlzoo: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _resolve_registry(args: argparse.Namespace):
    from rlzoo.config import plugin_modules
    from rlzoo.plugins import build_registry, make_plugin_manager

    pm = make_plugin_manager(modules=plugin_modules(args.overrides, args.config))
    registry = build_registry(pm)
    for error in registry.load_errors:
        print(f"rlzoo: warning: {error}", file=sys.stderr)
    return pm, registry, None


def _resolve(args: argparse.Namespace):
    from rlzoo.config import load_config

    pm, registry, _ = _resolve_registry(args)
    resolved = load_config(registry, args.overrides, args.config)
    return pm, registry, resolved


def _cmd_config(args: argparse.Namespace) -> int:
    _, _, resolved = _resolve(args)
    sys.stdout.write(resolved.plan.render() if args.plan else resolved.to_yaml())
    return 0


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _cmd_train(args: argparse.Namespace) -> int:
    from rlzoo.distributed import launched_by_torchrun
    from rlzoo.trainer import train

    pm, registry, resolved = _resolve(args)
    nproc = int(resolved.cfg.launcher.nproc)
    if nproc > 1 and not launched_by_torchrun():
        return _launch_torchrun(args, nproc)
    if int(os.environ.get("RANK", "0")) == 0:
        for warning in resolved.plan.warnings:
            print(f"rlzoo: warning: {warning}", file=sys.stderr)
    _quiet_transformers()
    train(resolved, registry, pm)
    return 0


def _launch_torchrun(args: argparse.Namespace, nproc: int) -> int:
    """Re-run this ``rlzoo train`` under ``torchrun --standalone`` with ``nproc`` processes
    (the plan has checked that the batch splits into whole groups per process)."""
    import subprocess

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "rlzoo", "train", *args.overrides]
    if args.config:
        command += ["--config", args.config]
    print("rlzoo: launching " + " ".join(command[1:]), file=sys.stderr, flush=True)
    return subprocess.call(command)


def _cmd_sft(args: argparse.Namespace) -> int:
    from rlzoo.sft import run_sft

    _, registry, resolved = _resolve(args)
    _quiet_transformers()
    out = run_sft(resolved, registry, steps=args.steps, out_dir=args.out, target=args.target,
                  batch_size=args.batch_size)
    print(f"saved the SFT model to {out}; train from it with model.path={out}")
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from datetime import datetime
    from pathlib import Path

    from rlzoo.sweep import run_sweep

    _, registry, _ = _resolve_registry(args)
    name = args.name or f"sweep-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    sweep_dir = Path(args.dir) if args.dir else Path("runs") / name
    results = run_sweep(sweep_dir, args.overrides, registry, args.config, args.jobs)
    failed = [run.name for run, outcome in results if outcome.startswith("failed")]
    print(f"sweep {sweep_dir}: {len(results) - len(failed)} of {len(results)} runs done; compare "
          f"with `rlzoo compare {sweep_dir}` or `tensorboard --logdir {sweep_dir}`")
    if failed:
        print(f"rlzoo: error: failed runs: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from rlzoo.compare import compare

    text, png, report = compare(args.paths, args.out, args.threshold, args.window)
    print(text)
    print(f"\nwrote {png} and {report}")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from rlzoo.config import describe_params
    from rlzoo.plugins import build_registry, make_plugin_manager

    registry = build_registry(make_plugin_manager(), strict=False)  # report name collisions, list the rest
    kinds = [args.kind] if args.kind else list(REGISTRATION_HOOKS)
    entries = [
        {
            "kind": c.kind,
            "name": c.name,
            "aliases": list(c.aliases),
            "package": c.package,
            "plugin": c.plugin,
            "description": c.description,
            "paper": c.paper,
            "needs": sorted(c.needs),
            "inputs": list(c.inputs),
            "params": describe_params(c),
        }
        for kind in kinds
        for c in registry.components(kind)
    ]
    errors = [str(e) for e in registry.load_errors]
    if args.json:
        print(json.dumps({"components": entries, "errors": errors}, indent=2))
    else:
        for kind in kinds:
            rows = [e for e in entries if e["kind"] == kind]
            print(f"{KIND_TITLES[kind]} ({kind}):")
            if not rows:
                print("  (none)")
            width = max((len(r["name"]) for r in rows), default=0)
            pkg_width = max((len(r["package"]) for r in entries), default=0)
            for row in rows:
                extra = []
                if row["aliases"]:
                    extra.append("aliases: " + ", ".join(row["aliases"]))
                if row["needs"]:
                    extra.append("needs: " + ", ".join(row["needs"]))
                if row["paper"]:
                    extra.append(row["paper"])
                tail = f" [{'; '.join(extra)}]" if extra else ""
                print(f"  {row['name']:<{width}}  {row['package']:<{pkg_width}}  {row['description']}{tail}")
            print()
    for error in errors:
        print(f"rlzoo: error: {error}", file=sys.stderr)
    return EXIT_USAGE if errors else 0


_COMMANDS = {"train": _cmd_train, "sft": _cmd_sft, "sweep": _cmd_sweep, "compare": _cmd_compare,
             "config": _cmd_config, "list": _cmd_list}
