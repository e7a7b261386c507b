"""One representative case of every GDN kernel variant family, for compute-sanitizer.

    compute-sanitizer --tool memcheck  python3 tools/sanitize_gdn.py
    compute-sanitizer --tool racecheck python3 tools/sanitize_gdn.py --staged-only [--forms [--kinds mma_pipe2 ...]]

Families: layout x state dtype x staged (T > 1) or not x pool mode (direct, pool with padding rows,
split with negative writes, page-strided, intermediate buffer + verify, per-token ssm writes).
Small shapes keep the sanitizer fast; each case is also checked against the float64 reference.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "ops"))

from gdn_cases import OVERRIDES, TC_OVERRIDE, Case, case_params, check, forced_tunables, forcing, run_case  # noqa: E402


def cases(staged_only: bool) -> list[Case]:
    out = []
    for layout in ("klast", "kmajor"):
        for sd in ("fp32", "bf16"):
            for T in (1, 3):
                if staged_only and T == 1:
                    continue
                if layout == "kmajor":
                    out.append(Case(layout=layout, B=3, T=T, state_dtype=sd))
                    continue
                out += [
                    Case(B=3, T=T, state_dtype=sd, pool="direct"),
                    Case(B=4, T=T, state_dtype=sd, pool="gaps", idx_dtype="int64"),
                    Case(B=4, T=T, state_dtype=sd, pool="split", neg_write=True),
                    Case(B=3, T=T, state_dtype=sd, pool="strided"),
                    Case(B=3, T=T, state_dtype=sd, pool="gaps", inter_dtype=sd, update=False, cache_extra=2),
                    Case(B=3, T=T, state_dtype=sd, pool="pool", ssm="int32"),
                ]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--staged-only", action="store_true", help="only the variants that use shared memory")
    ap.add_argument("--forms", action="store_true",
                    help="also run every multi-token case with each forced kernel kind (--kinds)")
    ap.add_argument("--kinds", nargs="+", default=["chunk", "mma", "pipe2", "mma_pipe2"],
                    choices=[*OVERRIDES, "tc", "tc128"],
                    help="the forced kinds of --forms (default: chunk, mma, pipe2, mma_pipe2)")
    args = ap.parse_args()
    todo = cases(args.staged_only)
    for i, c in enumerate(todo):
        check(c, run_case(c, seed=100 + i))
    n = len(todo)
    if args.forms:
        from gdnjit.spec import get_spec

        kinds = dict(OVERRIDES, tc=TC_OVERRIDE, tc128={"form": "tc", "tile_v": 128})  # tc128: a bf16 state's 128-row tiles
        for kind in args.kinds:
            for i, c in enumerate(todo):
                if c.T > 1 and forced_tunables(get_spec("gdn"), case_params(c), {}, kinds[kind]) is not None:
                    with forcing(kinds[kind]):
                        check(c, run_case(c, seed=200 + i))
                    n += 1
    print(f"sanitize_gdn: {n} cases ran and matched the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
