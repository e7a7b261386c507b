#!/usr/bin/env bash
# Run five FlashInfer test files against gdnjit, with gdnjit's functions substituted for FlashInfer's
# through the stand-in package in tools/flashinfer_harness/stub/flashinfer (no FlashInfer installed).
#
#   bash tools/flashinfer_harness/run.sh <fi_tests_dir> <out_dir> [extra pytest args...]
#
# <fi_tests_dir> holds FlashInfer's tests/ tree (tests/gdn, tests/utils, tests/test_helpers), e.g.
# .peers/fi_tests. Runs each file in its own pytest process (serially: one GPU), writes <out_dir>/<file>.xml
# (junit) and <out_dir>/fi.log (the full pytest output), then prints a per-file summary and the failures grouped
# by their first error line. Exit status: the last failing file's pytest status (0 when all passed).
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
PYTHON="${PYTHON:-python3}"
# The FlashInfer tree comes first: its tests import tests.test_helpers.utils_fp4.
export PYTHONPATH="$fi_dir:$repo:$here/stub${PYTHONPATH:+:$PYTHONPATH}"
cd "$fi_dir"
echo "gdnjit from $repo; flashinfer stand-in from $here/stub; tests from $fi_dir" | tee "$out/fi.log"
"$PYTHON" -c 'import flashinfer, gdnjit; print("flashinfer ->", flashinfer.__file__)' 2>&1 | tee -a "$out/fi.log"
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
