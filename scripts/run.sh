#!/usr/bin/env bash
# The main job: train the bundled small Llama (configs/debug.toml) on the
# bundled text on 4 local ranks, FSDP 2 x TP 2 (weights split Megatron's way
# over tp, and each tp part sharded over dp_shard with its gradients and
# optimizer states), and print what each rank held and did; then the
# communication benchmark on 4 local ranks (meshtrain's collectives next to
# plain MPI). Each run trains afresh in its own folder, runs/debug/<time>
# (checkpoints, metrics); a run given --checkpoint.folder of an earlier one
# resumes from its newest checkpoint. Extra arguments go to `meshtrain
# train` (e.g. --training.steps 100, or --parallel.tp 1 for FSDP over all 4).
set -euo pipefail
cd "$(dirname "$0")/.."
# The binary alone: the tests and benchmarks are built by scripts/test.sh.
scripts/setup.sh build --target meshtrain
run=runs/debug/$(date -u +%Y%m%d-%H%M%S)
scripts/mpirun.sh -np 4 build/meshtrain train --config configs/debug.toml --parallel.tp 2 \
  --checkpoint.folder "$run/checkpoints" --metrics.file "$run/metrics.jsonl" "$@"
echo
scripts/mpirun.sh -np 4 build/meshtrain bench comm --max-bytes 16M
