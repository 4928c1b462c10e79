#!/usr/bin/env bash
# The comm benchmark for the figures the foundation issue asks for: busBw of
# all_reduce, all_gather and reduce_scatter at 1 MiB and 16 MiB on 2 and 4
# ranks, as a ratio to the plain MPI call measured in the same run.
# Usage: bench/comm.sh [extra `bench comm` flags, e.g. --rounds 9 --no-verify]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/meshtrain ] || scripts/setup.sh build
for np in 2 4; do
  echo "== $np ranks"
  scripts/mpirun.sh -np "$np" build/meshtrain bench comm --ops all_reduce,all_gather,reduce_scatter \
    --min-bytes 1M --max-bytes 16M --rounds 21 "$@" | grep -v '4 MiB'
done
