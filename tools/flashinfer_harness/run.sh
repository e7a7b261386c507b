#!/usr/bin/env bash
# Run five FlashInfer test files against gdnjit, with gdnjit's functions substituted for FlashInfer's
# through the stand-in package in tools/flashinfer_harness/stub/flashinfer (no FlashInfer installed).
#
#   bash tools/flashinfer_harness/run.sh <fi_tests_dir> <out_dir> [extra pytest args...]
#
# <fi_tests_dir> holds FlashInfer's tests/ tree (tests/gdn, tests/utils, tests/test_helpers), e.g.
# .peers/fi_tests. Writes <out_dir>/fi.xml (junit) and <out_dir>/fi.log (full pytest output), then
# prints a per-file summary and the failures grouped by their first error line. Serial (one GPU).
# Exit status: pytest's.
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
PYTHON="${PYTHON:-python3}"
# The FlashInfer tree comes first: its tests import tests.test_helpers.utils_fp4.
export PYTHONPATH="$fi_dir:$repo:$here/stub${PYTHONPATH:+:$PYTHONPATH}"
cd "$fi_dir"
echo "gdnjit from $repo; flashinfer stand-in from $here/stub; tests from $fi_dir" | tee "$out/fi.log"
"$PYTHON" -c 'import flashinfer, gdnjit; print("flashinfer ->", flashinfer.__file__)' 2>&1 | tee -a "$out/fi.log"
"$PYTHON" -m pytest -c "$here/pytest.ini" --rootdir "$fi_dir" --confcutdir "$fi_dir" -p no:cacheprovider \
    -q -rfEs --junitxml="$out/fi.xml" "${files[@]}" "$@" >>"$out/fi.log" 2>&1
rc=$?
tail -n 3 "$out/fi.log"
echo
"$PYTHON" "$here/summarize.py" "$out/fi.xml"
echo "full log: $out/fi.log   junit: $out/fi.xml   pytest exit status: $rc"
exit $rc
