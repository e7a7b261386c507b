#!/usr/bin/env bash
# Run FlashInfer's test files (five, plus the optional ReplaySSM and u-cache ones when the copy has them) against
# gdnjit, with gdnjit's functions substituted for FlashInfer's through the stand-in package in
# tools/flashinfer_harness/stub/flashinfer (no FlashInfer installed).
#
#   bash tools/flashinfer_harness/run.sh <fi_tests_dir> <out_dir> [extra pytest args...]
#
# <fi_tests_dir> holds FlashInfer's tests/ tree (tests/gdn, tests/utils, tests/test_helpers), e.g.
# .peers/fi_tests (fetch_notes.md: how to fill it). Runs each file in its own pytest process (serially: one GPU),
# writes <out_dir>/<file>.xml (junit) and <out_dir>/fi.log (the full pytest output), then prints a per-file summary
# and the failures grouped by their first error line. Exit status: the last failing file's pytest status (0 when
# all passed).
#
# FlashInfer's u-cache test loads its kernel modules by path, <fi_tests_dir>/flashinfer/gdn_kernels/..., so this
# script makes <fi_tests_dir>/flashinfer a symbolic link to the stand-in package (re-pointed when it is a link
# elsewhere, e.g. one carried from another checkout; a real directory there is an error: it would be tested
# instead of gdnjit).
set -u -o pipefail
if [ $# -lt 2 ]; then
    echo "usage: bash $0 <fi_tests_dir> <out_dir> [extra pytest args...]" >&2
    exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
fi_dir="$(cd "$1" && pwd)" || { echo "no such directory: $1" >&2; exit 2; }
mkdir -p "$2" && out="$(cd "$2" && pwd)"
shift 2
files=(
    tests/gdn/test_decode_delta_rule.py
    tests/gdn/test_decode_pretranspose_bf16_padded_pool.py
    tests/gdn/test_decode_pretranspose_noncontiguous_pool.py
    tests/utils/test_fp4_quantize.py
    tests/utils/test_fp4_quantize_padding.py
)
for f in "${files[@]}"; do
    [ -f "$fi_dir/$f" ] || { echo "missing $fi_dir/$f" >&2; exit 2; }
done
# FlashInfer's ReplaySSM tests (newer than 0.7.2.post1; README.md: they skip off SM100 unless that skip is lifted in
# the copy): run when the copy has them
[ -f "$fi_dir/tests/gdn/test_replayssm_spec_fold.py" ] && files+=(tests/gdn/test_replayssm_spec_fold.py)
# FlashInfer's u-cache tests (0.7.2.post1; README.md): run when the copy has them
ucache_note=""
if [ -f "$fi_dir/tests/gdn/test_decode_ucache.py" ]; then
    files+=(tests/gdn/test_decode_ucache.py)
else
    ucache_note="note: $fi_dir/tests/gdn/test_decode_ucache.py is not in the copy: not run (see fetch_notes.md)"
fi
# The u-cache test reads <fi_tests_dir>/flashinfer/gdn_kernels/gdn_decode_bf16_wy_ucache{,_flush}.py by path.
# A relative link (e.g. ../../tools/flashinfer_harness/stub/flashinfer for .peers/fi_tests), so that a copy carried
# to another checkout at the same place still points at its stand-in.
link="$fi_dir/flashinfer"
target="$(python3 -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$here/stub/flashinfer" \
          "$fi_dir" 2>/dev/null || echo "$here/stub/flashinfer")"
if [ -L "$link" ]; then
    [ "$(readlink "$link")" = "$target" ] || ln -sfn "$target" "$link"
elif [ -e "$link" ]; then
    echo "$link exists and is not a link to the stand-in package: move it away (it would be imported instead of" \
         "the stand-in, and the u-cache test would load FlashInfer's own kernels)" >&2
    exit 2
else
    ln -s "$target" "$link" || { echo "cannot create the link $link" >&2; exit 2; }
fi
[ -f "$link/gdn_kernels/gdn_decode_bf16_wy_ucache_flush.py" ] || { echo "$link does not reach the stand-in" >&2; exit 2; }
PYTHON="${PYTHON:-python3}"
# The FlashInfer tree comes first: its tests import tests.test_helpers.utils_fp4.
export PYTHONPATH="$fi_dir:$repo:$here/stub${PYTHONPATH:+:$PYTHONPATH}"
cd "$fi_dir"
echo "gdnjit from $repo; flashinfer stand-in from $here/stub; tests from $fi_dir" | tee "$out/fi.log"
"$PYTHON" -c 'import flashinfer, gdnjit; print("flashinfer ->", flashinfer.__file__)' 2>&1 | tee -a "$out/fi.log"
echo "$link -> $(readlink "$link")" | tee -a "$out/fi.log"
[ -n "$ucache_note" ] && echo "$ucache_note" | tee -a "$out/fi.log"
# One pytest process per file: test_fp4_quantize_padding.py sets PYTORCH_NO_CUDA_MEMORY_CACHING=1 when it is
# imported, and with torch's caching allocator off, every allocation inside a CUDA-graph capture fails ("operation
# not permitted when stream is capturing"), so collected together it breaks test_fp4_quantize.py's captured case
# and, through the aborted capture, the cases after it.
rc=0
xmls=()
for f in "${files[@]}"; do
    name="$(basename "$f" .py)"
    echo "== $f" >>"$out/fi.log"
    "$PYTHON" -m pytest -c "$here/pytest.ini" --rootdir "$fi_dir" --confcutdir "$fi_dir" -p no:cacheprovider \
        -q -rfEs --junitxml="$out/$name.xml" "$f" "$@" >>"$out/fi.log" 2>&1
    frc=$?
    # 5: no tests collected (a -k slice that selects nothing in this file)
    if [ $frc -ne 0 ] && [ $frc -ne 5 ]; then rc=$frc; fi
    [ -f "$out/$name.xml" ] && xmls+=("$out/$name.xml")
    tail -n 1 "$out/fi.log"
done
echo
"$PYTHON" "$here/summarize.py" "${xmls[@]}"
echo "full log: $out/fi.log   junit: ${xmls[*]}   pytest exit status (worst file): $rc"
exit $rc
