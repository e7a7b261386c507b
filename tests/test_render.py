"""Rendering (StrictUndefined, template hashes over includes) and NVRTC compilation
(resource report, CompileError, ptxas log parsing, arch strings). CPU only: NVRTC needs no GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from gdnjit import compile as gcompile
from gdnjit import dispatch
from gdnjit import render as grender
from gdnjit.errors import CompileError
from gdnjit.gdn import NATIVE_CONVENTIONS
from gdnjit.render import CTYPES, RenderError
from gdnjit.spec import get_spec
from gdnjit.variant import Variant

FACTS = {"B": 1, "H": 16, "HV": 64, "num_sms": 132}


GDN_TEMPLATES = ("gdn_recurrent.cu.j2", "gdn_chunk.cu.j2", "gdn_mma.cu.j2", "gdn_tc.cu.j2")
# a valid variant of each form (K-last, K = 128, bf16 q/k, T = 4)
FORM_TUNABLES = {
    "recurrent": dict(lanes_per_row=8, ilp=2, tile_v=32, stage=False, form="recurrent", pipe=1, k_warps=1, l2_prefetch=False),
    "chunk": dict(lanes_per_row=8, ilp=1, tile_v=32, stage=True, form="chunk", pipe=1, k_warps=1, l2_prefetch=False),
    "mma": dict(lanes_per_row=4, ilp=1, tile_v=32, stage=True, form="mma", pipe=1, k_warps=1, l2_prefetch=False),
    "tc": dict(lanes_per_row=4, ilp=1, tile_v=64, stage=True, form="tc", pipe=1, k_warps=1, l2_prefetch=False),
}


def make_variant(arch: str = "sm_90", **params) -> Variant:
    spec = get_spec("gdn")
    p = {n: v[0] for n, v in spec.params}
    p.update(params)
    tunables, _ = dispatch.select(spec, p, FACTS)
    return Variant.make(spec, p, tunables, arch)


def form_variant(form: str) -> Variant:
    spec = get_spec("gdn")
    p = {n: v[0] for n, v in spec.params}
    p.update(K=128, V=128, T=4)
    return Variant.make(spec, p, FORM_TUNABLES[form], "sm_90")


@pytest.fixture
def fresh_template_hash():
    """Clear template_hash's cache before and after (monkeypatched sources must not leak)."""
    grender.template_hash.cache_clear()
    yield
    grender.template_hash.cache_clear()


# ---- rendering -------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["klast", "kmajor"])
def test_render_variant(layout):
    v = make_variant(layout=layout, K=128, V=128)
    src = v.source()
    assert 'extern "C"' in src
    assert f"{v.spec.kernel_name}(const Args p)" in src
    assert "struct Args {" in src
    for name, ty in v.spec.args:
        assert f"  {CTYPES[ty]} {name};\n" in src, (name, ty)
    # the args appear in the struct in the spec's order
    positions = [src.index(f" {name};\n") for name, _ in v.spec.args]
    assert positions == sorted(positions)
    assert "constexpr int K = 128;" in src and "constexpr int V = 128;" in src
    assert f"layout={layout}" in src
    # the prelude is inlined, and no template syntax is left
    assert "typedef unsigned short u16;" in src and "template <int C> struct DT;" in src
    assert "{%" not in src and "{{" not in src and "#include" not in src


def test_render_is_deterministic():
    assert make_variant().source() == make_variant().source()


def test_render_values_differ():
    a = make_variant(K=64).source()
    b = make_variant(K=128).source()
    assert a != b


@pytest.mark.parametrize("missing", ["K", "tile_v", "kernel_name", "args", "num_warps", "state_dtype", "writeback"])
def test_render_missing_variable(missing):
    v = make_variant()
    values = dict(v.values)
    del values[missing]
    with pytest.raises(RenderError) as ei:
        grender.render(v.template, values)
    msg = str(ei.value)
    assert v.template in msg and f"'{missing}'" in msg


def test_render_unknown_template():
    with pytest.raises(RenderError, match="nope.cu.j2"):
        grender.render("nope.cu.j2", {})
    assert not grender.template_exists("nope.cu.j2")
    assert all(grender.template_exists(t) for t in GDN_TEMPLATES) and grender.template_exists("prelude.cuh.j2")
    assert not grender.template_exists("gdn.cu.j2")  # one template per form


@pytest.mark.parametrize("form", sorted(FORM_TUNABLES))
def test_render_form_template(form):
    """Each form renders from its own template (gdn_{form}.cu.j2): one kernel, no other form's code, no
    template syntax left."""
    v = form_variant(form)
    assert v.template == f"gdn_{form}.cu.j2" and v.key_fields["template"] == v.template
    src = v.source()
    assert src.startswith(f"// gdnjit: gated delta rule step over T tokens, {form} form (gdn_{form}.cu.j2).")
    assert src.count("__global__") == 1 and "{%" not in src and "{{" not in src
    assert ("mma_tf32(acc[" in src) == (form == "mma")  # the mma form's TF32 dots (fp32 state)
    assert ("sm_A[" in src) == (form == "chunk")  # the chunk form's T x T coefficients
    assert ("tc_chunk(" in src) == (form == "tc")
    assert ("load_rows<" in src) == (form != "tc")  # tc: the state passes through shared memory only


def test_form_templates_have_no_form_conditions():
    """The form is the file: no template branches on `form` (one file per form over shared includes)."""
    root = Path(grender.__file__).parent / "templates"
    for path in root.glob("gdn*.j2"):
        text = path.read_text()
        assert "form ==" not in text and "form !=" not in text and "form in" not in text, path.name


# ---- template hashes ------------------------------------------------------------------------------


def test_template_hash_stable(fresh_template_hash):
    h = grender.template_hash("gdn_recurrent.cu.j2")
    assert len(h) == 64 and int(h, 16) >= 0
    grender.template_hash.cache_clear()
    assert grender.template_hash("gdn_recurrent.cu.j2") == h
    assert grender.template_hash("prelude.cuh.j2") != h
    assert len({grender.template_hash(t) for t in GDN_TEMPLATES}) == len(GDN_TEMPLATES)


# which form templates include / import each shared file (recursively)
USERS = {
    "prelude.cuh.j2": set(GDN_TEMPLATES),
    "gdn_common.cuh.j2": set(GDN_TEMPLATES),
    "gdn_stage.cuh.j2": {"gdn_recurrent.cu.j2", "gdn_chunk.cu.j2", "gdn_mma.cu.j2"},
    "gdn_kernels.cuh.j2": {"gdn_recurrent.cu.j2", "gdn_chunk.cu.j2", "gdn_mma.cu.j2"},
    "gdn_recurrent_fused_step.cuh.j2": {"gdn_recurrent.cu.j2"},
    **{f: {"gdn_recurrent.cu.j2", "gdn_chunk.cu.j2", "gdn_mma.cu.j2"}
       for f in ("gdn_kernels_commit.cuh.j2", "gdn_kernels_fused_step.cuh.j2")},
    **{f: {"gdn_tc.cu.j2"} for f in ("gdn_tc_chunk.cuh.j2", "gdn_tc_fused_step.cuh.j2", "gdn_tc_flush.cuh.j2",
                                    "gdn_tc_replay.cuh.j2", "gdn_tc_replayed.cuh.j2")},
    **{t: {t} for t in GDN_TEMPLATES},
}


@pytest.mark.parametrize("changed", sorted(USERS))
def test_template_hash_sees_includes(monkeypatch, fresh_template_hash, changed):
    """An edit of a template changes the hash (and the cache key of every variant) of exactly the form templates
    that include or import it, directly or through another include."""
    before = {t: grender.template_hash(t) for t in GDN_TEMPLATES}
    keys_before = {f: form_variant(f).key for f in FORM_TUNABLES}
    real = grender._source

    def patched(name):
        src = real(name)
        return src + "\n// edited\n" if name == changed else src

    monkeypatch.setattr(grender, "_source", patched)
    grender.template_hash.cache_clear()
    after = {t: grender.template_hash(t) for t in GDN_TEMPLATES}
    assert {t for t in GDN_TEMPLATES if after[t] != before[t]} == USERS[changed]
    # the cache key follows the hash of the variant's own template
    assert {f"gdn_{f}.cu.j2" for f in FORM_TUNABLES if form_variant(f).key != keys_before[f]} == USERS[changed]
    monkeypatch.undo()
    grender.template_hash.cache_clear()
    assert {t: grender.template_hash(t) for t in GDN_TEMPLATES} == before


def test_template_hash_rejects_dynamic_include(monkeypatch, fresh_template_hash):
    real = grender._source
    monkeypatch.setattr(
        grender, "_source", lambda name: "{% include some_name %}\n" if name == "gdn_common.cuh.j2" else real(name)
    )
    with pytest.raises(RenderError, match="dynamic includes"):
        grender.template_hash("gdn_chunk.cu.j2")


# ---- NVRTC -------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["klast", "kmajor"])
def test_compile_variant(layout):
    v = make_variant(layout=layout, K=128, V=128)
    built = v.build()
    assert built.cubin[:4] == b"\x7fELF"
    assert built.source == v.source()
    meta = built.meta
    assert meta["registers"] > 0
    assert meta["spill_bytes"] == 0
    assert meta["stack_bytes"] == 0
    assert meta["warnings"] == []
    assert meta["variant"] == v.describe()
    assert meta["compile_s"] > 0


def test_compile_cubin_result():
    v = make_variant()
    res = gcompile.compile_cubin(v.source(), "sm_90", v.spec.kernel_name)
    assert res.registers > 0 and res.spill_bytes == 0 and res.stack_bytes == 0
    assert f"'{v.spec.kernel_name}'" in res.log and "sm_90" in res.log
    assert gcompile.warnings_in(res.log) == []
    assert gcompile.parse_ptxas(res.log) == (res.registers, res.spill_bytes, res.stack_bytes, res.smem_bytes)


def _pinned_nvrtc():
    """The base dependency on the NVRTC wheel, as pyproject.toml declares it."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    with open(Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as f:
        deps = [Requirement(d) for d in tomllib.load(f)["project"]["dependencies"]]
    (req,) = [r for r in deps if r.name == "nvidia-cuda-nvrtc"]
    return req


def test_nvrtc_version_is_the_pinned_minor():
    """The NVRTC that compiles is the one minor version the rules, tuned tables and spill checks were
    measured with: the pin admits exactly one minor, and the library loaded is that minor (a looser pin,
    or a system NVRTC of another release shadowing the wheel, fails here)."""
    req = _pinned_nvrtc()
    loaded = gcompile.loaded_nvrtc_version()
    assert gcompile.nvrtc_version() == loaded  # the cache key's version (the wheel's) is the library's
    major, minor = (int(x) for x in loaded.split("."))
    assert req.specifier.contains(f"{major}.{minor}.0"), f"NVRTC {loaded} loaded, pin {req}"
    for other in (f"{major}.{minor + 1}.0", f"{major + 1}.0.0", f"{major}.{minor - 1}.0" if minor else "12.9.0"):
        assert not req.specifier.contains(other), f"the pin {req} admits NVRTC {other}"
    from importlib.metadata import PackageNotFoundError, version

    try:
        wheel = version("nvidia-cuda-nvrtc")
    except PackageNotFoundError:
        pytest.fail("the nvidia-cuda-nvrtc wheel is not installed")
    assert wheel.split(".")[:2] == [str(major), str(minor)], f"wheel {wheel}, loaded NVRTC {loaded}"


BROKEN = """\
extern "C" __global__ void broken(float* p) {
  int x = ;
  p[0] = x;
}
"""


def test_compile_error():
    with pytest.raises(CompileError) as ei:
        gcompile.compile_cubin(BROKEN, "sm_90", "broken")
    e = ei.value
    assert isinstance(e, RuntimeError)
    assert e.variant == "broken"
    assert e.options == gcompile.options_for("sm_90")
    assert "--gpu-architecture=sm_90" in e.options
    assert "error" in e.log and "broken.cu(2)" in e.log
    assert e.source == BROKEN
    msg = str(e)
    assert "broken" in msg and "--gpu-architecture=sm_90" in msg and e.log in msg
    dump = e.dump()
    assert "    1  extern \"C\" __global__ void broken(float* p) {" in dump
    assert "    2    int x = ;" in dump
    assert "    4  }" in dump
    assert "// options: " + " ".join(e.options) in dump
    assert dump.rstrip().endswith(e.log.rstrip())


def test_compile_warning_is_reported():
    src = 'extern "C" __global__ void w(int* p) { int unused_var; p[0] = 1; }\n'
    res = gcompile.compile_cubin(src, "sm_90", "w")
    # NVRTC may or may not warn about the unused variable; whatever it says, warnings_in agrees
    assert gcompile.warnings_in(res.log) == [line for line in res.log.splitlines() if "warning" in line.lower()]


REAL_LOG = (
    "ptxas info    : 68 bytes gmem\n"
    "ptxas info    : Compiling entry function 'gdn_step' for 'sm_90'\n"
    "ptxas info    : Function properties for gdn_step\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 48 registers, used 0 barriers\n"
    "ptxas info    : Compile time = 26.433 ms\n"
)

MULTI_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'a' for 'sm_90'
ptxas info    : Function properties for a
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'b' for 'sm_90'
ptxas info    : Function properties for b
    0 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 32 registers, 2048 bytes smem, 400 bytes cmem[0]
"""


@pytest.mark.parametrize(
    "log,expected",
    [
        (REAL_LOG, (48, 0, 0, 0)),
        (MULTI_LOG, (255, 28, 16, 2048)),
        ("", (0, 0, 0, 0)),
        ("ptxas info    : Used 7 registers, 16384 bytes smem\n", (7, 0, 0, 16384)),
        ("    0 bytes stack frame, 0 bytes spill stores, 100 bytes spill loads\n", (0, 100, 0, 0)),
    ],
)
def test_parse_ptxas(log, expected):
    assert gcompile.parse_ptxas(log) == expected


def test_warnings_in():
    log = "ptxas info    : Used 1 registers\nfoo.cu(3): warning #177-D: variable \"x\" was declared but never referenced\n"
    assert gcompile.warnings_in(log) == ['foo.cu(3): warning #177-D: variable "x" was declared but never referenced']
    assert gcompile.warnings_in(REAL_LOG) == []


# ---- arch strings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch,expected",
    [("sm_90", (90, "")), ("sm_90a", (90, "a")), ("sm_100a", (100, "a")), ("sm_120f", (120, "f")), ("sm_80", (80, ""))],
)
def test_check_arch_ok(arch, expected):
    assert gcompile.check_arch(arch) == expected
    assert gcompile.options_for(arch)[0] == f"--gpu-architecture={arch}"


@pytest.mark.parametrize(
    "arch",
    ["sm90", "90", "sm_9", "sm_1000", "compute_90", "sm_90x", "sm_90aa", "SM_90", "", " sm_90", "sm_", None, 90],
)
def test_check_arch_errors(arch):
    with pytest.raises(ValueError, match="arch: expected a target like"):
        gcompile.check_arch(arch)
    with pytest.raises(ValueError):
        gcompile.options_for(arch)


def test_check_arch_trailing_newline():
    with pytest.raises(ValueError):
        gcompile.check_arch("sm_90\n")


def test_variant_rejects_bad_arch():
    with pytest.raises(ValueError, match="arch"):
        make_variant(arch="sm90")


def test_variant_rejects_invalid_tunables():
    spec = get_spec("gdn")
    p = {n: v[0] for n, v in spec.params}
    t = {n: v[0] for n, v in spec.tunables}
    t.update(lanes_per_row=32, tile_v=128)
    with pytest.raises(ValueError, match="invalid for"):
        Variant.make(spec, p, t, "sm_90")
    with pytest.raises(ValueError, match="params must be exactly"):
        Variant.make(spec, {"K": 64}, t, "sm_90")


def test_referenced_templates_agree_with_jinjas_parser():
    """The regex scan the cache key uses finds exactly what Jinja's parser finds, in every shipped template."""
    import jinja2.meta

    from gdnjit.render import _source, environment, referenced_templates

    _ENV = environment()

    names = _ENV.loader.list_templates()
    assert len(names) >= 10
    for name in names:
        src = _source(name)
        assert sorted(referenced_templates(name, src)) == sorted(jinja2.meta.find_referenced_templates(_ENV.parse(src)))


@pytest.mark.parametrize("src", ['{% include name %}', '{%- import x ~ "y" as z %}', "{% from ['a', 'b'] import c %}"])
def test_a_dynamic_reference_is_refused(src):
    from gdnjit.render import RenderError, referenced_templates

    with pytest.raises(RenderError, match="dynamic includes are not allowed"):
        referenced_templates("t.j2", src)


def test_commented_references_are_not_followed():
    from gdnjit.render import referenced_templates

    assert referenced_templates("t.j2", '{# {% include "gone.j2" %} #}{% include "prelude.cuh.j2" %}') == \
        ["prelude.cuh.j2"]


def test_a_compile_refuses_an_nvrtc_other_than_the_keys(monkeypatch):
    """The cache key's NVRTC version comes from the installed wheel (a warm hit never loads the library); a
    compile checks that the library it loaded agrees, so an entry is never filed under another version."""
    gcompile.nvrtc_version.cache_clear()
    monkeypatch.setattr(gcompile, "_wheel_nvrtc_version", lambda: "12.9")
    try:
        assert gcompile.nvrtc_version() == "12.9"
        with pytest.raises(RuntimeError, match=r"NVRTC: the library cuda-bindings loaded reports 13\.\d+, but the "
                                               r"installed NVRTC wheel is 12\.9"):
            gcompile.compile_cubin('extern "C" __global__ void k() {}', "sm_90", "k")
    finally:
        gcompile.nvrtc_version.cache_clear()


def _prefetch_body(src: str) -> str:
    start = src.index("void prefetch_tile_l2(")
    return src[start:src.index("#else", start)]


ENGINE_VERIFY = dict(layout="klast", K=128, V=128, T=4, state_dtype="bf16", in_dtype="bf16", pool=True,
                     varlen=True, bounded=True, update=False)


def _engine_prefetch(**extra) -> str:
    """The L2 prefetch function of an engine verify variant (K-last, T = 4, the recurrent form with the prefetch)."""
    spec = get_spec("gdn")
    p = {n: v[0] for n, v in spec.params}
    p.update(ENGINE_VERIFY, **NATIVE_CONVENTIONS)
    p.update(extra)
    return _prefetch_body(Variant.make(spec, p, dict(FORM_TUNABLES["recurrent"], l2_prefetch=True), "sm_90").source())


@pytest.mark.parametrize("extra, lines", [
    (dict(inter_indexed=True, padding="zero_state", inter_dtype="bf16"), ["(const idx_t*)p.inter_idx + n"]),
    (dict(inter_indexed=True, padding="zero_state", inter_dtype="bf16", tree=True),
     ["(const idx_t*)p.inter_idx + n", "(const int*)p.parent + n * p.parent_sn",
      "(const int*)p.parent + n * p.parent_sn + T - 1"]),
    (dict(update=True, ssm_idx_dtype="int32", inter_dtype="bf16"),
     ["(const ssm_idx_t*)p.ssm_idx + n * p.ssm_sn", "(const ssm_idx_t*)p.ssm_idx + n * p.ssm_sn + (T - 1) * p.ssm_st"]),
])
def test_the_l2_prefetch_warms_the_indices_loaded_after_the_wait(extra, lines):
    # each index the kernel loads after griddepcontrol.wait and the prefetch does not read itself is asked into L2:
    # left cold, it alone was a DRAM round trip on that path (SGLang's buffer rows: docs/perf.md v38)
    body = _engine_prefetch(**extra)
    for addr in lines:
        assert f'asm volatile("prefetch.global.L2 [%0];" :: "l"({addr}));' in body, addr
    # and nothing of the kind where the call has no such index
    plain = _engine_prefetch()
    assert "p.inter_idx" not in plain and "p.parent" not in plain and "p.ssm_idx" not in plain


def test_the_l2_prefetch_leaves_a_slot_maps_write_slots_to_its_own_loads():
    # with accepted counts the write slots are the 2-D slot map's row, which the prefetch loads itself to find the read
    # slot; asked for again, vLLM's spec verify got slower (docs/perf.md v38)
    body = _engine_prefetch(update=True, ssm_idx_dtype="int32", accepted=True)
    assert "p.read_idx" in body and "p.ssm_idx" not in body
