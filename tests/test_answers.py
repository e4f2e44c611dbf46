"""Answer formats (plugins/answers.py), the answers reward input, strict and lenient
scoring (rlzoo/rollout/scoring.py) and prompt building (rlzoo/tasks/prompts.py), on hand-written strings."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlzoo.run.resume import with_added_keys
from rlzoo.plan.run_input import engine_input, load_run
from rlzoo.plan.planner import load_config
from rlzoo.core.errors import ConfigError
from rlzoo.tasks.prompts import PromptFormat
from rlzoo.rollout.scoring import Rewards
from rlzoo.tasks.task import Example
from zoo import REGISTRY


def fmt(name: str):
    return REGISTRY.get("answer_format", name).bind(None)


def spans(name: str, text: str) -> list[str]:
    return fmt(name)(text=text)


# --------------------------------------------------------------------------- extractors


def test_answer_tag_finds_every_pair_and_the_last_is_the_answer() -> None:
    assert spans("answer_tag", "I think <answer> 12 </answer>, no: <answer>13</answer>.") == ["12", "13"]
    assert spans("answer_tag", "<answer>multi\nline</answer>") == ["multi\nline"]
    assert spans("answer_tag", "no tags here, 42") == []
    assert spans("answer_tag", "<answer>unclosed 5") == []
    assert spans("answer_tag", "<answer></answer>") == [""]


def test_boxed_keeps_nested_braces_and_skips_an_unbalanced_one() -> None:
    assert spans("boxed", r"so \boxed{\frac{1}{2}} and \boxed{3}") == [r"\frac{1}{2}", "3"]
    assert spans("boxed", r"\boxed{{a}{b{c}}}") == ["{a}{b{c}}"]
    assert spans("boxed", r"\boxed {7}") == ["7"]
    assert spans("boxed", r"\boxed{1 + {2}") == []          # never closed
    assert spans("boxed", "plain 4") == []


def test_last_number_signs_commas_decimals() -> None:
    assert spans("last_number", "3 + 4 = 7.") == ["3", "4", "7"]
    assert spans("last_number", "it is -12, or 1,234.5 total") == ["-12", "1234.5"]
    assert spans("last_number", "no digits") == []


def test_exact_line_and_plain() -> None:
    assert spans("exact_line", "work\n\n  42  \n") == ["work", "42"]
    assert spans("exact_line", "   ") == []
    assert spans("plain", " 42 ") == [" 42 "]


# --------------------------------------------------------------------------- rewards


def _rewards(*overrides: str) -> Rewards:
    return Rewards.of(load_run(REGISTRY, ["eval.size=0", *overrides]).components)


def test_exact_match_compares_the_formats_answer_and_none_scores_zero() -> None:
    rewards = _rewards("task=arithmetic", "answer_format=answer_tag")
    completions = ["<answer>46</answer>", "46", "<answer>4</answer> <answer>46</answer>", "<answer>45</answer>"]
    assert rewards.answers(completions) == ["46", None, "46", "45"]
    scores, _ = rewards.score(["12+34="] * 4, completions, ["46"] * 4, [{}] * 4)
    assert scores.tolist() == [1.0, 0.0, 1.0, 0.0]


def test_plain_keeps_the_default_rewards_unchanged() -> None:
    rewards = _rewards("task=arithmetic")
    assert rewards.answer_format.name == "plain"
    assert rewards.answers([" 46", "x"]) == [" 46", "x"]
    assert rewards.score(["a", "b"], [" 46 ", "47"], ["46", "46"], [{}, {}])[0].tolist() == [1.0, 0.0]


def test_format_reward_in_a_reward_list() -> None:
    rewards = _rewards("task=arithmetic", "answer_format=boxed",
                       "reward=[exact_match, {name: format, weight: 0.5}]")
    scores, per = rewards.score(["q"] * 3, [r"\boxed{46}", r"\boxed{5}", "46"], ["46"] * 3, [{}] * 3)
    assert per.tolist() == [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]
    assert scores.tolist() == [1.5, 0.5, 0.0]


def test_lenient_finds_the_answer_anywhere_strict_only_in_the_format() -> None:
    rewards = _rewards("task=arithmetic", "answer_format=answer_tag")
    completions = ["<answer>46</answer>",        # strict and lenient
                   "12 + 34 = 46",               # lenient: the last number
                   r"the sum is \boxed{46}",     # lenient: boxed
                   "46\nso",                     # lenient: a line
                   "<answer>45</answer> maybe",  # neither
                   ""]                           # neither
    n = len(completions)
    strict = rewards.score(["q"] * n, completions, ["46"] * n, [{}] * n)[0]
    lenient = rewards.lenient_scores(["q"] * n, completions, ["46"] * n, [{}] * n)
    assert strict.tolist() == [1, 0, 0, 0, 0, 0]
    assert lenient.tolist() == [1, 1, 1, 1, 0, 0]


def test_an_answer_format_that_breaks_its_contract_is_named() -> None:
    from rlzoo.core.errors import TrainingError
    from rlzoo.rollout.scoring import _spans

    class Broken:  # returns the text itself, not a list of spans
        name = "broken"

        def __call__(self, text: str) -> str:
            return text

    with pytest.raises(TrainingError, match="answer_format 'broken' returned str"):
        _spans(Broken(), "x")


# --------------------------------------------------------------------------- prompts


class _Chat:
    """A tokenizer stand-in with a visible chat template."""

    chat_template = "x"

    def apply_chat_template(self, turns, tokenize, add_generation_prompt):
        return "".join(f"<{m['role']}>{m['content']}" for m in turns) + "<assistant>"


def test_prompt_format_defaults_leave_the_prompt_unchanged() -> None:
    plain = SimpleNamespace(chat_template=None)
    assert PromptFormat().render("123=", plain) == "123="
    assert PromptFormat().render(Example("123=", "123"), plain) == "123="
    assert PromptFormat.of(load_config(REGISTRY, []).plan.prompt).render("531=", plain) == "531="


def test_instruction_system_prompt_and_chat_template() -> None:
    p = PromptFormat(instruction="Q: {question}\n{format}", format_hint="Use tags.", system_prompt="Be brief.")
    assert p.render("2+2?", SimpleNamespace(chat_template=None)) == "Be brief.\n\nQ: 2+2?\nUse tags."
    assert p.render("2+2?", _Chat()) == "<system>Be brief.<user>Q: 2+2?\nUse tags.<assistant>"
    assert PromptFormat(format_hint="Use tags.").render("2+2?", _Chat()) == "<user>2+2?\nUse tags.<assistant>"
    assert PromptFormat(chat_template=False, system_prompt="S").render("q", _Chat()) == "S\n\nq"


def test_chat_messages_keep_their_turns_and_own_system_turn() -> None:
    messages = ({"role": "system", "content": "Data system."}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yo"}, {"role": "user", "content": "2+2?"})
    example = Example("2+2?", "4", messages=messages)
    p = PromptFormat(instruction="Solve: {question}", system_prompt="Config system.")
    assert p.render(example, _Chat()) == ("<system>Data system.<user>hi<assistant>yo<user>Solve: 2+2?<assistant>")
    bare = Example("2+2?", "4", messages=({"role": "user", "content": "2+2?"},))
    assert p.render(bare, _Chat()) == "<system>Config system.<user>Solve: 2+2?<assistant>"
    assert messages[3]["content"] == "2+2?"            # the example is not modified


def test_the_answer_formats_hint_reaches_the_prompt() -> None:
    resolved = load_config(REGISTRY, ["answer_format=answer_tag", 'task.instruction="Solve {question}. {format}"'])
    assert resolved.cfg.task.instruction == "Solve {question}. {format}"
    text = PromptFormat.of(resolved.plan.prompt).render("1+1", SimpleNamespace(chat_template=None))
    assert text == "Solve 1+1. Give your final answer between <answer> and </answer>."


@pytest.mark.parametrize("value, message", [
    ('"no field"', "no {question}"), ('"{question} {answer}"', "unknown field {answer}"),
    ('"{question"', "task.instruction"), ("3", "template string")])
def test_bad_instructions_are_refused(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("{", r"\{")):
        load_config(REGISTRY, [f"task.instruction={value}"])


def test_chat_template_true_without_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="no chat template"):
        PromptFormat(chat_template=True).check(SimpleNamespace(chat_template=None))


def test_the_sampler_and_sft_build_prompts_in_one_place() -> None:
    from pathlib import Path

    root = Path(__file__).parents[1] / "rlzoo"
    for module in ("rollout/sampler.py", "run/sft_trainer.py", "run/evaluation.py"):
        text = (root / module).read_text()
        assert "apply_chat_template" not in text, f"{module} builds prompts itself"
    assert "prompt_format.encode" in (root / "run" / "sft_trainer.py").read_text()


def test_eval_at_start_logs_step_0_and_leaves_training_alone(capsys, tmp_path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import zoo
    from rlzoo.commands.cli import main

    common = [*zoo.TINY, "trainer.total_steps=1", "eval.size=4", "eval.n=0", "answer_format=last_number"]
    for name, extra in (("plain", []), ("start", ["eval.at_start=true"])):
        assert main(["train", *common, *extra, f"run_dir={tmp_path / name}"]) == 0, capsys.readouterr().err
    assert "evaluation before the first step: eval/greedy_accuracy" in capsys.readouterr().out
    events = EventAccumulator(str(tmp_path / "start"))
    events.Reload()
    assert [e.step for e in events.Scalars("eval/strict_accuracy")] == [0, 1]
    assert [e.step for e in events.Scalars("eval/lenient_accuracy")] == [0, 1]
    weights = [(tmp_path / n / "checkpoints" / "step_000001" / "policy" / "model.safetensors").read_bytes()
               for n in ("plain", "start")]
    assert weights[0] == weights[1]


def test_a_config_saved_before_these_keys_existed_still_loads() -> None:
    from omegaconf import OmegaConf

    saved = OmegaConf.to_container(load_config(REGISTRY, []).cfg)
    del saved["answer_format"], saved["model"]["system_prompt"], saved["eval"]["at_start"]
    del saved["task"]["instruction"]
    resolved = load_config(REGISTRY, [], base=with_added_keys(saved))     # what resume= does
    assert resolved.components["answer_format"].name == "plain" and resolved.cfg.model.system_prompt is None
    assert Rewards.of(engine_input(resolved).components).answers([" 1 "]) == [" 1 "]      # no format: the completion
    assert PromptFormat.of(resolved.plan.prompt).render("12=", SimpleNamespace(chat_template=None)) == "12="
