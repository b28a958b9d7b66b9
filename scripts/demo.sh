#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: set up, build, prepare the King James Bible as
# byte-level token shards, and train the tiny NSA model of configs/demo_cpu.toml on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
NSATRON=./build/launch/nsatron
bash scripts/kjv_data.sh   # Debian's bible-kjv as byte-level token shards in runs/kjv/data
$NSATRON train configs/demo_cpu.toml --set checkpoint.resume=never --overwrite "$@"
echo
echo "== sample from the trained model (nsatron sample --checkpoint runs/kjv/checkpoints ...)"
$NSATRON sample --checkpoint runs/kjv/checkpoints --prompt "And God said" --tokens 300 --temperature 0.8 --seed 1
