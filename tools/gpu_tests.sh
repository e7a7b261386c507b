#!/usr/bin/env bash
# Every GPU test (pytest -m gpu) in eleven groups run side by side, one log per group, on a GPU machine.
#
#   PYTHONPATH=$PWD bash tools/gpu_tests.sh LOGDIR [extra pytest args]
#
# The groups split tests/ops/test_gdn_gpu.py's forced-form grids (most of the NVRTC compiles) so the
# machine's cores compile in parallel, and the other files into compat (SGLang's, the rest: as one group the longest,
# 425 s on an H100 beside the others: docs/bench/2026-11-27-h100-s31-gpu-tests.txt), spec step, replay and the rest (as one group
# they were the longest: past 580 s beside the others on an H200, docs/bench/2026-11-26-h200-s27-gpu-tests.txt); together they select exactly what `pytest -m gpu` selects
# (their collected counts add up to `pytest -m gpu --co -q`'s). The tests marked big_memory (a 35 GiB pool, the
# scatter-vs-dense cases at B 64 / 128: ~40 GiB) run alone after them: beside the other groups they run out of
# memory on an 80 GB card (docs/bench/2026-11-27-h100-s31-gpu-tests.txt). Prints each group's pytest summary
# line; exit status 0 only if every group passed.
set -u
# torch's CPU threads (the float64 references) would otherwise be one per core in each of the groups side by side:
# oversubscribed, the spec-step and compat groups took over 600 s instead of 2 minutes (docs/bench/2026-11-26-h100-s26-gpu-tests.txt)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
out=${1:?usage: tools/gpu_tests.sh LOGDIR [pytest args]}
shift
mkdir -p "$out"
gdn=tests/ops/test_gdn_gpu.py
tuned=tests/ops/test_tuned_gpu.py
spec=tests/ops/test_spec_step_gpu.py
replay=tests/ops/test_replay_gpu.py
names=(rules forced-recurrent forced-pipe forced-mma forced-tc-kwarps compat-sglang compat-rest spec-step replay other tuned)
args=(
  "$gdn -k 'not form_forced and not k_warps_forced'"
  "$gdn -k 'test_form_forced and (recurrent or chunk or lanes4x2)'"
  "$gdn -k 'test_form_forced and pipe and not mma'"
  "$gdn -k 'test_form_forced and mma'"
  "$gdn -k 'tc_form_forced or k_warps_forced'"
  "tests/compat -k sglang"
  "tests/compat -k 'not sglang'"
  "$spec"
  "$replay"
  "tests --ignore=$gdn --ignore=$tuned --ignore=tests/compat --ignore=$spec --ignore=$replay"
  "$tuned"
)
pids=()
for i in "${!names[@]}"; do
  eval "python3 -m pytest -m 'gpu and not big_memory' -q -p no:cacheprovider ${args[$i]} $*" >"$out/gpu-${names[$i]}.log" 2>&1 &
  pids+=($!)
done
rc=0
for i in "${!names[@]}"; do
  wait "${pids[$i]}" || rc=1
  printf '%-18s %s\n' "${names[$i]}" "$(tail -n 1 "$out/gpu-${names[$i]}.log")"
done
eval "python3 -m pytest -m 'gpu and big_memory' -q -p no:cacheprovider tests $*" >"$out/gpu-big-memory.log" 2>&1 || rc=1
printf '%-18s %s\n' big-memory "$(tail -n 1 "$out/gpu-big-memory.log")"
exit $rc
