"""The ``gdnjit`` command line: warm, render, list, cache ls/clear/verify/evict/export/import, spec validate/show."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from .cache import DiskCache
from .config import get_config
from .errors import SpecError


def _parse_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text


def _kv(items: Sequence[str] | None, what: str) -> dict[str, Any]:
    out = {}
    for item in items or ():
        if "=" not in item:
            raise SystemExit(f"gdnjit: {what} {item!r}: expected NAME=VALUE")
        k, v = item.split("=", 1)
        out[k.strip()] = _parse_value(v.strip())
    return out


def _local_arch() -> str | None:
    try:
        import torch

        if torch.cuda.is_available():
            from .kernels import device_info

            return device_info(torch.cuda.current_device()).arch
    except Exception:  # noqa: BLE001 - no usable GPU means "no local arch"
        return None
    return None


def cmd_warm(args) -> int:
    from .shapes import load_shapes
    from .warm import plan, tuned_docs, warm

    config = get_config()
    archs = args.arch or ([_local_arch()] if _local_arch() else None)
    if not archs:
        print("gdnjit warm: no GPU here; pass --arch (e.g. --arch sm_90)", file=sys.stderr)
        return 2
    problems = []
    for f in args.shapes:
        problems += load_shapes(f)
    t0 = time.perf_counter()
    variants = plan(problems, archs, args.num_sms, tuned_docs(config))
    if args.dry_run:
        for v in variants:
            print(f"{v.name}  {v.describe()}")
        print(f"{len(variants)} variants for {len(problems)} problems on {', '.join(archs)}")
        return 0
    n = len(variants)
    done = [0]

    def progress(res):
        done[0] += 1
        if sys.stderr.isatty():
            print(f"\r[{done[0]}/{n}] {res.status:8s} {res.variant.name[:90]:90s}", end="", file=sys.stderr, flush=True)
        elif res.status != "cached" or args.verbose:
            print(f"[{done[0]}/{n}] {res.status} {res.variant.name} ({res.seconds:.2f} s)", file=sys.stderr)

    results = warm(variants, config, args.jobs, progress)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    failed = [r for r in results if r.status == "failed"]
    if args.verbose:
        print(f"{'status':9s} {'regs':>4s} {'spill':>5s} {'sec':>6s}  variant")
        for r in results:
            print(f"{r.status:9s} {r.meta.get('registers', 0):4d} {r.meta.get('spill_bytes', 0):5d} "
                  f"{r.seconds:6.2f}  {r.variant.name}")
    compiled = sum(r.status == "compiled" for r in results)
    spills = sum(1 for r in results if r.meta.get("spill_bytes", 0))
    max_regs = max((r.meta.get("registers", 0) for r in results), default=0)
    print(f"gdnjit warm: {n} variants ({compiled} compiled, {n - compiled - len(failed)} already cached, "
          f"{len(failed)} failed), max registers {max_regs}, {spills} with spills, "
          f"{time.perf_counter() - t0:.1f} s, cache {config.cache_dir}")
    for r in failed:
        dump = config.cache_dir / "failed" / f"{r.variant.name}.cu"
        dump.parent.mkdir(parents=True, exist_ok=True)
        dump.write_text(r.error)
        print(f"FAILED {r.variant.describe()}: source and NVRTC log in {dump}", file=sys.stderr)
    return 1 if failed else 0


def cmd_tune(args) -> int:
    import torch

    from .shapes import load_shapes
    from .tune import table_doc, tune
    from .tuned import device_slug, write_table

    if args.where is not None:  # a bad expression fails here, not after the first compiles
        from . import expr as _expr

        try:
            _expr.compile_expr(args.where)
        except _expr.ExprError as e:
            print(f"gdnjit tune: --where: {e}", file=sys.stderr)
            return 2
    if not torch.cuda.is_available():
        print("gdnjit tune: needs a CUDA GPU (it measures the candidates on it)", file=sys.stderr)
        return 2
    config = get_config()
    problems = []
    for f in args.shapes:
        problems += load_shapes(f)
    if args.call:
        problems = [p for p in problems if p.call in args.call]
    dedup = {}
    for p in problems:  # models sharing (params, H, HV) measure the same thing
        dedup.setdefault((p.spec, p.params, p.H, p.HV), p)
    problems = list(dedup.values())[: args.max_problems or None]
    dev = torch.cuda.current_device()
    entries = tune(problems, config, dev, args.b, where=args.where)
    doc = table_doc(entries, dev)
    out = Path(args.out) if args.out else config.cache_dir / "tuned" / f"{device_slug(doc['device'])}.json"
    if out.exists() and not args.replace:
        import json

        old = json.loads(out.read_text()).get("entries", [])
        keep = {(e["spec"], repr(sorted(e["params"].items())), repr(sorted(e["facts"].items()))) for e in entries}
        doc["entries"] = [e for e in old if (e["spec"], repr(sorted(e["params"].items())),
                                              repr(sorted(e["facts"].items()))) not in keep] + entries
    write_table(out, doc)
    print(f"gdnjit tune: {len(entries)} problems measured on {doc['device']}; table {out}")
    return 0


def _variant_from_args(args):
    from . import dispatch
    from .spec import get_spec
    from .variant import Variant

    spec = get_spec(args.spec)
    given = _kv(args.param, "--param")
    unknown = set(given) - set(spec.param_names)
    if unknown:
        raise SystemExit(f"gdnjit: unknown params {sorted(unknown)} for spec {spec.name} (params: {list(spec.param_names)})")
    params = {n: given.get(n, vals[0]) for n, vals in spec.params}
    facts = {"B": args.B, "H": args.H, "HV": args.HV, "num_sms": args.num_sms}
    tunables = _kv(args.tunable, "--tunable")
    if not tunables:
        tunables, _ = dispatch.select(spec, params, {f: facts[f] for f in spec.facts if f in facts})
    else:
        chosen, _ = dispatch.select(spec, params, {f: facts[f] for f in spec.facts if f in facts})
        tunables = {**chosen, **tunables}
    return Variant.make(spec, params, tunables, args.arch)


def cmd_render(args) -> int:
    variant = _variant_from_args(args)
    sys.stdout.write(variant.source())
    return 0


def cmd_list(args) -> int:
    from .shapes import shipped_shapes
    from .spec import get_spec, list_specs

    for name in list_specs():
        spec = get_spec(name)
        print(f"spec {spec.name} (template {spec.template}): {spec.description.strip()}")
        for n, vals in spec.params:
            print(f"  param   {n}: {list(vals)}")
        for n, vals in spec.tunables:
            print(f"  tunable {n}: {list(vals)}")
        for i, r in enumerate(spec.rules):
            print(f"  rule {i}: when {r.when or '(always)'} -> {dict(r.use)}")
    print(f"shapes files: {', '.join(shipped_shapes())}")
    cache = DiskCache(get_config())
    entries = list(cache.list_entries())
    print(f"cached variants in {cache.dir}: {len(entries)}")
    return 0


def _human(n: int) -> str:
    """``123 B``, ``4.5 KiB``, ``1.2 GiB``."""
    if n < 1024:
        return f"{n} B"
    for i, unit in enumerate(("KiB", "MiB", "GiB"), start=1):
        if n < 1024 ** (i + 1) or unit == "GiB":
            return f"{n / 1024 ** i:.1f} {unit}"
    raise AssertionError("unreachable")


def cmd_cache(args) -> int:
    from .config import parse_size

    config = get_config()
    cache = DiskCache(config)
    if args.action == "ls":
        dirs = [(d, "ro") for d in cache.readonly] + [(cache.dir, "rw")]
        for directory, mode in dirs:
            usage = {u.name: u for u in cache.usage(directory)}
            n = 0
            for name, meta in cache.list_entries(directory):
                n += 1
                u = usage.get(name)
                size = u.bytes if u else 0
                if meta is None:
                    print(f"{mode} {name}  <unreadable sidecar> size={size}")
                    continue
                used = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(u.last_used)) if u and u.last_used else "-"
                print(f"{mode} {name}  regs={meta.get('registers')} spills={meta.get('spill_bytes')} "
                      f"smem={meta.get('smem_bytes')} compile={meta.get('compile_s')}s size={size} used={used}")
                if args.verbose:
                    print(f"     {meta.get('variant')}")
            if directory.is_dir():
                total = sum(u.bytes for u in usage.values())
                limit = f", limit {_human(config.cache_max_bytes)}" if mode == "rw" and config.cache_max_bytes else ""
                # the summary goes to stderr: stdout stays one line per entry (for scripts)
                print(f"{mode} total: {n} entries, {total} bytes ({_human(total)}) in {directory}{limit}",
                      file=sys.stderr)
        return 0
    if args.action == "evict":
        limit = parse_size("--max-bytes", args.max_bytes) if args.max_bytes is not None else config.cache_max_bytes
        if limit <= 0:
            print(f"gdnjit cache evict: no size limit (set GDNJIT_CACHE_MAX_BYTES or pass --max-bytes); "
                  f"nothing removed from {cache.dir}")
            return 0
        try:
            res = cache.evict(limit)
        except OSError as e:
            print(f"gdnjit cache evict: {e}", file=sys.stderr)
            return 1
        for name in res.removed:
            print(f"evicted {name}")
        for name in res.skipped:
            print(f"skipped {name} (locked: being built or published)", file=sys.stderr)
        print(f"evicted {len(res.removed)} entries from {cache.dir}: {_human(res.before)} -> {_human(res.after)} "
              f"(limit {_human(limit)})")
        return 0 if res.after <= limit else 1
    if args.action in ("export", "import"):
        if not args.file:
            print(f"gdnjit cache {args.action}: needs FILE", file=sys.stderr)
            return 2
        if args.action == "export":
            n = cache.export(Path(args.file))
            print(f"exported {n} entries from {cache.dir} to {args.file}")
            return 0
        imported, skipped = cache.import_(Path(args.file))
        print(f"imported {imported} entries into {cache.dir} ({skipped} invalid skipped)")
        return 1 if skipped else 0
    if args.action == "clear":
        n = cache.clear()
        print(f"removed {n} files from {cache.dir}")
        return 0
    bad = cache.verify(repair=args.repair)
    for name, problem in bad:
        print(f"BAD {name}: {problem}{' (removed)' if args.repair else ''}")
    total = sum(1 for _ in cache.list_entries())
    print(f"{total} entries checked in {cache.dir}, {len(bad)} bad")
    return 1 if bad and not args.repair else 0


def cmd_spec(args) -> int:
    from . import dispatch
    from .spec import get_spec, load_spec_file

    if args.action == "validate":
        for f in args.target:
            spec = load_spec_file(f) if Path(f).exists() else get_spec(f)
            print(f"{f}: ok (spec {spec.name}: {len(spec.params)} params, {len(spec.tunables)} tunables, "
                  f"{len(spec.rules)} rules)")
        return 0
    spec = get_spec(args.target[0])
    print(f"spec {spec.name}: {spec.description.strip()}")
    print(f"template: {spec.template}   kernel: {spec.kernel_name}   file: {spec.file}")
    for n, vals in spec.params:
        print(f"param   {n}: {list(vals)}")
    for n, vals in spec.tunables:
        print(f"tunable {n}: {list(vals)}")
    for n, e in spec.derived:
        print(f"derived {n} = {e}")
    for c in spec.constraints:
        print(f"constraint {c.expr}   # {c.why}")
    for i, r in enumerate(spec.rules):
        print(f"rule {i} (line {r.line}): when {r.when or '(always)'} -> {dict(r.use)}   # {r.why.strip()}")
    if args.param or args.B:
        given = _kv(args.param, "--param")
        params = {n: given.get(n, vals[0]) for n, vals in spec.params}
        facts = {"B": args.B or 1, "H": args.H, "HV": args.HV, "num_sms": args.num_sms}
        print(f"\nfor {params} with {facts}:")
        for line in dispatch.explain(spec, params, {f: facts[f] for f in spec.facts if f in facts}):
            print("  " + line)
    return 0


def _variant_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-p", "--param", action="append", help="spec param NAME=VALUE (default: first allowed value)")
    p.add_argument("-t", "--tunable", action="append", help="tunable NAME=VALUE (default: the dispatcher's choice)")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--B", type=int, default=None, help="batch size the dispatcher sees (default 1)")
    p.add_argument("--H", type=int, default=16)
    p.add_argument("--HV", type=int, default=32)
    p.add_argument("--num-sms", type=int, default=132)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gdnjit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("warm", help="precompile the variants the dispatcher can select for a shapes file")
    p.add_argument("--shapes", action="append", required=True, help="shipped name (qwen35.yaml) or path; repeatable")
    p.add_argument("--arch", action="append", help="target arch, repeatable (default: the local GPU's)")
    p.add_argument("--num-sms", type=int, action="append", help="SM counts the rules see (default: known parts of the arch)")
    p.add_argument("-j", "--jobs", type=int, default=None, help="parallel compiles (default: CPU count)")
    p.add_argument("--dry-run", action="store_true", help="list the variants, compile nothing")
    p.add_argument("-v", "--verbose", action="store_true", help="print a table of every variant")
    p.set_defaults(fn=cmd_warm)

    p = sub.add_parser("tune", help="measure the candidate variants on this GPU and write a tuned table")
    p.add_argument("--shapes", action="append", required=True, help="shipped name or path; repeatable")
    p.add_argument("--b", type=int, nargs="+", help="batch sizes to measure (default: the shapes file's)")
    p.add_argument("--call", action="append", help="only these calls of the shapes file")
    p.add_argument("--max-problems", type=int, default=0)
    p.add_argument("--out", help="table path (default: <cache dir>/tuned/<gpu>.json, merged)")
    p.add_argument("--replace", action="store_true", help="do not merge with an existing table")
    p.add_argument("--where", help="measure only candidates for which this expression over params and tunables "
                   "holds, e.g. \"form == 'chunk' and lanes_per_row <= 8\" (the rules' choice is always measured)")
    p.set_defaults(fn=cmd_tune)

    p = sub.add_parser("render", help="print the CUDA source of one variant")
    p.add_argument("spec")
    _variant_args(p)
    p.set_defaults(fn=cmd_render)

    p = sub.add_parser("list", help="show specs, their params, tunables and rules, and the cache size")
    p.set_defaults(fn=cmd_list)

    p = sub.add_parser("cache", help="inspect or maintain the on-disk cache")
    p.add_argument("action", choices=["ls", "clear", "verify", "evict", "export", "import"])
    p.add_argument("file", nargs="?", help="export/import: the .tar.gz archive")
    p.add_argument("--repair", action="store_true", help="verify: delete bad entries")
    p.add_argument("--max-bytes", default=None,
                   help="evict: the size limit (e.g. 2G; default GDNJIT_CACHE_MAX_BYTES): least recently used "
                        "entries are deleted until the cache fits")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(fn=cmd_cache)

    p = sub.add_parser("spec", help="validate spec files or show a spec and what a problem selects")
    p.add_argument("action", choices=["validate", "show"])
    p.add_argument("target", nargs="+", help="spec file path(s) or shipped spec name")
    _variant_args(p)
    p.set_defaults(fn=cmd_spec)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "B", None) is None and args.command == "render":
        args.B = 1
    try:
        return args.fn(args)
    except (SpecError, ValueError) as e:
        print(f"gdnjit {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
