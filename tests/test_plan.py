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
from rlzoo.plan.planner import CorrectionStep
from rlzoo.contract.loading import build_registry, make_plugin_manager
from rlzoo.run.trainer import Trainer
from zoo import TINY

PM = make_plugin_manager()
REGISTRY = build_registry(PM)


def plan_of(*overrides: str):
    return load_config(REGISTRY, list(overrides)).plan


def test_default_grpo_plan_is_the_papers_kl_loss_with_four_mini_batches() -> None:
    plan = plan_of()
    assert set(plan.models) == {"policy", "reference"} and set(plan.passes) == {"old_logp", "ref_logp"}
    assert plan.kl.placement == "loss" and plan.kl.estimator == "k3" and plan.kl.coef == 0.04
    assert plan.aggregation == {"policy": "seq-mean-token-mean", "kl": "seq-mean-token-mean"}
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
    assert plan.masks == {"policy": "loss_mask", "value": "response_mask"}


def test_full_kl_runs_the_reference_once_per_micro_batch_and_no_log_prob_pass() -> None:
    plan = plan_of("kl.coef=0.1", "kl.estimator=full")
    assert "reference" in plan.models and plan.kl.uses_logits
    assert "ref_logits" in plan.passes and "ref_logp" not in plan.passes   # one reference forward, not two


def test_sampled_token_kl_as_loss_runs_one_reference_pass() -> None:
    plan = plan_of("kl.coef=0.04", "trainer.num_mini_batches=1")
    assert plan.kl.placement == "loss" and plan.aggregation["kl"] == "seq-mean-token-mean"
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


def test_the_plan_is_written_to_the_run_directory(tmp_path: Path) -> None:
    resolved = load_config(REGISTRY, [*TINY, "algo=ppo", f"run_dir={tmp_path / 'r'}", "trainer.total_steps=1"])
    Trainer(resolved, PM).run()
    text = (tmp_path / "r" / "plan.txt").read_text()
    assert text == resolved.plan.render()
    assert "critic: value model" in text and "kl: k1 in the reward" in text


def _trainer(tmp_path: Path, *overrides: str) -> Trainer:
    return Trainer(load_config(REGISTRY, [*TINY, f"run_dir={tmp_path / 'r'}", *overrides]), PM)


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
    resolved = load_config(REGISTRY, [*TINY, f"run_dir={tmp_path / name}", "kl.coef=0.1", "eval.size=0",
                                      "trainer.entropy_coef=0.01", "trainer.num_mini_batches=1", "loss_agg=token-mean"])
    resolved.plan = dataclasses.replace(resolved.plan, **edit)
    trainer = Trainer(resolved, PM)
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


def test_the_learner_reads_each_terms_mask_and_aggregation_from_the_plan(tmp_path: Path) -> None:
    base, _, batch = _learn_with_plan(tmp_path, "base")
    plan = load_config(REGISTRY, [*TINY, "kl.coef=0.1", "trainer.entropy_coef=0.01", "loss_agg=token-mean"]).plan
    assert plan.masks == {"policy": "loss_mask", "kl": "loss_mask", "entropy": "loss_mask"}
    other_mask, _, _ = _learn_with_plan(tmp_path, "mask", masks={**plan.masks, "policy": "response_mask"})
    assert other_mask["policy/loss"] != pytest.approx(base["policy/loss"], rel=1e-3)
    assert other_mask["kl/value"] == pytest.approx(base["kl/value"], rel=1e-6)     # the kl term's mask is kept
    kl_mask, _, _ = _learn_with_plan(tmp_path, "kl_mask", masks={**plan.masks, "kl": "response_mask"})
    assert kl_mask["kl/value"] != pytest.approx(base["kl/value"], rel=1e-6)
    summed, _, _ = _learn_with_plan(tmp_path, "agg", aggregation={**plan.aggregation, "policy": "token-sum"})
    tokens = float(batch.loss_mask.sum())                                          # token-sum = token-mean x N
    assert summed["policy/loss"] == pytest.approx(base["policy/loss"] * tokens, rel=1e-4)


def test_the_engine_reads_precision_correction_and_recording_from_the_plan(tmp_path: Path) -> None:
    _, trainer, _ = _learn_with_plan(tmp_path, "p", precision="bf16",
                                     corrections=(CorrectionStep("tis", 0, "batch", "weight"),),
                                     passes={"old_logp": "read by tis", "ref_logp": "for KL"})
    assert isinstance(trainer.learner.compute(), torch.autocast)            # the config says fp32
    assert [b.name for _, b in trainer.learner.corrections.batch_steps] == ["tis"]   # the config says none
    resolved = load_config(REGISTRY, [*TINY, f"run_dir={tmp_path / 'rec'}", "trainer.total_steps=1", "eval.size=0"])
    resolved.plan = dataclasses.replace(resolved.plan, record=True)        # the config says rollout.record=false
    Trainer(resolved, PM).run()
    assert (tmp_path / "rec" / "rollouts").is_dir()


PLAN_DECIDED_KEYS = (
    "trainer.precision", "trainer.old_logp", "rollout.record", "rollout_correction",
    "loss_agg", "kl.coef", "kl.apply", "kl.estimator", "kl.target",
    "kl.controller", "trainer.update_epochs", "trainer.num_mini_batches", "trainer.micro_batch_size",
    "rollout.temperature", "rollout.top_p", "rollout.n", "rollout.max_new_tokens", "rollout.prompts_per_step",
    "rollout.dtype", "rollout.backend", "rollout.staleness", "launcher.nproc", "model.lora.rank", "model.lora.alpha",
    "model.lora.dropout", "model.lora.target_modules", "rollout.mode", "rollout.weight_sync_every",
    "rollout.max_staleness", "rollout.stale_batches", "rollout.queue_size",
)
"""Config keys whose decision the run plan prints: the engine reads them from the plan."""

ENGINE_MODULES = ("run/trainer", "learn/learner", "rollout/sampler", "run/evaluation", "models/build",
                  "rollout/scoring", "run/tracking", "models/lora", "rollout/async_generator")
CONFIG_ALIASES = {"trainer_cfg": "trainer", "rollout_cfg": "rollout", "t": "trainer"}
CONFIG_ROOTS = {"cfg", "trainer_cfg", "rollout_cfg", "t"}
ALLOWED_READS = {("models/build", "rollout.max_new_tokens")}
"""The embedded model's position table is sized by the response budget (``rlzoo sft`` builds
it too, without a plan)."""


def _config_reads(module: str) -> set[str]:
    """Dotted config keys ``module`` of rlzoo/ reads through an attribute chain from a config
    object (``cfg.trainer.precision``, ``self.trainer_cfg.precision``, ...)."""
    return _config_reads_of((Path(__file__).parents[1] / "rlzoo" / f"{module}.py").read_text())


def _config_reads_of(source: str) -> set[str]:
    reads = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            raw = ast.unparse(node).split(".")
            if "plan" in raw or not CONFIG_ROOTS & set(raw):
                continue
            chain = [CONFIG_ALIASES.get(part, part) for part in raw]
            for key in PLAN_DECIDED_KEYS:
                if ".".join(chain).endswith(key) and (len(chain) > key.count(".") + 1 or "." in key):
                    reads.add(key)
    return reads


@pytest.mark.parametrize("module", ENGINE_MODULES)
def test_the_engine_reads_no_config_key_the_plan_decides(module: str) -> None:
    assert {key for key in _config_reads(module) if (module, key) not in ALLOWED_READS} == set()


def test_the_config_read_scan_sees_a_read() -> None:
    assert _config_reads("learn/learner") == set()
    original = Path(__file__).parents[1] / "rlzoo" / "learn" / "learner.py"
    assert "self.plan.precision" in original.read_text()
    assert "trainer.precision" in _config_reads_of("x = self.trainer_cfg.precision\ny = rollout.n\n")
    assert _config_reads_of("y = cfg.rollout.n\nz = self.plan.rollout.n\nw = rollout.n\n") == {"rollout.n"}
