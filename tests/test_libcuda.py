"""gdnjit.libcuda without a GPU: its constants against cuda.bindings' enums, and its calls through a fake
driver library made of real ctypes callbacks (the same argument marshalling as libcuda.so.1's functions)."""

from __future__ import annotations

import ctypes

import pytest

from gdnjit import libcuda
from gdnjit.errors import CudaError

cu = pytest.importorskip("cuda.bindings.driver")


def test_constants_match_cuda_bindings():
    assert libcuda.CUDA_SUCCESS == int(cu.CUresult.CUDA_SUCCESS)
    assert libcuda.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES == \
        int(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
    assert libcuda.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION == \
        int(cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)


_INT = ctypes.c_int
_P = ctypes.c_void_p
_PP = ctypes.POINTER(_P)
_STR = ctypes.POINTER(ctypes.c_char_p)


class FakeDriver:
    """The functions libcuda calls, as ctypes callbacks with the driver's C signatures; records calls."""

    NAMES = {1: b"CUDA_ERROR_INVALID_VALUE", 200: b"CUDA_ERROR_INVALID_IMAGE"}

    def __init__(self, load_result: int = 0):
        self.calls = []
        self.strings = {}  # keep the C strings handed out alive

        def version(out):
            out[0] = 13000
            return 0

        def load(module, image):
            self.calls.append(("load", ctypes.string_at(image)))
            module[0] = 0xAB00
            return load_result

        def get_function(fn, module, name):
            self.calls.append(("function", module, name))
            fn[0] = 0xF00
            return 0

        def set_attribute(fn, attr, value):
            self.calls.append(("attribute", fn, attr, value))
            return 0

        def error_name(err, out):
            if err not in self.NAMES:
                return 1
            out[0] = self.NAMES[err]
            return 0

        def error_string(err, out):
            out[0] = b"device kernel image is invalid" if err == 200 else b"invalid argument"
            return 0

        self.cuDriverGetVersion = ctypes.CFUNCTYPE(_INT, ctypes.POINTER(_INT))(version)
        self.cuModuleLoadData = ctypes.CFUNCTYPE(_INT, _PP, ctypes.c_char_p)(load)
        self.cuModuleGetFunction = ctypes.CFUNCTYPE(_INT, _PP, _P, ctypes.c_char_p)(get_function)
        self.cuFuncSetAttribute = ctypes.CFUNCTYPE(_INT, _P, _INT, _INT)(set_attribute)
        self.cuGetErrorName = ctypes.CFUNCTYPE(_INT, _INT, _STR)(error_name)
        self.cuGetErrorString = ctypes.CFUNCTYPE(_INT, _INT, _STR)(error_string)


@pytest.fixture
def fake(monkeypatch):
    def install(**kw):
        lib = FakeDriver(**kw)
        monkeypatch.setattr(libcuda, "_library", lambda: lib)
        libcuda.function.cache_clear()
        return lib

    yield install
    libcuda.function.cache_clear()


def test_calls_pass_and_return_handles(fake):
    lib = fake()
    assert libcuda.driver_version() == 13000
    module = libcuda.load_module(b"\x7fELF-cubin", "k")
    assert module == 0xAB00
    assert libcuda.get_function(module, "gdn_kernel") == 0xF00
    libcuda.set_max_dynamic_shared_memory(0xF00, 100000, "gdn_kernel")
    assert lib.calls == [("load", b"\x7fELF-cubin"), ("function", 0xAB00, b"gdn_kernel"),
                         ("attribute", 0xF00, libcuda.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 100000)]


def test_a_failed_call_raises_with_the_drivers_error_name(fake):
    fake(load_result=200)
    with pytest.raises(CudaError, match=r"^cuModuleLoadData\(gdn_x\) failed: CUDA_ERROR_INVALID_IMAGE "
                                        r"\(device kernel image is invalid\)$"):
        libcuda.load_module(b"junk", "gdn_x")


def test_an_unnamed_error_is_reported_by_number(fake):
    fake()
    assert libcuda.error_text(1) == "CUDA_ERROR_INVALID_VALUE (invalid argument)"
    assert libcuda.error_text(12345) == "CUresult 12345"
    with pytest.raises(CudaError, match=r"^what failed: CUresult 999$"):
        libcuda.check(999, "what")
    libcuda.check(0, "what")  # success: nothing raised
