"""Driver compatibility (gdnjit/driver.py): the pure rules, the message, and ``check_driver`` with the
driver query monkeypatched (no GPU or driver needed)."""

from __future__ import annotations


import pytest

from gdnjit import driver
from gdnjit.errors import CudaError


@pytest.fixture(autouse=True)
def fresh():
    driver.reset()
    yield
    driver.reset()


@pytest.mark.parametrize("driver_version,nvrtc,ok", [
    (13000, 13, True), (13020, 13, True), (14000, 13, True),   # same or newer major
    (12090, 13, False), (12040, 13, False), (11080, 13, False),  # older major: never, whatever the minor
    (12000, 12, True), (12040, 12, True),                       # minor version compatibility within 12.x
    (11080, 12, False), (13000, 12, True),
])
def test_compatible(driver_version, nvrtc, ok):
    assert driver.compatible(driver_version, nvrtc) is ok


@pytest.mark.parametrize("v,text", [(12040, "12.4"), (13000, "13.0"), (12090, "12.9"), (11080, "11.8"),
                                    (13020, "13.2")])
def test_format_driver_version(v, text):
    assert driver.format_driver_version(v) == text


def test_nvrtc_major():
    assert driver.nvrtc_major("13.0") == 13 and driver.nvrtc_major("12.9") == 12 and driver.nvrtc_major("14") == 14
    for bad in ("", "x.1", "thirteen", ".0"):
        with pytest.raises(ValueError, match="nvrtc_version"):
            driver.nvrtc_major(bad)


def test_message_cuda12_driver_names_both_versions_and_the_cu12_extra():
    msg = driver.message(12040, "13.0")
    assert "CUDA 12.4" in msg and "NVRTC 13.0" in msg
    assert 'gdnjit[cu12]' in msg and "cuda-bindings>=12.8,<13" in msg
    assert "R580" in msg


def test_message_other_majors():
    msg = driver.message(11080, "12.9")
    assert "CUDA 11.8" in msg and "NVRTC 12.9" in msg and "R525" in msg
    assert "cu12" not in msg  # the CUDA 12 wheel does not help a CUDA 11 driver


def fake_driver(monkeypatch, version: int, calls: list | None = None):
    def query():
        if calls is not None:
            calls.append(1)
        return version

    monkeypatch.setattr(driver, "_query_driver_version", query)


def test_check_driver_raises_cuda_error_for_an_old_driver(monkeypatch):
    fake_driver(monkeypatch, 12080)
    with pytest.raises(CudaError) as info:
        driver.check_driver("13.0")
    assert isinstance(info.value, RuntimeError)
    assert "CUDA 12.8" in str(info.value) and "NVRTC 13.0" in str(info.value) and "gdnjit[cu12]" in str(info.value)
    driver.check_driver("12.9")  # a CUDA 12 NVRTC is fine on this driver


def test_check_driver_passes_and_queries_once(monkeypatch):
    calls = []
    fake_driver(monkeypatch, 13000, calls)
    for _ in range(5):
        driver.check_driver("13.0")
    driver.check_driver("12.4")
    assert calls == [1]  # the driver is read once per process


def test_a_failing_check_does_not_requery(monkeypatch):
    calls = []
    fake_driver(monkeypatch, 12020, calls)
    for _ in range(3):
        with pytest.raises(CudaError):
            driver.check_driver("13.0")
    assert calls == [1]


def test_unreadable_driver_skips_the_check(monkeypatch):
    def no_driver():
        raise RuntimeError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(driver, "_query_driver_version", no_driver)
    assert driver.driver_version() is None
    driver.check_driver("13.0")  # nothing to compare with: the module load reports the real problem


def test_query_reads_libcuda(monkeypatch):
    """``_query_driver_version`` reads cuDriverGetVersion through gdnjit.libcuda; a failed query is None."""
    from gdnjit import libcuda

    monkeypatch.setattr(libcuda, "driver_version", lambda: 12060)
    assert driver._query_driver_version() == 12060
    assert driver.driver_version() == 12060
    with pytest.raises(CudaError):
        driver.check_driver("13.0")

    driver.reset()

    def failed():
        raise CudaError("cuDriverGetVersion failed: CUDA_ERROR_NOT_INITIALIZED")

    monkeypatch.setattr(libcuda, "driver_version", failed)
    with pytest.raises(CudaError, match="cuDriverGetVersion failed"):
        driver._query_driver_version()
    assert driver.driver_version() is None


def _bindings_version() -> int | None:
    """cuDriverGetVersion through cuda.bindings: an oracle independent of gdnjit's ctypes (None: no driver)."""
    from cuda.bindings import driver as cu

    try:
        err, version = cu.cuDriverGetVersion()
    except Exception:  # noqa: BLE001 - no libcuda to load
        return None
    return int(version) if err == cu.CUresult.CUDA_SUCCESS else None


def test_this_machine():
    """The real driver: gdnjit reads the same version as a direct ctypes call (None where no libcuda loads,
    e.g. CI); where a GPU is present, that driver loads cubins of the NVRTC gdnjit compiles with."""
    import torch

    from gdnjit.compile import nvrtc_version

    expected = _bindings_version()
    assert driver.driver_version() == expected
    if torch.cuda.is_available():
        assert expected is not None
        assert driver.compatible(expected, driver.nvrtc_major(nvrtc_version())), (
            f"this GPU machine's driver ({driver.format_driver_version(expected)}) cannot load NVRTC "
            f"{nvrtc_version()} cubins")
        driver.check_driver(nvrtc_version())
