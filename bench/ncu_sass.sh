#!/usr/bin/env bash
# Stall samples of one kernel launch by SASS instruction (docs/performance.md, eighth session):
#   bash bench/ncu_sass.sh OUT.csv KERNEL_REGEX COMMAND [ARGS...]
# profiles the first launch whose demangled name matches KERNEL_REGEX (ncu's SourceCounters and
# WarpStateStats sections), writes the source page as CSV to OUT.csv, and prints its summary
# (bench/ncu_sass.py). Template arguments appear as "(int)128", so match them with dots:
#   bash bench/ncu_sass.sh /tmp/slc_fwd.csv 'row_kernel<.int.128, .int.1, .bool.0' \
#     build-gpu/bench/bench_nsa_gpu --shapes paper --T 8192 --reps 1 --no-dense
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,9p "$0"; exit 2; }
out=$1 regex=$2
shift 2
report=$(mktemp -d)/sass
ncu --clock-control none --kernel-name-base demangled -k "regex:$regex" --launch-count 1 \
  --section SourceCounters --section WarpStateStats -o "$report" -f "$@" >"$report.log" 2>&1 ||
  { tail -20 "$report.log"; exit 1; }
[ -f "$report.ncu-rep" ] || { echo "no launch matched $regex"; tail -5 "$report.log"; exit 1; }
ncu -i "$report.ncu-rep" --page source --csv --print-source sass >"$out"
python3 "$(dirname "$0")/ncu_sass.py" "$out"
