#!/usr/bin/env bash
# The scheduling passes under mpirun change which collectives run and when,
# never a result: on every layout of the parity test (DDP 2, FSDP 2, 3 and
# 4, HSDP 2x2, FSDP 2 x TP 2 in f32 and bf16, DDP 2 x TP 2 with sequence and
# loss parallel, TP 4, FSDP 2 without resharding and with 2 microbatches,
# and two pipelines: pp 2 x FSDP 2 zero-bubble and pp 2 x TP 2 with sequence
# parallel, whose stages get the same passes), the losses and gradient norms of every step with the collectives bucketed
# per block (the default) and reordered are bitwise equal to those with
# neither. The reordering is decided on the H100 profile (--schedule.hardware
# h100-sxm), where it moves collectives; on this machine's own profile (the
# cores that compute also move the bytes) it has nothing to gain and moves
# none. Each layout's lowered graph must differ between the two, so the
# comparison is never vacuous. On six of them, bucketing by size (1 MiB)
# and automatic bucketing must differ from no pass; buckets whose members
# are copied in and out (schedule.bucket_views false) and activation
# checkpointing (full, selective) from the default passes; and selective
# keeping every other matmul from plain selective.
# Benchmark mode (FSDP 2 x TP 2): see below.
# Memory budget (FSDP 4): an impossible budget is one error, printed once,
# naming the smallest budget that fits, and every rank exits non-zero; for a
# sweep of budgets from that smallest one up, each rank's measured step
# peak never exceeds the budget.
# Usage: schedule_passes_test.sh "MPIRUN [FLAGS]" MESHTRAIN SOURCE_DIR
source "$(dirname "$0")/common.sh"
model=(--config configs/debug.toml --model.dim 64 --model.n_layers 2 --model.n_heads 8 --model.n_kv_heads 4
       --model.ffn_dim 160 --data.seq_len 32 --data.batch_size 8 --training.steps 6 --metrics.log_every 1
       --checkpoint.folder "")
run() {  # NAME NP [KEY VALUE ...]
  local name=$1 np=$2
  shift 2
  timeout 300 $mpirun -np "$np" "$meshtrain" train "${model[@]}" --metrics.file "$dir/$name.jsonl" "$@" \
    > "$dir/$name.out" 2>&1 || { cat "$dir/$name.out"; fail "$name exited non-zero"; }
}
no_passes=(--schedule.bucket_mode none --schedule.reorder false)
layouts=(
  "ddp2:2:--parallel.dp_replicate 2 --parallel.dp_shard 1"
  "fsdp2:2:"
  "fsdp3:3:--data.batch_size 6"
  "fsdp4:4:"
  "hsdp:4:--parallel.dp_replicate 2 --parallel.dp_shard 2"
  "fsdp2_tp2:4:--parallel.tp 2"
  "fsdp2_tp2_bf16:4:--parallel.tp 2 --training.dtype bfloat16 --training.reduce_dtype bfloat16"
  "ddp2_tp2_sp_lp:4:--parallel.dp_replicate 2 --parallel.dp_shard 1 --parallel.tp 2 --parallel.sequence_parallel true --parallel.loss_parallel true"
  "tp4:4:--parallel.dp_shard 1 --parallel.tp 4"
  "fsdp2_keep:2:--parallel.reshard_after_forward false"
  "fsdp2_accum2:2:--training.grad_accum_steps 2"
  "pp2_fsdp2_zb:4:--parallel.pp 2 --parallel.dp_shard 2 --parallel.pp_schedule zero_bubble"
  "pp2_tp2_sp:4:--parallel.pp 2 --parallel.dp_shard 1 --parallel.tp 2 --parallel.sequence_parallel true"
)
for layout in "${layouts[@]}"; do
  IFS=: read -r name np flags <<< "$layout"
  read -r -a extra <<< "$flags"
  "$meshtrain" lower --ranks "$np" "${model[@]}" "${extra[@]}" "${no_passes[@]}" > "$dir/${name}_off.txt"
  "$meshtrain" lower --ranks "$np" "${model[@]}" "${extra[@]}" --schedule.hardware h100-sxm > "$dir/${name}_on.txt"
  moved=$(diff "$dir/${name}_off.txt" "$dir/${name}_on.txt" | grep -c '^>.*= [a-z_]*(.*mesh_dims')
  [ "$moved" -gt 0 ] || fail "$name: bucketing and reordering on the h100-sxm profile changed no collective"
  run "${name}_off" "$np" "${extra[@]}" "${no_passes[@]}"
  run "${name}_on" "$np" "${extra[@]}" --schedule.hardware h100-sxm
  python3 - "$dir/${name}_off.jsonl" "$dir/${name}_on.jsonl" "$name" "$moved" <<'PY' || exit 1
import json, sys
off, on, name, moved = sys.argv[1:]
a = [json.loads(l) for l in open(off)]
b = [json.loads(l) for l in open(on)]
assert len(a) == len(b) == 6, f"{name}: {len(a)} and {len(b)} steps logged"
for x, y in zip(a, b):
    for key in ("loss", "grad_norm"):
        if x[key] != y[key]:
            sys.exit(f"FAIL: {name} step {x['step']} {key}: {y[key]!r} reordered vs {x[key]!r} not")
print(f"{name}: {moved} collective lines differ; 6 steps, losses and gradient norms bitwise equal")
PY
done

# A pipeline's --dump-graph shows its stages' bucketed collectives.
run pp_dump 4 --parallel.pp 2 --parallel.dp_shard 2 --training.steps 1 --dump-graph "$dir/pp_dump_{rank}.txt"
for r in 0 2; do
  grep -q '= bucket_pack(' "$dir/pp_dump_$r.txt" || fail "pp 2 x FSDP 2: rank $r's --dump-graph shows no bucket"
done

# Bucketing by size and automatic bucketing, buckets that copy their
# members, and activation checkpointing (full, selective, and selective
# keeping every other matmul), each with the reordering on: bitwise equal to
# no pass.
for layout in "${layouts[@]}"; do
  IFS=: read -r name np flags <<< "$layout"
  case $name in fsdp3|fsdp4|hsdp|fsdp2_tp2|ddp2_tp2_sp_lp|fsdp2_accum2) ;; *) continue ;; esac
  read -r -a extra <<< "$flags"
  for mode in size_cap auto copies full selective every_other; do
    # What each mode's lowered graph must differ from: no pass (bucketing
    # modes: auto may choose per-block buckets), the default passes (copied
    # members, checkpointing), or plain selective (every other matmul).
    case $mode in
      size_cap|auto) pass=(--schedule.bucket_mode "$mode" --schedule.bucket_cap_mb 1) base=off ;;
      copies) pass=(--schedule.bucket_views false) base=on ;;
      every_other) pass=(--activation_checkpoint.mode selective --activation_checkpoint.selective_matmuls every_other)
                   base=selective ;;
      *) pass=(--activation_checkpoint.mode "$mode") base=on ;;
    esac
    "$meshtrain" lower --ranks "$np" "${model[@]}" "${extra[@]}" --schedule.hardware h100-sxm "${pass[@]}" > "$dir/${name}_$mode.txt"
    cmp -s "$dir/${name}_$base.txt" "$dir/${name}_$mode.txt" && fail "$name: $mode changed nothing against $base"
    run "${name}_ac_$mode" "$np" "${extra[@]}" --schedule.hardware h100-sxm "${pass[@]}"
    python3 - "$dir/${name}_off.jsonl" "$dir/${name}_ac_$mode.jsonl" "$dir/${name}_on.jsonl" "$name" "$mode" <<'PY' || exit 1
import json, sys
off, on, reordered, name, mode = sys.argv[1:]
a = [json.loads(l) for l in open(off)]
b = [json.loads(l) for l in open(on)]
assert len(a) == len(b) == 6, f"{name}: {len(a)} and {len(b)} steps logged"
for x, y in zip(a, b):
    for key in ("loss", "grad_norm"):
        if x[key] != y[key]:
            sys.exit(f"FAIL: {name} step {x['step']} {key}: {y[key]!r} with {mode} vs {x[key]!r} with no pass")
peak = lambda rows: max(r["step_peak_bytes_max"] for r in rows) / 2**20
none = peak([json.loads(l) for l in open(reordered)])
print(f"{name}, {mode}: bitwise equal; largest rank step peak {peak(b):.2f} MiB (per-block buckets: {none:.2f})")
PY
  done
done

# Benchmark mode (schedule.estimate = benchmark, on this machine's profile):
# every rank times the kernels and the ranks agree on the figures (rank 0
# says so once), automatic bucketing decides on them, the cache is written,
# and a second run reads it and times nothing; the losses and gradient norms
# stay bitwise equal to no pass. With an H100 profile it is one error,
# printed once, and every rank exits non-zero.
bench=(--parallel.tp 2 --schedule.estimate benchmark --schedule.kernel_cache "$dir/kernels.json" --schedule.bucket_mode auto)
run bench_timed 4 "${bench[@]}"
[ "$(grep -c 'benchmark mode: timed [0-9]* kernels .*the median of 4 ranks' "$dir/bench_timed.out")" -ge 1 ] ||
  { cat "$dir/bench_timed.out"; fail "benchmark mode: no line saying the kernels were timed and aligned"; }
[ -s "$dir/kernels.json" ] || fail "benchmark mode wrote no kernel cache"
run bench_cached 4 "${bench[@]}"
grep -q 'benchmark mode: timed' "$dir/bench_cached.out" && { cat "$dir/bench_cached.out"; fail "benchmark mode timed kernels the cache has"; }
python3 - "$dir/fsdp2_tp2_off.jsonl" "$dir/bench_timed.jsonl" "$dir/bench_cached.jsonl" <<'PY' || exit 1
import json, sys
off, *runs = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
for rows, what in zip(runs, ("timed", "cached")):
    assert len(rows) == len(off) == 6, f"{what}: {len(rows)} steps logged"
    for x, y in zip(off, rows):
        for key in ("loss", "grad_norm"):
            if x[key] != y[key]:
                sys.exit(f"FAIL: benchmark mode ({what}) step {x['step']} {key}: {y[key]!r} vs {x[key]!r} with no pass")
    if not all(r["estimated_step_ms"] > 0 for r in rows):
        sys.exit(f"FAIL: benchmark mode ({what}): no estimated step time in the metrics")
print(f"benchmark mode, FSDP 2 x TP 2: timed, then from the cache; bitwise equal to no pass; "
      f"estimated step {runs[0][-1]['estimated_step_ms']:.1f} ms, measured {runs[0][-1]['step_ms']:.1f} ms")
PY
out=$(timeout 60 $mpirun -np 2 "$meshtrain" train "${model[@]}" --schedule.estimate benchmark --schedule.hardware h100-sxm 2>&1)
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "$out"; fail "benchmark mode on h100-sxm: exit $rc (expected a non-zero exit, not a hang)"; }
[ "$(grep -c 'schedule.estimate = "benchmark" times the kernels' <<<"$out")" = 1 ] || { echo "$out"; fail "the benchmark-mode hardware error is not printed exactly once"; }
echo "benchmark mode on h100-sxm: one error, every rank exited"

# Memory budget, FSDP 4 on the benchmark model (about 50 MiB a rank), the
# reordering decided on the H100 profile, so that it has something to
# spend the room on.
model=(--config configs/debug.toml --model.n_layers 4 --model.n_heads 8 --model.n_kv_heads 8 --data.seq_len 256
       --data.batch_size 8 --training.steps 4 --metrics.log_every 1 --checkpoint.folder "" --schedule.hardware h100-sxm)
out=$(timeout 60 $mpirun -np 4 "$meshtrain" train "${model[@]}" --schedule.memory_budget_mb 10 2>&1)
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "$out"; fail "budget 10 MiB: exit $rc (expected a non-zero exit, not a hang)"; }
[ "$(grep -c 'schedule.memory_budget_mb 10 is too small' <<<"$out")" = 1 ] || { echo "$out"; fail "the budget error is not printed exactly once"; }
smallest=$(sed -n 's/.*the smallest budget that fits is \([0-9]*\) MiB.*/\1/p' <<<"$out" | head -1)
[ -n "$smallest" ] || { echo "$out"; fail "the budget error names no smallest budget"; }
echo "budget 10 MiB: one error, smallest budget that fits $smallest MiB"
"$meshtrain" lower --ranks 4 "${model[@]}" --schedule.reorder false > "$dir/budget_off.txt"
for budget in "$smallest" $((smallest + 1)) $((smallest + 2)) $((smallest + 3)) 0; do
  "$meshtrain" lower --ranks 4 "${model[@]}" --schedule.memory_budget_mb "$budget" > "$dir/budget_$budget.txt"
  moved=$(diff "$dir/budget_off.txt" "$dir/budget_$budget.txt" | grep -c '^>.*= [a-z_]*(.*mesh_dims')
  run "budget_$budget" 4 --schedule.memory_budget_mb "$budget"
  python3 - "$dir/budget_$budget.jsonl" "$budget" "$moved" <<'PY' || exit 1
import json, sys
path, budget, moved = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = [json.loads(l) for l in open(path)]
peak = max(r["step_peak_bytes_max"] for r in rows) / 2**20
if budget and peak > budget:
    sys.exit(f"FAIL: budget {budget} MiB: a rank's step peaked at {peak:.3f} MiB")
print(f"budget {budget or 'none'} MiB: {moved} collective lines moved, the largest rank's step peak {peak:.3f} MiB")
PY
done
echo "PASS"
