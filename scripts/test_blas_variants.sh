#!/usr/bin/env bash
# Runs the CPU test suite (ctest, in build/) once per OpenBLAS kernel family and thread count,
# so that no test passes only with the BLAS kernels of the machine it was written on.
# Usage: scripts/test_blas_variants.sh [CORETYPES] [THREADS] [extra ctest args...]
#   CORETYPES  comma-separated OPENBLAS_CORETYPE values (default Haswell,SkylakeX,Zen,Prescott,Sandybridge)
#   THREADS    comma-separated OpenMP/OpenBLAS thread counts (default 1,2)
# Build first (scripts/build.sh). Each run's summary line goes to stdout, its log to
# build/blas_variants/<coretype>_<threads>.log; exit code 1 if any run failed.
set -uo pipefail
cd "$(dirname "$0")/../build" || { echo "no build/: run scripts/build.sh first" >&2; exit 2; }
cores=${1:-Haswell,SkylakeX,Zen,Prescott,Sandybridge}
threads=${2:-1,2}
shift $(( $# < 2 ? $# : 2 ))
mkdir -p blas_variants
status=0
for core in ${cores//,/ }; do
  for th in ${threads//,/ }; do
    log=blas_variants/${core}_${th}.log
    OPENBLAS_CORETYPE=$core OMP_NUM_THREADS=$th OPENBLAS_NUM_THREADS=$th OMP_WAIT_POLICY=PASSIVE \
      ctest -j"$(nproc)" --timeout 900 --output-on-failure -LE gpu "$@" >"$log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && status=1
    printf '%-12s threads %s: %s\n' "$core" "$th" "$(grep -E 'tests passed' "$log" || echo "ctest exit $rc")"
    [ $rc -ne 0 ] && grep -E '\(Failed\)|\(Timeout\)' "$log" | sed 's/^/    /'
  done
done
exit $status
