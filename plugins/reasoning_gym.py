"""reasoning-gym as a task source: procedural reasoning tasks with their own verifiers.

``task={name: reasoning_gym, dataset: basic_arithmetic, config: {max_digits: 2}, seed: 0}``
draws examples from one of reasoning-gym's generators (``pip install 'rlzoo[reasoning]'``;
``rlzoo list --kind task`` names them); ``datasets: [{name: chain_sum, weight: 2,
config: {...}}, {name: basic_arithmetic}]`` mixes several, each example's generator drawn
with probability proportional to its weight. The default reward, ``reasoning_gym``, scores
the answer the run's ``answer_format`` finds with the generator's own ``score_answer``
(found through ``metadata.source_dataset`` of the example's row).

Held-out prompts: reasoning-gym generates entry ``i`` of a dataset seeded ``s`` from
``Random(s + i)``. Training draws ``i`` uniformly from ``[0, size)`` with ``seed``;
evaluation walks entries ``0, 1, ...`` of the same generators seeded ``eval_seed``
(default ``seed + size``), so no generator seed makes both a training and an evaluation
entry; and, as for every task, a prompt is used for evaluation only if it falls in the
held-out share (``eval.holdout``), which training drops, so a question that two seeds
happen to generate alike is never trained on either. docs/tasks.md is the guide.
"""

from __future__ import annotations

import random
import string
import tracemalloc
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Dict, List, Optional

from rlzoo.api import did_you_mean, Example, Holdout, hookimpl, Task

RLZOO_API_VERSION = "2"
INSTALL = "pip install 'rlzoo[reasoning]' (reasoning-gym)"


def _factory() -> Any:
    try:
        import reasoning_gym.factory as factory
    except ImportError as exc:
        raise ValueError(f"task reasoning_gym needs reasoning-gym, which is not importable ({exc}): {INSTALL}") \
            from exc
    return factory


def dataset_names() -> list[str]:
    """Every generator reasoning-gym registers (imports it: about 2 s)."""
    return sorted(_factory().DATASETS)


def _listing() -> str:
    """What ``rlzoo list`` prints under the task: the datasets, or how to install them."""
    try:
        names = dataset_names()
    except ValueError:
        return f"datasets: reasoning-gym is not installed: {INSTALL}"
    return f"datasets ({len(names)}): {', '.join(names)}"


@dataclass
class ReasoningGymParams:
    dataset: Optional[str] = None
    """One reasoning-gym dataset (``rlzoo list --kind task`` names them); or use ``datasets``."""
    config: Dict[str, Any] = field(default_factory=dict)
    """The dataset's settings (its config class's fields, e.g. ``max_digits``), with ``dataset``."""
    datasets: List[Any] = field(default_factory=list)
    """Several datasets mixed: ``[{name: chain_sum, weight: 2, config: {...}}, ...]`` (weight 1 unless given)."""
    seed: int = 0
    """Seed of the training entries (entry i is generated from Random(seed + i))."""
    size: int = 1_000_000_000
    """Training draws entry indices uniformly from [0, size)."""
    eval_seed: Optional[int] = None
    """Seed of the evaluation entries; None: seed + size (no generator seed in common with training)."""

    def __post_init__(self) -> None:
        if (self.dataset is None) == (not self.datasets):
            raise ValueError("give dataset: NAME (with config: {...}) or datasets: [{name: NAME, weight: W, "
                             "config: {...}}, ...], not both or neither")
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}")
        for item in self.mixture():
            check_dataset(item["name"], item["config"])
            check_size(item["name"], item["config"], self.size)

    def mixture(self) -> list[dict[str, Any]]:
        """``[{name, weight, config}]``: the one dataset, or every item of ``datasets`` checked."""
        if self.dataset is not None:
            return [{"name": self.dataset, "weight": 1.0, "config": dict(self.config)}]
        if self.config:
            raise ValueError("config goes with dataset; with datasets give each item its own config")
        out = []
        for i, item in enumerate(self.datasets):
            item = {"name": item} if isinstance(item, str) else dict(item)
            unknown = sorted(set(item) - {"name", "weight", "config"})
            if "name" not in item or unknown:
                raise ValueError(f"datasets[{i}] = {item!r}: each item is {{name: NAME, weight: W, config: {{...}}}}"
                                 + (f"; unknown key {unknown[0]!r}" if unknown else "; 'name' is missing"))
            weight = item.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
                raise ValueError(f"datasets[{i}].weight must be a number > 0, got {weight!r}")
            out.append({"name": item["name"], "weight": float(weight), "config": dict(item.get("config") or {})})
        names = [item["name"] for item in out]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"datasets names {twice[0]!r} twice; give each dataset once (with its weight)")
        return out


def check_dataset(name: Any, config: dict[str, Any]) -> None:
    """:raises ValueError: an unknown dataset (with a did-you-mean) or settings its config refuses."""
    factory = _factory()
    if name not in factory.DATASETS:
        names = sorted(factory.DATASETS)
        raise ValueError(f"unknown reasoning-gym dataset {name!r}.{did_you_mean(str(name), names)} "
                         f"`rlzoo list --kind task` names all {len(names)}")
    _build(name, config, seed=0, size=1)


SIZE_PROBE = 256
"""Entries of the second probe build of :func:`check_size` (the first has one)."""

SIZE_LIMIT_BYTES = 1 << 30
"""The most a dataset may hold in memory for its index range (``size`` entries): 1 GiB."""


def check_size(name: str, config: dict[str, Any], size: int) -> None:
    """Refuse a ``size`` for which the dataset would hold more than :data:`SIZE_LIMIT_BYTES`.

    Most generators make entry ``i`` on demand, but some make something for every entry of
    the index range when built: gsm_symbolic and list_functions draw a value per entry
    (``Random(seed).choices(..., k=size)``: 8 bytes an entry, 8 GB at the default 10⁹), acre
    generates every question (about 5 kB an entry, and hours). Two builds (1 and
    1 + :data:`SIZE_PROBE` entries) show whether a container of the dataset grows with
    ``size``; only then are its bytes per entry measured with :mod:`tracemalloc` (which slows
    a build several times over), from the same two builds.

    :raises ValueError: naming the dataset, the projected bytes and a ``size`` that fits.
    """
    small, large = _build(name, config, seed=0, size=1), _build(name, config, seed=0, size=1 + SIZE_PROBE)
    if not any(_length(getattr(large, key, None)) - _length(value) >= SIZE_PROBE for key, value in vars(small).items()):
        return
    del small, large
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        one = _build(name, config, seed=0, size=1)
        after_one = tracemalloc.get_traced_memory()[0]
        probe = _build(name, config, seed=0, size=1 + SIZE_PROBE)
        after_probe = tracemalloc.get_traced_memory()[0]
    finally:
        if not tracing:
            tracemalloc.stop()
    del one, probe
    # a container that grows holds at least a pointer (8 bytes) an entry
    per_entry = max((after_probe - after_one) - (after_one - before), 8 * SIZE_PROBE) / SIZE_PROBE
    if per_entry * size > SIZE_LIMIT_BYTES:
        fits = 10 ** len(str(int(SIZE_LIMIT_BYTES / 10 / per_entry))) // 10
        raise ValueError(f"reasoning-gym dataset {name!r} keeps about {per_entry:,.0f} bytes per entry of its index "
                         f"range when built: size {size:,} would take {per_entry * size / 2 ** 30:,.1f} GiB; "
                         f"set task.size={fits} (or below; its entries are drawn from [0, size))")


def _length(value: Any) -> int:
    """``len(value)`` of a container (not a string), else 0."""
    return len(value) if hasattr(value, "__len__") and not isinstance(value, (str, bytes)) else 0


def _build(name: str, config: dict[str, Any], seed: int, size: int) -> Any:
    try:
        return _factory().create_dataset(name, seed=seed, size=size, **config)
    except (TypeError, AssertionError, ValueError) as exc:
        raise ValueError(f"reasoning-gym dataset {name!r} refuses config {config!r}: {exc}") from exc


class ReasoningGym(Task):
    """Examples of one or several reasoning-gym generators (see the module docstring).

    Each example's ``row`` is the generator's entry (``question``, ``answer``,
    ``metadata``), which the ``reasoning_gym`` reward scores with.
    """

    alphabet = "".join(sorted(set(string.printable) - set("\x0b\x0c\r")))
    """Printable ASCII, so the embedded tiny model can train on it too (a real model's tokenizer covers more)."""

    def __init__(self, params: ReasoningGymParams) -> None:
        self.mixture = params.mixture()
        self.names = [item["name"] for item in self.mixture]
        self.weights = [item["weight"] for item in self.mixture]
        self.size = params.size
        eval_seed = params.seed + params.size if params.eval_seed is None else params.eval_seed
        self.train = [_build(i["name"], i["config"], params.seed, params.size) for i in self.mixture]
        self.evaluation = [_build(i["name"], i["config"], eval_seed, params.size) for i in self.mixture]

    def _example(self, datasets: list[Any], which: int, index: int) -> Example:
        entry = datasets[which][index]
        row = {"question": entry["question"], "answer": entry["answer"], "metadata": entry["metadata"]}
        return Example(prompt=entry["question"], reference=entry["answer"], row=row)

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        """``n`` training entries: each one's dataset drawn by weight, then its index."""
        out = []
        for _ in range(n):
            which = rng.choices(range(len(self.names)), weights=self.weights)[0] if len(self.names) > 1 else 0
            out.append(self._example(self.train, which, rng.randrange(self.size)))
        return out

    def eval_set(self, size: int, holdout: Holdout) -> list[Example]:
        """Up to ``size`` distinct held-out entries of the ``eval_seed`` generators, walked
        in index order (datasets drawn by weight with a fixed RNG); at most ``100 · size``."""
        rng = random.Random("rlzoo-eval")
        found: dict[str, Example] = {}
        for index in range(100 * size):
            which = rng.choices(range(len(self.names)), weights=self.weights)[0] if len(self.names) > 1 else 0
            example = self._example(self.evaluation, which, index)
            if holdout.contains(example.prompt) and example.prompt not in found:
                found[example.prompt] = example
                if len(found) >= size:
                    break
        return list(found.values())


@lru_cache(maxsize=None)
def _scorer(name: str) -> Any:
    return _factory().get_score_answer_fn(name)


def reasoning_gym_reward(completions: list[str], rows: list[dict[str, Any]],
                         answers: list[Optional[str]] | None = None) -> list[float]:
    """The generator's own verifier: ``score_answer(answer, entry)`` of the dataset named
    by the row's ``metadata.source_dataset`` (reasoning-gym's scores, in [0, 1]; partial
    credit where the dataset gives it); 0 where the answer format finds no answer."""
    answers = list(completions) if answers is None else answers
    scores = []
    for answer, row in zip(answers, rows):
        source = (row.get("metadata") or {}).get("source_dataset") if isinstance(row, dict) else None
        if source is None:
            raise ValueError("the reasoning_gym reward scores rows that carry metadata.source_dataset (task="
                             f"reasoning_gym, or a file with a metadata column); got a row with keys {sorted(row)}")
        scores.append(0.0 if answer is None else float(_scorer(source)(answer, row)))
    return scores


@hookimpl
def rlzoo_register_tasks(register) -> None:
    register("reasoning_gym", ReasoningGym, params=ReasoningGymParams, reward="reasoning_gym", listing=_listing,
             description="reasoning-gym's procedural generators, one or several mixed by weight "
                         f"({INSTALL.split(' (')[0]})")


@hookimpl
def rlzoo_register_reward_functions(register) -> None:
    register("reasoning_gym", reasoning_gym_reward,
             description="the reasoning-gym dataset's own score_answer on the extracted answer")
