"""The CUDA driver API calls gdnjit makes to load and launch kernels, through ctypes on ``libcuda.so.1``.

Why not ``cuda.bindings.driver``: importing it costs ~15-20 ms in a fresh process (three extension modules
and their enum tables), paid by the first call of every serving process; the load path needs five
functions and three constants. ``cuda.bindings`` is still what runs NVRTC (only on a cache miss).
A test checks the constants below against ``cuda.bindings``' enums.
"""

from __future__ import annotations

import ctypes
import functools

from .errors import CudaError

CUDA_SUCCESS = 0
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CUfunction_attribute
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID

_P = ctypes.c_void_p
# name -> argument types (every function returns a CUresult, an int)
_SIGNATURES = {
    "cuDriverGetVersion": [ctypes.POINTER(ctypes.c_int)],
    "cuModuleLoadData": [ctypes.POINTER(_P), ctypes.c_char_p],
    "cuModuleGetFunction": [ctypes.POINTER(_P), _P, ctypes.c_char_p],
    "cuFuncSetAttribute": [_P, ctypes.c_int, ctypes.c_int],
    "cuLaunchKernelEx": [_P, _P, _P, _P],
    "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
    "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
}


@functools.lru_cache(maxsize=None)
def function(name: str):
    """The driver function ``name`` with its argument types set (the library is opened once per process;
    OSError when there is no driver)."""
    fn = getattr(_library(), name)
    fn.argtypes = _SIGNATURES[name]
    fn.restype = ctypes.c_int
    return fn


@functools.lru_cache(maxsize=1)
def _library():
    return ctypes.CDLL("libcuda.so.1")


def error_text(err: int) -> str:
    """``CUDA_ERROR_X (description)`` for a CUresult, or the bare number when the driver cannot name it."""
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    try:
        if function("cuGetErrorName")(err, ctypes.byref(name)) != CUDA_SUCCESS or not name.value:
            return f"CUresult {err}"
        function("cuGetErrorString")(err, ctypes.byref(text))
    except OSError:
        return f"CUresult {err}"
    return f"{name.value.decode()} ({text.value.decode() if text.value else ''})"


def check(err: int, what: str) -> None:
    """Raise CudaError naming ``what`` and the error unless ``err`` is CUDA_SUCCESS."""
    if err != CUDA_SUCCESS:
        raise CudaError(f"{what} failed: {error_text(err)}")


def driver_version() -> int:
    """``cuDriverGetVersion``: 1000 * major + 10 * minor of the CUDA version the driver supports."""
    version = ctypes.c_int()
    check(function("cuDriverGetVersion")(ctypes.byref(version)), "cuDriverGetVersion")
    return version.value


def load_module(image: bytes, what: str) -> int:
    """``cuModuleLoadData`` into the current context; the CUmodule handle."""
    module = _P()
    check(function("cuModuleLoadData")(ctypes.byref(module), image), f"cuModuleLoadData({what})")
    return module.value


def get_function(module: int, name: str) -> int:
    """``cuModuleGetFunction``; the CUfunction handle."""
    fn = _P()
    check(function("cuModuleGetFunction")(ctypes.byref(fn), module, name.encode()), f"cuModuleGetFunction({name})")
    return fn.value


def set_max_dynamic_shared_memory(fn: int, nbytes: int, what: str) -> None:
    """Allow ``fn`` ``nbytes`` of dynamic shared memory (needed above 48 KiB)."""
    check(function("cuFuncSetAttribute")(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes),
          f"cuFuncSetAttribute({what})")
