"""Multi-turn episodes: token ids equal the chat template's, masks keep environment tokens
out of every loss, bounds, the plan's refusals, and a short training run (issue 22)."""

from __future__ import annotations

import random
import re
import string
from pathlib import Path

import pytest
import torch

from rlzoo.commands.cli import main
from rlzoo.plan.planner import load_config
from rlzoo.plan.run_input import engine_input, load_run
from rlzoo.agents.environment import Environment, StepResult
from rlzoo.agents.episodes import EpisodeFormat, EpisodeLimits, episode_tensors, play, registered_tools
from rlzoo.core.errors import ConfigError
from rlzoo.models.build import build_char_tokenizer
from rlzoo.contract.loading import build_registry, make_plugin_manager, module_plugin
from rlzoo.tasks.prompts import PromptFormat
from rlzoo.core.batch import Generation
from rlzoo.tasks.task import Example
from rlzoo.agents.tool_calls import tool_call_style
from rlzoo.run.trainer import Trainer
from rlzoo_plugins.environments import CalculatorEnv, CalculatorEnvParams
from zoo import TINY


class Feedback(Environment):
    """Answers every turn with the observation ``=;`` (a user turn) and ends after the third."""

    def __init__(self) -> None:
        self.turns = 0

    def step(self, completion: str) -> StepResult:
        self.turns += 1
        return StepResult(observations=[{"role": "user", "content": "=;"}], reward=0.5, done=self.turns == 3)


def _register(register) -> None:
    register("feedback_test", Feedback, description="test: feedback after every turn")


PM = make_plugin_manager()
PM.register(module_plugin(rlzoo_register_environments=_register), name="episodes_test")
REGISTRY = build_registry(PM)
ENV = ["env=calculator", "task=multiply", "rollout.max_new_tokens=24", "rollout.max_turn_tokens=8",
       "rollout.max_turns=3"]
TINY_ENV = [o for o in TINY if not o.startswith(("task.", "rollout.max_new_tokens"))] + ENV

# A Qwen2.5/Hermes-style template: tool schemas in a system turn, tool results grouped in a
# user turn of <tool_response> blocks, <|im_end|> ends every turn.
QWEN_STYLE = (
    "{% if tools %}<|im_start|>system\nYou may call functions.\n<tools>\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n"
    "Call one as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chat_tokenizer():
    """A character tokenizer with ChatML specials and :data:`QWEN_STYLE` (no download)."""
    tokenizer = build_char_tokenizer(string.printable)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = QWEN_STYLE
    return tokenizer


class ScriptedBackend:
    """A rollout backend that "samples" scripted turns (ids of the text + EOS), log-prob -1 each."""

    def __init__(self, tokenizer, turns: list[str]) -> None:
        self.tokenizer, self.turns, self.calls = tokenizer, list(turns), []

    def generate(self, prompt_ids, *, num_samples, max_new_tokens, temperature, top_p, greedy=False):
        self.calls.append((len(prompt_ids), num_samples, max_new_tokens))
        text = self.turns.pop(0)
        ids = self.tokenizer(text, add_special_tokens=False).input_ids + [self.tokenizer.eos_token_id]
        rows = len(prompt_ids) * num_samples
        tokens = torch.tensor([ids] * rows)
        return Generation(response_ids=tokens, response_mask=torch.ones(tokens.shape),
                          truncated=torch.zeros(rows, dtype=torch.bool), logp=-torch.ones(tokens.shape))


def test_episode_ids_equal_the_chat_template_of_the_final_conversation() -> None:
    tokenizer = chat_tokenizer()
    fmt = EpisodeFormat(tokenizer, PromptFormat())
    assert fmt.chat
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "37*48"}}</tool_call>'
    backend = ScriptedBackend(tokenizer, [call, "1776"])
    assert tool_call_style(tokenizer) == "hermes"
    env = lambda: CalculatorEnv(CalculatorEnvParams(), registered_tools(REGISTRY), "hermes")  # noqa: E731
    [episode] = play(backend, fmt, env, [Example("37*48=", "1776")], 1, EpisodeLimits(4, 200, 1000),
                     temperature=1.0, top_p=1.0)
    assert episode.done and not episode.truncated and not episode.drift
    assert (episode.turns, episode.tool_calls, episode.tool_errors, episode.answer) == (2, 1, 0, "1776")
    assert [m["role"] for m in episode.messages] == ["user", "assistant", "tool", "assistant"]
    assert episode.messages[2]["content"] == "1776"
    text = tokenizer.apply_chat_template(episode.messages, tools=[t.schema for t in env().tools], tokenize=False)
    expected = tokenizer(text, add_special_tokens=False).input_ids
    ids = episode.prompt_ids + episode.tokens
    assert expected[:len(ids)] == ids
    assert tokenizer.decode(expected[len(ids):]) == "\n"  # the template's newline after the last <|im_end|>
    # the policy's tokens are exactly the two sampled turns, the rest is the template's tool turn
    policy = [t for t, p in zip(episode.tokens, episode.policy) if p]
    sampled = [tokenizer(t, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for t in (call, "1776")]
    assert policy == sampled[0] + sampled[1]
    environment = tokenizer.decode([t for t, p in zip(episode.tokens, episode.policy) if not p])
    assert environment.startswith("\n<|im_start|>user") and environment.endswith("<|im_start|>assistant\n")
    assert "<tool_response>\n1776\n</tool_response><|im_end|>" in environment
    assert episode.logp == [-1.0 if p else 0.0 for p in episode.policy]


def test_retokenisation_drift_ends_the_episode_and_is_counted(capsys) -> None:
    tokenizer = chat_tokenizer()
    fmt = EpisodeFormat(tokenizer, PromptFormat())

    class Rewriting(Environment):
        """Rewrites the policy's last message: the template no longer extends the sampled ids."""

        def step(self, completion: str) -> StepResult:
            return StepResult(observations=[{"role": "user", "content": "again"}])

    backend = ScriptedBackend(tokenizer, ["x"] * 4)
    [episode] = play(backend, fmt, Rewriting, [Example("q", "a")], 1, EpisodeLimits(4, 20, 100),
                     temperature=1.0, top_p=1.0)
    assert not episode.drift and episode.turns == 4 and episode.truncated  # stopped by max_turns
    backend = ScriptedBackend(tokenizer, ["x"])
    fmt.tokenizer.chat_template = QWEN_STYLE.replace("{{ m.content }}<|im_end|>", "{{ m.content | upper }}<|im_end|>")
    [episode] = play(backend, fmt, Rewriting, [Example("q", "a")], 1, EpisodeLimits(4, 20, 100),
                     temperature=1.0, top_p=1.0)
    assert episode.drift and episode.truncated and episode.done and episode.turns == 1
    assert "retokenisation drift" in capsys.readouterr().err


def test_plain_episode_masks_bounds_and_group_prefill() -> None:
    tokenizer = build_char_tokenizer("0123456789+-*=;")
    fmt = EpisodeFormat(tokenizer, PromptFormat())
    assert not fmt.chat
    backend = ScriptedBackend(tokenizer, ["37*48", "1776"])
    env = lambda: CalculatorEnv(CalculatorEnvParams(), registered_tools(REGISTRY), "plain")  # noqa: E731
    episodes = play(backend, fmt, env, [Example("37*48=", "1776")], 2, EpisodeLimits(3, 8, 24),
                    temperature=1.0, top_p=1.0)
    assert backend.calls == [(1, 2, 8), (2, 1, 8)]  # turn 1: one prompt, prefilled once for its group
    e = episodes[0]
    assert tokenizer.decode(e.tokens) == "37*48</s>=1776;1776</s>"
    assert e.policy == [1] * 6 + [0] * 6 + [1] * 5
    tensors = episode_tensors(episodes, tokenizer.pad_token_id)
    assert torch.equal(tensors["loss_mask"][0], torch.tensor(e.policy, dtype=torch.float32))
    assert tensors["response_mask"][0].sum() == len(e.tokens)
    assert tensors["episode_counts"][0].tolist() == [2, 1, 0, 0, 0]
    # bounds: one turn allowed -> truncated after the call; an observation over the episode budget -> truncated
    for limits in (EpisodeLimits(1, 8, 24), EpisodeLimits(3, 8, 12)):
        [short] = play(ScriptedBackend(tokenizer, ["37*48"]), fmt, env, [Example("37*48=", "1776")], 1, limits,
                       temperature=1.0, top_p=1.0)
        assert short.truncated and short.turns == 1 and short.policy == [1] * 6


@pytest.mark.parametrize("overrides, fragment", [
    (["advantage=gae"], "critic"),
    (["algo=remax"], "greedy baseline"),
    (["kl.coef=0.1", "kl.apply=reward"], "kl.apply=reward"),
    (["rollout.max_turn_tokens=40"], "exceeds rollout.max_new_tokens"),
    (["distributed.strategy=fsdp", "launcher.nproc=2"], "cannot run with distributed.strategy=fsdp on 2 processes"),
])
def test_plan_refuses_what_cannot_work_over_episodes(overrides: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_config(REGISTRY, [*ENV, *overrides])


@pytest.mark.parametrize("env, fragment", [
    ("env={name: tools, tools: [nosuch_tool]}", "env 'tools': unknown tool(s) nosuch_tool; registered: calculator"),
    ("env={name: tools, tools: []}", "invalid parameter for env 'tools': tools is empty: name the registered tools"),
    ("env=tools", "tools is empty"),
])
def test_a_tools_env_without_usable_tools_is_refused_before_the_run_directory(capsys, tmp_path: Path, env: str,
                                                                             fragment: str) -> None:
    """An unknown tool was refused only when the first episode built the environment, after
    the run directory was made; ``tools: []`` was accepted (``reward=[]`` is refused)."""
    run = tmp_path / "run"
    assert main(["train", *TINY_ENV, env, "trainer.total_steps=1", f"run_dir={run}"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("rlzoo: error:")]
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in err, err
    assert not run.exists()


def test_plan_names_the_masks_of_an_episode_run() -> None:
    plan = load_config(REGISTRY, ENV).plan
    assert plan.episodes is not None and plan.sampled_mask == "loss_mask"
    assert {term.mask for term in plan.terms.values()} == {"loss_mask"}
    assert "loss_mask = the policy's sampled tokens only" in plan.render()
    assert load_config(REGISTRY, []).plan.episodes is None


def _learn(tmp_path: Path, name: str, perturb: str | None) -> dict[str, torch.Tensor]:
    """The weights after one update on the first episode batch, with the rollout log-probs of
    the environment (or policy) tokens shifted by 3 nats; old log-probs are the rollout's and two
    mini-batches make the ratio and its clip act."""
    resolved = load_config(REGISTRY, [*TINY_ENV, "env=feedback_test", f"run_dir={tmp_path / name}", "eval.size=0",
                                      "trainer.old_logp=rollout", "trainer.num_mini_batches=2", "kl.coef=0.1",
                                      "trainer.entropy_coef=0.01", "rollout_correction=opmask"])
    trainer = Trainer(engine_input(resolved), PM)
    try:
        torch.manual_seed(0)
        batch = trainer.sampler.sample(trainer.ctx.prompts)
        env_tokens = (batch.response_mask - batch.loss_mask).bool()
        assert env_tokens.sum() >= len(batch)  # every episode has observations
        if perturb == "env":
            batch.rollout_logp[env_tokens] += 3.0
        elif perturb == "policy":
            batch.rollout_logp[batch.loss_mask.bool()] += 3.0
        trainer.learn(batch)
        return {k: v.clone() for k, v in trainer.models.policy.state_dict().items()}
    finally:
        trainer.close()


def test_no_gradient_reaches_an_environment_token(tmp_path: Path) -> None:
    base = _learn(tmp_path, "base", None)
    env = _learn(tmp_path, "env", "env")
    policy = _learn(tmp_path, "policy", "policy")
    assert all(torch.equal(base[k], env[k]) for k in base)
    assert not all(torch.equal(base[k], policy[k]) for k in base)


def test_a_run_trains_and_evaluates_on_episodes(tmp_path: Path) -> None:
    resolved = load_config(REGISTRY, [*TINY_ENV, "env=feedback_test", f"run_dir={tmp_path / 'run'}", "eval.size=4",
                                      "eval.n=2"])
    trainer = Trainer(engine_input(resolved), PM)
    try:
        metrics = trainer.train_step()
        assert 1 <= metrics["episode/turns"] <= 3 and metrics["episode/env_tokens"] > 0
        assert 0 < metrics["episode/turn_reward"] <= 0.5 * metrics["episode/turns"]  # 0.5 per answered turn
        assert metrics["response_length/mean"] == pytest.approx(metrics["episode/policy_tokens"]
                                                                + metrics["episode/env_tokens"])
        assert any("=;" in sample.completion for sample in trainer.last_samples)  # the samples show whole episodes
        evaluation = trainer.evaluator.run(1)
        assert 0.0 <= evaluation["eval/greedy_accuracy"] <= 1.0 and "eval/pass@2" in evaluation
        assert 1 <= evaluation["eval/greedy_turns"] <= 3
        # scripted turns (every episode the same): greedy 3 turns, then the 2 samples' 3 turns
        script = ["12", "34", "56", "7", "8", "9"]
        trainer.evaluator.sampler.backend = ScriptedBackend(trainer.sampler.tokenizer, script)
        evaluation = trainer.evaluator.run(2)
        assert evaluation["eval/greedy_turns"] == 3.0
        assert [s.completion for s in trainer.evaluator.samples] == ["12</s>=;34</s>=;56</s>"] * 4
    finally:
        trainer.close()


def test_the_kit_checks_environments() -> None:
    from rlzoo.api import check_component, check_environment

    for name in ("calculator", "feedback_test"):
        check_component(REGISTRY.get("environment", name), registry=REGISTRY)
    check_component(REGISTRY.get("environment", "tools"), {"tools": ["calculator"]}, registry=REGISTRY)

    class Random(Feedback):
        def step(self, completion: str) -> StepResult:
            return StepResult(observations=[{"role": "user", "content": str(torch.rand(1).item())}])

    class Silent(Feedback):
        def step(self, completion: str) -> StepResult:
            return StepResult(observations=[{"role": "robot", "content": "?"}])

    with pytest.raises(AssertionError, match="answered differently"):
        check_environment(Random, "random")
    with pytest.raises(AssertionError, match="'robot'"):
        check_environment(Silent, "silent")


def test_an_episode_run_resumes_bit_exactly(tmp_path: Path) -> None:
    from rlzoo.commands.cli import main

    weights = "checkpoints/step_000002/policy/model.safetensors"
    common = [*TINY_ENV, "eval.size=0", "checkpoint.every=1"]
    assert main(["train", *common, f"run_dir={tmp_path / 'whole'}", "trainer.total_steps=2"]) == 0
    assert main(["train", *common, f"run_dir={tmp_path / 'cut'}", "trainer.total_steps=1"]) == 0
    assert main(["train", f"resume={tmp_path / 'cut'}", "trainer.total_steps=2"]) == 0
    assert (tmp_path / "whole" / weights).read_bytes() == (tmp_path / "cut" / weights).read_bytes()


def test_the_guessing_game_answers_higher_or_lower_and_charges_each_wrong_guess() -> None:
    from rlzoo_plugins.environments import GuessEnv, GuessParams

    tokenizer = build_char_tokenizer("0123456789+-*=;")
    fmt = EpisodeFormat(tokenizer, PromptFormat())
    backend = ScriptedBackend(tokenizer, ["1000", "2000", "x", "1776"])
    [episode] = play(backend, fmt, lambda: GuessEnv(GuessParams(turn_penalty=0.25)), [Example("37*48=", "1776")], 1,
                     EpisodeLimits(5, 6, 40), temperature=1.0, top_p=1.0)
    assert episode.done and not episode.truncated and episode.answer == "1776"
    assert [m["content"] for m in episode.messages if m["role"] == "user"][1:] == ["+;", "-;", "=;"]
    assert (episode.turns, episode.turn_reward) == (4, -0.75)  # three wrong guesses, charged on success
    [failed] = play(ScriptedBackend(tokenizer, ["1000", "2000"]), fmt, lambda: GuessEnv(GuessParams(turn_penalty=0.25)),
                    [Example("37*48=", "1776")], 1, EpisodeLimits(2, 6, 40), temperature=1.0, top_p=1.0)
    assert failed.truncated and failed.turn_reward == 0.0  # never below an episode that answers


def _guesses(env, example: Example, next_guess, max_turns: int) -> int | None:
    """Guesses ``next_guess(hints so far)`` makes to find ``example``'s secret in ``env``
    (``None``: not within ``max_turns``)."""
    env.reset(example)
    hints: list[tuple[int, str]] = []
    for turn in range(1, max_turns + 1):
        guess = next_guess(hints)
        result = env.step(str(guess))
        if result.done:
            return turn
        hints.append((guess, result.observations[0]["content"]))
    return None


def test_only_the_hints_find_the_secret_task_s_answer() -> None:
    from rlzoo.tasks.task import Holdout
    from rlzoo_plugins.environments import GuessEnv, GuessParams
    from rlzoo_plugins.tasks import Secret, SecretParams

    task = Secret(SecretParams(high=9))
    examples = task.sample(2000, random.Random(0))
    assert all(re.fullmatch(r"\d{4}\?", e.prompt) and 0 <= int(e.reference) <= 9 for e in examples)
    assert {int(e.reference) for e in examples} == set(range(10))
    assert examples == task.sample(2000, random.Random(0))
    holdout = Holdout(0.1)
    held_out = task.eval_set(64, holdout)
    assert len({e.prompt for e in held_out}) == 64 and all(holdout.contains(e.prompt) for e in held_out)
    assert not any(holdout.contains(e.prompt) for e in task.sample_train(256, random.Random(1), holdout))
    wide = Secret(SecretParams(high=99, tag_digits=3)).sample(2000, random.Random(0))
    assert all(re.fullmatch(r"\d{3}\?", e.prompt) for e in wide) and max(int(e.reference) for e in wide) == 99
    for params, bad in [(dict(high=0), "high"), (dict(tag_digits=1), "tag_digits")]:
        with pytest.raises(ValueError, match=bad):
            SecretParams(**params)

    def bisect(hints: list[tuple[int, str]]) -> int:
        low, high = 0, 9
        for guess, hint in hints:
            low, high = (guess + 1, high) if hint == "+;" else (low, guess - 1)
        return (low + high) // 2

    secrets = [Example("0000?", str(k)) for k in range(10)]
    env = GuessEnv(GuessParams())
    turns = [_guesses(env, e, bisect, 4) for e in secrets]
    assert None not in turns and sum(turns) == 29  # binary search: every secret within 4 guesses, 2.9 on average
    fixed = [_guesses(env, e, lambda hints: [4, 7, 1, 8][len(hints)], 4) for e in secrets]
    assert sum(t is not None for t in fixed) == 4  # ignoring the hints: at most 4 of the 10 secrets in 4 guesses


def test_the_calculator_demonstrates_a_call_then_the_answer_and_sft_trains_on_its_policy_tokens(
        tmp_path: Path, capsys) -> None:
    from rlzoo.commands.cli import main
    from rlzoo.agents.episodes import replay
    from rlzoo.run.sft_trainer import _demonstrations

    tools = registered_tools(REGISTRY)
    plain, hermes = CalculatorEnv(CalculatorEnvParams(), tools, "plain"), CalculatorEnv(CalculatorEnvParams(), tools,
                                                                                        "hermes")
    assert plain.demonstration(Example("37*48=", "1776")) == ["37*48", "1776"]
    assert hermes.demonstration(Example("37*48=", "1776"))[0] == (
        '<tool_call>{"name": "calculator", "arguments": {"expression": "37*48"}}</tool_call>')
    assert plain.demonstration(Example("what is 37 times 48?", "1776")) is None
    assert Feedback().demonstration(Example("1*2=", "2")) is None  # the base class has none

    tokenizer = build_char_tokenizer("0123456789+-*=;")
    episode = replay(EpisodeFormat(tokenizer, PromptFormat()), plain, Example("37*48=", "1776"), ["37*48", "1776"],
                     EpisodeLimits(3, 8, 24))
    assert tokenizer.decode(episode.tokens) == "37*48</s>=1776;1776</s>" and episode.done and not episode.truncated
    assert episode.policy == [1] * 6 + [0] * 6 + [1] * 5 and episode.logp == [0.0] * len(episode.tokens)

    resolved = load_config(REGISTRY, [*TINY_ENV, "task.digits=2"])
    batch = _demonstrations(engine_input(resolved), tokenizer, PromptFormat(), "answer")
    _, _, ids, response_mask, loss_mask = batch([Example("37*48=", "1776"), Example("2*3=", "6")])
    assert tokenizer.decode(ids[1][response_mask[1].bool()]) == "2*3</s>=6;6</s>"
    assert loss_mask[1].tolist() == [1] * 4 + [0] * 3 + [1] * 2 + [0] * 8  # the loss skips the observation
    assert loss_mask[0].tolist() == episode.policy and response_mask[0].sum() == len(episode.tokens)
    needs = (r"needs 2 turn\(s\), 6 tokens in its longest turn \(end of turn included\) and 17 tokens after the "
             r"prompt: raise rollout.max_turns=1 to 2$")  # 37*48</s> =1776; 1776</s>
    with pytest.raises(ConfigError, match=needs):
        _demonstrations(load_run(REGISTRY, [*TINY_ENV, "rollout.max_turns=1"]), tokenizer, PromptFormat(),
                        "answer")([Example("37*48=", "1776")])
    assert _demonstrations(load_run(REGISTRY, TINY), tokenizer, PromptFormat(), "answer") is None
    chat = chat_tokenizer()  # under a chat template: a <tool_call>, its ids those of the rendered conversation
    resolved = load_config(REGISTRY, [*TINY_ENV, "rollout.max_turn_tokens=200", "rollout.max_new_tokens=1000"])
    _, _, ids, response_mask, loss_mask = _demonstrations(engine_input(resolved), chat, PromptFormat(), "answer")(
        [Example("37*48=", "1776")])
    assert chat.decode(ids[0][loss_mask[0].bool()]) == (
        '<tool_call>{"name": "calculator", "arguments": {"expression": "37*48"}}</tool_call><|im_end|>1776<|im_end|>')
    chat.chat_template = QWEN_STYLE.replace("{{ m.content }}<|im_end|>", "{{ m.content | upper }}<|im_end|>")
    with pytest.raises(ConfigError, match="retokenisation drift"):
        _demonstrations(engine_input(resolved), chat, PromptFormat(), "answer")([Example("37*48=", "1776")])

    out = tmp_path / "sft"
    assert main(["sft", *TINY_ENV, "--steps", "2", "--out", str(out)]) == 0, capsys.readouterr().err
    assert (out / "model.safetensors").is_file()
    assert main(["sft", *TINY_ENV, "--steps", "2", "--target", "format", "--out", str(tmp_path / "sft2")]) == 2
    assert "--target format has no form under env='calculator'" in capsys.readouterr().err
    tools_env = [*TINY_ENV, "env={name: tools, tools: [calculator]}"]
    assert main(["sft", *tools_env, "--steps", "1", "--out", str(tmp_path / "sft3")]) == 2
    assert "env='tools' has no demonstration for the prompt" in capsys.readouterr().err


def test_multiply_has_a_format_only_sft_target() -> None:
    import random

    from rlzoo_plugins.tasks import Multiply, MultiplyParams

    task, rng = Multiply(MultiplyParams(digits=2)), random.Random(0)
    examples = task.sample(50, rng)
    texts = [task.format_text(e, rng) for e in examples]
    assert all(t.isdigit() and len(t) == len(e.reference) and t[0] != "0" for t, e in zip(texts, examples))
    assert sum(t == e.reference for t, e in zip(texts, examples)) < 5  # not the answers (the default)
