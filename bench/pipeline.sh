#!/usr/bin/env bash
# Pipeline schedules measured on this machine next to their simulation and the
# published bubble formulas: each schedule trains the bench model (Llama dim
# 256, 8 heads, vocab 256, seq 256; 6 layers, so that 8 stages of
# interleaved_1f1b and zbv get a block each but the ends) on PP ranks with
# MICROBATCHES microbatches of one sequence, and every rank reports its last
# step's measured bubble (the share of the step it did not compute) and the
# activations it held between programs at their peak (MiB, and (stage,
# microbatch) pairs), beside the schedule simulated with F = I = W.
# Ranks share this machine's cores: a rank that waits yields its core to
# another, so the measured bubble mixes the schedule's idle time with the
# core sharing. Usage: bench/pipeline.sh [PP] [MICROBATCHES] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
pp=${1:-4} micro=${2:-8} steps=${3:-5}
[[ $pp =~ ^[1-9][0-9]*$ && $micro =~ ^[1-9][0-9]*$ && $steps =~ ^[1-9][0-9]*$ ]] ||
  { echo "bench/pipeline.sh: PP, MICROBATCHES and STEPS must be positive integers" >&2; exit 2; }
[ -x build/meshtrain ] || { echo "bench/pipeline.sh: build first (scripts/test.sh or cmake --build build)" >&2; exit 2; }
echo "bench/pipeline.sh: pp $pp, $micro microbatches of 1 sequence of 256 tokens, $steps steps; $(nproc) cores"
for schedule in gpipe 1f1b interleaved_1f1b zero_bubble zbv; do
  out=$(scripts/mpirun.sh -np "$pp" build/meshtrain train --config configs/debug.toml --model.dim 256 --model.n_layers 6 \
    --model.n_heads 8 --model.n_kv_heads 8 --model.ffn_dim 768 --data.seq_len 256 --data.batch_size "$micro" \
    --training.steps "$steps" --checkpoint.folder "" --metrics.file "" --parallel.pp "$pp" \
    --parallel.pp_schedule $schedule --parallel.pp_microbatches "$micro" 2>&1) || { echo "$out"; exit 1; }
  echo "== $schedule: $(grep -m1 '^layout:' <<<"$out" | sed 's/^layout: //; s/; [0-9]* kernel thread.*//')"
  grep -E "^done:|^  rank [0-9]+ \(|last step: bubble|the schedule's bubble" <<<"$out" | sed 's/^/  /'
done
