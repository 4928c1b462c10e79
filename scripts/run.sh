#!/usr/bin/env bash
# The main job: train the bundled small Llama (configs/debug.toml) on the
# bundled text on 2 local ranks (FSDP: parameters, gradients and optimizer
# states sharded over both) and print what it did; then the communication
# benchmark on 4 local ranks (meshtrain's collectives next to plain MPI).
# Extra arguments go to `meshtrain train` (e.g. --training.steps 100, or
# --parallel.dp_replicate 2 --parallel.dp_shard 1 for DDP).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
scripts/mpirun.sh -np 2 build/meshtrain train --config configs/debug.toml "$@"
echo
scripts/mpirun.sh -np 4 build/meshtrain bench comm --max-bytes 16M
