#!/usr/bin/env bash
# The demo scaling study on CPU (configs/sweeps/kjv_tiny.toml: 3 model sizes x 2 token budgets x
# {NSA, dense attention} on the King James Bible, about 6 minutes of training on 2 cores): set up, build,
# prepare the corpus, plan, run, report. Run it again to continue an interrupted study.
# The report: runs/kjv_tiny/summary.md, runs/kjv_tiny/plots/*.png, runs/kjv_tiny/results.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
bash scripts/kjv_data.sh
NSATRON=./build/launch/nsatron
$NSATRON sweep plan configs/sweeps/kjv_tiny.toml
$NSATRON sweep run configs/sweeps/kjv_tiny.toml
$NSATRON sweep report runs/kjv_tiny
echo
echo "== runs/kjv_tiny/summary.md"
cat runs/kjv_tiny/summary.md
