#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: set up, build, and run the CPU demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
./build/launch/nsatron config check configs/demo_cpu.toml
