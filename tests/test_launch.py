"""The launch path without a GPU: the ctypes mirrors of the driver's launch structs against
cuda.bindings' own, and what a bound launch hands to ``cuLaunchKernelEx`` (driver call faked)."""

from __future__ import annotations

import ctypes
import struct

import pytest
import torch

from gdnjit import launch
from gdnjit.launch import LaunchAttribute, LaunchConfig, Launcher, launch_config, leading_pointers

driver = pytest.importorskip("cuda.bindings.driver")


def _bytes(addr: int, n: int) -> bytes:
    return ctypes.string_at(addr, n)


@pytest.mark.parametrize("pdl", [False, True])
def test_launch_config_matches_cuda_bindings_layout(pdl):
    ref = driver.CUlaunchConfig()
    ref.gridDimX, ref.gridDimY, ref.gridDimZ = 12345, 1, 1
    ref.blockDimX, ref.blockDimY, ref.blockDimZ = 256, 1, 1
    ref.sharedMemBytes = 70000
    ref.hStream = driver.CUstream(0xABCDEF12)
    attr = driver.CUlaunchAttribute()
    if pdl:
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        ref.attrs, ref.numAttrs = [attr], 1
    mine, attrs = launch_config(12345, 256, 70000, pdl)
    mine.hStream = 0xABCDEF12
    size = ctypes.sizeof(LaunchConfig)
    assert size == 56 and ctypes.sizeof(LaunchAttribute) == 72
    raw, got = _bytes(ref.getPtr(), size), _bytes(ctypes.addressof(mine), size)
    assert raw[:40] == got[:40] and raw[48:52] == got[48:52]  # all but the attrs pointer
    if pdl:
        ref_attr = _bytes(int.from_bytes(raw[40:48], "little"), 72)
        assert ref_attr == _bytes(ctypes.addressof(attrs), 72)
        assert int.from_bytes(got[40:48], "little") == ctypes.addressof(attrs)
    else:
        assert mine.numAttrs == 0


def test_leading_pointers():
    assert leading_pointers([("a", "ptr"), ("b", "ptr"), ("n", "i64"), ("c", "ptr")]) == 2
    assert leading_pointers([("n", "i32")]) == 0


@pytest.fixture
def fake_driver(monkeypatch):
    """Launcher with cuLaunchKernelEx replaced by a recorder of (config, function, argument bytes)."""
    calls = []

    def launch_ex(cfg_addr, fn, params, extra):
        cfg = LaunchConfig.from_address(cfg_addr)
        arg_buf = ctypes.c_void_p.from_address(params).value
        calls.append(dict(grid=cfg.gridDimX, block=cfg.blockDimX, smem=cfg.sharedMemBytes, stream=cfg.hStream,
                          attrs=cfg.numAttrs, fn=fn, extra=extra, args=_bytes(arg_buf, 40)))
        return 0

    monkeypatch.setattr(launch, "_launch_kernel_ex", lambda: launch_ex)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 0x5000 + dev, raising=False)
    return calls


ARGS = [("x", "ptr"), ("y", "ptr"), ("n", "i64"), ("m", "i32"), ("s", "f32"), ("flag", "i32")]


def _launcher():
    return Launcher("k", None, driver.CUfunction(0x1234), 3, 128, 4096, ARGS)


def test_bound_launch_packs_pointers_per_call_and_the_rest_once(fake_driver):
    bound = _launcher().bind(77, (1, 2, -5, 7, 0.5, 1), pdl=True)
    bound((0x1000, 0x2000))
    bound((0x3000, 0x4000))
    fmt = struct.Struct("@QQqifi")
    assert [c["args"][:fmt.size] for c in fake_driver] == [fmt.pack(0x1000, 0x2000, -5, 7, 0.5, 1),
                                                          fmt.pack(0x3000, 0x4000, -5, 7, 0.5, 1)]
    for c in fake_driver:
        assert (c["grid"], c["block"], c["smem"], c["stream"], c["attrs"], c["fn"], c["extra"]) == \
            (77, 128, 4096, 0x5003, 1, 0x1234, None)


def test_plain_and_pdl_launches(fake_driver):
    lau = _launcher()
    lau(9, (5, 6, 1, 2, 3.0, 0))
    lau.launch_pdl(10, (5, 6, 1, 2, 3.0, 0))
    assert [(c["grid"], c["attrs"]) for c in fake_driver] == [(9, 0), (10, 1)]
    assert fake_driver[0]["args"][:36] == struct.pack("@QQqifi", 5, 6, 1, 2, 3.0, 0)


def test_a_failed_launch_raises_naming_the_kernel(fake_driver, monkeypatch):
    monkeypatch.setattr(launch, "_launch_kernel_ex", lambda: lambda *a: 1)  # CUDA_ERROR_INVALID_VALUE
    from gdnjit import libcuda  # no driver library here: its error strings are faked too

    monkeypatch.setattr(libcuda, "error_text", lambda e: f"{driver.CUresult(e).name} (invalid argument)")
    bound = _launcher().bind(77, (1, 2, 3, 4, 5.0, 0))
    from gdnjit.errors import CudaError

    with pytest.raises(CudaError, match=r"cuLaunchKernelEx\(k, grid=77, block=128\) failed: CUDA_ERROR_INVALID_VALUE"):
        bound((1, 2))


def test_a_value_that_does_not_fit_its_kernel_argument_is_named(fake_driver):
    """A value past its kernel argument's type (an i64 past int64, an i32 past int32, a non-number) is a ValueError
    naming the argument and the kernel, at a launch and at a bind, and nothing is launched (was struct.error)."""
    lau = _launcher()
    for values, name in (((1, 2, 2 ** 63, 7, 0.5, 1), "n"), ((1, 2, 3, 2 ** 31, 0.5, 1), "m"),
                         ((1, 2, 3, 4, "x", 1), "s"), ((-1, 2, 3, 4, 0.5, 1), "x")):
        with pytest.raises(ValueError, match=rf"^{name}: .* does not fit the kernel argument's type .* \(k\)$"):
            lau(9, values)
        with pytest.raises(ValueError, match=rf"^{name}: "):
            lau.bind(9, values)
    with pytest.raises(ValueError, match=r"^k: expected 6 kernel arguments, got 5"):
        lau(9, (1, 2, 3, 4, 0.5))
    assert fake_driver == []
