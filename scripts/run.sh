#!/usr/bin/env bash
# The main job. Until training lands (issue "Compute graph, autodiff, CPU
# kernels and single-rank Llama training"), it is the communication
# benchmark on 4 local ranks: meshtrain's collectives next to plain MPI.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
exec scripts/mpirun.sh -np 4 build/meshtrain bench comm "$@"
