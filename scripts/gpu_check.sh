#!/usr/bin/env bash
# Runs on a GPU machine (the device tool's H100/H200): builds for sm_90a (ARCH), runs the `gpu`
# tests and the GPU benchmarks, and writes logs under $OUT (default ./gpu_out).
# toml++ is used header-only; where the package is absent, copy /usr/include/toml++ into
# .carry/include/ first (scripts/gpu_carry.sh does it) and carry .carry along.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
what=${1:-all}
{
  nvidia-smi -L
  nvcc --version | tail -1
  git rev-parse --short HEAD 2>/dev/null || true
} 2>&1 | tee "$OUT/device.txt"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DNSATRON_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${ARCH:-90a} \
  -DNSATRON_TOMLPP_DIR="$PWD/.carry/include" -DNSATRON_PYTHON="$(command -v python3)" >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu -j"$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -40; exit 1; }
echo "build ok"
if [ "$what" = all ] || [ "$what" = tests ]; then
  (cd build-gpu && ctest -L gpu --output-on-failure --timeout 600) 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
  run_bench() { echo "== $*" | tee -a "$OUT/bench.log"; "$@" 2>&1 | tee -a "$OUT/bench.log"; }
  [ -x build-gpu/bench/bench_nsa_gpu ] && run_bench build-gpu/bench/bench_nsa_gpu
  run_bench build-gpu/bench/train_gpu configs/nsa_125m.toml --micro 16,32,64,96 --policies none
  run_bench build-gpu/bench/train_gpu configs/nsa_125m.toml --micro 16 --policies none --profile
  [ -x build-gpu/bench/ops_gpu ] && run_bench build-gpu/bench/ops_gpu configs/nsa_125m.toml --micro 16
  run_bench build-gpu/bench/train_gpu configs/nsa_125m.toml --micro 16 --policies selective,full
  run_bench build-gpu/bench/train_gpu configs/nsa_125m.toml --seq 32768 --micro 1 --policies full
fi
