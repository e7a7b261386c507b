"""NVRTC compilation of rendered CUDA C++ to a cubin, with the ptxas resource report."""

from __future__ import annotations

import dataclasses
import functools
import re
import time

from .errors import CompileError

BASE_OPTIONS = ("-std=c++17", "--ptxas-options=-v", "-default-device", "--device-int128")
_ARCH_RE = re.compile(r"sm_(\d{2,3})([af]?)")


@dataclasses.dataclass(frozen=True)
class CompileResult:
    cubin: bytes
    log: str
    registers: int
    spill_bytes: int  # spill stores + spill loads
    stack_bytes: int
    smem_bytes: int
    compile_s: float


def check_arch(arch: str) -> tuple[int, str]:
    """Validate an arch string like ``sm_90``/``sm_90a``/``sm_100a``; returns (number, suffix)."""
    m = _ARCH_RE.fullmatch(arch) if isinstance(arch, str) else None
    if not m:
        raise ValueError(f"arch: expected a target like 'sm_90' or 'sm_100a', got {arch!r}")
    return int(m.group(1)), m.group(2)


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> str:
    """'major.minor' of the NVRTC that compiles (part of every cache key).

    Read from the installed NVRTC wheel that cuda-bindings loads (``nvidia-cuda-nvrtc`` for cuda-bindings 13,
    ``nvidia-cuda-nvrtc-cu12`` for 12), so a process whose kernels are all cached never loads the library
    (~60 ms of its first call on an H100 host); from the library itself where no such wheel is installed.
    Every compile checks that the library it loaded reports this version (:func:`compile_cubin`)."""
    return _wheel_nvrtc_version() or loaded_nvrtc_version()


def _wheel_nvrtc_version() -> str | None:
    from importlib import metadata

    try:
        major = int(metadata.version("cuda-bindings").split(".")[0])
        version = metadata.version("nvidia-cuda-nvrtc" if major >= 13 else f"nvidia-cuda-nvrtc-cu{major}")
    except (metadata.PackageNotFoundError, ValueError):
        return None
    parts = version.split(".")
    return f"{int(parts[0])}.{int(parts[1])}" if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit() else None


@functools.lru_cache(maxsize=None)
def loaded_nvrtc_version() -> str:
    """'major.minor' that the NVRTC library cuda-bindings loads reports (``nvrtcVersion``)."""
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return f"{major}.{minor}"


def options_for(arch: str) -> list[str]:
    check_arch(arch)
    return [f"--gpu-architecture={arch}", *BASE_OPTIONS]


def _check(err, what: str) -> None:
    from cuda.bindings import nvrtc

    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, msg = nvrtc.nvrtcGetErrorString(err)
        raise RuntimeError(f"{what} failed: {msg.decode(errors='replace')}")


def parse_ptxas(log: str) -> tuple[int, int, int, int]:
    """(registers, spill bytes, stack bytes, static smem bytes) from a ``-v`` ptxas log."""
    regs = max((int(x) for x in re.findall(r"Used (\d+) registers", log)), default=0)
    spills = sum(int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log))
    stack = max((int(x) for x in re.findall(r"(\d+) bytes stack frame", log)), default=0)
    smem = max((int(x) for x in re.findall(r"(\d+) bytes smem", log)), default=0)
    return regs, spills, stack, smem


def compile_cubin(source: str, arch: str, name: str) -> CompileResult:
    """Compile ``source`` for ``arch``; raises CompileError (with log and numbered source) on failure."""
    from cuda.bindings import nvrtc

    if loaded_nvrtc_version() != nvrtc_version():  # the cache key would name another NVRTC than the one compiling
        raise RuntimeError(
            f"NVRTC: the library cuda-bindings loaded reports {loaded_nvrtc_version()}, but the installed NVRTC wheel "
            f"is {nvrtc_version()} (the version cache keys are built with); install the NVRTC wheel that matches "
            f"the loaded library, or remove the wheel so the library's version is used")
    options = options_for(arch)
    t0 = time.perf_counter()
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        _, log_size = nvrtc.nvrtcGetProgramLogSize(prog)
        log_buf = b" " * log_size
        nvrtc.nvrtcGetProgramLog(prog, log_buf)
        log = log_buf.rstrip(b"\0 ").decode(errors="replace")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(name, options, log, source)
        e2, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(e2, "nvrtcGetCUBINSize")
        cubin = b" " * size
        (e3,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        _check(e3, "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    regs, spills, stack, smem = parse_ptxas(log)
    return CompileResult(cubin, log, regs, spills, stack, smem, time.perf_counter() - t0)


def warnings_in(log: str) -> list[str]:
    """Compiler warnings in a log (ptxas 'info' lines are not warnings)."""
    return [line for line in log.splitlines() if "warning" in line.lower()]
