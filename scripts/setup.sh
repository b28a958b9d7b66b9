#!/usr/bin/env bash
# Installs everything nsatron needs on a fresh Debian 12 machine (run as root or with sudo).
# The CUDA toolkit (nvcc, cuBLAS, NCCL) is taken from /usr/local/cuda when present; without
# it the CPU build is complete and the CUDA parts are left out.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
APT="$SUDO apt-get -o DPkg::Lock::Timeout=600"
# DPkg::Lock::Timeout makes install wait for another apt (a fresh machine's unattended
# upgrades) but not update, which fails at once on the lists' lock: retried for up to 10 min.
for attempt in $(seq 1 120); do
  if $APT update -q; then break; fi
  if [ "$attempt" = 120 ]; then echo "setup.sh: apt-get update kept failing" >&2; exit 1; fi
  echo "setup.sh: apt-get update failed (another apt holding its lock?); retrying in 5 s" >&2
  sleep 5
done
$APT install -y -q --no-install-recommends \
  build-essential cmake ninja-build pkg-config git ca-certificates \
  libtomlplusplus-dev \
  libhdf5-dev hdf5-tools \
  openmpi-bin libopenmpi-dev \
  libboost-dev \
  libgtest-dev libgmock-dev googletest libbenchmark-dev \
  libopenblas-dev \
  python3 python3-torch python3-h5py python3-numpy python3-scipy python3-matplotlib \
  bible-kjv bible-kjv-text \
  slurm-wlm munge
