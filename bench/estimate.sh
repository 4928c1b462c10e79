#!/usr/bin/env bash
# `meshtrain estimate` against the measurement, same run: the benchmark model
# (Llama dim 256, 4 layers, seq 256, batch 8) on 4 ranks as FSDP 4 and as
# DP 2 x TP 2, each estimated on a hardware profile of this machine and then
# trained under mpirun: step time (the median of the steps after 3 warm-up
# steps; the median over ROUNDS runs of each, the layouts alternating, as
# this host's step times vary by +-30% from run to run) and peak memory
# (what a step allocates: step_peak_bytes). Targets: step time within 10%,
# peak memory within 5%. Two estimates of the time: `meshtrain estimate` on
# the profile's roofline, and benchmark mode (schedule.estimate = benchmark),
# which the training runs themselves make: the ranks time every kernel of
# their step side by side before training, agree on the median, measure how
# far a group's slowest rank trails its mean (a collective waits for it), and
# the metrics carry the estimated step beside the measured one (the median
# over rounds). The roofline takes that wait from the profile (calibrate.sh
# measures it for `here`; the built-in cpu-2core has none).
# Usage: [ROUNDS=3] bench/estimate.sh [PROFILE] [STEPS] [float32|bfloat16]
#   PROFILE: `here` (the default) calibrates this host first in the same run
#   (bench/calibrate.sh, about 2 minutes), as a 2-core VM moves between hosts
#   of different speeds; or a built-in name (cpu-2core: this project's
#   development machine as calibrated on 2026-11-23) or a profile file.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-here}
steps=${2:-12}
dtype=${3:-float32}
[[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "bench/estimate.sh: STEPS must be a positive integer" >&2; exit 2; }
[ -x build/meshtrain ] || scripts/setup.sh build
source bench/bench_model.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bench_text "$work/text.txt"
profile=$(bench_profile "$profile" "$work")
model=(--config configs/debug.toml --model.n_layers 4 --model.n_heads 8 --model.n_kv_heads 8 --data.seq_len 256
       --data.batch_size 8 --data.path "$work/text.txt" --checkpoint.folder "" --training.dtype "$dtype")
rounds=${ROUNDS:-3}
layouts=("FSDP4:--parallel.dp_shard 4" "DP2xTP2:--parallel.dp_shard 2 --parallel.tp 2")
echo "profile $profile, $dtype, $steps steps after 3 warm-up steps, $rounds rounds, $(nproc) cores"
for round in $(seq "$rounds"); do
  for layout in "${layouts[@]}"; do
    name=${layout%%:*}
    read -r -a flags <<< "${layout#*:}"
    [ "$round" -gt 1 ] || build/meshtrain estimate "${model[@]}" "${flags[@]}" --ranks 4 --hardware "$profile" --json > "$work/est_$name.json"
    scripts/mpirun.sh -np 4 build/meshtrain train "${model[@]}" "${flags[@]}" --training.steps $((steps + 3)) \
      --schedule.estimate benchmark --schedule.hardware "$profile" \
      --metrics.file "$work/m_${name}_$round.jsonl" --metrics.log_every 1 > "$work/train.log"
  done
done
python3 - "$work" "$steps" "${layouts[@]%%:*}" <<'PY'
import glob, json, statistics, sys
work, steps, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"{'layout':<10} {'roofline':>9} {'ratio':>6} {'benchmark (per round)':>30} {'ratio':>6} {'measured ms (per round)':>34}   {'est. MiB':>9} {'measured':>9} {'ratio':>7}")
for name in names:
    est = json.load(open(f"{work}/est_{name}.json"))
    per_round, benchmark, peak = [], [], 0
    for path in sorted(glob.glob(f"{work}/m_{name}_*.jsonl")):
        rows = [json.loads(l) for l in open(path)][-steps:]
        per_round.append(statistics.median(r["step_ms"] for r in rows))
        benchmark.append(rows[-1]["estimated_step_ms"])
        peak = max(peak, max(r["step_peak_bytes"] for r in rows) / 2**20)
    ms = statistics.median(per_round)
    est_ms, est_mib = est["time"]["step_us"] / 1e3, est["memory"]["peak_bytes"] / 2**20
    bench_ms = statistics.median(benchmark)
    rounds = " ".join(f"{t:.0f}" for t in per_round)
    bench_rounds = " ".join(f"{t:.0f}" for t in benchmark)
    print(f"{name:<10} {est_ms:9.1f} {est_ms / ms:6.3f} {bench_ms:7.1f} ({bench_rounds:>20}) {bench_ms / ms:6.3f} {ms:9.1f} ({rounds:>22})   {est_mib:9.2f} {peak:9.2f} {est_mib / peak:7.3f}")
PY
