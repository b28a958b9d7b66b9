#!/usr/bin/env bash
# Installs everything nsatron needs on a fresh Debian 12 machine (run as root or with sudo).
# The CUDA toolkit (nvcc, cuBLAS, NCCL) is taken from /usr/local/cuda when present; without
# it the CPU build is complete and the CUDA parts are left out.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
APT="$SUDO apt-get -o DPkg::Lock::Timeout=600"
$APT update -q
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
