#!/usr/bin/env bash
# relaxcc's main job on a fresh Debian 12 machine: installs the packages
# (libtorch, python3-torch, OpenBLAS, Fashion-MNIST, gnuplot, ...), builds
# relaxcc-train with the release preset, then runs `relaxcc-train --compare`
# on 2 ranks: the MLP on Fashion-MNIST for one epoch with every relaxcc
# algorithm module, then PyTorch's own DistributedDataParallel (plain, fp16
# and PowerSGD hooks) with the same weights, data order and hyper-parameters,
# one run after the other. Writes results/table.md (accuracy, wall time, step
# time, bytes sent per rank, ratios to gradient_allreduce and torch_ddp) and
# results/accuracy_vs_time.png, results/accuracy_vs_bytes.png.
# Extra arguments go to relaxcc-train (--model cnn, --epochs 3, --seeds 1,2,3,
# --rate 100 to run inside bench/relaxcc-hosts at 100 Mbit/s, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release -DRELAXCC_BUILD_TESTS=OFF -DRELAXCC_BUILD_BENCH=OFF -DRELAXCC_WITH_TORCH=ON
cmake --build --preset release --target relaxcc-train
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec build/release/train/relaxcc-train --compare --ranks 2 --model mlp --epochs 1 \
  --results results "$@"
