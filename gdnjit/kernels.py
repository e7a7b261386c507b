"""From a spec and a call's compile-time params to a ready launcher: the JIT path.

spec -> dispatch (rules) -> variant -> disk cache (render + NVRTC on a miss) -> module load ->
:class:`~gdnjit.launch.Launcher`. Two in-process levels (FlashInfer/Triton lesson): ``resolve``
memoises (spec, params, facts, device) -> (launcher, grid) so the hot path is one dict lookup;
only a miss builds a Variant, hashes its key and touches the disk.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

from . import dispatch as _dispatch
from . import expr as _expr
from .cache import DiskCache
from .config import Config, get_config
from .driver import check_driver
from .errors import CudaError
from .launch import Launcher, load_function
from .spec import Spec
from .variant import Variant

log = logging.getLogger("gdnjit")

_launchers: dict[tuple, Launcher] = {}
_tuned: dict[int, Any] = {}  # device index -> TunedTable, loaded once per device
_resolved: dict[tuple, tuple[Launcher, int]] = {}
_RESOLVED_MAX = 65536
_dependent: list[dict] = []  # op modules' memos of resolve() results (gdn's validated-signature path)


def register_memo(memo: dict) -> dict:
    """Have :func:`clear_launcher_cache` clear ``memo`` too (it holds launchers from :func:`resolve`)."""
    _dependent.append(memo)
    return memo


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


def clear_launcher_cache() -> None:
    """Forget loaded launchers and dispatch results (e.g. after changing the configuration)."""
    _launchers.clear()
    _resolved.clear()
    _tuned.clear()
    for memo in _dependent:
        memo.clear()


def build_entry(variant: Variant, config: Config):
    """The cache entry (cubin + metadata) of ``variant``, compiling on a miss. Needs no GPU."""
    return DiskCache(config).get_or_build(variant.name, variant.key_fields, variant.build)


def get_launcher(variant: Variant, device_index: int, config: Config | None = None) -> Launcher:
    """A launcher for ``variant`` on ``device_index`` (loaded once per process and device)."""
    memo = (variant.spec.name, variant.params, variant.tunables, variant.arch, device_index)
    hit = _launchers.get(memo)
    if hit is not None:
        return hit
    config = config or get_config()
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
    block = int(_expr.evaluate(dict(variant.spec.launch)["block"], values))
    smem = int(_expr.evaluate(dict(variant.spec.launch)["smem"], values))
    launcher = Launcher(entry.name, module, function, device_index, block, smem, variant.spec.args)
    _launchers[memo] = launcher
    return launcher


def choose_variant(spec: Spec, params: dict[str, Any], facts: dict[str, Any], arch: str,
                   tuned: Any = None) -> Variant:
    """The variant the dispatcher picks for these params and runtime facts on ``arch``
    (a tuned table's entry when ``tuned`` has one, else the spec's rules)."""
    choice = tuned.lookup(spec.name, params, facts) if tuned is not None else None
    tunables, _ = _dispatch.select(spec, params, facts, tuned=choice)
    return Variant.make(spec, params, tunables, arch)


def tuned_table(device_index: int):
    """The tuned table(s) for this device's GPU model, loaded once per device."""
    table = _tuned.get(device_index)
    if table is None:
        from .tuned import load_tables

        table = _tuned[device_index] = load_tables(get_config(), device_info(device_index).name)
    return table


def resolve(spec: Spec, params: tuple, facts: tuple, device_index: int) -> tuple[Launcher, int]:
    """(launcher, grid) for a call. ``params`` in spec param order; ``facts`` in spec fact order
    without ``num_sms`` (taken from the device). Memoised: the steady state is one dict lookup."""
    memo = (spec.name, params, facts, device_index)
    hit = _resolved.get(memo)
    if hit is not None:
        return hit
    info = device_info(device_index)
    pdict = dict(zip(spec.param_names, params))
    fnames = [f for f in spec.facts if f != "num_sms"]
    fdict = dict(zip(fnames, facts), num_sms=info.num_sms)
    variant = choose_variant(spec, pdict, fdict, info.arch, tuned_table(device_index))
    launcher = get_launcher(variant, device_index)
    ctx = dict(variant.values)
    ctx.update(fdict)
    grid = int(_expr.evaluate(dict(spec.launch)["grid"], ctx))
    if len(_resolved) >= _RESOLVED_MAX:
        _resolved.clear()
    _resolved[memo] = (launcher, grid)
    return launcher, grid
