"""Compact summary of pytest junit XML files (FlashInfer tests run against gdnjit by run.sh, one file each).

    python tools/flashinfer_harness/summarize.py <file.xml> [<file.xml> ...] [--examples N]

Prints passed / failed / error / skipped counts per test file, then failures and errors
grouped by their first error line (digits folded to '#' so the same failure with other
shapes groups together; one real message shown), then skip reasons grouped the same way.
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter, OrderedDict, defaultdict


def _file_of(case: ET.Element) -> str:
    if case.get("file"):
        return case.get("file")
    cls = case.get("classname") or "?"
    parts = cls.split(".")
    # classname is "tests.gdn.test_x" or "tests.gdn.test_x.TestClass"; keep up to the test_ module
    for i, p in enumerate(parts):
        if p.startswith("test_"):
            return "/".join(parts[: i + 1]) + ".py"
    return cls


def _first_line(el: ET.Element) -> str:
    for text in (el.get("message") or "", el.text or ""):
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("E "):
                line = line[1:].strip()
            if line:
                return line[:200]
    return "(no message)"


def _key(line: str) -> str:
    return re.sub(r"\d+", "#", line)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("xml", nargs="+")
    ap.add_argument("--examples", type=int, default=2, help="test ids shown per failure group")
    args = ap.parse_args(argv)
    roots = []
    for path in args.xml:
        try:
            roots.append(ET.parse(path).getroot())
        except (OSError, ET.ParseError) as e:
            print(f"summarize: cannot read {path}: {e}", file=sys.stderr)
            return 1

    counts: "OrderedDict[str, Counter]" = OrderedDict()
    groups = defaultdict(list)  # (kind, key) -> [(example line, test id)]
    skips = defaultdict(list)
    for case in (c for root in roots for c in root.iter("testcase")):
        f = _file_of(case)
        c = counts.setdefault(f, Counter())
        name = f"{f.rsplit('/', 1)[-1]}::{case.get('name')}"
        failure, error, skipped = case.find("failure"), case.find("error"), case.find("skipped")
        if failure is not None:
            c["failed"] += 1
            line = _first_line(failure)
            groups[("FAIL", _key(line))].append((line, name))
        elif skipped is not None:
            c["skipped"] += 1
            line = _first_line(skipped)
            skips[_key(line)].append((line, name))
        elif error is None:
            c["passed"] += 1
        if error is not None:
            c["error"] += 1
            line = _first_line(error)
            groups[("ERROR", _key(line))].append((line, name))

    print(f"{'file':<58} {'passed':>7} {'failed':>7} {'error':>6} {'skipped':>8}")
    total = Counter()
    for f, c in counts.items():
        total.update(c)
        print(f"{f:<58} {c['passed']:>7} {c['failed']:>7} {c['error']:>6} {c['skipped']:>8}")
    print(f"{'total':<58} {total['passed']:>7} {total['failed']:>7} {total['error']:>6} {total['skipped']:>8}")

    if groups:
        print("\nfailures / errors by first error line:")
        for (kind, _), items in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            print(f"  {len(items):>5}  {kind}  {items[0][0]}")
            for _, name in items[: args.examples]:
                print(f"           e.g. {name}")
    if skips:
        print("\nskip reasons:")
        for _, items in sorted(skips.items(), key=lambda kv: -len(kv[1])):
            print(f"  {len(items):>5}  {items[0][0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
