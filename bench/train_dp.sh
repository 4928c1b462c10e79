#!/usr/bin/env bash
# Data-parallel training speed on 2 local ranks x 1 thread, meshtrain vs
# PyTorch DDP (gloo, 2 processes x 1 thread), same model and global batch as
# bench/train.sh (Llama dim 256, 4 layers, 8 heads, vocab 256, seq 256,
# global batch 8: 4 sequences per rank), measured in the same run, in rounds
# that alternate the sides (this host varies by up to +-30% run to run):
#   meshtrain DDP 2 / PyTorch DDP 2 (target >= 2x tokens/s),
#   meshtrain FSDP 2 / meshtrain DDP 2 (target: within 10%),
#   the cost per step of the cross-rank fingerprint check, two ways: end to
#   end (meshtrain DDP 2 with and without --no-verify; within this host's
#   noise) and measured apart (the check's cost per collective, from
#   `meshtrain bench comm` on a 4 KiB all_reduce with and without it, times
#   the collectives a DDP 2 step runs).
# PyTorch runs at its best: in every round, OpenBLAS threads 1 and 2 (and,
# on an AVX-512 CPU, OpenBLAS's AVX-512 kernels) are timed under torch
# threads 1 and the fastest is that round's baseline (each printed).
# Usage: [ROUNDS=3] bench/train_dp.sh [STEPS] [float32|bfloat16]
# (bfloat16: meshtrain's training.dtype bfloat16, PyTorch's CPU autocast.)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-10}
dtype=${2:-float32}
[[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "bench/train_dp.sh: STEPS must be a positive integer" >&2; exit 2; }
[[ $dtype == float32 || $dtype == bfloat16 ]] || { echo "bench/train_dp.sh: dtype must be float32 or bfloat16, not '$dtype'" >&2; exit 2; }
/usr/bin/python3 -c 'import torch' 2>/dev/null || bench/train.sh 1 1 > /dev/null  # installs python3-torch, or says how
[ -x build/meshtrain ] || scripts/setup.sh build
source bench/bench_model.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bench_text "$work/text.txt"
torch_ddp() {  # BLAS_THREADS [CORETYPE]: PyTorch DDP's JSON line
  env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS="$1" ${2:+OPENBLAS_CORETYPE=$2} \
    /usr/bin/python3 bench/torch_ddp_step.py "$bench_model" 1 "$steps" 2 "$dtype"
}
ours() {  # ARGS...: meshtrain on 2 ranks x 1 thread; the median step time (s) of the last STEPS steps
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 scripts/mpirun.sh -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -np 2 \
    build/meshtrain train --config configs/debug.toml --model.n_layers 4 --model.n_heads 8 --model.n_kv_heads 8 \
    --data.seq_len 256 --data.batch_size 8 --data.path "$work/text.txt" --training.steps $((steps + 3)) \
    --checkpoint.folder "" --metrics.file "$work/m.jsonl" --metrics.log_every 1 --training.dtype "$dtype" "$@" \
    > "$work/meshtrain.log" 2>&1 \
    || { cat "$work/meshtrain.log" >&2; exit 1; }
  tail -n "$steps" "$work/m.jsonl" |
    python3 -c 'import sys,json; t=sorted(json.loads(l)["step_ms"] for l in sys.stdin); print(t[len(t)//2]/1000)'
}
# OpenBLAS picks its kernels by CPU; on one it does not know (Debian's 0.3.21
# on AMD Zen 5) it falls back to AVX2 (Haswell), so PyTorch is also timed with
# OpenBLAS's AVX-512 kernels (OPENBLAS_CORETYPE=SkylakeX) where the CPU has AVX-512.
coretypes=("")
grep -qw avx512f /proc/cpuinfo && coretypes+=(SkylakeX)
settings=()
for b in 1 2; do for c in "${coretypes[@]}"; do settings+=("$b:$c"); done; done
fastest_torch() {  # every PyTorch setting, timed now: "SECONDS SETTING" of the fastest, and each on stderr
  local best= best_setting= t
  for setting in "${settings[@]}"; do
    t=$(torch_ddp "${setting%%:*}" "${setting#*:}" | python3 -c 'import sys,json; print(json.load(sys.stdin)["median_step_s"])')
    echo "  PyTorch DDP 2 x 1 thread, OpenBLAS threads ${setting%%:*}, OPENBLAS_CORETYPE=${setting#*:}: $t s/step" >&2
    if [ -z "$best" ] || python3 -c "import sys; sys.exit(not $t < $best)"; then best=$t best_setting=$setting; fi
  done
  echo "$best $best_setting"
}
check_us() {  # [--no-verify]: meshtrain's 4 KiB all_reduce on 2 ranks, us (median of 21 rounds)
  scripts/mpirun.sh -np 2 build/meshtrain bench comm --ops all_reduce --min-bytes 4K --max-bytes 4K --rounds 21 \
    --iters 200 --json "$@" | python3 -c 'import sys,json; print(json.load(sys.stdin)["results"][0]["time_us"])'
}
ddp=(--parallel.dp_replicate 2 --parallel.dp_shard 1)
# Each round times every PyTorch setting and takes the fastest as that
# round's baseline: a setting picked once, ahead of the rounds, was picked by
# the noise as often as by its speed (OpenBLAS threads 2 won a pick at 324 ms
# and then ran 357-618 ms).
rows=() winners=()
for round in $(seq "${ROUNDS:-3}"); do
  echo "round $round:"
  fastest=$(fastest_torch)
  read -r torch setting <<<"$fastest"
  winners+=("$setting")
  rows+=("$(ours "${ddp[@]}") $(ours) $(ours "${ddp[@]}" --no-verify) $torch")
done
echo "PyTorch's fastest setting per round (OpenBLAS threads:OPENBLAS_CORETYPE, empty = its own pick), torch threads 1," \
  "OMP_NUM_THREADS=1: ${winners[*]}"
# The collectives a DDP 2 step runs, from the last run's log (--no-verify runs the same ones).
collectives=$(sed -n 's/.*rank 0 ([^)]*): \([0-9]*\) collectives moving.*/\1/p' "$work/meshtrain.log")
checked=$(check_us) unchecked=$(check_us --no-verify)
python3 - "$(nproc)" "$dtype" "$collectives" "$checked" "$unchecked" "${rows[@]}" <<'PY'
import statistics, sys
cores, dtype = sys.argv[1], sys.argv[2]
collectives, checked_us, unchecked_us = int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
rows = [tuple(map(float, r.split())) for r in sys.argv[6:]]
tokens = 8 * 256
med = lambda i: statistics.median(r[i] for r in rows)
ratio = lambda f: statistics.median(f(r) for r in rows)
print(f"{len(rows)} rounds on {cores} cores, {dtype}, global batch 8 x 256 tokens; median step time per round:")
for name, i in (("meshtrain DDP 2", 0), ("meshtrain FSDP 2", 1), ("meshtrain DDP 2 --no-verify", 2), ("PyTorch DDP 2 (gloo), fastest", 3)):
    print(f"  {name:<28} {med(i) * 1e3:7.1f} ms  {tokens / med(i):7.0f} tokens/s   rounds: " +
          " ".join(f"{r[i] * 1e3:.0f}" for r in rows))
print(f"meshtrain DDP 2 / PyTorch DDP 2: {ratio(lambda r: r[3] / r[0]):.2f}x tokens/s (target >= 2x)")
print(f"meshtrain FSDP 2 / meshtrain DDP 2: {ratio(lambda r: r[0] / r[1]):.2f}x tokens/s (target >= 0.90)")
print(f"fingerprint check, end to end: {ratio(lambda r: (r[0] - r[2]) / r[0]) * 100:+.1f}% of a DDP 2 step "
      "(the median over rounds of (DDP 2 - DDP 2 --no-verify) / DDP 2; this host's noise is larger)")
per_step_ms = collectives * (checked_us - unchecked_us) / 1e3
print(f"fingerprint check, measured apart: 4 KiB all_reduce {checked_us:.1f} us with it, {unchecked_us:.1f} us without: "
      f"{checked_us - unchecked_us:+.1f} us x {collectives} collectives per DDP 2 step = {per_step_ms:.2f} ms, "
      f"{per_step_ms / med(0) / 10:.2f}% of a {med(0) * 1e3:.0f} ms step (on by default while < 2%)")
PY
