"""Cache keys (gdnjit/cache/key.py): every field matters, types never collide, stable across processes.

CPU only (no NVRTC compile here: building key fields needs only the NVRTC version query).
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gdnjit.cache.key import CACHE_FORMAT, REQUIRED_FIELDS, cache_key, canonical, entry_name
from gdnjit.spec import get_spec
from gdnjit.variant import Variant
from gdnjit.gdn import NATIVE_CONVENTIONS

REPO = Path(__file__).resolve().parents[2]

BASE_PARAMS = dict(
    layout="klast", K=128, V=128, T=1, in_dtype="bf16", out_dtype="bf16", state_dtype="fp32",
    dtb_dtype="fp32", pool=False, idx_dtype="int32", same_pool=True, inter_dtype="none",
    ssm_idx_dtype="none", update=True, l2norm=True, slot_strided=False, **NATIVE_CONVENTIONS,
)
BASE_TUNABLES = dict(lanes_per_row=8, ilp=2, tile_v=32)
SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
# hypothesis tests: at depth in the full test tier (GDNJIT_TEST_FULL=1, tests/conftest.py), a sample by default
FULL_TIER = os.environ.get("GDNJIT_TEST_FULL", "").strip() not in ("", "0")


@pytest.fixture(scope="module")
def spec():
    return get_spec("gdn")


def base_tunables(spec) -> dict[str, Any]:
    """BASE_TUNABLES, completed with the first valid value of any tunable the spec has gained since."""
    for choice in spec.all_tunable_choices():
        if all(choice.get(n) == v for n, v in BASE_TUNABLES.items() if n in choice) and not spec.violations(
            BASE_PARAMS, choice
        ):
            return choice
    raise AssertionError("no valid tunables extend BASE_TUNABLES")


@pytest.fixture(scope="module")
def tunables(spec):
    return base_tunables(spec)


@pytest.fixture(scope="module")
def variant(spec, tunables):
    return Variant.make(spec, BASE_PARAMS, tunables, "sm_90")


@pytest.fixture
def fields(variant) -> dict[str, Any]:
    """A private deep copy of the real variant's key fields (tests mutate it)."""
    return copy.deepcopy(variant.key_fields)


def _perturb(v: Any) -> Any:
    """A different value of the same kind."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + 1
    if isinstance(v, float):
        return v + 0.5
    if isinstance(v, str):
        return v + "x"
    if v is None:
        return "none"
    if isinstance(v, list):
        return [*v, "extra"]
    if isinstance(v, dict):
        return {**v, "extra_field": 1}
    raise TypeError(type(v))


def _leaf_paths(v: Any, path: tuple = ()) -> Iterator[tuple]:
    """Paths (dict keys / list indices) to every scalar inside ``v``."""
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _leaf_paths(x, (*path, k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _leaf_paths(x, (*path, i))
    else:
        yield path


def _set(root: Any, path: tuple, value: Any) -> None:
    for p in path[:-1]:
        root = root[p]
    root[path[-1]] = value


def _get(root: Any, path: tuple) -> Any:
    for p in path:
        root = root[p]
    return root


# ---- the real variant's fields -------------------------------------------------------------


def test_variant_key_fields_cover_required_fields(variant, tunables):
    assert REQUIRED_FIELDS <= set(variant.key_fields)
    f = variant.key_fields
    assert f["format"] == CACHE_FORMAT
    assert f["arch"] == "sm_90"
    assert f["params"] == BASE_PARAMS
    assert f["tunables"] == tunables
    assert re.fullmatch(r"[0-9a-f]{64}", f["template_hash"])
    assert re.fullmatch(r"\d+\.\d+", f["nvrtc_version"])
    assert any("sm_90" in o for o in f["options"])
    assert variant.key == cache_key(f)
    assert re.fullmatch(r"[0-9a-f]{64}", variant.key)


@pytest.mark.parametrize("field", sorted(REQUIRED_FIELDS))
def test_changing_any_top_level_field_changes_key(fields, field):
    base = cache_key(fields)
    fields[field] = _perturb(fields[field])
    assert cache_key(fields) != base


@pytest.mark.parametrize(
    "field,value",
    [
        ("arch", "sm_90a"),
        ("arch", "sm_100a"),
        ("nvrtc_version", "12.8"),
        ("nvrtc_version", "13.1"),
        ("options", ["--gpu-architecture=sm_90", "-std=c++17", "--ptxas-options=-v", "-default-device", "--device-int128", "-lineinfo"]),
        ("options", ["--gpu-architecture=sm_90", "-std=c++17"]),
        ("options", ["-std=c++17", "--gpu-architecture=sm_90", "--ptxas-options=-v", "-default-device", "--device-int128"]),
        ("gdnjit_version", "0.1.1"),
        ("gdnjit_version", "0.2.0"),
        ("format", CACHE_FORMAT + 1),
        ("template_hash", "0" * 64),
        ("template", "other.cu.j2"),
        ("kernel_name", "gdn_step2"),
        ("spec", "gdn2"),
    ],
)
def test_realistic_field_changes_change_key(fields, field, value):
    assert fields[field] != value
    base = cache_key(fields)
    fields[field] = value
    assert cache_key(fields) != base


def test_every_nested_leaf_changes_key(fields):
    """Every scalar anywhere in the fields (params, tunables, values, args, options...) is in the key."""
    base = cache_key(fields)
    keys = {base}
    paths = list(_leaf_paths(fields))
    assert len(paths) > 50  # sanity: params + tunables + values + args + options
    for path in paths:
        mutated = copy.deepcopy(fields)
        _set(mutated, path, _perturb(_get(fields, path)))
        k = cache_key(mutated)
        assert k != base, path
        keys.add(k)
    assert len(keys) == len(paths) + 1  # all distinct from each other too


def test_every_allowed_param_value_changes_key(spec, fields):
    base = cache_key(fields)
    seen = {base}
    n = 0
    for name in spec.param_names:
        for alt in spec.allowed(name):
            if alt == fields["params"][name] and type(alt) is type(fields["params"][name]):
                continue
            mutated = copy.deepcopy(fields)
            mutated["params"][name] = alt
            k = cache_key(mutated)
            assert k not in seen, (name, alt)
            seen.add(k)
            n += 1
    assert n >= len(spec.param_names)


def test_every_allowed_tunable_value_changes_key(spec, fields):
    base = cache_key(fields)
    seen = {base}
    for name in spec.tunable_names:
        for alt in spec.allowed(name):
            if alt == fields["tunables"][name]:
                continue
            mutated = copy.deepcopy(fields)
            mutated["tunables"][name] = alt
            k = cache_key(mutated)
            assert k not in seen, (name, alt)
            seen.add(k)
    assert len(seen) > len(spec.tunable_names)


def test_adding_or_removing_nested_entries_changes_key(fields):
    base = cache_key(fields)
    for section in ("params", "tunables", "values"):
        extra = copy.deepcopy(fields)
        extra[section]["new_knob"] = 0
        assert cache_key(extra) != base, section
        fewer = copy.deepcopy(fields)
        fewer[section].pop(next(iter(fewer[section])))
        assert cache_key(fewer) != base, section
    more_args = copy.deepcopy(fields)
    more_args["args"].append(["extra", "i32"])
    assert cache_key(more_args) != base
    fewer_args = copy.deepcopy(fields)
    fewer_args["args"].pop()
    assert cache_key(fewer_args) != base


def test_extra_top_level_field_changes_key(fields):
    base = cache_key(fields)
    fields["something_new"] = "x"
    assert cache_key(fields) != base


def test_key_ignores_dict_insertion_order(fields):
    base = cache_key(fields)
    reordered = {k: fields[k] for k in reversed(list(fields))}
    reordered["params"] = {k: fields["params"][k] for k in reversed(list(fields["params"]))}
    assert cache_key(reordered) == base
    assert canonical(reordered) == canonical(fields)


def test_tuple_and_list_encode_the_same(fields):
    base = cache_key(fields)
    fields["options"] = tuple(fields["options"])
    fields["args"] = tuple(tuple(a) for a in fields["args"])
    assert cache_key(fields) == base


# ---- types never collide -------------------------------------------------------------------


@pytest.mark.parametrize("where", [("params", "pool"), ("params", "K"), ("tunables", "ilp"), ("format",), ("arch",)])
def test_bool_int_float_str_none_do_not_collide(fields, where):
    values = [True, 1, "1", 1.0, "True", "true", False, 0, "0", 0.0, None, "None", "none", "", [1], ["1"], {}]
    keys = []
    for v in values:
        mutated = copy.deepcopy(fields)
        _set(mutated, where, v)
        keys.append(cache_key(mutated))
    assert len(set(keys)) == len(values), dict(zip(map(repr, values), keys, strict=True))


def test_true_vs_1_vs_string_1_in_params(fields):
    ks = []
    for v in (True, 1, "1"):
        f = copy.deepcopy(fields)
        f["params"]["update"] = v
        ks.append(cache_key(f))
    assert len(set(ks)) == 3


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=8),
)


@settings(max_examples=300 if FULL_TIER else 60, deadline=None)
@given(a=_scalars, b=_scalars)
def test_scalar_keys_equal_iff_type_and_value_equal(variant, a, b):
    fa = dict(variant.key_fields, params={**variant.key_fields["params"], "x": a})
    fb = dict(variant.key_fields, params={**variant.key_fields["params"], "x": b})
    same = (type(a), repr(a)) == (type(b), repr(b))
    assert (cache_key(fa) == cache_key(fb)) == same


def test_unsupported_value_types_raise(fields):
    for bad in ({1, 2}, b"bytes", Path("/x"), object(), 1j):
        f = copy.deepcopy(fields)
        f["params"]["weird"] = bad
        with pytest.raises(TypeError):
            cache_key(f)


# ---- required fields -----------------------------------------------------------------------


@pytest.mark.parametrize("field", sorted(REQUIRED_FIELDS))
def test_missing_required_field_raises(fields, field):
    del fields[field]
    with pytest.raises(ValueError, match=field):
        cache_key(fields)
    with pytest.raises(ValueError, match=field):
        canonical(fields)


def test_empty_fields_raise_naming_all_missing():
    with pytest.raises(ValueError) as e:
        cache_key({})
    for field in REQUIRED_FIELDS:
        assert field in str(e.value)


# ---- determinism across processes ------------------------------------------------------------

_SUBPROCESS = r"""
import json, sys
from gdnjit.cache.key import cache_key, canonical
from gdnjit.spec import get_spec
from gdnjit.variant import Variant
params, tunables, fields = json.loads(sys.stdin.read())
v = Variant.make(get_spec("gdn"), params, tunables, "sm_90")
print(json.dumps({"key": v.key, "name": v.name, "from_json": cache_key(fields),
                  "canonical": canonical(v.key_fields)}))
"""


@pytest.mark.parametrize("hashseed", ["0", "4242"])
def test_key_is_deterministic_across_processes(variant, tunables, hashseed):
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED=hashseed)
    payload = json.dumps([BASE_PARAMS, tunables, variant.key_fields])
    out = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS], input=payload, capture_output=True, text=True, env=env,
        cwd=str(REPO), timeout=60, check=True,
    )
    got = json.loads(out.stdout)
    assert got["key"] == variant.key
    assert got["name"] == variant.name
    assert got["from_json"] == variant.key  # JSON round trip keeps bool/int/str types apart
    assert got["canonical"] == canonical(variant.key_fields)


def test_key_of_fixed_fields_is_pinned():
    """The encoding itself is stable: if this changes on purpose, bump CACHE_FORMAT and update the digest."""
    f = {
        "format": 1, "gdnjit_version": "0.1.0", "spec": "s", "template": "t.cu.j2", "template_hash": "ab",
        "kernel_name": "k", "params": {"a": True, "b": 1, "c": "1", "d": None, "e": 1.5}, "tunables": {"x": 4},
        "arch": "sm_90", "nvrtc_version": "13.0", "options": ["-O3"], "args": [["q", "ptr"]], "values": {},
    }
    assert canonical(f) == (
        '{"arch":["str","sm_90"],"args":[[["str","q"],["str","ptr"]]],"format":["int",1],'
        '"gdnjit_version":["str","0.1.0"],"kernel_name":["str","k"],"nvrtc_version":["str","13.0"],'
        '"options":[["str","-O3"]],"params":{"a":["bool",true],"b":["int",1],"c":["str","1"],'
        '"d":["NoneType",null],"e":["float",1.5]},"spec":["str","s"],"template":["str","t.cu.j2"],'
        '"template_hash":["str","ab"],"tunables":{"x":["int",4]},"values":{}}'
    )
    import hashlib

    assert cache_key(f) == hashlib.sha256(canonical(f).encode()).hexdigest()


def test_repeated_calls_and_copies_agree(variant, spec, tunables):
    again = Variant.make(spec, dict(BASE_PARAMS), dict(tunables), "sm_90")
    assert again == variant
    assert again.key == variant.key == cache_key(copy.deepcopy(variant.key_fields))
    assert again.name == variant.name


# ---- entry names ---------------------------------------------------------------------------


def test_variant_name_is_readable_slug_plus_key(variant):
    name = variant.name
    assert SAFE_NAME.match(name), name
    assert name.startswith("gdn-sm_90-"), name
    assert "klast" in name and "128" in name and "bf16" in name
    assert name.endswith("-" + variant.key[:32])
    assert not name.startswith(".")
    assert len(name) <= 80 + 1 + 32
    assert name == entry_name(variant.slug, variant.key)
    safe_slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", variant.slug).strip("-")[:80]
    assert name.startswith(safe_slug)


@pytest.mark.parametrize(
    "slug",
    ["gdn-sm_90-ok", "a/b/../c", "with space:colon*star?q\"<>|", "../../etc/passwd", "ümlaut-名前", "", "///", "-" * 5,
     "x" * 500, "tab\tnew\nline\x00nul", ".."],
)
def test_entry_name_is_filesystem_safe(slug, tmp_path):
    key = cache_key({f: "" for f in REQUIRED_FIELDS})
    name = entry_name(slug, key)
    assert SAFE_NAME.match(name), name
    assert "/" not in name and "\x00" not in name
    assert name not in (".", "..")
    assert name.endswith("-" + key[:32])
    assert len(name) <= 80 + 1 + 32
    # usable as a file name right inside the directory
    p = tmp_path / f"{name}.cubin"
    p.write_bytes(b"x")
    assert p.parent == tmp_path and p.read_bytes() == b"x"


def test_entry_name_keeps_a_safe_slug_verbatim():
    key = "f" * 64
    assert entry_name("gdn-sm_90-klast.128", key) == "gdn-sm_90-klast.128-" + "f" * 32
    assert entry_name("", key) == "entry-" + "f" * 32


@settings(max_examples=200 if FULL_TIER else 60, deadline=None)
@given(slug=st.text(max_size=200))
def test_entry_name_safe_for_any_slug(slug):
    key = "0123456789abcdef" * 4
    name = entry_name(slug, key)
    assert SAFE_NAME.match(name)
    assert name.endswith("-" + key[:32])
    assert len(name) <= 80 + 1 + 32


# ---- variants ------------------------------------------------------------------------------


def test_changing_a_variant_param_changes_key_and_name(spec, variant, tunables):
    keys, names = {variant.key}, {variant.name}
    changed = set()
    for pname in spec.param_names:
        for alt in spec.allowed(pname):
            if alt == BASE_PARAMS[pname]:
                continue
            params = {**BASE_PARAMS, pname: alt}
            # the base tunables if they are valid for the new params (the usual case), else the first valid ones
            first = next((t for t in [tunables, *spec.all_tunable_choices()] if not spec.violations(params, t)), None)
            if first is None:
                continue
            v = Variant.make(spec, params, first, "sm_90")
            assert v.key not in keys, (pname, alt)
            assert v.name not in names, (pname, alt)
            keys.add(v.key)
            names.add(v.name)
            changed.add(pname)
    # every param has at least one valid alternative
    assert changed == set(spec.param_names)


def test_changing_a_variant_tunable_changes_key_and_name(spec, variant, tunables):
    keys, names = {variant.key}, {variant.name}
    for choice in spec.all_tunable_choices():
        if choice == tunables or spec.violations(BASE_PARAMS, choice):
            continue
        v = Variant.make(spec, BASE_PARAMS, choice, "sm_90")
        assert v.key not in keys and v.name not in names, choice
        keys.add(v.key)
        names.add(v.name)
    assert len(keys) > 2


def test_variants_differing_only_in_arch_have_different_keys(spec, tunables):
    archs = ["sm_90", "sm_90a", "sm_100a", "sm_120", "sm_80"]
    vs = [Variant.make(spec, BASE_PARAMS, tunables, a) for a in archs]
    assert len({v.key for v in vs}) == len(archs)
    assert len({v.name for v in vs}) == len(archs)
    for v, a in zip(vs, archs, strict=True):
        assert v.key_fields["arch"] == a
        assert f"-{a}-" in v.name


def test_variant_key_fields_are_json_round_trippable(variant):
    """The sidecar stores the fields as JSON; hashing them back must give the same key."""
    text = json.dumps(variant.key_fields, sort_keys=True)
    assert cache_key(json.loads(text)) == variant.key
