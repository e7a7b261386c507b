"""CUDA driver compatibility: is the installed driver new enough for the cubins NVRTC builds?

A cubin built by NVRTC of CUDA major version N loads only on a driver that supports CUDA N (minor
versions are compatible: an NVRTC 12.8 cubin runs on a 12.4 driver, an NVRTC 13.x cubin does not
run on any CUDA 12 driver). Without this check the failure shows up as an obscure
``cuModuleLoadData`` error (e.g. ``CUDA_ERROR_UNSUPPORTED_PTX_VERSION``) after a compile; with it,
the first module load raises :class:`~gdnjit.errors.CudaError` naming both versions and the fix.

The driver is queried once per process (``cuDriverGetVersion`` through :mod:`gdnjit.libcuda`).
:func:`compatible` and :func:`message` are pure functions.
"""

from __future__ import annotations

import functools
import logging

from .errors import CudaError

log = logging.getLogger("gdnjit")

# The first driver branch of each CUDA major version (Linux), for the error message.
MIN_DRIVER_BRANCH = {12: "525", 13: "580"}


def format_driver_version(driver_version: int) -> str:
    """``12040`` -> ``"12.4"`` (the encoding of ``cuDriverGetVersion``: 1000 * major + 10 * minor)."""
    return f"{driver_version // 1000}.{driver_version % 1000 // 10}"


def nvrtc_major(nvrtc_version: str) -> int:
    """The major version of an NVRTC ``"major.minor"`` string; ValueError for anything else."""
    head = str(nvrtc_version).split(".", 1)[0]
    if not head.isdigit():
        raise ValueError(f"nvrtc_version: expected 'major.minor', got {nvrtc_version!r}")
    return int(head)


def compatible(driver_version: int, nvrtc_major: int) -> bool:
    """True if a driver reporting ``driver_version`` (``cuDriverGetVersion``) loads cubins built by
    NVRTC of CUDA major version ``nvrtc_major``: the driver's CUDA major must be at least NVRTC's."""
    return driver_version // 1000 >= nvrtc_major


def message(driver_version: int, nvrtc_version: str) -> str:
    """The error text for an incompatible driver: both versions, and the two ways out."""
    major = nvrtc_major(nvrtc_version)
    driver = format_driver_version(driver_version)
    branch = MIN_DRIVER_BRANCH.get(major)
    branch = f"R{branch} or later; " if branch else ""
    text = (
        f"the CUDA driver supports CUDA {driver}, but gdnjit's cubins are built by NVRTC {nvrtc_version}, "
        f"which needs a CUDA {major} driver: cubins from NVRTC {major}.x do not load on a CUDA "
        f"{driver_version // 1000} driver. Either install a driver for CUDA {major}.0 or newer ({branch}on "
        f"data-center GPUs the cuda-compat-{major}-x forward-compatibility package also works), or compile "
        f"with an NVRTC that matches this driver: "
    )
    if driver_version // 1000 == 12:
        text += (
            'pip install "gdnjit[cu12]" "cuda-bindings>=12.8,<13" (the CUDA 12 NVRTC wheel, and the CUDA 12 '
            "Python bindings that load it). The NVRTC version is part of every cache key, so cubins built by "
            "NVRTC 13 are never used with NVRTC 12 and vice versa (docs/deploy.md)."
        )
    else:
        text += f"NVRTC {driver_version // 1000}.x with the matching cuda-bindings {driver_version // 1000}.x."
    return text


def _query_driver_version() -> int:
    """``cuDriverGetVersion`` (:mod:`gdnjit.libcuda`; raises when no driver can be loaded)."""
    from . import libcuda

    return libcuda.driver_version()


@functools.lru_cache(maxsize=1)
def driver_version() -> int | None:
    """The CUDA version the installed driver supports (e.g. ``13000``), read once per process;
    None if it cannot be read (no driver: the module load itself will report that)."""
    try:
        return _query_driver_version()
    except Exception as e:  # noqa: BLE001 - a missing driver is reported by the load that needs it
        log.debug("gdnjit: cannot read the CUDA driver version (%s: %s)", type(e).__name__, e)
        return None


_checked: set[str] = set()


def check_driver(nvrtc_version: str) -> None:
    """Raise :class:`CudaError` if the driver is too old for cubins from NVRTC ``nvrtc_version``.

    Cheap after the first call (the driver is queried once per process; a passing NVRTC version is
    remembered). Does nothing when the driver version cannot be read.
    """
    if nvrtc_version in _checked:
        return
    version = driver_version()
    if version is None:
        return
    if not compatible(version, nvrtc_major(nvrtc_version)):
        raise CudaError(message(version, nvrtc_version))
    _checked.add(nvrtc_version)


def reset() -> None:
    """Forget the cached driver version and checks (tests)."""
    driver_version.cache_clear()
    _checked.clear()
