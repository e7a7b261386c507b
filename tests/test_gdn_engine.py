"""gdnjit.gdn_engine: argument checks (one-line errors naming the argument) and the named call it builds, on CPU
tensors (``prepare(require_cuda=False)``); the engine variants compile without spills for sm_90."""

from __future__ import annotations

import pytest
import torch

from gdnjit import dispatch
from gdnjit.gdn_engine import prepare
from gdnjit.spec import get_spec
from gdnjit.variant import Variant

H, HV, K, V = 2, 4, 128, 128


def _args(N=3, T=4, varlen=True, sdt=torch.float32):
    lead = (1, N * T) if varlen else (N, T)
    bf = torch.bfloat16
    d = dict(q=torch.randn(*lead, H, K, dtype=bf), k=torch.randn(*lead, H, K, dtype=bf),
             v=torch.randn(*lead, HV, V, dtype=bf), A_log=torch.randn(HV), a=torch.randn(*lead, HV, dtype=bf),
             dt_bias=torch.randn(HV), b=torch.randn(*lead, HV, dtype=bf), state=torch.zeros(40, HV, V, K, dtype=sdt),
             T=T, read_idx=torch.arange(N * T, dtype=torch.int32).view(N, T),
             cu_seqlens=torch.arange(0, N * T + 1, T, dtype=torch.int32) if varlen else None,
             num_accepted=torch.ones(N, dtype=torch.int32), ssm_idx=None, inter=None, inter_idx=None, parent=None,
             bounded=True, update=True, null_slot="nonpositive", padding="skip", gates="raw", scale=None, l2norm=True,
             softplus_beta=1.0, softplus_threshold=20.0, output=None)
    return d


def prep(**kw):
    d = _args(**{k: kw.pop(k) for k in ("N", "varlen", "sdt") if k in kw})
    d.update(kw)
    return prepare(*d.values(), require_cuda=False)


def test_vllm_spec_call():
    out, call = prep(ssm_idx=torch.arange(12, dtype=torch.int32).view(3, 4))
    p, a = call.params, call.args
    assert out.shape == (1, 12, HV, V)
    assert (p["varlen"], p["accepted"], p["tree"], p["inter_indexed"], p["null_slot"], p["padding"]) == (
        True, True, False, False, "nonpositive", "skip")
    assert p["ssm_idx_dtype"] == "int32" and p["update"] is True and p["T"] == 4
    assert a["q_sn"] == a["q_st"] == H * K and a["o_sn"] == a["o_st"] == HV * V  # varlen: rows are tokens
    assert a["read_sn"] == 4 and a["read_cols"] == 4 and a["B"] == 3


def test_strided_1d_read_indices():
    table = torch.arange(40, dtype=torch.int32).view(10, 4)
    bf = torch.bfloat16
    _, call = prep(N=10, varlen=False, read_idx=table[:, 0], num_accepted=None, q=torch.zeros(10, 4, H, K, dtype=bf),
                   k=torch.zeros(10, 4, H, K, dtype=bf), v=torch.zeros(10, 4, HV, V, dtype=bf),
                   a=torch.zeros(10, 4, HV, dtype=bf), b=torch.zeros(10, 4, HV, dtype=bf))
    assert call.args["read_sn"] == 4 and call.params["accepted"] is False


def test_sglang_tree_call():
    N, T = 3, 4
    _, call = prep(num_accepted=None, read_idx=torch.tensor([0, -1, 2], dtype=torch.int32),
                   inter=torch.zeros(5, T, HV, V, K), inter_idx=torch.tensor([4, 0, -1], dtype=torch.int32),
                   parent=torch.zeros(N, T, dtype=torch.int32), update=False, null_slot="negative",
                   padding="zero_state")
    p, a = call.params, call.args
    assert (p["tree"], p["inter_indexed"], p["padding"], p["inter_dtype"]) == (True, True, "zero_state", "fp32")
    assert a["inter_rows"] == 5 and a["inter_sn"] == T * HV * V * K and a["parent_sn"] == T


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(T=0), ValueError, "T: expected an int in 1..16"),
    (dict(T=True), ValueError, "T: expected an int"),
    (dict(cu_seqlens=torch.arange(4, dtype=torch.int64)), TypeError, "cu_seqlens: expected dtype int32"),
    (dict(num_accepted=torch.ones(3, dtype=torch.int64)), TypeError, "num_accepted_tokens: expected dtype int32"),
    (dict(num_accepted=None), ValueError, "read_idx: expected shape [N=3]"),
    (dict(read_idx=torch.zeros(3, 4, dtype=torch.int16)), TypeError, "read_idx: expected dtype int32, int64"),
    (dict(null_slot="zero"), ValueError, "null_slot: expected one of"),
    (dict(padding="drop"), ValueError, "padding: expected one of"),
    (dict(gates="fp32"), ValueError, "gates: expected 'raw' or 'given'"),
    (dict(scale=-1.0), ValueError, "scale: expected a positive float"),
    (dict(softplus_beta=0.0), ValueError, "softplus_beta: expected a positive float"),
    (dict(parent=torch.zeros(3, 4, dtype=torch.int32)), ValueError, "retrieve_parent_token: tree verification needs"),
    (dict(inter_idx=torch.zeros(3, dtype=torch.int32)), ValueError, "intermediate_state_indices: needs"),
    (dict(ssm_idx=torch.zeros(3, 4, dtype=torch.int32), update=False), ValueError, "ssm_state_indices: writes pool"),
    (dict(ssm_idx=torch.zeros(3, 5, dtype=torch.int32)), ValueError, "ssm_state_indices: expected shape [N=3, T=4]"),
    (dict(state=torch.zeros(40, HV, V, K)[:, :, :, :64]), ValueError, "initial_state: expected shape"),
    (dict(state=torch.zeros(40, HV, V, 2 * K)[..., ::2]), ValueError, "initial_state: each slot's"),
    (dict(inter=torch.zeros(3, 2, HV, V, K), inter_idx=torch.zeros(3, dtype=torch.int32)), ValueError,
     "intermediate_states_buffer: expected >= T=4 steps"),
    (dict(inter=torch.zeros(3, 4, HV, V, K), inter_idx=torch.zeros(3, dtype=torch.int64)), TypeError,
     "intermediate_state_indices: expected the dtype of the read indices"),
    (dict(a=torch.randn(1, 12, HV)), TypeError, "a: expected the dtype of q"),
    (dict(gates="given"), TypeError, "g: expected dtype float32"),
])
def test_errors(kw, exc, msg):
    with pytest.raises(exc) as e:
        prep(**kw)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_varlen_needs_one_row():
    with pytest.raises(ValueError, match=r"q: with cu_seqlens expected shape \[1, total_tokens, H, K\]"):
        d = _args(varlen=False)
        d["cu_seqlens"] = torch.arange(0, 13, 4, dtype=torch.int32)
        prepare(*d.values(), require_cuda=False)


def test_given_gates_refuse_a_log():
    with pytest.raises(ValueError, match="A_log, dt_bias: not used with given gates"):
        prep(gates="given", a=torch.randn(1, 12, HV), b=torch.rand(1, 12, HV))


ENGINE_CASES = [
    dict(varlen=True, accepted=True, ssm_idx_dtype="int32", null_slot="nonpositive"),
    dict(varlen=True, accepted=True, inter_dtype="fp32", update=False, null_slot="nonpositive"),
    dict(varlen=True, null_slot="nonpositive"),
    dict(varlen=True, bounded=True, null_slot="nonpositive"),
    dict(varlen=True, accepted=True, ssm_idx_dtype="int64", gates="given", null_slot="nonpositive"),
    dict(varlen=True, inter_indexed=True, tree=True, inter_dtype="bf16", update=False, padding="zero_state"),
    dict(varlen=True, inter_indexed=True, tree=True, inter_dtype="fp32", update=True, padding="zero_state"),
    dict(varlen=True, padding="zero_state"),
    dict(inter_indexed=True, inter_dtype="fp32", update=False, padding="zero_state"),
    # SGLang's ReplaySSM ring verify (cache_ring): varlen, bounded by cache_steps or not, frozen or updated
    dict(varlen=True, padding="zero_state", replay_cache=True, update=False),
    dict(varlen=True, bounded=True, padding="zero_state", replay_cache=True, update=True),
]


@pytest.mark.sample(3)  # ~2.3 s a case
@pytest.mark.parametrize("case", range(len(ENGINE_CASES)))
def test_engine_variants_compile_without_spills(case):
    """Each engine convention's variants (as dispatched at B 1 / 128 / 512, T 1 / 4 / 8, both state dtypes) compile
    for sm_90 with no spills, no stack frame and no warnings."""
    spec = get_spec("gdn")
    from gdnjit.gdn import NATIVE_CONVENTIONS

    seen = set()
    for T in (1, 4, 8):
        for sd in ("fp32", "bf16"):
            c = dict(ENGINE_CASES[case])
            if c.get("inter_dtype") == "bf16" and sd == "fp32":
                continue
            p = dict(layout="klast", K=128, V=128, T=T, in_dtype="bf16", out_dtype="bf16", state_dtype=sd,
                     dtb_dtype="fp32", pool=True, idx_dtype="int32", same_pool=True, inter_dtype="none",
                     ssm_idx_dtype="none", update=True, l2norm=True, slot_strided=False, **NATIVE_CONVENTIONS)
            p.update(c)
            for B in (1, 128, 512):
                tun, _ = dispatch.select(spec, p, dict(B=B, H=16, HV=64, num_sms=132))
                key = (tuple(sorted(p.items())), tuple(sorted(tun.items())))
                if key in seen:
                    continue
                seen.add(key)
                v = Variant.make(spec, p, tun, "sm_90")
                assert tun["form"] == "recurrent"  # the CTA kernel or the pipelined one (gdn.yaml's engine constraint)
                meta = v.build().meta
                assert meta["spill_bytes"] == 0 and meta["stack_bytes"] == 0 and not meta["warnings"], (p, tun, meta)


def test_round_beta_only_for_one_token_raw_gates():
    """round_beta (SGLang's packed decode: beta rounded to the input dtype) is a kernel argument compiled into the
    one-token variants only, so a multi-token or given-gates call asking for it is refused, not silently unrounded."""
    from gdnjit.gdn_engine import prepare as engine_prepare

    d = _args(N=3, T=1, varlen=False)
    d.update(read_idx=torch.arange(3, dtype=torch.int32), num_accepted=None)
    _, call = engine_prepare(*d.values(), require_cuda=False, round_beta=True)
    assert call.args["beta_round"] == 1 and call.params["T"] == 1
    with pytest.raises(ValueError, match="round_beta: only for one-token steps with raw gates"):
        engine_prepare(*_args(N=3, T=4).values(), require_cuda=False, round_beta=True)
    with pytest.raises(TypeError, match="round_beta: expected a bool"):
        engine_prepare(*d.values(), require_cuda=False, round_beta=1)
