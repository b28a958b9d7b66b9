#!/usr/bin/env bash
# Runs on a GPU machine: builds a reference commit (default HEAD) beside the working tree and
# compares them in one call, so that a change is judged against its baseline on the same GPU:
#   - bf16 parity, per test case, the worst error over out and every gradient, side by side,
#     for each seed;
#   - the D=6 case over many seeds (the shape nearest its bound): how many exceed it;
#   - bench_nsa_gpu on the 125M and paper shapes, reference then working tree;
#   - with NCU set, the per-kernel times (ncu, bench/ncu_table.py) of both at 125M and T = 8192;
#   - with DENSE set, the working tree's test_dense_cuda (dense attention on the same kernels);
#     with DENSE_SEEDS=N as well, its bf16 comparison on seeds 1..N for both trees (how many
#     fail: its inputs are fresh each run, and a rounding that exceeds the bound on a few
#     seeds shows only this way; docs/performance.md, 2026-11-27, second session).
# Usage: scripts/gpu_compare.sh [REF]. REF: a commit, or a tar of one (the device's copy of the
# repository may lack this session's commits: `git archive COMMIT -o .ref.tar`, carry it).
# Env: SEEDS (default "11 555 222 9"), D6_SEEDS (default 40), BENCH (default "--shapes
# 125m,paper --T 8192,65536 --no-dense"), FULL (set: first all of test_nsa_cuda on the working
# tree), NCU, DENSE (see above), L2 (set: the L2, DRAM and L2-to-SM throughput of each row
# and key kernel of the working tree at the paper's T = 8192, from ncu), ARCH (default 90a).
# The working tree's test_wgmma runs first where it exists. Logs under $OUT (at most 8 files come back from the device tool: the ncu
# logs are summarised into compare.log).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
source scripts/gpu_trees.sh
ref=${1:-HEAD}
refdir=/tmp/nsatron_ref
gpu_ref_tree "$ref" "$refdir"
configure() {  # the two trees build at the same time (half the cores each)
  local targets=(test_nsa_cuda bench_nsa_gpu)
  [ -n "${DENSE:-}" ] && { [ "$2" = new ] || [ -n "${DENSE_SEEDS:-}" ]; } && targets+=(test_dense_cuda)
  [ -f "$1/tests/nsa_cuda/test_wgmma.cu" ] && targets+=(test_wgmma)
  gpu_build_tree "$1" "$2" "${targets[@]}"
}
configure "$refdir" ref & pid_ref=$!
configure "$PWD" new || exit 1
wait $pid_ref || exit 1
if [ -x build-gpu/tests/nsa_cuda/test_wgmma ]; then  # the warpgroup products on their own
  build-gpu/tests/nsa_cuda/test_wgmma 2>&1 | tee "$OUT/test_wgmma.log" | grep -E "^\[  (FAILED|PASSED) |seed|Failure" | head -20
fi
if [ -n "${FULL:-}" ]; then  # every test of the working tree's test_nsa_cuda on a fresh seed
  build-gpu/tests/nsa_cuda/test_nsa_cuda 2>&1 | tee "$OUT/test_nsa_cuda.log" | grep -E "^\[  (FAILED|PASSED) |seed|Failure" | head -30
fi
bin() { [ "$1" = ref ] && echo "$refdir/build-gpu/$2" || echo "build-gpu/$2"; }
echo "ref: $([ -f "$ref" ] && echo "$ref" || git rev-parse --short "$ref")  new: the working tree" | tee "$OUT/compare.log"
for s in ${SEEDS:-11 555 222 9}; do
  for v in ref new; do
    NSA_CUDA_SEED=$s "$(bin $v tests/nsa_cuda/test_nsa_cuda)" --gtest_filter='*Bf16MatchesCpu*' 2>&1 |
      grep -E "worst|FAILED  \]" | sed -E 's/ +B=.*worst/ /; s/, bound.*//' >"/tmp/nsatron_$v.txt"
  done
  echo "== seed $s: ref | new"
  paste /tmp/nsatron_ref.txt /tmp/nsatron_new.txt | awk -F'\t' '{printf "%-52s | %s\n", $1, $2}'
done | tee -a "$OUT/compare.log"
d6=$(seq 1 "${D6_SEEDS:-40}")
for v in ref new; do
  for s in $d6; do
    NSA_CUDA_SEED=$s "$(bin $v tests/nsa_cuda/test_nsa_cuda)" --gtest_filter='*Bf16MatchesCpu/case7' 2>&1 |
      grep -oE "worst [0-9.e-]+ \([a-z_]+\)"
  done >"/tmp/nsatron_d6_$v.txt"
  echo "D=6 $v: $(awk '$2 + 0 > 1e-2 {n++} END {print n + 0}' "/tmp/nsatron_d6_$v.txt") of $(wc -l <"/tmp/nsatron_d6_$v.txt") seeds above 1e-2, worst $(sort -k2 -g "/tmp/nsatron_d6_$v.txt" | tail -1)"
done | tee -a "$OUT/compare.log"
for v in ref new; do
  echo "== bench $v"
  "$(bin $v bench/bench_nsa_gpu)" ${BENCH:---shapes 125m,paper --T 8192,65536 --no-dense} 2>&1 | grep -E "^\| (125m|paper|groups)"
done | tee -a "$OUT/compare.log"
if [ -n "${DENSE:-}" ]; then  # dense attention runs the same row and key kernels
  build-gpu/tests/nsa_cuda/test_dense_cuda 2>&1 | grep -E "^\[  (FAILED|PASSED) |seed|Failure" |
    tee -a "$OUT/compare.log"
  if [ -n "${DENSE_SEEDS:-}" ]; then
    for v in ref new; do
      n=0
      for s in $(seq 1 "$DENSE_SEEDS"); do
        DENSE_CUDA_SEED=$s "$(bin $v tests/nsa_cuda/test_dense_cuda)" --gtest_filter='*Bf16MatchesCpu' \
          >/tmp/nsatron_dense.log 2>&1 || { n=$((n + 1)); grep -E "^dq|^dk|^dv|^out|^lse" /tmp/nsatron_dense.log | head -2; }
      done
      echo "dense bf16 $v: $n of $DENSE_SEEDS seeds failed"
    done | tee -a "$OUT/compare.log"
  fi
fi
if [ -n "${NCU:-}" ]; then  # per-kernel times, ms per call
  for v in ref new; do
    for spec in "125m" "paper --T 8192"; do
      ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
        "$(bin $v bench/bench_nsa_gpu)" --shapes $spec --reps 1 --no-dense >/tmp/nsatron_ncu.log 2>&1
      echo "== ncu $v $spec"
      python3 bench/ncu_table.py /tmp/nsatron_ncu.log | head -16 | cut -c1-100
    done
  done | tee -a "$OUT/compare.log"
fi
if [ -n "${L2:-}" ]; then  # where the row and key kernels' bytes come from (working tree, 8192)
  ncu --clock-control none -k regex:'^(row_kernel|key_kernel)' --print-summary per-kernel \
    --metrics gpu__time_duration.sum,lts__t_bytes.sum.per_second,dram__bytes.sum.per_second,l1tex__m_xbar2l1tex_read_bytes.sum.per_second \
    "$(bin new bench/bench_nsa_gpu)" --shapes paper --T 8192 --reps 1 --no-dense >/tmp/nsatron_l2.log 2>&1
  echo "== L2 / DRAM throughput per kernel (new, paper 8192)"
  grep -E "row_kernel|key_kernel|gpu__time_duration|lts__t_bytes|dram__bytes|xbar2l1tex" /tmp/nsatron_l2.log |
    sed -E 's/ +/ /g' | head -80
fi | tee -a "$OUT/compare.log"
