#!/usr/bin/env bash
# Installs every Debian 12 package that relaxcc's build, tests, benchmarks and
# training demo need. Idempotent: packages already present are skipped, and
# apt is not touched at all when nothing is missing.
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build git pkg-config
  # distributed engine and topology
  openmpi-bin libopenmpi-dev libhwloc-dev hwloc
  # the UCX wing (src/ucx; ucx_perftest for comparisons)
  libucx-dev ucx-utils
  # lossless packing of compressed payloads
  libzstd-dev
  # command line, tests
  libcli11-dev googletest libgtest-dev
  # fuzzing the kernel decoders (clang + libFuzzer runtime), the format check
  clang-14 libclang-rt-14-dev clang-format-14
  # emulated hosts on shaped links, and plots
  iproute2 iputils-ping iperf3 gnuplot-nox
  # libtorch frontend, PyTorch DDP baseline and the training demo
  libtorch-dev python3-torch libopenblas0-pthread dataset-fashion-mnist zlib1g-dev
  # the Python package (relaxcc._C)
  pybind11-dev python3-dev python3-pytest
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo_cmd=()
if ((EUID != 0)); then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
