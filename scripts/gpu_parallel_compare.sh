#!/usr/bin/env bash
# Runs on a machine of several GPUs: builds a reference commit (default HEAD) beside the working
# tree and compares their parallel layouts in one call, so that a change to communication is
# judged against its baseline on the same GPUs:
#   - the working tree's multi-GPU tests: test_nccl_comm (ctest, every rank count the machine
#     has), test_gpu_train (every layout against one GPU, checkpoints between layouts) and
#     test_peer_failure_gpu (a hung and a dead peer);
#   - bench/parallel_gpu.sh's rows for both trees, row by row (reference first), on the KJV
#     shards, with one GPU of the reference as the baseline of the speed-ups printed last.
# Usage: scripts/gpu_parallel_compare.sh [REF [ROW...]]. REF: a commit, or a tar of one (the
# device's copy of the repository may lack this session's commits: `git archive COMMIT -o
# .carry/ref.tar`, carry it with the prepared shards: carry [".carry", "runs/kjv/data"]).
# ROWs: bench/parallel_gpu.sh's row names (default: pp2_7_5_dp1 pp2_v2_4332_dp1 tp2_dp1).
# Env: STEPS (default 8), TESTS (default 1; 0 skips the tests), ARCH (default 90a).
# Logs under $OUT (default gpu_out; at most 8 files come back from the device tool).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
ref=${1:-HEAD}
shift $(( $# > 0 ? 1 : 0 ))
rows=("$@")
[ ${#rows[@]} -eq 0 ] && rows=(pp2_7_5_dp1 pp2_v2_4332_dp1 tp2_dp1)
[ -d runs/kjv/data ] || { echo "no prepared shards in runs/kjv/data (bash scripts/kjv_data.sh, then carry them)"; exit 1; }
source scripts/gpu_trees.sh
refdir=/tmp/nsatron_pref
gpu_ref_tree "$ref" "$refdir"
mkdir -p "$refdir/runs/kjv" && ln -s "$PWD/runs/kjv/data" "$refdir/runs/kjv/data"
configure() {  # the two trees build at the same time (half the cores each)
  local targets=(nsatron)
  [ "$2" = new ] && [ "${TESTS:-1}" != 0 ] && targets+=(test_nccl_comm test_gpu_train test_peer_failure_gpu)
  gpu_build_tree "$1" "$2" "${targets[@]}"
}
configure "$refdir" ref & pid_ref=$!
configure "$PWD" new || exit 1
wait $pid_ref || exit 1
nvidia-smi -L | tee "$OUT/compare.log"
if [ "${TESTS:-1}" != 0 ]; then
  (cd build-gpu && timeout 300 ctest -R test_nccl_comm --output-on-failure 2>&1 | grep -E "Test +#|tests passed|Failed") |
    tee -a "$OUT/compare.log"
  timeout 400 build-gpu/tests/parallel/test_gpu_train 2>&1 | tee "$OUT/test_gpu_train.log" |
    grep -E "^\[ +(OK|FAILED) |largest|Failure" | tee -a "$OUT/compare.log"
  timeout 200 build-gpu/tests/parallel/test_peer_failure_gpu 2>&1 | tee "$OUT/test_peer_failure.log" |
    grep -E "^\[ +(OK|FAILED) |ended|Failure" | tee -a "$OUT/compare.log"
fi
bench() {  # tree-dir row -> the row's line of bench/parallel_gpu.sh
  (cd "$1" && timeout 300 bash bench/parallel_gpu.sh build-gpu runs/kjv/data "${STEPS:-8}" "$2" 2>&1 | tail -1)
}
one=$(bench "$refdir" one)
echo "ref $one" | tee -a "$OUT/compare.log"
for row in "${rows[@]}"; do
  for v in ref new; do
    line=$(bench "$([ $v = ref ] && echo "$refdir" || echo "$PWD")" "$row")
    echo "$v $line" | tee -a "$OUT/compare.log"
  done
done
# Speed-ups against the reference's one GPU. A row's line: NAME RANKS GPUs TOKENS tok/s ...
# (here after the tree's name).
awk -v base="$(echo "$one" | awk '{print $4}')" '$2 != "one" && $6 == "tok/s" && base > 0 {
  printf "%s %-18s %.3fx one GPU\n", $1, $2, $5 / base }' "$OUT/compare.log" | tee "$OUT/speedups.log"
