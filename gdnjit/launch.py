"""Loading cubins with the CUDA driver API and launching them on the current torch stream.

A :class:`Launcher` is built once per (variant, device) and holds the CUfunction, block size,
shared memory bytes and a preallocated argument buffer (the kernel takes one by-value struct,
packed with ``struct.pack_into`` straight into that buffer). Modules are loaded and launches made
through ``ctypes`` straight to the driver (:mod:`gdnjit.libcuda`); a launch calls ``cuLaunchKernelEx``
with a prebuilt ``CUlaunchConfig``: a ctypes call with four integer arguments costs ~0.2 us of
Python overhead against ~0.8 us for eleven (dev CPU). On the H200 host the driver call itself
dominates (bare launches 4.9 us either way; docs/perf.md v7). The hot path is: pack, read the raw
stream handle, launch.
Nothing allocates, hashes or synchronises.

:meth:`Launcher.bind` gives a :class:`BoundLaunch`: its own argument buffer and launch config,
packed once with a call signature's fixed values, so a memoised call packs only its pointers.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Sequence

from . import libcuda

_FORMATS = {"ptr": "Q", "i64": "q", "i32": "i", "f32": "f"}


def arg_format(args: Sequence[tuple[str, str]]) -> str:
    """struct format (native alignment, like the C struct) of a spec's argument list."""
    return "@" + "".join(_FORMATS[ty] for _, ty in args)


def misfit(kernel: str, args: Sequence[tuple[str, str]], values: Sequence) -> str:
    """Why ``values`` do not pack as the spec's ``args`` (a struct.error at a launch): the first value that does not
    fit its argument's type, named. The ops check their arguments first; this names what got past them."""
    if len(values) != len(args):
        return f"{kernel}: expected {len(args)} kernel arguments, got {len(values)}"
    for (name, ty), v in zip(args, values):
        try:
            struct.pack("@" + _FORMATS[ty], v)
        except struct.error:
            return f"{name}: {v!r} does not fit the kernel argument's type {ty} ({kernel})"
    return f"{kernel}: the arguments do not pack"


def leading_pointers(args: Sequence[tuple[str, str]]) -> int:
    """How many of the spec's arguments, from the first, are pointers (the per-call part of a bound launch)."""
    n = 0
    for _, ty in args:
        if ty != "ptr":
            break
        n += 1
    return n


class LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute`` (cuda.h): the id, padding to 8 bytes, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_ubyte * 64)]


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (cuda.h), the argument of ``cuLaunchKernelEx``."""

    _fields_ = [
        ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint),
    ]


def launch_config(grid: int, block: int, smem: int, pdl: bool) -> tuple[LaunchConfig, object]:
    """A ``CUlaunchConfig`` for a 1-D launch; with ``pdl`` it carries the programmatic stream
    serialization attribute. Returns (config, attribute array): keep both alive together."""
    cfg = LaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block, 1, 1
    cfg.sharedMemBytes = smem
    attrs = (LaunchAttribute * 1)()
    if pdl:
        attrs[0].id = libcuda.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attrs[0].value[0] = 1  # programmaticStreamSerializationAllowed (an int at offset 0 of the union)
        cfg.attrs, cfg.numAttrs = attrs, 1
    return cfg, attrs


def _launch_kernel_ex():
    """``cuLaunchKernelEx`` (config address, function, params address, extra) -> CUresult."""
    return libcuda.function("cuLaunchKernelEx")


def load_function(cubin: bytes, name: str, device_index: int) -> tuple[int, int]:
    """Load ``cubin`` into the primary context of ``device_index``; returns (CUmodule, CUfunction) handles.

    An image the driver rejects (corrupt, or built for another arch / a newer CUDA) raises CudaError
    naming the variant; the caller decides whether to rebuild.
    """
    import torch

    with torch.cuda.device(device_index):
        torch.cuda.init()
        torch.empty(0, device=f"cuda:{device_index}")  # make sure the primary context is current
        module = libcuda.load_module(cubin, name)
        function = libcuda.get_function(module, name)
    return module, function


class BoundLaunch:
    """One call signature of a :class:`Launcher`: grid, PDL choice and every non-pointer argument
    fixed and packed once into a buffer of its own; ``bound(ptrs)`` packs the leading pointer
    arguments and launches on the current torch stream of the launcher's device."""

    __slots__ = ("launcher", "grid", "pdl", "buf", "_ptrs", "_params", "_cfg", "_attrs", "_cfg_addr",
                 "_fn", "_pack_ptrs", "_stream", "_dev", "_ex")

    def __init__(self, launcher: "Launcher", grid: int, values: Sequence, pdl: bool):
        self.launcher, self.grid, self.pdl = launcher, int(grid), bool(pdl)
        self.buf = ctypes.create_string_buffer(len(launcher.buf))
        try:
            launcher._pack(self.buf, 0, *values)
        except struct.error:
            raise ValueError(misfit(launcher.name, launcher.args, values)) from None
        self._ptrs = (ctypes.c_void_p * 1)(ctypes.addressof(self.buf))
        self._params = ctypes.addressof(self._ptrs)
        self._cfg, self._attrs = launch_config(self.grid, launcher.block, launcher.smem, self.pdl)
        self._cfg_addr = ctypes.addressof(self._cfg)
        self._fn, self._pack_ptrs = launcher._fn, launcher._pack_ptrs
        self._stream, self._dev, self._ex = launcher._stream, launcher.device_index, launcher._ex

    def __call__(self, ptrs: Sequence[int]) -> None:
        """Launch with these leading pointer arguments (the spec's first ``len(ptrs)`` args)."""
        self._pack_ptrs(self.buf, 0, *ptrs)
        cfg = self._cfg
        cfg.hStream = self._stream(self._dev)
        err = self._ex(self._cfg_addr, self._fn, self._params, None)
        if err:
            self.launcher._fail(err, self.grid, self.pdl)


class Launcher:
    """A ready-to-launch kernel on one device."""

    __slots__ = ("name", "function", "module", "device_index", "block", "smem", "args", "fmt", "buf", "params_addr",
                 "_ptrs", "_stream", "_pack", "_pack_ptrs", "_fn", "_ex", "_cfg", "_cfg_pdl", "_keep", "_cfg_addr")

    def __init__(self, name: str, module, function, device_index: int, block: int, smem: int,
                 args: Sequence[tuple[str, str]]):
        import torch

        self.name, self.module, self.function = name, module, function
        self.device_index, self.block, self.smem = device_index, int(block), int(smem)
        self.args = tuple(args)
        self.fmt = arg_format(args)
        size = (struct.calcsize(self.fmt) + 7) // 8 * 8  # C pads the struct to its 8-byte alignment
        self.buf = ctypes.create_string_buffer(size)
        self._ptrs = (ctypes.c_void_p * 1)(ctypes.addressof(self.buf))
        self.params_addr = ctypes.addressof(self._ptrs)
        self._stream = torch._C._cuda_getCurrentRawStream
        self._pack = struct.Struct(self.fmt).pack_into
        self._pack_ptrs = struct.Struct("@" + "Q" * leading_pointers(args)).pack_into
        self._fn = int(function)
        self._ex = _launch_kernel_ex()
        cfg, attrs = launch_config(1, self.block, self.smem, False)
        cfg_pdl, attrs_pdl = launch_config(1, self.block, self.smem, True)
        self._cfg, self._cfg_pdl, self._keep = cfg, cfg_pdl, (attrs, attrs_pdl)
        self._cfg_addr = {False: ctypes.addressof(cfg), True: ctypes.addressof(cfg_pdl)}
        if self.smem > 48 * 1024:
            libcuda.set_max_dynamic_shared_memory(self._fn, self.smem, name)

    def _fail(self, err: int, grid: int, pdl: bool) -> None:
        libcuda.check(err, f"cuLaunchKernelEx({self.name}, grid={grid}, block={self.block}{', PDL' if pdl else ''})")

    def _launch(self, cfg: LaunchConfig, grid: int, values: Sequence, pdl: bool) -> None:
        try:
            self._pack(self.buf, 0, *values)
        except struct.error:
            raise ValueError(misfit(self.name, self.args, values)) from None
        cfg.gridDimX = grid
        cfg.hStream = self._stream(self.device_index)
        err = self._ex(self._cfg_addr[pdl], self._fn, self.params_addr, None)
        if err:
            self._fail(err, grid, pdl)

    def __call__(self, grid: int, values: Sequence) -> None:
        """Launch on the current torch stream of this launcher's device. ``values`` in spec arg order."""
        self._launch(self._cfg, grid, values, False)

    def launch_pdl(self, grid: int, values: Sequence) -> None:
        """Like ``__call__`` with programmatic dependent launch (programmatic stream serialization):
        the grid may start while the previous kernel in the stream is finishing. Only for kernels
        that execute ``griddepcontrol.wait`` before touching global memory (the caller checks); on
        other kernels it would race."""
        self._launch(self._cfg_pdl, grid, values, True)

    def bind(self, grid: int, values: Sequence, pdl: bool = False) -> BoundLaunch:
        """A :class:`BoundLaunch` with ``values`` (all arguments, spec order) packed once; its
        calls replace only the leading pointer arguments."""
        return BoundLaunch(self, grid, values, pdl)
