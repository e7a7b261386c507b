"""GDN API argument checks on the CPU: every bad argument gives the documented exception type with a
message naming the argument, before any kernel could run (``prepare(require_cuda=False)`` runs every
check except the CUDA-device one on CPU tensors)."""

from __future__ import annotations

import pytest
import torch

import gdnjit
from gdnjit import gdn, guard


def make(B=3, T=1, H=2, HV=4, K=128, V=128, dtype=torch.bfloat16, state_dtype=torch.float32, layout="klast"):
    q = torch.randn(B, T, H, K, dtype=dtype)
    k = torch.randn(B, T, H, K, dtype=dtype)
    v = torch.randn(B, T, HV, V, dtype=dtype)
    a = torch.randn(B, T, HV, dtype=dtype)
    b = torch.randn(B, T, HV, dtype=dtype)
    A_log = torch.rand(HV)
    dt_bias = torch.randn(HV)
    shape = (B, HV, V, K) if layout == "klast" else (B, HV, K, V)
    state = torch.randn(*shape, dtype=state_dtype)
    return dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state)


def prep(layout="klast", read_idx=None, write_idx=None, scale=None, output=None, inter=None, ssm=None, update=True,
         l2norm=True, direct=True, pool=None, **over):
    t = make(layout=layout)
    t.update(over)
    return gdn.prepare(layout, t["q"], t["k"], t["v"], t["A_log"], t["a"], t["dt_bias"], t["b"],
                        t["state"] if pool is None else pool, read_idx, write_idx, scale, output, inter, ssm,
                        update, l2norm, direct, require_cuda=False)


def test_valid_direct_and_pool_pass():
    out, call = prep()
    assert out.shape == (3, 1, 4, 128) and call is not None
    pool = torch.randn(7, 4, 128, 128)
    out, call = prep(direct=False, pool=pool, read_idx=torch.tensor([0, -1, 5], dtype=torch.int32))
    params = call.params
    assert params["pool"] is True and params["idx_dtype"] == "int32" and params["same_pool"] is True


def test_strided_gate_params_pass_their_strides():
    """A_log / dt_bias as strided [HV] views (FlashInfer accepts them): valid, each one's stride a kernel argument."""
    _, call = prep(A_log=torch.rand(12)[::3], dt_bias=torch.randn(8, dtype=torch.bfloat16)[::2])
    assert (call.args["gate_sh"], call.args["dtb_sh"]) == (3, 2)
    _, call = prep()
    assert (call.args["gate_sh"], call.args["dtb_sh"], call.args["min_slot"]) == (1, 1, 0)


@pytest.mark.parametrize("over,exc,needle", [
    (dict(q=[1, 2]), TypeError, "q: expected a torch.Tensor"),
    (dict(q=torch.randn(3, 1, 2, 128)), TypeError, "q: expected dtype"),
    (dict(q=torch.randn(3, 2, 128, dtype=torch.bfloat16)), ValueError, "q: expected 4 dimensions"),
    (dict(q=torch.randn(3, 1, 2, 96, dtype=torch.bfloat16), k=torch.randn(3, 1, 2, 96, dtype=torch.bfloat16)),
     ValueError, "q: head dim K"),
    (dict(k=torch.randn(3, 1, 2, 128, dtype=torch.float16)), TypeError, "k: expected the dtype of q"),
    (dict(k=torch.randn(3, 1, 1, 128, dtype=torch.bfloat16)), ValueError, "k: expected shape"),
    (dict(v=torch.randn(3, 1, 4, 128, dtype=torch.float16)), TypeError, "v: expected the dtype of q"),
    (dict(v=torch.randn(2, 1, 4, 128, dtype=torch.bfloat16)), ValueError, "v: expected shape [B=3"),
    (dict(v=torch.randn(3, 1, 4, 100, dtype=torch.bfloat16)), ValueError, "v: head dim V"),
    (dict(v=torch.randn(3, 1, 3, 128, dtype=torch.bfloat16)), ValueError, "multiple of H=2"),
    (dict(a=torch.randn(3, 1, 4)), TypeError, "a: expected the dtype of q"),
    (dict(b=torch.randn(3, 1, 5, dtype=torch.bfloat16)), ValueError, "b: expected shape"),
    (dict(A_log=torch.rand(4, dtype=torch.float64)), TypeError, "A_log: expected dtype float32"),
    (dict(A_log=torch.rand(5)), ValueError, "A_log: expected shape"),
    (dict(dt_bias=torch.randn(4, dtype=torch.float64)), TypeError, "dt_bias: expected dtype"),
    (dict(state=torch.randn(3, 4, 128, 128, dtype=torch.float16)), TypeError, "state: expected dtype"),
    (dict(state=torch.randn(4, 4, 128, 128)), ValueError, "state: expected shape"),
    (dict(state=torch.randn(3, 4, 128, 128).transpose(2, 3)), ValueError, "state: the last dim (K) must be contiguous"),
    (dict(scale="0.1"), TypeError, "scale: expected a Python float"),
    (dict(scale=True), TypeError, "scale: expected a Python float"),
    (dict(l2norm=1), TypeError, "use_qk_l2norm: expected a bool"),
    (dict(output=torch.empty(3, 1, 4, 128, dtype=torch.float64)), TypeError, "output: expected dtype"),
    (dict(output=torch.empty(3, 1, 4, 64, dtype=torch.bfloat16)), ValueError, "output: expected shape"),
    (dict(output=torch.empty(3, 1, 128, 4, dtype=torch.bfloat16).transpose(2, 3)), ValueError, "output: the last"),
])
def test_argument_errors(over, exc, needle):
    kwargs = {k: v for k, v in over.items() if k in ("scale", "output", "l2norm")}
    tensors = {k: v for k, v in over.items() if k not in kwargs}
    with pytest.raises(exc) as info:
        prep(**kwargs, **tensors)
    assert needle in str(info.value)


def test_unaligned_and_strided_q():
    base = torch.randn(3 * 1 * 2 * 128 + 1, dtype=torch.bfloat16)
    q = base[1:].view(3, 1, 2, 128)  # 2-byte offset: not 16-byte aligned
    with pytest.raises(ValueError, match="q: data pointer must be 16-byte aligned"):
        prep(q=q)
    q = torch.randn(3, 1, 2, 130, dtype=torch.bfloat16)[..., :128]  # row stride 130 elements = 260 bytes
    with pytest.raises(ValueError, match="q: stride of dim"):
        prep(q=q)
    qkv = torch.randn(3, 1, 2, 3 * 128, dtype=torch.bfloat16)  # q/k slices of a fused projection are fine
    out, call = prep(q=qkv[..., :128], k=qkv[..., 128:256])
    assert call is not None


def test_pool_errors():
    pool = torch.randn(7, 4, 128, 128)
    idx = torch.tensor([0, 1, 2], dtype=torch.int32)
    with pytest.raises(TypeError, match="initial_state_indices: expected a torch.Tensor"):
        prep(direct=False, pool=pool, read_idx=[0, 1, 2])
    with pytest.raises(TypeError, match="initial_state_indices: expected dtype"):
        prep(direct=False, pool=pool, read_idx=idx.float())
    with pytest.raises(ValueError, match=r"initial_state_indices: expected shape \[B\]"):
        prep(direct=False, pool=pool, read_idx=idx[:2])
    with pytest.raises(TypeError, match="output_state_indices: expected the same dtype"):
        prep(direct=False, pool=pool, read_idx=idx, write_idx=idx.long())
    with pytest.raises(ValueError, match="initial_state: expected shape"):
        prep(direct=False, pool=torch.randn(7, 4, 128, 64), read_idx=idx)
    with pytest.raises(ValueError, match="slots overlap"):
        prep(direct=False, pool=torch.randn(7 * 4 * 128 * 128).as_strided((7, 4, 128, 128), (100, 128 * 128, 128, 1)),
             read_idx=idx)
    with pytest.raises(ValueError, match="output_state_indices: has no effect with disable_state_update"):
        prep(direct=False, pool=pool, read_idx=idx, write_idx=idx, update=False)


def test_page_strided_pool_accepted():
    backing = torch.randn(7, 4 * 128 * 128 + 64)
    pool = backing.as_strided((7, 4, 128, 128), (4 * 128 * 128 + 64, 128 * 128, 128, 1))
    out, call = prep(direct=False, pool=pool, read_idx=torch.tensor([6, 0, -1]))
    assert call.args["slot_stride"] == 4 * 128 * 128 + 64  # slot stride is a runtime argument


def test_intermediate_and_ssm_errors():
    pool = torch.randn(20, 4, 128, 128)
    idx = torch.tensor([0, 1, 2])
    good = torch.empty(3, 1, 4, 128, 128)
    prep(direct=False, pool=pool, read_idx=idx, inter=good)
    with pytest.raises(ValueError, match="intermediate_states_buffer: expected shape"):
        prep(direct=False, pool=pool, read_idx=idx, inter=torch.empty(2, 1, 4, 128, 128))
    with pytest.raises(ValueError, match="intermediate_states_buffer: expected a contiguous"):
        prep(direct=False, pool=pool, read_idx=idx, inter=torch.empty(3, 1, 4, 128, 128).transpose(3, 4))
    with pytest.raises(TypeError, match="intermediate_states_buffer: expected dtype"):
        prep(direct=False, pool=pool, read_idx=idx, inter=good.half())
    ssm = torch.tensor([[5], [6], [7]])
    prep(direct=False, pool=pool, read_idx=idx, ssm=ssm)
    with pytest.raises(ValueError, match="ssm_state_indices: cannot be combined"):
        prep(direct=False, pool=pool, read_idx=idx, ssm=ssm, inter=good)
    with pytest.raises(ValueError, match="ssm_state_indices: writes pool slots"):
        prep(direct=False, pool=pool, read_idx=idx, ssm=ssm, update=False)
    with pytest.raises(ValueError, match="ssm_state_indices: expected shape"):
        prep(direct=False, pool=pool, read_idx=idx, ssm=ssm.T)
    with pytest.raises(ValueError, match="ssm_state_indices: needs a state pool"):
        prep(ssm=ssm)


def test_kmajor_shapes():
    out, call = prep(layout="kmajor")
    assert call.params["layout"] == "kmajor"
    with pytest.raises(ValueError, match=r"state: expected shape \[B, HV, K, V\]"):
        t = make()
        gdn.prepare("kmajor", t["q"], t["k"], t["v"], t["A_log"], t["a"], t["dt_bias"], t["b"],
                     torch.randn(3, 4, 128, 64), None, None, None, None, None, None, True, True, True,
                     require_cuda=False)


def test_zero_batch_launches_nothing():
    t = make(B=0)
    out, call = gdn.prepare("klast", t["q"], t["k"], t["v"], t["A_log"], t["a"], t["dt_bias"], t["b"], t["state"],
                             None, None, None, None, None, None, True, True, True, require_cuda=False)
    assert call is None and out.shape == (0, 1, 4, 128)


def test_public_api_errors_on_cpu_tensors():
    t = make()
    with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        gdnjit.gated_delta_rule_decode_pretranspose(t["q"], t["k"], t["v"], t["state"], t["A_log"], t["a"],
                                                    t["dt_bias"], t["b"])
    with pytest.raises(ValueError, match="initial_state and initial_state_indices: must be passed together"):
        gdnjit.gated_delta_rule_decode_pretranspose(t["q"], t["k"], t["v"], None, t["A_log"], t["a"], t["dt_bias"],
                                                    t["b"], initial_state=t["state"])
    with pytest.raises(ValueError, match="output_state_indices: needs pool mode"):
        gdnjit.gated_delta_rule_decode_pretranspose(t["q"], t["k"], t["v"], t["state"], t["A_log"], t["a"],
                                                    t["dt_bias"], t["b"], output_state_indices=torch.zeros(3))
    with pytest.raises(ValueError, match="state: expected the direct state"):
        gdnjit.gated_delta_rule_decode_pretranspose(t["q"], t["k"], t["v"], None, t["A_log"], t["a"], t["dt_bias"],
                                                    t["b"])
    with pytest.raises(TypeError, match="disable_state_update: expected a bool or an int, got str"):
        gdnjit.gated_delta_rule_mtp(t["q"], t["k"], t["v"], t["state"], torch.zeros(3, dtype=torch.int32),
                                    t["A_log"], t["a"], t["dt_bias"], t["b"], disable_state_update="yes")


def test_flashinfer_value_conventions(monkeypatch):
    """FlashInfer 0.7.2's conventions: disable_state_update as a truthy int (its tests pass 0 / 1) or None
    (mtp: frozen, with a one-time FutureWarning); backend validated ("cake_gdn" / "rubin": not provided);
    at T = 1 an intermediate buffer or a true disable_state_update is refused; ReplaySSM arguments are
    refused until provided. The flags reach the kernel call as bools."""
    from gdnjit import gdn as g

    seen = []
    monkeypatch.setattr(g, "run", lambda *a, **kw: seen.append((a[15], kw)) or a[12])
    t = make()
    idx = torch.zeros(3, dtype=torch.int32)
    t4 = make(T=4)
    mtp = lambda **kw: gdnjit.gated_delta_rule_mtp(t4["q"], t4["k"], t4["v"], t4["state"], idx, t4["A_log"],  # noqa: E731
                                                   t4["a"], t4["dt_bias"], t4["b"], **kw)
    for flag, update in ((0, True), (1, False), (False, True), (True, False), (2, False)):
        seen.clear()
        mtp(disable_state_update=flag)
        assert seen[0][0] is update
    monkeypatch.setattr(g, "_warned_none_default", False)
    seen.clear()
    with pytest.warns(FutureWarning, match="disable_state_update=None is treated as True"):
        mtp()
    assert seen[0][0] is False and seen[0][1]["zero_padding"] is True
    mtp(output=torch.empty(3, 4, 4, 128, dtype=torch.bfloat16), disable_state_update=False)
    assert seen[-1][1]["zero_padding"] is False  # a caller's buffer keeps its padding rows
    # FlashInfer's ReplaySSM cache: all four buffers with the flag, none without it (one-line errors)
    with pytest.raises(ValueError, match="replayssm_rawv, replayssm_rawk, replayssm_g, replayssm_beta: required with "
                                         "cache_replayssm=True"):
        mtp(disable_state_update=True, cache_replayssm=True)
    with pytest.raises(ValueError, match="replayssm_rawv: given without cache_replayssm=True"):
        mtp(disable_state_update=True, replayssm_rawv=torch.zeros(1))
    with pytest.raises(TypeError, match="cache_replayssm: expected a bool, got float"):
        mtp(disable_state_update=True, cache_replayssm=1.0)

    pre = lambda **kw: gdnjit.gated_delta_rule_decode_pretranspose(t["q"], t["k"], t["v"], t["state"], t["A_log"],  # noqa: E731
                                                                   t["a"], t["dt_bias"], t["b"], **kw)
    for backend in ("auto", "flashinfer"):
        pre(backend=backend)
    for backend in ("cake_gdn", "rubin"):
        with pytest.raises(NotImplementedError, match=f"backend='{backend}'"):
            pre(backend=backend)
    with pytest.raises(ValueError, match=r"backend: expected one of \['auto', 'flashinfer', 'cake_gdn', 'rubin'\], got 'cuda'"):
        pre(backend="cuda")
    with pytest.raises(NotImplementedError, match="backend='cake_gdn'"):
        gdnjit.gated_delta_rule_decode(t["q"], t["k"], t["v"], t["state"], t["A_log"], t["a"], t["dt_bias"], t["b"],
                                       backend="cake_gdn")
    with pytest.raises(ValueError, match="backend: expected one of"):
        gdnjit.gated_delta_rule_decode(t["q"], t["k"], t["v"], t["state"], t["A_log"], t["a"], t["dt_bias"], t["b"],
                                       backend="rubin")
    with pytest.raises(ValueError, match="intermediate_states_buffer: supported only for T > 1"):
        pre(intermediate_states_buffer=torch.zeros(3, 1, 4, 128, 128))
    with pytest.raises(ValueError, match="disable_state_update: supported only for T > 1"):
        pre(disable_state_update=1)
    seen.clear()
    pre(disable_state_update=0)
    pre(disable_state_update=None)
    assert [x[0] for x in seen] == [True, True] and all(x[1]["zero_padding"] for x in seen)



def _fake_dispatch(monkeypatch, launches, binds=None, pdl_capable=False):
    """Validation on CPU tensors; a launch records its pointers in ``launches`` instead of running (and
    each bind its PDL choice in ``binds``); empty memos."""
    from gdnjit import gdn as g, gdn_core, runner, validate

    class FakeLauncher:
        def bind(self, grid, values, pdl=False):
            if binds is not None:
                binds.append(pdl)
            return lambda ptrs: launches.append(ptrs)

    monkeypatch.setattr(validate, "cuda_tensor", validate.tensor)
    monkeypatch.setattr(runner.RUNNER, "resolve", lambda call: (FakeLauncher(), 1))
    monkeypatch.setattr(gdn_core, "supports_pdl", lambda dev: pdl_capable)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)  # CPU torch lacks it
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(g, "_fast", {})
    monkeypatch.setattr(g, "_guarded", {})


def test_fast_path_does_not_skip_type_checks(monkeypatch):
    """After a call with scale=1.0 (and use_qk_l2norm=True) is validated and memoised, a call with
    scale=True or use_qk_l2norm=1 (equal values as dict keys) must still be refused."""
    from gdnjit import gdn as g

    launches = []
    _fake_dispatch(monkeypatch, launches)
    t = make()
    args = (t["q"], t["k"], t["v"], t["state"], t["A_log"], t["a"], t["dt_bias"], t["b"])
    gdnjit.gated_delta_rule_decode_pretranspose(*args, scale=1.0)
    gdnjit.gated_delta_rule_decode_pretranspose(*args, scale=1.0)  # memoised path
    assert len(launches) == 2 and len(g._fast) == 1
    assert len(g._guarded) == (1 if guard.available() else 0)
    with pytest.raises(TypeError, match="scale: expected a Python float"):
        gdnjit.gated_delta_rule_decode_pretranspose(*args, scale=True)
    with pytest.raises(TypeError, match="use_qk_l2norm: expected a bool"):
        gdnjit.gated_delta_rule_decode_pretranspose(*args, scale=1.0, use_qk_l2norm=1)
    assert len(launches) == 2



@pytest.mark.parametrize("flag, capable, expected", [(True, True, True), (True, False, False), (False, True, False)])
def test_pdl_follows_the_config_and_the_device(monkeypatch, flag, capable, expected):
    """GDNJIT_PDL (default on) launches with PDL where the device has griddepcontrol (sm_90+), else plainly."""
    import dataclasses

    from gdnjit import config as cfg

    binds = []
    _fake_dispatch(monkeypatch, [], binds=binds, pdl_capable=capable)
    monkeypatch.setattr(cfg, "_current", dataclasses.replace(cfg.get_config(), pdl=flag))
    t = make()
    gdnjit.gated_delta_rule_decode_pretranspose(t["q"], t["k"], t["v"], t["state"], t["A_log"], t["a"], t["dt_bias"],
                                                t["b"])
    assert binds == [expected]


@pytest.mark.skipif(not guard.available(), reason="torch's TensorGuards is unavailable here")
def test_guard_tier_serves_repeat_calls_with_fresh_pointers(monkeypatch):
    """A repeat call with new tensors of the same metadata is served by the C++ guard (the Python
    signature is not read) and launches with the new tensors' pointers."""
    launches = []
    _fake_dispatch(monkeypatch, launches)
    t = make()
    args = (t["q"], t["k"], t["v"], t["state"], t["A_log"], t["a"], t["dt_bias"], t["b"])
    gdnjit.gated_delta_rule_decode_pretranspose(*args)
    gdnjit.gated_delta_rule_decode_pretranspose(*args)  # signature path, installs the guard

    def no_signature(*a, **kw):
        raise AssertionError("the guard should have served this call")

    monkeypatch.setattr(gdn, "_signature_hit", no_signature)
    t2 = make()
    out, _ = gdnjit.gated_delta_rule_decode_pretranspose(t2["q"], t2["k"], t2["v"], t2["state"], t2["A_log"], t2["a"],
                                                         t2["dt_bias"], t2["b"])
    assert launches[-1][0] == t2["q"].data_ptr() and launches[-1][7] == t2["state"].data_ptr()
    assert launches[-1][10] == out.data_ptr() and len(launches) == 3


@pytest.mark.parametrize("slot, bad, match", [
    ("q", lambda x: torch.randn(x.shape[::-1], dtype=x.dtype).permute(3, 2, 1, 0), "q: "),  # same shape, strided
    ("k", lambda x: x.half(), "k: expected the dtype of q"),
    ("v", lambda x: torch.randn(x.shape[:3] + (64,), dtype=x.dtype), "state: expected shape"),  # V from v
    ("a", lambda x: x.float(), "a: expected the dtype of q"),
    ("b", lambda x: torch.randn(x.shape[0], x.shape[1], x.shape[2] * 2, dtype=x.dtype)[..., ::2], None),
    ("A_log", lambda x: x.double(), "A_log: "),
    ("dt_bias", lambda x: torch.randn(2 * x.shape[0])[::2], None),  # strided: valid (its stride is an argument)
    ("state", lambda x: x.bfloat16(), None),
    ("state", lambda x: torch.randn(x.shape[0], x.shape[1], x.shape[3], x.shape[2]).transpose(2, 3),
     r"state: the last dim \(K\) must be contiguous"),
])
def test_guard_tier_never_skips_a_check(monkeypatch, slot, bad, match):
    """After the guard (and the signature memo) hold a validated call, a tensor with other metadata in
    any slot is validated again: refused if invalid, launched (as a new signature) if valid."""
    launches = []
    _fake_dispatch(monkeypatch, launches)
    t = make()
    names = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b")
    for _ in range(3):
        gdnjit.gated_delta_rule_decode_pretranspose(*(t[n] for n in names))
    t[slot] = bad(t[slot])
    calls = len(gdn._fast)
    if match is None:  # still valid: goes through the full path, a second signature
        gdnjit.gated_delta_rule_decode_pretranspose(*(t[n] for n in names))
        assert len(gdn._fast) == calls + 1 and len(launches) == 4
    else:
        with pytest.raises((TypeError, ValueError), match=match):
            gdnjit.gated_delta_rule_decode_pretranspose(*(t[n] for n in names))
        assert len(launches) == 3


@pytest.mark.parametrize("slot, bad, match", [
    ("output", lambda x: x.to(torch.int32), "output: expected dtype"),
    ("output", lambda x: torch.empty(x.shape[::-1], dtype=x.dtype).permute(3, 2, 1, 0), "output: "),  # same shape
    ("output", lambda x: torch.empty(*x.shape[:3], 2 * x.shape[3], dtype=x.dtype)[..., :x.shape[3]], None),  # valid
    ("initial_state_indices", lambda x: x.to(torch.int64), None),  # the other index dtype: valid
    ("initial_state_indices", lambda x: x.float(), "initial_state_indices: expected dtype"),
    ("initial_state_indices", lambda x: torch.zeros(2 * x.shape[0], dtype=x.dtype)[::2],
     "initial_state_indices: expected a contiguous tensor"),
])
def test_guard_tier_checks_optional_slots(monkeypatch, slot, bad, match):
    """The guard checks only the optional tensors a call passes (which ones is part of its key): a changed
    output or index tensor after memoised calls is validated again, like the required slots above."""
    launches = []
    _fake_dispatch(monkeypatch, launches)
    t = make()
    kw = dict(output=torch.empty(3, 1, 4, 128, dtype=torch.bfloat16), initial_state=torch.randn(7, 4, 128, 128),
              initial_state_indices=torch.tensor([0, 6, 2], dtype=torch.int32))

    def call():
        return gdnjit.gated_delta_rule_decode_pretranspose(t["q"], t["k"], t["v"], None, t["A_log"], t["a"],
                                                           t["dt_bias"], t["b"], **kw)

    for _ in range(3):
        call()
    assert len(launches) == 3 and len(gdn._guarded) == (1 if guard.available() else 0)
    kw[slot] = bad(kw[slot])
    calls = len(gdn._fast)
    if match is None:  # still valid: the full path, a second signature, its own pointers
        call()
        assert len(gdn._fast) == calls + 1 and len(launches) == 4
        assert launches[-1][8 if slot == "initial_state_indices" else 10] == kw[slot].data_ptr()
    else:
        with pytest.raises((TypeError, ValueError), match=match):
            call()
        assert len(launches) == 3


def test_pools_strided_inside_a_slot():
    """A state that is a strided view (every m-th head, padded rows; pool or direct, K-last or K-major) is accepted
    with its strides as kernel arguments (variant slot_strided); overlapping rows / heads / slots and a
    non-contiguous last dim are refused naming the argument."""
    from gdnjit import gdn as g

    t = make(T=2)
    idx = torch.tensor([0, 2, 1], dtype=torch.int32)

    def prep(pool, direct=False, layout="klast", q=t):
        return g.prepare(layout, q["q"], q["k"], q["v"], q["A_log"], q["a"], q["dt_bias"], q["b"], pool,
                          None if direct else idx, None, None, None, None, None, True, True, direct,
                          require_cuda=False)[1]

    heads = torch.randn(3, 8, 128, 128)[:, ::2]
    call = prep(heads)
    assert call.params["slot_strided"] is True and (call.args["s_head"], call.args["s_row"]) == (2 * 128 * 128, 128)
    rows = torch.randn(3, 4, 128, 136)[..., :128]
    call = prep(rows)
    assert call.params["slot_strided"] is True and (call.args["s_head"], call.args["s_row"]) == (128 * 136, 136)
    dense = prep(torch.randn(3, 4, 128, 128))
    assert dense.params["slot_strided"] is False
    with pytest.raises(ValueError, match=r"initial_state: the last dim \(K\) must be contiguous"):
        prep(torch.randn(3, 4, 128, 256)[..., ::2])
    with pytest.raises(ValueError, match="initial_state: a slot's rows or heads overlap"):
        prep(torch.randn(3, 4, 128 * 128 + 64).as_strided((3, 4, 128, 128), (4 * 128 * 128, 64, 64, 1)))
    with pytest.raises(ValueError, match="initial_state: slots overlap"):
        prep(torch.randn(4, 8, 128, 128)[:, ::2].as_strided((3, 4, 128, 128), (4 * 128 * 128, 2 * 128 * 128, 128, 1)))
    assert prep(torch.randn(3, 8, 128, 128)[:, ::2], direct=True).params["slot_strided"] is True  # a direct state
    tk = make(T=2, layout="kmajor")
    call = prep(torch.randn(3, 4, 128, 136)[..., :128], direct=True, layout="kmajor", q=tk)
    assert call.params["slot_strided"] is True and call.args["s_row"] == 136
    with pytest.raises(ValueError, match=r"state: the last dim \(V\) must be contiguous"):
        prep(torch.randn(3, 4, 128, 256)[..., ::2], direct=True, layout="kmajor", q=tk)


def test_replayssm_verify_contract():
    """FlashInfer's contract for the caching verify, checked before anything runs: a frozen pool, no per-token state
    buffer or scatter, every base address 16-byte aligned (ValueError naming the tensor). (Dtype errors are DtypeError,
    which FlashInfer's callers catch as ValueError too: tests/ops/test_replay_gpu.py.)"""
    t = make(T=4)
    idx = torch.zeros(3, dtype=torch.int32)
    caches = dict(replayssm_rawv=torch.zeros(3, 4, 4, 128, dtype=torch.bfloat16),
                  replayssm_rawk=torch.zeros(3, 2, 4, 128, dtype=torch.bfloat16),
                  replayssm_g=torch.zeros(3, 4, 4), replayssm_beta=torch.zeros(3, 4, 4))

    def mtp(**kw):
        args = dict(t, initial_state=t["state"], initial_state_indices=idx, disable_state_update=True)
        del args["state"]
        args.update(kw)
        return gdnjit.gated_delta_rule_mtp(cache_replayssm=True, **{**caches, **args})

    with pytest.raises(ValueError, match="disable_state_update: must be true with cache_replayssm"):
        mtp(disable_state_update=False)
    with pytest.raises(ValueError, match="intermediate_states_buffer: not with cache_replayssm"):
        mtp(intermediate_states_buffer=torch.zeros(3, 4, 4, 128, 128))
    with pytest.raises(ValueError, match="ssm_state_indices: not with cache_replayssm"):
        mtp(ssm_state_indices=torch.zeros(3, 4, dtype=torch.int32))
    for name in ("q", "A_log", "initial_state_indices", "replayssm_g"):
        x = caches[name] if name in caches else idx if name == "initial_state_indices" else t[name]
        shifted = torch.empty(x.numel() + 1, dtype=x.dtype)[1:].view_as(x)
        with pytest.raises(ValueError, match=f"{name}: cache_replayssm needs a 16-byte aligned base address"):
            mtp(**{name: shifted})
    assert issubclass(gdnjit.DtypeError, TypeError) and issubclass(gdnjit.DtypeError, ValueError)
