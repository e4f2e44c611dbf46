"""Padding-free passes and token-budget micro-batches (issue 46).

Layouts and micro-batch splits by hand; on every architecture the tests build, the packed
forward against the padded one (log-probs, entropies, logits, values, gradients; sampled and
random tokens; LoRA); the learner's losses, metrics and gradients packed and padded, and with a
token budget against the fixed split; the refusals; the plan and the pre-flight estimate.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from rlzoo.commands.cli import main
from rlzoo.core.batch import RolloutBatch
from rlzoo.core.errors import ConfigError
from rlzoo.diagnostics.preflight import activation_bytes, micro_batch
from rlzoo.diagnostics.roofline import ModelShapes
from rlzoo.models import build as build_module
from rlzoo.models import packing
from rlzoo.models.build import ValueModel, build_tiny_model
from rlzoo.models.decode import generate
from rlzoo.models.dropout import disable_dropout
from rlzoo.models.head import fast_paths, set_fast_paths
from rlzoo.models.logprobs import model_inputs, response_forward
from rlzoo.models.lora import add_adapters, linear_names
from rlzoo.models.model_check import check_model
from rlzoo.learn.micro_batches import computed_tokens, token_micro_batches
from rlzoo.models.packing import PADDED, ROWS, SEGMENTS, pack, row_plan, sequence_inputs, token_mixers
from rlzoo.plan.planner import load_config
from rlzoo.plan.records import LoraPlan
from rlzoo.plan.settings import TinyModel
from rlzoo.plan.run_input import load_run
from rlzoo.run.trainer import Trainer
from test_architectures import ARCHITECTURES, COMMON, HEAD_VARIANTS, TOKENIZER, batch, tiny_model
from zoo import PM, REGISTRY, TINY

CPU = torch.device("cpu")
EXACT = 1e-5
"""Packed against padded, float32: ``|Δ| / max(1, |value|)`` (a log-prob of -30 nats under
scaled logits differs by a few 1e-6 between two layouts, as between two padded batches)."""


pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs() / b.abs().clamp(min=1.0)).max()) if a.numel() else 0.0


# ------------------------------------------------------------------ layouts by hand

PROMPTS = torch.tensor([[0, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]])
RESPONSES = torch.tensor([[10, 11], [12, 0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])


def test_one_row_layout_by_hand() -> None:
    layout = pack(*PROMPTS, *RESPONSES)
    assert layout.input_ids.tolist() == [[5, 6, 10, 11, 7, 8, 9, 12]]
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]
    assert layout.response_index.tolist() == [[1, 2], [6, 0]]  # the token before each response token
    assert layout.boundaries == [0, 4, 8] and layout.tokens == layout.computed == 8
    kwargs = layout.attention_kwargs()
    assert kwargs["cu_seq_lens_q"].tolist() == [0, 4, 8] and kwargs["max_length_q"] == 4
    hidden = torch.arange(8.0)[None, :, None]
    assert layout.gather(hidden)[..., 0].tolist() == [[1.0, 2.0], [6.0, 0.0]]


def test_rows_layout_balances_rows_and_its_unfilled_end_is_a_sequence_of_its_own() -> None:
    assert row_plan([5, 2, 2]) == [[0], [1, 2]]                # 2 rows of 5 beat 3 rows of 5
    assert row_plan([4, 4, 4, 4]) == [[0], [1], [2], [3]]
    prompt_ids = torch.tensor([[1, 2, 3], [0, 0, 4], [0, 0, 5]])
    prompt_mask = (prompt_ids > 0).long()
    response_ids = torch.tensor([[6, 7], [8, 0], [9, 0]])
    response_mask = (response_ids > 0).float()
    layout = pack(prompt_ids, prompt_mask, response_ids, response_mask, one_row=False)
    assert layout.input_ids.tolist() == [[1, 2, 3, 6, 7], [4, 8, 5, 9, 4]]
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 0, 1, 0]]
    assert layout.response_index.tolist() == [[2, 3], [5, 0], [7, 0]] and layout.boundaries == []
    assert (layout.tokens, layout.computed) == (9, 10)


def test_a_prompt_without_a_token_cannot_be_packed() -> None:
    with pytest.raises(ValueError, match="prompt has no valid token"):
        pack(torch.tensor([[0, 0]]), torch.tensor([[0, 0]]), torch.tensor([[3]]), torch.tensor([[1.0]]))


def test_a_batch_without_padding_keeps_the_padded_layout() -> None:
    """Packing that would compute as many positions as padding leaves the padded inputs."""
    ids = torch.tensor([[1, 2], [3, 4]])
    inputs = sequence_inputs(ids, torch.ones_like(ids), ids, torch.ones(2, 2), SEGMENTS)
    assert inputs.layout is None and inputs.attention_mask is not None
    packed = sequence_inputs(*PROMPTS, *RESPONSES, SEGMENTS)
    assert packed.layout is not None and packed.attention_mask is None and packed.computed == 8


def test_packing_pays_from_a_share_of_padding_set_by_the_models_cost_per_token() -> None:
    """The embedded default (2 layers of width 64, 4 heads, 2 key-value heads, MLP 256):
    2 x 2 x (2·64·64 + 2·64·32 + 3·64·256) = 245,760 FLOPs a token, so 6e4 / 245,760 of the
    padded positions must go; Qwen2's biases are not matrices, the embedding is left out."""
    model = build_tiny_model(TinyModel("qwen2", 64, 256, 2, 4, 2, 512), TOKENIZER)
    assert packing.token_flops(model) == 245_760
    assert packing.pack_min_share(model) == pytest.approx(6e4 / 245_760)
    # 2 sequences: prompts 3 and 1 tokens, responses 2 and 1: 7 real of 2 x (3 + 2) = 10 padded
    prompt_ids, prompt_mask = torch.tensor([[1, 2, 3], [0, 0, 4]]), torch.tensor([[1, 1, 1], [0, 0, 1]])
    response_ids, response_mask = torch.tensor([[5, 6], [7, 0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    inputs = (prompt_ids, prompt_mask, response_ids, response_mask, SEGMENTS)
    assert sequence_inputs(*inputs, 0.3).layout is not None and sequence_inputs(*inputs, 0.31).layout is None
    assert computed_tokens([3, 1], [2, 1], SEGMENTS, 0.3) == 7 and computed_tokens([3, 1], [2, 1], SEGMENTS, 0.31) == 10


def test_trimmed_drops_the_padding_columns_no_row_uses() -> None:
    scores = torch.zeros(2)
    rollout = RolloutBatch(prompt_ids=torch.tensor([[0, 0, 5], [0, 6, 7]]),
                           prompt_mask=torch.tensor([[0, 0, 1], [0, 1, 1]]),
                           response_ids=torch.tensor([[1, 2, 0, 0], [3, 0, 0, 0]]),
                           response_mask=torch.tensor([[1.0, 1, 0, 0], [1, 0, 0, 0]]), group_ids=torch.zeros(2),
                           scores=scores, truncated=torch.zeros(2, dtype=torch.bool), prompts=["a", "b"],
                           completions=["c", "d"], references=[None, None], reward_scores=torch.zeros(2, 3))
    trimmed = rollout.trimmed()
    assert trimmed.prompt_ids.tolist() == [[0, 5], [6, 7]] and trimmed.response_ids.tolist() == [[1, 2], [3, 0]]
    assert trimmed.loss_mask.shape == (2, 2) and trimmed.reward_scores.shape == (2, 3)
    assert trimmed.trimmed() is trimmed


# ------------------------------------------------------------------ micro-batches by tokens

def test_computed_tokens_by_hand() -> None:
    prompts, responses = [2, 3, 1], [6, 1, 3]
    assert computed_tokens(prompts, responses, SEGMENTS) == 16
    assert computed_tokens(prompts, responses, PADDED) == 3 * (3 + 6)
    assert computed_tokens(prompts, responses, ROWS) == 2 * 8           # rows [8], [4, 4]
    assert computed_tokens([], [], SEGMENTS) == 0


def test_token_micro_batches_by_hand() -> None:
    prompts, responses = [2, 2, 2, 2], [6, 1, 3, 2]                    # lengths 8, 3, 5, 4
    # packed: 2 balanced groups would be {8, 3} = 11 > 10, so 3: {8}, {5}, {4, 3}
    assert token_micro_batches(prompts, responses, 10, SEGMENTS) == [[0], [1, 3], [2]]
    assert token_micro_batches(prompts, responses, 20, SEGMENTS) == [[0, 1, 2, 3]]
    # padded, longest first: {8}; {5, 4} pads to 2 x 5 = 10; {3}
    assert token_micro_batches(prompts, responses, 10, PADDED) == [[0], [1], [2, 3]]
    assert token_micro_batches(prompts, responses, 7, SEGMENTS) == [[0], [1, 3], [2]]  # 8 > 7: alone
    assert token_micro_batches([], [], 10, SEGMENTS) == []


@pytest.mark.parametrize("packing_kind", [SEGMENTS, ROWS, PADDED])
def test_token_micro_batches_cover_every_sequence_once_within_the_budget(packing_kind: str) -> None:
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, 40, (50,), generator=generator).tolist()
    responses = torch.randint(0, 200, (50,), generator=generator).tolist()
    groups = token_micro_batches(prompts, responses, 600, packing_kind)
    assert sorted(i for group in groups for i in group) == list(range(50))
    for group in groups:
        assert computed_tokens([prompts[i] for i in group], [responses[i] for i in group], packing_kind) <= 600


# ------------------------------------------------------------------ every architecture

LAYOUTS = {**{arch: SEGMENTS for arch in [*ARCHITECTURES, *HEAD_VARIANTS, "persimmon"]},
           "gemma2": ROWS,       # eager attention (its softcap): no sdpa to run per sequence
           "stablelm": ROWS,     # its layers pass no keyword arguments down to the attention
           "lfm2": PADDED, "falcon_h1": PADDED,   # convolution / state-space layers
           "mpt": PADDED,        # eager, its mask ignores the position ids
           "opt": SEGMENTS}      # its mask ignores them too, but segment attention keeps each sequence apart
"""The layout the load-time check gives each architecture the tests build."""


def any_model(arch: str) -> torch.nn.Module:
    if arch in ARCHITECTURES:
        return tiny_model(arch)
    if arch in HEAD_VARIANTS:
        return tiny_model(arch, overrides=HEAD_VARIANTS[arch])
    torch.manual_seed(0)
    return disable_dropout(AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **COMMON))).eval()


def ragged_batch(model: torch.nn.Module, sampled: bool) -> tuple[torch.Tensor, ...]:
    """Prompts of 9, 2 and 5 tokens, 3 responses each of 8 tokens at most, some shorter:
    sampled by the model, or any tokens."""
    ids, mask = batch()
    prompt_ids, prompt_mask = ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0)
    if sampled:
        torch.manual_seed(0)
        gen = generate(model, ids, mask, max_new_tokens=8, eos_id=-1, pad_id=0, temperature=0.7, num_samples=3)
        response_ids, response_mask = gen.response_ids, gen.response_mask
    else:
        response_ids = torch.randint(4, len(TOKENIZER), (9, 8), generator=torch.Generator().manual_seed(3))
        response_mask = torch.ones(9, 8)
    lengths = torch.tensor([8, 3, 6, 1, 8, 5, 2, 7, 4])
    response_mask = response_mask * (torch.arange(8)[None, :] < lengths[:, None])
    return prompt_ids, prompt_mask, response_ids * response_mask.long(), response_mask


def forward_with(model: torch.nn.Module, layout: str, inputs: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
    """Log-probs, entropies, logits and the gradient of a loss through them, under ``layout``."""
    set_fast_paths(model, dataclasses.replace(fast_paths(model), packing=layout, pack_min_share=0.0))
    model.zero_grad(set_to_none=True)
    out = response_forward(model, *inputs, with_entropy=True, with_logits=True, temperature=0.7)
    mask = inputs[3]
    ((out.logp * mask).sum() + 0.1 * (out.entropy * mask).sum()).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    valid = mask > 0
    return {"logp": out.logp.detach(), "entropy": out.entropy.detach(), "logits": out.logits.detach()[valid],
            "grad": grads}


@pytest.mark.parametrize("arch", sorted(LAYOUTS))
def test_packed_equals_padded_on_every_architecture(arch: str) -> None:
    model = any_model(arch)
    check = check_model(model, CPU)
    assert check.paths.packing == LAYOUTS[arch], check.warning
    if LAYOUTS[arch] == PADDED:
        assert "not packed without padding" in check.warning and check.summary().endswith("training-side passes padded")
        return
    assert check.packed_error <= 1e-4 and f"packed without padding in {LAYOUTS[arch]}" in check.summary()
    for sampled in (True, False):
        inputs = ragged_batch(model, sampled)
        assert sequence_inputs(*inputs, LAYOUTS[arch]).layout is not None      # packing acts on this batch
        padded, packed = forward_with(model, PADDED, inputs), forward_with(model, LAYOUTS[arch], inputs)
        for key in ("logp", "entropy", "logits"):
            assert relative(packed[key], padded[key]) <= EXACT, (key, sampled)
        scale = padded["grad"].abs().max()
        assert float((packed["grad"] - padded["grad"]).abs().max() / scale) <= EXACT


@pytest.mark.parametrize("arch", sorted(arch for arch, layout in LAYOUTS.items() if layout != PADDED))
def test_packed_values_equal_padded_values(arch: str) -> None:
    """The critic (the policy's architecture with a value head) under the policy's layout."""
    policy = any_model(arch)
    check_model(policy, CPU)
    critic = disable_dropout(ValueModel(AutoModel.from_config(policy.config)))
    torch.nn.init.normal_(critic.value_head.weight)
    inputs = ragged_batch(policy, sampled=False)
    values = {}
    for layout in (PADDED, LAYOUTS[arch]):
        set_fast_paths(policy, dataclasses.replace(fast_paths(policy), packing=layout, pack_min_share=0.0))
        found = model_inputs(critic, *inputs, paths_of=policy)
        assert (found.layout is None) == (layout == PADDED)
        with torch.no_grad():
            values[layout] = found.responses(critic(**found.kwargs())) * inputs[3]
    assert relative(values[LAYOUTS[arch]], values[PADDED]) <= EXACT


LORA_ARCHS = ("llama", "qwen2", "gemma2", "stablelm", "gpt_neox", "mistral")


@pytest.mark.parametrize("arch", LORA_ARCHS)
def test_packed_equals_padded_with_lora_and_with_its_adapters_off(arch: str) -> None:
    model = any_model(arch)
    targets = tuple(name for name in linear_names(model) if name != "lm_head")
    model = add_adapters(model, LoraPlan(rank=4, alpha=8.0, dropout=0.0, target_modules=targets))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.5)                 # adapters that change the log-probs
    check = check_model(model, CPU)
    assert check.paths.packing == LAYOUTS[arch]
    inputs = ragged_batch(model, sampled=False)
    padded, packed = forward_with(model, PADDED, inputs), forward_with(model, LAYOUTS[arch], inputs)
    assert relative(packed["logp"], padded["logp"]) <= EXACT and relative(packed["entropy"], padded["entropy"]) <= EXACT
    assert float((packed["grad"] - padded["grad"]).abs().max() / padded["grad"].abs().max()) <= EXACT
    with model.disable_adapter(), torch.no_grad():
        base = {layout: (set_fast_paths(model, dataclasses.replace(fast_paths(model), packing=layout,
                                                                   pack_min_share=0.0)),
                         response_forward(model, *inputs).logp)[1] for layout in (PADDED, LAYOUTS[arch])}
    assert relative(base[LAYOUTS[arch]], base[PADDED]) <= EXACT and relative(base[PADDED], padded["logp"]) > 1e-3


def test_a_window_shorter_than_a_sequence_attends_through_its_block_of_the_mask(monkeypatch) -> None:
    """Full attention runs sdpa's causal kernel per sequence without a mask; a sliding window
    (Mistral's, 4 tokens) shorter than a sequence passes each sequence's block of the mask."""
    masks: dict[str, list] = {}
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def spy(module, query, key, value, attention_mask, **kwargs):
        masks.setdefault(type(module).__name__, []).append(attention_mask)
        return sdpa(module, query, key, value, attention_mask, **kwargs)

    for arch in ("llama", "mistral"):
        model = tiny_model(arch)
        check_model(model, CPU)
        set_fast_paths(model, dataclasses.replace(fast_paths(model), pack_min_share=0.0))
        monkeypatch.setitem(type(ALL_ATTENTION_FUNCTIONS)._global_mapping, "sdpa", spy)
        with torch.no_grad():
            response_forward(model, *ragged_batch(model, sampled=False))
        monkeypatch.setitem(type(ALL_ATTENTION_FUNCTIONS)._global_mapping, "sdpa", sdpa)
    assert all(mask is None for mask in masks["LlamaAttention"])
    found = masks["MistralAttention"]
    assert found and all(mask is not None and mask.shape[0] == 9 for mask in found)


def test_attention_groups_by_hand() -> None:
    """Lengths 100, 2, 3, 90 at 1000 FLOPs a pair and 2 MFLOPs a call: one call costs
    4·100²·1000 + 2e6 = 42e6; {100, 90} + {3, 2} cost 2·100²·1000 + 2·3²·1000 + 2·2e6 = 24.02e6;
    three calls 24.12e6."""
    packing.attention_groups.cache_clear()
    assert packing.attention_groups((100, 2, 3, 90), 1000.0) == ((0, 3), (1, 2))
    assert packing.attention_groups((5, 5, 5), 1000.0) == ((0, 1, 2),)


def test_packed_rows_attend_in_several_calls_exactly(monkeypatch) -> None:
    """Without a cost per call every sequence attends in a call of its own; the outputs go
    back to their places in the row."""
    monkeypatch.setattr(packing, "ATTENTION_CALL_FLOPS", 0.0)
    packing.attention_groups.cache_clear()
    for arch in ("llama", "mistral"):
        model = tiny_model(arch)
        assert check_model(model, CPU).paths.packing == SEGMENTS
        inputs = ragged_batch(model, sampled=False)
        padded, packed = forward_with(model, PADDED, inputs), forward_with(model, SEGMENTS, inputs)
        for key in ("logp", "entropy"):
            assert relative(packed[key], padded[key]) <= EXACT, (arch, key)
        assert float((packed["grad"] - padded["grad"]).abs().max() / padded["grad"].abs().max()) <= EXACT
    lengths = (17, 4, 10, 10, 3, 11, 6, 12, 9)
    groups = packing.attention_groups(lengths, 256.0)
    assert len(groups) == 8 and all(len({lengths[i] for i in group}) == 1 for group in groups)  # no padding
    packing.attention_groups.cache_clear()


def test_token_mixers_name_what_mixes_tokens_outside_attention() -> None:
    assert token_mixers(tiny_model("llama")) == [] and token_mixers(tiny_model("gpt2")) == []  # Conv1D: a linear
    assert token_mixers(tiny_model("lfm2")) == ["Conv1d layers", "Lfm2ShortConv layers", "layer type 'conv'"]


# ------------------------------------------------------------------ the learner

QUIET = ["eval.size=0", "logging.sample_every=0", "trainer.total_steps=1"]
PPO = ["algo=ppo", "kl.coef=0.05", "trainer.entropy_coef=0.01", "trainer.num_mini_batches=2",
       "trainer.update_epochs=2", "rollout.max_new_tokens=8"]


def _trainer(tmp_path: Path, name: str, *overrides: str) -> Trainer:
    return Trainer(load_run(REGISTRY, [*TINY, *QUIET, *PPO, *overrides, f"run_dir={tmp_path / name}"]), PM)


def _learn(trainer: Trainer, rollout: RolloutBatch) -> tuple[dict[str, float], RolloutBatch]:
    rollout = copy.deepcopy(rollout)
    torch.manual_seed(1)                                          # the mini-batches' order
    metrics = trainer.learner.prepare(rollout)
    metrics.update(trainer.learner.update(rollout))
    return metrics, rollout


def test_every_loss_term_and_the_update_equal_the_padded_paths(tmp_path: Path, monkeypatch) -> None:
    """PPO with a critic, KL in the loss and an entropy bonus, 2 epochs x 2 mini-batches:
    the passes' outputs, every logged loss term and metric, and the weights after the update
    (every micro-batch packed: this batch's padding is below the share that packs by default)."""
    monkeypatch.setattr(packing, "PACK_OVERHEAD_FLOPS", 0.0)
    packed, padded = _trainer(tmp_path, "packed"), _trainer(tmp_path, "padded", "trainer.padding_free=false")
    assert fast_paths(packed.models.policy).packing == SEGMENTS
    assert fast_paths(padded.models.policy).packing == PADDED
    rollout = packed._produce()
    assert sequence_inputs(rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids, rollout.response_mask,
                           SEGMENTS).layout is not None
    found, done = _learn(packed, rollout)
    want, expected = _learn(padded, rollout)
    for field in ("old_logp", "ref_logp", "old_values", "advantages", "returns"):
        got = getattr(done, field)
        if got is not None:
            assert relative(got, getattr(expected, field)) <= EXACT, field
    assert found.keys() == want.keys()
    for key in want:
        assert abs(found[key] - want[key]) <= EXACT * max(1.0, abs(want[key])), (key, found[key], want[key])
    for module in ("policy", "critic"):
        for (name, mine), theirs in zip(getattr(packed.models, module).state_dict().items(),
                                        getattr(padded.models, module).state_dict().values()):
            assert torch.allclose(mine, theirs, rtol=0, atol=1e-6), (module, name)


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("padding_free", ["null", "false"])
def test_a_token_budget_gives_the_gradient_of_the_fixed_split(tmp_path: Path, loss_agg: str, padding_free: str,
                                                              monkeypatch) -> None:
    """The same mini-batches split into 4-sequence micro-batches or into micro-batches of at
    most 40 token positions (other groups, other sizes): every aggregation divides by the
    mini-batch's counts, so the accumulated gradients agree (lr 0: the weights stay put and
    the last mini-batch's gradient is left on them). Packed: every micro-batch packed."""
    monkeypatch.setattr(packing, "PACK_OVERHEAD_FLOPS", 0.0)
    common = [f"loss_agg={loss_agg}", "trainer.lr=0", "trainer.critic_lr=0", f"trainer.padding_free={padding_free}"]
    fixed = _trainer(tmp_path, "fixed", *common, "trainer.micro_batch_size=4")
    budget = _trainer(tmp_path, "budget", *common, "trainer.micro_batch_tokens=40")
    rollout = fixed._produce()
    groups = budget.learner._micro_batches(rollout)
    assert len(groups) > 4 and len({len(rows) for rows, _ in groups}) > 1   # not the fixed split's groups
    found, _ = _learn(budget, rollout)
    want, _ = _learn(fixed, rollout)
    for key in ("policy/loss", "value/loss", "kl/value", "entropy", "grad_norm"):
        assert abs(found[key] - want[key]) <= 1e-5 * max(1.0, abs(want[key])), key
    for module in ("policy", "critic"):
        mine = [p.grad for p in getattr(budget.models, module).parameters()]
        theirs = [p.grad for p in getattr(fixed.models, module).parameters()]
        for a, b in zip(mine, theirs):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)


def test_passes_with_a_token_budget_put_every_row_back_in_place(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(packing, "PACK_OVERHEAD_FLOPS", 0.0)
    fixed = _trainer(tmp_path, "fixed")
    budget = _trainer(tmp_path, "budget", "trainer.micro_batch_tokens=30")
    rollout = fixed._produce()
    _, want = _learn(fixed, rollout)
    _, found = _learn(budget, rollout)
    for field in ("old_logp", "ref_logp", "old_values"):
        assert relative(getattr(found, field), getattr(want, field)) <= EXACT, field


# ------------------------------------------------------------------ refusals

def _saved(tmp_path: Path, arch: str) -> Path:
    model_dir = tmp_path / arch
    any_model(arch).save_pretrained(model_dir)
    TOKENIZER.save_pretrained(model_dir)
    return model_dir


def test_a_budget_smaller_than_a_response_is_refused_when_the_config_is_read(capsys) -> None:
    assert main(["config", "trainer.micro_batch_tokens=7", "rollout.max_new_tokens=7"]) == 2
    err = capsys.readouterr().err
    assert "a model was built" not in err
    assert "trainer.micro_batch_tokens=7 is smaller than the longest sequence" in err
    assert "at least 8 tokens (a prompt of 1 token + rollout.max_new_tokens=7)" in err
    assert main(["config", "trainer.micro_batch_tokens=0"]) == 2
    assert "must be > 0" in capsys.readouterr().err


def test_a_budget_smaller_than_the_longest_sequence_is_refused_before_any_model(tmp_path: Path, capsys,
                                                                                monkeypatch) -> None:
    """The default task's prompts are 5 tokens (4 digits and a separator, its probe draws): a
    budget of 7 holds a response of 3 tokens (the config's check) but not the prompt with it."""
    def no_model(*args):
        raise ConfigError("a model was built")

    monkeypatch.setattr(build_module, "build_policy", no_model)
    code = main(["train", f"run_dir={tmp_path / 'run'}", "rollout.max_new_tokens=3", "trainer.micro_batch_tokens=7",
                 "trainer.threads=1", "logging.progress=false"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "a model was built" not in err
    assert "trainer.micro_batch_tokens=7 is smaller than the longest sequence of this run: 8 tokens (its " \
           "longest prompt, 5 tokens, + rollout.max_new_tokens=3)" in err
    assert not (tmp_path / "run").exists()
    assert main(["train", f"run_dir={tmp_path / 'run'}", "rollout.max_new_tokens=3", "trainer.micro_batch_tokens=8",
                 "trainer.threads=1", "logging.progress=false", "trainer.total_steps=1"]) == 2  # 8 fits: a model
    assert "a model was built" in capsys.readouterr().err


def test_packing_forced_on_a_model_it_cannot_pack_exactly_exits_2_naming_it_and_the_key(tmp_path: Path,
                                                                                        capsys) -> None:
    model_dir = _saved(tmp_path, "lfm2")
    code = main(["train", f"model.path={model_dir}", f"run_dir={tmp_path / 'run'}", "task.num_digits=3",
                 "trainer.padding_free=true", "trainer.threads=1", "logging.progress=false"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "trainer.padding_free=true, but packing sequences is not exact on Lfm2ForCausalLM: its Conv1d layers" in err
    assert "set trainer.padding_free=null (pack where exact) or false" in err


def test_padding_free_false_pads_and_skips_the_check() -> None:
    model = tiny_model("llama")
    check = check_model(model, CPU, padding_free=False)
    assert check.paths.packing == PADDED and check.packed_error is None and check.warning is None


# ------------------------------------------------------------------ plan and pre-flight

def test_the_plan_says_the_layout_and_the_budget() -> None:
    text = load_config(REGISTRY, ["trainer.micro_batch_tokens=512"]).plan.render()
    assert "micro-batches of at most 512 token positions each, balanced by tokens (trainer.micro_batch_tokens)" in text
    assert "training-side passes: each micro-batch's sequences packed without padding, where the model check " in text
    text = load_config(REGISTRY, ["trainer.padding_free=false"]).plan.render()
    assert "micro-batches of 64\n" in text and "training-side passes: padded (trainer.padding_free=false)" in text


def test_the_preflight_activations_are_bounded_by_the_budget() -> None:
    shapes = ModelShapes(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=256, vocab=16)
    common = ["rollout.max_new_tokens=100", "trainer.num_mini_batches=1", "trainer.padding_free=false"]
    fixed = load_config(REGISTRY, [*common, "trainer.micro_batch_size=64"])
    budget = load_config(REGISTRY, [*common, "trainer.micro_batch_size=64", "trainer.micro_batch_tokens=1100"])
    assert micro_batch(fixed.plan, 10) == 64 and micro_batch(budget.plan, 10) == 10     # 1100 // (10 + 100)
    # 64 sequences x 110 tokens against 10 x 110: the kept activations and the kept head scale alike
    assert activation_bytes(fixed, shapes, 10) == pytest.approx(6.4 * activation_bytes(budget, shapes, 10), rel=0.01)
    packed = load_config(REGISTRY, [*common[:2], "trainer.micro_batch_tokens=1100"])
    assert activation_bytes(packed, shapes, 10) == activation_bytes(budget, shapes, 10) + 1100**2
