"""The figures of docs/diagnostics.md's gallery: per finding, the sick run's curves beside the
fixed run's, each figure titled with the two commands that made the runs.

    python benchmarks/diagnostics_gallery.py runs/doctor docs/images     # after the gallery's commands
    python benchmarks/diagnostics_gallery.py runs/doctor docs/images --only heldout_fall

Each run directory is ``RUNS/<name>`` as the gallery's commands write it (``run_dir=runs/doctor/<name>``);
also prints ``rlzoo doctor``'s report of every run, as the page shows it.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from rlzoo.commands.doctor import examine, report  # noqa: E402
from rlzoo.core.events import read_scalars  # noqa: E402
from plots import smooth  # noqa: E402  (benchmarks/plots.py, beside this script)

COMMON = "trainer.threads=1"
PADDED = "trainer.padding_free=false"
"""The runs made before packed passes became the default keep their padded passes (docs/diagnostics.md)."""
GALLERY: dict[str, tuple[tuple[str, str], tuple[str, str], tuple[str, ...]]] = {
    # finding: ((sick run, its overrides), (fixed run, its overrides), tags to plot)
    "heldout_fall": (("default", ""), ("default-cosine", f"trainer.lr_schedule=cosine {PADDED}"),
                     ("reward/mean", "eval/greedy_accuracy", "reward/zero_std_frac")),
    "entropy_collapse": (("lr4x", "trainer.lr=2e-3 trainer.total_steps=600"), ("default", ""),
                         ("entropy", "reward/mean", "eval/greedy_accuracy")),
    "step_too_big": (("lr10x", "trainer.lr=5e-3 trainer.total_steps=300"),
                     ("base300", "trainer.total_steps=300"),
                     ("policy/approx_kl", "policy/clipfrac", "reward/mean")),
    "step_too_big_epochs": (("epochs", "trainer.update_epochs=4 trainer.num_mini_batches=8 trainer.total_steps=200"),
                            ("base300", "trainer.total_steps=300"),
                            ("policy/clipfrac", "policy/approx_kl", "reward/mean")),
    "truncation": (("maxnew3", "rollout.max_new_tokens=3 trainer.total_steps=200"),
                   ("base300", "trainer.total_steps=300"),
                   ("reward/max", "response_length/truncated_frac", "reward/mean")),
    "zero_variance_groups": (("easy", "task.num_digits=2 rollout.max_new_tokens=4 rollout.n=16 "
                                      "trainer.total_steps=300"),
                             ("easy-ds", "task.num_digits=2 rollout.max_new_tokens=4 rollout.n=16 "
                                         "extensions=[dynamic_sampling] trainer.total_steps=300"),
                             ("reward/zero_std_frac", "reward/mean", "grad_norm")),
    "proxy_over_optimised": (("rm-kl0", RM := "algo=grpo 'reward=[{name: reward_model, path: "
                                               "runs/doctor/rm-sort/reward_model}, {name: sorted_digits, weight: 0}]' "
                                               f"trainer.total_steps=200 eval.size=0 kl.coef=0 {PADDED}"),
                             ("rm-kl0.05", RM.replace("kl.coef=0", "kl.coef=0.05")),
                             ("reward/proxy", "reward/gold", "kl/value")),
    "critic_lagging": (("ppo-critic-slow", "algo=ppo trainer.critic_lr=1e-6 trainer.total_steps=300 eval.every=50"),
                       ("ppo", "algo=ppo trainer.total_steps=300 eval.every=50"),
                       ("value/explained_var", "value/loss", "reward/mean")),
    "kl_pinned": (("klpin100", "kl.apply=reward 'kl.controller={name: adaptive, target: 2.0, horizon: 100}' "
                               f"trainer.total_steps=300 {PADDED}"),
                  ("klpin100-fix", "kl.apply=reward 'kl.controller={name: adaptive, target: 6.0, horizon: 100}' "
                                   f"trainer.total_steps=300 {PADDED}"),
                  ("kl/sequence_sum", "kl/coef", "reward/mean")),
    "rollout_mismatch": (("stale4", f"rollout.staleness=4 trainer.total_steps=300 {PADDED}"),
                         ("base300", "trainer.total_steps=300"),
                         ("rollout/mismatch_k3", "reward/mean", "policy/clipfrac")),
    "warmup_unfinished": (("warmup", "trainer.warmup_steps=1000 trainer.lr_schedule=cosine trainer.total_steps=300"),
                          ("warmup30", "trainer.warmup_steps=30 trainer.lr_schedule=cosine trainer.total_steps=300"),
                          ("lr", "reward/mean", "entropy")),
    "constant_reward": (("format", "reward=format trainer.total_steps=100"), ("base100", "trainer.total_steps=100"),
                        ("reward/mean", "entropy", "eval/greedy_accuracy")),
    "first_steps_too_big": (("lr0.05", "trainer.lr=0.05 trainer.total_steps=100"),
                            ("lr0.01", "trainer.lr=0.01 trainer.total_steps=100"),
                            ("policy/approx_kl", "entropy", "reward/mean")),
    "kl_pins_policy": (("kl10", "kl.coef=10 trainer.total_steps=100"), ("kl0.3", "kl.coef=0.3 trainer.total_steps=100"),
                       ("kl/grad_share", "entropy", "reward/mean")),
    "no_variety": (("temp0.05", "rollout.temperature=0.05 trainer.total_steps=100"),
                   ("base100", "trainer.total_steps=100"), ("entropy", "reward/zero_std_frac", "reward/mean")),
    "budget": (("mnt1", "rollout.max_new_tokens=1 trainer.total_steps=100"),
               ("mnt4", "rollout.max_new_tokens=4 trainer.total_steps=100"),
               ("reward/max", "response_length/mean", "reward/mean")),
    "loss_at_zero": (("arith", "task=arithmetic trainer.total_steps=150 eval.size=32"),
                     ("arith-lm", "task=arithmetic 'reward=[exact_match, {name: length_match, weight: 0.1}]' "
                                  "trainer.total_steps=150 eval.size=32"),
                     ("policy/loss", "grad_norm", "reward/mean")),
}
"""Every figure: the finding's name -> the sick and the fixed run (directory name and the
overrides of its ``rlzoo train``), and the tags drawn."""


def command(name: str, overrides: str) -> str:
    """The ``rlzoo train`` command of run ``name``, as the gallery prints it."""
    return " ".join(x for x in ("rlzoo train", overrides, COMMON, f"run_dir=runs/doctor/{name}") if x)


def figure(key: str, runs: Path, out: Path) -> Path:
    """Draw one figure: a panel per tag, the sick run and the fixed run overlaid (10-step means;
    evaluation points as markers)."""
    (sick, sick_args), (fixed, fixed_args), tags = GALLERY[key]
    fig, axes = plt.subplots(1, len(tags), figsize=(4.2 * len(tags), 3.9), dpi=100)
    for (name, _), colour, label in (((sick, sick_args), "tab:red", "sick"), ((fixed, fixed_args), "tab:green",
                                                                              "fixed")):
        curves = read_scalars(runs / name)
        for ax, tag in zip(axes, tags):
            if tag not in curves:
                continue
            steps = np.array([s for s, _ in curves[tag]])
            values = np.array([v for _, v in curves[tag]])
            if tag.startswith("eval/"):
                ax.plot(steps, values, marker="o", color=colour, label=f"{label}: {name}")
            else:
                ax.plot(steps, values, color=colour, alpha=0.15, linewidth=0.8)
                ax.plot(steps, smooth(values, 10), color=colour, label=f"{label}: {name}", linewidth=1.6)
    for ax, tag in zip(axes, tags):
        ax.set_title(tag, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if tag in ("policy/approx_kl", "rollout/mismatch_k3", "value/loss", "kl/coef"):
            ax.set_yscale("symlog", linthresh=1e-4)
    axes[0].legend(fontsize=8)
    title = "\n".join(textwrap.wrap(f"sick: {command(sick, sick_args)}", 150) +
                      textwrap.wrap(f"fixed: {command(fixed, fixed_args)}", 150))
    fig.suptitle(title, fontsize=8, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    path = out / f"doctor_{key}.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="the directory holding the gallery's runs (runs/doctor)")
    parser.add_argument("out", type=Path, help="where the PNGs go (docs/images)")
    parser.add_argument("--only", nargs="*", help="these figures only")
    args = parser.parse_args()
    for key in args.only or GALLERY:
        (sick, _), (fixed, _), _ = GALLERY[key]
        print(f"## {key}: {figure(key, args.runs, args.out)}")
        print(report(examine([args.runs / sick, args.runs / fixed])))


if __name__ == "__main__":
    main()
