#!/usr/bin/env python3
"""Where a kernel's executed instructions go, from ncu's per-instruction source counters (docs/perf.md v30).

On the GPU machine, profile one call with the SourceCounters section and export the SASS page as CSV::

    ncu --profile-from-start off --section SourceCounters -f -o /tmp/r python3 SCRIPT ...   # e.g. tools/profile_gdn.py
    ncu -i /tmp/r.ncu-rep --page source --csv --print-source sass | gzip > $OUT/src.csv.gz

then here (no GPU needed)::

    python tools/ncu_segments.py src.csv.gz                 # per-warp instructions between barriers
    python tools/ncu_segments.py src.csv.gz --list 660 1039 # those instructions, with counts and stall samples

The kernel's straight-line code is cut into segments at every barrier (``BAR``) and exit; for each segment it prints the
instructions executed per warp (the ncu count divided by the number of warps: the first instruction's count, which
every warp executes), the share of the warp-stall samples, and the opcodes that executed most. A segment that only some
warps run (a warp-specialised phase) shows its count averaged over all warps.
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import re
import sys

_GUARD = re.compile(r"^@!?U?P\w+\s+")


def read_rows(path: str) -> list[tuple[str, int, int]]:
    """(SASS text, executed count, warp-stall samples) of every instruction, in address order."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    for i, row in enumerate(rows):  # a "Kernel Name" line precedes the header
        if "Source" in row and "Instructions Executed" in row:
            hdr, data = row, rows[i + 1:]
            break
    else:
        raise ValueError(f"{path}: expected ncu's source page as CSV (a header with 'Source' and 'Instructions "
                         f"Executed'), found none")
    i_src, i_exe = hdr.index("Source"), hdr.index("Instructions Executed")
    i_stall = hdr.index("Warp Stall Sampling (All Samples)") if "Warp Stall Sampling (All Samples)" in hdr else None
    out = []
    for row in data:
        if len(row) <= i_exe or not row[i_exe].strip().replace(",", "").isdigit():
            continue
        stall = int(row[i_stall].replace(",", "")) if i_stall is not None and row[i_stall].strip() else 0
        out.append((row[i_src].strip(), int(row[i_exe].replace(",", "")), stall))
    if not out:
        raise ValueError(f"{path}: no instruction rows")
    return out


def opcode(sass: str) -> str:
    """The mnemonic without modifiers or predicate guard (``@!P0 LDS.U16 R1, [R2]`` -> ``LDS``)."""
    body = _GUARD.sub("", sass)
    return body.split()[0].split(".")[0] if body else ""


def segments(rows: list[tuple[str, int, int]]) -> tuple[int, list[dict]]:
    """(warps, [{first, last, per_warp, stall, ops}]): cut after every barrier and exit."""
    warps = rows[0][1]
    if warps <= 0:
        raise ValueError("the first instruction executed 0 times: not a profiled launch")
    out, cur = [], None
    for k, (sass, exe, stall) in enumerate(rows):
        if cur is None:
            cur = dict(first=k, per_warp=0.0, stall=0, ops=collections.Counter())
        op = opcode(sass)
        cur["per_warp"] += exe / warps
        cur["stall"] += stall
        cur["ops"][op] += exe / warps
        if op in ("BAR", "EXIT") or k == len(rows) - 1:
            cur["last"] = k
            out.append(cur)
            cur = None
    return warps, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output (.gz or plain)")
    ap.add_argument("--list", nargs=2, type=int, metavar=("FIRST", "LAST"),
                    help="print these instructions (indices as in the segment table) instead")
    ap.add_argument("--top", type=int, default=7, help="opcodes shown per segment (default %(default)s)")
    args = ap.parse_args(argv)
    try:
        rows = read_rows(args.csv)
        warps, segs = segments(rows)
    except (OSError, ValueError) as e:
        print(f"ncu_segments: {e}", file=sys.stderr)
        return 2
    if args.list:
        first, last = args.list
        if not 0 <= first <= last < len(rows):
            print(f"ncu_segments: --list: expected 0 <= FIRST <= LAST < {len(rows)}, got {first} {last}", file=sys.stderr)
            return 2
        for k in range(first, last + 1):
            sass, exe, stall = rows[k]
            print(f"{k:5d} {exe / warps:7.2f} {stall:6d}  {sass}")
        return 0
    total = sum(exe for _, exe, _ in rows) / warps
    stalls = max(1, sum(s for _, _, s in rows))
    print(f"{len(rows)} instructions, {warps} warps, {total:.1f} executed per warp, {stalls} stall samples")
    for s in segs:
        if s["per_warp"] < 0.5 and s["stall"] < 0.002 * stalls:
            continue
        top = ", ".join(f"{o}:{c:.0f}" for o, c in s["ops"].most_common(args.top))
        print(f"[{s['first']:5d}-{s['last']:5d}] {s['per_warp']:8.1f} per warp  stall {100 * s['stall'] / stalls:5.1f}%  | {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
