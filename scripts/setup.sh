#!/usr/bin/env bash
# Install the Debian packages meshtrain needs (only those missing), then
# configure and build into BUILD_DIR (default: build).
# Usage: scripts/setup.sh [BUILD_DIR] [extra cmake -D options...] [--target NAME...]
# With --target, only those targets (and what they need) are built, e.g.
# --target meshtrain: the binary alone, not the tests and benchmarks.
set -euo pipefail
cd "$(dirname "$0")/.."

# ocl-icd-opencl-dev: Debian's libdnnl-dev only recommends it, but its CMake
# package (dnnl-config.cmake) calls find_package(OpenCL) and fails without it.
# python3: tests/mpi/train_parity_test.sh compares runs' metrics and
# checkpoints with it (standard library only); python3-venv: the tokenizer
# parity test installs tiktoken and sentencepiece into a venv.
# libpcre2-dev, libsentencepiece-dev: `meshtrain tokenize` (src/tokenize).
# chromium: tests/cli/report_chromium_test.sh renders a run report headless
# (81 MB download, 290 MB installed; the test skips without it).
packages=(g++ cmake make pkg-config openmpi-bin libopenmpi-dev libopenblas-dev libopenblas-openmp-dev libdnnl-dev
          ocl-icd-opencl-dev libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev libtomlplusplus-dev
          nlohmann-json3-dev libfmt-dev python3 python3-venv libpcre2-dev libsentencepiece-dev chromium)
source scripts/install-packages.sh
install_missing_packages "${packages[@]}"

build_dir=${1:-build}
shift || true
configure=() targets=()
while (($#)); do
  if [ "$1" = --target ]; then
    [ $# -ge 2 ] || { echo "setup.sh: --target needs a target name" >&2; exit 2; }
    targets+=(--target "$2")
    shift 2
  else
    configure+=("$1")
    shift
  fi
done
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "${configure[@]}" >/dev/null
cmake --build "$build_dir" -j "$(nproc)" "${targets[@]}"
