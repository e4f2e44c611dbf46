"""The run plan: decided once from the config, read by the engine, written to the run."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from rlzoo.core.batch import RolloutBatch
from rlzoo.plan.planner import load_config
from rlzoo.learn.learner import _WeightedMeans
from rlzoo.plan.learning import CorrectionStep
from rlzoo.plan.run_input import engine_input, load_run
from rlzoo.contract.loading import build_registry, make_plugin_manager
from rlzoo.run.trainer import Trainer
from zoo import TINY

PM = make_plugin_manager()
REGISTRY = build_registry(PM)


def plan_of(*overrides: str):
    return load_config(REGISTRY, list(overrides)).plan


def modes(plan) -> dict[str, str]:
    """Loss term -> the name of its aggregation."""
    return {name: term.mode for name, term in plan.terms.items()}


def masks(plan) -> dict[str, str]:
    """Loss term -> its mask."""
    return {name: term.mask for name, term in plan.terms.items()}


def test_default_grpo_plan_is_the_papers_kl_loss_with_four_mini_batches() -> None:
    plan = plan_of()
    assert set(plan.models) == {"policy", "reference"} and set(plan.passes) == {"old_logp", "ref_logp"}
    assert plan.kl.placement == "loss" and plan.kl.estimator.name == "k3" and plan.kl.coef == 0.04
    assert modes(plan) == {"policy": "seq-mean-token-mean", "kl": "seq-mean-token-mean"}
    assert {name: term.coef for name, term in plan.terms.items()} == {"policy": 1.0, "kl": 0.04}
    assert not plan.update.on_policy and plan.update.optimizer_steps == 4 and plan.warnings == []


def test_a_plan_without_kl_or_off_policy_steps_builds_only_the_policy_and_runs_no_extra_pass() -> None:
    plan = plan_of("kl.coef=0", "trainer.num_mini_batches=1")
    assert plan.models == {"policy": "trained"} and plan.passes == {} and plan.kl is None
    assert plan.update.on_policy and plan.update.optimizer_steps == 1


def test_off_policy_steps_run_the_old_log_prob_pass() -> None:
    plan = plan_of("trainer.num_mini_batches=4", "trainer.update_epochs=2")
    assert "old_logp" in plan.passes and plan.update.optimizer_steps == 8
    assert not any("on-policy" in w for w in plan.warnings)


def test_ppo_plan_models_passes_kl_and_value_aggregation() -> None:
    plan = plan_of("algo=ppo")
    assert set(plan.models) == {"policy", "reference", "critic"}
    assert {"old_logp", "ref_logp", "values"} <= set(plan.passes)
    assert plan.kl.placement == "reward" and plan.kl.controller_updates
    assert masks(plan) == {"policy": "loss_mask", "value": "response_mask"}


def test_full_kl_runs_the_reference_once_per_micro_batch_and_no_log_prob_pass() -> None:
    plan = plan_of("kl.coef=0.1", "kl.estimator=full")
    assert "reference" in plan.models and plan.kl.uses_logits
    assert "ref_logits" in plan.passes and "ref_logp" not in plan.passes   # one reference forward, not two


def test_sampled_token_kl_as_loss_runs_one_reference_pass() -> None:
    plan = plan_of("kl.coef=0.04", "trainer.num_mini_batches=1")
    assert plan.kl.placement == "loss" and plan.terms["kl"].mode == "seq-mean-token-mean"
    assert "ref_logp" in plan.passes and "ref_logits" not in plan.passes and "old_logp" not in plan.passes


def test_kl_knobs_set_while_kl_is_off_are_named_as_inert() -> None:
    plan = plan_of("kl.coef=0", "kl.estimator=k1", "kl.apply=reward")
    assert any("kl.coef=0" in w and "kl.estimator" in w and "kl.apply" in w for w in plan.warnings)


def test_extension_needs_are_planned() -> None:
    plan = plan_of("extensions=[entropy_top_tokens]")
    assert "old_entropy" in plan.passes and "old_logp" in plan.passes


def test_the_plan_names_the_input_that_pulled_a_critic_or_a_greedy_rollout_in() -> None:
    # a plugin migrated from API 1 whose advantage names `values` / `baseline_scores`: rlzoo explain
    # (and plan.txt) says which component, through which argument, made the run build what
    from rlzoo.contract.loading import module_plugin

    def migrated(token_rewards, values, baseline_scores, response_mask):
        return token_rewards - values, token_rewards

    def register(register):
        register("migrated", migrated, description="an API 1 estimator")

    plugin = module_plugin(rlzoo_register_advantage_estimators=register)
    PM.register(plugin, name="migrated-plugin")
    try:
        registry = build_registry(PM)
        plan = load_config(registry, ["advantage=migrated", "value_loss=clipped"]).plan
    finally:
        PM.unregister(plugin)
    assert plan.models["critic"].endswith("(advantage migrated via its input values)")
    assert plan.passes["greedy"].endswith("(advantage migrated via its input baseline_scores)")


def test_the_plan_prints_its_optimizer_loss_terms_model_evaluation_and_cadence() -> None:
    text = plan_of("algo=ppo", "trainer.entropy_coef=0.02", "trainer.lr=0.001", "trainer.lr_schedule=cosine",
                   "trainer.warmup_steps=5", "trainer.total_steps=40", "trainer.max_grad_norm=null",
                   "eval.size=16", "eval.n=0", "eval.every=10", "checkpoint.every=20", "checkpoint.keep=3",
                   "logging.sample_every=0", "model.gradient_checkpointing=true", "launcher.nproc=2",
                   "distributed.strategy=fsdp").render().splitlines()
    assert "processes: 2 (fsdp: each trained model wrapped)" in text
    assert ("policy weights: the embedded tiny qwen2 model (2 layers, width 64, 4 heads, 2 key-value), float32; "
            "gradient checkpointing") in text
    assert text[text.index("loss terms (coefficient x aggregation over mask):") + 1:][:3] == [
        "  policy: token-mean over loss_mask", "  entropy: -0.02 x token-mean over loss_mask",
        "  value: token-mean over response_mask"]
    assert ("optimizer: AdamW lr 0.001 (critic 0.001), betas 0.9/0.99, weight decay 0; LR linear warm-up over 5 "
            "steps, then cosine decay to 0 at step 40; gradient norm never clipped (norm logged)") in text
    assert ("evaluation: up to 16 held-out prompts (0.1 of the prompts, never trained on), greedy each, correct = "
            "score >= 1, every 10 steps and after the last") in text
    assert "steps: 40; checkpoints every 20 steps and at the end, newest 3 kept; scalars logged every 1 step(s)" in text
    assert "evaluation: off (eval.size=0); 0.1 of the prompts still held out of training" in plan_of(
        "eval.size=0").render()


def test_the_plan_is_written_to_the_run_directory(tmp_path: Path) -> None:
    resolved = load_config(REGISTRY, [*TINY, "algo=ppo", f"run_dir={tmp_path / 'r'}", "trainer.total_steps=1"])
    Trainer(engine_input(resolved), PM).run()
    text = (tmp_path / "r" / "plan.txt").read_text()
    assert text == resolved.plan.render()
    assert "critic: value model" in text and "kl: k1 in the reward" in text


def _trainer(tmp_path: Path, *overrides: str) -> Trainer:
    return Trainer(load_run(REGISTRY, [*TINY, f"run_dir={tmp_path / 'r'}", *overrides]), PM)


def test_mismatch_is_logged_when_old_log_probs_exist_and_is_zero_in_float32(tmp_path: Path) -> None:
    for temperature in ("1.0", "0.7"):
        trainer = _trainer(tmp_path, "trainer.num_mini_batches=2", "kl.coef=0", f"rollout.temperature={temperature}")
        metrics = trainer.train_step()
        assert metrics["rollout/mismatch_k3"] < 1e-9, (temperature, metrics["rollout/mismatch_k3"])
        assert metrics["rollout/max_abs_log_ratio"] < 1e-4, (temperature, metrics["rollout/max_abs_log_ratio"])
        trainer.close()                                                 # releases the run directory
    metrics = _trainer(tmp_path, "trainer.num_mini_batches=1", "kl.coef=0").train_step()   # no old log-probs
    assert "rollout/mismatch_k3" not in metrics


def test_top_p_sampling_shows_as_a_mismatch(tmp_path: Path) -> None:
    """Training log-probs are of the full tempered distribution; the rollout's of the top-p
    nucleus (renormalised), so top_p < 1 is a real, logged mismatch."""
    metrics = _trainer(tmp_path, "trainer.num_mini_batches=2", "rollout.top_p=0.5").train_step()
    assert metrics["rollout/mismatch_k3"] > 1e-4 and metrics["rollout/max_abs_log_ratio"] > 0.01


def _batch(old_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> RolloutBatch:
    n, width = mask.shape
    return RolloutBatch(prompt_ids=torch.ones(n, 1, dtype=torch.long), prompt_mask=torch.ones(n, 1),
                        response_ids=torch.ones(n, width, dtype=torch.long), response_mask=mask,
                        group_ids=torch.tensor([0, 0]), scores=torch.tensor([1.0, 0.0]),
                        truncated=torch.tensor([False, False]), prompts=["", ""], completions=["", ""],
                        references=[None, None], rollout_logp=old_logp, old_logp=old_logp, ref_logp=ref_logp)


def test_kl_value_is_nats_per_token_and_the_controller_gets_the_sequence_sum(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, "algo=rloo", "kl.coef=0.5", "kl.estimator=k1", "rollout.n=2",
                       "rollout.prompts_per_step=1")
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    old = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.5, -1.5], [-1.0, 0.0, 0.0]])          # k1 = +0.5 x3, -1.0 x1
    metrics: dict[str, float] = {}
    batch = _batch(old, ref, mask)
    trainer.learner._advantages(batch, metrics)
    assert metrics["kl/value"] == pytest.approx((1.5 - 1.0) / 4)         # per token
    assert metrics["kl/sequence_sum"] == pytest.approx((1.5 - 1.0) / 2)  # per sequence
    # the reward of each sequence is lowered by beta * its KL sum (folded on tokens)
    assert batch.token_rewards.sum(-1).tolist() == pytest.approx([1.0 - 0.5 * 1.5, 0.0 + 0.5 * 1.0])


def test_the_value_loss_is_normalised_over_the_mask_it_sums(tmp_path: Path) -> None:
    """With tokens masked out of the policy loss (overlong_filter, entropy_top_tokens), the
    critic still trains on every response token and divides by their count."""
    trainer = _trainer(tmp_path, "algo=ppo", "trainer.max_grad_norm=1e9", "trainer.critic_lr=0")
    batch = trainer.sampler.sample(4)
    trainer.learner.prepare(batch)
    batch.loss_mask[: len(batch) // 2] = 0                                # half the rows out of the policy loss
    trainer.learner._critic_step(batch, _WeightedMeans())
    error = torch.where(batch.response_mask.bool(), batch.old_values - batch.returns, torch.zeros_like(batch.returns))
    expected = float(error.sum() / batch.response_mask.sum())             # d/d(head bias) of mean ½(V−R)²
    assert float(trainer.models.critic.value_head.bias.grad) == pytest.approx(expected, rel=1e-4, abs=1e-7)


def test_logprob_keep_mb_reaches_the_head_and_does_not_change_the_update(tmp_path: Path, monkeypatch) -> None:
    """``trainer.logprob_keep_mb`` is passed to the head as bytes; keeping the log-softmax
    for backward or recomputing it gives the same weights after a step."""
    import rlzoo.models.logprobs as logprobs

    seen: list[int] = []
    original = logprobs.token_logprobs

    def spy(*args, **kwargs):
        seen.append(kwargs["keep_max_bytes"])
        return original(*args, **kwargs)

    weights = []
    for keep_mb in ("0", "64"):
        trainer = _trainer(tmp_path / keep_mb, f"trainer.logprob_keep_mb={keep_mb}")
        monkeypatch.setattr(logprobs, "token_logprobs", spy)     # after the load-time model check
        trainer.train_step()
        monkeypatch.setattr(logprobs, "token_logprobs", original)
        weights.append([p.detach().clone() for p in trainer.models.policy.parameters()])
        trainer.close()
    assert set(seen) == {0, 64 * 2**20}
    assert all(torch.equal(a, b) for a, b in zip(*weights))


# ------------------------------------------------------------------ the engine follows the plan object


def _learn_with_plan(tmp_path: Path, name: str, **edit) -> tuple[dict[str, float], Trainer, RolloutBatch]:
    """One update (one mini-batch: every metric is taken at the initial policy) on the first
    rollout of a run whose plan was edited after it was decided: the batch (same seed) is
    identical whatever the edit; its loss mask drops each response's first token, so
    ``loss_mask`` and ``response_mask`` differ; the reference is perturbed so KL is not 0."""
    run = load_run(REGISTRY, [*TINY, f"run_dir={tmp_path / name}", "kl.coef=0.1", "eval.size=0",
                              "trainer.entropy_coef=0.01", "trainer.num_mini_batches=1", "loss_agg=token-mean",
                              *edit.pop("overrides", ())])
    trainer = Trainer(run.with_plan(**edit), PM)
    noise = torch.Generator().manual_seed(0)                        # a reference other than the policy: KL > 0
    with torch.no_grad():
        for weight in trainer.models.reference.parameters():
            weight.add_(0.05 * torch.randn(weight.shape, generator=noise))
    batch = trainer.sampler.sample(trainer.ctx.prompts)
    batch.loss_mask[:, 0] = 0
    try:
        return trainer.learn(batch), trainer, batch
    finally:
        trainer.close()


PLAN = load_config(REGISTRY, [*TINY, "kl.coef=0.1", "trainer.entropy_coef=0.01", "loss_agg=token-mean"]).plan


def _term(name: str, **change) -> dict:
    """The plan's loss terms with term ``name`` changed."""
    return {**PLAN.terms, name: dataclasses.replace(PLAN.terms[name], **change)}


def test_the_learner_reads_each_terms_mask_and_aggregation_from_the_plan(tmp_path: Path) -> None:
    base, _, batch = _learn_with_plan(tmp_path, "base")
    assert masks(PLAN) == {"policy": "loss_mask", "kl": "loss_mask", "entropy": "loss_mask"}
    other_mask, _, _ = _learn_with_plan(tmp_path, "mask", terms=_term("policy", mask="response_mask"))
    assert other_mask["policy/loss"] != pytest.approx(base["policy/loss"], rel=1e-3)
    assert other_mask["kl/value"] == pytest.approx(base["kl/value"], rel=1e-6)     # the kl term's mask is kept
    kl_mask, _, _ = _learn_with_plan(tmp_path, "kl_mask", terms=_term("kl", mask="response_mask"))
    assert kl_mask["kl/value"] != pytest.approx(base["kl/value"], rel=1e-6)
    token_sum = REGISTRY.get("loss_agg", "token-sum").bind(None)
    summed, _, _ = _learn_with_plan(tmp_path, "agg", terms=_term("policy", aggregation=token_sum))
    tokens = float(batch.loss_mask.sum())                                          # token-sum = token-mean x N
    assert summed["policy/loss"] == pytest.approx(base["policy/loss"] * tokens, rel=1e-4)


def test_the_learner_weights_the_entropy_term_by_the_plans_coefficient(tmp_path: Path) -> None:
    """The config says trainer.entropy_coef=0.01; a plan whose entropy term has coefficient 0
    updates exactly as a run without the term, and one with another coefficient otherwise (the
    same config and batch: were the coefficient read from the config, the two would be equal
    bit for bit; at the initial, near-uniform policy the entropy's gradient is small)."""
    with_bonus, _, _ = _learn_with_plan(tmp_path, "bonus")
    zeroed, _, _ = _learn_with_plan(tmp_path, "zeroed", terms=_term("entropy", coef=0.0))
    without, _, _ = _learn_with_plan(tmp_path, "without", overrides=["trainer.entropy_coef=0"])
    assert PLAN.terms["entropy"].coef == -0.01                                    # a bonus: the loss goes down
    assert zeroed["grad_norm"] == without["grad_norm"] != with_bonus["grad_norm"]
    larger, _, _ = _learn_with_plan(tmp_path, "larger", terms=_term("entropy", coef=-1.0))
    assert larger["grad_norm"] != with_bonus["grad_norm"]


def test_the_engine_reads_precision_correction_and_recording_from_the_plan(tmp_path: Path) -> None:
    tis = REGISTRY.get("rollout_correction", "tis")
    capped = tis.bind(tis.params(cap=1.5))                                   # not tis's default parameters
    _, trainer, _ = _learn_with_plan(tmp_path, "p", precision="bf16",
                                     corrections=(CorrectionStep(capped, "batch", "weight"),),
                                     passes={"old_logp": "read by tis", "ref_logp": "for KL"})
    assert isinstance(trainer.learner.compute(), torch.autocast)            # the config says fp32
    [step] = trainer.learner.corrections.batch_steps                        # the config says none
    assert step.correction is capped and step.correction.params.cap == 1.5   # its own parameters, not the defaults
    run = load_run(REGISTRY, [*TINY, f"run_dir={tmp_path / 'rec'}", "trainer.total_steps=1", "eval.size=0"])
    Trainer(run.with_plan(record=True), PM).run()                          # the config says rollout.record=false
    assert (tmp_path / "rec" / "rollouts").is_dir()


def test_the_engine_reads_model_optimizer_evaluation_and_cadence_from_the_plan(tmp_path: Path) -> None:
    """Every edit below contradicts the config the run was planned from; the run follows the plan."""
    run = load_run(REGISTRY, [*TINY, f"run_dir={tmp_path / 'r'}", "trainer.total_steps=5", "eval.size=0",
                              "checkpoint.every=0"])
    plan = run.plan
    trainer = Trainer(run.with_plan(
        model=dataclasses.replace(plan.model, tiny=dataclasses.replace(plan.model.tiny, hidden_size=16)),
        optimizer=dataclasses.replace(plan.optimizer, lr=0.0),
        eval=dataclasses.replace(plan.eval, size=3, every=0),
        cadence=dataclasses.replace(plan.cadence, total_steps=2, checkpoint_every=1, checkpoint_keep=5)), PM)
    assert trainer.models.policy.config.hidden_size == 16
    assert len(trainer.evaluator.examples) == 3
    initial = [p.detach().clone() for p in trainer.models.policy.parameters()]
    metrics = trainer.run()
    assert trainer.step == 2 and metrics["lr"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(initial, trainer.models.policy.parameters()))   # lr 0: unchanged
    assert sorted(p.name for p in (tmp_path / "r" / "checkpoints").iterdir()) == [
        "step_000000", "step_000001", "step_000002"]


# ------------------------------------------------------------------ no engine module reads the config

ROOT = Path(__file__).parents[1]
ENGINE = ("models", "rollout", "learn", "run")
"""The engine's layers: everything below them is the config and the plan they read instead."""
ENGINE_MODULES = sorted(path.relative_to(ROOT / "rlzoo").as_posix()
                        for layer in ENGINE for path in (ROOT / "rlzoo" / layer).glob("*.py"))
ALLOWED = {
    "run/resume.py": "resuming is a config layer (the saved config.yaml as the base, what a resume may change); it "
                     "sits with the run because it reads a run directory, and the engine never calls it",
}
"""Engine modules that may read the run config, and why (the commands call them before the engine)."""
CONFIG_NAMES = {"cfg", "resolved"}
"""Names a config object goes by: no engine code names one (``RunContext(cfg=...)`` passes the
hooks' copy by keyword; ``hook_config`` and ``config_yaml`` are passed on, never looked into)."""
CONFIG_DATA = {"hook_config", "config_yaml"}
READERS = {"OmegaConf.select", "OmegaConf.to_container", "OmegaConf.create", "yaml.safe_load", "yaml.load"}


def config_reads(source: str) -> list[str]:
    """The places ``source`` reads a run config: an import from the config layer or of the
    planned config, a name or attribute ``cfg`` / ``resolved`` / ``*_cfg``,
    a look inside the config handed on as data, or an OmegaConf / YAML reader call."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and (
                node.module.startswith("rlzoo.config") or node.module == "rlzoo.plan.planner"):
            found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Import) and any(a.name.startswith("rlzoo.config") for a in node.names):
            found.append("import rlzoo.config")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and (
                node.id in CONFIG_NAMES or node.id.endswith("_cfg")):
            found.append(node.id)
        elif isinstance(node, ast.Attribute) and (node.attr in CONFIG_NAMES or node.attr.endswith("_cfg")):
            found.append(ast.unparse(node))
        elif isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.value, ast.Attribute) \
                and node.value.attr in CONFIG_DATA:
            found.append(ast.unparse(node))
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in READERS:
            found.append(ast.unparse(node.func))
    return found


@pytest.mark.parametrize("module", ENGINE_MODULES)
def test_no_engine_module_reads_the_run_config(module: str) -> None:
    """The engine reads the plan and the bound components (:class:`rlzoo.plan.run_input.RunInput`)."""
    reads = config_reads((ROOT / "rlzoo" / module).read_text())
    assert module in ALLOWED or reads == [], f"{module} reads the run config: {reads}"


def test_the_config_read_scan_sees_every_kind_of_read() -> None:
    assert {"trainer.py", "learner.py", "build.py", "sampler.py", "async_generator.py", "tracking.py",
            "rundir.py", "evaluation.py"} <= {m.split("/")[1] for m in ENGINE_MODULES}
    assert config_reads("x = self.cfg.trainer.lr") == ["self.cfg"]
    assert config_reads("def f(cfg):\n    return cfg.model.path") == ["cfg"]
    assert config_reads("y = self.trainer_cfg.entropy_coef") == ["self.trainer_cfg"]
    assert config_reads("z = resolved.components['task']") == ["resolved"]
    assert config_reads("from rlzoo.config.resolved import ResolvedConfig") == ["from rlzoo.config.resolved import ..."]
    assert config_reads("from rlzoo.plan.planner import load_config") == ["from rlzoo.plan.planner import ..."]
    assert config_reads("n = run.setup.hook_config.eval.n") == ["run.setup.hook_config.eval"]
    assert config_reads("n = setup.hook_config['eval']") == ["setup.hook_config['eval']"]
    assert config_reads("v = OmegaConf.select(c, 'kl.coef')") == ["OmegaConf.select"]
    assert config_reads("d = yaml.safe_load(spec.config_yaml)") == ["yaml.safe_load"]
    passing = ("ctx = RunContext(cfg=run.setup.hook_config, plan=plan)\n"
               "write(path, run.setup.config_yaml)\nlr = self.plan.optimizer.lr\n")
    assert config_reads(passing) == []


# ------------------------------------------------------------------ settings a run accepts but should hear about

def test_a_warm_up_longer_than_the_run_is_a_plan_warning() -> None:
    plan = load_config(REGISTRY, ["trainer.warmup_steps=500", "trainer.total_steps=100"]).plan
    assert ("trainer.warmup_steps=500 > trainer.total_steps=100: the learning rate never reaches trainer.lr=0.0005 "
            "(the last step's is 0.2 of it)") in plan.warnings
    assert not [w for w in load_config(REGISTRY, ["trainer.warmup_steps=100", "trainer.total_steps=100"]).plan.warnings
                if "warmup" in w]


def test_a_truncation_cap_below_one_is_a_plan_warning_naming_the_correction() -> None:
    plan = load_config(REGISTRY, ["algo=bypass_pg_is", "rollout_correction.cap=0.5"]).plan
    said = [w for w in plan.warnings if "cap=0.5 < 1" in w]
    assert len(said) == 1 and said[0].startswith("rollout_correction 'seq_tis': cap=0.5 < 1 cuts every weight")
    plan = load_config(REGISTRY, ["rollout_correction=[{name: seq_tis, cap: 3}, {name: tis, cap: 0.5}]"]).plan
    assert [w.split(":")[0] for w in plan.warnings if "< 1 cuts" in w] == ["rollout_correction[1] 'tis'"]
    assert not [w for w in load_config(REGISTRY, ["algo=bypass_pg_is"]).plan.warnings if "< 1 cuts" in w]


def test_a_parameter_dataclass_speaks_through_its_warnings_method() -> None:
    """The generic door (docs/plugins.md, parameters): any chosen component's ``warnings()``."""
    from dataclasses import dataclass

    from rlzoo.api import hookimpl

    @dataclass
    class LoudParams:
        level: int = 0

        def warnings(self) -> list[str]:
            return [f"level={self.level} is loud"] if self.level > 3 else []

    class Plugin:
        @hookimpl
        def rlzoo_register_loss_aggregations(self, register):
            def loud_mean(loss, mask, params=None):
                return (loss * mask).sum() / mask.sum().clamp(min=1)
            register("loud-mean", loud_mean, params=LoudParams)

    pm = make_plugin_manager()
    pm.register(Plugin(), name="loud")
    registry = build_registry(pm)
    assert "loss_agg 'loud-mean': level=5 is loud" in load_config(registry, ["loss_agg={name: loud-mean, level: 5}"]
                                                                      ).plan.warnings
    assert not [w for w in load_config(registry, ["loss_agg=loud-mean"]).plan.warnings if "loud" in w]


def test_vllm_threads_beyond_the_cores_is_a_warning() -> None:
    from rlzoo_plugins.vllm_cores import usable
    from rlzoo_plugins.vllm_rollout import VLLMParams

    cores = len(usable())
    assert VLLMParams(threads=cores).warnings() == [] and VLLMParams(threads=0).warnings() == []
    assert VLLMParams(threads=cores + 62).warnings() == [
        f"threads={cores + 62} is more than the {cores} core(s) this process may use: on a CPU the engine runs "
        f"{cores} OpenMP thread(s), one per core (threads=0: all of them)"]
