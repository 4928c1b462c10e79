#!/usr/bin/env bash
# meshtrain's grouped GEMM (the MoE experts' f32 GEMMs: forward, input and
# weight gradients) against one dense oneDNN GEMM of the same FLOPs, in the
# same run (build/grouped_gemm; bench/grouped_gemm.cpp says how): realistic
# MoE shapes of 8 and 64 experts, top-2, uneven seeded routing, each sorted
# all at once and per sequence (meshtrain's MoE layer). Target: grouped >=
# 0.85x the dense GFLOP/s.
# Usage: [REPS=9] bench/grouped_gemm.sh [THREADS] [--quick | --only NAME]
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-$(nproc)}
shift || true
[[ $threads =~ ^[1-9][0-9]*$ ]] || { echo "bench/grouped_gemm.sh: THREADS must be a positive integer" >&2; exit 2; }
[ -x build/grouped_gemm ] || scripts/setup.sh build
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores," \
  "$(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || echo 'no AVX-512'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
OMP_NUM_THREADS=$threads build/grouped_gemm --threads "$threads" --reps "${REPS:-9}" "$@"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
