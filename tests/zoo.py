"""The standard zoo as the registry sees it, so per-family, docs and end-to-end tests cover
a newly registered component without anyone editing a list."""

from __future__ import annotations

import textwrap
from pathlib import Path

from rlzoo.contract.loading import load_registry

TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
        "model.num_kv_heads=1", "task.num_digits=3", "rollout.prompts_per_step=4", "rollout.n=4",
        "rollout.max_new_tokens=5", "logging.progress=false", "trainer.threads=1"]
"""Overrides of a fast end-to-end run: a 1-layer model of width 32, 3-digit sorting, 16
completions a step, one torch thread."""

PM, REGISTRY = load_registry()


def fake_distribution(root: Path, dist: str, module: str, source: str, entry: str = "main",
                      requires: tuple[str, ...] = ()) -> str:
    """An installed plugin package as ``importlib.metadata`` sees it, without pip: ``module``
    (``source`` dedented) and a ``dist``-0.1 ``.dist-info`` with its ``rlzoo`` entry point
    ``entry`` and ``Requires-Dist`` lines for ``requires``, in ``root`` (put ``root`` on
    ``sys.path``). Returns the plugin's name, ``dist:entry``."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    requirements = "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n{requirements}")
    (info / "entry_points.txt").write_text(f"[rlzoo]\n{entry} = {module}\n")
    return f"{dist}:{entry}"


def builtin_names(kind: str) -> tuple[str, ...]:
    """Names of the components of ``kind`` that rlzoo itself registers, in registration order."""
    return tuple(c.name for c in REGISTRY.components(kind) if c.package == "rlzoo")


def tiny_reward_model(path, alphabet: str = "0123456789=", seed: int = 0, hidden: int = 16):
    """Write a randomly initialised one-layer reward model (Qwen2 sequence classifier, one
    label, a character tokenizer over ``alphabet``) to ``path``; returns ``(model, tokenizer)``."""
    import torch
    from omegaconf import OmegaConf

    from rlzoo.models.build import build_char_tokenizer, build_tiny_model
    from rlzoo.models.reward_model import from_causal_lm

    torch.manual_seed(seed)
    tokenizer = build_char_tokenizer(alphabet)
    shape = OmegaConf.create({"arch": "qwen2", "hidden_size": hidden, "intermediate_size": 2 * hidden,
                              "num_layers": 1, "num_heads": 2, "num_kv_heads": 1})
    model = from_causal_lm(build_tiny_model(shape, tokenizer, 64))
    torch.nn.init.normal_(model.score.weight)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return model.eval(), tokenizer
