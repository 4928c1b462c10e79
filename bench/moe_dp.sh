#!/usr/bin/env bash
# An MoE step against a dense one with the same active parameters per token,
# on RANKS local ranks (FSDP over all of them; with EP=N the MoE's experts
# split over N of them, tokens dispatched by all_to_all, else every rank
# runs every expert on its own tokens), in the same run, rounds alternating
# the two (this host varies by up to +-30% run to run):
#   MoE:   the benchmark model (Llama dim 256, 4 layers, 8 heads, vocab 256,
#          seq 256, global batch 8) with every MLP a Mixtral sparse block of
#          8 experts, top-2, moe_ffn_dim 256;
#   dense: the same with a SwiGLU MLP of ffn_dim = top-k x moe_ffn_dim = 512,
#          the FLOPs per token of the MoE's experts (the router aside).
# Each rank runs on one thread (OMP_NUM_THREADS=1); with more ranks than
# cores they share cores (printed). Also printed: the parameters each model
# holds (the MoE's experts are 4x the dense MLP's weights, which FSDP gathers
# and reduces every step), the time per step rank 0's compute thread
# spends in collectives (--profile: starts, waits, bucket packing), and the
# MoE's routing balance: its most unbalanced layer's tokens per expert, max
# over mean (with EP the rank holding the busiest expert sets the pace).
# Usage: [ROUNDS=3] [EP=1] bench/moe_dp.sh [RANKS] [STEPS] [float32|bfloat16]
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-4}
steps=${2:-10}
dtype=${3:-float32}
[[ $ranks =~ ^[1-9][0-9]*$ && $steps =~ ^[1-9][0-9]*$ ]] || { echo "bench/moe_dp.sh: RANKS and STEPS must be positive integers" >&2; exit 2; }
[[ $dtype == float32 || $dtype == bfloat16 ]] || { echo "bench/moe_dp.sh: dtype must be float32 or bfloat16, not '$dtype'" >&2; exit 2; }
[ -x build/meshtrain ] || scripts/setup.sh build
source bench/bench_model.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bench_text "$work/text.txt"
model=(--config configs/debug.toml --model.n_layers 4 --model.n_heads 8 --model.n_kv_heads 8 --data.seq_len 256
       --data.batch_size 8 --data.path "$work/text.txt" --checkpoint.folder "" --parallel.dp_shard "$ranks"
       --training.dtype "$dtype" --training.steps $((steps + 3)) --metrics.log_every 1 --profile)
ep=${EP:-1}
[[ $ep =~ ^[1-9][0-9]*$ ]] && (( ranks % ep == 0 && 8 % ep == 0 )) ||
  { echo "bench/moe_dp.sh: EP must divide RANKS and the 8 experts, not '$ep'" >&2; exit 2; }
declare -A flags=([moe]="${bench_moe[*]} --parallel.ep $ep"
                  [dense]="--model.ffn_dim 512")
run() {  # NAME ROUND: one run; its metrics and log in WORKDIR
  local extra
  read -r -a extra <<< "${flags[$1]}"
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 scripts/mpirun.sh -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -np "$ranks" \
    build/meshtrain train "${model[@]}" "${extra[@]}" --metrics.file "$work/m_$1_$2.jsonl" > "$work/log_$1_$2.txt" 2>&1 \
    || { cat "$work/log_$1_$2.txt" >&2; exit 1; }
}
rounds=${ROUNDS:-3}
echo "load average $(cut -d' ' -f1-3 /proc/loadavg); $ranks ranks x 1 thread on $(nproc) cores$([ "$ranks" -le "$(nproc)" ] || echo " (oversubscribed: ranks share cores)"), FSDP $ranks (MoE: EP $ep), $dtype, global batch 8 x 256 tokens, $steps steps after 3 warm-up steps, $rounds rounds"
for round in $(seq "$rounds"); do
  run moe "$round"
  run dense "$round"
done
grep -m1 -i "param" "$work/log_moe_1.txt" | sed 's/^/MoE:   /' || true
grep -m1 -i "param" "$work/log_dense_1.txt" | sed 's/^/dense: /' || true
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$work" "$steps" "$rounds" <<'PY'
import json, re, statistics, sys
work, steps, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
comm_ops = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "wait", "bucket_pack", "bucket_unpack", "shard_locally"}
def step_s(name, r):
    rows = [json.loads(l) for l in open(f"{work}/m_{name}_{r}.jsonl")][-steps:]
    return statistics.median(x["step_ms"] for x in rows) / 1e3
def comm_ms(name, r):  # rank 0's profile covers steps 2..: per step
    total = 0.0
    for line in open(f"{work}/log_{name}_{r}.txt"):
        m = re.match(r"^\s*(?:profile \(steps 2\.\.\):)?\s*(\w+)\s+(\d+)\s+([\d.]+)\s+[\d.]+%", line)
        if m and m.group(1) in comm_ops: total += float(m.group(3))
    return total / (steps + 2)
tokens = 8 * 256
def load(r):  # the most unbalanced MoE layer's tokens per expert, max / mean, over the timed steps (median)
    rows = [json.loads(l) for l in open(f"{work}/m_moe_{r}.jsonl")][-steps:]
    worst = [max(x["tokens_per_expert_max"] / x["tokens_per_expert_mean"] for x in row["moe"]) for row in rows]
    return statistics.median(worst)
rows = [(step_s("moe", r), step_s("dense", r), comm_ms("moe", r), comm_ms("dense", r)) for r in range(1, rounds + 1)]
for r, (m, d, mc, dc) in enumerate(rows, 1):
    print(f"round {r}: MoE {tokens / m:.0f} tok/s ({m * 1e3:.0f} ms, comm {mc:.0f} ms, experts max/mean {load(r):.2f}), "
          f"dense {tokens / d:.0f} tok/s ({d * 1e3:.0f} ms, comm {dc:.0f} ms), ratio {d / m:.2f}")
ratios = [d / m for m, d, _, _ in rows]
print(f"MoE {tokens / statistics.median(r[0] for r in rows):.0f} tok/s, dense (same active parameters) "
      f"{tokens / statistics.median(r[1] for r in rows):.0f} tok/s (medians of {rounds} rounds); "
      f"MoE / dense {statistics.median(ratios):.2f}x (median round; min {min(ratios):.2f}x; target >= 0.8x)")
# Other processes on the host only ever slow a run down: each side's fastest round is its least disturbed.
best_moe, best_dense = min(r[0] for r in rows), min(r[1] for r in rows)
print(f"fastest rounds: MoE {tokens / best_moe:.0f} tok/s, dense {tokens / best_dense:.0f} tok/s, "
      f"MoE / dense {best_dense / best_moe:.2f}x")
PY
