#!/usr/bin/env python3
"""Compare the machine code two checkouts of gdnjit generate for the same variants (CPU only, NVRTC).

For a template or spec refactoring that must not change any kernel: every variant of the CPU compile
matrix (``tests/test_compile_matrix.py``: its dispatch, fallback and kinds sets) plus every distinct
variant of the shipped tuned tables (``gdnjit/tuned/*.json``, spec gdn) is rendered and compiled with
NVRTC in each checkout, and the cubins are compared section by section:

- the machine code: every ``.text.<kernel>`` section, byte for byte;
- what the code runs with: the size of every ``.nv.shared.<kernel>`` / ``.nv.constant<N>.<kernel>`` section,
  the contents of the initialised constant banks and of ``.nv.info.<kernel>`` (parameter layout, exit
  offsets, ...; symbol indices aside), ptxas' report (registers, spill, stack, static shared memory) and the
  compiler's warnings (line numbers aside: a warning only the new checkout has is a difference, one it no
  longer has is reported);
- the module's data: the variables NVRTC emits (under ``-default-device`` every namespace-scope ``constexpr``
  becomes a ``__device__`` variable, read or not). A value that differs counts as a difference; a constant
  that only one checkout declares is reported (with identical ``.text`` the code cannot read it).

Everything else in a cubin (tool notes, symbol and string tables) is metadata and is not compared. A
variant is *identical* when all of the above match, *identical machine code* when only unread constants are
declared in one checkout and not the other. For one that differs, both kernels are disassembled
(``nvdisasm``: on PATH, from the ``nvidia-cuda-nvdisasm`` wheel, or from triton's bundled copy), a unified
diff of the SASS is written to ``WORK/diff/<id>.diff`` and the difference is classified: the same
instructions in another order or with other registers, or different instructions.

Usage (from the new checkout; the base is e.g. ``git worktree add /tmp/base <commit>``)::

    python tools/compare_sass.py --base /tmp/base --new . [--work /tmp/compare_sass] [-j 2] [--variants FILE]
        [--new-param NAME=VALUE ...]   (a param the new checkout added: its variants with that value vs the base's)

Each checkout is imported in its own subprocess (``PYTHONPATH=<checkout>``). Compiled cubins are kept
under ``WORK/<side>/`` keyed by the variant and the sha256 of its rendered source, so a rerun compiles
only what changed. The variant list is the union of both checkouts' lists (a variant valid in only one
checkout is reported as such). Exit status 0 when every variant is identical or has identical machine code,
1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import difflib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve()


# ---- in a checkout's subprocess -----------------------------------------------------------------------


def _variant_id(spec: str, params: dict, tunables: dict, arch: str) -> str:
    text = json.dumps([spec, params, tunables, arch], sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def list_variants(root: Path) -> list[dict]:
    """The compile matrix's sets (dispatch, fallback, kinds, and the calling modes' own variants) and the shipped tuned
    tables' gdn variants, as JSON-able dicts."""
    sys.path.insert(0, str(root))
    mod_spec = importlib.util.spec_from_file_location("_compile_matrix", root / "tests" / "test_compile_matrix.py")
    matrix = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(matrix)
    out: dict[str, dict] = {}

    def add(spec: str, params: dict, tunables: dict, arch: str, origin: str) -> None:
        vid = _variant_id(spec, params, tunables, arch)
        entry = out.setdefault(vid, {"id": vid, "spec": spec, "params": params, "tunables": tunables, "arch": arch,
                                     "sets": []})
        if origin not in entry["sets"]:
            entry["sets"].append(origin)

    fallback, _ = matrix.fallback_variants()
    modes = matrix.mode_variants() if hasattr(matrix, "mode_variants") else []  # (a base from before the set)
    for origin, variants in (("dispatch", matrix.dispatch_variants()), ("fallback", fallback),
                             ("kinds", matrix.kind_variants()), ("modes", modes)):
        for v in variants:
            add(v.spec.name, dict(v.params), dict(v.tunables), v.arch, origin)
    for table in sorted((root / "gdnjit" / "tuned").glob("*.json")):
        doc = json.loads(table.read_text())
        for e in doc.get("entries", []):
            if e.get("spec") == "gdn":
                add("gdn", e["params"], e["tunables"], doc.get("arch", "sm_90"), f"tuned:{table.name}")
    return list(out.values())


def build_variants(root: Path, variants: list[dict], outdir: Path, jobs: int, added: dict | None = None) -> None:
    """Render and compile each variant in this checkout into OUTDIR/<id>.{cubin,cu,json}; a variant whose
    rendered source has not changed since the last run is not compiled again. ``added``: params this checkout's
    spec has and the variants lack (``--new-param``), with the value they take."""
    sys.path.insert(0, str(root))
    from gdnjit import compile as gcompile
    from gdnjit.spec import get_spec
    from gdnjit.variant import Variant

    outdir.mkdir(parents=True, exist_ok=True)

    def one(entry: dict) -> str:
        meta_path = outdir / f"{entry['id']}.json"
        try:
            spec = get_spec(entry["spec"])
            params = dict(entry["params"])
            for name, value in (added or {}).items():
                if name in spec.param_names and name not in params:
                    params[name] = value
            v = Variant.make(spec, params, entry["tunables"], entry["arch"])
            src = v.source()
        except Exception as e:  # noqa: BLE001 - recorded for the comparison
            meta_path.write_text(json.dumps({"id": entry["id"], "error": f"{type(e).__name__}: {e}"}))
            return "error"
        sha = hashlib.sha256(src.encode()).hexdigest()
        if meta_path.exists() and (outdir / f"{entry['id']}.cubin").exists():
            try:
                old = json.loads(meta_path.read_text())
                if old.get("source_sha256") == sha and "warnings" in old:
                    return "kept"
            except ValueError:
                pass
        try:
            res = gcompile.compile_cubin(src, entry["arch"], spec.kernel_name)
        except Exception as e:  # noqa: BLE001
            meta_path.write_text(json.dumps({"id": entry["id"], "error": f"{type(e).__name__}: {str(e)[:4000]}"}))
            return "error"
        (outdir / f"{entry['id']}.cubin").write_bytes(res.cubin)
        (outdir / f"{entry['id']}.cu").write_text(src)
        template = getattr(v, "template", spec.template)
        meta_path.write_text(json.dumps({
            "id": entry["id"], "source_sha256": sha, "template": template, "registers": res.registers,
            "spill_bytes": res.spill_bytes, "stack_bytes": res.stack_bytes, "smem_bytes": res.smem_bytes,
            "warnings": [re.sub(r"^\S+\(\d+\): ", "", w) for w in gcompile.warnings_in(res.log)],
        }))
        return "compiled"

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        counts = collections.Counter(pool.map(one, variants))
    print(f"{root}: {dict(counts)}", file=sys.stderr)


# ---- comparison (no gdnjit import) ------------------------------------------------------------------------


def elf_sections(data: bytes) -> dict[str, tuple[int, int, bytes | None]]:
    """{name: (type, size, contents or None for NOBITS)} of a little-endian ELF64 file (a cubin)."""
    return {name: (typ, size, body) for name, typ, size, body in _elf(data)[0]}


def _elf(data: bytes) -> tuple[list[tuple[str, int, int, bytes | None]], list[tuple[str, int, int, int]]]:
    """(sections as (name, type, size, contents), symbols as (name, section index, value, size))."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def cstr(table: bytes, off: int) -> str:
        return table[off:table.find(b"\0", off)].decode()

    shstr = data[headers[shstrndx][4]:headers[shstrndx][4] + headers[shstrndx][5]]
    sections, symbols = [], []
    for name, typ, _flags, _addr, off, size, link, _info, _align, entsize in headers:
        body = None if typ == 8 else data[off:off + size]  # SHT_NOBITS: no contents
        sections.append((cstr(shstr, name), typ, size, body))
        if typ == 2:  # SHT_SYMTAB
            strtab = data[headers[link][4]:headers[link][4] + headers[link][5]]
            for j in range(size // (entsize or 24)):
                st_name, _st_info, _st_other, shndx, value, st_size = struct.unpack_from("<IBBHQQ", data, off + j * 24)
                symbols.append((cstr(strtab, st_name), shndx, value, st_size))
    return sections, symbols


# .nv.info attributes that hold a symbol index (EIATTR_PARAM_CBANK: index, then offset and size): the index moves
# when the module has more or fewer symbols, which is not a property of the kernel.
_SYMBOL_ATTRS = {0x0A}


def _kernel_info(body: bytes) -> list[tuple[int, int, bytes]]:
    """The per-kernel .nv.info attributes as (format, attribute, value), symbol indices blanked."""
    out, i = [], 0
    while i + 4 <= len(body):
        fmt, attr = body[i], body[i + 1]
        if fmt == 4:  # EIFMT_SVAL: u16 size, then the value
            size, = struct.unpack_from("<H", body, i + 2)
            value = body[i + 4:i + 4 + size]
            i += 4 + size
        else:  # EIFMT_NVAL / EIFMT_HVAL: a 2-byte value in place
            value = body[i + 2:i + 4]
            i += 4
        if attr in _SYMBOL_ATTRS and len(value) >= 4:
            value = b"\0\0\0\0" + value[4:]
        out.append((fmt, attr, value))
    return out


def _compared(data: bytes) -> tuple[dict[str, object], dict[str, object]]:
    """(what must match, the module's data symbols). What must match: every .text section's bytes, the size of
    every kernel's shared / constant banks, its initialised constant banks (not bank 0: parameters) and its .nv.info
    attributes. Data symbols: {name: contents (or size)} of the variables in .nv.global* and module-level constant
    banks; NVRTC's -default-device makes every namespace-scope constexpr such a variable, emitted whether or not
    the code reads it."""
    sections, symbols = _elf(data)
    must, data_syms = {}, {}
    for name, _typ, size, body in sections:
        if name.startswith(".text."):
            must[name] = body
        elif name.startswith(".nv.shared."):
            must[name + " size"] = size
        elif re.fullmatch(r"\.nv\.constant\d+\..+", name):  # a kernel's bank
            must[name + " size"] = size
            if body is not None and not name.startswith(".nv.constant0"):
                must[name] = body
        elif name.startswith(".nv.info."):
            must[name] = _kernel_info(body)
    for name, shndx, value, size in symbols:
        if 0 < shndx < len(sections) and size > 0:
            sec_name, _typ, _size, body = sections[shndx]
            if sec_name.startswith(".nv.global") or re.fullmatch(r"\.nv\.constant\d+", sec_name):
                data_syms[name] = body[value:value + size] if body is not None else size
    return must, data_syms


def _short(symbol: str) -> str:
    """The last name of a mangled symbol: ``K`` for ``_ZN42_INTERNAL_..._GLOBAL__N__..._cu_gdn_step1KE``."""
    if not (symbol.startswith("_ZN") and symbol.endswith("E")):
        return symbol
    body = symbol[:-1]
    for i in range(len(body)):
        m = re.match(r"\d+", body[i:])
        if m and (i == 0 or not body[i - 1].isdigit()) and i + len(m.group()) + int(m.group()) == len(body):
            return body[i + len(m.group()):]
    return symbol


def find_nvdisasm() -> str | None:
    found = shutil.which("nvdisasm")
    if found:
        return found
    for base in map(Path, sys.path + [str(Path(sys.executable).parent.parent)]):
        for pattern in ("nvidia/cu*/bin/nvdisasm", "nvidia/cuda_nvdisasm/bin/nvdisasm",
                        "triton/backends/nvidia/bin/nvdisasm", "lib/python3*/site-packages/nvidia/cu*/bin/nvdisasm"):
            for p in sorted(base.glob(pattern)):
                if p.is_file() and os.access(p, os.X_OK):
                    return str(p)
    return None


_ADDR = re.compile(r"/\*[0-9a-f]{4,}\*/")
_COMMENT = re.compile(r"/\*.*?\*/")


def sass(nvdisasm: str, cubin: Path) -> list[str]:
    """The instructions of every kernel, one per line, without addresses and encodings."""
    text = subprocess.run([nvdisasm, "-c", "-hex", str(cubin)], capture_output=True, text=True, check=True).stdout
    lines = []
    for line in text.splitlines():
        line = _COMMENT.sub("", _ADDR.sub("", line)).strip()
        if line and not line.startswith("."):
            lines.append(line)
    return lines


_REG = re.compile(r"\b(U?R\d+|U?P\d+|URZ|RZ|PT|UPT)\b")


def opcode(line: str) -> str:
    """The mnemonic with modifiers, predicate guard dropped (``@P0 BRA ...`` -> ``BRA``)."""
    body = re.sub(r"^@!?U?P\w+\s+", "", line.rstrip(" ;"))
    return body.split()[0] if body else ""


def classify(a: list[str], b: list[str]) -> str:
    if sorted(map(opcode, a)) == sorted(map(opcode, b)):
        if [opcode(x) for x in a] == [opcode(x) for x in b]:
            return "same instructions in the same order, other registers or operands"
        return f"same instructions ({len(a)}), another order (and registers)"
    ca, cb = collections.Counter(map(opcode, a)), collections.Counter(map(opcode, b))
    delta = {k: cb[k] - ca[k] for k in sorted(set(ca) | set(cb)) if ca[k] != cb[k]}
    return f"different instructions ({len(a)} -> {len(b)}): {delta}"


def normalized_source(path: Path) -> str:
    """The rendered source without comments and whitespace (token-identical sources compare equal)."""
    text = path.read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return " ".join(text.split())


def compare(variants: list[dict], base_dir: Path, new_dir: Path, work: Path) -> int:
    nvdisasm = find_nvdisasm()
    results = collections.Counter()
    unused = {"base": collections.Counter(), "new": collections.Counter()}
    fixed_warnings = collections.Counter()
    same_source = 0
    differing = []
    (work / "diff").mkdir(parents=True, exist_ok=True)
    for entry in variants:
        vid = entry["id"]
        metas = []
        for d in (base_dir, new_dir):
            p = d / f"{vid}.json"
            metas.append(json.loads(p.read_text()) if p.exists() else {"error": "not built"})
        if "error" in metas[0] or "error" in metas[1]:
            results["error"] += 1
            differing.append((entry, f"base: {metas[0].get('error', 'ok')[:300]}; new: {metas[1].get('error', 'ok')[:300]}"))
            continue
        if normalized_source(base_dir / f"{vid}.cu") == normalized_source(new_dir / f"{vid}.cu"):
            same_source += 1
        (a, data_a), (b, data_b) = (_compared((d / f"{vid}.cubin").read_bytes()) for d in (base_dir, new_dir))
        report = {k: metas[0].get(k) for k in ("registers", "spill_bytes", "stack_bytes", "smem_bytes")}
        report_new = {k: metas[1].get(k) for k in report}
        warn_a, warn_b = set(metas[0].get("warnings", [])), set(metas[1].get("warnings", []))
        if warn_b - warn_a:
            bad_warnings = sorted(warn_b - warn_a)
        else:
            bad_warnings = []
            fixed_warnings.update(w for w in warn_a - warn_b if w.startswith("warning"))
            if warn_a - warn_b:
                results["warnings fixed"] += 1
        bad = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        bad += sorted(f"data {_short(k)}" for k in set(data_a) & set(data_b) if data_a[k] != data_b[k])
        if report != report_new:
            bad.append(f"ptxas {report} -> {report_new}")
        if bad_warnings:
            bad.append(f"new warnings {bad_warnings}")
        if not bad:
            only = sorted(set(data_a) ^ set(data_b))
            if not only:
                results["identical"] += 1
            else:
                results["same code"] += 1
                unused["base"].update(_short(k) for k in set(data_a) - set(data_b))
                unused["new"].update(_short(k) for k in set(data_b) - set(data_a))
            continue
        results["different"] += 1
        why = "differs in " + ", ".join(bad)
        if nvdisasm and any(k.startswith(".text.") for k in bad):
            sa, sb = sass(nvdisasm, base_dir / f"{vid}.cubin"), sass(nvdisasm, new_dir / f"{vid}.cubin")
            why += f"; {classify(sa, sb)}"
            diff = difflib.unified_diff(sa, sb, "base", "new", lineterm="", n=3)
            (work / "diff" / f"{vid}.diff").write_text(json.dumps(entry) + "\n" + "\n".join(diff) + "\n")
        differing.append((entry, why))
    for entry, why in differing:
        print(f"DIFF {entry['id']} {entry['sets']} params={entry['params']} tunables={entry['tunables']}: {why}")
    total = len(variants)
    print(f"{total} variants compared: {results['identical']} identical (machine code, kernel attributes, data), "
          f"{results['same code']} identical machine code and kernel attributes with only unread constants in one "
          f"checkout, {results['different']} differ, {results['error']} failed to build in a checkout; "
          f"{same_source} with token-identical sources (comments and whitespace aside)")
    for side in ("base", "new"):
        if unused[side]:
            print(f"  constants only in {side} (namespace-scope constexprs, each a __device__ variable under "
                  f"-default-device; the code never reads them: its .text is the same): "
                  + ", ".join(f"{k} ({n} variants)" for k, n in sorted(unused[side].items())))
    if fixed_warnings:
        print(f"  compiler warnings of the base gone in {results['warnings fixed']} variants: "
              + ", ".join(f"{w} ({n})" for w, n in sorted(fixed_warnings.items())))
    by_set = collections.Counter(s.split(":")[0] for e in variants for s in e["sets"])
    print(f"sets: {dict(by_set)} (a variant can be in several)")
    if differing and nvdisasm:
        print(f"SASS diffs in {work / 'diff'}")
    return 0 if results["identical"] + results["same code"] == total else 1


def _run_side(root: Path, args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, str(HERE), *args], cwd=root, env=env, capture_output=True, text=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_list":
        json.dump(list_variants(Path(argv[1]).resolve()), sys.stdout)
        return 0
    if argv and argv[0] == "_build":
        build_variants(Path(argv[1]).resolve(), json.loads(Path(argv[2]).read_text()), Path(argv[3]), int(argv[4]),
                       json.loads(argv[5]) if len(argv) > 5 else None)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the reference checkout (e.g. a worktree of the base commit)")
    ap.add_argument("--new", default=".", help="the changed checkout (default: .)")
    ap.add_argument("--work", default="/tmp/compare_sass", help="cubins, sources and diffs (default: %(default)s)")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="compile threads per checkout (default: 2)")
    ap.add_argument("--variants", help="a JSON list of variants ({spec, params, tunables, arch}) instead of the sets")
    ap.add_argument("--new-param", action="append", default=[], metavar="NAME=VALUE",
                    help="a param the new checkout added, with the value that keeps a kernel as it was (e.g. "
                         "fused_step=none; a JSON value, or a string): the new checkout's variants with that value are "
                         "compared with the base's without the param, the others (new only) are left out")
    args = ap.parse_args(argv)
    added = {}
    for item in args.new_param:
        name, sep, value = item.partition("=")
        if not sep or not name:
            ap.error(f"--new-param: expected NAME=VALUE, got {item!r}")
        try:
            added[name] = json.loads(value)
        except ValueError:
            added[name] = value
    base, new, work = Path(args.base).resolve(), Path(args.new).resolve(), Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if args.variants:
        variants = []
        for e in json.loads(Path(args.variants).read_text()):
            arch = e.get("arch", "sm_90")
            variants.append({"id": _variant_id(e["spec"], e["params"], e["tunables"], arch), "spec": e["spec"],
                             "params": e["params"], "tunables": e["tunables"], "arch": arch, "sets": ["given"]})
    else:
        merged: dict[str, dict] = {}
        for root in (base, new):
            res = _run_side(root, ["_list", str(root)])
            if res.returncode != 0:
                print(f"listing variants in {root} failed:\n{res.stderr}", file=sys.stderr)
                return 2
            for e in json.loads(res.stdout):
                if root == new and added:
                    if any(e["params"].get(n, v) != v for n, v in added.items()):
                        continue  # a variant only the new checkout has
                    e["params"] = {n: v for n, v in e["params"].items() if n not in added}
                    e["id"] = _variant_id(e["spec"], e["params"], e["tunables"], e["arch"])
                m = merged.setdefault(e["id"], e)
                m["sets"] = sorted(set(m["sets"]) | set(e["sets"]))
        variants = sorted(merged.values(), key=lambda e: e["id"])
    (work / "variants.json").write_text(json.dumps(variants, indent=0))
    print(f"{len(variants)} variants; building in {base} and {new} with {args.jobs} threads each", file=sys.stderr)
    for side, root in (("base", base), ("new", new)):
        res = _run_side(root, ["_build", str(root), str(work / "variants.json"), str(work / side), str(args.jobs)]
                        + ([json.dumps(added)] if side == "new" and added else []))
        sys.stderr.write(res.stderr)
        if res.returncode != 0:
            return 2
    return compare(variants, work / "base", work / "new", work)


if __name__ == "__main__":
    sys.exit(main())
