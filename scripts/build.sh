#!/usr/bin/env bash
# Configures and builds nsatron into build/ (CUDA parts included wherever nvcc is found).
# Extra arguments go to cmake's configure step, e.g. -DNSATRON_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j"$(nproc)"
