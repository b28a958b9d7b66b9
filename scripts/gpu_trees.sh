# shellcheck shell=bash
# Sourced by scripts/gpu_compare.sh and scripts/gpu_parallel_compare.sh (from the repository's
# root, with OUT set): a reference tree beside the working tree, and the builds of both.

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
# $OUT/configure_NAME.log and $OUT/build_NAME.log; on failure prints the errors, returns 1.
gpu_build_tree() {
  local dir=$1 name=$2
  shift 2
  cmake -S "$dir" -B "$dir/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNSATRON_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${ARCH:-90a}" -DNSATRON_TOMLPP_DIR="$dir/.carry/include" >"$OUT/configure_$name.log" 2>&1 ||
    { echo "$name: configure failed"; tail -20 "$OUT/configure_$name.log"; return 1; }
  cmake --build "$dir/build-gpu" -j"$(( $(nproc) / 2 + 1 ))" --target "$@" >"$OUT/build_$name.log" 2>&1 ||
    { echo "$name: build failed"; grep -E "error" -A3 "$OUT/build_$name.log" | head -30; return 1; }
}
