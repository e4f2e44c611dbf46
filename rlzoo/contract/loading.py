"""The plugin manager: load plugins from entry points and build the component registry.

Environment variables:

- ``RLZOO_PLUGINS``: comma-separated plugin names (``dist:entry-point``, or just the
  entry-point name) to load; others are skipped. Keeps tests and reproductions hermetic.
- ``RLZOO_DISABLE_PLUGINS``: comma-separated plugin names not to load.
- ``RLZOO_TRACE_HOOKS=1``: print every hook call (pluggy tracing) to stderr.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pluggy

from rlzoo.contract import hookspecs
from rlzoo.core.errors import DuplicateComponentError, PluginError, RefusedComponentError, did_you_mean
from rlzoo.contract.registry import Registry

ENTRY_POINT_GROUP = "rlzoo"


def _api_compatible(declared: Any) -> bool:
    return str(declared).split(".")[0] == hookspecs.API_VERSION.split(".")[0]


def _env_list(name: str) -> set[str] | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    return {item.strip() for item in raw.split(",") if item.strip()}


class PluginManager(pluggy.PluginManager):
    """A pluggy manager with the rlzoo hookspecs and a record of where plugins came from.

    :ivar load_errors: plugins that failed to load; loading goes on without them.
    :ivar packages: plugin name -> the distribution (package) it came from.
    """

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT_NAME)
        self.add_hookspecs(hookspecs)
        self.load_errors: list[PluginError] = []
        self.packages: dict[str, str] = {}
        if os.environ.get("RLZOO_TRACE_HOOKS"):
            self.trace.root.setwriter(lambda message: sys.stderr.write(message))
            self.enable_tracing()

    def register_plugin(self, plugin: Any, name: str, package: str) -> None:
        """Register ``plugin`` (a module or object with hook implementations).

        :raises PluginError: an incompatible ``RLZOO_API_VERSION`` or invalid hook impls.
        """
        declared = getattr(plugin, "RLZOO_API_VERSION", None)
        if declared is not None and not _api_compatible(declared):
            raise PluginError(
                f"plugin {name!r} ({package}) targets rlzoo plugin API {declared}, but this "
                f"rlzoo provides API {hookspecs.API_VERSION}; upgrade the plugin or rlzoo "
                "(docs/plugins.md, 'Plugin API version', says what changed)"
            )
        self._check_hook_names(plugin, name, package)
        try:
            hash(plugin)
        except TypeError as exc:
            raise PluginError(f"plugin {name!r} ({package}) is an unhashable {type(plugin).__name__}: pluggy "
                              "needs plugin objects hashable (a dataclass: eq=False)") from exc
        try:
            self.register(plugin, name=name)
        except (pluggy.PluginValidationError, ValueError) as exc:
            raise PluginError(f"plugin {name!r} ({package}) is invalid: {exc}") from exc
        self.packages[name] = package

    def _check_hook_names(self, plugin: Any, name: str, package: str) -> None:
        """Every ``rlzoo_*`` function of ``plugin`` must be a ``@hookimpl`` of a known hook.

        :raises PluginError: naming the plugin, the function and the closest hook.
        """
        for attr in dir(plugin):
            if not attr.startswith("rlzoo_") or not callable(getattr(plugin, attr, None)):
                continue
            if attr in RENAMED_HOOKS:
                raise PluginError(f"plugin {name!r} ({package}) defines {attr!r}, renamed to "
                                  f"{RENAMED_HOOKS[attr]!r} in plugin API 2 (docs/plugins.md, 'Plugin API version')")
            if attr not in HOOK_NAMES:
                raise PluginError(f"plugin {name!r} ({package}) defines {attr!r}, which is no rlzoo hook."
                                  f"{did_you_mean(attr, HOOK_NAMES)} (hooks: rlzoo.contract.hookspecs)")
            if self.parse_hookimpl_opts(plugin, attr) is None:
                raise PluginError(f"plugin {name!r} ({package}) defines {attr!r} without @hookimpl, so "
                                  "pluggy would never call it: decorate it with `from rlzoo.api import hookimpl`")
            spec = getattr(self.hook, attr).spec
            wanted = _required_args(getattr(plugin, attr))
            unknown = [arg for arg in wanted if spec is not None and arg not in spec.argnames]
            if unknown:
                raise PluginError(f"plugin {name!r} ({package}): {attr}() takes {', '.join(map(repr, unknown))}, which "
                                  f"{attr} does not pass; its arguments are {', '.join(spec.argnames)} (a hook "
                                  "implementation may take any of them, by these names)")

    def register_run_extensions(self, plugins: list[tuple[str, Any]]) -> None:
        """Register a run's extension objects so they run in list order (pluggy calls the
        most recently registered first, so they are registered last to first).

        :param plugins: ``(name, object)`` pairs in ``extensions=[...]`` order.
        """
        for name, plugin in reversed(plugins):
            self.register_plugin(plugin, name=f"extension:{name}:{id(plugin)}", package=f"extension {name}")

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Import and register every entry point of ``group`` (rlzoo's own first, then by
        distribution and name); failures are recorded."""
        only = _env_list("RLZOO_PLUGINS")
        disabled = _env_list("RLZOO_DISABLE_PLUGINS") or set()
        # rlzoo's own plugins first: a third-party name clash is then reported against them
        entry_points = sorted(md.entry_points(group=group),
                              key=lambda e: (_dist_name(e) != hookspecs.PROJECT_NAME, _dist_name(e), e.name))
        for ep in entry_points:
            dist = _dist_name(ep)
            name = f"{dist}:{ep.name}"
            if only is not None and not ({name, ep.name} & only):
                continue
            if {name, ep.name} & disabled or self.has_plugin(name):
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # noqa: BLE001 - any import failure is reported
                self.load_errors.append(
                    PluginError(f"plugin {name!r} (entry point {ep.value!r}) failed to import: {type(exc).__name__}: "
                                f"{exc}. {import_fix(exc, ep, dist, name)}", plugin=name, package=dist))
                continue
            try:
                self.register_plugin(plugin, name=name, package=dist)
            except PluginError as exc:
                exc.plugin, exc.package = name, dist
                self.load_errors.append(exc)

    def load_modules(self, modules: Iterable[str]) -> None:
        """Import and register the ``plugins=[...]`` of a config: each item is a module name
        (importable from the current directory or any installed package) or the path of a
        ``.py`` file (relative to the current directory).

        :raises PluginError: naming the item that cannot be found or imported.
        """
        for item in modules:
            name = f"file:{Path(item).resolve()}" if _is_path(item) else f"module:{item}"
            if self.has_plugin(name):
                continue
            module = _import_file(item) if _is_path(item) else _import_module(item)
            if self.is_registered(module):  # an installed plugin's own module: its entry point loaded it
                continue
            self.register_plugin(module, name=name, package=item)


def import_fix(exc: BaseException, ep: md.EntryPoint, dist: str, name: str) -> str:
    """What to do about an installed plugin that failed to import: the missing dependency's
    pip name where the plugin's package declares it (a requirement that is not installed),
    else how to see the traceback; and the switch that skips the plugin."""
    module = ep.value.split(":")[0].strip()
    skip = f"or skip the plugin: RLZOO_DISABLE_PLUGINS={name}"
    missing = exc.name.split(".")[0] if isinstance(exc, ModuleNotFoundError) and exc.name else None
    if missing is None:
        return f"Its traceback: python -c 'import {module}'; fix {dist}, {skip}"
    if missing == module.split(".")[0]:
        return f"{dist} is installed without its own module {missing!r}: reinstall it (pip install --force-reinstall " \
               f"{dist}), {skip}"
    absent = _absent_requirements(dist)
    wanted = [req for req in absent if _normalised(req) == _normalised(missing)] or (absent if len(absent) == 1 else [])
    if wanted:
        return f"It needs {wanted[0]}, a dependency of {dist} that is not installed: pip install {wanted[0]}; {skip}"
    return (f"Install the package that provides the module {missing!r} ({dist} does not declare it; its pip name may "
            f"differ from the module's), {skip}")


def _normalised(name: str) -> str:
    """A distribution or module name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _absent_requirements(dist: str) -> list[str]:
    """The requirements of distribution ``dist`` (those not behind an extra) that are not installed."""
    try:
        requires = md.distribution(dist).requires or []
    except md.PackageNotFoundError:
        return []
    absent = []
    for requirement in requires:
        found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
        if found is None or "extra" in requirement.partition(";")[2]:
            continue
        try:
            md.distribution(found.group(1))
        except md.PackageNotFoundError:
            absent.append(found.group(1))
    return absent


def _required_args(fn: Any) -> list[str]:
    """The arguments without a default of a hook implementation (those pluggy passes by name)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in parameters if p.kind in kinds and p.default is inspect.Parameter.empty]


def _is_path(item: str) -> bool:
    """A ``plugins`` item naming a file (``my_reward.py``, ``lib/rewards.py``), not a module."""
    return item.endswith(".py") or "/" in item or os.sep in item


def _import_module(module_name: str) -> Any:
    """Import ``module_name``, the current directory included in the search (after the
    installed packages), as ``python -m`` would."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name == module_name.split(".")[0]:
            hint = (f" (searched the current directory {cwd} and the installed packages; a file elsewhere "
                    f"can be given by path: plugins=[path/to/{module_name.split('.')[-1]}.py])")
        raise PluginError(f"plugin module {module_name!r} from config 'plugins' failed to import: "
                          f"{type(exc).__name__}: {exc}{hint}") from exc


def _import_file(item: str) -> Any:
    """Import the Python file ``item`` as module ``rlzoo_plugin_file_<stem>``."""
    path = Path(item)
    if path.suffix != ".py" or not path.is_file():
        raise PluginError(f"plugin file {item!r} from config 'plugins' does not exist (relative to the current "
                          f"directory {os.getcwd()}) or is not a .py file")
    module_name = f"rlzoo_plugin_file_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}"
    spec = importlib.util.spec_from_file_location(module_name, path.resolve())
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin file {item!r} cannot be imported as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001
        del sys.modules[module_name]
        raise PluginError(f"plugin file {item!r} from config 'plugins' failed to import: "
                          f"{type(exc).__name__}: {exc}") from exc
    return module


def _dist_name(ep: md.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return dist.metadata["Name"] if dist is not None else "?"


def make_plugin_manager(load_entry_points: bool = True, modules: Iterable[str] = ()) -> PluginManager:
    """Create a fresh plugin manager, loading entry points and extra modules."""
    pm = PluginManager()
    if load_entry_points:
        pm.load_entry_points()
    pm.load_modules(modules)
    return pm


HOOK_NAMES = sorted([*hookspecs.REGISTRATION_HOOKS.values(), *hookspecs.LIFECYCLE_HOOKS])
"""Every hook of the contract."""

RENAMED_HOOKS = {"rlzoo_register_kl_penalties": "rlzoo_register_kl_estimators"}
"""Hooks of plugin API 1 -> their API 2 names."""


def build_registry(pm: PluginManager, strict: bool = True) -> Registry:
    """Call every registration hook of every plugin and collect the components.

    Each plugin's hook is called through pluggy on its own (``pm.subset_hook_caller``, so
    ``RLZOO_TRACE_HOOKS=1`` shows every call), plugin by plugin in registration order, so
    each component is attributed to the plugin and package that registered it.
    A plugin whose registration raises is recorded in ``registry.load_errors`` (what it
    registered before failing stays, the other plugins are unaffected); a duplicate name raises at once
    because a run could otherwise pick the wrong implementation silently.
    """
    registry = Registry()
    registry.load_errors.extend(pm.load_errors)
    for kind, hook_name in hookspecs.REGISTRATION_HOOKS.items():
        impls = getattr(pm.hook, hook_name).get_hookimpls()  # registration order
        for impl in impls:
            plugin_name = impl.plugin_name
            package = pm.packages.get(plugin_name, plugin_name)
            others = [other.plugin for other in impls if other is not impl]
            caller = pm.subset_hook_caller(hook_name, remove_plugins=others)

            def register(name: str, fn: Any, _kind: str = kind, _p: str = plugin_name,
                         _pkg: str = package, **meta: Any) -> None:
                try:
                    registry.add(_kind, name, fn, plugin=_p, package=_pkg, **meta)
                except DuplicateComponentError as exc:
                    exc.plugin, exc.package = _p, _pkg
                    if strict:
                        raise
                    registry.load_errors.append(exc)
                except PluginError as exc:  # this component only: the plugin's others still register
                    registry.refuse(RefusedComponentError(f"{exc}. {_refusal(_kind, name, _p)}", _kind, str(name),
                                                          plugin=_p, package=_pkg))

            try:
                caller(register=register)
            except DuplicateComponentError:
                raise
            except PluginError as exc:
                exc.plugin, exc.package = plugin_name, package
                registry.load_errors.append(exc)
            except Exception as exc:  # noqa: BLE001
                registry.load_errors.append(
                    PluginError(
                        f"plugin {plugin_name!r} ({package}) failed in {hook_name}: "
                        f"{type(exc).__name__}: {exc}", plugin=plugin_name, package=package
                    )
                )
    refused = registry.refused()
    if strict and refused:
        if len(refused) == 1:
            raise refused[0]
        raise RefusedComponentError(f"{len(refused)} components were refused at registration:\n"
                                    + "\n".join(f"  - {e}" for e in refused), refused[0].kind, refused[0].name,
                                    plugin=refused[0].plugin, package=refused[0].package)
    return registry


def _refusal(kind: str, name: str, plugin: str) -> str:
    """What a refused component means and the way out, after the reason it was refused."""
    if plugin.startswith(("module:", "file:")):
        way_out = " or the plugin leaves plugins=[...]"
    elif ":" in plugin and not plugin.startswith(("<", "extension:")):
        way_out = f" or the plugin is skipped: RLZOO_DISABLE_PLUGINS={plugin}"
    else:
        way_out = ""
    return (f"The plugin loaded, but its {kind} {name!r} is refused at registration, and no run starts until it is "
            f"fixed{way_out}")


def load_registry(modules: Iterable[str] = ()) -> tuple[PluginManager, Registry]:
    """Convenience: a plugin manager with entry points plus ``modules``, and its registry."""
    pm = make_plugin_manager(modules=modules)
    return pm, build_registry(pm)


class _Plugin:
    """A plugin object built from functions (hashable by identity, as pluggy needs)."""

    def __repr__(self) -> str:
        return f"<plugin {', '.join(sorted(vars(self)))}>"


def module_plugin(**hooks: Any) -> Any:
    """Build a throwaway plugin object from hook functions (handy in tests and notebooks).

    ``pm.register(module_plugin(rlzoo_register_tasks=fn), name="mine")``
    """
    plugin = _Plugin()
    for name, fn in hooks.items():
        setattr(plugin, name, hookspecs.hookimpl(fn))
    return plugin
