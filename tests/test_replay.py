"""gdnjit.replay (FlashInfer's ReplaySSM commit) and the verify cache of gated_delta_rule_mtp on CPU tensors: one-line
errors, the named calls, and their variants compile for sm_90 with no spills, no stack frame and no warnings."""

from __future__ import annotations

import pytest
import torch

from gdnjit import dispatch
from gdnjit.gdn_engine import prepare as engine_prepare
from gdnjit.replay import prepare, gated_delta_rule_replayssm_commit
from gdnjit.spec import get_spec
from gdnjit.variant import Variant

L, S, H, HV, T, K, V, B = 2, 10, 4, 8, 4, 128, 128, 5
bf = torch.bfloat16


def _commit_args(**kw):
    d = dict(checkpoint_state=torch.zeros(L, S, HV, V, K), rawv_cache=torch.zeros(L, S, HV, T, V, dtype=bf),
             rawk_cache=torch.zeros(L, S, H, T, K, dtype=bf), g_cache=torch.zeros(L, S, HV, T),
             beta_cache=torch.zeros(L, S, HV, T), state_indices=torch.zeros(B, dtype=torch.int32),
             accept_lens=torch.zeros(B, dtype=torch.int32), track_state_indices=None, track_steps=None,
             use_qk_l2norm=True, null_block_id=-1)
    d.update(kw)
    return d


def prep(**kw):
    return prepare(*_commit_args(**kw).values(), require_cuda=False)


def test_commit_call():
    call = prep(null_block_id=0, track_state_indices=torch.zeros(B, dtype=torch.int32),
                track_steps=torch.zeros(B, dtype=torch.int32))
    p, a = call.params, call.args
    assert (p["replay"], p["track"], p["gates"], p["null_slot"], p["T"], p["update"]) == (True, True, "given",
                                                                                          "negative", T, True)
    # FlashInfer's null_block_id is any int >= -1: the first live slot is a kernel argument, one variant for all
    assert a["min_slot"] == 1 and prep(null_block_id=-1).args["min_slot"] == 0
    big = prep(null_block_id=6)
    assert big.args["min_slot"] == 7 and big.params == prep().params
    assert a["B"] == L * B and a["layer_rows"] == B and a["layer_slots"] == S and a["pool_size"] == L * S
    assert (a["k_sn"], a["k_st"], a["k_sh"]) == (H * T * K, K, T * K)  # the cache as a pool of L * S slots
    assert (a["v_sn"], a["a_sn"], a["a_sh"]) == (HV * T * V, HV * T, T)


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(checkpoint_state=torch.zeros(L, S, HV, V, 96)), ValueError, "checkpoint_state: K and V must be in"),
    (dict(checkpoint_state=torch.zeros(L, S, HV, V, K, dtype=torch.float16)), TypeError,
     "checkpoint_state: expected dtype float32, bfloat16"),
    (dict(rawk_cache=torch.zeros(L, S, 3, T, K, dtype=bf)), ValueError, "rawk_cache: its heads H=3 must divide HV=8"),
    (dict(rawk_cache=torch.zeros(L, S, H, 17, K, dtype=bf)), ValueError, "rawk_cache: the cached tokens T"),
    (dict(rawv_cache=torch.zeros(L, S, HV, T, V, dtype=torch.float16)), TypeError, "rawv_cache: expected dtype bfloat16"),
    (dict(g_cache=torch.zeros(L, S, HV, T + 1)), ValueError, "g_cache: expected shape"),
    (dict(beta_cache=torch.zeros(L, S, HV, T, dtype=bf)), TypeError, "beta_cache: expected dtype float32"),
    (dict(accept_lens=torch.zeros(B, dtype=torch.int64)), TypeError, "accept_lens: expected dtype int32"),
    (dict(accept_lens=torch.zeros(B + 1, dtype=torch.int32)), ValueError, "accept_lens: expected shape"),
    (dict(track_steps=torch.zeros(B, dtype=torch.int32)), ValueError, "track_state_indices, track_steps: pass both"),
    (dict(null_block_id=-2), ValueError, "null_block_id: expected an int >= -1"),
    (dict(null_block_id=True), TypeError, "null_block_id: expected an int >= -1, got bool"),
    (dict(use_qk_l2norm=1), TypeError, "use_qk_l2norm: expected a bool"),
])
def test_commit_errors(kw, exc, msg):
    with pytest.raises(exc) as e:
        prep(**kw)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_commit_backends():
    # tcgen05 (FlashInfer's Blackwell commit): the arguments and the backend's own limits checked first, as FlashInfer
    # (CPU tensors: through the torch op, whose CPU path runs the same checks)
    from gdnjit.torch_ops import gated_delta_rule_replayssm_commit as op
    args = list(_commit_args().values())[:7]
    with pytest.raises(NotImplementedError, match="backend='tcgen05'"):
        op(*args, backend="tcgen05")
    with pytest.raises(ValueError, match="tcgen05 commit takes T 4..8 with use_qk_l2norm=True and no track"):
        op(*args, backend="tcgen05", use_qk_l2norm=False)
    track = torch.zeros(B, dtype=torch.int32)
    with pytest.raises(ValueError, match="track=True"):
        op(*args, backend="tcgen05", track_state_indices=track, track_steps=track)
    with pytest.raises(ValueError, match="rawk_cache: the cached tokens T"):
        op(*list(_commit_args(rawk_cache=torch.zeros(L, S, H, 17, K, dtype=bf)).values())[:7], backend="tcgen05")
    with pytest.raises(ValueError, match="checkpoint_state: expected a CUDA tensor"):  # the eager function: same order
        gated_delta_rule_replayssm_commit(*args, backend="tcgen05")
    with pytest.raises(ValueError, match="backend: expected one of"):
        gated_delta_rule_replayssm_commit(*args, backend="cuda")


def _mtp_cache_call(sdt=torch.float32, cache_T=T, **over):
    N = 3
    caches = (torch.zeros(S, HV, cache_T, V, dtype=bf), torch.zeros(S, H, cache_T, K, dtype=bf), torch.zeros(S, HV, cache_T),
              torch.zeros(S, HV, cache_T))
    args = dict(q=torch.zeros(N, T, H, K, dtype=bf), k=torch.zeros(N, T, H, K, dtype=bf),
                v=torch.zeros(N, T, HV, V, dtype=bf), A_log=torch.zeros(HV), a=torch.zeros(N, T, HV, dtype=bf),
                dt_bias=torch.zeros(HV), b=torch.zeros(N, T, HV, dtype=bf), state=torch.zeros(S, HV, V, K, dtype=sdt),
                T=T, read_idx=torch.zeros(N, dtype=torch.int32), cu_seqlens=None, num_accepted=None, ssm_idx=None,
                inter=None, inter_idx=None, parent=None, bounded=False, update=False, null_slot="negative",
                padding="skip", gates="raw", scale=None, l2norm=True, softplus_beta=1.0, softplus_threshold=20.0,
                output=None)
    args.update(over)
    return engine_prepare(*args.values(), require_cuda=False, replay_cache=caches, zero_padding=False)


def test_mtp_cache_call_and_errors():
    _, call = _mtp_cache_call()
    assert call.params["replay_cache"] is True and call.args["rk"] != 0 and call.args["zero_padding"] == 0
    with pytest.raises(ValueError, match=r"replayssm_rawv: expected shape \[slots, heads, L >= T, dim\]"):
        _mtp_cache_call(state=torch.zeros(S + 1, HV, V, K))
    # the engine step's caches may be longer than T (SGLang's rings): rc_len is their token count
    _, call = _mtp_cache_call(cache_T=T + 3)
    assert call.args["rc_len"] == T + 3 and call.params == _mtp_cache_call()[1].params
    with pytest.raises(ValueError, match=f"replayssm_rawv: expected >= T={T} tokens"):
        _mtp_cache_call(cache_T=T - 1)


@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
def test_replay_variants_compile_without_spills(sdt):
    spec = get_spec("gdn")
    calls = [prep(checkpoint_state=torch.zeros(L, S, HV, V, K, dtype=sdt)),
             prep(checkpoint_state=torch.zeros(L, S, HV, V, K, dtype=sdt),
                  track_state_indices=torch.zeros(B, dtype=torch.int32), track_steps=torch.zeros(B, dtype=torch.int32)),
             _mtp_cache_call(sdt)[1]]
    for call in calls:
        for rows in (1, 64, 512):
            tun, _ = dispatch.select(spec, call.params, dict(B=rows, H=H, HV=64, num_sms=132))
            meta = Variant.make(spec, call.params, tun, "sm_90").build().meta
            assert meta["spill_bytes"] == 0 and meta["stack_bytes"] == 0 and not meta["warnings"], (call.params, tun)


def test_scalar_caches_need_no_vector_alignment():
    """g / beta caches are read one by one: T = 3 rows (12 bytes) are accepted (they were refused as unaligned)."""
    t = 3
    call = prep(rawv_cache=torch.zeros(L, S, HV, t, V, dtype=bf), rawk_cache=torch.zeros(L, S, H, t, K, dtype=bf),
                g_cache=torch.zeros(L, S, HV, t), beta_cache=torch.zeros(L, S, HV, t))
    assert call.params["T"] == t
    caches = (torch.zeros(S, HV, t, V, dtype=bf), torch.zeros(S, H, t, K, dtype=bf), torch.zeros(S, HV, t),
              torch.zeros(S, HV, t))
    _, call = engine_prepare(torch.zeros(2, t, H, K, dtype=bf), torch.zeros(2, t, H, K, dtype=bf),
                             torch.zeros(2, t, HV, V, dtype=bf), torch.zeros(HV), torch.zeros(2, t, HV, dtype=bf),
                             torch.zeros(HV), torch.zeros(2, t, HV, dtype=bf), torch.zeros(S, HV, V, K), t,
                             torch.zeros(2, dtype=torch.int32), None, None, None, None, None, None, False, False,
                             "negative", "skip", "raw", None, True, 1.0, 20.0, None, require_cuda=False,
                             replay_cache=caches, zero_padding=False)
    assert call.params["replay_cache"] is True


@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
def test_tc_form_replay_variants_compile_without_spills(sdt):
    """The tc form of the ReplaySSM verify (caching the tokens) and of the commit (no track), T 2..8, as the rules pick
    it at mid / large batches (at T 2..3 below their batch thresholds the recurrent form runs, docs/perf.md v28); the commit
    with track stays with the recurrent form."""
    spec = get_spec("gdn")
    tc = dict(lanes_per_row=4, ilp=1, tile_v=64, stage=True, form="tc", pipe=1, k_warps=1, l2_prefetch=False)
    for t, null in ((2, -1), (3, -1), (5, 0), (8, -1)):
        caches = dict(rawv_cache=torch.zeros(L, S, HV, t, V, dtype=bf), rawk_cache=torch.zeros(L, S, H, t, K, dtype=bf),
                      g_cache=torch.zeros(L, S, HV, t), beta_cache=torch.zeros(L, S, HV, t))
        commit = prep(checkpoint_state=torch.zeros(L, S, HV, V, K, dtype=sdt), null_block_id=null, **caches)
        verify = _mtp_cache_call(sdt, T=t, q=torch.zeros(3, t, H, K, dtype=bf), k=torch.zeros(3, t, H, K, dtype=bf),
                                 v=torch.zeros(3, t, HV, V, dtype=bf), a=torch.zeros(3, t, HV, dtype=bf),
                                 b=torch.zeros(3, t, HV, dtype=bf), cache_T=t)[1]
        for call in (commit, verify):
            tun, _ = dispatch.select(spec, call.params, dict(B=64, H=H, HV=64, num_sms=132))
            # B * HV = 4096: a bf16 verify (T >= 4) and a bf16 commit take the 128-row tile (docs/perf.md v27, v44)
            want = dict(tc, tile_v=128) if sdt == torch.bfloat16 and (t >= 4 or call is commit) else tc
            assert tun == want, (call.params["replay"], t, tun)
            meta = Variant.make(spec, call.params, tun, "sm_90").build().meta
            assert meta["spill_bytes"] == 0 and meta["stack_bytes"] == 0 and not meta["warnings"], (call.params, meta)
            if t <= 3:  # B * HV 128: under the batch thresholds at T 2..3 (bf16 from 256, fp32 from 1024)
                assert dispatch.select(spec, call.params, dict(B=2, H=H, HV=64, num_sms=132))[0]["form"] != "tc", t
    tracked = prep(checkpoint_state=torch.zeros(L, S, HV, V, K, dtype=sdt),
                   track_state_indices=torch.zeros(B, dtype=torch.int32), track_steps=torch.zeros(B, dtype=torch.int32))
    assert dispatch.select(spec, tracked.params, dict(B=64, H=H, HV=64, num_sms=132))[0]["form"] == "recurrent"


@pytest.mark.parametrize("name", ["checkpoint_state", "rawv_cache", "rawk_cache", "g_cache", "beta_cache",
                                  "state_indices", "accept_lens", "track_state_indices", "track_steps"])
def test_commit_refuses_unaligned_bases(name):
    """FlashInfer's contract: every base address 16-byte aligned (a view one element into its storage is refused)."""
    kw = dict(track_state_indices=torch.zeros(B, dtype=torch.int32), track_steps=torch.zeros(B, dtype=torch.int32))
    x = _commit_args(**kw)[name]
    storage = torch.zeros(x.numel() + 1, dtype=x.dtype)
    kw[name] = storage[1:].view(x.shape)
    with pytest.raises(ValueError, match=f"{name}: .*16-byte aligned"):
        prep(**kw)
