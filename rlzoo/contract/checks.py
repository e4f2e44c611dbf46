"""The contract checking itself: signatures at registration, outputs at every call.

A component's function names the inputs it wants (:data:`rlzoo.contract.hookspecs.INPUTS`);
:func:`inspect_inputs` reads and validates that signature once, when the component
registers, and derives the needs it implies. :class:`BoundComponent` is how the engine
calls a component: keyword arguments filtered to the ones the function names, ``params``
bound, and the output checked against the kind's contract, so a plugin returning the
wrong shape or no ``clipfrac`` is stopped with its name and package, not a traceback
three stages later.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Callable, Protocol

import torch

from rlzoo.core.errors import ConfigError, PluginError, TrainingError, did_you_mean
from rlzoo.contract.kinds import KINDS


class Bindable(Protocol):
    """What :class:`BoundComponent` reads of a component (a :class:`rlzoo.contract.registry.Component`)."""

    kind: str
    name: str
    fn: Any
    params: type | None
    inputs: tuple[str, ...]
    package: str
    plugin: str

    def default_params(self) -> Any: ...


def inspect_inputs(kind: str, name: str, fn: Any, has_params: bool, who: str) -> tuple[str, ...]:
    """The inputs ``fn`` names, in signature order (``params`` excluded).

    A class registered for a kind with :attr:`rlzoo.contract.kinds.Kind.setup_inputs` (a scorer built
    once per run) is read twice: its constructor may name the setup inputs and ``params``,
    its ``__call__`` the kind's inputs (returned).

    :raises PluginError: ``fn`` is not callable, takes ``*args`` / ``**kwargs``, names a
        required parameter that is not an input of ``kind``, or lacks ``params`` although
        the component declares a parameter dataclass.
    """
    label = f"plugin {who!r}: {kind} {name!r}"
    if not callable(fn):
        raise PluginError(f"{label} is a {type(fn).__name__}, not a function or class")
    setup = KINDS[kind].setup_inputs
    if setup and isinstance(fn, type):
        _named_inputs(label, fn, setup, has_params, f"{KINDS[kind].hook}, constructor of a scorer class")
        return _named_inputs(label, fn.__call__, KINDS[kind].inputs, False, KINDS[kind].hook, skip_self=True)
    return _named_inputs(label, fn, KINDS[kind].inputs, has_params, KINDS[kind].hook)


def setup_names(fn: type) -> tuple[str, ...]:
    """The setup inputs a scorer class's constructor names (``params`` excluded)."""
    return tuple(p for p in inspect.signature(fn).parameters if p != "params")


def _named_inputs(label: str, fn: Any, known: dict[str, Any], has_params: bool, where: str,
                  skip_self: bool = False) -> tuple[str, ...]:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise PluginError(f"{label}: cannot read the signature of {fn!r} ({exc})") from exc
    inputs = []
    takes_params = False
    for index, parameter in enumerate(signature.parameters.values()):
        if skip_self and index == 0:
            continue
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise PluginError(f"{label} takes {'*' if parameter.kind == parameter.VAR_POSITIONAL else '**'}"
                              f"{parameter.name}: inputs are passed by name, so name the ones it uses "
                              f"({', '.join(known) or 'none for this kind'}; see rlzoo.contract.kinds.KINDS)")
        if parameter.name == "params" and not skip_self:
            takes_params = True
        elif parameter.name in known:
            inputs.append(parameter.name)
        elif parameter.default is parameter.empty:
            raise PluginError(f"{label} takes {parameter.name!r}, which is not an input of its kind."
                              f"{did_you_mean(parameter.name, known)} The engine passes "
                              f"{', '.join(known) or 'no inputs'}{' and params' if has_params else ''} ({where})")
        elif close_input(parameter.name, known):
            raise PluginError(f"{label} takes {parameter.name!r} (with a default), which is not an input of its "
                              f"kind, so the engine never passes it.{did_you_mean(parameter.name, known)} The "
                              f"engine passes {', '.join(known)}{' and params' if has_params else ''} ({where})")
    if has_params and not takes_params:
        raise PluginError(f"{label} declares a parameter dataclass but its function takes no 'params'")
    return tuple(inputs)


CLOSE_INPUT = 0.85
"""How similar (``difflib`` ratio) a defaulted parameter's name must be to an input's to be
refused as its misspelling: ``group_id``/``group_ids`` 0.94, ``ref_logprobs``/``ref_logp`` 0.80 (not
refused), ``mask``/``loss_mask`` 0.62."""


def close_input(name: str, known: dict[str, Any]) -> bool:
    """``name`` looks like a misspelt input of ``known`` (``group_id`` for ``group_ids``,
    ``token_reward`` for ``token_rewards``): a parameter with a default and such a name would
    silently never be passed. Closer than :func:`rlzoo.core.errors.did_you_mean`'s threshold, so
    a parameter of the function's own (``scale``, ``eps``) is never taken for one."""
    return bool(difflib.get_close_matches(name, list(known), n=1, cutoff=CLOSE_INPUT))


def derived_needs(kind: str, inputs: tuple[str, ...]) -> frozenset[str]:
    """The needs implied by the inputs a component names (e.g. ``values`` -> ``critic``)."""
    inputs_of = KINDS[kind].inputs
    return frozenset(inputs_of[name].need for name in inputs if inputs_of[name].need)


def check_declared_needs(kind: str, name: str, declared: frozenset[str], inputs: tuple[str, ...],
                         who: str) -> None:
    """A declared need whose inputs the function never takes would be computed for nothing.

    :raises PluginError: naming the need and the inputs that would carry it.
    """
    for need in sorted(declared):
        carriers = [input_name for input_name, spec in KINDS[kind].inputs.items() if spec.need == need]
        if carriers and not set(carriers) & set(inputs):
            raise PluginError(
                f"plugin {who!r}: {kind} {name!r} declares needs {need!r} but its function takes none of "
                f"{', '.join(carriers)}: the run would compute them for nothing; name the input instead")


def _shape(value: Any) -> str:
    return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__


class BoundComponent:
    """A component with its parameters bound, called by the engine with keyword inputs.

    ``bound(**available)`` passes the inputs the function names (the rest are ignored)
    and checks the output against the kind's contract.
    """

    def __init__(self, component: Bindable, params: Any = None) -> None:
        self.component = component
        self.params = params if params is not None else component.default_params()
        output = KINDS[component.kind].output
        self._check = _CHECKS[output] if output else None

    @property
    def name(self) -> str:
        return self.component.name

    def __call__(self, **available: Any) -> Any:
        component = self.component
        kwargs = {name: available[name] for name in component.inputs if name in available}
        if component.params is not None:
            kwargs["params"] = self.params
        result = component.fn(**kwargs)
        if self._check is not None:
            self._check(self, result, available)
        return result

    def construct(self, **inputs: Any) -> Any:
        """Call a factory component (a task, a rollout backend, an environment, a KL
        controller) with ``inputs``: a ``ValueError`` / ``OSError`` it raises is a config error
        naming its config key and name."""
        try:
            return self(**inputs)
        except ConfigError:
            raise
        except (ValueError, OSError) as exc:
            raise ConfigError(f"{KINDS[self.component.kind].config_path} {self.name!r}: {exc}") from exc

    def build(self, **setup: Any) -> "BoundComponent | BuiltComponent":
        """For a scorer class (its kind has setup inputs and ``fn`` is a class): the instance
        built once, from the setup inputs its constructor names and ``params``; otherwise
        this bound component itself. Call it once per run."""
        if KINDS[self.component.kind].setup_inputs and isinstance(self.component.fn, type):
            return BuiltComponent(self, setup)
        return self

    def fail(self, what: str) -> TrainingError:
        """An error naming the component, its package and the broken contract."""
        c = self.component
        return TrainingError(f"{c.kind} {c.name!r} (package {c.package or '?'}, plugin {c.plugin or '?'}) "
                             f"{what} ({KINDS[c.kind].hook} in rlzoo.contract.hookspecs)")


class BuiltComponent:
    """A scorer class built once per run (:meth:`BoundComponent.build`), called like a
    bound component: ``built(**available)`` passes the inputs its ``__call__`` names.

    :ivar instance: the built object; it may define ``state_dict()`` / ``load_state_dict()``
        (kept in checkpoints), ``metrics()`` (logged each step) and a ``training`` flag.
    """

    def __init__(self, bound: BoundComponent, setup: dict[str, Any]) -> None:
        component = self.component = bound.component
        self.params = bound.params
        kwargs = {name: setup[name] for name in setup_names(component.fn) if name in setup}
        if component.params is not None:
            kwargs["params"] = bound.params
        self.instance = component.fn(**kwargs)

    @property
    def name(self) -> str:
        return self.component.name

    def __call__(self, **available: Any) -> Any:
        return self.instance(**{name: available[name] for name in self.component.inputs if name in available})


def _expect_matrix(bound: BoundComponent, value: Any, shape: torch.Size, what: str) -> None:
    if not isinstance(value, torch.Tensor) or value.shape != shape or not value.is_floating_point():
        raise bound.fail(f"returned {what} of shape {_shape(value)}"
                         f"{'' if not isinstance(value, torch.Tensor) else ' ' + str(value.dtype)}; "
                         f"the contract is a float tensor of shape {tuple(shape)}")


def _expect_metrics(bound: BoundComponent, metrics: Any) -> None:
    if not isinstance(metrics, dict):
        raise bound.fail(f"returned metrics of type {type(metrics).__name__}; the contract is a dict "
                         "of scalar tensors")
    missing = [key for key in KINDS[bound.component.kind].required_metrics if key not in metrics]
    if missing:
        raise bound.fail(f"returned no {', '.join(repr(k) for k in missing)} metric (got "
                         f"{', '.join(sorted(map(str, metrics))) or 'none'})")
    for key, value in metrics.items():
        if not (isinstance(value, (int, float)) or (isinstance(value, torch.Tensor) and value.numel() == 1)):
            raise bound.fail(f"returned metric {key!r} of shape {_shape(value)}; metrics are scalars")


def _loss_and_metrics(shape_of: str) -> Callable[[BoundComponent, Any, dict[str, Any]], None]:
    def check(bound: BoundComponent, result: Any, available: dict[str, Any]) -> None:
        if not (isinstance(result, tuple) and len(result) == 2):
            raise bound.fail(f"returned {type(result).__name__}; the contract is (loss, metrics)")
        _expect_matrix(bound, result[0], available[shape_of].shape, "a per-token loss")
        _expect_metrics(bound, result[1])

    return check


def _check_advantage(bound: BoundComponent, result: Any, available: dict[str, Any]) -> None:
    if not (isinstance(result, tuple) and len(result) == 2):
        raise bound.fail(f"returned {type(result).__name__}; the contract is (advantages, returns)")
    shape = available["response_mask"].shape
    _expect_matrix(bound, result[0], shape, "advantages")
    _expect_matrix(bound, result[1], shape, "returns")


def _check_kl(bound: BoundComponent, result: Any, available: dict[str, Any]) -> None:
    reference = available.get("logp")
    shape = reference.shape if reference is not None else available["logits"].shape[:2]
    _expect_matrix(bound, result, shape, "a per-token KL")


def _check_weights(bound: BoundComponent, result: Any, available: dict[str, Any]) -> None:
    if not (isinstance(result, tuple) and len(result) == 2):
        raise bound.fail(f"returned {type(result).__name__}; the contract is (weights, metrics)")
    _expect_matrix(bound, result[0], available["response_mask"].shape, "weights")
    _expect_metrics(bound, result[1])


def _check_scalar(bound: BoundComponent, result: Any, available: dict[str, Any]) -> None:
    if not isinstance(result, torch.Tensor) or result.numel() != 1:
        raise bound.fail(f"returned {_shape(result)}; the contract is a scalar tensor")


_CHECKS: dict[str, Callable[[BoundComponent, Any, dict[str, Any]], None]] = {
    "advantages_returns": _check_advantage,
    "loss_metrics": _loss_and_metrics("response_mask"),
    "kl": _check_kl,
    "weights_metrics": _check_weights,
    "scalar": _check_scalar,
}
"""Output contract (:data:`rlzoo.contract.kinds.OUTPUTS`) -> its check."""


def build_rewards(rewards: list[tuple[BoundComponent, float]],
                  **setup: Any) -> list[tuple[BoundComponent | BuiltComponent, float]]:
    """The reward functions of a run with their weights, each scorer class built once from
    ``setup`` (``device``, ``tokenizer``: :attr:`rlzoo.contract.kinds.Kind.setup_inputs`); a
    ``ValueError`` / ``OSError`` of a scorer's constructor is a config error naming it."""
    out = []
    for bound, weight in rewards:
        try:
            out.append((bound.build(**setup), weight))
        except (ConfigError, ValueError, OSError) as exc:
            raise ConfigError(f"reward {bound.name!r}: {exc}") from exc
    return out
