"""Right log-probs on any causal LM (issue 20): an architecture matrix of tiny random models
of the families transformers ships, held to each sequence's own unpadded forward.

For every architecture: the load-time check (:mod:`rlzoo.models.model_check`) keeps the fast paths
(or, for a hybrid cache, leaves the preallocated cache with one warning); the rollout's
log-probs of the tokens it samples and the training forward's log-probs of any tokens equal
``log_softmax(model(sequence).logits / τ)`` of each sequence alone to 1e-4, with large
logits (the output embedding scaled), left-padded prompts of different lengths, groups and
a temperature; then ``rlzoo train`` runs 2 steps on the model loaded from ``model.path``.
"""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM

from rlzoo.models import head as head_module
from rlzoo.commands.cli import main
from rlzoo.models.dropout import disable_dropout
from rlzoo.core.events import read_scalars
from rlzoo.models.head import FastPaths, LogitTransform, fast_paths, known_transform, set_fast_paths
from rlzoo.models.logprobs import head_logits, response_forward, token_logprobs
from rlzoo.models.model_check import TOLERANCE, check_model, reference_logprobs
from rlzoo.models.build import build_char_tokenizer
from rlzoo.models.decode import generate
from rlzoo.core.tokens import left_pad

transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.filterwarnings("ignore:.*past_key_values.*:FutureWarning")

TOKENIZER = build_char_tokenizer(string.digits + string.ascii_letters + string.punctuation + " ")
COMMON = dict(vocab_size=len(TOKENIZER), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
              pad_token_id=TOKENIZER.pad_token_id, bos_token_id=TOKENIZER.bos_token_id,
              eos_token_id=TOKENIZER.eos_token_id)
TWO_KINDS = ["sliding_attention", "full_attention"]

ARCHITECTURES: dict[str, dict] = {
    "llama": {}, "qwen2": {}, "qwen3": {}, "mistral": {"sliding_window": 4}, "gemma": {},
    "gemma2": {"sliding_window": 4},                                         # softcap 30, sliding + full
    "gemma3_text": {"sliding_window": 4, "layer_types": TWO_KINDS},          # softcap, sliding + full
    "phi3": {}, "olmo2": {}, "olmo3": {}, "gpt2": {},                        # gpt2: absolute positions
    "gpt_neox": {}, "smollm3": {}, "stablelm": {}, "starcoder2": {},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
    "cohere": {"logit_scale": 0.5},                                          # logits x scale
    "cohere2": {"logit_scale": 0.5, "sliding_window": 4, "layer_types": TWO_KINDS},
    "granite": {"logits_scaling": 4.0},                                      # logits / scaling
    "lfm2": {"layer_types": ["conv", "full_attention"]},                     # hybrid cache: conv + attention
}
"""``model_type`` -> config overrides of a tiny random model. A sliding window of 4 is
shorter than the probe sequences, so windows act."""

HYBRID = {"lfm2"}
"""Architectures whose cache cannot be repeated per group: the check moves them to the
``dynamic`` cache, with a warning."""

LARGE = 25.0
"""The output embedding is scaled so the largest logit of a probe is about this."""


def tiny_model(arch: str, large: bool = True, overrides: dict | None = None) -> torch.nn.Module:
    """A tiny random ``arch`` model (config: :data:`COMMON`, then ``overrides`` or its
    :data:`ARCHITECTURES` entry), in eval mode, its logits scaled to about :data:`LARGE`,
    its dropout off as rlzoo's commands switch it off (GPT-2's config has 0.1)."""
    torch.manual_seed(0)
    config = AutoConfig.for_model(arch, **{**COMMON, **(ARCHITECTURES[arch] if overrides is None else overrides)})
    model = disable_dropout(AutoModelForCausalLM.from_config(config))
    model.eval()
    if large:
        ids = torch.arange(2, 12)[None]
        with torch.no_grad():
            largest = model(input_ids=ids).logits.abs().max()
            model.get_output_embeddings().weight.mul_(LARGE / float(largest))
    return model


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three left-padded prompts of 9, 2 and 5 tokens."""
    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randint(4, len(TOKENIZER), (n,), generator=generator).tolist() for n in (9, 2, 5)]
    return left_pad(prompts, TOKENIZER.pad_token_id)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_fast_paths_equal_each_sequence_alone(arch: str) -> None:
    model = tiny_model(arch)
    check = check_model(model, torch.device("cpu"))
    if arch in HYBRID:
        assert check.paths.cache == "dynamic" and "cache" in check.warning
    else:
        packing = check.paths.packing, check.paths.pack_min_share    # tests/test_packing.py: which and why
        assert check.warning is None and check.paths == FastPaths(transform=known_transform(model.config),
                                                                  packing=packing[0], pack_min_share=packing[1])
    assert check.rollout_error <= TOLERANCE and check.training_error <= TOLERANCE

    ids, mask = batch()
    group, temperature = 3, 0.7
    torch.manual_seed(0)
    gen = generate(model, ids, mask, max_new_tokens=8, eos_id=-1, pad_id=TOKENIZER.pad_token_id,
                   temperature=temperature, num_samples=group)
    prompt_ids, prompt_mask = ids.repeat_interleave(group, 0), mask.repeat_interleave(group, 0)
    truth = reference_logprobs(model, prompt_ids, prompt_mask, gen.response_ids, gen.response_mask, temperature)
    assert (gen.logp - truth).abs().max() <= TOLERANCE

    response_ids = torch.randint(4, len(TOKENIZER), gen.response_ids.shape, generator=torch.Generator().manual_seed(3))
    response_mask = torch.ones(response_ids.shape)
    response_mask[1, 5:] = 0                                     # right padding
    response_ids[1, 5:] = TOKENIZER.pad_token_id
    truth = reference_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature)
    assert truth[response_mask > 0].min() < -5                   # large logits: unlikely tokens are far down
    out = response_forward(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature=temperature,
                           with_logits=True)
    assert (out.logp - truth).abs().max() <= TOLERANCE
    chosen = torch.log_softmax(out.logits, -1).gather(-1, response_ids[..., None]).squeeze(-1) * response_mask
    assert (chosen - truth).abs().max() <= TOLERANCE          # the full logits (estimators that read them)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_dropping_finished_rows_leaves_every_token_and_log_prob(arch: str, monkeypatch) -> None:
    """A ragged batch: the decode loop drops finished rows (issue 46); the tokens are the full
    batch's (one uniform per row and step either way) and the log-probs equal each sequence's own
    forward; a cache it cannot select rows of (lfm2's conv layers) is never compacted."""
    from rlzoo.models import decode

    model = tiny_model(arch)
    check_model(model, torch.device("cpu"))
    ids, mask = batch()
    budget, group = 40, 4
    torch.manual_seed(1)
    free = generate(model, ids, mask, max_new_tokens=budget, eos_id=-1, pad_id=TOKENIZER.pad_token_id,
                    num_samples=group, compact=False)
    # the token that ends the most rows early (first drawn after step 1, before the last 16 + 1 steps)
    early = free.response_ids[:, 1:budget - decode.COMPACT_MIN_STEPS - 1]
    eos = int(torch.stack([early.eq(v).any(-1) for v in range(len(TOKENIZER))]).sum(-1).argmax())
    dropped: list[int] = []
    for kind in (decode._PreallocatedLayer, transformers.cache_utils.DynamicLayer):
        select = kind.batch_select_indices
        monkeypatch.setattr(kind, "batch_select_indices",
                            lambda self, indices, select=select: (dropped.append(len(indices)), select(self, indices)))
    outputs = {}
    for compact in (False, True):
        torch.manual_seed(1)
        outputs[compact] = generate(model, ids, mask, max_new_tokens=budget, eos_id=eos,
                                    pad_id=TOKENIZER.pad_token_id, num_samples=group, compact=compact)
    plain, compacted = outputs[False], outputs[True]
    assert torch.equal(plain.response_ids, compacted.response_ids)
    assert torch.equal(plain.response_mask, compacted.response_mask) and torch.equal(plain.truncated,
                                                                                       compacted.truncated)
    assert (plain.logp - compacted.logp).abs().max() <= 1e-5
    lengths = plain.response_mask.sum(-1)
    # a quarter of the rows end while 16 steps may remain, the rest later: the loop must drop rows
    assert (lengths < budget - decode.COMPACT_MIN_STEPS).float().mean() >= decode.COMPACT_SHARE
    assert lengths.max() > lengths.min()
    if arch in HYBRID:
        assert dropped == []
    else:
        assert dropped and all(n < len(lengths) for n in dropped)
    prompt_ids, prompt_mask = ids.repeat_interleave(group, 0), mask.repeat_interleave(group, 0)
    truth = reference_logprobs(model, prompt_ids, prompt_mask, compacted.response_ids, compacted.response_mask, 1.0)
    assert (compacted.logp - truth).abs().max() <= TOLERANCE


def test_dropping_finished_rows_without_a_cache() -> None:
    model = tiny_model("llama")
    ids, mask = batch()
    outputs = {}
    for compact in (False, True):
        torch.manual_seed(2)
        outputs[compact] = generate(model, ids, mask, max_new_tokens=30, eos_id=5, pad_id=TOKENIZER.pad_token_id,
                                    num_samples=2, cache="none", compact=compact)
    assert torch.equal(outputs[False].response_ids, outputs[True].response_ids)
    assert (outputs[False].logp - outputs[True].logp).abs().max() <= 1e-5


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_two_training_steps_from_model_path(arch: str, tmp_path: Path, capsys) -> None:
    model_dir = tmp_path / "model"
    tiny_model(arch).save_pretrained(model_dir)
    TOKENIZER.save_pretrained(model_dir)
    code = main(["train", f"model.path={model_dir}", f"run_dir={tmp_path / 'run'}", "task.num_digits=3",
                 "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4", "trainer.total_steps=2",
                 "eval.size=0", "logging.progress=false", "trainer.threads=1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "policy model check: log-probs vs the model's own forward" in out
    scalars = read_scalars(tmp_path / "run")
    assert len(scalars["policy/loss"]) == 2
    assert all(torch.isfinite(torch.tensor(value)) for value, _ in scalars["grad_norm"])


def test_gemma2_without_its_softcap_is_caught_and_falls_back(monkeypatch) -> None:
    """The issue's bug: the chunked head without the softcap is far off; the check finds it
    (the transform hidden from rlzoo) and the model's own logits are used, with one warning."""
    model = tiny_model("gemma2")
    ids, mask = batch()
    responses = torch.randint(4, len(TOKENIZER), (3, 6), generator=torch.Generator().manual_seed(1))
    truth = reference_logprobs(model, ids, mask, responses, torch.ones(3, 6))
    set_fast_paths(model, FastPaths())
    wrong = response_forward(model, ids, mask, responses, torch.ones(3, 6)).logp
    assert (wrong - truth).abs().max() > 0.5
    monkeypatch.setattr(head_module, "known_transform", lambda config: None)
    check = check_model(model, torch.device("cpu"))
    assert check.paths.model_logits and "differs from the model's own logits" in check.warning
    right = response_forward(model, ids, mask, responses, torch.ones(3, 6)).logp
    assert (right - truth).abs().max() <= TOLERANCE


class ShiftedLlama(LlamaForCausalLM):
    """A subclass that transforms its logits in a way rlzoo does not know."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = out.logits * 0.5 + torch.arange(out.logits.shape[-1], dtype=out.logits.dtype) / 10
        return out


def test_unknown_logit_transform_falls_back_to_the_models_own_logits_with_one_warning() -> None:
    model = ShiftedLlama(AutoConfig.for_model("llama", **COMMON))
    check = check_model(model, torch.device("cpu"))
    assert check.paths.model_logits and check.paths.cache == "preallocated"
    assert check.warning.startswith("ShiftedLlama: the chunked LM head differs") and "rollout" not in check.warning
    assert fast_paths(model) is check.paths
    ids, mask = batch()
    responses = torch.randint(4, len(TOKENIZER), (3, 6), generator=torch.Generator().manual_seed(1))
    truth = reference_logprobs(model, ids, mask, responses, torch.ones(3, 6))
    out = response_forward(model, ids, mask, responses, torch.ones(3, 6), with_entropy=True)
    assert (out.logp - truth).abs().max() <= TOLERANCE and out.entropy.min() > 0
    out.logp.sum().backward()                                     # the fallback trains
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0


def test_the_check_leaves_the_rng_and_the_weights_as_they_were() -> None:
    """The default run's numbers do not change: no global draw, weights bit-identical."""
    model = tiny_model("qwen2", large=False)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(5)
    state = torch.get_rng_state()
    check_model(model, torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert fast_paths(model) == FastPaths(packing="segments", pack_min_share=1.0)  # qwen2: every fast path


def test_known_transforms_are_read_from_the_config() -> None:
    config = lambda arch, **kw: AutoConfig.for_model(arch, **{**COMMON, **kw})  # noqa: E731
    assert known_transform(config("qwen2")) is None and known_transform(config("llama")) is None
    assert known_transform(config("gemma2", final_logit_softcapping=30.0)) == LogitTransform(softcap=30.0)
    assert known_transform(config("gemma2", final_logit_softcapping=None)) is None
    assert known_transform(config("cohere", logit_scale=0.0625)) == LogitTransform(scale=0.0625)
    assert known_transform(config("granite", logits_scaling=8.0)) == LogitTransform(scale=0.125)
    assert known_transform(config("hyperclovax", logits_scaling=8.0)) == LogitTransform(scale=8.0)  # multiplies
    assert known_transform(config("falcon_h1", lm_head_multiplier=8.0)) == LogitTransform(scale=8.0)
    assert known_transform(config("mpt", logit_scale=8.0)) is None                  # MptForCausalLM ignores it


HEAD_VARIANTS = {
    "cohere": {"logit_scale": 4.0}, "granite": {"logits_scaling": 4.0}, "hyperclovax": {"logits_scaling": 4.0},
    "falcon_h1": {"lm_head_multiplier": 4.0, "mamba_d_ssm": 64, "mamba_d_state": 8, "mamba_n_heads": 4,
                  "mamba_chunk_size": 16},                    # a small SSM: the defaults take a minute a check
    "mpt": {"logit_scale": 4.0},
}
"""Models whose config has a factor on the logits, each with 4: the model's own forward
multiplies by it (Cohere, HyperCLOVAX, Falcon-H1), divides by it (Granite) or ignores it (MPT)."""


@pytest.mark.parametrize("arch", sorted(HEAD_VARIANTS))
def test_the_unchecked_head_applies_each_models_own_logit_factor(arch: str) -> None:
    """Without the load-time check (no paths recorded: :func:`rlzoo.models.head.default_paths`),
    the chunked head's log-probs equal the model's own forward: the config's factor is
    applied as the model's ``forward`` applies it."""
    model = tiny_model(arch, overrides=HEAD_VARIANTS[arch])
    assert not hasattr(model, head_module.PATHS_ATTRIBUTE)
    ids, mask = batch()
    responses = torch.randint(4, len(TOKENIZER), (3, 6), generator=torch.Generator().manual_seed(1))
    truth = reference_logprobs(model, ids, mask, responses, torch.ones(3, 6))
    with torch.no_grad():
        unchecked = response_forward(model, ids, mask, responses, torch.ones(3, 6)).logp
    assert (unchecked - truth).abs().max() <= TOLERANCE
    set_fast_paths(model, FastPaths(transform=LogitTransform(scale=4.0 if arch == "mpt" else 1.0)))
    with torch.no_grad():                                         # the other reading of the factor is far off
        wrong = response_forward(model, ids, mask, responses, torch.ones(3, 6)).logp
    assert (wrong - truth).abs().max() > 0.1
    check = check_model(model, torch.device("cpu"))
    assert not check.paths.model_logits and check.paths.transform == known_transform(model.config)


@pytest.mark.parametrize("transform", [LogitTransform(scale=0.25), LogitTransform(softcap=3.0),
                                       LogitTransform(scale=2.0, softcap=5.0)])
@pytest.mark.parametrize("keep", [0, 2**30])
def test_chunked_head_gradient_through_a_transform_equals_autograd(transform: LogitTransform, keep: int) -> None:
    """Hand-written backward of the chunked head, chained through the transform (kept or
    recomputed log-softmax), against autograd through :func:`head_logits`."""
    generator = torch.Generator().manual_seed(0)
    hidden = (torch.randn(2, 5, 8, generator=generator) * 3).requires_grad_(True)
    head = torch.nn.Linear(8, 30, bias=True)
    targets = torch.randint(0, 30, (2, 5), generator=generator)
    mask = torch.ones(2, 5)
    mask[0, 3:] = 0
    logp, entropy = token_logprobs(hidden, head, targets, mask, chunk_size=3, with_entropy=True, keep_max_bytes=keep,
                                   temperature=0.8, transform=transform)
    (logp.sum() + 0.3 * entropy.sum()).backward()
    got = [hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()]
    for tensor in (hidden, head.weight, head.bias):
        tensor.grad = None
    log_probs = torch.log_softmax(head_logits(hidden, head.weight, head.bias, transform) / 0.8, -1)
    want_logp = log_probs.gather(-1, targets[..., None]).squeeze(-1) * mask
    want_entropy = -(log_probs.exp() * log_probs).sum(-1) * mask
    assert torch.allclose(logp, want_logp, atol=1e-5) and torch.allclose(entropy, want_entropy, atol=1e-5)
    (want_logp.sum() + 0.3 * want_entropy.sum()).backward()
    for mine, theirs in zip(got, [hidden.grad, head.weight.grad, head.bias.grad]):
        assert torch.allclose(mine, theirs, atol=1e-5)
