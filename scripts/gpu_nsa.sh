#!/usr/bin/env bash
# Runs on a GPU machine (the device tool's H100/H200): builds the NSA CUDA test and benchmark
# for sm_90a (ARCH), runs the NSA parity tests, the benchmark and a per-kernel profile, logs under $OUT.
# Usage: scripts/gpu_nsa.sh [tests] [seeds] [bench] [groups] [ncu] [train] [gputests]
#   tests: test_wgmma and test_nsa_cuda; seeds: its bf16 and determinism cases on 3 more seeds; bench: the
#   NSA table; groups: the group-size table; ncu: per-kernel times (125M, paper T=8192);
#   train: train_gpu on configs/nsa_125m.toml; gputests: every test labelled gpu.
#   (default: tests bench groups ncu)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
steps=${*:-tests bench groups ncu}
has() { [[ " $steps " == *" $1 "* ]]; }
{ nvidia-smi -L; nvcc --version | tail -1; git rev-parse --short HEAD 2>/dev/null; } 2>&1 | tee "$OUT/device.txt"
targets="test_nsa_cuda test_wgmma bench_nsa_gpu"
has train && targets="$targets train_gpu nsatron"
has gputests && targets="all"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DNSATRON_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${ARCH:-90a} \
  -DNSATRON_TOMLPP_DIR="$PWD/.carry/include" -DNSATRON_PYTHON="$(command -v python3)" >"$OUT/configure.log" 2>&1 \
  || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu -j"$(nproc)" --target $targets >"$OUT/build.log" 2>&1 \
  || { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
echo "build ok"
if has tests; then
  build-gpu/tests/nsa_cuda/test_wgmma 2>&1 | tee "$OUT/test_wgmma.log" | grep -E "^\[  (FAILED|PASSED) |seed|Failure" | head -20
  build-gpu/tests/nsa_cuda/test_nsa_cuda 2>&1 | tee "$OUT/test_nsa_cuda.log" | grep -E "^\[  (FAILED|PASSED) |worst|seed|Failure|error" | head -60
fi
if has seeds; then
  for seed in 11 222 3333; do
    NSA_CUDA_SEED=$seed build-gpu/tests/nsa_cuda/test_nsa_cuda --gtest_filter='*Bf16*:*Determ*' 2>&1 \
      | tee -a "$OUT/seeds.log" | grep -E "^\[  (FAILED|PASSED) |Failure" | head -5
  done
  grep -E "bf16 .*worst" "$OUT/seeds.log" | sed 's/.*worst //' | sort -g | tail -3
fi
if has bench; then
  build-gpu/bench/bench_nsa_gpu --shapes 125m,paper --T 8192,32768,65536 2>&1 | tee "$OUT/bench.log" | tail -6
fi
if has groups; then  # the group-size table (h = 1..16, D = 64 and 128)
  build-gpu/bench/bench_nsa_gpu --shapes groups --T 8192,65536 --D 64,128 --no-dense --reps 2 2>&1 | tee "$OUT/groups.log" | grep -E "^\| groups" | cut -c1-110
fi
if has ncu; then
  for spec in "125m" "paper --T 8192"; do
    echo "== ncu $spec"
    ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
      build-gpu/bench/bench_nsa_gpu --shapes $spec --reps 1 --no-dense >>"$OUT/ncu.log" 2>&1
  done
fi
if has train; then
  build-gpu/bench/train_gpu configs/nsa_125m.toml --micro 16,64 --policies none 2>&1 | tee "$OUT/train.log" | tail -8
  build-gpu/bench/train_gpu configs/nsa_125m.toml --micro 16 --policies none --profile 2>&1 | tee -a "$OUT/train.log" | tail -25
fi
if has gputests; then
  (cd build-gpu && timeout 420 ctest -L gpu --output-on-failure --timeout 300) 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
fi
