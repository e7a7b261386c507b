"""Loading cubins with the CUDA driver API and launching them on the current torch stream.

A :class:`Launcher` is built once per (variant, device) and holds the CUfunction, block size,
shared memory bytes and a preallocated argument buffer (the kernel takes one by-value struct,
packed with ``struct.pack_into`` straight into that buffer). The hot path is: pack, read the
raw stream handle, ``cuLaunchKernel``. Nothing allocates, hashes or synchronises.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Sequence

from .errors import CudaError

_FORMATS = {"ptr": "Q", "i64": "q", "i32": "i", "f32": "f"}


def arg_format(args: Sequence[tuple[str, str]]) -> str:
    """struct format (native alignment, like the C struct) of a spec's argument list."""
    return "@" + "".join(_FORMATS[ty] for _, ty in args)


def _driver():
    from cuda.bindings import driver

    return driver


def check(result, what: str):
    """Raise CudaError unless a cuda.bindings driver call returned CUDA_SUCCESS; returns the values."""
    driver = _driver()
    err = result[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        _, text = driver.cuGetErrorString(err)
        raise CudaError(f"{what} failed: {name.decode() if name else err} ({text.decode() if text else ''})")
    return result[1] if len(result) == 2 else result[1:]


def load_function(cubin: bytes, name: str, device_index: int):
    """Load ``cubin`` into the primary context of ``device_index``; returns (module, CUfunction).

    An image the driver rejects (corrupt, or built for another arch / a newer CUDA) raises CudaError
    naming the variant; the caller decides whether to rebuild.
    """
    import torch

    driver = _driver()
    with torch.cuda.device(device_index):
        torch.cuda.init()
        torch.empty(0, device=f"cuda:{device_index}")  # make sure the primary context is current
        module = check(driver.cuModuleLoadData(cubin), f"cuModuleLoadData({name})")
        function = check(driver.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")
    return module, function


class Launcher:
    """A ready-to-launch kernel on one device."""

    __slots__ = ("name", "function", "module", "device_index", "block", "smem", "fmt", "buf", "params_addr",
                 "_launch", "_ptrs", "_stream", "_ok", "_pack", "_pdl_config", "_launch_ex", "_cu_stream")

    def __init__(self, name: str, module, function, device_index: int, block: int, smem: int,
                 args: Sequence[tuple[str, str]]):
        import torch

        driver = _driver()
        self.name, self.module, self.function = name, module, function
        self.device_index, self.block, self.smem = device_index, int(block), int(smem)
        self.fmt = arg_format(args)
        size = (struct.calcsize(self.fmt) + 7) // 8 * 8  # C pads the struct to its 8-byte alignment
        self.buf = ctypes.create_string_buffer(size)
        self._ptrs = (ctypes.c_void_p * 1)(ctypes.addressof(self.buf))
        self.params_addr = ctypes.addressof(self._ptrs)
        self._launch = driver.cuLaunchKernel
        self._stream = torch._C._cuda_getCurrentRawStream
        self._ok = driver.CUresult.CUDA_SUCCESS
        self._pack = struct.Struct(self.fmt).pack_into
        self._pdl_config = None  # built on the first launch_pdl
        self._launch_ex = driver.cuLaunchKernelEx
        self._cu_stream = driver.CUstream
        if self.smem > 48 * 1024:
            check(driver.cuFuncSetAttribute(
                function, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.smem),
                f"cuFuncSetAttribute({name})")

    def __call__(self, grid: int, values: Sequence) -> None:
        """Launch on the current torch stream of this launcher's device. ``values`` in spec arg order."""
        self._pack(self.buf, 0, *values)
        (err,) = self._launch(self.function, grid, 1, 1, self.block, 1, 1, self.smem,
                              self._stream(self.device_index), self.params_addr, 0)
        if err != self._ok:
            check((err,), f"cuLaunchKernel({self.name}, grid={grid}, block={self.block})")

    def launch_pdl(self, grid: int, values: Sequence) -> None:
        """Like ``__call__`` with programmatic dependent launch (``cuLaunchKernelEx`` with
        programmatic stream serialization): the grid may start while the previous kernel in the
        stream is finishing. Only for kernels that execute ``griddepcontrol.wait`` before touching
        global memory (the caller checks); on other kernels it would race."""
        cfg = self._pdl_config
        if cfg is None:
            driver = _driver()
            attr = driver.CUlaunchAttribute()
            attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            cfg = driver.CUlaunchConfig()
            cfg.gridDimY = cfg.gridDimZ = cfg.blockDimY = cfg.blockDimZ = 1
            cfg.blockDimX = self.block
            cfg.sharedMemBytes = self.smem
            cfg.attrs = [attr]
            cfg.numAttrs = 1
            self._pdl_config = cfg
        self._pack(self.buf, 0, *values)
        cfg.gridDimX = grid
        cfg.hStream = self._cu_stream(self._stream(self.device_index))
        (err,) = self._launch_ex(cfg, self.function, self.params_addr, 0)
        if err != self._ok:
            check((err,), f"cuLaunchKernelEx({self.name}, grid={grid}, block={self.block}, PDL)")
