"""Dropout off where log-probs are compared (issue 37, item 1), and every command that
computes log-probs on the checked path (item 2).

The update runs the policy in training mode while the rollout, π_old and the reference run
in eval mode: with the model's dropout on (GPT-2 and OPT ship 0.1), the first mini-batch's
ratio would not be 1. rlzoo sets every dropout rate to 0 when it builds a model it trains
(:mod:`rlzoo.models.dropout`), and the load-time check measures the training forward in training
mode, so a random layer left on is refused.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

import zoo
from rlzoo.run import async_generator as async_rollout
from rlzoo.run import trainer as trainer_module
from rlzoo.commands.cli import main
from rlzoo.plan.run_input import load_run
from rlzoo.models.dropout import active_rates, adapter_dropout_off, disable_dropout
from rlzoo.core.errors import ConfigError
from rlzoo.models.head import FastPaths, fast_paths
from rlzoo.models.logprobs import response_forward
from rlzoo.models.model_check import check_model, reference_logprobs
from rlzoo.run.trainer import Trainer
from test_architectures import COMMON, TOKENIZER, batch
from zoo import PM, REGISTRY

transformers.logging.set_verbosity_error()

DROPOUT = {
    "gpt2": {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1},
    "opt": {"dropout": 0.1, "attention_dropout": 0.1, "layerdrop": 0.1, "word_embed_proj_dim": 32, "ffn_dim": 64},
}
"""GPT-2 and OPT as they ship: dropout 0.1 (and, for OPT, layer drop) in every layer."""

RUN = [*zoo.TINY, "eval.size=0", "logging.sample_every=0", "trainer.total_steps=1"]


pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py


def dropout_model(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **{**COMMON, **DROPOUT[arch]}))


def responses() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(4, len(TOKENIZER), (3, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 6)
    mask[1, 4:] = 0                                              # a shorter response
    return ids, mask


def logp(model: torch.nn.Module, training: bool) -> torch.Tensor:
    ids, mask = batch()
    response_ids, response_mask = responses()
    model.train(training)
    with torch.no_grad():
        return response_forward(model, ids, mask, response_ids, response_mask).logp


@pytest.mark.parametrize("arch", sorted(DROPOUT))
def test_training_mode_log_probs_equal_eval_modes_once_dropout_is_off(arch: str) -> None:
    model = dropout_model(arch)
    ids, mask = batch()
    response_ids, response_mask = responses()
    truth = reference_logprobs(model.eval(), ids, mask, response_ids, response_mask)  # eval mode, alone
    assert (logp(model, training=True) - truth).abs().max() > 1e-3      # dropout on: the bug
    assert len(active_rates(model)) >= 6
    disable_dropout(model)
    assert active_rates(model) == []
    assert (logp(model, training=True) - logp(model, training=False)).abs().max() <= 1e-5
    assert (logp(model, training=True) - truth).abs().max() <= 1e-5
    saved = {key: getattr(model.config, key) for key in DROPOUT[arch]}
    assert saved == DROPOUT[arch]                                       # the config a run saves is the model's


def test_the_model_check_measures_the_training_forward_in_training_mode() -> None:
    with pytest.raises(ConfigError) as info:
        check_model(dropout_model("gpt2"), torch.device("cpu"))
    message = str(info.value)
    assert message.startswith("GPT2LMHeadModel: the update runs the model in training mode, where its log-probs "
                              "differ from eval mode's (max |diff|/max(1, |logp|) ")
    assert "its dropout is on (7 rates > 0, e.g. transformer.drop.p=0.1" in message
    assert "rlzoo.models.dropout.disable_dropout(model)" in message
    frozen = check_model(dropout_model("gpt2"), torch.device("cpu"), trained=False)   # a teacher: eval mode only
    assert " in eval mode (tolerance" in frozen.summary()
    check = check_model(disable_dropout(dropout_model("gpt2")), torch.device("cpu"))
    assert check.training_error <= 1e-5 and " in training mode (tolerance" in check.summary()


def test_a_rate_read_from_the_config_at_run_time_is_refused_naming_the_field() -> None:
    """Persimmon passes ``self.config.attention_dropout`` to its attention in training mode,
    which no module attribute holds: rlzoo cannot zero it, the check refuses it."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("persimmon", **COMMON, attention_dropout=0.5))
    disable_dropout(model)
    assert active_rates(model) == []
    with pytest.raises(ConfigError) as info:
        check_model(model, torch.device("cpu"))
    assert "a random layer is on that rlzoo cannot switch off" in str(info.value)
    assert "its config has attention_dropout=0.5); set it to 0 in the model's config.json" in str(info.value)


def test_adapter_dropout_is_left_alone_and_off_only_within_the_context() -> None:
    adapter = torch.nn.Module()
    adapter.lora_dropout = torch.nn.ModuleDict({"default": torch.nn.Dropout(0.3)})
    model = torch.nn.Sequential(torch.nn.Dropout(0.2), adapter)
    disable_dropout(model)
    assert model[0].p == 0.0 and adapter.lora_dropout["default"].p == 0.3
    with adapter_dropout_off(model):
        assert adapter.lora_dropout["default"].p == 0.0
    assert adapter.lora_dropout["default"].p == 0.3


@pytest.mark.parametrize("arch", sorted(DROPOUT))
def test_a_run_trains_on_log_probs_equal_to_the_eval_mode_passes(arch: str, tmp_path: Path, capsys) -> None:
    """The issue's 'done when': a GPT-2 (OPT) model with dropout 0.1 from model.path; the
    update's training-mode log-probs of a sampled batch equal π_old's (eval mode) to 1e-5,
    and no dropout is left in the policy, the reference or the critic."""
    model_dir = tmp_path / "model"
    dropout_model(arch).save_pretrained(model_dir)
    TOKENIZER.save_pretrained(model_dir)
    trainer = Trainer(load_run(REGISTRY, [*RUN, "algo=ppo", "kl.coef=0.05", f"model.path={model_dir}",
                                             f"run_dir={tmp_path / 'run'}"]), PM)
    models = trainer.models
    assert "in training mode" in capsys.readouterr().out
    assert [active_rates(m) for m in (models.policy, models.reference, models.critic)] == [[], [], []]
    sampled = trainer.sampler.sample(trainer.ctx.prompts)
    trainer.learner.prepare(sampled)                                  # π_old in eval mode
    models.policy.train()
    with torch.no_grad():
        training = models.policy_forward(sampled.prompt_ids, sampled.prompt_mask, sampled.response_ids,
                                         sampled.response_mask)[0]
    mask = sampled.response_mask
    assert mask.sum() > 0
    assert ((training - sampled.old_logp) * mask).abs().max() <= 1e-5
    assert ((sampled.ref_logp - sampled.old_logp) * mask).abs().max() <= 1e-5
    trainer.close()


def test_sft_goes_through_the_model_check(tmp_path: Path, capsys) -> None:
    model_dir = tmp_path / "gpt2"
    dropout_model("gpt2").save_pretrained(model_dir)
    TOKENIZER.save_pretrained(model_dir)
    out = tmp_path / "sft"
    assert main(["sft", *zoo.TINY, f"model.path={model_dir}", "--steps", "1", "--batch-size", "4",
                 "--out", str(out)]) == 0
    assert "rlzoo: policy model check: log-probs vs the model's own forward" in capsys.readouterr().out
    torch.manual_seed(0)
    refused = tmp_path / "persimmon"
    AutoModelForCausalLM.from_config(AutoConfig.for_model("persimmon", **COMMON, attention_dropout=0.5)
                                     ).save_pretrained(refused)
    TOKENIZER.save_pretrained(refused)
    assert main(["sft", *zoo.TINY, f"model.path={refused}", "--steps", "1", "--out", str(tmp_path / "no")]) == 2
    assert "set it to 0 in the model's config.json" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()


def test_the_async_generator_runs_the_paths_the_trainer_checked(tmp_path: Path, monkeypatch) -> None:
    specs = []

    def started(plan, spec, weights, step):
        specs.append(spec)
        return type("Started", (), {"pid": 0})()

    monkeypatch.setattr(trainer_module, "AsyncRollout", started)
    trainer = Trainer(load_run(REGISTRY, [*RUN, "rollout.mode=async", f"run_dir={tmp_path / 'run'}"]), PM)
    trainer._start_generator()
    trainer.generator = None                                          # none was started
    assert specs[0].paths is fast_paths(trainer.models.policy)
    other = dataclasses.replace(specs[0], paths=FastPaths(cache="dynamic"))
    generator = async_rollout._Generator(other, dict(trainer.models.policy.state_dict()), None, None)
    assert fast_paths(generator.policy) == FastPaths(cache="dynamic")
    trainer.close()
