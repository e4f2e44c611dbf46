"""Deferred imports: ``import torch`` that loads torch only when something uses it.

The quick commands (``rlzoo list``, ``config``, ``explain``, ``diff``) import every plugin,
and the plugins (rlzoo's own and third-party ones alike) import torch at their top, but
nothing those commands compute touches torch: its import (~1.5 s, most of their time) is
wasted. :func:`defer_imports` makes ``import torch`` give a placeholder module that runs
torch's real import, into that same module object, the first time any attribute of it is
read (``torch.Tensor``, ``torch.no_grad``, ``from torch import nn``, a submodule import
such as ``import torch.nn.functional``): what a command computes, and prints, is the same
either way; only when torch loads changes. A plugin that uses torch at import time (a
module-level ``@torch.no_grad()``, ``torch.float32`` as a dataclass default) loads it
there, as without deferral.

Unlike :class:`importlib.util.LazyLoader`, which loads on *any* attribute read, the
placeholder answers the module metadata the import system reads on every later
``import torch`` (``__spec__``, ``__name__``, ``__loader__``, ``__file__``) without loading;
``__path__`` is not answered, so importing a submodule loads the package first, as it must
(and a submodule the package's own import brought in is then taken as found, not run twice).
Meant for a single-threaded start-up (the CLI's): a second thread reading the module while
the first one's read is loading it would find it half-initialised.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

QUICK_IMPORTS: tuple[str, ...] = ("torch",)
"""The packages the quick commands defer. Only packages whose ``__init__`` keeps its module
object in ``sys.modules`` fit (transformers replaces its own with a lazy module and is
imported by no plugin at its top)."""


_METADATA = frozenset({"__name__", "__loader__", "__package__", "__path__", "__file__", "__cached__"})
"""What the import system reads (as absent or not) while it sets a new module up."""
_ARMED = "__rlzoo_deferred_armed__"
"""Set in the placeholder's namespace once the import system has set it up."""


class _Deferred(types.ModuleType):
    """A module whose import has not run yet; any attribute it lacks runs it."""

    def __getattr__(self, attr: str) -> Any:
        if attr in _METADATA and not self.__dict__.get(_ARMED):
            raise AttributeError(attr)  # the import system is still setting the placeholder up
        spec: importlib.machinery.ModuleSpec = self.__dict__["__spec__"]
        del self.__dict__[_ARMED]
        self.__class__ = types.ModuleType  # from here on an ordinary module: no second load
        before = set(sys.modules)
        _init_module_attrs(spec, self)
        spec._initializing = True  # type: ignore[attr-defined]  # as the import system marks a module it runs
        try:
            spec.loader.exec_module(self)  # type: ignore[union-attr]
        except BaseException:
            sys.modules.pop(spec.name, None)  # as a failed import leaves it: the next import retries
            raise
        finally:
            spec._initializing = False  # type: ignore[attr-defined]
        if attr == "__path__":
            # a submodule import asked (importlib._bootstrap._find_and_load_unlocked), having
            # checked sys.modules before: the package may just have imported that submodule,
            # which the import system must now take as found, not run a second time
            for finder in sys.meta_path:
                if isinstance(finder, _DeferringFinder):
                    finder.imported_by_load = set(sys.modules) - before
        return getattr(self, attr)


def _init_module_attrs(spec: importlib.machinery.ModuleSpec, module: types.ModuleType) -> None:
    """Set ``module``'s import metadata from ``spec`` as the import system does before
    running a module (``__path__`` of a package included)."""
    module.__spec__ = spec
    module.__loader__ = spec.loader
    module.__package__ = spec.parent
    if spec.submodule_search_locations is not None:
        module.__path__ = spec.submodule_search_locations  # type: ignore[assignment]
    if spec.has_location:
        module.__file__ = spec.origin
        if spec.cached is not None:
            module.__cached__ = spec.cached  # type: ignore[attr-defined]


class _DeferringFinder(importlib.abc.MetaPathFinder):
    """Finds the deferred packages as the other finders do and hands out a placeholder."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.imported_by_load: set[str] = set()
        """Modules the package's load, started by a submodule import, imported itself."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        imported_by_load, self.imported_by_load = self.imported_by_load, set()  # only the next lookup's
        if fullname in imported_by_load and fullname in sys.modules:
            return importlib.util.spec_from_loader(fullname, _FoundLoader(sys.modules[fullname]))
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None  # not installed: the import fails as it would
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        return importlib.util.spec_from_loader(fullname, _PlaceholderLoader(spec), origin=spec.origin)


class _PlaceholderLoader(importlib.abc.Loader):
    """Creates the placeholder module of a deferred package; running it does nothing yet."""

    def __init__(self, real: importlib.machinery.ModuleSpec) -> None:
        self.real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Deferred(self.real.name)
        module.__dict__.update(__spec__=self.real, __loader__=self.real.loader, __file__=self.real.origin)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # the import system has just set this loader's spec on it: give back the real metadata
        # (a later import reads __spec__), and arm it
        module.__dict__.update({"__spec__": self.real, "__loader__": self.real.loader, "__file__": self.real.origin,
                                "__package__": self.real.parent, _ARMED: True})


class _FoundLoader(importlib.abc.Loader):
    """Hands the import system a module that is already imported, unchanged."""

    def __init__(self, module: types.ModuleType) -> None:
        self.module = module
        self.spec = module.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self.spec  # the import system set this loader's


def defer_imports(names: Iterable[str] = QUICK_IMPORTS) -> None:
    """Make later imports of the top-level packages ``names`` deferred (see the module's
    docstring); packages already imported stay as they are. Lasts for the process."""
    names = frozenset(n for n in names if n not in sys.modules)
    if names and not any(isinstance(f, _DeferringFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeferringFinder(names))


def loaded(name: str) -> bool:
    """Whether ``name`` has been imported for real (not only deferred)."""
    module = sys.modules.get(name)
    return module is not None and not isinstance(module, _Deferred)


def no_grad(fn: F) -> F:
    """``@torch.no_grad()`` for a plugin's function without importing torch before the first
    call: the first call decorates ``fn`` with ``torch.no_grad()`` and every call goes through
    that (generator functions included, as torch handles them). ``@torch.no_grad()`` itself
    reads ``torch`` when the module defining ``fn`` is imported, which loads torch even for
    ``rlzoo list``."""
    decorated: Callable[..., Any] | None = None

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal decorated
        if decorated is None:
            import torch

            decorated = torch.no_grad()(fn)
        return decorated(*args, **kwargs)

    return call  # type: ignore[return-value]
