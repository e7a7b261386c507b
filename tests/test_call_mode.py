"""Calling modes (gdnjit/call_mode.py) on the CPU: every mode of the gdn kernel builds its call from only the names
it sets (the spec's defaults fill the rest), a name the spec does not declare or a required one left out fails by
name, and a mode's per-call pointers reach the launch by name, not by position."""

from __future__ import annotations

import re

import pytest
import torch

from gdnjit import gdn, gdn_engine, replay, spec_step
from gdnjit.call_mode import CallMode
from gdnjit.gdn_core import SPEC
from gdnjit.runner import KernelInterfaceError
from gdnjit.spec import SPEC_DIR, load_spec_file

bf = torch.bfloat16
B, T, H, HV, K, V = 3, 4, 2, 4, 128, 128


def _tokens(lead, dtype=bf):
    return dict(q=torch.randn(*lead, H, K, dtype=dtype), k=torch.randn(*lead, H, K, dtype=dtype),
                v=torch.randn(*lead, HV, V, dtype=dtype), A_log=torch.rand(HV), a=torch.randn(*lead, HV, dtype=dtype),
                dt_bias=torch.randn(HV), b=torch.randn(*lead, HV, dtype=dtype))


def _native_direct():
    x = _tokens((B, 1))
    return gdn.prepare("klast", *x.values(), torch.randn(B, HV, V, K), None, None, None, None, None, None, True, True,
                       True, require_cuda=False)[1]


def _native_pool_ssm():
    x = _tokens((B, T))
    pool, ri = torch.randn(20, HV, V, K), torch.arange(B, dtype=torch.int64)
    ssm = torch.arange(B * T, dtype=torch.int64).view(B, T)
    return gdn.prepare("klast", *x.values(), pool, ri, None, None, None, None, ssm, True, True, False,
                       require_cuda=False, write_once=True)[1]


def _native_kmajor():
    x = _tokens((B, 2))
    return gdn.prepare("kmajor", *x.values(), torch.randn(B, HV, K, V), None, None, None, None, None, None, True,
                       True, True, require_cuda=False)[1]


def _engine_varlen():
    x = _tokens((1, B * T))
    return gdn_engine.prepare(*x.values(), torch.zeros(40, HV, V, K), T,
                              torch.arange(B * T, dtype=torch.int32).view(B, T),
                              torch.arange(0, B * T + 1, T, dtype=torch.int32), torch.ones(B, dtype=torch.int32),
                              None, None, None, None, True, True, "nonpositive", "skip", "raw", None, True, 1.0, 20.0,
                              None, require_cuda=False)[1]


def _engine_replay_cache():
    x = _tokens((B, T))
    rc = (torch.zeros(40, HV, T, V, dtype=bf), torch.zeros(40, H, T, K, dtype=bf), torch.zeros(40, HV, T),
          torch.zeros(40, HV, T))
    return gdn_engine.prepare(*x.values(), torch.zeros(40, HV, V, K), T, torch.arange(B, dtype=torch.int32), None,
                              None, None, None, None, None, False, False, "negative", "skip", "raw", None, True, 1.0,
                              20.0, None, require_cuda=False, replay_cache=rc)[1]


def _spec_step(flush=False):
    cache = spec_step.spec_cache(10, H, HV, 3, K, V)
    x = _tokens((B, 3)) if not flush else dict.fromkeys(("q", "k", "v", "A_log", "a", "dt_bias", "b"))
    return spec_step.prepare(*x.values(), torch.zeros(10, HV, V, K), torch.arange(B, dtype=torch.int32),
                             torch.zeros(B, dtype=torch.int32), cache, None, True, 1.0, 20.0, -1, None, flush=flush,
                             require_cuda=False)[1]


def _commit():
    L, S = 2, 10
    return replay.prepare(torch.zeros(L, S, HV, V, K), torch.zeros(L, S, HV, T, V, dtype=bf),
                          torch.zeros(L, S, H, T, K, dtype=bf), torch.zeros(L, S, HV, T), torch.zeros(L, S, HV, T),
                          torch.arange(B, dtype=torch.int32), torch.zeros(B, dtype=torch.int32),
                          torch.zeros(B, dtype=torch.int32), torch.zeros(B, dtype=torch.int32), True, -1,
                          require_cuda=False)


MODES = {
    "native direct": (gdn.NATIVE, _native_direct), "native pool + ssm": (gdn.NATIVE, _native_pool_ssm),
    "native kmajor": (gdn.NATIVE, _native_kmajor), "engine varlen": (gdn_engine.ENGINE, _engine_varlen),
    "engine replay cache": (gdn_engine.ENGINE, _engine_replay_cache), "fused step": (spec_step.STEP, _spec_step),
    "fused flush": (spec_step.FLUSH, lambda: _spec_step(flush=True)), "replay commit": (replay.COMMIT, _commit),
}


@pytest.mark.parametrize("case", sorted(MODES))
def test_every_mode_builds_its_call_from_the_names_it_sets(case, monkeypatch):
    """What each mode names is a subset of the spec; everything it leaves out is the spec's default; the built
    call is complete (the launch buffer packs by name) and its pointers are the mode's per-call pointers."""
    mode, build = MODES[case]
    seen = {}
    real = CallMode.call

    def spy(self, params, facts, args, device, pdl=False):
        seen.update(params=dict(params), args=dict(args))
        return real(self, params, facts, args, device, pdl)

    monkeypatch.setattr(CallMode, "call", spy)
    call = build()
    assert set(seen["params"]) <= set(SPEC.param_names) and set(seen["args"]) <= {n for n, _ in SPEC.args}
    assert len(seen["args"]) < len(SPEC.args)  # a mode names what it sets, not the whole interface
    for n, default in SPEC.param_defaults:
        if n not in seen["params"]:
            assert call.params[n] == default, n
    for n, default in SPEC.arg_defaults:
        if n not in seen["args"]:
            assert call.args[n] == default, n
    assert len(call.arg_values()) == len(SPEC.args) and len(call.param_values()) == len(SPEC.param_names)
    live = {n for n in mode.spec_pointers if call.args[n]}
    assert live <= set(mode.pointers), live - set(mode.pointers)
    # the memoised path's pointer tuple equals the first call's, by name
    assert mode.pack(*(call.args[n] for n in mode.pointers)) == mode.pointer_values(call)


def test_a_name_the_spec_does_not_declare_fails_by_name():
    mode = CallMode(SPEC, "test", ("q", "state"))
    base_params = dict(K=128, V=128, T=1, in_dtype="bf16", out_dtype="bf16", state_dtype="fp32", dtb_dtype="fp32",
                       pool=False, idx_dtype="int32", update=True, l2norm=True)
    base_args = dict(q=16, state=32, slot_stride=1, pool_size=1, B=1, H=1, HV=1, scale=1.0, s_head=1, s_row=1)
    call = mode.call(base_params, dict(B=1, H=1, HV=1), base_args, 0)
    assert call.args["cu"] == 0 and call.args["softplus_threshold"] == 20.0 and call.params["fused_step"] == "none"
    with pytest.raises(KernelInterfaceError, match=re.escape("mode test: params: names the spec does not declare "
                                                             "['ragged']")):
        mode.call(dict(base_params, ragged=True), dict(B=1, H=1, HV=1), base_args, 0)
    with pytest.raises(KernelInterfaceError, match=re.escape("mode test: args: names the spec does not declare "
                                                             "['q_stride']")):
        mode.call(base_params, dict(B=1, H=1, HV=1), dict(base_args, q_stride=4), 0)
    with pytest.raises(KernelInterfaceError, match=re.escape("args: required names left out ['scale']")):
        mode.call(base_params, dict(B=1, H=1, HV=1), {k: v for k, v in base_args.items() if k != "scale"}, 0)
    with pytest.raises(KernelInterfaceError, match=re.escape("params: required names left out ['T']")):
        mode.call({k: v for k, v in base_params.items() if k != "T"}, dict(B=1, H=1, HV=1), base_args, 0)
    with pytest.raises(KernelInterfaceError, match=re.escape("pointer(s) ['k'] set but not among the mode's per-call "
                                                             "pointers ['q', 'state']")):
        mode.call(base_params, dict(B=1, H=1, HV=1), dict(base_args, k=48), 0)


@pytest.mark.parametrize("pointers, what", [(("q", "cu_seqlens"), "unknown ['cu_seqlens']"),
                                            (("q", "q"), "repeated names"), (("q", "scale"), "unknown ['scale']")])
def test_a_mode_declares_known_pointers_once(pointers, what):
    with pytest.raises(KernelInterfaceError, match=re.escape(what)):
        CallMode(SPEC, "bad", pointers)


def test_pointers_reach_the_launch_by_name(tmp_path):
    """A spec whose q and k swap places: the mode's values land at the spec's positions of q and k."""
    text = (SPEC_DIR / "gdn.yaml").read_text()
    swapped = re.sub(r"(?m)^  q: ptr = null( .*)?\n  k: ptr = null\n", "  k: ptr = null\n  q: ptr = null\n", text, 1)
    assert swapped != text
    path = tmp_path / "gdn.yaml"
    path.write_text(swapped)
    spec = load_spec_file(path)
    for s in (SPEC, spec):
        mode = CallMode(s, "test", ("state", "k", "q"))
        packed = mode.pack(300, 200, 100)
        order = [n for n, _ in s.args[:len(packed)]]
        assert packed[order.index("q")] == 100 and packed[order.index("k")] == 200
        assert packed[order.index("state")] == 300 and packed.count(0) == len(packed) - 3
