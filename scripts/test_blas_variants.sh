#!/usr/bin/env bash
# Runs the CPU test suite with OpenBLAS forced to each kernel family and with 1 and 2
# threads, so that no tolerance passes only on the BLAS of the machine it was written on.
# Results of a matrix product depend on the kernel (its blocking and summation order); every
# test must assert what holds for any of them (docs/architecture.md, "Tests").
#
#   bash scripts/test_blas_variants.sh                    # every core type x threads 1 and 2
#   CORETYPES="Haswell Zen" THREADS=2 bash scripts/test_blas_variants.sh
#   bash scripts/test_blas_variants.sh -R 'Accumulation|Train'   # extra arguments go to ctest
#
# Needs a build in ./build (scripts/build.sh). Tests labelled `gpu` are left out (they need a
# GPU and use cuBLAS, not OpenBLAS). Prints one summary line per run and exits 1 when any
# run failed; the logs are in build/blas_variants/CORETYPE-tTHREADS.log.
set -uo pipefail
cd "$(dirname "$0")/../build" || { echo "no build/: run scripts/build.sh first" >&2; exit 2; }
coretypes=${CORETYPES:-"Haswell SkylakeX Zen Prescott Sandybridge"}
threads=${THREADS:-"1 2"}
mkdir -p blas_variants
failed=0
summary=()
for c in $coretypes; do
  for t in $threads; do
    log=blas_variants/$c-t$t.log
    start=$(date +%s)
    OPENBLAS_CORETYPE=$c OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t \
      ctest --output-on-failure -LE gpu -j"$(nproc)" --timeout 900 "$@" > "$log" 2>&1
    rc=$?
    line=$(grep -E "tests passed|tests failed" "$log" | tail -1)
    summary+=("OPENBLAS_CORETYPE=$c threads=$t: ${line:-no summary (see $log)} ($(( $(date +%s) - start )) s)")
    echo "${summary[-1]}"
    if [ $rc -ne 0 ]; then
      failed=1
      grep -E "^\s*[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception)" "$log" | sed 's/^/    /'
    fi
  done
done
echo
printf '%s\n' "${summary[@]}"
exit $failed
