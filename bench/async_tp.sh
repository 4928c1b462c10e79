#!/usr/bin/env bash
# Async TP against plain sequence parallelism: the debug model (Llama dim
# 256, 6 layers, 16 heads, vocab 256; batch 8 of 128 tokens by default) on
# TP ranks (default 4) with sequence parallel, STEPS steps (default 6) with
# parallel.async_tp false and true in alternating rounds (default 3).
# Prints each round's median step time (steps 2 on) of each, their ratio
# (the issue asks async TP's at most the plain one's), each one's estimate
# on this machine's profile and on 4 H100s (h100-sxm), and, from a trace of
# async TP's last step (train --trace), how many of its ring_shifts were in
# flight while a GEMM ran on the same rank. Both must train to the same
# loss and gradient norm.
# Usage: bench/async_tp.sh [TP] [STEPS] [ROUNDS] [SEQ]
set -euo pipefail
cd "$(dirname "$0")/.."
tp=${1:-4} steps=${2:-6} rounds=${3:-3} seq=${4:-128}
for n in "$tp" "$steps" "$rounds" "$seq"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "bench/async_tp.sh: TP, STEPS, ROUNDS and SEQ must be positive integers" >&2; exit 2; }
done
(( tp >= 2 && seq % tp == 0 )) || { echo "bench/async_tp.sh: TP must be at least 2 and divide SEQ $seq" >&2; exit 2; }
(( steps >= 2 )) || { echo "bench/async_tp.sh: STEPS must be at least 2 (the first is not timed)" >&2; exit 2; }
[ -x build/meshtrain ] || scripts/setup.sh build
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
model=(--config configs/debug.toml --data.seq_len "$seq" --training.steps "$steps" --checkpoint.folder ""
       --metrics.log_every 1 --parallel.tp "$tp" --parallel.dp_shard 1 --parallel.sequence_parallel true)
echo "debug model, batch 8 of $seq tokens, tp $tp with sequence parallel, $steps steps, $rounds rounds" \
  "($(date -u +%F), $(nproc) cores, OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset})"
median_ms() { python3 -c 'import json, statistics, sys; rows = [json.loads(l) for l in open(sys.argv[1])][1:]; print("%.1f" % statistics.median(r["step_ms"] for r in rows))' "$1"; }
last() { python3 -c 'import json, sys; r = [json.loads(l) for l in open(sys.argv[1])][-1]; print("%.6f %.6f" % (r["loss"], r["grad_norm"]))' "$1"; }
for round in $(seq "$rounds"); do
  for mode in false true; do
    trace=()
    [ "$round" = "$rounds" ] && [ $mode = true ] && trace=(--trace "$out/async.trace.json")
    scripts/mpirun.sh -np "$tp" build/meshtrain train "${model[@]}" --parallel.async_tp $mode \
      --metrics.file "$out/$mode.jsonl" "${trace[@]}" >"$out/$mode.log" 2>&1 || { tail -5 "$out/$mode.log"; exit 1; }
    echo "$(median_ms "$out/$mode.jsonl")" >>"$out/$mode.times"
  done
  printf 'round %d: plain %s ms, async TP %s ms\n' "$round" "$(tail -1 "$out/false.times")" "$(tail -1 "$out/true.times")"
done
[ "$(last "$out/false.jsonl")" = "$(last "$out/true.jsonl")" ] ||
  echo "note: the last step's loss and gradient norm differ in their last digits: $(last "$out/false.jsonl") vs $(last "$out/true.jsonl")"
# The estimated step in ms (meshtrain prints us, ms or s).
estimate() {  # HARDWARE ASYNC
  build/meshtrain estimate --hardware "$1" --ranks "$tp" "${model[@]}" --parallel.async_tp "$2" |
    sed -n 's/^time: step \([0-9.]*\) \(us\|ms\|s\):.*/\1 \2/p' |
    awk '{ print $2 == "s" ? $1 * 1000 : $2 == "us" ? $1 / 1000 : $1 }'
}
python3 - "$out" "$(estimate cpu-2core false)" "$(estimate cpu-2core true)" "$(estimate h100-sxm false)" \
  "$(estimate h100-sxm true)" <<'PY'
import json, statistics, sys
out, cpu_plain, cpu_async, gpu_plain, gpu_async = sys.argv[1], *map(float, sys.argv[2:])
plain = statistics.median(float(x) for x in open(f"{out}/false.times"))
fast = statistics.median(float(x) for x in open(f"{out}/true.times"))
print(f"{'':<10} {'step ms':>9} {'cpu-2core':>10} {'h100-sxm':>9}")
print(f"{'plain':<10} {plain:>9.1f} {cpu_plain:>10.1f} {gpu_plain:>9.3f}")
print(f"{'async TP':<10} {fast:>9.1f} {cpu_async:>10.1f} {gpu_async:>9.3f}")
print(f"async / plain: {fast / plain:.3f} measured (median of rounds; the issue asks <= 1), "
      f"{cpu_async / cpu_plain:.3f} estimated on cpu-2core, {gpu_async / gpu_plain:.3f} on h100-sxm")
# The trace: each ring_shift's transfer (start to the end of its wait, the communication track) against the GEMMs
# that ran on the rank's compute track meanwhile.
events = json.load(open(f"{out}/async.trace.json"))
events = events["traceEvents"] if isinstance(events, dict) else events
gemms, begins, shifts = {}, {}, []
for e in events:
    if e.get("ph") == "X" and e.get("name") in ("matmul", "rows_matmul", "fp8_matmul", "fp8_rows_matmul"):
        gemms.setdefault(e["pid"], []).append((e["ts"], e["ts"] + e["dur"]))
    elif e.get("name") == "ring_shift" and e.get("ph") == "b":
        begins[(e["pid"], e["id"])] = e["ts"]
    elif e.get("name") == "ring_shift" and e.get("ph") == "e":
        shifts.append((e["pid"], begins.pop((e["pid"], e["id"])), e["ts"]))
under = sum(any(b < end and e > begin for b, e in gemms.get(pid, [])) for pid, begin, end in shifts)
print(f"trace of async TP's last step: {under} of {len(shifts)} ring_shifts in flight while a GEMM ran on their rank")
PY
echo "last step (loss, grad norm): plain $(last "$out/false.jsonl"), async TP $(last "$out/true.jsonl")"
