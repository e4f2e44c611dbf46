"""Engine pieces: tokenizer round trip, rollout masks, chunked log-probs, batch ops."""

from __future__ import annotations

import contextlib
import math
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from rlzoo.core.batch import RolloutBatch
from rlzoo.models.logprobs import response_forward, token_logprobs
from rlzoo.models.build import build_char_tokenizer, build_tiny_model, load_pretrained, load_tokenizer
from rlzoo.models.decode import generate, sample_categorical
from rlzoo.core.tokens import left_pad

TINY = OmegaConf.create(dict(arch="qwen2", hidden_size=32, intermediate_size=64, num_layers=1,
                             num_heads=2, num_kv_heads=1, dtype="float32"))


def test_tokenizer_save_reload_round_trip_is_exact(tmp_path) -> None:
    tok = build_char_tokenizer("0123456789+-*=,:")
    model = build_tiny_model(TINY, tok)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    samples = ["531826=", "12+34=", "3,5,7:22=", "0", "=" * 9, "9*9-1"]
    reloaded = load_tokenizer(tmp_path)
    for text in samples:
        ids = tok(text, add_special_tokens=False).input_ids
        assert len(ids) == len(text)                       # one token per character
        assert reloaded(text, add_special_tokens=False).input_ids == ids
        assert reloaded.decode(ids) == text
    assert (reloaded.pad_token_id, reloaded.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    assert reloaded.padding_side == "left"
    _, via_loader = load_pretrained(tmp_path)
    assert via_loader("531826=", add_special_tokens=False).input_ids == tok(
        "531826=", add_special_tokens=False).input_ids


def test_a_model_path_whose_tokenizer_outgrows_its_embedding_is_refused_before_the_run(tmp_path: Path,
                                                                                        capsys) -> None:
    """A 20-token model saved beside a 30-token tokenizer: ids 20..29 have no embedding row.
    `rlzoo train` exits 2 naming both sizes, with no run directory; an embedding larger
    than its tokenizer (rows padded to a multiple, as most released models have) loads."""
    from rlzoo.commands.cli import main

    small = build_char_tokenizer("0123456789abcdef")               # 4 + 16 = 20 tokens
    build_tiny_model(TINY, small).save_pretrained(tmp_path / "m")
    build_char_tokenizer("0123456789abcdefghijklmnopqrstuvwxyz"[:26]).save_pretrained(tmp_path / "m")  # 30
    run_dir = tmp_path / "run"
    assert main(["train", f"model.path={tmp_path / 'm'}", "trainer.total_steps=1", f"run_dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert (f"model.path '{tmp_path / 'm'}' does not fit its tokenizer: the tokenizer has 30 tokens, the model's "
            "input embedding 20 rows (ids 20..29 have no embedding)") in err
    assert "Traceback" not in err and not run_dir.exists()
    padded = build_tiny_model(TINY, small)
    padded.resize_token_embeddings(32)
    padded.save_pretrained(tmp_path / "p")
    small.save_pretrained(tmp_path / "p")
    model, tokenizer = load_pretrained(tmp_path / "p")
    assert (len(tokenizer), model.get_input_embeddings().num_embeddings) == (20, 32)
    assert "warning" not in capsys.readouterr().err
    # An added token past the embedding (what transformers' GGUF reader does): a warning, not a refusal.
    build_tiny_model(TINY, small).save_pretrained(tmp_path / "a")
    small.add_tokens(["<extra>"])
    small.save_pretrained(tmp_path / "a")
    model, tokenizer = load_pretrained(tmp_path / "a")
    assert (len(tokenizer), model.get_input_embeddings().num_embeddings) == (21, 20)
    assert ("the tokenizer's added token(s) '<extra>' (ids 20..20) have no row in the model's 20-row input "
            "embedding") in capsys.readouterr().err


def test_left_pad() -> None:
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_rollout_response_mask_and_truncation() -> None:
    torch.manual_seed(0)
    tok = build_char_tokenizer("0123456789=")
    model = build_tiny_model(TINY, tok)
    prompts = ["12=", "3=", "456="]
    ids, mask = left_pad([tok(p, add_special_tokens=False).input_ids for p in prompts], tok.pad_token_id)
    gen = generate(model, ids, mask, max_new_tokens=6, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    for row, row_mask, truncated in zip(gen.response_ids, gen.response_mask, gen.truncated):
        n = int(row_mask.sum())
        assert row_mask[:n].eq(1).all() and row_mask[n:].eq(0).all()
        assert row[n:].eq(tok.pad_token_id).all()
        eos_positions = (row[:n] == tok.eos_token_id).nonzero().flatten().tolist()
        if truncated:
            assert eos_positions == [] and n == gen.response_ids.shape[1] == 6
        else:
            assert eos_positions == [n - 1]                   # EOS is the last valid token


def test_greedy_rollout_is_deterministic_and_matches_full_forward() -> None:
    torch.manual_seed(0)
    tok = build_char_tokenizer("0123456789=")
    model = build_tiny_model(TINY, tok).eval()
    ids, mask = left_pad([tok(p, add_special_tokens=False).input_ids for p in ["12=", "3="]], tok.pad_token_id)
    a = generate(model, ids, mask, max_new_tokens=5, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, greedy=True)
    b = generate(model, ids, mask, max_new_tokens=5, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, greedy=True)
    assert torch.equal(a.response_ids, b.response_ids)
    # the KV-cached greedy tokens are the argmax of a full (uncached) forward
    with torch.no_grad():
        out = response_forward(model, ids, mask, a.response_ids, a.response_mask, with_logits=True)
    argmax = out.logits.argmax(-1)
    valid = a.response_mask.bool()
    assert torch.equal(argmax[valid], a.response_ids[valid])


def test_group_rollout_prefills_once_and_equals_repeated_prompts() -> None:
    """num_samples=n reuses each prompt's prefill for its n completions: the same tokens
    as generating from the prompt repeated n times (greedy, and sampled with one seed),
    ordered prompt-major, and the sampled completions of a group differ."""
    torch.manual_seed(0)
    tok = build_char_tokenizer("0123456789=")
    model = build_tiny_model(TINY, tok).eval()
    ids, mask = left_pad([tok(p, add_special_tokens=False).input_ids for p in ["12=", "3456="]], tok.pad_token_id)
    kwargs = dict(max_new_tokens=6, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    for greedy in (True, False):
        torch.manual_seed(1)
        grouped = generate(model, ids, mask, greedy=greedy, num_samples=3, **kwargs)
        torch.manual_seed(1)
        repeated = generate(model, ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0), greedy=greedy,
                            **kwargs)
        assert grouped.response_ids.shape[0] == 6
        assert torch.equal(grouped.response_ids, repeated.response_ids)
        assert torch.equal(grouped.response_mask, repeated.response_mask)
        assert torch.equal(grouped.truncated, repeated.truncated)
    assert len({tuple(r) for r in grouped.response_ids[:3].tolist()}) > 1


def _naive(hidden, head, targets):
    logits = head(hidden).float()
    logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
    probs = torch.softmax(logits, -1)
    entropy = -(probs * torch.log_softmax(logits, -1)).sum(-1)
    return logp, entropy


def test_chunked_logprobs_and_entropy_equal_naive_values_and_gradients() -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    hidden = torch.randn(3, 7, 8, requires_grad=True)
    targets = torch.randint(0, 50, (3, 7))
    mask = torch.ones(3, 7)
    mask[1, 4:] = 0
    mask[2] = 0
    expected_logp, expected_entropy = _naive(hidden, head, targets)
    (expected_logp * mask).sum().backward()
    expected_grad = hidden.grad.clone()
    for chunk, keep_bytes in ((1, 0), (4, 0), (1000, 0), (4, 2**30)):   # recomputed, then kept
        hidden.grad = None
        logp, entropy = token_logprobs(hidden, head, targets, mask, chunk_size=chunk, with_entropy=True,
                                       keep_max_bytes=keep_bytes)
        assert torch.allclose(logp, expected_logp * mask, atol=1e-6)
        assert torch.allclose(entropy, expected_entropy * mask, atol=1e-6)
        (logp * mask).sum().backward()
        assert torch.allclose(hidden.grad, expected_grad, atol=1e-6)
    assert logp[2].eq(0).all()                                  # fully masked row


@pytest.mark.parametrize("keep_bytes", [0, 2**30])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_head_gradients_of_a_mixed_logp_and_entropy_loss_equal_autograd(keep_bytes: int, temperature: float) -> None:
    """The head's written-out backward against autograd through the naive formula, for a
    loss that weights log-probs and entropies per token (entropy_coef > 0), with a bias,
    a temperature, and gradients for the hidden states, the weight and the bias."""
    torch.manual_seed(1)
    head = torch.nn.Linear(6, 40, bias=True)
    hidden = torch.randn(2, 9, 6, requires_grad=True)
    targets = torch.randint(0, 40, (2, 9))
    mask = (torch.rand(2, 9) > 0.3).float()
    weights_logp, weights_entropy = torch.randn(2, 9), torch.randn(2, 9)

    def naive_loss() -> torch.Tensor:
        logits = head(hidden) / temperature
        log_probs = torch.log_softmax(logits, -1)
        logp = log_probs.gather(-1, targets[..., None]).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return ((weights_logp * logp + weights_entropy * entropy) * mask).sum()

    def chunked_loss() -> torch.Tensor:
        logp, entropy = token_logprobs(hidden, head, targets, mask, chunk_size=4, with_entropy=True,
                                       keep_max_bytes=keep_bytes, temperature=temperature)
        return ((weights_logp * logp + weights_entropy * entropy) * mask).sum()

    grads = []
    for loss_fn in (naive_loss, chunked_loss):
        hidden.grad = head.weight.grad = head.bias.grad = None
        loss_fn().backward()
        grads.append((hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()))
    for expected, got in zip(*grads):
        assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), (got - expected).abs().max()
    hidden.grad = head.weight.grad = None                          # logp alone: the entropy gradient is skipped
    logp, _ = token_logprobs(hidden, head, targets, mask, chunk_size=4, keep_max_bytes=keep_bytes,
                             temperature=temperature)
    (logp * mask).sum().backward()
    assert hidden.grad.abs().sum() > 0


def test_a_second_backward_through_a_kept_head_is_refused_not_wrong() -> None:
    """Backward forms the logits' gradient in the kept log-softmax's buffer; a second
    backward through the same graph is an autograd error, never a silently wrong gradient."""
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 30, bias=False)
    hidden = torch.randn(1, 5, 8, requires_grad=True)
    logp, _ = token_logprobs(hidden, head, torch.randint(0, 30, (1, 5)), torch.ones(1, 5), keep_max_bytes=2**30)
    logp.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        logp.sum().backward()


def test_head_under_autocast_runs_its_matmuls_in_bfloat16_like_autograd() -> None:
    """Under ``torch.autocast(bfloat16)`` the written-out backward runs its matmuls in bf16
    like autograd's: its gradients are off the float32 ones by bf16 rounding (not zero),
    and no further than autograd's own bf16 gradients are."""
    torch.manual_seed(2)
    head = torch.nn.Linear(32, 300, bias=False)
    hidden = torch.randn(64, 32, requires_grad=True)
    targets = torch.randint(0, 300, (64,))
    weights = torch.randn(64)

    def grads(fn, autocast: bool) -> tuple[torch.Tensor, torch.Tensor]:
        hidden.grad = head.weight.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            (fn() * weights).sum().backward()
        return hidden.grad.clone(), head.weight.grad.clone()

    def naive() -> torch.Tensor:
        return torch.log_softmax(F.linear(hidden, head.weight).float(), -1).gather(-1, targets[:, None]).squeeze(-1)

    def chunked() -> torch.Tensor:
        return token_logprobs(hidden[None], head, targets[None], torch.ones(1, 64), chunk_size=16)[0][0]

    exact = grads(naive, autocast=False)
    autograd_bf16, ours_bf16 = grads(naive, autocast=True), grads(chunked, autocast=True)
    for reference, a, b in zip(exact, autograd_bf16, ours_bf16):
        scale = reference.norm()
        ours, autograds = (b - reference).norm() / scale, (a - reference).norm() / scale
        assert ours < 1e-2 and ours <= 1.25 * autograds          # as close to float32 as autograd's bf16
        assert (b - reference).norm() > 0                        # the matmuls did run in bfloat16


def test_batch_select_and_concat_pad_correctly() -> None:
    def make(p_width: int, t_width: int, group: int) -> RolloutBatch:
        return RolloutBatch(
            prompt_ids=torch.ones(2, p_width, dtype=torch.long), prompt_mask=torch.ones(2, p_width),
            response_ids=torch.ones(2, t_width, dtype=torch.long), response_mask=torch.ones(2, t_width),
            group_ids=torch.tensor([group, group]), scores=torch.tensor([0.0, 1.0]),
            truncated=torch.tensor([False, True]), prompts=["a", "b"], completions=["x", "y"],
            references=[1, 2],
        )

    merged = RolloutBatch.concat([make(3, 2, 0), make(1, 4, 1)])
    assert merged.prompt_ids.shape == (4, 3) and merged.response_ids.shape == (4, 4)
    assert merged.prompt_mask[2].tolist() == [0, 0, 1]            # prompts padded on the left
    assert merged.response_mask[0].tolist() == [1, 1, 0, 0]       # responses on the right
    assert merged.loss_mask[0].tolist() == [1, 1, 0, 0]
    assert merged.prompts == ["a", "b", "a", "b"]
    sub = merged.select([3, 0])
    assert sub.group_ids.tolist() == [1, 0] and sub.references == [2, 1]
    assert torch.equal(sub.rewards, sub.scores)


def _saved_bytes(fn) -> int:
    """Bytes of tensors autograd keeps for backward while ``fn`` runs (unique storages)."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def test_chunked_head_keeps_memory_sublinear_in_vocab_times_length() -> None:
    """The chunked head saves O(B·T·H + chunk·V) for backward; naive log_softmax saves
    O(B·T·V) float32. Growing V·T by 16x must grow the chunked figure far less."""
    torch.manual_seed(0)
    hidden_size, batch = 64, 4
    figures = {}
    for vocab, length in ((1000, 32), (4000, 128)):
        head = torch.nn.Linear(hidden_size, vocab, bias=False)
        hidden = torch.randn(batch, length, hidden_size, requires_grad=True)
        targets = torch.randint(0, vocab, (batch, length))
        mask = torch.ones(batch, length)
        chunked = _saved_bytes(partial(token_logprobs, hidden, head, targets, mask, chunk_size=64,
                                       with_entropy=True, keep_max_bytes=0))
        naive = _saved_bytes(partial(_naive, hidden, head, targets))
        figures[(vocab, length)] = (chunked, naive)
    (small_c, small_n), (big_c, big_n) = figures[(1000, 32)], figures[(4000, 128)]
    assert big_n >= 12 * small_n                        # naive: ~linear in V·T (16x)
    assert big_c < 4.5 * small_c                        # chunked: grows with T (4x), not V·T
    assert big_c < big_n / 20                           # and much smaller outright


def test_log_softmax_is_kept_within_the_budget_and_recomputed_above_it() -> None:
    """Up to ``keep_max_bytes`` each chunk's log-softmax is saved for backward (cheaper
    than recomputing it); above it only the chunk inputs are."""
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 300, bias=False)
    hidden = torch.randn(2, 40, 16, requires_grad=True)
    targets = torch.randint(0, 300, (2, 40))
    mask = torch.ones(2, 40)
    logits_bytes = 2 * 40 * 300 * 4
    kept = _saved_bytes(partial(token_logprobs, hidden, head, targets, mask, chunk_size=80,
                                keep_max_bytes=logits_bytes))             # within: kept
    recomputed = _saved_bytes(partial(token_logprobs, hidden, head, targets, mask, chunk_size=80,
                                      keep_max_bytes=logits_bytes - 1))
    assert kept >= logits_bytes > recomputed


def test_rollout_log_probs_are_those_of_the_distribution_sampled_from() -> None:
    """temperature: log_softmax(logits / T) of a full forward; top-p: the nucleus
    renormalised (the sampled token's log-prob is higher than under the full distribution)."""
    torch.manual_seed(0)
    tok = build_char_tokenizer("0123456789=")
    model = build_tiny_model(TINY, tok).eval()
    ids, mask = left_pad([tok(p, add_special_tokens=False).input_ids for p in ["12=", "3456="]], tok.pad_token_id)
    kwargs = dict(max_new_tokens=6, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, num_samples=3)
    for temperature in (1.0, 0.6):
        gen = generate(model, ids, mask, temperature=temperature, **kwargs)
        with torch.no_grad():
            full = response_forward(model, ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0),
                                    gen.response_ids, gen.response_mask, temperature=temperature)
        valid = gen.response_mask.bool()
        assert torch.allclose(gen.logp[valid], full.logp[valid], atol=1e-5)
        assert gen.logp[~valid].eq(0).all()
    gen = generate(model, ids, mask, top_p=0.3, **kwargs)
    with torch.no_grad():
        full = response_forward(model, ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0),
                                gen.response_ids, gen.response_mask)
    valid = gen.response_mask.bool()
    assert (gen.logp[valid] >= full.logp[valid] - 1e-6).all() and (gen.logp[valid] <= 0).all()
    assert (gen.logp[valid] > full.logp[valid] + 1e-3).any()
    greedy = generate(model, ids, mask, greedy=True, **kwargs)
    assert greedy.logp.eq(0).all()                            # a point mass


@pytest.mark.parametrize("vocab", [7, 256, 1000])                 # under, at and not a multiple of a block
def test_sample_categorical_draws_each_index_with_its_probability(vocab: int) -> None:
    """Frequencies over many draws match ``probs / probs.sum()`` (Pearson's chi-square
    below its 0.1 % critical value, deterministic under the seed); zero-mass entries,
    including the first and the last, are never drawn."""
    torch.manual_seed(0)
    weights = torch.rand(vocab) ** 3 * 5                            # unnormalised, skewed
    weights[0] = weights[-1] = 0.0
    weights[vocab // 2] = 0.0
    draws = 200_000 // 50
    counts = torch.zeros(vocab)
    for _ in range(50):
        token = sample_categorical(weights.repeat(draws, 1))
        counts += torch.bincount(token, minlength=vocab).float()
    assert counts[0] == counts[-1] == counts[vocab // 2] == 0
    expected = weights / weights.sum() * counts.sum()
    support = expected > 0
    chi2 = float(((counts[support] - expected[support]) ** 2 / expected[support]).sum())
    dof = int(support.sum()) - 1
    critical = dof + 3.09 * math.sqrt(2 * dof) + 3.1                # ≈ the 0.999 quantile (normal approx.)
    assert chi2 < critical, (chi2, critical)


def test_sample_categorical_edge_rows() -> None:
    """A point mass is always drawn; rows are independent; mass only in the last entry of
    a padded block is still found."""
    torch.manual_seed(0)
    probs = torch.zeros(4, 300)
    probs[0, 0] = 1.0
    probs[1, 299] = 3.0
    probs[2, 256] = 1e-30                                          # tiny but positive
    probs[3] = 1.0
    token = sample_categorical(probs)
    assert token[:3].tolist() == [0, 299, 256] and 0 <= int(token[3]) < 300
    many = sample_categorical(torch.ones(2000, 300))
    assert many.unique().numel() > 250                              # uniform over the row


def test_sampling_from_non_finite_logits_stops_with_a_training_error() -> None:
    from rlzoo.core.errors import TrainingError

    logits = torch.zeros(3, 40)
    logits[1, 5] = float("nan")
    with pytest.raises(TrainingError, match=r"rows \[1\] are not finite"):
        sample_categorical(torch.softmax(logits, -1))


def test_generate_with_the_preallocated_cache_equals_the_growing_cache(monkeypatch) -> None:
    """Decoding into a cache allocated once gives the same tokens and log-probs as
    transformers' growing ``DynamicCache`` under the same seed."""
    import rlzoo.models.decode as rollout

    tok = build_char_tokenizer("0123456789=")
    model = build_tiny_model(TINY, tok).eval()
    ids, mask = left_pad([tok(p, add_special_tokens=False).input_ids for p in ["12=", "3456="]], tok.pad_token_id)
    kwargs = dict(max_new_tokens=7, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, num_samples=3)
    swapped = []
    original = rollout._preallocate

    def spy(past, capacity: int) -> None:
        original(past, capacity)
        swapped.extend(type(layer) for layer in past.layers)

    monkeypatch.setattr(rollout, "_preallocate", spy)
    torch.manual_seed(3)
    fast = generate(model, ids, mask, **kwargs)
    assert swapped and all(kind is rollout._PreallocatedLayer for kind in swapped)
    calls = []
    monkeypatch.setattr(rollout, "_preallocate", lambda past, capacity: calls.append(capacity))
    torch.manual_seed(3)
    plain = generate(model, ids, mask, **kwargs)
    assert calls == [ids.shape[1] + 7]
    assert torch.equal(fast.response_ids, plain.response_ids)
    assert torch.allclose(fast.logp, plain.logp, atol=1e-6)


def test_hf_backend_generates_with_a_synced_copy_in_another_dtype() -> None:
    from rlzoo_plugins.rollout_backends import HFRollout

    torch.manual_seed(0)
    tok = build_char_tokenizer("0123456789=")
    policy = build_tiny_model(TINY, tok)
    prompts = [tok(p, add_special_tokens=False).input_ids for p in ["12=", "3456="]]
    kwargs = dict(num_samples=2, max_new_tokens=5, temperature=1.0, top_p=1.0)
    same = HFRollout(policy, tok, torch.device("cpu"), "float32", contextlib.nullcontext)
    assert same.model is policy
    half = HFRollout(policy, tok, torch.device("cpu"), "bfloat16", contextlib.nullcontext)
    assert half.model is not policy and next(half.model.parameters()).dtype == torch.bfloat16
    out = half.generate(prompts, **kwargs)
    assert out.logp.dtype == torch.float32 and out.response_ids.shape[0] == 4
    assert not out.response_ids.is_inference()              # usable in a later autograd graph
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.5)
    before = next(half.model.parameters()).clone()
    half.sync_weights(lambda: iter(policy.state_dict().items()))
    after = next(half.model.parameters())
    assert not torch.equal(before, after)
    assert torch.equal(after, next(policy.parameters()).to(torch.bfloat16))


def test_mismatch_metrics_hand_computed() -> None:
    from rlzoo.learn.learner import mismatch_metrics

    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    rollout = torch.tensor([[-1.5, -2.0, 9.0], [-0.4, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    out = mismatch_metrics(old, rollout, mask)
    k3 = [math.exp(0.5) - 0.5 - 1, 0.0, math.exp(-0.1) + 0.1 - 1]    # x = old − rollout on valid tokens
    assert float(out["mismatch_k3"]) == pytest.approx(sum(k3) / 3, abs=1e-7)
    assert float(out["max_abs_log_ratio"]) == pytest.approx(0.5)


def test_masked_whiten_is_verls_formula_eps_inside_the_root() -> None:
    """verl / TRL: (x − mean)·rsqrt(unbiased var + 1e-8). Where the variance is ~1e-8 this
    differs from (x − mean)/(std + 1e-8): the test would catch a return to the latter."""
    from rlzoo.core.masked import masked_whiten

    values = torch.tensor([[1.0, 1.0 + 2e-4, 1.0 - 2e-4, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    valid = values[0, :3]
    mean, var = valid.mean(), valid.var(unbiased=True)            # var = 4e-8
    expected = (valid - mean) / math.sqrt(float(var) + 1e-8)
    out = masked_whiten(values, mask)
    assert torch.allclose(out[0, :3], expected, atol=1e-12) and out[0, 3] == 0
    assert not torch.allclose(out[0, :3], (valid - mean) / (var.sqrt() + 1e-8), atol=1e-3)


# ------------------------------------------------------------------ one rank failing alone (rlzoo.core.distributed)


def test_the_failure_line_names_each_failed_rank_and_what_failed() -> None:
    from rlzoo.core.distributed import ranks_failed_message

    one = ranks_failed_message([None, "reward function 'r' returned nan (non-finite)"])
    assert one.startswith("rank 1 of 2 failed: reward function 'r' returned nan (non-finite); every rank stopped")
    assert "the newest one stays resumable" in one
    two = ranks_failed_message(["a", None, "b"])
    assert two.startswith("ranks 0, 2 of 3 failed: rank 0: a; rank 2: b; every rank stopped")
    assert ranks_failed_message(["same", "same"]).startswith("same, on every rank; every rank stopped")
    nobody = ranks_failed_message([None, None], fallback="non-finite value in policy gradient (component 'x')")
    assert nobody.startswith("non-finite value in policy gradient (component 'x') on every rank; every rank stopped")


def test_failure_text_is_the_message_of_an_rlzoo_error_and_type_and_message_of_a_bug() -> None:
    from rlzoo.core.distributed import failure_text
    from rlzoo.core.errors import TrainingError

    assert failure_text(TrainingError("reward function 'r' raised\nmore")) == "reward function 'r' raised"
    assert failure_text(ValueError("bad shape")) == "ValueError: bad shape"
    assert failure_text(KeyError()) == "KeyError"


def test_in_one_process_a_failure_raises_unchanged_and_no_collective_runs() -> None:
    from rlzoo.core.distributed import SINGLE, failing_together
    from rlzoo.core.errors import TrainingError

    with pytest.raises(TrainingError, match="^as it was$"):
        with failing_together(SINGLE):
            raise TrainingError("as it was")
    with failing_together(SINGLE):  # nothing failed: nothing happens (no process group exists here)
        pass


def test_a_gloo_error_from_ddps_backward_is_recognised_as_a_collective_failure(monkeypatch) -> None:
    from rlzoo.core.distributed import check_collective_failure
    from rlzoo.core.errors import TrainingError

    error = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(TrainingError, match="rank 0: a collective failed"):
        check_collective_failure(error)
    check_collective_failure(RuntimeError("shape mismatch"))  # this process's own error: left as it is
