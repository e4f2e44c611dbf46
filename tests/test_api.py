"""``rlzoo.api``, the one surface plugin authors import, and the API 2.0 import paths that
``rlzoo.compat`` keeps working (with a deprecation warning) until API 3."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

import rlzoo.api
from rlzoo.compat import OLD_MODULES


@pytest.mark.parametrize("name", rlzoo.api.__all__)
def test_every_public_name_resolves_to_its_module_s_object(name: str) -> None:
    module = importlib.import_module(rlzoo.api.HOME[name])
    assert getattr(rlzoo.api, name) is getattr(module, name)


def test_an_unknown_name_is_an_attribute_error_listing_the_surface() -> None:
    with pytest.raises(AttributeError, match=r"rlzoo.api has no name 'masked_meen'; the public surface: .*masked_mean"):
        rlzoo.api.masked_meen  # noqa: B018
    with pytest.raises(ImportError):
        exec("from rlzoo.api import masked_meen", {})


def test_importing_the_surface_and_the_hook_marker_imports_no_torch() -> None:
    """A plugin module's ``from rlzoo.api import hookimpl`` is cheap; names are resolved on use."""
    code = "import sys, rlzoo.api; from rlzoo.api import hookimpl, API_VERSION; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_surface_names_each_object_once() -> None:
    names = [name for names in rlzoo.api.SURFACE.values() for name in names]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(("statement", "name", "new"), [
    ("from rlzoo import hookimpl", "hookimpl", "rlzoo.api"),
    ("from rlzoo.masked import masked_mean", "masked_mean", "rlzoo.api"),
    ("from rlzoo.tasks import Task", "Task", "rlzoo.api"),
    ("from rlzoo.rollout import generate", "generate", "rlzoo.api"),
    ("from rlzoo.rollout import left_pad", "left_pad", "rlzoo.api"),
    ("from rlzoo.tools import Tool", "Tool", "rlzoo.api"),
    ("from rlzoo.tools import ToolCall", "ToolCall", "rlzoo.api"),
    ("from rlzoo.models import build_policy", "build_policy", "rlzoo.models.build"),
    ("from rlzoo.config import load_config", "load_config", "rlzoo.plan.planner"),
    ("from rlzoo.rewardmodel import RunningMoments", "RunningMoments", "rlzoo.api"),
    ("from rlzoo.testing import check_component", "check_component", "rlzoo.api"),  # the kit is public via rlzoo.api
    ("from rlzoo.testing import check_tool", "check_tool", "rlzoo.api"),
    ("from rlzoo.testing import KIND_CHECKS", "KIND_CHECKS", "rlzoo.testing.component_checks"),
])
def test_an_api_2_0_import_path_still_works_and_names_the_new_one(statement: str, name: str, new: str) -> None:
    namespace: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(statement, namespace)
    assert namespace[name] is getattr(importlib.import_module(rlzoo.api.HOME.get(name, new)), name)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any(f"import {name} from {new}" in m and "removed in API 3" in m for m in messages), messages


def test_every_old_module_s_new_homes_exist() -> None:
    for homes in OLD_MODULES.values():
        for home in homes:
            importlib.import_module(home)


def test_an_old_path_without_the_name_is_an_attribute_error() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ImportError, match="no_such_name"):
            exec("from rlzoo.masked import no_such_name", {})


def test_the_test_kit_from_rlzoo_api_passes_the_documented_deprecation_recipe() -> None:
    """docs/plugins.md: run a plugin's tests with -W error::DeprecationWarning; the kit's public
    path must pass it (``rlzoo.testing``, its API 2.0 path, warns: see above)."""
    code = ("from rlzoo.api import build_registry, check_component, check_environment, check_tool, "
            "make_plugin_manager, CHECKED_KINDS; "
            "registry = build_registry(make_plugin_manager()); "
            "check_component(registry.get('loss_agg', 'token-mean'))")
    subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code], check=True, capture_output=True)
