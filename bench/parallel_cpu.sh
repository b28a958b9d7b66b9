#!/bin/bash
# Throughput of the parallel layouts on CPU ranks: the demo model (configs/demo_cpu.toml) on
# the prepared KJV data, 1 process against dp2, tp2, pp2 (and tp2+pp2, dp4 ... when there are
# cores for them), one OpenMP thread per rank, the same global batch. Prints the mean
# tokens/s and ms/step of steps 6..N (the first steps warm up) from each run's metrics.
#
#   bash bench/parallel_cpu.sh [BUILD_DIR] [STEPS]      (after `bash scripts/demo.sh` prepared runs/kjv/data)
# Results: docs/performance.md, "CPU ranks: parallel layouts".
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
STEPS=${2:-20}
NSATRON=$BUILD/launch/nsatron
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none"
common=(--set train.steps="$STEPS" --set train.eval_every=0 --set log.every=1000 --set train.micro_batch=2
        --set checkpoint.resume=never --overwrite)
run() {  # name ranks settings...
  local name=$1 np=$2
  shift 2
  local args=(train configs/demo_cpu.toml "${common[@]}" --set checkpoint.dir="$OUT/$name" --set log.metrics="$OUT/$name.jsonl" "$@")
  if [ "$np" = 1 ]; then OMP_NUM_THREADS=1 "$NSATRON" "${args[@]}" >/dev/null
  else OMP_NUM_THREADS=1 $MPI -np "$np" "$NSATRON" "${args[@]}" >/dev/null; fi
  /usr/bin/python3 bench/parallel_rows.py --cpu "$OUT/$name.jsonl" "$name" "$np"
}
echo "layout     ranks   tokens/s   ms/step   (demo model, global batch 8 x 256, micro-batch 2, 1 thread per rank, $(nproc) cores)"
run one 1
run dp2 2
run tp2 2 --set parallel.tp=2
run pp2 2 --set parallel.pp=2
run tp2_pp2 4 --set parallel.tp=2 --set parallel.pp=2
run dp4 4
