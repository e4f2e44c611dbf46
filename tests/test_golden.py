"""Golden learning curves: every built-in preset, replayed briefly, still learns the default
task as it did when its curve was recorded (benchmarks/golden.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlzoo.commands import golden
from rlzoo.contract.loading import build_registry, make_plugin_manager, module_plugin
from zoo import builtin_names

GOLDEN = Path(__file__).parents[1] / "benchmarks" / "golden"
PRESETS = builtin_names("algorithm")


def test_every_builtin_preset_has_a_golden_record() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(PRESETS)
    assert (GOLDEN / "curves.png").is_file()


def _replay(name: str, tmp_path: Path, extra: list[str] | None = None, pm=None) -> tuple[float, dict]:
    record = golden.load(GOLDEN / f"{name}.json")
    replay = record["replay"]
    pm = pm or make_plugin_manager()
    curve = golden.run_curve(build_registry(pm), pm, [*record["overrides"], *(extra or [])], replay["steps"],
                             replay["seeds"][0], tmp_path / name)
    return golden.gain(curve.rewards, replay["window"]), record


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
def test_replayed_reward_gain_is_within_the_golden_band(name: str, tmp_path: Path) -> None:
    gain, record = _replay(name, tmp_path)
    low, high = record["replay"]["band"]
    steps, gains = record["replay"]["steps"], record["replay"]["gains"]
    assert low <= gain <= high, (f"{name}: reward gain {gain:+.3f} over {steps} steps is outside its golden band "
                                 f"[{low:+.3f}, {high:+.3f}] (seeds' gains {gains})")


FLIP = """
from rlzoo.api import hookimpl
class Flip:
    @hookimpl
    def rlzoo_before_update(self, batch, ctx):
        batch.advantages = -batch.advantages

@hookimpl
def rlzoo_register_extensions(register):
    register("flip_advantage_sign", lambda: Flip())
"""


@pytest.mark.slow
def test_a_flipped_advantage_sign_falls_outside_the_band(tmp_path: Path) -> None:
    """The net catches a broken formula: the same replay with every advantage negated."""
    namespace: dict = {}
    exec(FLIP, namespace)
    pm = make_plugin_manager()
    pm.register(module_plugin(rlzoo_register_extensions=namespace["rlzoo_register_extensions"]), name="flip")
    gain, record = _replay("grpo", tmp_path, ["extensions=[flip_advantage_sign]"], pm)
    assert gain < record["replay"]["band"][0], (gain, record["replay"]["band"])
