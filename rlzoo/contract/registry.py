"""The component registry: every named piece a run can choose, by kind and name.

The registry is filled by the registration hooks (see :mod:`rlzoo.contract.hookspecs`) and read by
the config resolver, the engine and the CLI through :meth:`Registry.get` and
:meth:`Registry.names`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rlzoo.contract.checks import BoundComponent, check_declared_needs, derived_needs, inspect_inputs
from rlzoo.core.errors import (DuplicateComponentError, PluginError, RefusedComponentError, UnknownComponentError,
                               did_you_mean)
from rlzoo.contract.kinds import KINDS
from rlzoo.contract.tool_schema import ToolsByName, registered_tool

NEEDS = frozenset({"critic", "reference", "groups", "logits", "greedy", "entropy", "old_logp", "teacher",
                   "sum_pi_squared"})
"""What a component needs, so the engine builds and runs only that. Most needs follow from
the inputs a component's function names (:data:`rlzoo.contract.kinds.KINDS`); ``groups``, and
whatever an extension reads from the batch, are declared with ``needs=``:

- ``critic``: a value model (values, returns, value loss);
- ``reference``: log-probs of a frozen reference policy (``batch.ref_logp``);
- ``groups``: several completions per prompt (``rollout.n > 1``);
- ``logits``: full-vocabulary logits of the policy and the reference;
- ``greedy``: the score of a greedy completion of every prompt;
- ``entropy``: per-token entropy of the policy before the update (``batch.old_entropy``);
- ``old_logp``: log-probs of the policy before the update, before the advantages
  (``batch.old_logp``);
- ``sum_pi_squared``: Σ_v π_old(v)² at each response position, from the full logits of the
  old-log-prob pass (``batch.old_sum_pi_squared``).
"""


@dataclass(frozen=True)
class Component:
    """One registered component.

    :ivar kind: one of :data:`rlzoo.contract.kinds.KINDS`' keys.
    :ivar name: the primary name; ``aliases`` resolve to it too.
    :ivar fn: the implementation (function, class or preset mapping, per kind).
    :ivar params: dataclass of the component's parameters, or ``None``.
    :ivar needs: subset of :data:`NEEDS`: declared ones plus those its inputs imply.
    :ivar inputs: the inputs its function names (:data:`rlzoo.contract.kinds.KINDS`).
    :ivar description: one line shown by ``rlzoo list``.
    :ivar paper: reference, e.g. ``"arXiv:2402.03300"``.
    :ivar plugin: the plugin that registered it (``distribution:entry-point`` or a name).
    :ivar package: the distribution the plugin came from.
    :ivar meta: any further keyword given to ``register``; a tool's :class:`~rlzoo.contract.tool_schema.Tool`
        is ``meta["tool"]``.
    :ivar registry: the registry it was added to (``None`` for a component made by hand): where
        calling an environment finds the registered tools.
    """

    kind: str
    name: str
    fn: Any
    params: type | None = None
    needs: frozenset[str] = frozenset()
    description: str = ""
    paper: str | None = None
    aliases: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    retired_aliases: dict[str, str] = field(default_factory=dict)
    plugin: str = ""
    package: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    registry: Any = field(default=None, repr=False, compare=False)

    def default_params(self) -> Any:
        """An instance of the parameter dataclass with every default, or ``None``."""
        return self.params() if self.params is not None else None

    def bind(self, params: Any = None) -> BoundComponent:
        """The component as the engine calls it: ``bound(**inputs)`` passes the inputs
        ``fn`` names, ``params`` (defaults when ``None``), and checks the output."""
        return BoundComponent(self, params)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn`` directly (no output check); keyword arguments that name parameters
        build ``params``; keywords that are inputs of the kind but not named by ``fn`` are
        dropped (so every component of a kind can be called with the same keywords).

        ``registry.get("policy_loss", "ppo_clip")(logp, old, adv, mask, clip_high=0.28)``

        An environment gets the inputs a run passes unless they are given: ``tools``, every
        tool of its registry by name, and ``tool_style="plain"`` (the format of a run
        without a chat template): ``registry.get("environment", "tools")(tools=["calculator"])``.
        """
        if self.params is not None and "params" not in kwargs:
            names = {f.name for f in dataclasses.fields(self.params)}
            given = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
            kwargs["params"] = self.params(**given)
        if self.kind == "environment":
            if "tools" not in kwargs and self.registry is not None:
                kwargs["tools"] = ToolsByName({c.name: c.meta["tool"] for c in self.registry.components("tool")})
            kwargs.setdefault("tool_style", "plain")
        known = KINDS[self.kind].inputs
        kwargs = {k: v for k, v in kwargs.items() if k not in known or k in self.inputs}
        return self.fn(*args, **kwargs)


def _tool_meta(name: str, fn: Any, meta: dict[str, Any], description: str, who: str) -> tuple[dict, str]:
    """A tool's meta with its :class:`rlzoo.contract.tool_schema.Tool` (``meta["tool"]``) and its listing line.

    :raises PluginError: the schema cannot be built or a limit is bad, naming the plugin.
    """
    try:
        tool = registered_tool(name, fn, meta, description)
    except (TypeError, ValueError) as exc:
        raise PluginError(f"plugin {who!r}: {exc}") from exc
    return {**meta, "tool": tool}, description or tool.schema["function"]["description"]


class Registry:
    """Components by kind and name; built by :func:`rlzoo.contract.loading.build_registry`."""

    def __init__(self) -> None:
        self._components: dict[str, dict[str, Component]] = {k: {} for k in KINDS}
        self._aliases: dict[str, dict[str, str]] = {k: {} for k in KINDS}
        self.load_errors: list[PluginError] = []
        """Plugins that failed to import or register, and components refused at registration
        (:class:`~rlzoo.core.errors.RefusedComponentError`); the rest of the registry is usable."""

    def refuse(self, error: RefusedComponentError) -> None:
        """Record a component refused at registration: it stays out of the registry, and
        :meth:`get` of its name says why."""
        self.load_errors.append(error)

    def refused(self, kind: str | None = None) -> list[RefusedComponentError]:
        """The components refused at registration (of ``kind``, or all)."""
        return [e for e in self.load_errors
                if isinstance(e, RefusedComponentError) and (kind is None or e.kind == kind)]

    def add(
        self,
        kind: str,
        name: str,
        fn: Any,
        *,
        params: type | None = None,
        needs: tuple[str, ...] | frozenset[str] | list[str] = (),
        description: str = "",
        paper: str | None = None,
        aliases: tuple[str, ...] | list[str] = (),
        retired_aliases: dict[str, str] | None = None,
        plugin: str = "",
        package: str = "",
        **meta: Any,
    ) -> Component:
        """Add a component; the ``register`` callback of the hooks forwards here.

        :param kind: the component kind (a key of :data:`rlzoo.contract.kinds.KINDS`).
        :param name: the name users choose it by; unique within its kind.
        :param fn: the implementation.
        :param params: a dataclass of parameters with defaults; ``__post_init__`` may raise
            ``ValueError`` for out-of-range values (reported with the parameter named).
        :param needs: subset of :data:`NEEDS` beyond what the function's inputs imply
            (``groups``; what an extension reads from the batch).
        :param description: one line for ``rlzoo list``.
        :param paper: a reference (arXiv id or URL).
        :param aliases: further names that resolve to this component.
        :param retired_aliases: former names that no longer resolve, each with the reason;
            choosing one is an error that names this component instead.
        :param plugin: set by the plugin manager: who registered it.
        :param package: set by the plugin manager: the distribution it came from.
        :raises PluginError: duplicate name or alias, unknown kind or need, bad params, a
            signature that does not fit the kind's inputs (see :mod:`rlzoo.contract.checks`).
        """
        who = plugin or "<unknown plugin>"
        if kind not in self._components:
            raise PluginError(f"plugin {who!r} registered unknown kind {kind!r}")
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin {who!r} registered a {kind} with an empty name")
        bad_needs = set(needs) - NEEDS
        if bad_needs:
            raise PluginError(
                f"plugin {who!r}: {kind} {name!r} declares unknown needs {sorted(bad_needs)}; "
                f"valid needs are {sorted(NEEDS)}"
            )
        if params is not None and not dataclasses.is_dataclass(params):
            raise PluginError(f"plugin {who!r}: {kind} {name!r} params must be a dataclass")
        inputs: tuple[str, ...] = ()
        declared = frozenset(needs)
        if kind == "tool":  # its arguments come from the model, described by the schema of its signature
            meta, description = _tool_meta(name, fn, meta, description, who)
        elif kind != "algorithm":
            inputs = inspect_inputs(kind, name, fn, params is not None, who)
            check_declared_needs(kind, name, declared, inputs, who)
        for label in (name, *aliases):
            owner = self._owner(kind, label)
            if owner is not None:
                installed = [p for p in (who, owner.plugin)  # third-party entry points, not rlzoo's own
                             if not p.startswith(("module:", "file:", "<", "rlzoo:", "extension:"))]
                hint = (f"; rename one of them (register another name), or skip one with "
                        f"RLZOO_DISABLE_PLUGINS={installed[0]} or uninstall its package"
                        if installed else "; rename one of them (register another name)")
                raise DuplicateComponentError(
                    f"{kind} name {label!r} is registered twice: by plugin {owner.plugin!r} "
                    f"({owner.package}) and by plugin {who!r} ({package or '?'}){hint}", kind=kind
                )
        component = Component(
            kind=kind,
            name=name,
            fn=fn,
            params=params,
            needs=declared | derived_needs(kind, inputs),
            description=description,
            paper=paper,
            aliases=tuple(aliases),
            inputs=inputs,
            retired_aliases=dict(retired_aliases or {}),
            plugin=plugin,
            package=package,
            meta=dict(meta),
            registry=self,
        )
        self._components[kind][name] = component
        for alias in aliases:
            self._aliases[kind][alias] = name
        return component

    def _owner(self, kind: str, label: str) -> Component | None:
        if label in self._components[kind]:
            return self._components[kind][label]
        if label in self._aliases[kind]:
            return self._components[kind][self._aliases[kind][label]]
        return None

    def get(self, kind: str, name: str) -> Component:
        """The component ``name`` (or an alias of it) of ``kind``.

        :raises UnknownComponentError: listing the registered names, with a did-you-mean.
        """
        if kind not in self._components:
            raise UnknownComponentError(
                f"unknown component kind {kind!r}; kinds are {sorted(self._components)}"
            )
        component = self._owner(kind, str(name))
        if component is None:
            for refusal in self.refused(kind):
                if refusal.name == str(name):
                    raise UnknownComponentError(f"{kind} {name!r} is not registered: {refusal}")
            for candidate in self._components[kind].values():
                if str(name) in candidate.retired_aliases:
                    raise UnknownComponentError(
                        f"{kind} {name!r} was retired: use {candidate.name!r} "
                        f"({candidate.retired_aliases[str(name)]})")
            choices = self.names(kind, aliases=True)
            listed = ", ".join(
                f"{c.name} [{', '.join(c.aliases)}]" if c.aliases else c.name
                for c in sorted(self._components[kind].values(), key=lambda c: c.name)
            ) or "(none registered)"
            failed = ""
            unloaded = [e for e in self.load_errors if not isinstance(e, RefusedComponentError)]
            if unloaded:  # the component may live in a plugin that did not load
                failed = (f" {len(unloaded)} plugin(s) failed to load and may hold it: "
                          + "; ".join(str(e) for e in unloaded))
            refused = self.refused(kind)
            if refused:
                failed += (" Refused at registration: "
                           + ", ".join(f"{kind} {e.name!r} (plugin {e.plugin!r})" for e in refused) + ".")
            raise UnknownComponentError(
                f"unknown {kind} {name!r}; registered: {listed}.{did_you_mean(name, choices)}{failed}"
            )
        return component

    def names(self, kind: str, aliases: bool = False) -> list[str]:
        """Sorted primary names of ``kind`` (plus aliases when ``aliases``)."""
        out = list(self._components[kind])
        if aliases:
            out += list(self._aliases[kind])
        return sorted(out)

    def components(self, kind: str | None = None) -> list[Component]:
        """All components, or those of one kind, in registration order per kind."""
        kinds = [kind] if kind is not None else list(self._components)
        return [c for k in kinds for c in self._components[k].values()]

    def __contains__(self, key: tuple[str, str]) -> bool:
        kind, name = key
        return kind in self._components and self._owner(kind, name) is not None
