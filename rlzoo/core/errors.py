"""User-facing errors. The CLI prints their message and exits with code 2, no traceback."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable


class RlzooError(Exception):
    """Base of every error caused by the user's input (config, plugin, data)."""


class ConfigError(RlzooError):
    """A config value, key, file or component choice is invalid."""


class UnknownComponentError(ConfigError):
    """A component name is not registered for its kind."""


class PluginError(RlzooError):
    """A plugin failed to load, register or run; the message names the plugin.

    :ivar plugin: the plugin's name (``dist:entry-point``, ``module:...``, ``file:...``, or the
        name it was registered under), ``None`` when unknown.
    :ivar package: the distribution (package) it came from, ``None`` when unknown. A plugin
        author's test filters ``registry.load_errors`` by it (docs/plugins.md, "Testing your plugin").
    """

    def __init__(self, message: str, *, plugin: str | None = None, package: str | None = None) -> None:
        super().__init__(message)
        self.plugin = plugin
        self.package = package


class DuplicateComponentError(PluginError):
    """Two plugins registered the same name (or alias) for one kind.

    :ivar kind: that kind (``None`` when unknown).
    """

    def __init__(self, message: str, kind: str | None = None, *, plugin: str | None = None,
                 package: str | None = None) -> None:
        super().__init__(message, plugin=plugin, package=package)
        self.kind = kind


class RefusedComponentError(PluginError):
    """A plugin loaded, but one component it registered breaks the contract (a signature
    naming an input its kind does not have, unknown needs, a parameter class that is no
    dataclass, a tool whose schema cannot be built, ...): that component is not registered.

    Like a name collision it stops every run (:func:`rlzoo.contract.loading.build_registry`
    raises it), while ``rlzoo list`` and a registry built with ``strict=False`` keep the
    plugin's other components.

    :ivar kind: the component's kind.
    :ivar name: the name it was registered under.
    """

    def __init__(self, message: str, kind: str, name: str, *, plugin: str | None = None,
                 package: str | None = None) -> None:
        super().__init__(message, plugin=plugin, package=package)
        self.kind = kind
        self.name = name


class TrainingError(RlzooError):
    """Training had to stop (non-finite loss or reward, a failing reward function, ...)."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest choice, or ``""`` when none is close."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    if not close:
        lowered = {c.lower().replace("_", "-"): c for c in choices}
        key = str(word).lower().replace("_", "-")
        if key in lowered:
            close = [lowered[key]]
    return f" Did you mean '{close[0]}'?" if close else ""


def say(line: str) -> None:
    """Print ``line`` on stderr in one write and flush it.

    ``print(line, file=sys.stderr)`` writes the text and its newline in two system calls
    (stderr is unbuffered), so the lines of processes sharing one stderr (torchrun's ranks,
    a sweep's runs) can interleave as ``error Aerror B`` followed by two empty lines; one
    write of a line shorter than the pipe's atomic size (4096 bytes on Linux) never does.
    """
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
