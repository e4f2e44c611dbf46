"""One record per config key (rlzoo/config/keys*.py): configs/default.yaml, docs/config.md's
key tables, the schema, the value checks, ADDED_KEYS, RESUMABLE_KEYS and ``rlzoo explain``
all agree with the records, and a key added as one record reaches every one of them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml
from omegaconf import DictConfig, OmegaConf

from rlzoo.commands import explain as explain_cmd
from rlzoo.config import key_docs, keys, layers
from rlzoo.config.key_record import NEW, Key, Rule, Section, allowed, check_key, show
from rlzoo.config.keys_learn import TRAINER
from rlzoo.contract.kinds import COMPONENT_FIELDS
from rlzoo.core.errors import ConfigError
from rlzoo.plan.planner import load_config
from rlzoo.run import resume
from zoo import REGISTRY

ROOT = Path(__file__).parents[1]


def _leaves(data: dict, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value; a component choice (a mapping with ``name``) is one leaf."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and "name" not in value and f"{prefix}{key}" not in COMPONENT_FIELDS:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# ------------------------------------------------------------------ the generated files


def test_default_yaml_is_what_the_records_write() -> None:
    assert (ROOT / "configs" / "default.yaml").read_text() == explain_cmd.default_yaml_text(REGISTRY), \
        "regenerate it: rlzoo explain --default-yaml > configs/default.yaml"


def test_default_yaml_holds_every_records_default_and_nothing_else() -> None:
    written = _leaves(yaml.safe_load((ROOT / "configs" / "default.yaml").read_text()))
    records = keys.key_records()
    assert list(written) == list(records)
    for path, key in records.items():
        assert written[path] == key.default and type(written[path]) is type(key.default), path


def test_docs_config_md_key_tables_are_what_the_records_write() -> None:
    page = (ROOT / "docs" / "config.md").read_text()
    start, end = page.index(key_docs.BEGIN), page.index(key_docs.END) + len(key_docs.END) + 1
    assert page[start:end] == explain_cmd.keys_markdown_text(REGISTRY), \
        "regenerate the block: rlzoo explain --keys-markdown (between the <!-- keys --> lines of docs/config.md)"


def test_docs_config_md_has_a_row_per_key_with_its_default_and_doc() -> None:
    """Read back from the page itself, not from the renderer: every key once, its default, its doc."""
    page = (ROOT / "docs" / "config.md").read_text()
    rows = {}
    for line in page.splitlines():
        match = re.match(r"^\| `([\w.]+)` \| (.*) \|$", line)
        if match:
            assert match.group(1) not in rows, f"{match.group(1)} has two rows"
            rows[match.group(1)] = match.group(2).replace("\\|", "|")
    assert set(rows) == set(keys.key_records())
    for path, key in keys.key_records().items():
        assert f"`{show(key.default)}`" in rows[path] and key.doc in rows[path], path
    assert "`token-mean` (grpo: `seq-mean-token-mean`)" in rows["loss_agg"]
    assert "`0.0` (grpo: `0.04`)" in rows["kl.coef"]


def test_the_yaml_comment_of_a_key_is_its_doc_led_by_its_choices() -> None:
    kl_apply, arch = keys.key_records()["kl.apply"], keys.key_records()["model.arch"]
    assert key_docs.comment(kl_apply) == kl_apply.doc                     # names loss and reward itself
    assert key_docs.comment(arch) == "qwen2 | llama: architecture of the embedded model"
    assert key_docs.comment(arch, "grpo sets llama").endswith("; grpo sets llama")
    text = (ROOT / "configs" / "default.yaml").read_text()
    assert "  arch: qwen2" in text and "# qwen2 | llama: architecture of the embedded model\n" in text


def test_docs_training_md_lists_exactly_the_resumable_keys() -> None:
    page = (ROOT / "docs" / "training.md").read_text()
    table = page[page.index("### What a resume may change"):].split("\n\n")[2]
    listed = [k for line in table.splitlines()[2:] for k in re.findall(r"`([\w.*]+)`", line.split(" | ")[0])]
    assert sorted(listed) == sorted(k + "*" if k.endswith(".") else k for k in resume.RESUMABLE_KEYS)


# ------------------------------------------------------------------ what derives from them


def test_the_schema_has_a_typed_field_per_record() -> None:
    schema = OmegaConf.structured(keys.run_schema())
    fields = {}

    def walk(node: DictConfig, prefix: str) -> None:
        for name in node.keys():
            child = node._get_node(name)
            if isinstance(child, DictConfig) and not child._is_missing():
                walk(child, f"{prefix}{name}.")
            else:
                fields[prefix + name] = child._metadata.ref_type
    walk(schema, "")
    assert list(fields) == list(keys.key_records())
    assert fields["trainer.lr"] is float and fields["seed"] is int and fields["model.gradient_checkpointing"] is bool
    assert fields["model.path"] is str and schema.model._get_node("path")._metadata.optional
    assert not schema._get_node("seed")._metadata.optional


def test_added_renamed_and_resumable_keys_come_from_the_records() -> None:
    from rlzoo.config import schema
    assert schema.ADDED_KEYS == {p: k.old for p, k in keys.key_records().items() if k.old is not NEW}
    assert schema.ADDED_KEYS["rollout.staleness"] == 0 and schema.ADDED_KEYS["env"] is None
    assert "trainer.lr" not in schema.ADDED_KEYS
    assert schema.RENAMED_KEYS == {"trainer.ppo_epochs": "trainer.update_epochs",
                                   "trainer.mini_batches": "trainer.num_mini_batches", "kl.penalty": "kl.estimator"}
    assert resume.RESUMABLE_KEYS == ("trainer.total_steps", "trainer.micro_batch_size", "trainer.micro_batch_tokens",
                                     "trainer.padding_free", "trainer.logprob_chunk_size",
                                     "trainer.logprob_keep_mb", "trainer.threads", "logging.", "checkpoint.every",
                                     "checkpoint.keep", "distributed.timeout_s", "rm.steps", "rm.eval_every")
    assert resume.resumable("logging.progress") and not resume.resumable("trainer.lr")


def test_explain_lists_the_keys_whose_record_says_so() -> None:
    shown = {k.key for k in explain_cmd.knobs(load_config(REGISTRY, ["rollout_correction=[tis]"]), None)}
    assert {"algo", "seed", "model.path", "trainer.lr", "kl.coef", "kl.estimator.name", "eval.holdout",
            "rollout_correction[0].cap", "advantage.name", "task.num_digits"} <= shown
    # what a run computes, which explain left out (issue 47 item 17d): the answer a reward reads, a teacher,
    # the weights' dtype, the embedded model's shape, a plugin module's hooks
    assert {"answer_format.name", "teacher.path", "model.dtype", "model.hidden_size", "model.arch", "plugins",
            "model.system_prompt", "model.lora.rank"} <= shown
    assert not shown & {"trainer.threads", "trainer.device", "trainer.micro_batch_size", "run_dir", "resume",
                        "model.gradient_checkpointing", "logging.log_every", "checkpoint.every", "rm.steps",
                        "launcher.nproc"}
    for path, key in keys.key_records().items():
        assert any(k == path or k.startswith((path + ".", path + "[")) for k in shown) == key.explain, path


def test_every_key_is_explained_or_its_record_says_why_not() -> None:
    """A key changes what a run computes (``rlzoo explain`` lists it) or its record says why not
    (how, where or when a run computes, what it records): a new key cannot be left out by default."""
    for path, key in keys.key_records().items():
        assert key.explain != bool(key.not_explained), (
            f"{path}: explain={key.explain}, not_explained={key.not_explained!r}: set explain=True, or say in "
            "not_explained why it changes nothing a run computes")


def test_a_new_key_with_neither_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    forgotten = Key("forgotten", int, 1, "a key whose author decided nothing")
    run = next(s for s in keys.TABLE if s.entries and getattr(s.entries[0], "name", "") == "algo")
    monkeypatch.setattr(keys, "TABLE", tuple(Section(None, (*run.entries, forgotten)) if s is run else s
                                             for s in keys.TABLE))
    record = keys.key_records()["forgotten"]
    assert record.explain is False and record.not_explained == ""  # what the test above fails on


def test_explain_marks_the_tiny_models_shape_unused_under_a_model_path(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    rows = {k.key: k for k in explain_cmd.knobs(load_config(REGISTRY, [f"model.path={tmp_path}"]), None)}
    assert rows["model.hidden_size"].unused == "model.path is set: the embedded model is not built"
    assert rows["model.dtype"].unused == ""


def test_records_are_well_formed() -> None:
    records = keys.key_records()
    for path, key in records.items():
        assert key.doc and "\n" not in key.doc and "#" not in key.doc, path    # one line; YAML comments end at #
        assert not (key.choices and key.range), path
        assert key.renamed_from not in records, path
        if key.choices:
            assert key.default in key.choices, path
        check_key(key, key.default)                                              # the default passes its checks
    for path in COMPONENT_FIELDS:
        assert records[path].type is Any, path
    for rule in keys.rules():
        assert set(rule.reads) <= set(records), rule.reads


# ------------------------------------------------------------------ the checks


@pytest.mark.parametrize(("override", "message"), [
    ("rollout.n=0", "invalid value for rollout.n: 0; must be > 0"),
    ("trainer.lr=-0.001", "invalid value for trainer.lr: -0.001; must be >= 0"),
    ("rollout.top_p=0", "invalid value for rollout.top_p: 0.0; must be in (0, 1]"),
    ("rollout.top_p=1.5", "invalid value for rollout.top_p: 1.5; must be in (0, 1]"),
    ("eval.holdout=1", "invalid value for eval.holdout: 1.0; must be in [0, 1) (the share of each task's prompts "
                       "held out of training for evaluation)"),
    ("model.lora.alpha=0", "invalid value for model.lora.alpha: 0.0; must be > 0 (the adapters' product is scaled "
                           "by alpha / rank)"),
    ("kl.apply=rewrd", "invalid value for kl.apply: 'rewrd'; choose one of loss, reward. Did you mean 'reward'?"),
    ("rollout.dtype=float64", "invalid value for rollout.dtype: 'float64'; choose one of None, float32, bfloat16, "
                              "float16."),
    ("seed=4294967296", "invalid value for seed: 4294967296; must be in [0, 2**32 - 1] = [0, 4294967295] "
                        "(NumPy's seed range)"),
])
def test_a_value_outside_its_record_is_refused_with_one_line(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(REGISTRY, [override])
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize("override", ["rollout.top_p=1.0", "eval.holdout=0", "model.lora.dropout=0.0",
                                      "trainer.max_grad_norm=null", "rollout.dtype=null", "seed=4294967295",
                                      "trainer.threads=0"])
def test_a_value_on_the_edge_of_its_range_is_accepted(override: str) -> None:
    load_config(REGISTRY, [override])


def test_model_dtype_float16_gets_its_own_reason_before_the_choices() -> None:
    with pytest.raises(ConfigError, match="model.dtype=float16 is not supported: AdamW"):
        load_config(REGISTRY, ["model.dtype=float16"])


def test_a_rule_reading_two_keys_runs_after_each_keys_own_checks() -> None:
    with pytest.raises(ConfigError, match="trainer.precision=bf16 computes in bfloat16 over float32 master"):
        load_config(REGISTRY, ["trainer.precision=bf16", "model.dtype=bfloat16"])
    with pytest.raises(ConfigError, match="invalid value for trainer.precision: 'fp16'"):
        load_config(REGISTRY, ["trainer.precision=fp16", "model.dtype=bfloat16"])


def test_allowed_says_what_a_key_takes() -> None:
    records = keys.key_records()
    assert allowed(records["rollout.top_p"]) == "(0, 1]"
    assert allowed(records["trainer.device"]) == "`cpu`, `cuda`, `auto`"
    assert allowed(records["trainer.max_grad_norm"]) == "> 0 or `null`"
    assert allowed(records["model.gradient_checkpointing"]) == ""
    assert show(1e-6) == "1.0e-06" and yaml.safe_load(show(1e-6)) == 1e-6     # YAML 1.1 reads 1e-06 as a string
    assert show("null") == '"null"' and show({"name": "a", "k": [1, None]}) == "{name: a, k: [1, null]}"


# ------------------------------------------------------------------ adding a key is one record


def _with_fake_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Add ``trainer.fake_knob`` (one record and one rule) and point the default layer at the
    default.yaml the records now write."""
    def knob_within_group(cfg: DictConfig) -> None:
        if cfg.trainer.fake_knob > cfg.rollout.n:
            raise ConfigError(f"trainer.fake_knob={cfg.trainer.fake_knob} exceeds rollout.n={cfg.rollout.n}")

    fake = Key("fake_knob", int, 3, "a knob only this test has", range="> 0", resumable=True, old=1)
    trainer = Section("trainer", (*TRAINER.entries, fake), explain=True,
                      rules=(*TRAINER.rules, Rule(("trainer.fake_knob", "rollout.n"), knob_within_group)))
    monkeypatch.setattr(keys, "TABLE", tuple(trainer if s is TRAINER else s for s in keys.TABLE))
    path = tmp_path / "default.yaml"
    path.write_text(key_docs.default_yaml(keys.TABLE, {}))
    monkeypatch.setattr(layers, "default_config_path", lambda: path)


def test_a_key_added_as_one_record_reaches_schema_checks_explain_resume_and_docs(monkeypatch, tmp_path) -> None:
    with pytest.raises(ConfigError, match="unknown config key 'trainer.fake_knob'"):
        load_config(REGISTRY, ["trainer.fake_knob=2"])
    _with_fake_key(monkeypatch, tmp_path)

    resolved = load_config(REGISTRY, [])
    assert resolved.cfg.trainer.fake_knob == 3                                   # default.yaml, written from it
    assert load_config(REGISTRY, ["trainer.fake_knob=5"]).cfg.trainer.fake_knob == 5
    with pytest.raises(ConfigError, match="'abc' is not a valid int"):             # the schema's type
        load_config(REGISTRY, ["trainer.fake_knob=abc"])
    with pytest.raises(ConfigError, match=r"invalid value for trainer.fake_knob: 0; must be > 0$"):
        load_config(REGISTRY, ["trainer.fake_knob=0"])                           # its range
    with pytest.raises(ConfigError, match="trainer.fake_knob=9 exceeds rollout.n=8"):
        load_config(REGISTRY, ["trainer.fake_knob=9"])                           # its rule
    assert any(k.key == "trainer.fake_knob" and k.value == 3 for k in explain_cmd.knobs(resolved, None))
    assert "trainer.fake_knob" in explain_cmd.explain(resolved, REGISTRY)
    assert "trainer.fake_knob" in resume.resumable_keys() and resume.resumable("trainer.fake_knob")
    assert keys.added_keys()["trainer.fake_knob"] == 1
    assert resume.with_added_keys({"trainer": {"lr": 0.1}})["trainer"]["fake_knob"] == 1
    assert "| `trainer.fake_knob` | `3` | > 0 | a knob only this test has |" in \
        key_docs.keys_markdown(keys.key_records(), "grpo", {})
    assert "  fake_knob: 3" in layers.default_config_path().read_text()


# ------------------------------------------------------------------ booleans read one way

BOOLEAN_KEYS = sorted(path for path, key in keys.key_records().items() if key.type in (bool, Optional[bool]))


def test_there_are_boolean_keys_to_check() -> None:
    assert {"logging.doctor", "eval.at_start", "rollout.record", "model.chat_template"} <= set(BOOLEAN_KEYS)


@pytest.mark.parametrize("path", BOOLEAN_KEYS)
@pytest.mark.parametrize("value", ["2", "1", "0", "maybe", "0.5"])
def test_a_boolean_key_takes_true_or_false_only(path: str, value: str) -> None:
    """OmegaConf alone reads 2 as true and refuses 'maybe': every boolean key refuses both."""
    with pytest.raises(ConfigError, match=rf"^invalid value for {re.escape(path)}: .*; a boolean is true or false"):
        load_config(REGISTRY, [f"{path}={value}"])


@pytest.mark.parametrize("path", BOOLEAN_KEYS)
def test_a_boolean_key_takes_yaml_booleans(path: str) -> None:
    assert OmegaConf.select(load_config(REGISTRY, [f"{path}=false"]).cfg, path) is False
    assert OmegaConf.select(load_config(REGISTRY, [f"{path}=true"]).cfg, path) is True


def test_a_boolean_in_a_config_file_and_a_nullable_one(tmp_path: Path) -> None:
    assert OmegaConf.select(load_config(REGISTRY, ["model.chat_template=null"]).cfg, "model.chat_template") is None
    (tmp_path / "run.yaml").write_text("logging:\n  doctor: 2\n")
    with pytest.raises(ConfigError, match=r"^invalid value for logging.doctor: 2; a boolean is true or false$"):
        load_config(REGISTRY, [], config_file=tmp_path / "run.yaml")


def test_a_boolean_component_parameter_takes_true_or_false_only() -> None:
    with pytest.raises(ConfigError, match=r"^invalid parameter for rollout.backend 'vllm': sleep=2; a boolean is "
                                          r"true or false$"):
        load_config(REGISTRY, ["rollout.backend={name: vllm, sleep: 2}"])


@pytest.mark.parametrize("override, message", [
    ("rollout=vllm", "rollout='vllm': rollout is a section of keys, not a value; did you mean rollout.backend=vllm?"),
    ("model=/m/dir", "model='/m/dir': model is a section of keys, not a value; did you mean model.path=/m/dir?"),
    ("trainer=bf16", "trainer='bf16': trainer is a section of keys, not a value; did you mean trainer.precision=bf16?"),
    ("kl=k3", "kl='k3': kl is a section of keys, not a value; did you mean kl.estimator=k3?"),
    ("eval=0", "eval=0: eval is a section of keys, not a value; set its keys, e.g. eval.every=..., eval.size=..."),
])
def test_a_section_given_one_value_names_the_key_it_belongs_to(override: str, message: str) -> None:
    """``rollout=vllm`` looks like ``algo=grpo``; it said "Merge error: str is not a subclass of RolloutConfig"."""
    with pytest.raises(ConfigError) as error:
        load_config(REGISTRY, [override])
    assert str(error.value).startswith(message)
