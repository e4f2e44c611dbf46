"""Scoring with a learned reward model (``reward=reward_model``, rlzoo/models/reward_model.py):
known weights give known scores, padding on either side gives the same scores, a reward
model with another tokenizer than the policy reads the decoded text, normalisation and
clipping by hand, and the scorer in a run (plan, explain, metrics, a reward list)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import zoo
from rlzoo.commands.cli import main
from rlzoo.plan.planner import load_config
from rlzoo.core.errors import ConfigError
from rlzoo.models.build import build_char_tokenizer
from rlzoo.models.reward_model import RunningMoments, encode, load_reward_model, score_ids, sequence_scores
from rlzoo.core.tokens import left_pad
from rlzoo.rollout.scoring import Rewards
from zoo import REGISTRY, tiny_reward_model

ALPHABET = "0123456789="


def _scorer(path: Path, **params):
    component = REGISTRY.get("reward", "reward_model")
    bound = component.bind(component.params(path=str(path), **params))
    return bound.build(device=torch.device("cpu"), tokenizer=None)


# ------------------------------------------------------------------ known weights -> known scores


def test_known_weights_give_known_scores(tmp_path: Path) -> None:
    """Attention and MLP outputs zeroed, so the last hidden state is RMSNorm(embedding of the
    last token): with embedding 3·e_t for token t and head weights w_t = t/10 the score of a
    text is 3·w_t / sqrt(9/H + eps), t its last token."""
    model, tokenizer = tiny_reward_model(tmp_path / "rm", ALPHABET, hidden=16)
    H, eps = 16, model.config.rms_norm_eps
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.model.embed_tokens.weight
        emb.zero_()
        emb[torch.arange(len(tokenizer)), torch.arange(len(tokenizer))] = 3.0
        model.score.weight.copy_((torch.arange(H, dtype=torch.float32) / 10)[None])
    model.save_pretrained(str(tmp_path / "rm"))
    scorer = _scorer(tmp_path / "rm")
    prompts, completions = ["321=", "9=", "55="], ["123", "", "5"]
    got = scorer(prompts=prompts, completions=completions)
    last = [tokenizer.convert_tokens_to_ids(text[-1]) for text in ("321=123", "9=", "55=5")]
    want = [3 * (t / 10) / math.sqrt(9 / H + eps) for t in last]
    assert got.dtype == torch.float32 and got.tolist() == pytest.approx(want, rel=1e-5)


def test_scores_equal_the_models_own_forward_and_padding_side_does_not_matter(tmp_path: Path) -> None:
    model, tokenizer = tiny_reward_model(tmp_path / "rm", ALPHABET)
    ids = [tokenizer(t, add_special_tokens=True).input_ids for t in ("12=12", "9876=6789", "3=")]
    with torch.no_grad():
        alone = torch.stack([model(input_ids=torch.tensor([row])).logits[0, 0] for row in ids])  # HF, unpadded
        left_ids, left_mask = left_pad(ids, tokenizer.pad_token_id)
        width = left_ids.shape[1]
        right_ids = torch.full_like(left_ids, tokenizer.pad_token_id)
        right_mask = torch.zeros_like(left_mask)
        for i, row in enumerate(ids):
            right_ids[i, :len(row)], right_mask[i, :len(row)] = torch.tensor(row), 1
        left = sequence_scores(model, left_ids, left_mask)
        right = sequence_scores(model, right_ids, right_mask)
    assert width > len(ids[2])  # the short row really is padded
    torch.testing.assert_close(left, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(right, alone, atol=1e-5, rtol=0)
    assert score_ids(model, ids, tokenizer.pad_token_id, 2, torch.device("cpu")).tolist() == \
        pytest.approx(alone.tolist(), abs=1e-5)  # batches of 2: the same


def test_a_reward_model_with_another_tokenizer_reads_the_decoded_text(tmp_path: Path) -> None:
    """The policy's character tokenizer and the reward model's map the same text to other
    ids (the reward model's alphabet has three more characters that sort first); the scorer
    re-tokenises the text with the reward model's tokenizer."""
    policy_tokenizer = build_char_tokenizer(ALPHABET)
    model, rm_tokenizer = tiny_reward_model(tmp_path / "rm", "!#$" + ALPHABET)
    text = "4312=1234"
    assert policy_tokenizer(text).input_ids != rm_tokenizer(text).input_ids
    scorer = _scorer(tmp_path / "rm")
    got = scorer(prompts=["4312=", "21="], completions=["1234", "12"])
    want = score_ids(model, encode(rm_tokenizer, ["4312=1234", "21=12"], False), rm_tokenizer.pad_token_id, 8,
                     torch.device("cpu"))
    assert got.tolist() == pytest.approx(want.tolist(), abs=1e-6)
    plan = load_config(REGISTRY, [f"reward={{name: reward_model, path: {tmp_path / 'rm'}}}"]).plan
    assert "re-tokenised with its own tokenizer" in plan.models["reward_model"]


def test_chat_messages_use_the_reward_models_template(tmp_path: Path) -> None:
    _, tokenizer = tiny_reward_model(tmp_path / "rm", ALPHABET + "abcdefghijklmnopqrstuvwxyz:|")
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}|{% endfor %}"
    tokenizer.save_pretrained(str(tmp_path / "rm"))
    scorer = _scorer(tmp_path / "rm")
    model, _ = load_reward_model(tmp_path / "rm", "auto", torch.device("cpu"))
    got = scorer(prompts=["21="], completions=["12"])
    want = score_ids(model, [tokenizer("u:21=|a:12|", add_special_tokens=False).input_ids], 0, 1, torch.device("cpu"))
    assert got.tolist() == pytest.approx(want.tolist(), abs=1e-6)
    with pytest.raises(ConfigError, match="chat_template=true but the reward model's tokenizer has no chat template"):
        tiny_reward_model(tmp_path / "plain", ALPHABET)
        _scorer(tmp_path / "plain", chat_template=True)


# ------------------------------------------------------------------ normalisation and clipping


def test_normalisation_by_running_moments_by_hand_and_clipping(tmp_path: Path) -> None:
    """A batch is normalised by the statistics settled before it (none at first: mean 0,
    std 1); settling folds it in; evaluation moves nothing; the state round-trips."""
    tiny_reward_model(tmp_path / "rm", ALPHABET)
    raw = _scorer(tmp_path / "rm")
    scorer = _scorer(tmp_path / "rm", normalize=True, clip=1.5)
    a = (["1=", "2=", "3="], ["1", "2", "3"])
    b = (["45=", "6="], ["45", ""])
    ra, rb = raw(prompts=a[0], completions=a[1]).double(), raw(prompts=b[0], completions=b[1]).double()
    scorer.instance.training = True
    first = scorer(prompts=a[0], completions=a[1])
    torch.testing.assert_close(first.double(), ra.clamp(-1.5, 1.5), atol=1e-5, rtol=0)
    scorer.instance.settle(None)
    second = scorer(prompts=b[0], completions=b[1])
    want = ((rb - ra.mean()) / (ra.std(unbiased=False) + 1e-8)).clamp(-1.5, 1.5)
    torch.testing.assert_close(second.double(), want, atol=1e-5, rtol=0)
    pending = scorer.instance.state_dict()
    assert pending["moments"]["count"] == 3 and pending["moments"]["pending"][0] == 2
    again = _scorer(tmp_path / "rm", normalize=True, clip=1.5)
    again.instance.load_state_dict(pending)  # a checkpoint between scoring and settling resumes it
    for moments in (scorer.instance, again.instance):
        moments.settle(None)
    state = scorer.instance.state_dict()
    assert again.instance.state_dict() == state
    seen = torch.cat([ra, rb])
    assert state["moments"]["count"] == 5 and state["moments"]["pending"] == [0.0, 0.0, 0.0]
    assert state["moments"]["mean"] == pytest.approx(float(seen.mean()), abs=1e-12)
    assert state["moments"]["m2"] == pytest.approx(float(((seen - seen.mean()) ** 2).sum()), abs=1e-12)
    scorer.instance.training = False  # evaluation: the statistics stay
    scorer(prompts=["99="], completions=["99"])
    scorer.instance.settle(None)
    assert scorer.instance.state_dict() == state


def test_running_moments_equal_the_population_statistics() -> None:
    moments = RunningMoments()
    x = torch.randn(37, dtype=torch.float64) * 3 + 1
    for part in x.split([1, 10, 26]):
        moments.update(part)
        moments.settle()
    assert moments.mean == pytest.approx(float(x.mean()), abs=1e-12)
    assert moments.std == pytest.approx(float(x.std(unbiased=False)), abs=1e-12)


def test_settling_over_ranks_gives_every_rank_the_statistics_of_the_union() -> None:
    """Two ranks gather different numbers of batches, then settle with a reduce that sums
    both: each holds the population statistics of every score, as one process would."""
    x = torch.randn(50, dtype=torch.float64) * 2 + 5
    ranks = [RunningMoments(), RunningMoments()]
    for first, second in ((x[:3], x[3:20]), (x[20:21], x[21:50])):
        ranks[0].update(first)
        for part in second.split(6):  # rank 1 scores more, smaller batches
            ranks[1].update(part)
        pending = [list(r.pending) for r in ranks]
        summed = [a + b for a, b in zip(*pending)]
        for r in ranks:
            r.settle(lambda values, summed=summed: summed)
    assert ranks[0].state_dict() == ranks[1].state_dict()
    assert ranks[0].count == 50
    assert ranks[0].mean == pytest.approx(float(x.mean()), abs=1e-12)
    assert ranks[0].std == pytest.approx(float(x.std(unbiased=False)), abs=1e-12)


# ------------------------------------------------------------------ bad input


def test_bad_reward_model_paths_are_refused_before_anything_is_built(tmp_path: Path, capsys) -> None:
    assert main(["config", "reward=reward_model"]) == 2
    assert "reward 'reward_model': set path=DIR" in capsys.readouterr().err
    assert main(["config", f"reward={{name: reward_model, path: {tmp_path}}}"]) == 2
    assert "no config.json" in capsys.readouterr().err
    (tmp_path / "lm").mkdir()
    (tmp_path / "lm" / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    assert main(["config", f"reward={{name: reward_model, path: {tmp_path / 'lm'}}}"]) == 2
    assert "not a ...ForSequenceClassification reward model" in capsys.readouterr().err
    (tmp_path / "lm" / "config.json").write_text('{"architectures": ["Qwen2ForSequenceClassification"], '
                                                '"id2label": {"0": "a", "1": "b"}}')
    assert main(["config", f"reward={{name: reward_model, path: {tmp_path / 'lm'}}}"]) == 2
    assert "has 2 labels; a reward model has one" in capsys.readouterr().err
    assert main(["config", f"reward={{name: reward_model, path: {tmp_path / 'lm'}, batch_size: 0}}"]) == 2
    assert "batch_size must be >= 1" in capsys.readouterr().err


def test_a_tokenizer_that_does_not_fit_the_model_is_refused_before_the_run(tmp_path: Path, capsys) -> None:
    """A 26-token tokenizer beside a 15-token reward model: its ids past 14 have no
    embedding. Refused when the scorer loads, with no run directory left behind."""
    model, _ = tiny_reward_model(tmp_path / "rm", ALPHABET)
    assert model.get_input_embeddings().num_embeddings == 15
    build_char_tokenizer("abcdefghijklmnopqrstuv").save_pretrained(str(tmp_path / "rm"))   # 4 + 22 tokens
    run_dir = tmp_path / "run"
    assert main(["train", *zoo.TINY, "trainer.total_steps=1", f"run_dir={run_dir}",
                 f"reward={{name: reward_model, path: {tmp_path / 'rm'}}}"]) == 2
    err = capsys.readouterr().err
    assert (f"the reward model in '{tmp_path / 'rm'}' (tokenizer in '{tmp_path / 'rm'}') does not fit its "
            "tokenizer: the tokenizer has 26 tokens, the model's input embedding 15 rows (ids 15..25 have no "
            "embedding)") in err
    assert "Traceback" not in err and not run_dir.exists()


def test_missing_tokenizer_files_are_named_not_blamed_on_the_text(tmp_path: Path, capsys) -> None:
    tiny_reward_model(tmp_path / "rm", ALPHABET)
    (tmp_path / "rm" / "tokenizer.json").unlink()                 # the vocabulary, the config kept
    with pytest.raises(ConfigError) as info:
        load_reward_model(tmp_path / "rm", "float32", torch.device("cpu"))
    assert f"the reward model's tokenizer in '{tmp_path / 'rm'}' encodes 'Hello, world! 0123456789' to no " \
           "token: its vocabulary is missing (the directory holds config.json, model.safetensors, " \
           "tokenizer_config.json)" in str(info.value)
    (tmp_path / "rm" / "tokenizer_config.json").unlink()          # no tokenizer at all: refused at plan time
    assert main(["config", f"reward={{name: reward_model, path: {tmp_path / 'rm'}}}"]) == 2
    assert (f"'{tmp_path / 'rm'}' has no tokenizer (neither tokenizer.json nor tokenizer_config.json): save the "
            "tokenizer the reward model was trained with into it") in capsys.readouterr().err


# ------------------------------------------------------------------ in a run


def test_a_run_scores_with_a_reward_model_in_a_reward_list(tmp_path: Path) -> None:
    tiny_reward_model(tmp_path / "rm", ALPHABET)
    reward = f"reward=[sorted_digits, {{name: reward_model, path: {tmp_path / 'rm'}, weight: 0.5, normalize: true}}]"
    out = subprocess.run([sys.executable, "-m", "rlzoo", "explain", reward], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "reward_model: frozen reward model" in out.stdout
    run_dir = tmp_path / "run"
    code = main(["train", *zoo.TINY, "eval.size=4", "eval.n=1", "trainer.total_steps=2", "checkpoint.every=1",
                 f"run_dir={run_dir}", reward])
    assert code == 0
    events = EventAccumulator(str(run_dir)).Reload()
    tags = set(events.Tags()["scalars"])
    assert {"timing/reward_model_s", "reward/reward_model", "reward/sorted_digits"} <= tags
    assert not {"reward/proxy", "reward/gold"} & tags  # no weight-0 function: nothing is a gold score
    assert "reward_model: frozen reward model" in (run_dir / "plan.txt").read_text()
    state = torch.load(run_dir / "checkpoints" / "step_000002" / "trainer_state.pt", weights_only=True)
    moments = state["ranks"][0]["sampler"]["rewards"]["1:reward_model"]["moments"]
    assert moments["count"] == 2 * 16  # two training batches of 16; evaluation is not counted


def test_a_weight_zero_reward_is_logged_as_gold_beside_the_proxy() -> None:
    from rlzoo.core.batch import RolloutBatch
    from rlzoo.core.distributed import SINGLE
    from rlzoo.run.tracking import batch_metrics

    per_reward = torch.tensor([[1.0, 0.25], [3.0, 0.75]])
    scores = per_reward @ torch.tensor([1.0, 0.0])
    mask = torch.ones(2, 3)
    batch = RolloutBatch(prompt_ids=torch.ones(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1),
                         response_ids=torch.ones(2, 3, dtype=torch.long), response_mask=mask,
                         group_ids=torch.tensor([0, 0]), scores=scores, truncated=torch.zeros(2, dtype=torch.bool),
                         prompts=["a", "b"], completions=["x", "y"], references=["x", "y"], reward_scores=per_reward)
    batch.rewards = scores.clone()
    metrics = batch_metrics(batch, ["reward_model", "sorted_digits"], SINGLE, [1.0, 0.0])
    assert metrics["reward/proxy"] == metrics["reward/mean"] == 2.0
    assert metrics["reward/gold"] == 0.5 == metrics["reward/sorted_digits"]
    both = batch_metrics(batch, ["reward_model", "sorted_digits"], SINGLE, [1.0, 0.5])
    assert "reward/gold" not in both and "reward/proxy" not in both


def test_the_remote_judge_of_plugins_md_registers_plans_and_scores(plugin_module, capsys) -> None:
    """The scorer-class example of docs/plugins.md, verbatim, against a local HTTP judge
    that scores a completion by its length."""
    import json
    import re
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from rlzoo.contract.loading import build_registry, make_plugin_manager

    text = (Path(__file__).parents[1] / "docs" / "plugins.md").read_text()
    source = re.search(r"a judge behind an HTTP\s+endpoint looks like this:\s+```python\n(.*?)```", text, re.S).group(1)
    name = plugin_module(source)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            reply = json.dumps({"score": float(len(body["completion"]))}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        registry = build_registry(make_plugin_manager(modules=[name]))
        url = f"http://127.0.0.1:{server.server_port}/score"
        resolved = load_config(registry, [f"plugins=[{name}]", f"reward={{name: judge, url: '{url}'}}"])
        assert resolved.plan.models["judge"] == f"remote judge at {url} (one request per completion)"
        with pytest.raises(ConfigError, match="url must be an http"):
            load_config(registry, [f"plugins=[{name}]", "reward={name: judge, url: ftp://x}"])
        built = resolved.reward_functions(device=torch.device("cpu"), tokenizer=None)
        scores, _ = Rewards(built).score(["1="], ["abc"], ["1"], [{}], training=True)
        assert scores.tolist() == [3.0]
    finally:
        server.shutdown()


def test_a_resumed_run_continues_the_running_statistics_exactly(tmp_path: Path) -> None:
    tiny_reward_model(tmp_path / "rm", ALPHABET)
    reward = f"reward={{name: reward_model, path: {tmp_path / 'rm'}, normalize: true, clip: 2.0}}"
    common = [*zoo.TINY, "eval.size=0", "checkpoint.every=1", reward]
    assert main(["train", *common, "trainer.total_steps=3", f"run_dir={tmp_path / 'straight'}"]) == 0
    assert main(["train", *common, "trainer.total_steps=2", f"run_dir={tmp_path / 'split'}"]) == 0
    assert main(["train", f"resume={tmp_path / 'split'}", "trainer.total_steps=3"]) == 0

    def state(run: str) -> dict:
        saved = torch.load(tmp_path / run / "checkpoints" / "step_000003" / "trainer_state.pt", weights_only=True)
        return saved["ranks"][0]["sampler"]["rewards"]["0:reward_model"]["moments"]

    assert state("straight")["count"] == 3 * 16
    assert state("split") == state("straight")  # float64 statistics, bit for bit


def test_an_rlzoo_critic_directory_scores_with_its_value_head(tmp_path: Path, capsys) -> None:
    """A causal LM backbone with a value head (rlzoo's critic, as a PPO checkpoint holds it:
    ``critic/`` without a tokenizer, the policy's in ``policy/`` beside it): the score is the
    value at the last valid token."""
    from omegaconf import OmegaConf

    from rlzoo.models.build import ValueModel, build_tiny_model

    torch.manual_seed(1)
    tokenizer = build_char_tokenizer(ALPHABET)
    shape = OmegaConf.create({"arch": "llama", "hidden_size": 16, "intermediate_size": 32, "num_layers": 1,
                              "num_heads": 2, "num_kv_heads": 1})
    critic = ValueModel.from_policy_config(build_tiny_model(shape, tokenizer, 64).config)
    torch.nn.init.normal_(critic.value_head.weight)
    critic.save_pretrained(tmp_path / "critic")
    assert main(["config", f"reward={{name: reward_model, path: {tmp_path / 'critic'}}}"]) == 2
    assert (f"'{tmp_path / 'critic'}' is an rlzoo critic without a tokenizer (neither tokenizer.json nor "
            f"tokenizer_config.json), and '{tmp_path / 'policy'}', where a checkpoint keeps the policy's, has none "
            "either") in capsys.readouterr().err
    tokenizer.save_pretrained(str(tmp_path / "policy"))          # the checkpoint's layout
    ids = tokenizer("31=13").input_ids
    with torch.no_grad():
        want = critic(torch.tensor([ids]), torch.ones(1, len(ids)), torch.arange(len(ids))[None])[0, -1]
    got = _scorer(tmp_path / "critic")(prompts=["31="], completions=["13"])
    assert got.tolist() == pytest.approx([float(want)], abs=1e-5)
