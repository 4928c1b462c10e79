#!/usr/bin/env bash
# The main job: train the bundled small Llama (configs/debug.toml) on the
# bundled text and print what it did; then the communication benchmark on 4
# local ranks (meshtrain's collectives next to plain MPI). Training runs on
# one rank until the data-parallel plan lands. Extra arguments go to
# `meshtrain train` (e.g. --training.steps 100).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
build/meshtrain train --config configs/debug.toml "$@"
echo
scripts/mpirun.sh -np 4 build/meshtrain bench comm --max-bytes 16M
