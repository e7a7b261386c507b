#!/usr/bin/env bash
# A real install: builds a wheel of this checkout, installs it NON-editable (with its dependencies) into a
# fresh virtual environment, and from outside the source tree checks that
#   - the wheel holds every tracked file under gdnjit/ (.py and data) and nothing else of gdnjit's,
#   - every module of the installed package imports (found by walking it, not listed here), and the
#     compat subpackage is among them,
#   - the package data is there: the shipped specs validate, `gdnjit warm --dry-run` plans from the
#     shipped shapes file.
# Run alone:  bash .ci/wheel_check.sh      (.ci/run calls it after the tests; ~1-2 min, mostly the install)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
work=$(mktemp -d "${TMPDIR:-/tmp}/gdnjit-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
PY=${PYTHON:-python3}

# Build from a copy of the files git sees (tracked and untracked-not-ignored), as a fresh clone would:
# a stale build/ or *.egg-info in the checkout can neither add files to the wheel nor hide a missing one,
# and nothing is written into the checkout.
mkdir "$work/src"
git ls-files -z --cached --others --exclude-standard \
    | "$PY" -c '
import os, shutil, sys
dst = sys.argv[1]
for p in sys.stdin.buffer.read().decode().split("\0"):
    if p and os.path.isfile(p):  # a tracked file deleted in the work tree is not there to copy
        os.makedirs(os.path.join(dst, os.path.dirname(p)), exist_ok=True)
        shutil.copy2(p, os.path.join(dst, p))
' "$work/src"

"$PY" -m venv "$work/venv"
# shellcheck disable=SC1091
. "$work/venv/bin/activate"
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
echo "wheel_check: building the wheel"
quiet() {  # run a pip command; its output (the index's warnings too) only when it fails
    "$@" >"$work/pip.log" 2>&1 || { cat "$work/pip.log"; echo "wheel_check: FAILED: $*" >&2; exit 1; }
}
quiet python -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
wheel=$(ls "$work"/dist/gdnjit-*.whl)
echo "wheel_check: built $(basename "$wheel")"

# The wheel's gdnjit files against the checkout's tracked ones (untracked files are not part of a release).
git ls-files -z gdnjit | python -c '
import sys, zipfile
tracked = {p for p in sys.stdin.buffer.read().decode().split("\0") if p}
names = {n for n in zipfile.ZipFile(sys.argv[1]).namelist() if not n.split("/")[0].endswith(".dist-info")}
missing, extra = sorted(tracked - names), sorted(n for n in names - tracked if not n.endswith("/"))
for p in missing:
    print("wheel_check: MISSING from the wheel:", p)
for p in extra:
    print("wheel_check: in the wheel but not tracked:", p)
if missing or extra:
    sys.exit(1)
print(f"wheel_check: the wheel holds all {len(tracked)} tracked files under gdnjit/ and no others")
' "$wheel"

echo "wheel_check: installing it (not editable) with torch==2.13.0"
quiet python -m pip install -q "torch==2.13.0" "$wheel"

# From a directory that holds no checkout: the source tree must not be importable from here.
cd "$work"
python - <<'EOF'
import importlib, os, pkgutil, sys

import gdnjit

site = os.path.dirname(os.path.dirname(gdnjit.__file__))
assert "site-packages" in site, f"gdnjit imported from {gdnjit.__file__}, not from the installed wheel"
from importlib.metadata import distribution
import json
direct_url = json.loads(distribution("gdnjit").read_text("direct_url.json") or "{}")
assert not direct_url.get("dir_info", {}).get("editable"), f"an editable install: {direct_url}"

failed, names = [], ["gdnjit"]
def onerror(name):
    failed.append((name, sys.exc_info()[1]))
for mod in pkgutil.walk_packages(gdnjit.__path__, "gdnjit.", onerror=onerror):
    names.append(mod.name)
for name in names:
    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - every failure is reported, then the check fails
        failed.append((name, e))
for name, e in failed:
    print(f"wheel_check: import {name} FAILED: {type(e).__name__}: {e}")
for must in ("gdnjit.compat", "gdnjit.compat.vllm", "gdnjit.compat.sglang", "gdnjit.cache", "gdnjit.reference",
             "gdnjit.cli", "gdnjit.torch_ops"):
    if must not in names:
        failed.append((must, "not in the installed package"))
        print(f"wheel_check: {must} is not in the installed package")
if failed:
    sys.exit(1)
print(f"wheel_check: imported all {len(names)} modules of the installed package from {site}")
print("wheel_check: " + " ".join(names))
EOF

# Package data: the shipped specs (YAML + validated.json + templates), shapes and tuned tables.
for spec in gdn nvfp4_quantize causal_conv1d_update; do
    gdnjit spec validate "$spec"
done
python -c '
import importlib.resources as r
base = r.files("gdnjit")
for folder, ext in (("specs", ".yaml"), ("templates", ".j2"), ("shapes", ".yaml"), ("tuned", ".json")):
    files = [p.name for p in (base / folder).iterdir() if p.name.endswith(ext)]
    assert files, f"no {ext} files in the installed gdnjit/{folder}"
    print(f"wheel_check: gdnjit/{folder}: {len(files)} {ext} files")
assert (base / "specs" / "validated.json").is_file(), "no specs/validated.json"
'
GDNJIT_CACHE_DIR="$work/cache" gdnjit warm --shapes qwen35.yaml --arch sm_90 --dry-run | tail -5
echo "wheel_check: OK"
