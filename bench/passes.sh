#!/usr/bin/env bash
# Do the scheduling passes pay off? The benchmark model (Llama dim 256, 4
# layers, seq 256, batch 8) as FSDP 4 on 4 ranks, f32 and bf16, three ways
# in the same run, rounds alternating (this host's step times vary by
# +-30%): no pass (one collective per parameter, each waited on where it is
# first read), bucketing (a block's collectives as one), and bucketing plus
# reordering (collectives started early). On this machine the cores that
# compute also move a collective's bytes, so reordering decided on its own
# profile moves nothing; the third way is decided on the H100 profile, to
# measure what starting collectives early does here. Measured: the median
# step time, and the communication the compute thread runs or waits for
# (collective starts, waits, bucket packing; rank 0's --profile, per step).
# Beside each, `meshtrain estimate` of the same configuration on this
# machine's profile, and then the three ways for Llama 3.1 8B on 8 H100s.
# Usage: [ROUNDS=3] bench/passes.sh [STEPS] [PROFILE]
#   PROFILE: `here` (the default) calibrates this host first (about 2
#   minutes); or a built-in name (cpu-2core) or a profile file.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-8}
profile=${2:-here}
[[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "bench/passes.sh: STEPS must be a positive integer" >&2; exit 2; }
[ -x build/meshtrain ] || scripts/setup.sh build
source bench/bench_model.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bench_text "$work/text.txt"
profile=$(bench_profile "$profile" "$work")
model=(--config configs/debug.toml --model.n_layers 4 --model.n_heads 8 --model.n_kv_heads 8 --data.seq_len 256
       --data.batch_size 8 --data.path "$work/text.txt" --checkpoint.folder "" --parallel.dp_shard 4)
ways=("none:--schedule.bucket_mode none --schedule.reorder false"
      "bucket:--schedule.bucket_mode per_block --schedule.reorder false"
      "bucket+reorder:--schedule.bucket_mode per_block --schedule.hardware h100-sxm")
rounds=${ROUNDS:-3}
echo "FSDP 4 on 4 ranks, $steps steps after 3 warm-up steps, $rounds rounds, $(nproc) cores"
for dtype in float32 bfloat16; do
  for round in $(seq "$rounds"); do
    for way in "${ways[@]}"; do
      name=${way%%:*}
      read -r -a flags <<< "${way#*:}"
      [ "$round" -gt 1 ] || build/meshtrain estimate "${model[@]}" "${flags[@]}" --training.dtype "$dtype" --ranks 4 \
        --hardware "$profile" --json > "$work/est_${dtype}_$name.json"
      scripts/mpirun.sh -np 4 build/meshtrain train "${model[@]}" "${flags[@]}" --training.dtype "$dtype" \
        --training.steps $((steps + 3)) --metrics.file "$work/m_${dtype}_${name}_$round.jsonl" --metrics.log_every 1 \
        --profile > "$work/p_${dtype}_${name}_$round.txt"
    done
  done
done
python3 - "$work" "$steps" "${ways[@]%%:*}" <<'PY'
import glob, json, re, statistics, sys
work, steps, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
comm_ops = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "wait", "bucket_pack", "bucket_unpack", "shard_locally"}
def comm_ms(path, runs):  # rank 0's profile covers steps 2..: per step
    total = 0.0
    for line in open(path):
        m = re.match(r"^\s*(?:profile \(steps 2\.\.\):)?\s*(\w+)\s+(\d+)\s+([\d.]+)\s+[\d.]+%", line)
        if m and m.group(1) in comm_ops: total += float(m.group(3))
    return total / runs
print(f"{'dtype':<9} {'way':<15} {'step ms':>9} {'comm ms':>8}   {'est. step':>9} {'est. comm':>9} {'est. exposed':>12}")
for dtype in ("float32", "bfloat16"):
    for name in names:
        per_round, comm = [], []
        for path in sorted(glob.glob(f"{work}/m_{dtype}_{name}_*.jsonl")):
            rows = [json.loads(l) for l in open(path)][-steps:]
            per_round.append(statistics.median(r["step_ms"] for r in rows))
            comm.append(comm_ms(path.replace("/m_", "/p_").replace(".jsonl", ".txt"), steps + 2))
        est = json.load(open(f"{work}/est_{dtype}_{name}.json"))["time"]
        print(f"{dtype:<9} {name:<15} {statistics.median(per_round):9.1f} {statistics.median(comm):8.1f}   "
              f"{est['step_us'] / 1e3:9.1f} {est['communication_us'] / 1e3:9.1f} {est['exposed_us'] / 1e3:12.1f}")
PY
echo
echo "Llama 3.1 8B, FSDP 8 with selective activation checkpointing, on 8 H100 (estimate):"
printf '%-15s %10s %12s %12s %10s\n' way "step s" "comm ms" "exposed ms" "peak GiB"
for way in "${ways[@]}"; do
  name=${way%%:*}
  read -r -a flags <<< "${way#*:}"
  build/meshtrain estimate --config configs/llama3_8b.toml "${flags[@]}" --ranks 8 --hardware h100-sxm --json |
    python3 -c 'import json,sys; d=json.load(sys.stdin); t=d["time"]; m=d["memory"]["peak_bytes"]; print("%-15s %10.3f %12.1f %12.1f %10.2f" % (sys.argv[1], t["step_us"]/1e6, t["communication_us"]/1e3, t["exposed_us"]/1e3, m/2**30))' "$name"
done
