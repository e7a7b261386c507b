"""The ``gdnjit`` command line: precompile, tune, inspect and ship gdnjit's JIT-compiled CUDA kernels."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from .cache import CacheDirError, DiskCache
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
            raise ValueError(f"{what}: expected NAME=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = _parse_value(v.strip())
    return out


def _local_arch() -> str | None:
    try:
        import torch

        if torch.cuda.is_available():
            from .runner import device_info

            return device_info(torch.cuda.current_device()).arch
    except Exception:  # noqa: BLE001 - no usable GPU means "no local arch"
        return None
    return None


def _cache(config, write: bool = False, create: bool = False) -> DiskCache:
    """The configured cache, its dirs checked first (CacheDirError: one line, exit 2)."""
    cache = DiskCache(config)
    cache.check(write=write, create=create)
    return cache


def cmd_warm(args) -> int:
    from . import plan_record
    from .shapes import load_shapes, resolve_path
    from .warm import all_cached, check_supported_arch, plan, tuned_docs, warm

    config = get_config()
    archs = args.arch  # each checked by argparse (_arch)
    if not archs:
        local = _local_arch()
        if not local:
            print("gdnjit warm: no GPU here; pass --arch (e.g. --arch sm_90)", file=sys.stderr)
            return 2
        archs = [check_supported_arch(local, what="the local GPU's arch (pass --arch to warm for another)")]
    cache = _cache(config)  # a cache dir that is a file fails here; writing is checked once the plan stands
    t0 = time.perf_counter()
    docs = tuned_docs(config)
    shapes = [resolve_path(f).read_bytes() for f in args.shapes]  # a missing file fails here
    record_key = plan_record.digest(shapes, archs, args.num_sms, docs, config.batch_invariant)
    record = None if config.disable_disk_cache else plan_record.load(config.cache_dir, record_key)
    results = None
    if record is not None and not args.dry_run:
        results = all_cached(record[0], config)  # every recorded variant cached: nothing to plan or compile
    if record is not None and args.dry_run:
        for r in record[0]:
            print(f"{r.name}  {r.description}")
        print(f"{len(record[0])} variants for {record[1]} problems on {', '.join(archs)}")
        return 0
    n = len(results) if results is not None else 0
    done = [0]

    def progress(res):
        done[0] += 1
        if sys.stderr.isatty():
            print(f"\r[{done[0]}/{n}] {res.status:8s} {res.name[:90]:90s}", end="", file=sys.stderr, flush=True)
        elif res.status != "cached" or args.verbose:
            print(f"[{done[0]}/{n}] {res.status} {res.name} ({res.seconds:.2f} s)", file=sys.stderr)

    if results is None:
        problems = []
        for f in args.shapes:
            problems += load_shapes(f)
        variants = plan(problems, archs, args.num_sms, docs, batch_invariant=config.batch_invariant)
        if args.dry_run:
            for v in variants:
                print(f"{v.name}  {v.describe()}")
            print(f"{len(variants)} variants for {len(problems)} problems on {', '.join(archs)}")
            return 0
        cache.check(write=True, create=True)  # unwritable: one line now, not an OSError per worker
        n = len(variants)
        results = warm(variants, config, args.jobs, progress)
        if not config.disable_disk_cache and not any(r.status == "failed" for r in results):
            try:
                plan_record.save(config.cache_dir, record_key, variants, len(problems))
            except OSError as e:  # the warm itself succeeded: only the next one will plan again
                print(f"gdnjit warm: warning: the plan was not recorded: {e}", file=sys.stderr)
    else:
        for res in results:
            progress(res)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    failed = [r for r in results if r.status == "failed"]
    if args.verbose:
        print(f"{'status':9s} {'regs':>4s} {'spill':>5s} {'sec':>6s}  variant")
        for r in results:
            print(f"{r.status:9s} {r.meta.get('registers', 0):4d} {r.meta.get('spill_bytes', 0):5d} "
                  f"{r.seconds:6.2f}  {r.name}")
    compiled = sum(r.status == "compiled" for r in results)
    spilling = [r for r in results if r.meta.get("spill_bytes", 0)]
    for r in spilling:
        print(f"gdnjit warm: warning: variant {r.name} spills {r.meta['spill_bytes']} bytes "
              f"({r.meta.get('registers', 0)} registers): {r.description}", file=sys.stderr)
    max_regs = max((r.meta.get("registers", 0) for r in results), default=0)
    print(f"gdnjit warm: {n} variants ({compiled} compiled, {n - compiled - len(failed)} already cached, "
          f"{len(failed)} failed), max registers {max_regs}, {len(spilling)} with spills, "
          f"{time.perf_counter() - t0:.1f} s, cache {config.cache_dir}")
    for r in failed:
        dump = config.cache_dir / "failed" / f"{r.name}.cu"
        dump.parent.mkdir(parents=True, exist_ok=True)
        dump.write_text(r.error)
        print(f"FAILED {r.description}: source and NVRTC log in {dump}", file=sys.stderr)
    if args.strict and spilling:
        print(f"gdnjit warm: --strict: {len(spilling)} variant(s) spill registers (listed above)", file=sys.stderr)
    return 1 if failed or (args.strict and spilling) else 0


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
    config = get_config()
    _cache(config)  # a cache dir that is a file fails here, before the GPU checks
    problems = []
    for f in args.shapes:  # a bad shapes file too
        problems += load_shapes(f)
    if args.call:
        calls = sorted({p.call for p in problems})
        unknown = sorted(set(args.call) - set(calls))
        if unknown:
            print(f"gdnjit tune: --call: expected calls of the shapes files ({', '.join(calls)}), got unknown {unknown}",
                  file=sys.stderr)
            return 2
        problems = [p for p in problems if p.call in args.call]
    from .spec import get_spec

    if args.where is not None:  # and a name the candidates do not have (it evaluates over params and tunables)
        for name in sorted({p.spec for p in problems}):
            spec = get_spec(name)
            unknown = _expr.names_in(args.where) - set(spec.param_names) - set(spec.tunable_names)
            if unknown:
                print(f"gdnjit tune: --where: expected names of spec {name}'s params and tunables, got unknown "
                      f"{sorted(unknown)} (--call narrows the shapes' calls)", file=sys.stderr)
                return 2
    untunable = {}  # call -> why its op does not time it (the op module's `untunable(params)` says)
    for p in problems:
        spec = get_spec(p.spec)
        hook = getattr(importlib.import_module(f"gdnjit.{spec.module}"), "untunable", None) if spec.module else None
        reason = hook(dict(spec.param_defaults, **dict(p.params))) if hook else None
        if reason:
            untunable.setdefault(p.call, reason)
    problems = [p for p in problems if p.call not in untunable]
    if not problems:
        print("gdnjit tune: --call: no call left to tune ("
              + "; ".join(f"{c}: {r}" for c, r in sorted(untunable.items())) + ")", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gdnjit tune: needs a CUDA GPU (it measures the candidates on it)", file=sys.stderr)
        return 2
    from .runner import device_info
    from .warm import check_supported_arch

    check_supported_arch(device_info(torch.cuda.current_device()).arch, what="the local GPU's arch")
    for call, reason in sorted(untunable.items()):
        print(f"gdnjit tune: skipping call {call} ({reason})", file=sys.stderr)
    dedup = {}
    for p in problems:  # models sharing (params, facts) measure the same thing
        dedup.setdefault((p.spec, p.params, p.facts), p)
    problems = list(dedup.values())[: args.max_problems or None]
    _cache(config, write=True, create=True)  # the candidates are compiled into it
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


def _facts(args, spec) -> dict[str, int]:
    """The runtime facts the dispatcher sees for ``spec``: ``-f NAME=VALUE``, else the shorthands --B / --H /
    --HV / --num-sms (their defaults where the spec has them); ValueError naming a fact that is missing,
    unknown or not a positive integer."""
    given = _kv(args.fact, "--fact")
    unknown = sorted(set(given) - set(spec.facts))
    if unknown:
        raise ValueError(f"--fact: expected facts of spec {spec.name} ({', '.join(spec.facts)}), got unknown {unknown}")
    bad = {k: v for k, v in given.items() if isinstance(v, bool) or not isinstance(v, int) or v <= 0}
    if bad:
        raise ValueError(f"--fact: expected positive integers, got {bad}")
    facts = {"B": args.B or 1, "H": args.H, "HV": args.HV, "num_sms": args.num_sms, **given}
    missing = [f for f in spec.facts if f not in facts]
    if missing:
        raise ValueError(f"--fact: spec {spec.name} needs the facts {missing}; give them as -f {missing[0]}=VALUE")
    return {f: facts[f] for f in spec.facts}


def _given(spec, items: Sequence[str] | None, flag: str, kind: str) -> dict[str, Any]:
    """The ``NAME=VALUE`` items of ``flag``: each name one of ``spec``'s ``kind`` ('params' or 'tunables'), each value
    one the spec allows (accepts: 1 == True, so a bool's value must be a bool too). Whether tunables satisfy the
    constraints together is Variant.make's check."""
    given = _kv(items, flag)
    names = spec.param_names if kind == "params" else spec.tunable_names
    unknown = set(given) - set(names)
    if unknown:
        raise ValueError(f"{flag}: expected {kind} of spec {spec.name} ({', '.join(names)}), got unknown {sorted(unknown)}")
    for n, v in given.items():
        if not spec.accepts(n, v) or isinstance(v, bool) != isinstance(spec.allowed(n)[0], bool):
            raise ValueError(f"{flag} {n}: expected one of {spec.allowed_text(n)}, got {v!r}")
    return given


DEFAULT_SHAPES = "qwen35.yaml"  # the shipped shapes whose first call of a spec gives the params -p leaves out


def _default_params(spec, arch: str) -> dict[str, Any]:
    """The values of ``spec``'s params that ``-p`` leaves out: those of the spec's first call in the shipped
    Qwen3.5 shapes (qwen35.yaml: gdn's T = 1 decode of K = V = 128 over a pool, nvfp4_quantize's K = 4096, ...)
    and those ``arch`` sets (the spec's ``from_arch``); a param neither gives a value ``spec`` accepts (a spec
    qwen35.yaml does not call, a spec file that narrows a param) takes its first allowed value."""
    from .shapes import load_shapes

    first = next((p for p in load_shapes(DEFAULT_SHAPES) if p.spec == spec.name), None)
    given = {**(dict(first.params) if first else {}), **spec.arch_params(arch)}
    return {n: given[n] if n in given and spec.accepts(n, given[n]) else vals[0] for n, vals in spec.params}


def _params(spec, items: Sequence[str] | None, arch: str) -> dict[str, Any]:
    """Every param of ``spec``: the ``-p`` values given (checked), :func:`_default_params` for the rest."""
    given = _given(spec, items, "--param", "params")
    return {**_default_params(spec, arch), **given}


def _variant_from_args(args):
    from . import dispatch
    from .spec import get_spec
    from .variant import Variant

    spec = get_spec(args.spec)
    params = _params(spec, args.param, args.arch)
    facts = _facts(args, spec)
    tunables = _given(spec, args.tunable, "--tunable", "tunables")
    chosen, _ = dispatch.select(spec, params, facts)
    return Variant.make(spec, params, {**chosen, **tunables}, args.arch)


def cmd_render(args) -> int:
    variant = _variant_from_args(args)
    sys.stdout.write(variant.source())
    return 0


def cmd_list(args) -> int:
    from .shapes import shipped_shapes
    from .spec import get_spec, list_specs

    cache = _cache(get_config())  # a bad cache dir fails before any output
    specs = [get_spec(name) for name in list_specs()]
    width = max(len(spec.name) for spec in specs)
    for spec in specs:
        if not args.verbose:  # one short line: the detail is `list -v` or `spec show NAME`
            print(f"spec {spec.name:{width}s}  template {spec.template}: {len(spec.params)} params, "
                  f"{len(spec.tunables)} tunables, {len(spec.rules)} rules")
            continue
        print(f"spec {spec.name} (template {spec.describe_template()}): {spec.description.strip()}")
        for n, vals in spec.params:
            print(f"  param   {n}: {list(vals)}")
        for n, vals in spec.tunables:
            print(f"  tunable {n}: {list(vals)}")
        for i, r in enumerate(spec.rules):
            print(f"  rule {i}: when {r.when or '(always)'} -> {dict(r.use)}")
    if not args.verbose:
        print("(each spec's params, tunables and rules: gdnjit list -v, or gdnjit spec show NAME)")
    print(f"shapes files: {', '.join(shipped_shapes())}")
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


# The options each cache action takes (FILE is export's and import's): any other is an error, not ignored.
_CACHE_OPTIONS = {"ls": {"verbose"}, "clear": set(), "verify": {"repair"}, "evict": {"max_bytes"},
                  "export": {"file", "force"}, "import": {"file", "replace"}}
_CACHE_FLAGS = {"file": "FILE", "repair": "--repair", "max_bytes": "--max-bytes", "force": "--force",
                "replace": "--replace", "verbose": "-v"}


def _check_cache_args(args) -> None:
    """ValueError naming the first argument ``args.action`` does not take (``cache clear x`` used to clear)."""
    for name, flag in _CACHE_FLAGS.items():
        value = getattr(args, name)
        if value not in (None, False) and name not in _CACHE_OPTIONS[args.action]:
            shown = f"argument {value!r}" if name == "file" else f"option {flag}"
            takers = [a for a, names in _CACHE_OPTIONS.items() if name in names]
            raise ValueError(f"{args.action}: unexpected {shown} (only {' and '.join(takers)} take "
                             f"{'a FILE' if name == 'file' else flag})")
    if args.action in ("export", "import") and not args.file:
        raise ValueError(f"{args.action}: expected FILE, the .tar.gz archive, got none")


def cmd_cache(args) -> int:
    from .cache.archive import export_archive, import_archive  # here: tarfile costs the other commands' start
    from .config import parse_size

    _check_cache_args(args)
    config = get_config()
    writes = args.action in ("clear", "evict", "import") or (args.action == "verify" and args.repair)
    # import makes the dirs it needs (after reading the archive); the others only delete in dirs that exist
    cache = _cache(config, write=writes)
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
            total = sum(u.bytes for u in usage.values())
            limit = f", limit {_human(config.cache_max_bytes)}" if mode == "rw" and config.cache_max_bytes else ""
            missing = "" if directory.is_dir() else " (not created yet)"
            # the summary goes to stderr: stdout stays one line per entry (for scripts)
            print(f"{mode} total: {n} entries, {total} bytes ({_human(total)}) in {directory}{missing}{limit}",
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
    if args.action == "export":
        n = export_archive(cache, Path(args.file), force=args.force)
        print(f"exported {n} entries from {cache.dir} to {args.file}")
        return 0
    if args.action == "import":
        return _report_import(import_archive(cache, Path(args.file), replace=args.replace), cache.dir)
    if args.action == "clear":
        from . import plan_record

        n = cache.clear()
        print(f"removed {n} files from {cache.dir}")
        plans = plan_record.clear(config.cache_dir)
        if plans:
            print(f"removed {plans} files from {config.cache_dir / plan_record.PLAN_DIR}")
        return 0
    bad = cache.verify(repair=args.repair)
    for name, problem in bad:
        print(f"BAD {name}: {problem}{' (removed)' if args.repair else ''}")
    total = sum(1 for _ in cache.list_entries())
    print(f"{total} entries checked in {cache.dir}, {len(bad)} bad")
    return 1 if bad and not args.repair else 0


def _report_import(res, directory: Path) -> int:
    """Print what an import did; 1 if anything needs a look (entries skipped as invalid, files that are not
    entries, local entries kept over the archive's), else 0."""
    c = res.contents
    print(f"imported {len(res.added) + len(res.replaced)} entries into {directory} ({len(res.added)} new, "
          f"{len(res.replaced)} replaced, {len(res.present)} already present, {len(res.kept)} kept, "
          f"{len(c.invalid)} invalid skipped, {len(c.other)} other files skipped)")
    for name in res.kept:
        print(f"gdnjit cache import: kept the local entry {name}: its cubin differs from the archive's "
              f"(pass --replace to take the archive's)", file=sys.stderr)
    for name in c.invalid:
        print(f"gdnjit cache import: skipped invalid entry {name} (incomplete, or its cubin does not match its "
              f"sidecar or name)", file=sys.stderr)
    for name in c.other:
        print(f"gdnjit cache import: skipped {name!r}: not a cache entry file", file=sys.stderr)
    return 1 if res.kept or c.invalid or c.other else 0


def _looks_like_file(target: str) -> bool:
    """An existing path, or a name that can only be one (a .yaml/.yml suffix or a directory part)."""
    return Path(target).exists() or target.endswith((".yaml", ".yml")) or "/" in target or os.sep in target


def _spec_file(target: str) -> Path:
    path = Path(target)
    if not path.exists():
        raise ValueError(f"spec file {target!r}: no such file")
    if not path.is_file():
        raise ValueError(f"spec file {target!r}: expected a YAML file, got a directory")
    return path


def _shipped_spec_name(target: str) -> str:
    from .spec import list_specs

    if target not in list_specs():
        raise ValueError(f"{target!r}: expected a spec file or a shipped spec name ({', '.join(list_specs())}), "
                         f"got neither (no such file, no such spec)")
    return target


def _spec_target(target: str):
    """The spec a ``gdnjit spec`` target names: a spec file (loaded and checked) or a shipped spec."""
    from .spec import get_spec, load_spec_file

    return load_spec_file(_spec_file(target)) if _looks_like_file(target) else get_spec(_shipped_spec_name(target))


def cmd_spec(args) -> int:
    from . import dispatch

    if args.action == "validate":
        for f in args.target:
            spec = _spec_target(f)
            print(f"{f}: ok (spec {spec.name}: {len(spec.params)} params, {len(spec.tunables)} tunables, "
                  f"{len(spec.rules)} rules)")
        return 0
    if len(args.target) != 1:
        raise ValueError(f"show: expected one target (a spec file or a shipped spec name), got {len(args.target)}: "
                         f"{args.target}")
    spec = _spec_target(args.target[0])
    explain = bool(args.param or args.B or args.fact)
    spec_facts = _facts(args, spec) if explain else None  # bad facts or params: one line before any output
    params = _params(spec, args.param, args.arch) if explain else None
    print(f"spec {spec.name}: {spec.description.strip()}")
    print(f"template: {spec.describe_template()}   kernel: {spec.kernel_name}   file: {spec.file}")
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
    if explain:
        print(f"\nfor {params} with {spec_facts}:")
        for line in dispatch.explain(spec, params, spec_facts):
            print("  " + line)
        if spec.template_fields:
            try:
                chosen, _ = dispatch.select(spec, params, spec_facts)
            except dispatch.DispatchError:
                chosen = None
            if chosen is not None:
                print(f"  template of the chosen variant: {spec.template_for({**params, **chosen})}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors: ``gdnjit warm: argument --num-sms: expected ..., got '-5'``
    (exit 2), the full usage being one ``--help`` away."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _int_at_least(least: int, what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    parse.__name__ = what  # argparse's fallback message names the type
    return parse


_positive = _int_at_least(1, "a positive integer")
_nonnegative = _int_at_least(0, "an integer >= 0")


def _arch(text: str) -> str:
    from .warm import check_supported_arch

    try:
        return check_supported_arch(text, what=None)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _variant_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-p", "--param", action="append",
                   help="spec param NAME=VALUE (default: the value in the spec's first call of the shipped Qwen3.5 "
                        "shapes, qwen35.yaml, e.g. K=128 V=128 for gdn, or the one --arch sets; the first allowed "
                        "value for a spec it does not call)")
    p.add_argument("-t", "--tunable", action="append", help="tunable NAME=VALUE (default: the dispatcher's choice)")
    p.add_argument("--arch", type=_arch, default="sm_90", help="target arch (default sm_90)")
    p.add_argument("-f", "--fact", action="append", help="runtime fact NAME=VALUE the dispatcher sees (any spec's "
                   "facts, e.g. -f D=12288 for causal_conv1d_update, -f M=4096 for nvfp4_quantize)")
    p.add_argument("--B", type=_positive, default=None, help="shorthand for -f B=VALUE (default 1)")
    p.add_argument("--H", type=_positive, default=16, help="shorthand for -f H=VALUE (gdn)")
    p.add_argument("--HV", type=_positive, default=32, help="shorthand for -f HV=VALUE (gdn)")
    p.add_argument("--num-sms", type=_positive, default=132,
                   help="shorthand for -f num_sms=VALUE: the SM count the rules see (default 132: H100 SXM, H200)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gdnjit")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("warm", help="precompile the variants the dispatcher can select for a shapes file",
                       description="Precompile the variants the dispatcher can select for the shapes files. A warm "
                       "with no failure records its plan in <cache dir>/plans/; a later warm with the same inputs "
                       "(gdnjit's files, NVRTC, shapes, archs, SM counts, tuned tables, batch-invariant mode) whose "
                       "recorded variants are all cached reports them without planning.")
    p.add_argument("--shapes", action="append", required=True, help="shipped name (qwen35.yaml) or path; repeatable")
    p.add_argument("--arch", type=_arch, action="append",
                   help="target arch, repeatable (default: the local GPU's); one of the supported targets "
                        "(an unsupported one is refused before anything is compiled)")
    p.add_argument("--num-sms", type=_positive, action="append",
                   help="SM counts the rules see (default: known parts of the arch)")
    p.add_argument("-j", "--jobs", type=_positive, default=None, help="parallel compiles (default: CPU count)")
    p.add_argument("--dry-run", action="store_true", help="list the variants, compile nothing")
    p.add_argument("-v", "--verbose", action="store_true", help="print a table of every variant")
    p.add_argument("--strict", action="store_true",
                   help="exit with status 1 if any variant spills registers (each spilling variant is "
                        "always printed as a warning on stderr) or fails to compile")
    p.set_defaults(fn=cmd_warm)

    p = sub.add_parser("tune", help="measure the candidate variants on this GPU and write a tuned table")
    p.add_argument("--shapes", action="append", required=True, help="shipped name or path; repeatable")
    p.add_argument("--b", type=_positive, nargs="+", help="values of each problem's batch fact to measure (gdn: B, nvfp4_quantize: M; "
                   "default: the shapes file's)")
    p.add_argument("--call", action="append", help="only these calls of the shapes file")
    p.add_argument("--max-problems", type=_nonnegative, default=0, help="measure at most this many (0: all)")
    p.add_argument("--out", help="table path (default: <cache dir>/tuned/<gpu>.json, merged)")
    p.add_argument("--replace", action="store_true", help="do not merge with an existing table")
    p.add_argument("--where", help="measure only candidates for which this expression over params and tunables "
                   "holds, e.g. \"form == 'chunk' and lanes_per_row <= 8\" (the rules' choice is always measured)")
    p.set_defaults(fn=cmd_tune)

    p = sub.add_parser("render", help="print the CUDA source of one variant")
    p.add_argument("spec")
    _variant_args(p)
    p.set_defaults(fn=cmd_render)

    p = sub.add_parser("list", help="show the specs (one line each), the shapes files and the cache size")
    p.add_argument("-v", "--verbose", action="store_true", help="each spec's description, params, tunables and rules")
    p.set_defaults(fn=cmd_list)

    p = sub.add_parser("cache", help="inspect or maintain the on-disk cache")
    p.add_argument("action", choices=["ls", "clear", "verify", "evict", "export", "import"])
    p.add_argument("file", nargs="?", help="export/import: the .tar.gz archive")
    p.add_argument("--repair", action="store_true", help="verify: delete bad entries")
    p.add_argument("--force", action="store_true", help="export: replace FILE if it is an existing regular file "
                   "(anything else there, a link or a device, is always refused)")
    p.add_argument("--replace", action="store_true", help="import: where a local entry's cubin differs from the "
                   "archive's, take the archive's (default: keep the local one and say so)")
    p.add_argument("--max-bytes", default=None,
                   help="evict: the size limit (e.g. 2G; default GDNJIT_CACHE_MAX_BYTES): least recently used "
                        "entries are deleted until the cache fits")
    p.add_argument("-v", "--verbose", action="store_true", help="ls: each entry's variant too")
    p.set_defaults(fn=cmd_cache)

    p = sub.add_parser("spec", help="validate spec files or show a spec and what a problem selects")
    p.add_argument("action", choices=["validate", "show"])
    p.add_argument("target", nargs="+", help="spec file paths or shipped spec names (show: exactly one)")
    _variant_args(p)
    p.set_defaults(fn=cmd_spec)
    # listed from the parser itself: a new command cannot be left out of `gdnjit --help` (tune once was)
    parser.description = (f"Precompile, tune, inspect and ship gdnjit's JIT-compiled CUDA kernels. Commands: "
                          f"{', '.join(sub.choices)} (gdnjit COMMAND --help for each).")
    return parser


def _one_line(e: BaseException) -> str:
    return " ".join(part.strip() for part in str(e).splitlines() if part.strip())


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null, so that the interpreter's final flush of what is
    still buffered does not raise again (the recipe of the Python docs, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (tests), or no stdout
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Bad input (arguments, environment, cache dirs, files) ends with one line
    ``gdnjit <command>: <message>`` on stderr and status 2; a closed stdout (``gdnjit ... | head``)
    ends quietly with status 141 (128 + SIGPIPE, what a shell reports for a killed writer)."""
    args = build_parser().parse_args(argv)
    if getattr(args, "B", None) is None and args.command == "render":
        args.B = 1
    try:
        get_config()  # every GDNJIT_* variable is checked before any output
        rc = args.fn(args)
        sys.stdout.flush()  # a closed pipe shows up here, not in the interpreter's exit
        return rc
    except BrokenPipeError:
        _silence_stdout()
        return 128 + int(getattr(signal, "SIGPIPE", 13))
    except (SpecError, ValueError, CacheDirError) as e:  # ConfigError, ArchiveError: ValueErrors
        print(f"gdnjit {args.command}: {_one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:  # the machine's, not the input's (a full disk, an I/O error): one line all the same
        where = f"{e.filename}: " if e.filename else ""
        print(f"gdnjit {args.command}: {where}{_one_line(e) if not e.strerror else e.strerror.lower()}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
