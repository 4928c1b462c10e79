#!/usr/bin/env bash
# The comm benchmark for the figures the foundation issue asks for: busBw of
# all_reduce, all_gather and reduce_scatter at 1 MiB and 16 MiB on 2 and 4
# ranks, as a ratio to the plain MPI call measured in the same run; then the
# small sizes on 4 ranks one at a time (4 KiB to 1 MiB, every op, uneven
# all_to_all next to MPI_Alltoallv too), and (64 KiB to 1 MiB) bucketed 8 at
# a time as training buckets them (packed, one collective, unpacked; members
# that training's memory plan makes views of the bucket not copied), all 8
# in one bucket and in buckets of at most 1 MiB, next to the same 8 as plain
# MPI calls one by one on the members' buffers and as one MPI call per bucket
# on the packed bytes.
# Usage: bench/comm.sh [extra `bench comm` flags, e.g. --rounds 9 --no-verify]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/meshtrain ] || scripts/setup.sh build
ops=all_reduce,all_gather,reduce_scatter
for np in 2 4; do
  echo "== $np ranks"
  scripts/mpirun.sh -np "$np" build/meshtrain bench comm --ops "$ops" --min-bytes 1M --max-bytes 16M --rounds 21 "$@" |
    grep -v '4 MiB'
done
echo "== 4 ranks, small collectives one at a time"
scripts/mpirun.sh -np 4 build/meshtrain bench comm --min-bytes 4K --max-bytes 1M --rounds 21 "$@"
echo "== 4 ranks, small collectives bucketed 8 at a time"
scripts/mpirun.sh -np 4 build/meshtrain bench comm --ops "$ops" --min-bytes 64K --max-bytes 1M --rounds 21 --bucket 8 "$@"
echo "== 4 ranks, the same 8 in buckets of at most 1 MiB (schedule.bucket_mode size_cap, bucket_cap_mb 1)"
scripts/mpirun.sh -np 4 build/meshtrain bench comm --ops "$ops" --min-bytes 64K --max-bytes 1M --rounds 21 --bucket 8 \
  --bucket-cap 1M "$@"
