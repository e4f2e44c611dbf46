"""The load-time check of rlzoo's fast paths against a model's own forward.

rlzoo computes log-probs its own way: the rollout samples in a KV-cache decode loop with a
preallocated cache (:func:`rlzoo.models.decode.generate`), the update projects the decoder's
hidden states through a chunked head (:func:`rlzoo.models.logprobs.response_forward`) that applies
the model's post-head transform itself (:mod:`rlzoo.models.head`). :func:`check_model` runs a probe
batch (left-padded prompts of different lengths, groups of completions, a shorter
response, and the same again with the output embedding scaled so logits are large)
through both and compares every sampled token's log-prob with that of the model's own
``forward(input_ids).logits`` on the sequence alone, unpadded, in eval mode, in float32.
The training forward is measured in training mode, the mode the update runs it in: a model
that computes other log-probs there (a dropout or other random layer
:func:`rlzoo.models.dropout.disable_dropout` could not switch off) is refused, naming it.

A path that differs by more than :data:`TOLERANCE` is left for a slower, correct one
(training: the model's own logits; rollout: the model's own cache, then no cache), which
is checked in turn, and :class:`CheckResult` says why in one warning. A model that no path
computes correctly is refused.

The training-side passes pack their sequences without padding (:mod:`rlzoo.models.packing`)
where that is exact: the check runs the training forward on a probe packed so that short
sequences follow each other in one row (:data:`PACKED_PROBE`) and compares it with each
sequence alone, like the padded one. A model with a layer that mixes tokens outside
attention (a convolution or a recurrent state, :func:`rlzoo.models.packing.token_mixers`) is
not packed whatever the probe shows (a random model's convolution moves the probe's
log-probs by less than the tolerance; a trained one's does not), nor is one whose packed
forward differs (a mask that ignores the position ids); the warning says so, and
``trainer.padding_free=true`` refuses such a model. The check draws from its own seeded generator and restores
torch's global RNG and the weights exactly, so a run's numbers are those it has without it.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace

import torch
from transformers import PreTrainedModel

from rlzoo.models.dropout import active_rates, adapter_dropout_off, is_random_rate
from rlzoo.core.errors import ConfigError, say
from rlzoo.models.head import CACHE_MODES, FastPaths, default_paths, set_fast_paths
from rlzoo.models.logprobs import response_forward
from rlzoo.models.decode import generate
from rlzoo.models.packing import PADDED, ROWS, SEGMENTS, pack_min_share, passes_boundaries, token_mixers
from rlzoo.core.tokens import left_pad

TOLERANCE = 1e-4
"""Largest accepted difference between a fast path's log-prob and the model's own forward's
(float32): ``|Δ| / max(1, |log-prob|)``, i.e. nats for a log-prob above -1 nat and relative
below (a token of log-prob -30 under a 30-layer model differs by about 5e-4 nats between a
left-padded batch and the sequence alone, through the model's own logits too)."""

LARGE_LOGIT = 60.0
"""The probe is repeated with the output embedding scaled so the largest raw logit is about
this (a small random model's logits are too small for a softcap at 30 to show); see
:func:`_measure`."""

PROBE_PROMPTS = (7, 3)
"""Token lengths of the probe's prompts (left-padded to the longest)."""

PROBE_SAMPLES, PROBE_TOKENS, PROBE_SEED = 2, 6, 1234

PACKED_PROBE = ((9, 6), (1, 3), (2, 2), (1, 3))
"""``(prompt, response)`` token lengths of the packed probe: packed into two rows, the first
sequence alone and the three short ones one after another, two with a one-token prompt, so
a sequence's first response tokens are predicted at its first positions, right after the
previous sequence's last token."""


@dataclass
class CheckResult:
    """What :func:`check_model` measured and decided.

    :ivar paths: the fast paths the model runs (recorded on it).
    :ivar rollout_error: max difference of the rollout's decode loop (:data:`TOLERANCE`).
    :ivar training_error: max difference of the training forward (:data:`TOLERANCE`), in
        training mode when ``training_mode``.
    :ivar warning: one line saying which fast path was left and why, or ``None``.
    :ivar training_mode: the training forward was measured in training mode (a trained
        model), not eval mode (a frozen one).
    :ivar packed_error: max difference of the packed training forward, or ``None`` where it
        was not measured (``trainer.padding_free=false``, or a layer that cannot be packed).
    """

    paths: FastPaths
    rollout_error: float
    training_error: float
    warning: str | None = None
    training_mode: bool = True
    packed_error: float | None = None

    def summary(self) -> str:
        """One line for the run's output."""
        transform = self.paths.transform.describe() if self.paths.transform is not None else "none"
        head = ("the model's own logits" if self.paths.model_logits
                else f"chunked head (post-head transform: {transform})")
        mode = "training" if self.training_mode else "eval"
        packed = (f"packed without padding in {self.paths.packing} (packed {self.packed_error:.2g})"
                  if self.packed_error is not None and self.paths.packing != PADDED else "padded")
        return (f"model check: log-probs vs the model's own forward, max |diff|/max(1, |logp|) rollout "
                f"{self.rollout_error:.2g}, training {self.training_error:.2g} in {mode} mode (tolerance "
                f"{TOLERANCE:g}); training uses {head}, rollout cache {self.paths.cache}; training-side passes "
                f"{packed}")


def report(name: str, check: CheckResult, summary: bool = True) -> None:
    """Print ``check`` as a command does: its warning, if any, on stderr (``rlzoo: warning:
    NAME: ...``) and, when ``summary``, its :meth:`CheckResult.summary` on stdout."""
    if check.warning:
        say(f"rlzoo: warning: {name}: {check.warning}")
    if summary:
        print(f"rlzoo: {name} {check.summary()}", flush=True)


def _probe(vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The probe batch, drawn from its own generator (the global RNG is not touched):
    left-padded prompts ``(ids, mask)`` ``(len(PROBE_PROMPTS), P)`` and, for the training
    path, responses of any tokens ``(ids, mask)`` ``(len(PROBE_PROMPTS) · PROBE_SAMPLES,
    PROBE_TOKENS)`` (not only likely ones: at large logits a sampled token's log-prob is
    about 0 under almost any transform), the first two tokens shorter (right padding)."""
    generator = torch.Generator().manual_seed(PROBE_SEED)
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in PROBE_PROMPTS]
    ids, mask = left_pad(prompts, pad_id=0)
    response_ids = torch.randint(0, vocab, (len(prompts) * PROBE_SAMPLES, PROBE_TOKENS), generator=generator)
    response_mask = torch.ones(response_ids.shape)
    response_mask[0, -2:] = 0
    response_ids[0, -2:] = 0
    return ids.to(device), mask.to(device), response_ids.to(device), response_mask.to(device)


def _packed_probe(vocab: int, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The packed probe (:data:`PACKED_PROBE`): left-padded prompts ``(ids, mask)`` and
    right-padded responses ``(ids, mask)``, any tokens, from its own generator."""
    generator = torch.Generator().manual_seed(PROBE_SEED + 1)
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n, _ in PACKED_PROBE]
    ids, mask = left_pad(prompts, pad_id=0)
    width = max(n for _, n in PACKED_PROBE)
    response_ids = torch.randint(0, vocab, (len(PACKED_PROBE), width), generator=generator)
    response_mask = (torch.arange(width)[None, :] < torch.tensor([n for _, n in PACKED_PROBE])[:, None]).float()
    response_ids = response_ids * response_mask.long()
    return ids.to(device), mask.to(device), response_ids.to(device), response_mask.to(device)


def reference_logprobs(model: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                       response_ids: torch.Tensor, response_mask: torch.Tensor, temperature: float = 1.0
                       ) -> torch.Tensor:
    """Each response token's log-prob ``(B, T)`` under ``log_softmax(model(seq).logits /
    temperature)`` of its sequence alone (prompt without padding + valid response tokens),
    float32; 0 where ``response_mask`` is 0. The ground truth the fast paths are held to.

    :param prompt_ids: ``(B, P)`` left-padded; ``prompt_mask`` ``(B, P)``.
    :param response_ids: ``(B, T)`` right-padded; ``response_mask`` ``(B, T)``.
    """
    out = torch.zeros(response_ids.shape, dtype=torch.float32, device=response_ids.device)
    with torch.no_grad():
        for row in range(prompt_ids.shape[0]):
            prompt = prompt_ids[row][prompt_mask[row] > 0]
            length = int((response_mask[row] > 0).sum())
            sequence = torch.cat([prompt, response_ids[row, :length]])[None]
            logits = model(input_ids=sequence).logits[0].float() / temperature
            log_probs = torch.log_softmax(logits[len(prompt) - 1: len(prompt) - 1 + length], dim=-1)
            out[row, :length] = log_probs.gather(-1, response_ids[row, :length, None]).squeeze(-1)
    return out


ROLLOUT, TRAINING, TRAINING_EVAL_MODE = "rollout", "training", "training in eval mode"
"""What :func:`_error` measures: the rollout's decode loop (eval mode), the training forward
in training mode (as the update runs it), or the training forward in eval mode (as the
old-log-prob and reference passes run it)."""


def _error(model: PreTrainedModel, paths: FastPaths, device: torch.device, which: str, packed: bool = False
           ) -> float:
    """Max ``|Δ log-prob| / max(1, |log-prob|)`` (:data:`TOLERANCE`) of one path under
    ``paths`` on the probe batch: the rollout's (:data:`ROLLOUT`) log-probs of the tokens it
    sampled, or the training forward's (:data:`TRAINING`, :data:`TRAINING_EVAL_MODE`) of any
    tokens (``packed``: on the packed probe, :data:`PACKED_PROBE`); the truth is the model's
    own forward in eval mode. ``model`` is in eval mode before and after; what a random layer
    draws comes from a forked RNG."""
    set_fast_paths(model, paths)
    vocab = model.get_input_embeddings().num_embeddings
    if packed:
        prompt_ids, prompt_mask, response_ids, response_mask = _packed_probe(vocab, device)
    else:
        ids, mask, response_ids, response_mask = _probe(vocab, device)
        prompt_ids, prompt_mask = ids.repeat_interleave(PROBE_SAMPLES, 0), mask.repeat_interleave(PROBE_SAMPLES, 0)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(PROBE_SEED)
        if which == ROLLOUT:
            gen = generate(model, ids, mask, max_new_tokens=PROBE_TOKENS, eos_id=-1, pad_id=0,
                           num_samples=PROBE_SAMPLES)
            fast, response_ids, response_mask = gen.logp, gen.response_ids, gen.response_mask
        else:
            model.train(which == TRAINING)
            try:
                with torch.no_grad():
                    fast = response_forward(model, prompt_ids, prompt_mask, response_ids, response_mask).logp
            finally:
                model.eval()
    truth = reference_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask)
    return float(((fast - truth).abs() / truth.abs().clamp(min=1.0)).max())


def _random_config_fields(model: PreTrainedModel) -> list[str]:
    """``key=value`` of the model's (text) config fields > 0 named like a dropout or noise
    (:func:`rlzoo.models.dropout.is_random_rate`): where a random layer may read its rate."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return [f"{key}={value:g}" for key, value in sorted(vars(config).items())
            if isinstance(value, float) and value > 0 and is_random_rate(key)]


def _refuse_random_training_mode(model: PreTrainedModel, paths: FastPaths, device: torch.device, name: str,
                                 found: str) -> None:
    """After the training forward failed in training mode (``found``): when it passes in eval
    mode, the model is random in training mode, where the update runs it.

    :raises ConfigError: that, naming the config fields that may hold the rate.
    """
    error, eval_found = _measure(model, paths, device, TRAINING_EVAL_MODE)
    if error > TOLERANCE:
        return
    head = (f"{name}: the update runs the model in training mode, where its log-probs differ from eval mode's "
            f"({found}; eval mode {eval_found}): ")
    if rates := active_rates(model):
        raise ConfigError(head + f"its dropout is on ({len(rates)} rates > 0, e.g. {', '.join(rates[:3])}); "
                          "switch it off with rlzoo.models.dropout.disable_dropout(model) before the check, as rlzoo's "
                          "commands do")
    fields = _random_config_fields(model)
    where = f"its config has {', '.join(fields)}" if fields else "no field of its config is named like one"
    raise ConfigError(head + "a random layer is on that rlzoo cannot switch off (it sets every torch.nn.Dropout "
                      "and every layer's dropout rate to 0; this one may read its rate from the config at run "
                      f"time: {where}); set it to 0 in the model's config.json")


def _measure(model: PreTrainedModel, paths: FastPaths, device: torch.device, which: str, packed: bool = False
             ) -> tuple[float, str]:
    """:func:`_error` at the model's own weights and, the larger, with the output
    embedding alone scaled by ``factor`` so the largest raw logit is about
    :data:`LARGE_LOGIT` (a copy of the head's weight put in its place, the tie to the input
    embedding left alone, so the hidden states are the model's own; restored afterwards),
    that difference divided by ``factor`` (float32 noise of the hidden states grows with
    it; a transform's difference is of order one nat there); ``inf`` and the exception's
    first line when the path raises. ``packed``: :func:`_error` on the packed probe."""
    head = model.get_output_embeddings()
    original = head.weight
    try:
        error = _error(model, paths, device, which, packed)
        ids, mask, _, _ = _probe(model.get_input_embeddings().num_embeddings, device)
        with torch.no_grad():
            hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
            largest = float(torch.nn.functional.linear(hidden.float(), original.float()).abs().max())
        if 0 < largest < LARGE_LOGIT:
            factor = LARGE_LOGIT / largest
            head.weight = torch.nn.Parameter(original.detach() * factor, requires_grad=False)
            error = max(error, _error(model, paths, device, which, packed) / factor)
    except Exception as exc:  # noqa: BLE001 - a path that cannot run on this model is left like a wrong one
        lines = str(exc).strip().splitlines()
        return math.inf, f"{type(exc).__name__}: {lines[0] if lines else ''}"
    finally:
        head.weight = original
    return error, f"max |diff|/max(1, |logp|) {error:.2g}"


def check_model(model: PreTrainedModel, device: torch.device, trained: bool = True,
                padding_free: bool | None = None) -> CheckResult:
    """Check ``model``'s fast paths against its own forward (module docstring), record
    the paths it runs on it (:func:`rlzoo.models.head.set_fast_paths`) and return what was found.

    A model not in float32 is checked on a float32 copy (the paths are the same; the
    tolerance is for float32 arithmetic). LoRA adapters' own dropout (``model.lora.dropout``,
    kept by choice) is off while it measures.

    :param trained: the update runs the model in training mode (the policy), so its
        training forward is measured there; ``False`` for a frozen model (a teacher), run
        in eval mode only.
    :param padding_free: ``trainer.padding_free``: ``None`` packs where the check finds it
        exact, ``True`` requires it, ``False`` never packs (and does not measure it).
    :raises ConfigError: no path gives the model's own log-probs (e.g. a model whose
        forward does not honour left padding), or a trained model is random in training
        mode, with the differences found; ``padding_free`` is ``True`` and packing is not
        exact on the model (the architecture and the reason named).
    """
    probe = model if next(model.parameters()).dtype == torch.float32 else copy.deepcopy(model).float()
    was_training = probe.training
    probe.eval()
    reasons: list[str] = []
    try:
        with adapter_dropout_off(probe):
            which = TRAINING if trained else TRAINING_EVAL_MODE
            paths, training, rollout = _check(probe, device, which, type(model).__name__, reasons)
            packed = None
            if padding_free is not False:
                paths, packed = _check_packing(probe, paths, device, which, type(model).__name__, reasons,
                                               required=bool(padding_free))
    finally:
        probe.train(was_training)
    set_fast_paths(model, paths)
    warning = f"{type(model).__name__}: {'; '.join(reasons)}" if reasons else None
    return CheckResult(paths=paths, rollout_error=rollout, training_error=training, warning=warning,
                       training_mode=trained, packed_error=packed)


def _check_packing(probe: PreTrainedModel, paths: FastPaths, device: torch.device, which: str, name: str,
                   reasons: list[str], required: bool) -> tuple[FastPaths, float | None]:
    """How the training-side passes of ``probe`` may pack their sequences (module docstring):
    ``(paths, packed error)``, ``paths`` with the layout set where packing is exact: one row
    with attention per stretch (:data:`rlzoo.models.packing.SEGMENTS`) for a model on
    ``sdpa`` whose layers pass the sequence boundaries down to their attention, else a few
    rows (:data:`rlzoo.models.packing.ROWS`); why not is appended to ``reasons``.

    :raises ConfigError: ``required`` (``trainer.padding_free=true``) and packing is not exact.
    """
    mixers = token_mixers(probe)
    error = None
    if mixers:
        why = (f"its {', '.join(mixers)} mix tokens outside attention, across the boundary between packed "
               "sequences")
    else:
        layout = SEGMENTS if passes_boundaries(probe) else ROWS
        error, found = _measure(probe, replace(paths, packing=layout), device, which, packed=True)
        if error <= TOLERANCE:
            return replace(paths, packing=layout, pack_min_share=pack_min_share(probe)), error
        why = (f"packed sequences differ from each sequence alone ({found}; its attention mask does not follow "
               "the position ids?)")
    if required:
        raise ConfigError(f"trainer.padding_free=true, but packing sequences is not exact on {name}: {why}; set "
                          "trainer.padding_free=null (pack where exact) or false")
    reasons.append(f"the training-side passes are not packed without padding ({why}), so they compute on padding "
                   "(trainer.padding_free=false skips this check)")
    return paths, error


def _check(probe: PreTrainedModel, device: torch.device, which: str, name: str,
           reasons: list[str]) -> tuple[FastPaths, float, float]:
    """:func:`check_model`'s decisions on ``probe`` (in eval mode): ``(paths, training
    error, rollout error)``; each fast path left is appended to ``reasons`` in words."""
    paths = default_paths(probe)
    training, found = _measure(probe, paths, device, which)
    if training > TOLERANCE:
        if which == TRAINING:
            _refuse_random_training_mode(probe, paths, device, name, found)
        reasons.append(f"the chunked LM head differs from the model's own logits ({found}; a transform of "
                       "the logits after the head that rlzoo does not know?), so the update reads the "
                       "model's own logits (slower, more memory)")
        paths = paths.with_fallback(reasons[-1], model_logits=True)
        training, found = _measure(probe, paths, device, which)
        if training > TOLERANCE:
            if which == TRAINING:
                _refuse_random_training_mode(probe, paths, device, name, found)
            raise ConfigError(f"{name}: rlzoo cannot reproduce the model's own log-probs on a left-padded "
                              f"batch even through its own logits ({found}, tolerance {TOLERANCE:g}); this "
                              "model cannot be trained correctly here")
    rollout, found = _measure(probe, paths, device, ROLLOUT)
    for cache in CACHE_MODES[1:]:
        if rollout <= TOLERANCE:
            break
        reasons.append(f"the rollout with the {paths.cache} KV cache differs from the model's own forward "
                       f"({found}), so it runs with cache={cache} (slower)")
        paths = paths.with_fallback(reasons[-1], cache=cache)
        rollout, found = _measure(probe, paths, device, ROLLOUT)
    if rollout > TOLERANCE:
        raise ConfigError(f"{name}: rlzoo's rollout cannot reproduce the model's own log-probs on a "
                          f"left-padded batch even without a KV cache ({found}, tolerance {TOLERANCE:g}); "
                          "this model cannot be trained correctly here")
    return paths, training, rollout
