"""The one runner every op launches through: a named call -> variant -> launcher -> launch.

An op module only validates its arguments and builds a :class:`KernelCall`: its spec's params,
facts and kernel arguments, each by the name the spec declares. The runner does the rest for every
op alike: dispatch (rules or a tuned table) -> :class:`~gdnjit.variant.Variant` -> disk cache
(render + NVRTC on a miss) -> module load -> :class:`~gdnjit.launch.Launcher`, packs the arguments
by name into the launch buffer, and launches on the current torch stream, with programmatic
dependent launch when the call asks for it.

Two in-process levels (FlashInfer/Triton lesson): ``resolve`` memoises (spec, params, facts, device)
-> (launcher, grid), so the steady state is one dict lookup; only a miss builds a Variant, hashes its
key and touches the disk. The runner owns every in-process cache, also the memos an op keeps of
bound launches (:meth:`Runner.memo`), and clears them all when the process-wide configuration is
replaced (:meth:`Runner.sync`, a pointer comparison per call): no lower layer clears them.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Mapping, Sequence

from . import dispatch as _dispatch
from . import expr as _expr
from .cache import DiskCache
from .config import Config, get_config
from .driver import check_driver
from .errors import CudaError
from .launch import BoundLaunch, Launcher, load_function
from .spec import Spec
from .variant import Variant

log = logging.getLogger("gdnjit")


class KernelInterfaceError(ValueError):
    """A call's names do not match its spec's kernel interface (params, facts or args)."""


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """One kernel launch, named end to end.

    ``params``: every param of ``spec`` by name (compile-time values); ``facts``: the spec's runtime
    facts by name, without ``num_sms`` (the device's); ``args``: every kernel argument by its name in
    the spec's ``args``; ``device``: the CUDA device index; ``pdl``: launch with programmatic
    dependent launch (only for kernels that wait on ``griddepcontrol`` before touching memory); ``pinned``:
    tunables the op sets over the dispatcher's choice, by name (a launch that must agree with another launch of the
    same call: the lazy rows form's prep takes its step's window), None for none."""

    spec: Spec
    params: Mapping[str, Any]
    facts: Mapping[str, int]
    args: Mapping[str, Any]
    device: int
    pdl: bool = False
    pinned: Mapping[str, Any] | None = None

    def param_values(self) -> tuple:
        """The params in spec order (KernelInterfaceError naming any missing or unknown name)."""
        return _ordered(self.spec, "params", self.spec.param_names, self.params)

    def fact_values(self) -> tuple:
        """The facts in spec order, ``num_sms`` left out (the runner takes it from the device)."""
        return _ordered(self.spec, "facts", tuple(f for f in self.spec.facts if f != "num_sms"), self.facts)

    def arg_values(self) -> tuple:
        """The kernel arguments in the order of the spec's ``args`` (the launch buffer's layout)."""
        return _ordered(self.spec, "args", tuple(n for n, _ in self.spec.args), self.args)


def _ordered(spec: Spec, what: str, names: Sequence[str], given: Mapping[str, Any]) -> tuple:
    if len(given) != len(names) or any(n not in given for n in names):
        missing = [n for n in names if n not in given]
        unknown = [n for n in given if n not in names]
        raise KernelInterfaceError(
            f"spec {spec.name}: {what}: expected exactly the names {list(names)} (gdnjit/specs/{spec.name}.yaml), "
            f"got {'missing ' + str(missing) if missing else ''}{' and ' if missing and unknown else ''}"
            f"{'unknown ' + str(unknown) if unknown else ''}")
    return tuple(given[n] for n in names)


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    arch: str
    num_sms: int


def arch_for_capability(major: int, minor: int) -> str:
    """The NVRTC target for a compute capability: plain ``sm_90`` on Hopper (no sm_90a features are
    used), the arch-specific ``sm_<NNN>a`` from Blackwell on (hardware FP4 conversion)."""
    return f"sm_{major}{minor}" if major < 10 else f"sm_{major}{minor}a"


@functools.lru_cache(maxsize=None)
def device_info(index: int) -> DeviceInfo:
    """Properties read once per device (never per call)."""
    import torch

    prop = torch.cuda.get_device_properties(index)
    return DeviceInfo(index, prop.name, arch_for_capability(prop.major, prop.minor), prop.multi_processor_count)


def supports_pdl(index: int) -> bool:
    """Whether kernels on this device can be launched with programmatic dependent launch
    (``griddepcontrol``: compute capability 9.0 and newer)."""
    return int(device_info(index).arch[3:].rstrip("af")) >= 90


def build_entry(variant: Variant, config: Config):
    """The cache entry (cubin + metadata) of ``variant``, compiling on a miss. Needs no GPU."""
    return DiskCache(config).get_or_build(variant.name, variant.key_fields, variant.build)


def choose_variant(spec: Spec, params: dict[str, Any], facts: dict[str, Any], arch: str,
                   tuned: Any = None, batch_invariant: bool = False) -> Variant:
    """The variant the dispatcher picks for these params and runtime facts on ``arch``
    (a tuned table's entry when ``tuned`` has one, else the spec's rules); ``batch_invariant``: the
    same one for every batch size (``GDNJIT_BATCH_INVARIANT``)."""
    choice = tuned.lookup(spec.name, params, facts, batch_invariant) if tuned is not None else None
    tunables, _ = _dispatch.select(spec, params, facts, tuned=choice, batch_invariant=batch_invariant)
    return Variant.make(spec, params, tunables, arch)


def pin(variant: Variant, pinned: Mapping[str, Any] | None) -> Variant:
    """``variant`` with the ``pinned`` tunables set over its own (None or empty: itself); ValueError naming them
    when a name is not a tunable of the spec or the result is not valid for the variant's params."""
    if not pinned:
        return variant
    spec = variant.spec
    unknown = sorted(set(pinned) - set(spec.tunable_names))
    if unknown:
        raise KernelInterfaceError(f"spec {spec.name}: pinned: expected tunable names {list(spec.tunable_names)}, "
                                   f"got unknown {unknown}")
    tunables = dict(dict(variant.tunables), **pinned)
    params = dict(variant.params)
    if not spec.valid(params, tunables):
        raise ValueError(f"spec {spec.name}: pinned tunables {dict(pinned)}: expected a choice valid for the "
                         f"call's params over the dispatcher's {dict(variant.tunables)}, got an invalid one")
    return Variant.make(spec, params, tunables, variant.arch)


class Runner:
    """Resolves, binds and launches :class:`KernelCall` s; owns every in-process cache of launches."""

    RESOLVED_MAX = 65536

    def __init__(self) -> None:
        self._launchers: dict[tuple, Launcher] = {}
        self._resolved: dict[tuple, tuple[Launcher, int, Variant]] = {}
        self._tuned: dict[int, Any] = {}  # device index -> TunedTable, loaded once per device
        self._memos: list[dict] = []
        self._config: Config | None = None

    def memo(self) -> dict:
        """A dict an op may fill with what it derives from this runner's launches (bound launches per
        call signature); cleared together with the runner's own caches."""
        d: dict = {}
        self._memos.append(d)
        return d

    def clear(self) -> None:
        """Forget loaded launchers, dispatch results, tuned tables and the ops' memos."""
        self._launchers.clear()
        self._resolved.clear()
        self._tuned.clear()
        for d in self._memos:
            d.clear()

    def sync(self) -> Config:
        """The current configuration; the caches are dropped first if it was replaced since they were
        filled (``gdnjit.config.set_config``). Cheap enough for every call: one comparison."""
        config = get_config()
        if config is not self._config:
            self.clear()
            self._config = config
        return config

    def get_launcher(self, variant: Variant, device_index: int, config: Config | None = None) -> Launcher:
        """A launcher for ``variant`` on ``device_index`` (loaded once per process and device)."""
        memo = (variant.spec.name, variant.params, variant.tunables, variant.arch, device_index)
        hit = self._launchers.get(memo)
        if hit is not None:
            return hit
        config = config or self.sync()
        check_driver(variant.key_fields["nvrtc_version"])  # an old driver: a clear CudaError before any compile or load
        entry = build_entry(variant, config)
        try:
            module, function = load_function(entry.cubin, variant.spec.kernel_name, device_index)
        except CudaError as e:
            if entry.origin == "built":
                raise CudaError(f"variant {variant.describe()}: freshly compiled cubin failed to load: {e}") from None
            # A cached image the driver rejects is a cache problem: log, rebuild, overwrite (never raise for it).
            log.warning("gdnjit: cached cubin %s failed to load (%s); recompiling", entry.name, e)
            entry = build_entry(variant, dataclasses.replace(config, always_compile=True))
            module, function = load_function(entry.cubin, variant.spec.kernel_name, device_index)
        values = dict(variant.values)
        launch = dict(variant.spec.launch)
        block = int(_expr.evaluate(launch["block"], values))
        smem = int(_expr.evaluate(launch["smem"], values))
        launcher = Launcher(entry.name, module, function, device_index, block, smem, variant.spec.args)
        self._launchers[memo] = launcher
        return launcher

    def tuned_table(self, device_index: int):
        """The tuned table(s) for this device's GPU model, loaded once per device."""
        table = self._tuned.get(device_index)
        if table is None:
            from .tuned import load_tables

            table = self._tuned[device_index] = load_tables(self.sync(), device_info(device_index).name)
        return table

    def resolve(self, call: KernelCall) -> tuple[Launcher, int]:
        """(launcher, grid) for a call. Memoised: the steady state is one dict lookup."""
        spec = call.spec
        memo = self.resolve_key(call)
        hit = self._resolved.get(memo)
        if hit is not None:
            return hit[:2]
        info = device_info(call.device)
        pdict = dict(zip(spec.param_names, memo[1]))
        fdict = dict(call.facts, num_sms=info.num_sms)
        variant = pin(choose_variant(spec, pdict, fdict, info.arch, self.tuned_table(call.device),
                                     batch_invariant=self.sync().batch_invariant), call.pinned)
        launcher = self.get_launcher(variant, call.device)
        ctx = dict(variant.values)
        ctx.update(fdict)
        grid = int(_expr.evaluate(dict(spec.launch)["grid"], ctx))
        if len(self._resolved) >= self.RESOLVED_MAX:
            self._resolved.clear()
        self._resolved[memo] = (launcher, grid, variant)
        return launcher, grid

    def variant(self, call: KernelCall) -> Variant:
        """The variant :meth:`resolve` picks for a call (an op whose calls take one launch or two by the chosen
        tunables asks this first)."""
        self.resolve(call)
        return self._resolved[self.resolve_key(call)][2]

    @staticmethod
    def resolve_key(call: KernelCall) -> tuple:
        """The key :meth:`resolve` memoises a call's variant under: spec, params, facts, device and pinned tunables."""
        pinned = tuple(sorted(call.pinned.items())) if call.pinned else ()
        return call.spec.name, call.param_values(), call.fact_values(), call.device, pinned

    def bind(self, call: KernelCall) -> BoundLaunch:
        """A :class:`~gdnjit.launch.BoundLaunch` of ``call``: every argument packed once by name, the
        grid and PDL fixed; its calls take new values of the spec's leading pointer arguments (in spec order:
        :meth:`gdnjit.call_mode.CallMode.pack` places a mode's pointers by name)."""
        launcher, grid = self.resolve(call)
        return launcher.bind(grid, call.arg_values(), pdl=call.pdl)

    def launch(self, call: KernelCall) -> None:
        """Launch ``call`` on the current torch stream of its device."""
        self.sync()
        launcher, grid = self.resolve(call)
        launch = launcher.launch_pdl if call.pdl else launcher
        launch_on(call.device, launch, grid, call.arg_values())


def remember(memo: dict, sig, entry, config, max_entries: int) -> None:
    """Keep an op's validated launch ``entry`` under its metadata signature ``sig`` (None: not memoisable) in the
    bounded ``memo`` (cleared when full). Not with ``GDNJIT_CHECK_INDICES``: each call then validates in full."""
    if sig is None or config.check_indices:
        return
    if len(memo) >= max_entries:
        memo.clear()
    memo[sig] = entry


def launch_on(device: int, fn, *args) -> None:
    """``fn(*args)`` with ``device`` current (torch's current device is switched only when it differs)."""
    import torch

    if torch._C._cuda_getDevice() != device:
        with torch.cuda.device(device):
            fn(*args)
    else:
        fn(*args)


RUNNER = Runner()
