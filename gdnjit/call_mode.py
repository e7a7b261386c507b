"""Calling modes: one way of calling a spec's kernel, declared once, by name.

A spec declares its kernel interface once: every param and argument by name, with defaults for those a caller
may leave out (``param_defaults``; ``args`` written ``TYPE = DEFAULT``: a null pointer, a zero stride, the off
value of a flag). A :class:`CallMode` is one calling mode of that kernel (the native decode, an engine's varlen
step, the ReplaySSM commit, ...): it names the pointer arguments it passes per call, and each call it builds
names only the params and args the mode sets; the spec's defaults fill in the rest. A name the spec does not
declare, or a required one left out, fails by name when the call is built (:class:`KernelInterfaceError`).

The pointers a bound launch takes per call are the spec's leading ``ptr`` args. A mode passes the values of its
own pointers in the order it declared them; :meth:`CallMode.pack` puts them where the spec has them (zeros for
the others), so no module depends on the position of an argument in another module's tuple. ``pack`` is a
function generated for the mode (Triton's generated binders: no per-call loop over names).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from .launch import leading_pointers
from .runner import KernelCall, KernelInterfaceError
from .spec import Spec


def _make_packer(mode: str, names: Sequence[str], order: Sequence[str]) -> Callable[..., tuple]:
    """``f(*values)``: the values of ``names``, placed at their positions in ``order`` (0 elsewhere)."""
    body = ", ".join(n if n in names else "0" for n in order)
    src = f"def pack({', '.join(names)}):\n    return ({body},)\n"
    scope: dict[str, Any] = {}
    exec(compile(src, f"<gdnjit pointer packer: {mode}>", "exec"), scope)  # noqa: S102 - names are identifiers
    return scope["pack"]


class CallMode:
    """One calling mode of ``spec``'s kernel (``name``: for messages), passing the pointer args ``pointers`` per
    call (a subset of the spec's leading ``ptr`` args, in the mode's own order). Built once, at import."""

    def __init__(self, spec: Spec, name: str, pointers: Sequence[str]):
        self.spec = spec
        self.name = name
        self.spec_pointers = tuple(n for n, _ in spec.args[:leading_pointers(spec.args)])
        unknown = [p for p in pointers if p not in self.spec_pointers]
        if unknown or len(set(pointers)) != len(pointers):
            raise KernelInterfaceError(
                f"spec {spec.name}, mode {name}: pointers: expected distinct names of the leading pointer args "
                f"{list(self.spec_pointers)}, got {'unknown ' + str(unknown) if unknown else 'repeated names'}")
        self.pointers = tuple(pointers)
        self.pack = _make_packer(f"{spec.name} {name}", self.pointers, self.spec_pointers)
        self._arg_names = tuple(n for n, _ in spec.args)
        self._arg_defaults = dict(spec.arg_defaults)
        self._param_defaults = dict(spec.param_defaults)
        self._required_args = tuple(n for n in self._arg_names if n not in self._arg_defaults)
        self._required_params = tuple(n for n in spec.param_names if n not in self._param_defaults)

    def call(self, params: Mapping[str, Any], facts: Mapping[str, int], args: Mapping[str, Any], device: int,
             pdl: bool = False) -> KernelCall:
        """The :class:`KernelCall` of one call: ``params`` and ``args`` name only what this mode sets (the spec's
        defaults complete them); ``facts`` are the spec's runtime facts. KernelInterfaceError naming a name the spec
        does not declare, a required one left out, or a non-null pointer this mode does not pass per call (a bound
        launch would drop it)."""
        self._check("params", params, self.spec.param_names, self._required_params)
        self._check("args", args, self._arg_names, self._required_args)
        stray = [n for n in self.spec_pointers if n not in self.pointers and args.get(n, 0)]
        if stray:
            raise KernelInterfaceError(f"spec {self.spec.name}, mode {self.name}: args: pointer(s) {stray} set but not "
                                       f"among the mode's per-call pointers {list(self.pointers)}")
        full_params = {n: params[n] if n in params else self._param_defaults[n] for n in self.spec.param_names}
        full_args = {n: args[n] if n in args else self._arg_defaults[n] for n in self._arg_names}
        return KernelCall(self.spec, full_params, dict(facts), full_args, device, pdl=pdl)

    def _check(self, what: str, given: Mapping[str, Any], declared: Sequence[str], required: Sequence[str]) -> None:
        unknown = [n for n in given if n not in declared]
        missing = [n for n in required if n not in given]
        if unknown or missing:
            parts = ([f"names the spec does not declare {unknown}"] if unknown else []) + (
                [f"required names left out {missing}"] if missing else [])
            raise KernelInterfaceError(f"spec {self.spec.name}, mode {self.name}: {what}: {' and '.join(parts)} "
                                       f"(gdnjit/specs/{self.spec.name}.yaml declares them, with their defaults)")

    def pointer_values(self, call: KernelCall) -> tuple:
        """The per-call pointer tuple of a built ``call`` (its values of the spec's leading pointer args)."""
        return tuple(call.args[n] for n in self.spec_pointers)
