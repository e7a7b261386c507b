"""gdnjit.lazy (the lazy-state GDN) on CPU tensors: the cache allocator, one-line errors naming the argument (the
step, the fold, the reset: ``prepare_step`` / ``prepare_fold`` with ``require_cuda=False``), the named calls they
build (params, strides of page-strided pools and rings, padding, empty batches), and the gdn_lazy spec's variants: a
covering set (mode step / fold / reset, cursor slot / row, T 0..16, every dtype, K / V, the rules' tiles) compiles for
sm_90 with no spills, no stack frame and no warnings (every tunable of the heaviest problems in the full tier)."""

from __future__ import annotations

import concurrent.futures
import random

import pytest
import torch

import gdnjit
from gdnjit import dispatch, lazy
from gdnjit.lazy import LazyCache, lazy_cache, prepare_fold, prepare_step
from gdnjit.spec import get_spec
from gdnjit.variant import Variant

S, H, HV, T, K, V, B = 10, 2, 4, 3, 64, 64, 4
bf = torch.bfloat16
i32 = torch.int32


def _args(**kw):
    d = dict(q=torch.zeros(B, T, H, K, dtype=bf), k=torch.zeros(B, T, H, K, dtype=bf),
             v=torch.zeros(B, T, HV, V, dtype=bf), A_log=torch.zeros(HV), a=torch.zeros(B, T, HV, dtype=bf),
             dt_bias=torch.zeros(HV), b=torch.zeros(B, T, HV, dtype=bf), state=torch.zeros(S, HV, V, K),
             state_indices=torch.zeros(B, dtype=i32), cache=lazy_cache(S, H, HV, K, V, dtype=torch.float32),
             num_accepted=None, scale=None, use_qk_l2norm=True, softplus_beta=1.0, softplus_threshold=20.0,
             null_block_id=-1, output=None)
    d.update(kw)
    return d


def step(**kw):
    return prepare_step(*_args(**kw).values(), require_cuda=False)


def fold(mode="fold", **kw):
    d = dict(state=torch.zeros(S, HV, V, K), state_indices=torch.zeros(B, dtype=i32),
             cache=lazy_cache(S, H, HV, K, V), num_accepted=None, null_block_id=-1)
    d.update(kw)
    if mode == "reset":
        d["state"] = None
    return prepare_fold(*d.values(), mode, require_cuda=False)


def _cache_with(i, x, slots=S):
    c = list(lazy_cache(slots, H, HV, K, V, dtype=torch.float32))
    c[i] = x
    return LazyCache(*c)


def test_lazy_cache_layout():
    c = lazy_cache(S, H, HV, K, V, dtype=torch.float16, layers=3)
    assert c.k.shape == (3, S, H, 32, K) and c.u.shape == (3, S, HV, 32, V) and c.k.dtype == c.u.dtype == torch.float16
    assert c.g.shape == (3, S, HV, 32) and c.g.dtype == torch.float32
    assert c.cursor.shape == (3, S, 4) and c.cursor.dtype == i32
    assert all(int(x.abs().sum()) == 0 for x in c)
    one = c.layer(2)
    assert one.k.shape == (S, H, 32, K) and one.k.data_ptr() == c.k[2].data_ptr()
    with pytest.raises(ValueError, match="layer: this cache has no layer dim"):
        one.layer(0)
    assert lazy_cache(S, H, HV, K, V).k.dtype == bf  # the default ring dtype


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(slots=0), ValueError, "slots: expected a positive int"),
    (dict(H=True), ValueError, "H: expected a positive int"),
    (dict(HV=3), ValueError, "HV: expected a multiple of H=2"),
    (dict(K=96), ValueError, "K: expected one of (64, 128, 256)"),
    (dict(V=32), ValueError, "V: expected one of (64, 128, 256)"),
    (dict(dtype=torch.float64), TypeError, "dtype: expected torch.float32, torch.bfloat16 or torch.float16"),
    (dict(layers=0), ValueError, "layers: expected None or a positive int"),
])
def test_lazy_cache_errors(kw, exc, msg):
    a = dict(slots=S, H=H, HV=HV, K=K, V=V)
    a.update(kw)
    with pytest.raises(exc) as e:
        lazy_cache(**a)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_step_call():
    out, call = step(state_indices=torch.zeros(B, dtype=torch.int64), null_block_id=0)
    p, a = call.params, call.args
    assert out.shape == (B, T, HV, V) and out.dtype == bf
    assert (p["mode"], p["cursor"], p["pending"], p["T"], p["idx_dtype"], p["zero_pad"]) == ("step", "slot", False,
                                                                                              T, "int64", True)
    assert (p["state_dtype"], p["ring_dtype"], p["in_dtype"], p["out_dtype"], p["K"], p["V"]) == ("fp32", "fp32",
                                                                                                  "bf16", "bf16", K, V)
    assert a["null_block"] == 0 and a["pool_size"] == S and a["acc"] == 0 and a["cursor"] != 0
    assert (a["B"], a["H"], a["HV"], a["scale"]) == (B, H, HV, K ** -0.5)
    # null_block_id is an argument, not a param: one variant for all
    assert step(null_block_id=5)[1].params == step()[1].params
    # speculative: pending rows and an accepted-count pointer
    _, call = step(num_accepted=torch.zeros(B, dtype=i32))
    assert call.params["pending"] is True and call.args["acc"] != 0
    # a caller's output: padding rows left as they were; its dtype is a param
    _, call = step(output=torch.zeros(B, T, HV, V))
    assert call.params["zero_pad"] is False and call.params["out_dtype"] == "fp32"
    # dtypes of every tensor are params
    _, call = step(q=torch.zeros(B, T, H, K, dtype=torch.float16), k=torch.zeros(B, T, H, K, dtype=torch.float16),
                   v=torch.zeros(B, T, HV, V, dtype=torch.float16), a=torch.zeros(B, T, HV, dtype=torch.float16),
                   b=torch.zeros(B, T, HV, dtype=torch.float16), A_log=torch.zeros(HV, dtype=bf),
                   dt_bias=torch.zeros(HV, dtype=torch.float16), state=torch.zeros(S, HV, V, K, dtype=torch.float16),
                   cache=lazy_cache(S, H, HV, K, V, dtype=bf))
    p = call.params
    assert (p["in_dtype"], p["state_dtype"], p["ring_dtype"], p["alog_dtype"], p["dtb_dtype"]) == ("fp16", "fp16",
                                                                                                    "bf16", "bf16",
                                                                                                    "fp16")


def test_step_strides():
    """A page-strided pool and rings (slot pitch past one slot's block), strided q / k / v / a / b and a strided
    output: the strides are kernel arguments."""
    pages = torch.zeros(S, 3, HV, V, K)
    ring_pages = [torch.zeros(S, 2, *x.shape[1:], dtype=x.dtype) for x in lazy_cache(S, H, HV, K, V)[:3]]
    cache = LazyCache(*(x[:, 1] for x in ring_pages), torch.zeros(S, 4, dtype=i32))
    qkv = torch.zeros(B, T, 2 * H * K + HV * V, dtype=bf)
    q, k = qkv[..., :H * K].view(B, T, H, K), qkv[..., H * K:2 * H * K].view(B, T, H, K)
    v = qkv[..., 2 * H * K:].view(B, T, HV, V)
    ab = torch.zeros(B, T, 2, HV, dtype=bf)
    out = torch.zeros(B, T, HV, 2 * V)[..., :V]
    _, call = step(state=pages[:, 1], cache=cache, q=q, k=k, v=v, a=ab[:, :, 0], b=ab[:, :, 1], output=out)
    a = call.args
    assert (a["s_slot"], a["s_head"], a["s_row"]) == (3 * HV * V * K, V * K, K)
    assert (a["kr_slot"], a["ur_slot"], a["gr_slot"]) == (2 * H * 32 * K, 2 * HV * 32 * V, 2 * HV * 32)
    assert (a["q_sn"], a["q_st"], a["q_sh"]) == (T * qkv.shape[-1], qkv.shape[-1], K)
    assert (a["v_sn"], a["v_sh"], a["a_sn"], a["a_st"], a["b_st"]) == (T * qkv.shape[-1], V, T * 2 * HV, 2 * HV, 2 * HV)
    assert (a["o_sn"], a["o_st"], a["o_sh"]) == (T * HV * 2 * V, HV * 2 * V, 2 * V)


def test_empty_batch_and_fold_calls():
    out, call = step(q=torch.zeros(0, T, H, K, dtype=bf), k=torch.zeros(0, T, H, K, dtype=bf),
                     v=torch.zeros(0, T, HV, V, dtype=bf), a=torch.zeros(0, T, HV, dtype=bf),
                     b=torch.zeros(0, T, HV, dtype=bf), state_indices=torch.zeros(0, dtype=i32))
    assert call is None and out.shape == (0, T, HV, V)
    assert fold(state_indices=torch.zeros(0, dtype=i32)) is None
    call = fold(num_accepted=torch.zeros(B, dtype=i32), state=torch.zeros(S, HV, V, K, dtype=bf))
    p, a = call.params, call.args
    assert (p["mode"], p["T"], p["state_dtype"], p["ring_dtype"], p["K"], p["V"]) == ("fold", 0, "bf16", "bf16", K, V)
    assert a["acc"] != 0 and a["H"] == H and a["HV"] == HV and a["q"] == 0 and a["pool_size"] == S
    assert fold().args["acc"] == 0
    call = fold("reset", state_indices=torch.zeros(B, dtype=torch.int64), null_block_id=3)
    assert call.params["mode"] == "reset" and call.params["idx_dtype"] == "int64" and call.args["null_block"] == 3
    assert call.args["state"] == 0 and call.args["k_ring"] == 0 and call.args["pool_size"] == S


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(state=torch.zeros(S, HV, V, 96)), ValueError, "state: K and V (dims 3, 2) must be in"),
    (dict(state=torch.zeros(S, HV, V, K, dtype=torch.float64)), TypeError, "state: expected dtype float32, bfloat16"),
    (dict(state=torch.zeros(S, HV, K, V).transpose(2, 3)), ValueError, "state: expected K (dim 3) contiguous"),
    (dict(state=torch.zeros(S, HV * V * K + 1)[:, :HV * V * K].view(S, HV, V, K)), ValueError,
     "state: stride of dim 0 must be a multiple of 16 bytes"),
    (dict(state=torch.zeros(S * HV * V * K + 1)[1:].view(S, HV, V, K)), ValueError,
     "state: data pointer must be 16-byte aligned"),
    (dict(state=torch.zeros(S, HV, V, K)[..., None]), ValueError, "state: expected 4 dimensions"),
    (dict(state=[0]), TypeError, "state: expected a torch.Tensor"),
    (dict(q=torch.zeros(B, T, H, K)), TypeError, "q: expected dtype bfloat16 or float16"),
    (dict(q=torch.zeros(B + 1, T, H, K, dtype=bf)), ValueError, "q: expected B=4 rows"),
    (dict(q=torch.zeros(B, 17, H, K, dtype=bf)), ValueError, "q: the tokens T (dim 1) must be in 1..16"),
    (dict(q=torch.zeros(B, 0, H, K, dtype=bf)), ValueError, "q: the tokens T (dim 1) must be in 1..16"),
    (dict(q=torch.zeros(B, T, 3, K, dtype=bf)), ValueError, "q: its heads H=3 (dim 2) must divide"),
    (dict(q=torch.zeros(B, T, H, 128, dtype=bf)), ValueError, "q: expected K=64"),
    (dict(q=torch.zeros(B, T, H, 2 * K, dtype=bf)[..., ::2]), ValueError, "q: the last dimension must be contiguous"),
    (dict(k=torch.zeros(B, T, H, K, dtype=torch.float16)), TypeError, "k: expected dtype bfloat16"),
    (dict(k=torch.zeros(B, T, H + 2, K, dtype=bf)), ValueError, "k: expected shape"),
    (dict(v=torch.zeros(B, T, HV, V + 64, dtype=bf)), ValueError, "v: expected shape"),
    (dict(v=torch.zeros(B, T, HV, 2 * V, dtype=bf)[..., ::2]), ValueError, "v: the last dimension must be contiguous"),
    (dict(a=torch.zeros(B, T, HV)), TypeError, "a: expected dtype bfloat16"),
    (dict(a=torch.zeros(B, T, 2 * HV, dtype=bf)[..., ::2]), ValueError, "a: the last dimension must be contiguous"),
    (dict(b=torch.zeros(B, T + 1, HV, dtype=bf)), ValueError, "b: expected shape"),
    (dict(A_log=torch.zeros(HV + 1)), ValueError, "A_log: expected shape"),
    (dict(A_log=torch.zeros(HV, dtype=torch.float64)), TypeError, "A_log: expected dtype float32, bfloat16, float16"),
    (dict(dt_bias=torch.zeros(HV, dtype=torch.int32)), TypeError, "dt_bias: expected dtype"),
    (dict(dt_bias=torch.zeros(2 * HV)[::2]), ValueError, "dt_bias: the last dimension must be contiguous"),
    (dict(state_indices=torch.zeros(B, dtype=torch.int16)), TypeError, "state_indices: expected dtype"),
    (dict(state_indices=torch.zeros(B, 1, dtype=i32)), ValueError, "state_indices: expected 1 dimensions"),
    (dict(state_indices=torch.zeros(2 * B, dtype=i32)[::2]), ValueError, "state_indices: expected a contiguous"),
    (dict(num_accepted=torch.zeros(B, dtype=torch.int64)), TypeError, "num_accepted: expected dtype int32"),
    (dict(num_accepted=torch.zeros(B + 1, dtype=i32)), ValueError, "num_accepted: expected shape"),
    (dict(num_accepted=torch.zeros(B, 2, dtype=i32)[:, 0]), ValueError, "num_accepted: expected a contiguous"),
    (dict(cache=(1, 2)), TypeError, "cache: expected a LazyCache"),
    (dict(cache=lazy_cache(S + 1, H, HV, K, V)), ValueError, "cache.k: expected shape [slots, H, 32, K]"),
    (dict(cache=lazy_cache(S, 1, HV, K, V)), ValueError, "cache.k: expected shape [slots, H, 32, K]"),
    (dict(cache=lazy_cache(S, H, HV, K, 128)), ValueError, "cache.u: expected shape [slots, HV, 32, V]"),
    (dict(cache=_cache_with(0, torch.zeros(S, H, 16, K))), ValueError, "cache.k: expected shape [slots, H, 32, K]"),
    (dict(cache=_cache_with(0, torch.zeros(S, H, 32, K, dtype=torch.float64))), TypeError, "cache.k: expected dtype"),
    (dict(cache=_cache_with(1, torch.zeros(S, HV, 32, V, dtype=bf))), TypeError, "cache.u: expected dtype float32"),
    (dict(cache=_cache_with(2, torch.zeros(S, HV, 32, dtype=bf))), TypeError, "cache.g: expected dtype float32"),
    (dict(cache=_cache_with(0, torch.zeros(S, H, K, 32).transpose(2, 3))), ValueError,
     "cache.k: expected its dims after the slot dim dense"),
    (dict(cache=_cache_with(0, torch.zeros(S * H * 32 * K + 1)[1:].view(S, H, 32, K))), ValueError,
     "cache.k: data pointer must be 16-byte aligned"),
    (dict(cache=_cache_with(0, torch.zeros(S, H * 32 * K + 1)[:, 1:].view(S, H, 32, K))), ValueError,
     "cache.k: data pointer must be 16-byte aligned"),
    (dict(cache=_cache_with(0, torch.zeros(S, H * 32 * K + 1)[:, :H * 32 * K].view(S, H, 32, K))),
     ValueError, "cache.k: stride of dim 0 must be a multiple of 16 bytes"),
    (dict(cache=_cache_with(1, torch.zeros(S * HV * 32 * V + 1)[1:].view(S, HV, 32, V))), ValueError,
     "cache.u: data pointer must be 16-byte aligned"),
    (dict(cache=_cache_with(1, torch.zeros(S, HV * 32 * V + 1)[:, :HV * 32 * V].view(S, HV, 32, V))),
     ValueError, "cache.u: stride of dim 0 must be a multiple of 16 bytes"),
    (dict(cache=_cache_with(3, torch.zeros(S, 4, dtype=torch.int64))), TypeError, "cache.cursor: expected dtype int32"),
    (dict(cache=_cache_with(3, torch.zeros(S, 3, dtype=i32))), ValueError, "cache.cursor: expected shape"),
    (dict(cache=_cache_with(3, torch.zeros(S, 8, dtype=i32)[:, ::2])), ValueError,
     "cache.cursor: expected a contiguous"),
    (dict(scale=0.0), ValueError, "scale: expected a positive float"),
    (dict(scale=True), TypeError, "scale: expected a Python float"),
    (dict(scale=float("nan")), ValueError, "scale: expected a finite float"),
    (dict(softplus_beta=-1.0), ValueError, "softplus_beta: expected a positive float"),
    (dict(softplus_threshold="20"), TypeError, "softplus_threshold: expected a Python float"),
    (dict(use_qk_l2norm=1), TypeError, "use_qk_l2norm: expected a bool"),
    (dict(null_block_id=-2), ValueError, "null_block_id: expected an int >= -1"),
    (dict(null_block_id=0.0), TypeError, "null_block_id: expected an int >= -1, got float"),
    (dict(output=torch.zeros(B, T, HV, V, dtype=i32)), TypeError, "output: expected dtype"),
    (dict(output=torch.zeros(B, T + 1, HV, V)), ValueError, "output: expected shape"),
    (dict(output=torch.zeros(B, T, HV, 2 * V)[..., ::2]), ValueError, "output: the last dimension must be contiguous"),
    (dict(output=torch.zeros(1, T, HV, V).expand(B, T, HV, V)), ValueError, "output:"),
])
def test_step_errors(kw, exc, msg):
    with pytest.raises(exc) as e:
        step(**kw)
    assert msg in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("mode,kw,exc,msg", [
    ("fold", dict(state=torch.zeros(S, HV, V, K, dtype=torch.int32)), TypeError, "state: expected dtype"),
    ("fold", dict(state=torch.zeros(S, HV, 128, K)), ValueError, "cache.u: expected shape"),
    ("fold", dict(cache=lazy_cache(S, 3, 3, K, V)), ValueError, "cache.k: its heads H (dim 1) must divide HV=4"),
    ("fold", dict(cache=lazy_cache(S + 2, H, HV, K, V)), ValueError, "cache.k: expected shape"),
    ("fold", dict(cache=None), TypeError, "cache: expected a LazyCache"),
    ("fold", dict(state_indices=torch.zeros(B)), TypeError, "state_indices: expected dtype"),
    ("fold", dict(num_accepted=torch.zeros(B + 1, dtype=i32)), ValueError, "num_accepted: expected shape"),
    ("fold", dict(num_accepted=torch.zeros(B, dtype=torch.int16)), TypeError, "num_accepted: expected dtype int32"),
    ("fold", dict(null_block_id=-3), ValueError, "null_block_id: expected an int >= -1"),
    ("reset", dict(cache=[1, 2, 3]), TypeError, "cache: expected a LazyCache"),
    ("reset", dict(cache=_cache_with(3, torch.zeros(S, 4, dtype=torch.int64))), TypeError,
     "cache.cursor: expected dtype int32"),
    ("reset", dict(cache=_cache_with(3, torch.zeros(S, dtype=i32))), ValueError, "cache.cursor: expected 2 dimensions"),
    ("reset", dict(state_indices=torch.zeros(B, dtype=torch.uint8)), TypeError, "state_indices: expected dtype"),
    ("reset", dict(null_block_id=None), TypeError, "null_block_id: expected an int >= -1"),
])
def test_fold_and_reset_errors(mode, kw, exc, msg):
    with pytest.raises(exc) as e:
        fold(mode, **kw)
    assert msg in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_cuda_required():
    d = _args()
    with pytest.raises(ValueError, match="state: expected a CUDA tensor"):
        gdnjit.gated_delta_rule_lazy_step(*list(d.values())[:10])
    with pytest.raises(ValueError, match="state: expected a CUDA tensor"):
        gdnjit.gated_delta_rule_lazy_fold(d["state"], d["state_indices"], d["cache"])
    with pytest.raises(ValueError, match="cache.cursor: expected a CUDA tensor"):
        gdnjit.gated_delta_rule_lazy_reset(d["state_indices"], d["cache"])


# ---- the gdn_lazy spec's variants compile clean --------------------------------------------------------------

SPEC = get_spec("gdn_lazy")
ARCH = "sm_90"
# the rules' tiles 32, 64, 128 (V >= 128); only the facts the spec names
FACTS = [{f: v for f, v in dict(B=B_, H=8, HV=32, num_sms=132).items() if f in SPEC.facts} for B_ in (1, 8, 512)]
DTYPES = ("in_dtype", "out_dtype", "state_dtype", "ring_dtype", "alog_dtype", "dtb_dtype", "idx_dtype")


def _dealt(n: int, columns: dict, seed: int) -> list[dict]:
    """n dicts, each column's values dealt round-robin over them in a fixed shuffled order."""
    rng = random.Random(seed)
    cols = {}
    for name, vals in columns.items():
        col = [vals[i % len(vals)] for i in range(n)]
        rng.shuffle(col)
        cols[name] = col
    return [{name: cols[name][i] for name in columns} for i in range(n)]


def covering_params() -> list[dict]:
    """The param sets the op modules build (gdnjit/lazy.py, gdnjit/ucache.py), each value of each param at least
    once: 24 of gdnjit's own steps (T 1..16), 8 of FlashInfer's u-cache steps (flush over a 32-row ring, verify-only
    over the flat 16-row ring), 6 folds and 2 resets, and the prep launch of each step or fold in the rows form."""
    base = dict(SPEC.param_defaults)
    everything = {n: SPEC.allowed(n) for n in ("K", "V", "l2norm", "zero_pad") + DTYPES}
    out = []
    for i, p in enumerate(_dealt(24, dict(everything, T=list(range(1, 17)), pending=[False, True]), 20261129)):
        out.append(dict(base, mode="step", cursor="slot", fold="auto", ring=32, **p))
    for p in _dealt(8, dict(everything, T=[1, 4, 8, 16, 3, 12, 7, 13], fold=["auto", "never"]), 7):
        out.append(dict(base, mode="step", cursor="row", pending=False, ring=32 if p["fold"] == "auto" else 16, **p))
    for p in _dealt(6, {n: SPEC.allowed(n) for n in ("K", "V", "state_dtype", "ring_dtype", "idx_dtype")}, 3):
        out.append(dict(base, mode="fold", T=0, **p))
    for idx in ("int32", "int64"):
        out.append(dict(base, mode="reset", T=0, K=128, V=128, state_dtype="fp32", ring_dtype="bf16", idx_dtype=idx))
    out = [{n: p[n] for n in SPEC.param_names} for p in out]
    # a step or fold the rules give the rows form launches its prep first
    preps = [dict(p, mode="prep") for i, p in enumerate(out) if p["mode"] != "reset"
             and dispatch.select(SPEC, p, FACTS[i % len(FACTS)])[0]["form"] == "rows"]
    return out + preps


def covering_variants() -> list[Variant]:
    out = {}
    for i, p in enumerate(covering_params()):
        t, _ = dispatch.select(SPEC, p, FACTS[i % len(FACTS)])
        v = Variant.make(SPEC, p, t, ARCH)
        out[v.key] = v
    return list(out.values())


def heavy_variants() -> list[Variant]:
    """Every valid tunable choice of the heaviest problems: T = 16, K = V = 256, fp32 everything (the largest staged
    tile and tables, the most registers), both cursors, pending or not; their prep launches too; and the eager form's
    (T = 1) at K = V = 256."""
    base = dict(SPEC.param_defaults, mode="step", T=16, K=256, V=256, in_dtype="fp16", out_dtype="fp32",
                state_dtype="fp32", ring_dtype="fp32", alog_dtype="fp32", dtb_dtype="fp32", idx_dtype="int64",
                l2norm=True, zero_pad=True)
    out = []
    for extra in (dict(cursor="slot", pending=False), dict(cursor="slot", pending=True),
                  dict(cursor="row", pending=False, fold="auto", ring=32),
                  dict(cursor="row", pending=False, fold="never", ring=16)):
        for mode in ("step", "prep"):
            p = {n: dict(base, mode=mode, **extra)[n] for n in SPEC.param_names}
            out += [Variant.make(SPEC, p, t, ARCH) for t in SPEC.all_tunable_choices() if SPEC.valid(p, t)]
    # the eager form (plain steps of one token; its state in fp32 registers whatever the dtype): K = V = 256
    p = {n: dict(base, T=1, cursor="slot", pending=False)[n] for n in SPEC.param_names}
    out += [Variant.make(SPEC, p, t, ARCH) for t in SPEC.all_tunable_choices()
            if dict(t)["form"] == "eager" and SPEC.valid(p, t)]
    return out


def test_covering_set_covers_every_value():
    params = covering_params()
    for name, vals in SPEC.params:
        assert {p[name] for p in params} == set(vals), name
    chosen = {(dict(v.params)["mode"], dict(v.tunables)["form"]) for v in covering_variants()}
    assert chosen >= {("step", "rows"), ("step", "tile"), ("fold", "rows"), ("prep", "rows"), ("reset", "tile")}, chosen


def test_covering_params_are_what_the_modules_build():
    """The covering set's forms are the param sets gdnjit.lazy builds: a reset's one set is in it, a fold's differs
    from the defaults only in its dims and dtypes, a step's fixes the slot cursor's mode params."""
    cover = covering_params()
    assert fold("reset").params in cover
    fixed = dict(SPEC.param_defaults, mode="fold", T=0)
    p = fold(state=torch.zeros(S, HV, V, K, dtype=torch.float16)).params
    assert {n: p[n] for n in fixed} == fixed and p["state_dtype"] == "fp16"
    for kw in ({}, dict(num_accepted=torch.zeros(B, dtype=i32))):
        p = step(**kw)[1].params
        assert (p["mode"], p["cursor"], p["fold"], p["ring"]) == ("step", "slot", "auto", 32)
        assert any(all(c[n] == p[n] for n in ("mode", "cursor", "fold", "ring", "pending")) for c in cover)


def _compile_clean(todo: list[Variant]) -> None:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        metas = list(pool.map(lambda v: v.build().meta, todo))
    bad = [f"{v.describe()}: {m}" for v, m in zip(todo, metas)
           if m["spill_bytes"] or m["stack_bytes"] or m["warnings"] or m["registers"] <= 0]
    assert not bad, "\n".join(bad)


def test_covering_variants_compile_clean():
    todo = covering_variants()
    assert 48 <= len(todo) <= 72, len(todo)  # 40 param sets and the preps of those in the rows form
    _compile_clean(todo)


@pytest.mark.full  # ~300 more variants at the largest sizes (~70 s)
def test_every_tunable_of_the_heaviest_problems_compiles_clean():
    todo = heavy_variants()
    assert len(todo) >= 14, len(todo)
    _compile_clean(todo)


def test_the_rules_give_an_fp32_states_small_plain_batches_the_eager_form():
    """An fp32 state's plain steps (gdnjit's cursor) at B * HV <= 512 take the eager form (8 lanes x 2 rows, 16 at K
    256), which compiles clean; larger batches, a 16-bit state, speculative steps and FlashInfer's cursor do not."""
    base = dict(SPEC.param_defaults, mode="step", T=1, K=128, V=128, state_dtype="fp32", ring_dtype="fp32",
                idx_dtype="int32")

    def chosen(B, HV=32, **kw):
        p = {n: dict(base, **kw)[n] for n in SPEC.param_names}
        return p, dispatch.select(SPEC, p, dict(B=B, H=HV // 4, HV=HV, num_sms=132))[0]

    for B, HV, kw in ((1, 32, {}), (16, 32, {}), (8, 64, {}), (4, 64, dict(ring_dtype="bf16")), (2, 16, dict(K=64)),
                      (1, 32, dict(K=256, V=64))):
        p, t = chosen(B, HV, **kw)
        assert (t["form"], t["window"], t["lanes_per_row"]) == ("eager", 0, 16 if p["K"] == 256 else 8), (B, HV, kw)
    _compile_clean([Variant.make(SPEC, *chosen(1, 32, K=256, V=64), ARCH)])
    for B, HV, kw in ((17, 32, {}), (9, 64, {}), (1, 32, dict(state_dtype="bf16", ring_dtype="bf16")),
                      (1, 32, dict(state_dtype="fp16", ring_dtype="fp32")), (1, 32, dict(pending=True)),
                      (1, 32, dict(T=2)), (1, 32, dict(cursor="row", ring_dtype="bf16"))):
        assert chosen(B, HV, **kw)[1]["form"] != "eager", (B, HV, kw)


def test_the_rules_give_an_fp32_states_short_speculative_steps_the_rows_form():
    """An fp32 state and rings' speculative steps of T 2 / 3 at B * HV >= 2048 take the rows form (8 lanes x 2 rows,
    CTAs of 16 rows); T 4, smaller batches, K 256 (no rows shape fits its registers), 16-bit states or rings keep the
    tile form."""
    base = dict(SPEC.param_defaults, mode="step", K=128, V=128, state_dtype="fp32", ring_dtype="fp32",
                idx_dtype="int32", pending=True)

    def chosen(B, HV, **kw):
        p = {n: dict(base, **kw)[n] for n in SPEC.param_names}
        return dispatch.select(SPEC, p, dict(B=B, H=HV // 4, HV=HV, num_sms=132))[0]

    for B, HV, kw in ((512, 64, dict(T=2)), (32, 64, dict(T=3)), (64, 32, dict(T=2)), (128, 32, dict(T=3, K=64)),
                      (40, 64, dict(T=2, cursor="row", fold="auto"))):
        t = chosen(B, HV, **kw)
        assert (t["form"], t["lanes_per_row"], t["rows_per_lane"], t["tile_v"]) == ("rows", 8, 2, 16), (B, HV, kw)
    for B, HV, kw in ((512, 64, dict(T=4)), (31, 64, dict(T=2)), (32, 32, dict(T=3)), (512, 64, dict(T=2, K=256)),
                      (512, 64, dict(T=2, state_dtype="bf16", ring_dtype="bf16")), (512, 64, dict(T=2, ring_dtype="bf16"))):
        assert chosen(B, HV, **kw)["form"] == "tile", (B, HV, kw)


def test_the_rules_give_an_fp32_states_plain_steps_16_lanes_by_4_rows():
    """An fp32 state and rings' plain steps at K 128 past the small batches take rows of 16 lanes x 4 rows (CTAs of 16
    rows, the fold on tensor cores; gdnjit tune's fastest, v71), which compile clean; folds, K 256 and bf16 rings
    keep 8 x 2 (16 x 2 at K 256)."""
    base = dict(SPEC.param_defaults, mode="step", T=1, K=128, V=128, state_dtype="fp32", ring_dtype="fp32",
                idx_dtype="int32")

    def chosen(B, HV, **kw):
        p = {n: dict(base, **kw)[n] for n in SPEC.param_names}
        return p, dispatch.select(SPEC, p, dict(B=B, H=HV // 4, HV=HV, num_sms=132))[0]

    shape = lambda t: (t["form"], t["lanes_per_row"], t["rows_per_lane"], t["tile_v"], t["window"])  # noqa: E731
    for B, HV in ((512, 64), (32, 64), (32, 32), (17, 32)):
        p, t = chosen(B, HV)
        assert shape(t) == ("rows", 16, 4, 16, 16), (B, HV)
        v = Variant.make(SPEC, p, t, ARCH)
        assert v.values["tc_fold"], (B, HV)
    _compile_clean([v])
    for kw, want in ((dict(mode="fold", T=0), 8), (dict(ring_dtype="bf16"), 8), (dict(K=256, V=256), 16)):
        t = chosen(512, 64, **kw)[1]
        assert shape(t) == ("rows", want, 2, 16, 16), kw


def test_scratch_layout_matches_the_spec():
    """gdnjit.lazy.scratch_bytes lays out the rows form's scratch as the kernels index it: a 16-byte record a row, the
    keys [H, 2T, K] fp32 a row, the spec's tab_words fp32 a (row, value head) (16-byte multiples)."""
    for T in range(0, 5):
        p = dict(SPEC.param_defaults, mode="prep", T=T, K=128, V=128, state_dtype="bf16", ring_dtype="bf16",
                 idx_dtype="int32")
        p = {n: p[n] for n in SPEC.param_names}
        t, _ = dispatch.select(SPEC, p, FACTS[0])
        words = Variant.make(SPEC, p, t, ARCH).values["tab_words"]
        assert words % 4 == 0 and words >= 2 * T * (16 + T) + 2 * T + 17
        for B, H, HV, K in ((1, 1, 1, 64), (7, 2, 8, 256), (512, 16, 64, 128)):
            assert lazy.scratch_bytes(B, H, HV, K, T) == B * 16 + B * H * 2 * T * K * 4 + B * HV * words * 4


def test_launches_follow_the_chosen_form(monkeypatch):
    """A step or fold the dispatcher gives the rows form is the prep launch (the same call, mode prep) and then the
    call, sharing scratch_bytes; a speculative step in the tile form, a plain step at a small batch (an fp32 state's
    in the eager form, a bf16 state's in the tile form) and a reset are one launch (RUNNER.variant, on a stand-in H200
    without loading anything)."""
    from gdnjit import runner

    monkeypatch.setattr(runner, "device_info", lambda i: runner.DeviceInfo(i, "NVIDIA H200", "sm_90", 132))
    monkeypatch.setattr(runner.RUNNER, "tuned_table", lambda i: None)
    monkeypatch.setattr(runner.RUNNER, "get_launcher", lambda variant, i, config=None: object())
    runner.RUNNER.clear()
    try:
        def plain(b_, sdt=torch.float32):  # a T = 1 step of b_ rows
            return step(q=torch.zeros(b_, 1, H, K, dtype=bf), k=torch.zeros(b_, 1, H, K, dtype=bf),
                        v=torch.zeros(b_, 1, HV, V, dtype=bf), a=torch.zeros(b_, 1, HV, dtype=bf),
                        b=torch.zeros(b_, 1, HV, dtype=bf), state_indices=torch.zeros(b_, dtype=i32),
                        state=torch.zeros(S, HV, V, K, dtype=sdt))[1]

        big = 4 * 132 // HV + 1  # B * HV past 4 per SM: the rows form
        for call, forms, form in ((plain(big), ("prep", "step"), "rows"), (plain(B), ("step",), "eager"),
                                  (plain(B, bf), ("step",), "tile"), (fold(), ("prep", "fold"), "rows"),
                                  (step()[1], ("step",), "tile"), (fold("reset"), ("reset",), "tile")):
            calls, nbytes = lazy.launches(call)
            assert tuple(c.params["mode"] for c in calls) == forms
            assert all({n: v for n, v in c.params.items() if n != "mode"} == {n: v for n, v in call.params.items()
                                                                              if n != "mode"} for c in calls)
            assert calls[-1] is call and dict(runner.RUNNER.variant(call).tunables)["form"] == form
            p = call.params
            rows = call.args["B"] if "B" in call.args else B
            assert nbytes == (lazy.scratch_bytes(rows, H, HV, K, p["T"]) if len(calls) == 2 else 0)
    finally:
        runner.RUNNER.clear()


def test_a_rows_form_calls_prep_takes_its_window(monkeypatch):
    """The prep launch decides each row's fold and hands the window to the state launch, so it takes the call's
    window whatever its own choice: a tuned table's rows-form step with window 8 launches a prep of window 8 (the
    rules' prep has 16), pinned over the dispatcher's choice; without the table both have 16. The spec's first_launch names
    the prep for rows-form steps and folds only (stand-in H200, nothing loaded)."""
    from gdnjit import runner
    from gdnjit.tuned import TunedTable

    monkeypatch.setattr(runner, "device_info", lambda i: runner.DeviceInfo(i, "NVIDIA H200", "sm_90", 132))
    monkeypatch.setattr(runner.RUNNER, "get_launcher", lambda variant, i, config=None: object())
    rows = dict(form="rows", tile_v=16, lanes_per_row=8, rows_per_lane=2, window=8, staged=False, head_warps=1)
    big = 4 * 132 // HV + 1  # B * HV past 4 per SM: the rules' rows form for an fp32 state's plain steps
    call = prepare_step(q=torch.zeros(big, 1, H, K, dtype=bf), k=torch.zeros(big, 1, H, K, dtype=bf),
                        v=torch.zeros(big, 1, HV, V, dtype=bf), a=torch.zeros(big, 1, HV, dtype=bf),
                        b=torch.zeros(big, 1, HV, dtype=bf), A_log=torch.zeros(HV), dt_bias=torch.zeros(HV),
                        state=torch.zeros(S, HV, V, K), state_indices=torch.zeros(big, dtype=i32),
                        cache=lazy_cache(S, H, HV, K, V, dtype=torch.float32), num_accepted=None, scale=None,
                        use_qk_l2norm=True, softplus_beta=1.0, softplus_threshold=20.0, null_block_id=-1,
                        output=None, require_cuda=False)[1]
    for table, window in ((None, 16), (TunedTable([{"spec": "gdn_lazy", "params": dict(call.params),
                                                     "facts": {"B": big, "H": H, "HV": HV}, "tunables": rows}]), 8)):
        monkeypatch.setattr(runner.RUNNER, "tuned_table", lambda i, t=table: t)
        runner.RUNNER.clear()
        try:
            (prep, own), _ = lazy.launches(call)
            step_t, prep_t = dict(runner.RUNNER.variant(own).tunables), dict(runner.RUNNER.variant(prep).tunables)
            assert step_t["form"] == prep_t["form"] == "rows" and step_t["window"] == prep_t["window"] == window
            assert prep.pinned == {"window": window} and own.pinned is None
        finally:
            runner.RUNNER.clear()
    p = dict(call.params)
    assert SPEC.first_launch_of(p, rows) == (dict(p, mode="prep"), {"window": 8})
    for mode, form in (("fold", "rows"), ("step", "tile"), ("step", "eager"), ("reset", "tile"), ("prep", "rows")):
        first = SPEC.first_launch_of(dict(p, mode=mode), dict(rows, form=form))
        assert (first is not None) == (mode == "fold" and form == "rows"), (mode, form)


def test_fold_cycle_follows_the_models_cursor():
    """gdnjit.lazy.fold_cycle (gdnjit tune's steps per replay) is the period of the reference model's cursor for
    steady plain and speculative steps, windows 0 / 8 / 16."""
    from gdnjit.reference.lazy import LazyModel

    g = torch.Generator().manual_seed(5)
    for Tn, window, acc in ((1, 16, None), (1, 8, None), (1, 0, None), (2, 16, 1), (3, 16, 2), (4, 16, 2),
                            (4, 8, 1), (8, 16, 4), (8, 8, 8), (5, 16, 3)):
        m = LazyModel(torch.zeros(2, 1, 8, 8, dtype=torch.float64), 1, window=window)
        idx = torch.tensor([1])
        cursors = []
        for _ in range(60):
            x = lambda *sh: torch.randn(*sh, generator=g, dtype=torch.float64)  # noqa: E731
            m.step(x(1, Tn, 1, 8), x(1, Tn, 1, 8), x(1, Tn, 1, 8), torch.zeros(1), x(1, Tn, 1), torch.zeros(1),
                   x(1, Tn, 1), idx, num_accepted=None if acc is None else torch.tensor([acc], dtype=torch.int32))
            cursors.append((int(m.cursor[1, 0]), int(m.cursor[1, 2])))  # len, pending (the base slides)
        tail = cursors[20:]
        period = next(c for c in range(1, 30) if all(tail[i] == tail[i + c] for i in range(len(tail) - c)))
        assert lazy.fold_cycle(Tn, window, acc) == period, (Tn, window, acc)


def test_tune_times_steps_and_skips_the_other_calls():
    """gdnjit tune times a lazy step of gdnjit's cursors (plain or speculative) through example_steps and says why
    it skips a prep, a fold, a reset and FlashInfer's cursors; TUNE_WHERE keeps a 16-bit state's eager form out of
    the candidates (it would round once a token), not an fp32 state's."""
    from gdnjit.tune import candidate_tunables

    base = {n: v for n, v in SPEC.param_defaults}
    base.update(mode="step", K=128, V=128, T=1, state_dtype="fp32", ring_dtype="fp32", idx_dtype="int32")
    assert lazy.untunable(base) is None and lazy.untunable(dict(base, pending=True, T=4)) is None
    for kw, word in ((dict(mode="prep"), "prep"), (dict(mode="fold", T=0), "fold"), (dict(mode="reset", T=0), "reset"),
                     (dict(cursor="row", T=4, ring=16), "caller")):
        assert word in lazy.untunable(dict(base, **kw)), kw
    for sdt, eager in (("fp32", True), ("bf16", False)):
        p = {n: dict(base, state_dtype=sdt, ring_dtype=sdt)[n] for n in SPEC.param_names}
        forms = {t["form"] for t in candidate_tunables(SPEC, p, lazy.TUNE_WHERE, [])}
        assert forms == ({"rows", "tile", "eager"} if eager else {"rows", "tile"}), sdt


def test_the_tensor_core_fold_is_the_rules_bf16_fold_with_bf16_rings():
    """mma_fold (the fold's update as bf16 MMAs) is on exactly where its operands are exact in bf16 and a warp holds
    16 rows: the rules' fold for a bf16 state with bf16 rings; fp32 rings, an fp16 state and an fp32 state keep the
    fold on CUDA cores; the prep and the tile form have none. Each variant's shared memory follows. (At B 512: a plain
    step with a 16-bit state and ring takes the tile form a chunk at a time (v63), as a small batch's does.)"""
    def chosen(**kw):
        p = dict(SPEC.param_defaults, mode="step", T=1, K=128, V=128, state_dtype="bf16", ring_dtype="bf16",
                 idx_dtype="int32")
        p.update(kw)
        p = {n: p[n] for n in SPEC.param_names}
        t, _ = dispatch.select(SPEC, p, FACTS[2])
        return Variant.make(SPEC, p, t, ARCH).values

    for kw in (dict(mode="fold", T=0), dict(mode="fold", T=0, K=64, V=64), dict(ring_dtype="fp32", mode="fold", T=0)):
        vals = chosen(**kw)
        assert vals["mma_fold"] == ("ring_dtype" not in kw) and vals["form"] == "rows", kw
        if vals["mma_fold"]:
            assert vals["smem_bytes"] == vals["threads"] // 32 * 16 * 72 * 4, kw
    for kw in (dict(), dict(K=64, V=64), dict(state_dtype="fp16", ring_dtype="fp16")):
        vals = chosen(**kw)
        assert vals["form"] == "tile" and vals["ring_mma"] and not vals["staged"], kw
    for kw in (dict(ring_dtype="fp32"), dict(state_dtype="fp16", ring_dtype="fp16"),
               dict(state_dtype="fp32", ring_dtype="fp32"), dict(mode="prep"), dict(T=4)):
        vals = chosen(**kw)
        assert not vals["mma_fold"], kw
        assert vals["smem_bytes"] == (vals["tile_smem"] if vals["form"] == "tile" else vals["tables_smem"]), kw
        assert vals["smem_bytes"] <= vals["tables_smem"], kw


def test_a_fold_with_fp32_rings_takes_the_tensor_cores_in_ctas_of_16_rows():
    """tc_fold (the fold's update as TF32 MMAs in three parts, the CTA's rows read again in the MMA's layout) is on for
    the rows form's state launch with fp32 rings and 16 rows a CTA whose warps split K in whole 32-column groups: the
    rules' folds and plain steps of an fp32 state at K 64 / 128 / 256, and of a 16-bit state with fp32 rings; off with
    16-bit rings (a bf16 state and rings fold with mma_fold), other tiles, the prep and the tile form. It takes no
    shared memory."""
    def variant(force=None, B=512, **kw):
        p = dict(SPEC.param_defaults, mode="fold", T=0, K=128, V=128, state_dtype="fp32", ring_dtype="fp32",
                 idx_dtype="int32")
        p.update(kw)
        p = {n: p[n] for n in SPEC.param_names}
        t, _ = dispatch.select(SPEC, p, dict(FACTS[2], B=B))
        return Variant.make(SPEC, p, dict(t, **(force or {})), ARCH).values

    for kw in (dict(), dict(K=64, V=64), dict(K=256, V=256), dict(K=256, V=64), dict(mode="step", T=1),
               dict(mode="step", T=1, K=64, V=128), dict(state_dtype="bf16"), dict(state_dtype="fp16", K=64, V=64),
               dict(mode="step", T=1, state_dtype="bf16")):
        vals = variant(**kw)
        assert vals["form"] == "rows" and vals["tile_v"] == 16 and vals["tc_fold"], kw
        assert vals["smem_bytes"] == 0 and not vals["mma_fold"], kw
    rows = dict(form="rows", lanes_per_row=8, rows_per_lane=2)
    assert variant(dict(rows, tile_v=16), mode="step", T=4, pending=True)["tc_fold"]
    for force, kw in ((None, dict(ring_dtype="bf16")), (None, dict(state_dtype="bf16", ring_dtype="bf16")),
                      (None, dict(state_dtype="fp16", ring_dtype="fp16")), (dict(rows, tile_v=32), {}),
                      (dict(rows, tile_v=64), dict(mode="step", T=1)), (None, dict(mode="prep", T=1)),
                      (None, dict(mode="step", T=4, pending=True)), (None, dict(mode="step", T=1, B=4))):
        assert not variant(force, **kw)["tc_fold"], (force, kw)


def test_the_tile_form_takes_the_tensor_cores_for_a_16_bit_state():
    """tile_mma (a step's dots on tensor cores) is on for the tile form with a bf16 / fp16 state and 16 rows a CTA or
    more, not for an fp32 state, a reset or 8-row tiles; ring_mma (the window's part and the fold too, the window keys
    kept 16-bit) only where the ring has the state's type. tile_smem is the kernel's layout: exactly the tiles, the
    tables and the operands it asks for; tables_smem, which the constraint bounds, is never below it."""
    def vals(tile_v=128, staged=False, **kw):
        p = dict(SPEC.param_defaults, mode="step", T=4, K=128, V=128, state_dtype="bf16", ring_dtype="bf16",
                 idx_dtype="int32", pending=True)
        p.update(kw)
        p = {n: p[n] for n in SPEC.param_names}
        t = dict(form="tile", tile_v=tile_v, lanes_per_row=8, rows_per_lane=1, window=16, staged=staged, head_warps=1)
        assert SPEC.valid(p, t), (kw, t)
        return Variant.make(SPEC, p, t, ARCH).values

    for kw, tile_mma, ring_mma in ((dict(), True, True), (dict(state_dtype="fp16", ring_dtype="fp16"), True, True),
                                   (dict(ring_dtype="fp32"), True, False), (dict(ring_dtype="fp16"), True, False),
                                   (dict(state_dtype="fp32", ring_dtype="fp32"), False, False),
                                   (dict(state_dtype="fp32", ring_dtype="bf16"), False, False),
                                   (dict(tile_v=8), False, False), (dict(tile_v=16), True, True),
                                   (dict(mode="fold", T=0, pending=False), True, True),
                                   (dict(staged=True), True, True), (dict(staged=True, T=1, pending=False), True, True),
                                   (dict(staged=True, mode="fold", T=0, pending=False), True, True),
                                   (dict(mode="reset", T=0, pending=False), False, False)):
        v = vals(**kw)
        assert (v["tile_mma"], v["ring_mma"]) == (tile_mma, ring_mma), kw
        if kw.get("mode") == "reset":
            continue
        T, K, tv = v["T"], v["K"], v["tile_v"]
        nxp = (2 * T + 7) // 8 * 8
        kr = 16 * (K + 8) * 2 if ring_mma else 16 * (K + 4) * 4
        # the vectors' hi and lo rows (ring_mma: no lo rows for the n-tiles of keys alone: a key as the ring holds it)
        xh = (2 * nxp - (T // 8 * 8 if ring_mma else 0)) * (K + 8) * 2
        ops = (xh if T else 0) + ((16 * (tv + 8) * 2 + (2 * nxp * 24 * 2 if T else 0)) if ring_mma else 0)
        # ring_mma: a buffer of 64-column chunks of the state, no fp32 vectors, one Gram table; else the staged tile,
        # the fp32 vectors and the warps' partial Grams
        state = ((K // 64 if kw.get("staged") else 1) * tv * 64 * 2 if ring_mma else
                 tv * (K * v["s_bytes"] + 16) + 2 * T * (K + 4) * 4)
        grams = (1 if ring_mma else v["threads"] // 32) * (16 + T) * 2 * T * 4
        assert v["gram_bytes"] == (grams + 2 * T * (16 + T) * 4 + 15) // 16 * 16, kw
        assert v["smem_bytes"] == (state + kr + (4 * T + 16) * 4 + v["gram_bytes"] + (ops if tile_mma else 0)), kw
        assert v["gram_bytes"] % 16 == 0 and v["smem_bytes"] <= v["tables_smem"], kw
        # the launch bounds ask for as many CTAs an SM as the shared memory holds (228 KB, 1 KB reserved each), as far
        # as T's registers allow (128 threads: 64 registers at 8 CTAs, 80 at 6, 128 at 4: no spills)
        regs = 8 if T <= 4 else 6 if T <= 8 else 4
        assert v["min_ctas"] == (min(regs, 228 * 1024 // (v["smem_bytes"] + 1024)) if ring_mma else 1), kw
    # 7 CTAs an SM at T = 4 (as FlashInfer's u-cache kernel), 6 at T = 8 (its keys taken late: late_keys)
    assert vals()["min_ctas"] == 7 and vals(T=8)["min_ctas"] == 6
    assert not vals()["late_keys"] and vals(T=8)["late_keys"] and not vals(T=8, staged=True)["late_keys"]
    assert not vals(T=8, ring_dtype="fp32")["late_keys"]
    # staged only for ring_mma with more than one chunk
    p = dict(SPEC.param_defaults, mode="step", T=4, K=128, V=128, state_dtype="bf16", ring_dtype="bf16",
             idx_dtype="int32", pending=True)
    t = dict(form="tile", tile_v=128, lanes_per_row=8, rows_per_lane=1, window=16, staged=True, head_warps=1)
    assert SPEC.valid(p, t) and SPEC.valid(p, dict(t, staged=False))
    for kw in (dict(ring_dtype="fp32"), dict(state_dtype="fp32", ring_dtype="fp32"), dict(K=64), dict(mode="reset")):
        assert not SPEC.valid(dict(p, **kw), t), kw
    assert not SPEC.valid(p, dict(t, form="rows", lanes_per_row=8, rows_per_lane=4, tile_v=16))


def test_the_prep_launch_takes_a_warp_an_item_for_large_batches_and_four_for_small():
    """The rules' head_warps: the prep launch does a (row, key head) item in one warp (its value heads in turn) from 8
    items an SM up, in 4 warps (a value head each) below, one warp at T >= 2 (the spec refuses more); the grid covers
    every item's warps in 4-warp CTAs; no other launch has head warps."""
    from gdnjit import expr as _expr

    def prep(B, H=16, HV=64, T=1):
        p = dict(SPEC.param_defaults, mode="prep", T=T, K=128, V=128, state_dtype="bf16", ring_dtype="bf16",
                 idx_dtype="int32")
        p = {n: p[n] for n in SPEC.param_names}
        facts = dict(B=B, H=H, HV=HV, num_sms=132)
        t, _ = dispatch.select(SPEC, p, facts)
        v = Variant.make(SPEC, p, t, ARCH)
        grid = int(_expr.evaluate(dict(SPEC.launch)["grid"], dict(v.values, **facts)))
        return dict(v.tunables)["head_warps"], v.values["threads"], grid

    for B, want in ((512, 1), (128, 1), (66, 1), (65, 4), (32, 4), (1, 4)):
        hw, threads, grid = prep(B)
        assert hw == want, (B, hw)
        assert threads == 128 and grid == -(-B * 16 * hw // 4), (B, grid)
        assert prep(B, T=0)[0] == want and prep(B, T=2)[0] == 1, B  # a fold's prep as a step's; T >= 2: one warp
    p = dict(SPEC.param_defaults, mode="prep", T=2, K=128, V=128, state_dtype="bf16", ring_dtype="bf16",
             idx_dtype="int32")
    p = {n: p[n] for n in SPEC.param_names}
    t, _ = dispatch.select(SPEC, p, dict(B=1, H=16, HV=64, num_sms=132))
    assert not SPEC.valid(p, dict(t, head_warps=4))  # a warp reads back its own earlier tokens' keys
    for mode, T in (("step", 1), ("fold", 0), ("step", 4), ("reset", 0)):
        p = dict(SPEC.param_defaults, mode=mode, T=T, K=128, V=128, state_dtype="bf16", ring_dtype="bf16",
                 idx_dtype="int32")
        p = {n: p[n] for n in SPEC.param_names}
        t, _ = dispatch.select(SPEC, p, FACTS[2])
        assert dict(t)["head_warps"] == 1, mode
        assert not SPEC.valid(p, dict(t, head_warps=4)), mode


def test_the_rules_stage_the_tile_for_the_smallest_grids():
    """A 16-bit state and ring in the tile form (ring_mma): a 64-column chunk at a time, the whole tile staged at about
    a CTA an SM (B * HV <= the SMs), and for plain steps and past T = 4 at up to 4 CTAs of 128 rows an SM; other
    dtypes, and one chunk (K 64), no staging."""
    facts = lambda B: dict(B=B, H=16, HV=64, num_sms=132)  # noqa: E731
    p = {n: dict(SPEC.param_defaults, mode="step", T=4, K=128, V=128, state_dtype="bf16", ring_dtype="bf16",
                 idx_dtype="int32", pending=True)[n] for n in SPEC.param_names}

    def pick(B, **kw):
        t, _ = dispatch.select(SPEC, dict(p, **kw), facts(B))
        return t["form"], t["tile_v"], t["staged"]

    assert pick(512) == pick(8) == ("tile", 128, False)
    assert pick(2) == pick(1) == ("tile", 128, True)
    assert pick(1, V=64) == ("tile", 32, True)  # tiles of 128 rows need V a multiple of 128
    # past T = 4 the whole tile staged up to 4 CTAs an SM too (the 6-CTA launch bounds' registers show there)
    assert pick(512, T=8) == pick(9, T=8) == ("tile", 128, False)
    assert pick(8, T=8) == pick(5, T=6) == ("tile", 128, True)
    assert pick(1, T=8) == ("tile", 128, True)
    assert pick(1, T=1, pending=False) == ("tile", 128, True)
    assert pick(8, T=1, pending=False) == ("tile", 128, True)  # plain steps: staged up to 4 CTAs an SM
    assert pick(9, T=1, pending=False) == ("tile", 128, False)
    for kw in (dict(ring_dtype="fp32"), dict(state_dtype="fp32", ring_dtype="fp32")):
        assert pick(512, **kw) == ("tile", 128, False), kw
        assert pick(1, **kw) == ("tile", 32, False), kw
    assert pick(1, K=64, V=64) == ("tile", 32, False)  # one chunk: nothing to stage
