"""The runner's named kernel interface (gdnjit/runner.py), on the CPU: an op's call reaches the launch
buffer only through the names its spec declares, so a spec whose args are renamed or reordered is
either refused by name or packed in its own order, never silently misread by position; and the
runner, not a lower layer, drops its caches when the configuration is replaced."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from gdnjit import config as _config
from gdnjit import conv, gdn, nvfp4
from gdnjit.runner import RUNNER, KernelCall, KernelInterfaceError
from gdnjit.spec import SPEC_DIR, get_spec, load_spec_file
from gdnjit.gdn import NATIVE_CONVENTIONS


def _gdn_call() -> KernelCall:
    B, T, H, HV, K, V = 3, 2, 2, 4, 128, 128
    q = torch.randn(B, T, H, K, dtype=torch.bfloat16)
    k = torch.randn_like(q)
    v = torch.randn(B, T, HV, V, dtype=torch.bfloat16)
    a = torch.randn(B, T, HV, dtype=torch.bfloat16)
    b = torch.randn_like(a)
    state = torch.randn(B, HV, V, K)
    _, call = gdn.prepare("klast", q, k, v, torch.rand(HV), a, torch.randn(HV), b, state, None, None, None, None,
                           None, None, True, True, True, require_cuda=False)
    return call


def _nvfp4_call() -> KernelCall:
    return nvfp4.prepare(torch.randn(5, 64, dtype=torch.bfloat16), 2.0, require_cuda=False, arch="sm_90")[2]


def _conv_call() -> KernelCall:
    x, state, w = torch.randn(3, 64, dtype=torch.bfloat16), torch.randn(4, 64, 3), torch.randn(64, 4)
    idx = torch.tensor([2, 0, -1], dtype=torch.int32)
    return conv.prepare(x, state, w, None, "silu", idx, None, None, -1, -1, None, require_cuda=False)[1]


CALLS = {"gdn": _gdn_call, "nvfp4_quantize": _nvfp4_call, "causal_conv1d_update": _conv_call}


def _spec_copy(tmp_path, name: str, edit) -> object:
    text = (SPEC_DIR / f"{name}.yaml").read_text()
    new = edit(text)
    assert new != text
    path = tmp_path / f"{name}.yaml"
    path.write_text(new)
    return load_spec_file(path)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_calls_name_every_param_fact_and_arg(name):
    call = CALLS[name]()
    spec = get_spec(name)
    assert call.spec is spec
    assert set(call.params) == set(spec.param_names)
    assert set(call.facts) == set(spec.facts) - {"num_sms"}
    assert list(call.args) == [n for n, _ in spec.args]  # built in the spec's order, but packed by name
    assert call.arg_values() == tuple(call.args[n] for n, _ in spec.args)


@pytest.mark.parametrize("name,old,new", [("gdn", "scale", "qk_scale"), ("nvfp4_quantize", "x_stride", "row_stride"),
                                               ("causal_conv1d_update", "s_col", "s_tok")])
def test_a_renamed_arg_is_refused_by_name(tmp_path, name, old, new):
    """A copy of the spec with one kernel argument renamed: packing the op's call fails, naming both."""
    renamed = _spec_copy(tmp_path, name, lambda t: re.sub(rf"(?m)^  {old}:", f"  {new}:", t, count=1))
    call = dataclasses.replace(CALLS[name](), spec=renamed)
    with pytest.raises(KernelInterfaceError, match=rf"args: .*missing \['{new}'\] and unknown \['{old}'\]"):
        call.arg_values()


@pytest.mark.parametrize("name,first,second", [("gdn", "q", "k"), ("gdn", "B", "HV"),
                                               ("nvfp4_quantize", "M", "sf_rows"),
                                               ("causal_conv1d_update", "s_slot", "s_col")])
def test_reordered_args_are_packed_in_the_spec_order(tmp_path, name, first, second):
    """Swapping two args in a copy of the spec moves their values in the packed buffer with them: the
    layout comes from the spec's names, not from the order the op module wrote them in."""

    def swap(text):
        a = re.search(rf"(?m)^  {first}: \w+.*$", text).group(0)
        b = re.search(rf"(?m)^  {second}: \w+.*$", text).group(0)
        return text.replace(a, "\0").replace(b, a).replace("\0", b)

    swapped = _spec_copy(tmp_path, name, swap)
    call = CALLS[name]()
    packed = dataclasses.replace(call, spec=swapped).arg_values()
    names = [n for n, _ in swapped.args]
    assert names.index(first) > names.index(second)
    assert packed == tuple(call.args[n] for n in names)
    assert packed != call.arg_values() or call.args[first] == call.args[second]


def test_a_missing_param_or_fact_is_refused_by_name():
    call = _gdn_call()
    params = dict(call.params)
    del params["l2norm"]
    with pytest.raises(KernelInterfaceError, match=r"params: .*missing \['l2norm'\]"):
        dataclasses.replace(call, params=params).param_values()
    with pytest.raises(KernelInterfaceError, match=r"facts: .*unknown \['num_sms'\]"):
        dataclasses.replace(call, facts=dict(call.facts, num_sms=132)).fact_values()


def test_a_replaced_config_clears_the_runner_and_the_ops_memos(tmp_path):
    before = RUNNER.sync()
    gdn._fast["x"] = 1
    gdn._guarded["y"] = 2
    RUNNER._resolved["z"] = 3
    assert RUNNER.sync() is before
    assert gdn._fast and gdn._guarded and RUNNER._resolved  # the same config: nothing dropped
    _config.set_config(_config.load_config({"GDNJIT_CACHE_DIR": str(tmp_path)}))
    try:
        assert gdn._fast and RUNNER._resolved  # set_config itself reaches into no cache
        after = RUNNER.sync()
        assert after is not before
        assert not gdn._fast and not gdn._guarded and not RUNNER._resolved
    finally:
        _config.set_config(None)


_WARM_HOT_PATH = """
import json, sys
import torch
import gdnjit.gdn, gdnjit.nvfp4, gdnjit.conv
from gdnjit.config import get_config
from gdnjit.gdn import NATIVE_CONVENTIONS
from gdnjit.runner import build_entry, choose_variant
from gdnjit.spec import get_spec
p = dict(layout="klast", K=128, V=128, T=1, in_dtype="bf16", out_dtype="bf16", state_dtype="fp32", dtb_dtype="fp32",
         pool=True, idx_dtype="int32", same_pool=True, inter_dtype="none", ssm_idx_dtype="none", update=True, l2norm=True, slot_strided=False, **NATIVE_CONVENTIONS)
v = choose_variant(get_spec("gdn"), p, dict(B=32, H=16, HV=32, num_sms=132), "sm_90")
entry = build_entry(v, get_config())
print(json.dumps({"origin": entry.origin, "loaded": [m for m in ("jinja2", "yaml", "filelock", "cuda.bindings.nvrtc")
                                                      if m in sys.modules]}))
"""


def test_a_warm_cache_hit_imports_no_jinja_yaml_filelock_or_nvrtc(tmp_path):
    """A serving process whose kernels are cached resolves, keys and reads its variant without the libraries
    only a miss needs (each costs its first call 10-60 ms): the records replace YAML, the common expression
    subset Jinja, the regex include scan Jinja again, the NVRTC wheel's metadata the library."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, GDNJIT_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SPEC_DIR.parents[1]), env.get("PYTHONPATH")]))
    run = lambda: json.loads(subprocess.run([sys.executable, "-c", _WARM_HOT_PATH], env=env, capture_output=True,  # noqa: E731
                                            text=True, check=True).stdout.splitlines()[-1])
    first = run()  # compiles (a miss loads what it needs)
    assert first["origin"] == "built"
    second = run()
    assert second == {"origin": "disk", "loaded": []}


def test_pinned_tunables_are_set_over_the_choice_or_refused():
    """runner.pin: a call's pinned tunables replace the dispatcher's by name; an unknown name is a
    KernelInterfaceError naming it, a choice the params make invalid a ValueError naming the pinned values; nothing
    pinned is the variant itself. The runner's memo keeps a pinned call apart from the same call unpinned."""
    from gdnjit import dispatch
    from gdnjit.runner import Runner, pin
    from gdnjit.variant import Variant

    spec = get_spec("gdn_lazy")
    p = dict(spec.param_defaults, mode="prep", K=128, V=128, T=1, state_dtype="fp32", ring_dtype="fp32",
             idx_dtype="int32")
    p = {n: p[n] for n in spec.param_names}
    v = Variant.make(spec, p, dispatch.select(spec, p, dict(B=512, H=16, HV=64, num_sms=132))[0], "sm_90")
    assert dict(v.tunables)["window"] == 16
    w8 = pin(v, {"window": 8})
    assert dict(w8.tunables) == dict(dict(v.tunables), window=8) and w8.arch == v.arch
    assert pin(v, None) is v and pin(v, {}) is v
    with pytest.raises(KernelInterfaceError, match=r"pinned: expected tunable names .* got unknown \['windw'\]"):
        pin(v, {"windw": 8})
    with pytest.raises(ValueError, match=r"pinned tunables \{'form': 'tile'\}: expected a choice valid"):
        pin(v, {"form": "tile"})  # a prep launch is the rows form's
    call = _gdn_call()
    assert Runner.resolve_key(call) != Runner.resolve_key(dataclasses.replace(call, pinned={"tile_v": 8}))
    assert Runner.resolve_key(call) == Runner.resolve_key(dataclasses.replace(call, pinned={}))
