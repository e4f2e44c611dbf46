"""The ``rlzoo`` command line: train, sft, rm, sweep, compare, doctor, config, explain, diff, ab, export, list.

Every user error (:class:`rlzoo.core.errors.RlzooError`) prints one line ``rlzoo: error: ...``
and exits with code 2, before any model is built.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from rlzoo.contract.hookspecs import KIND_TITLES, REGISTRATION_HOOKS
from rlzoo.core.deferred import defer_imports
from rlzoo.core.errors import ConfigError, DuplicateComponentError, RefusedComponentError, RlzooError, say
from rlzoo.core.processes import share_cores_politely

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
QUICK_COMMANDS = frozenset({"list", "config", "explain", "diff"})
"""The commands that read the plugins and the config but run no torch code: they defer torch's
import (:func:`rlzoo.core.deferred.defer_imports`), which loads only if something uses it."""


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

    def with_baseline(p: argparse.ArgumentParser) -> None:
        p.add_argument("--baseline", action="append", metavar="KEY=VALUE", help="the group differences are taken "
                       "to (algo=grpo; repeat for several keys); default: the best final --metric")
        p.add_argument("--metric", default="eval/greedy_accuracy", metavar="TAG", help="the per-prompt eval/ tag "
                       "of the differences (eval/greedy_accuracy)")
        p.add_argument("--min-effect", type=float, metavar="DELTA", help="the seeds that resolve DELTA (0..1)")

    train = sub.add_parser("train", help="train a policy with RL (the main job)",
                           description="Train a policy with RL. With no arguments: the "
                           "embedded default (tiny model, built-in task) on the CPU.")
    with_config(train)
    train.add_argument("--overwrite", action="store_true",
                       help="start over in a run_dir that holds another run: delete that run's files "
                       "first (without it, such a run_dir is refused)")
    sft = sub.add_parser("sft", help="supervised warm-up on a task's reference answers",
                         description="Supervised fine-tuning on the task's reference "
                         "answers; writes a model directory usable as model.path=.")
    with_config(sft)
    sft.add_argument("--steps", type=int, default=100, help="optimizer steps (default 100)")
    sft.add_argument("--out", metavar="DIR", help="where to save the model: a new or empty directory (default "
                     "runs/<run_name or sft>-<task>/model)")
    sft.add_argument("--target", choices=("answer", "format"), default="answer",
                     help="train on reference answers (with env: the environment's demonstration "
                     "episodes, the loss on the policy's turns only), or on well-formed unsolved completions "
                     "(a format-only warm-up that leaves the skill to RL)")
    sft.add_argument("--batch-size", type=int, default=64, help="examples per step")

    rm = sub.add_parser("rm", help="train a reward model from preference pairs (rm.data=FILE)",
                        description="Train a reward model from pairwise preferences (rm.data: a .jsonl or "
                        ".parquet file with prompt, chosen, rejected and an optional margin) with the "
                        "Bradley-Terry loss; writes <run_dir>/reward_model/, which "
                        "reward={name: reward_model, path: DIR} scores with. resume=RUN_DIR continues a run.")
    with_config(rm)
    rm.add_argument("--overwrite", action="store_true",
                    help="start over in a run_dir that holds another run: delete that run's files first")

    sweep = sub.add_parser("sweep", help="run the cartesian product of comma-separated values",
                           description="Run one training per combination of comma-separated "
                           "override values (e.g. algo=grpo,rloo seed=0,1,2), each in "
                           "runs/<sweep-name>/<run-name>/. Completed runs are skipped and "
                           "interrupted ones resumed when the sweep is run again.")
    with_config(sweep)
    sweep.add_argument("--name", help="sweep name (default: sweep-<timestamp>)")
    sweep.add_argument("--dir", metavar="DIR", help="sweep directory (default: runs/<name>)")
    sweep.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    sweep.add_argument("--until-resolved", action="store_true", help="after seed=a,b,..., add a seed per round to "
                       "the baseline and each group whose difference to it is not resolved (docs/compare.md)")
    sweep.add_argument("--max-seeds", type=int, metavar="N", help="--until-resolved: at most N seeds a group (6)")
    with_baseline(sweep)

    compare = sub.add_parser("compare", help="table with 95%% intervals, differences to a baseline, PNGs, reports",
                             description="Compare runs (sweep or run directories): runs differing only in seed "
                             "form a group; prints a table with 95%% intervals and each group's difference to the "
                             "baseline; writes compare.png, compare_differences.png, compare.md and compare.json.")
    compare.add_argument("paths", nargs="+", metavar="DIR", help="sweep or run directories")
    compare.add_argument("--threshold", type=float, default=0.5, help="reward level for 'steps to T' (0.5)")
    compare.add_argument("--window", type=int, default=25, help="moving-average window (steps)")
    compare.add_argument("--out", metavar="DIR", help="where to write its files (default: the first path)")
    compare.add_argument("--x", metavar="KEY", help="also compare_KEY.png: the final reward and accuracy against a "
                         "numeric key that separates the groups (e.g. rollout.staleness)")
    with_baseline(compare)
    compare.add_argument("--json", action="store_true", help="print compare.json (every number), not the table")

    doctor = sub.add_parser("doctor", help="what went wrong in runs (RUN_DIR ...), or what a config will cost "
                            "(--plan)", description="Post-mortem (rlzoo doctor RUN_DIR [RUN_DIR ...]): read each run's "
                            "logged curves and report every pathology found (entropy collapse, KL blow-up, steps too "
                            "big, rollout mismatch, zero-variance groups, truncation, gradient spikes, non-finite "
                            "values, a dead loss, a lagging critic, a held-out fall, proxy over-optimisation, "
                            "schedules that never act) with the steps and values that show it, the likely cause and "
                            "the overrides to try. Pre-flight (rlzoo doctor --plan [--config FILE] [KEY=VALUE ...]): "
                            "the estimated peak memory and step time of the run, against this machine's free "
                            "memory, before any model is built.")
    doctor.add_argument("--plan", action="store_true", help="estimate a config's cost instead (the items are "
                        "config overrides)")
    doctor.add_argument("--config", metavar="FILE", help="with --plan: a YAML file of config keys")
    doctor.add_argument("--strict", action="store_true", help="exit 2 when a run has a finding, or (--plan) the "
                        "estimate does not fit")
    doctor.add_argument("items", nargs="*", metavar="RUN_DIR|KEY=VALUE",
                        help="run (or sweep) directories; with --plan, config overrides")

    config = sub.add_parser("config", help="print the fully resolved config (or its run plan) and exit",
                            description="Resolve and check the config exactly as `rlzoo train` would, "
                            "print it and exit; --plan prints the run plan instead (models, passes, "
                            "KL placement, aggregation, update structure, warnings) and the pre-flight estimate of "
                            "its peak memory and step time (rlzoo doctor --plan).")
    with_config(config)
    config.add_argument("--plan", action="store_true", help="print the run plan instead of the config")

    explain = sub.add_parser("explain", help="the run's knobs with their sources, and its run plan",
                             description="Resolve the config as `rlzoo train` would and print every "
                             "knob that changes what the run computes with its value, the layer that set it and, "
                             "for a preset's "
                             "knobs, the preset card's source and deviation; then the run plan (models, "
                             "passes, KL placement and units, aggregation, update structure) and warnings "
                             "for choices that cannot act.")
    with_config(explain)
    explain.add_argument("--presets-markdown", action="store_true",
                         help="print docs/algorithms/presets.md (every built-in preset's card) instead")
    explain.add_argument("--default-yaml", action="store_true",
                         help="print configs/default.yaml as the key records write it (rlzoo/config/keys*.py)")
    explain.add_argument("--keys-markdown", action="store_true",
                         help="print docs/config.md's key tables as the key records write them")

    diff = sub.add_parser("diff", help="the knobs two configs set differently, with their sources",
                          description="Resolve two configs and print the knobs and plan lines that "
                          "differ. `rlzoo diff algo=grpo algo=dapo [common overrides]`: two algo= items "
                          "choose the two sides; --a / --b add side-specific overrides.")
    with_config(diff)
    diff.add_argument("--a", nargs="*", default=[], metavar="KEY=VALUE", help="overrides of side A only")
    diff.add_argument("--b", nargs="*", default=[], metavar="KEY=VALUE", help="overrides of side B only")

    ab = sub.add_parser("ab", help="train two learners on the identical recorded rollouts of a run",
                        description="Replay the rollouts a run recorded (rollout.record=true) through two "
                        "learners, A and B, each the run's config plus its overrides, from the run's initial "
                        "weights and with the same mini-batch shuffles; report per step the cosine between "
                        "their updates, KL(A||B) on the batch, each one's distance from the recording policy "
                        "and its update metrics, to TensorBoard (ab/...) and ab.png.")
    ab.add_argument("run_dir", metavar="RUN_DIR", help="a run recorded with rollout.record=true")
    ab.add_argument("--a", nargs="*", default=[], metavar="KEY=VALUE", help="overrides of learner A")
    ab.add_argument("--b", nargs="*", default=[], metavar="KEY=VALUE", help="overrides of learner B")
    ab.add_argument("--steps", type=int, help="replay only the first N recorded steps")
    ab.add_argument("--out", metavar="DIR", help="output directory, new or empty (default RUN_DIR-ab-<timestamp>)")

    export = sub.add_parser("export", help="write a run's trained policy as a model directory (LoRA merged)",
                            description="Write the policy of a run's newest intact checkpoint (or --step's) "
                            "to OUT as a transformers model directory with its tokenizer, loadable as "
                            "model.path=OUT; a LoRA run's adapters are merged into its base weights.")
    export.add_argument("run_dir", metavar="RUN_DIR", help="a run directory")
    export.add_argument("out", metavar="OUT", help="a new (or empty) directory to write")
    export.add_argument("--step", type=int, help="export this step's checkpoint (default: the newest intact one)")

    listing = sub.add_parser("list", help="list registered components by kind")
    listing.add_argument("--json", action="store_true", help="print JSON instead of text")
    listing.add_argument("--kind", choices=sorted(REGISTRATION_HOOKS), help="only this kind")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlzoo`` console script; returns the exit code."""
    share_cores_politely()  # before any subcommand imports torch
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if args.command in QUICK_COMMANDS:
        defer_imports()
    try:
        return _COMMANDS[args.command](args)
    except RlzooError as exc:
        say(f"rlzoo: error: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        say("rlzoo: error: interrupted (Ctrl-C); a run's newest complete checkpoint stays resumable")
        return EXIT_INTERRUPTED


def _resolve_registry(args: argparse.Namespace):
    from rlzoo.contract.loading import build_registry, make_plugin_manager
    from rlzoo.run.resume import plugin_modules

    pm = make_plugin_manager(modules=plugin_modules(args.overrides, args.config))
    registry = build_registry(pm)
    for error in registry.load_errors:
        say(f"rlzoo: warning: {error}")
    return pm, registry, None


def _resolve(args: argparse.Namespace, reward_model: bool = False):
    from rlzoo.run.resume import load_run_config

    pm, registry, _ = _resolve_registry(args)
    resolved = load_run_config(registry, args.overrides, args.config, reward_model)
    return pm, registry, resolved


def _cmd_config(args: argparse.Namespace) -> int:
    _, _, resolved = _resolve(args)
    if not args.plan:
        sys.stdout.write(resolved.to_yaml())
        return 0
    from rlzoo.commands.doctor import preflight

    sys.stdout.write(resolved.plan.render())
    _quiet_transformers()
    sys.stdout.write("\n".join(preflight(resolved).lines()) + "\n")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    if args.plan:
        from rlzoo.commands.doctor import preflight
        args.overrides = args.items
        _, _, resolved = _resolve(args)
        _quiet_transformers()
        found = preflight(resolved)
        sys.stdout.write("\n".join(found.lines()) + "\n")
        return EXIT_USAGE if args.strict and not found.fits else 0
    if args.config:
        raise ConfigError("--config goes with --plan (rlzoo doctor --plan --config FILE); RUN_DIR has its config.yaml")
    if not args.items:
        raise ConfigError("rlzoo doctor needs run directories (rlzoo doctor runs/NAME) or --plan [KEY=VALUE ...]")
    from rlzoo.commands.doctor import examine, report

    results = examine(args.items)
    sys.stdout.write(report(results))
    unreadable = any(result.unreadable for result in results)  # no run in a path, or unreadable logs: named above
    return EXIT_USAGE if unreadable or (args.strict and any(result.findings for result in results)) else 0


def _cmd_explain(args: argparse.Namespace) -> int:
    from rlzoo.commands.explain import default_yaml_text, explain, keys_markdown_text, presets_markdown

    generated = {"presets_markdown": presets_markdown, "default_yaml": default_yaml_text,
                 "keys_markdown": keys_markdown_text}
    for flag, page in generated.items():
        if getattr(args, flag):
            _, registry, _ = _resolve_registry(args)
            sys.stdout.write(page(registry))
            return 0
    _, registry, resolved = _resolve(args)
    sys.stdout.write(explain(resolved, registry))
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    from rlzoo.plan.planner import load_config
    from rlzoo.core.errors import ConfigError
    from rlzoo.commands.explain import diff

    _, registry, _ = _resolve_registry(args)
    algos = [item for item in args.overrides if item.split("=", 1)[0] == "algo"]
    common = [item for item in args.overrides if item.split("=", 1)[0] != "algo"]
    if len(algos) not in (0, 2) or (not algos and not (args.a or args.b)):
        raise ConfigError("rlzoo diff compares two configs: give two algo= items (rlzoo diff algo=grpo "
                          f"algo=dapo) and/or --a / --b overrides; got {len(algos)} algo= item(s)")
    sides = algos or ["", ""]
    left = [*common, *([sides[0]] if sides[0] else []), *args.a]
    right = [*common, *([sides[1]] if sides[1] else []), *args.b]
    labels = (" ".join(x for x in (sides[0], *args.a) if x) or "A",
              " ".join(x for x in (sides[1], *args.b) if x) or "B")
    text = diff(load_config(registry, left, args.config), load_config(registry, right, args.config), registry,
                labels)
    sys.stdout.write(text)
    return 0


def _cmd_ab(args: argparse.Namespace) -> int:
    from rlzoo.commands.ab import run_ab
    from rlzoo.core.errors import ConfigError

    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {args.steps}")
    _quiet_transformers()
    result = run_ab(args.run_dir, args.a, args.b, args.out, args.steps)
    series = result.series
    print("| recorded step | cosine(ΔA, ΔB) | KL(A‖B) | KL(μ‖A) | KL(μ‖B) |\n|---|---|---|---|---|")
    for i, step in enumerate(result.steps):
        print(f"| {step} | {series['ab/cosine'][i]:.4f} | {series['ab/kl_a_b'][i]:.3g} | "
              f"{series['ab/kl_recording_a'][i]:.3g} | {series['ab/kl_recording_b'][i]:.3g} |")
    print(f"\nwrote {result.out_dir / 'ab.png'}; tensorboard --logdir {result.out_dir}")
    return 0


def _quiet_transformers() -> None:
    from rlzoo.models.hf_output import quiet_transformers
    quiet_transformers()


def _cmd_train(args: argparse.Namespace) -> int:
    from rlzoo.core.distributed import launched_by_torchrun
    from rlzoo.diagnostics.preflight import check_fits
    from rlzoo.plan.run_input import engine_input
    from rlzoo.run.trainer import train

    pm, registry, resolved = _resolve(args)
    if args.overwrite and resolved.cfg.resume:
        raise ConfigError("--overwrite starts a new run in place of another; it does not go with resume=")
    if int(os.environ.get("RANK", "0")) == 0 and not resolved.cfg.resume:  # a resume's model.path may be gone
        check_fits(resolved)  # a run that cannot fit is refused before its directory exists
    nproc = int(resolved.cfg.launcher.nproc)
    if nproc > 1 and not launched_by_torchrun():
        return _launch_torchrun(args, resolved, nproc)
    if int(os.environ.get("RANK", "0")) == 0:
        for warning in resolved.plan.warnings:
            say(f"rlzoo: warning: {warning}")
    _quiet_transformers()
    train(engine_input(resolved), pm, overwrite=args.overwrite)
    return 0


def _launch_torchrun(args: argparse.Namespace, resolved, nproc: int, subcommand: str = "train") -> int:
    """Re-run this ``rlzoo train`` (or ``rlzoo rm``) under ``torchrun --standalone`` with
    ``nproc`` processes (the caller has checked that the batch splits over them), after
    checking its run directory as the run will (so a refusal is one line, before launching)."""
    from rlzoo.commands.launcher import launch_torchrun
    from rlzoo.plan.run_input import run_path
    from rlzoo.run.rundir import check_run_dir

    run_dir = run_path(resolved.cfg)
    check_run_dir(run_dir, bool(resolved.cfg.resume), args.overwrite)
    train_args = [*(["--overwrite"] if args.overwrite else []), *args.overrides]
    if not resolved.cfg.resume and not resolved.cfg.run_dir:
        train_args.append(f"run_dir={run_dir}")  # the directory checked here, whatever the time is there
    if args.config:
        train_args += ["--config", args.config]
    return launch_torchrun(train_args, nproc, run_dir, subcommand)


def _cmd_sft(args: argparse.Namespace) -> int:
    from rlzoo.plan.run_input import engine_input
    from rlzoo.run.sft_trainer import default_out, run_sft

    _, registry, resolved = _resolve(args)
    _quiet_transformers()
    run = engine_input(resolved)
    out_dir = Path(args.out) if args.out else default_out(resolved.cfg.run_name, run.components.task.name)
    out = run_sft(run, out_dir, steps=args.steps, target=args.target, batch_size=args.batch_size,
                  out_flag="--out" if args.out else "the default --out")
    print(f"saved the SFT model to {out}; train from it with model.path={out}")
    return 0


def _cmd_rm(args: argparse.Namespace) -> int:
    from rlzoo.core.distributed import launched_by_torchrun
    from rlzoo.plan.planner import reward_model_plan
    from rlzoo.plan.run_input import engine_input
    from rlzoo.run.rm_trainer import check_world, run_rm

    _, _, resolved = _resolve(args, reward_model=True)  # rm trains no policy: the RL plan's checks do not apply
    rm = reward_model_plan(resolved.cfg)
    if args.overwrite and resolved.cfg.resume:
        raise ConfigError("--overwrite starts a new run in place of another; it does not go with resume=")
    nproc = int(resolved.cfg.launcher.nproc)
    if nproc > 1 and not launched_by_torchrun():
        check_world(rm.batch_size, nproc)
        return _launch_torchrun(args, resolved, nproc, "rm")
    _quiet_transformers()
    out = run_rm(engine_input(resolved), rm, overwrite=args.overwrite)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"saved the reward model to {out}; score with reward={{name: reward_model, path: {out}}}")
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from datetime import datetime

    from rlzoo.commands.sweep import run_sweep, until_resolved

    _, registry, _ = _resolve_registry(args)
    name = args.name or f"sweep-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    sweep_dir = Path(args.dir) if args.dir else Path("runs") / name
    if args.until_resolved:
        results = until_resolved(sweep_dir, args.overrides, registry, args.config, args.jobs, args.max_seeds,
                                 args.baseline, args.metric, args.min_effect)
    elif args.max_seeds is not None or args.baseline or args.min_effect is not None:
        raise ConfigError("--max-seeds, --baseline and --min-effect go with --until-resolved (or: rlzoo compare)")
    else:
        results = run_sweep(sweep_dir, args.overrides, registry, args.config, args.jobs)
    failed = [run.name for run, outcome in results if outcome.startswith("failed")]
    done = sum(outcome in ("completed", "skipped") for _, outcome in results)
    print(f"sweep {sweep_dir}: {done} of {len(results)} runs done; compare with `rlzoo compare {sweep_dir}` or "
          f"`tensorboard --logdir {sweep_dir}`")
    if any(outcome == "aborted" for _, outcome in results):
        say("rlzoo: error: sweep aborted by a second Ctrl-C; each run's newest complete checkpoint stays "
            "resumable: run the same sweep command again")
        return EXIT_INTERRUPTED
    if done < len(results) and not failed:
        print("sweep: stopped by a signal; run the same sweep command again to resume it", flush=True)
    if failed:
        say(f"rlzoo: error: failed runs: {', '.join(failed)}")
        return 1
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from rlzoo.commands.compare import compare
    done = compare(args.paths, args.out, args.threshold, args.window, args.x, args.baseline, args.metric,
                   args.min_effect)
    print(done.files[-1].read_text() if args.json else f"{done.text}\n\nwrote {', '.join(map(str, done.files))}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from rlzoo.commands.export import export_policy

    _quiet_transformers()
    checkpoint = export_policy(args.run_dir, args.out, args.step)
    print(f"wrote {args.out} from {checkpoint}; load it with model.path={args.out}")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from rlzoo.config.introspect import describe_params
    from rlzoo.contract.loading import build_registry, make_plugin_manager

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
            # a listing may import a whole library (reasoning-gym's datasets: ~2 s): only when asked for
            "listing": (c.meta["listing"]() if args.kind or args.json else f"more: rlzoo list --kind {c.kind}")
            if callable(c.meta.get("listing")) else None,
        }
        for kind in kinds
        for c in registry.components(kind)
    ]
    # a plugin that failed to load is an error of the whole listing; with --kind only a name
    # collision or a refused component in that kind is (the kind is listed, the rest reported as a warning)
    fatal = [e for e in registry.load_errors
             if not args.kind or (isinstance(e, (DuplicateComponentError, RefusedComponentError))
                                  and e.kind == args.kind)]
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
                if row["listing"]:
                    print(textwrap.fill(row["listing"], 110, initial_indent=" " * 4, subsequent_indent=" " * 6))
            print()
    for error in registry.load_errors:
        if error in fatal:
            say(f"rlzoo: error: {error}")
        else:
            say(f"rlzoo: warning: {error} (any {args.kind} it holds is missing above)")
    return EXIT_USAGE if fatal else 0


_COMMANDS = {"train": _cmd_train, "sft": _cmd_sft, "rm": _cmd_rm, "sweep": _cmd_sweep, "compare": _cmd_compare,
             "doctor": _cmd_doctor, "config": _cmd_config, "explain": _cmd_explain, "diff": _cmd_diff, "ab": _cmd_ab,
             "list": _cmd_list,
             "export": _cmd_export}
