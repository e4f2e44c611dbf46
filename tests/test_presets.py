"""Presets are their papers' recipes: cards with sources, explain / diff, the generated
presets page, and update structures under which the policy losses differ."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import pytest
import torch

from rlzoo.commands.cli import main
from rlzoo.plan.run_input import load_run
from rlzoo.plan.planner import load_config
from rlzoo.commands.explain import presets_markdown
from rlzoo.contract.loading import build_registry, make_plugin_manager
from rlzoo.config.preset_cards import load_preset
from rlzoo.run.trainer import Trainer
from zoo import REGISTRY, builtin_names

ROOT = Path(__file__).parents[1]
PRESETS = builtin_names("algorithm")


@pytest.mark.parametrize("name", PRESETS)
def test_every_knob_a_preset_sets_has_a_source_and_every_card_entry_is_a_set_knob(name: str) -> None:
    preset = load_preset(REGISTRY.get("algorithm", name))
    assert preset.paper and preset.description
    missing = [key for key in preset.set_keys() if preset.entry_for(key) is None]
    assert missing == [], f"{name}: knobs without a source: {missing}"
    set_keys = preset.set_keys()
    stale = [key for key in preset.card if not any(k == key or k.startswith(key + ".") for k in set_keys)]
    assert stale == [], f"{name}: card entries for knobs the preset does not set: {stale}"


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_runs_several_optimizer_steps_per_rollout_or_has_no_ratio(name: str) -> None:
    """A preset whose loss has an importance ratio never runs one on-policy step (ratio ≡ 1,
    every clip inert): the 0.1 presets all did."""
    resolved = load_config(REGISTRY, [f"algo={name}"])
    loss = resolved.components["policy_loss"]
    assert loss.meta.get("ratio_free") or not resolved.plan.update.on_policy, name
    assert not any("on-policy update" in w for w in resolved.plan.warnings), name


def test_presets_page_is_generated_from_the_cards_and_current() -> None:
    page = (ROOT / "docs" / "algorithms" / "presets.md").read_text()
    assert page == presets_markdown(REGISTRY), \
        "regenerate it: rlzoo explain --presets-markdown > docs/algorithms/presets.md"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", PRESETS)
def test_explain_prints_every_preset_knob_with_its_source_and_the_plan(capsys, name: str) -> None:
    code, out, err = _run(capsys, "explain", f"algo={name}")
    assert code == 0, err
    preset = load_preset(REGISTRY.get("algorithm", name))
    for key in preset.set_keys():
        lines = [line for line in out.splitlines() if line.split(" ")[0] in (key, f"{key}.name")
                 or line.startswith((key + ".", key + "["))]
        assert lines and all(f"[preset {name}]" in line for line in lines if "[default of" not in line), key
        assert preset.entry_for(key).source[:40] in out, key
    assert "# run plan" in out and "optimizer step(s) per step" in out


def test_explain_names_inert_knobs_and_the_layer_of_each_value(capsys) -> None:
    code, out, err = _run(capsys, "explain", "algo=dapo", "kl.estimator=k1", "trainer.lr=0.001")
    assert code == 0, err
    lines = {line.split()[0]: line for line in out.splitlines() if line and not line.startswith(("#", " "))}
    assert "[command line]" in lines["trainer.lr"] and "[defaults]" in lines["trainer.total_steps"]
    assert "[preset dapo]" in lines["policy_loss.clip_high"] and "DAPO §3.1" in lines["policy_loss.name"]
    assert lines["policy_loss.clip_high"].endswith("source: see policy_loss.name")  # the card entry, printed once
    assert "unused: kl.coef = 0" in lines["kl.estimator.name"]
    assert "warning: kl.coef=0" in out


def test_diff_lists_the_knobs_that_differ_with_their_sources(capsys) -> None:
    code, out, err = _run(capsys, "diff", "algo=grpo", "algo=dapo")
    assert code == 0, err
    rows = {line.split("|")[1].strip(" `"): line for line in out.splitlines() if line.startswith("| `")}
    assert {"policy_loss.clip_high", "loss_agg.name", "trainer.num_mini_batches", "extensions", "kl.coef"} <= set(rows)
    assert "`0.28` [preset dapo; clip-higher" in rows["policy_loss.clip_high"]
    assert "advantage.name" not in rows                                   # both grpo
    assert "# plan lines only in algo=grpo" in out
    code, out, _ = _run(capsys, "diff", "algo=grpo", "algo=grpo")
    assert code == 0 and "resolve to the same knobs and plan" in out
    code, out, err = _run(capsys, "diff", "algo=grpo", "--b", "trainer.lr=0.001")
    assert code == 2 and "two algo= items" in err


def test_explain_and_diff_work_for_a_third_party_preset_with_its_card(capsys, plugin_module) -> None:
    name = plugin_module("""
from rlzoo.api import hookimpl
@hookimpl
def rlzoo_register_algorithms(register):
    register("grpo_wide", {"policy_loss": {"name": "ppo_clip", "clip_high": 0.4}, "trainer": {"num_mini_batches": 2}},
             description="GRPO with a wide clip", card={"policy_loss": "my paper, table 2",
                                                         "trainer.num_mini_batches": {"source": "my code",
                                                                                      "deviation": "halved"}})
""")
    code, out, err = _run(capsys, "explain", f"plugins=[{name}]", "algo=grpo_wide")
    assert code == 0, err
    assert "my paper, table 2" in out and "my code; deviates: halved" in out
    code, out, err = _run(capsys, "diff", f"plugins=[{name}]", "algo=grpo", "algo=grpo_wide")
    assert code == 0, err
    assert "my paper, table 2" in out


# ------------------------------------------------------------- the losses act and differ

PM = make_plugin_manager()
REG = build_registry(PM)


def _trainer(run_dir: Path, *overrides: str) -> Trainer:
    return Trainer(load_run(REG, ["algo=grpo", f"run_dir={run_dir}", "logging.progress=false", *overrides]), PM)


def _scored_batch(run_dir: Path):
    trainer = _trainer(run_dir)
    batch = trainer.sampler.sample(16)
    trainer.close()
    scores = torch.rand(len(batch), generator=torch.Generator().manual_seed(7))
    batch.scores, batch.rewards = scores, scores.clone()
    return batch


def _update(run_dir: Path, batch, *overrides: str) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy's parameters after one learn() on a copy of ``batch`` (same init, same RNG)."""
    trainer = _trainer(run_dir, *overrides)
    torch.manual_seed(1)
    metrics = trainer.learn(copy.deepcopy(batch))
    trainer.close()
    return torch.cat([p.detach().flatten() for p in trainer.models.policy.parameters()]), metrics


@pytest.mark.slow
def test_policy_losses_give_pairwise_different_updates_under_the_grpo_update_structure(tmp_path: Path) -> None:
    batch = _scored_batch(tmp_path / "sample")
    losses = ["ppo_clip", "vanilla_pg", "cispo", "gspo", "sapo", "{name: dual_clip, clip_ratio_c: 1.25}"]
    params = {loss: _update(tmp_path / f"l{i}", batch, f"policy_loss={loss}")[0] for i, loss in enumerate(losses)}
    for a, b in itertools.combinations(losses, 2):
        assert (params[a] - params[b]).abs().max() > 1e-6, (a, b)
    # dual clip with its paper's c = 3 bounds only negative-advantage tokens whose ratio
    # exceeded 3: synchronous updates never get there on this batch, so it is ppo_clip
    default_dual, metrics = _update(tmp_path / "dual", batch, "policy_loss=dual_clip")
    assert metrics["policy/clipfrac_lower"] == 0.0 and torch.equal(default_dual, params["ppo_clip"])


@pytest.mark.slow
def test_default_run_ppo_clip_and_vanilla_pg_no_longer_train_to_identical_weights(tmp_path: Path) -> None:
    weights = {}
    for loss in ("ppo_clip", "vanilla_pg"):
        trainer = _trainer(tmp_path / loss, f"policy_loss={loss}")
        clipfrac = [trainer.train_step()["policy/clipfrac"] for _ in range(5)]
        trainer.close()
        weights[loss] = torch.cat([p.detach().flatten() for p in trainer.models.policy.parameters()])
        if loss == "ppo_clip":
            assert sum(clipfrac) > 0, "the default grpo run never clips"
    assert (weights["ppo_clip"] - weights["vanilla_pg"]).abs().max() > 1e-6
