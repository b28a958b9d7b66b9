# shellcheck shell=bash
# Sourced by scripts/gpu_compare.sh and scripts/gpu_parallel_compare.sh (from the repository's
# root, with OUT set): a reference tree beside the working tree, and the builds of both.
# Building two trees at once: `gpu_build_tree A a ... & p=$!; ...; wait $p`, never a bare `wait`
# in a script that logs through `exec > >(tee FILE)`: bash (>= 5.1) then waits for the tee too,
# which ends only with the script, and the call hangs until the device's time limit.

# gpu_ref_tree REF DIR: DIR holds REF, a commit or a tar of one (git archive COMMIT -o FILE,
# carried: the device's copy of the repository may lack this session's commits), with the
# working tree's .carry (toml++ for the GPU machine). Exits on failure.
gpu_ref_tree() {
  rm -rf "$2" && mkdir -p "$2"
  if [ -f "$1" ]; then
    tar -x -C "$2" -f "$1" || { echo "cannot extract $1"; exit 1; }
  else
    git archive "$1" | tar -x -C "$2" || { echo "cannot export $1"; exit 1; }
  fi
  if [ -d .carry ]; then cp -r .carry "$2/"; fi
}

# gpu_build_tree DIR NAME TARGET...: configures DIR/build-gpu (Release, CUDA for ARCH, default
# 90a) and builds the targets with half the cores (two trees build at once); logs
# configure_NAME.log and build_NAME.log in GPU_LOG_DIR (default /tmp/gpu_logs: the device tool
# brings back at most 8 files from $OUT, and four trees' logs crowded out summary.txt); on
# failure prints the errors and copies the log into $OUT, returns 1.
gpu_build_tree() {
  local dir=$1 name=$2 logs=${GPU_LOG_DIR:-/tmp/gpu_logs}
  shift 2
  mkdir -p "$logs"
  cmake -S "$dir" -B "$dir/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNSATRON_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${ARCH:-90a}" -DNSATRON_TOMLPP_DIR="$dir/.carry/include" >"$logs/configure_$name.log" 2>&1 ||
    { echo "$name: configure failed"; tail -20 "$logs/configure_$name.log"; cp "$logs/configure_$name.log" "$OUT/"; return 1; }
  cmake --build "$dir/build-gpu" -j"$(( $(nproc) / 2 + 1 ))" --target "$@" >"$logs/build_$name.log" 2>&1 ||
    { echo "$name: build failed"; grep -E "error" -A3 "$logs/build_$name.log" | head -30; cp "$logs/build_$name.log" "$OUT/"; return 1; }
}
