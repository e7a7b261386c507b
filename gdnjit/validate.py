"""Argument checks shared by the op modules. Errors name the argument, what was expected, what came.

TypeError for a wrong kind of object or dtype; ValueError for wrong shapes, strides, devices
or values. Never ``assert`` (``python -O`` removes it).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from .errors import DtypeError

FLOAT_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
INDEX_NAMES = {torch.int32: "int32", torch.int64: "int64"}


def tensor(name: str, x: Any, ndim: int | None = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided:
        raise TypeError(f"{name}: expected a dense (strided) tensor, got layout {x.layout}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(x.shape)}")
    return x


def cuda_tensor(name: str, x: Any, ndim: int | None = None) -> torch.Tensor:
    tensor(name, x, ndim)
    if x.device.type != "cuda":
        raise ValueError(f"{name}: expected a CUDA tensor, got one on {x.device}")
    return x


def same_device(name: str, x: torch.Tensor, device: torch.device) -> None:
    if x.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (like q), got one on {x.device}")


def dtype_in(name: str, x: torch.Tensor, allowed: Iterable[torch.dtype]) -> None:
    allowed = tuple(allowed)
    if x.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise DtypeError(f"{name}: expected dtype {names}, got {str(x.dtype).replace('torch.', '')}")


def shape_is(name: str, x: torch.Tensor, expected: tuple, what: str) -> None:
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {what} = {tuple(expected)}, got {tuple(x.shape)}")


def inner_contiguous(name: str, x: torch.Tensor) -> None:
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous (stride 1), got strides {x.stride()}")


def aligned(name: str, x: torch.Tensor, nbytes: int, strides_from: int = 0) -> None:
    """Base address and the strides of dims >= ``strides_from`` (except the last) aligned to ``nbytes``."""
    if x.numel() == 0:
        return
    if x.data_ptr() % nbytes:
        raise ValueError(f"{name}: data pointer must be {nbytes}-byte aligned for vector loads, got {hex(x.data_ptr())}")
    es = x.element_size()
    for d in range(strides_from, x.dim() - 1):
        if x.shape[d] > 1 and (x.stride(d) * es) % nbytes:
            raise ValueError(
                f"{name}: stride of dim {d} must be a multiple of {nbytes} bytes for vector loads, "
                f"got strides {x.stride()} ({es}-byte elements)"
            )


_F32_MAX = 3.4028234663852886e38


def real_number(name: str, x: Any) -> float:
    """A finite Python number representable in fp32 (kernel arguments are fp32)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{name}: expected a Python float, got {type(x).__name__}")
    try:
        value = float(x)
    except OverflowError:
        raise ValueError(f"{name}: expected a finite float within fp32 range, got {x!r}") from None
    if not math.isfinite(value) or abs(value) > _F32_MAX:
        raise ValueError(f"{name}: expected a finite float within fp32 range, got {x!r}")
    return value


def no_overlap(name: str, x: torch.Tensor) -> None:
    """Refuse outputs whose elements alias each other (a stride of 0, e.g. from ``expand``)."""
    for d in range(x.dim()):
        if x.shape[d] > 1 and x.stride(d) == 0:
            raise ValueError(f"{name}: elements overlap in memory (stride 0 in dim {d}, strides {x.stride()})")


def index_tensor(name: str, x: Any, n: int, device: torch.device, what: str = "[B]",
                 contiguous: bool = True) -> str:
    """An optional 1-D int32 / int64 tensor of ``n`` elements on ``device``; its dtype name ("none" if None)."""
    if x is None:
        return "none"
    tensor(name, x, 1)
    dtype_in(name, x, INDEX_NAMES)
    same_device(name, x, device)
    shape_is(name, x, (n,), what)
    if contiguous and n > 1 and x.stride(0) != 1:
        raise ValueError(f"{name}: expected a contiguous tensor, got stride {x.stride()}")
    return INDEX_NAMES[x.dtype]


def host_index_in_range(name: str, idx: torch.Tensor, pool_size: int) -> None:
    """GDNJIT_CHECK_INDICES: IndexError if an index of ``idx`` is ``>= pool_size`` (reads the device: synchronises)."""
    if idx.numel() and int(idx.max()) >= pool_size:
        raise IndexError(f"{name}: index {int(idx.max())} is out of range for a pool of {pool_size} slots")


def vector_ok(x: torch.Tensor, dim: int, nbytes: int = 16) -> bool:
    """Whether ``x`` has contiguous elements along ``dim`` and ``nbytes``-aligned base and other strides."""
    es = x.element_size()
    return (x.stride(dim) == 1 and x.data_ptr() % nbytes == 0
            and all((x.stride(d) * es) % nbytes == 0 for d in range(x.dim()) if d != dim and x.shape[d] > 1))


def truthy(name: str, x: Any) -> bool:
    """A flag given as a bool or an int (FlashInfer's convention: its truth value); TypeError otherwise."""
    if not isinstance(x, int):  # bool is an int
        raise TypeError(f"{name}: expected a bool or an int, got {type(x).__name__}")
    return bool(x)


def boolean(name: str, x: Any) -> bool:
    if not isinstance(x, bool):
        raise TypeError(f"{name}: expected a bool, got {type(x).__name__}")
    return x


def null_block(name: str, x: Any) -> int:
    """FlashInfer's ``null_block_id``: an int >= -1; slots <= it are padding (-1: negative slots; vLLM's 0: slot 0)."""
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{name}: expected an int >= -1, got {type(x).__name__}")
    if not -1 <= x < 2 ** 62:
        raise ValueError(f"{name}: expected an int >= -1 (slots <= it are padding), got {x}")
    return x


def gate_params(A_log: Any, dt_bias: Any, HV: int, device: torch.device) -> None:
    """The GDN gate parameters: fp32 ``A_log [HV]`` and ``dt_bias [HV]`` (fp32 / bf16 / fp16), on ``device``, any
    stride (the kernels take each one's stride)."""
    tensor("A_log", A_log, 1)
    dtype_in("A_log", A_log, (torch.float32,))
    same_device("A_log", A_log, device)
    shape_is("A_log", A_log, (HV,), "[HV]")
    tensor("dt_bias", dt_bias, 1)
    dtype_in("dt_bias", dt_bias, (torch.float32, torch.bfloat16, torch.float16))
    same_device("dt_bias", dt_bias, device)
    shape_is("dt_bias", dt_bias, (HV,), "[HV]")


def value_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dims: tuple) -> tuple:
    """(HV, V) of the GDN inputs q, k ``[.., H, K]`` and v ``[.., HV, V]`` (shapes of q / k and v's leading dims
    checked by the caller): V in ``dims``, HV a positive multiple of H, last dims contiguous, q / k 16-byte aligned."""
    H, HV, V = q.shape[-2], v.shape[-2], v.shape[-1]
    if V not in dims:
        raise ValueError(f"v: head dim V must be one of {dims}, got {V}")
    if HV < H or HV % H:
        raise ValueError(f"v: number of value heads HV={HV} must be a positive multiple of H={H} (q heads)")
    for name, x in (("q", q), ("k", k), ("v", v)):
        inner_contiguous(name, x)
    aligned("q", q, 16)
    aligned("k", k, 16)
    return HV, V


def dense_buffer(name: str, x: Any, shape: tuple, dtypes: Iterable[torch.dtype], device: torch.device,
                 what: str, vector: bool = True) -> torch.Tensor:
    """A contiguous tensor of exactly ``shape`` (described as ``what``), one of ``dtypes``; ``vector``: 16-byte
    aligned rows (read with vector loads; a buffer of scalars read one by one needs only its element alignment)."""
    tensor(name, x, len(shape))
    dtype_in(name, x, dtypes)
    same_device(name, x, device)
    shape_is(name, x, shape, what)
    if not x.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {x.stride()}")
    if vector:
        aligned(name, x, 16)
    return x


def given_output(x: Any, shape: tuple, what: str, dtypes: Iterable[torch.dtype], device: torch.device) -> None:
    """A caller's ``output``: ``shape`` (described as ``what``), one of ``dtypes``, on ``device``, last dim contiguous,
    no two elements at one address (the kernels write every element once)."""
    tensor("output", x, len(shape))
    dtype_in("output", x, dtypes)
    same_device("output", x, device)
    shape_is("output", x, shape, what)
    inner_contiguous("output", x)
    no_overlap("output", x)
