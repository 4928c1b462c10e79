#!/usr/bin/env bash
# `meshtrain autoplan` against measurement, same run: for the benchmark
# model (Llama dim 256, 4 layers, 8 heads, seq 256, batch 8) and the debug
# model (configs/debug.toml: dim 256, 6 layers, 16 heads, seq 128, batch 8)
# on 4 ranks, autoplan ranks every plan on a hardware profile of this
# machine; TOP of them (default 12) of distinct estimates, spread evenly over
# its ranking from its first, are then trained under mpirun (STEPS steps
# after 3 warm-up steps, the median step; ROUNDS runs of each, the plans
# alternating, the median of those). Each rank is bound to a core, two to a
# core (bench_model.sh's bind_ranks): unbound, a plan's runs varied by
# +-30%; bound, by about 9%. Printed per model: every plan's estimated and measured
# step, the Spearman rank correlation between them (target >= 0.8), and the
# measured step of the plan ranked first against the fastest measured
# (target within 10%). With 2 rounds or more it also prints how well the
# measurement agrees with itself: the mean Spearman correlation between the
# rounds' step times, a ceiling on what any estimate can reach against them.
# KEEP=DIR keeps the profile, autoplan's JSON, the plans and every run's
# metrics there (the estimate can then be re-checked against them).
# Usage: [ROUNDS=3] [TOP=12] [KEEP=DIR] bench/autoplan.sh [PROFILE] [STEPS]
#   PROFILE: `here` (the default: bench/calibrate.sh measures this host first,
#   about 2 minutes), a built-in name (cpu-2core) or a profile file.
set -euo pipefail
keep=${KEEP:+$(mkdir -p "$KEEP" && realpath -- "$KEEP")}
cd "$(dirname "$0")/.."
profile=${1:-here}
steps=${2:-8}
rounds=${ROUNDS:-3}
top=${TOP:-12}
[[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "bench/autoplan.sh: STEPS must be a positive integer" >&2; exit 2; }
[ -x build/meshtrain ] || scripts/setup.sh build
source bench/bench_model.sh
if [ -n "$keep" ]; then
  work=$keep
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
bench_text "$work/text.txt"
profile=$(bench_profile "$profile" "$work")
common=(--data.path "$work/text.txt" --checkpoint.folder "" --metrics.log_every 1)
bench=(--config configs/debug.toml --model.n_layers 4 --model.n_heads 8 --model.n_kv_heads 8 --data.seq_len 256
       --data.batch_size 8 "${common[@]}")
debug=(--config configs/debug.toml "${common[@]}")
echo "$steps $rounds $profile" > "$work/run.txt"  # for bench/autoplan_recheck.sh
echo "profile $profile; 4 ranks on $(nproc) cores; $steps steps after 3 warm-up steps, $rounds rounds; top $top"
for name in bench debug; do
  declare -n model=$name
  printf '%s\n' "${model[@]}" > "$work/$name.flags"
  build/meshtrain autoplan "${model[@]}" --ranks 4 --hardware "$profile" --top 1000 --json \
    > "$work/$name.json" 2> "$work/$name.autoplan.log"
  # TOP plans of distinct estimates spread evenly over autoplan's ranking of every plan that fits, its first
  # among them (the fastest few alone lie within a few percent, closer than this host's noise).
  python3 - "$work/$name.json" "$top" > "$work/$name.picked.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1])); top = int(sys.argv[2])
ranked, seen = [], set()
for p in doc["best"]:
    key = round(p["step_us"], 1)
    if key not in seen:
        seen.add(key); ranked.append(p)
n = min(top, len(ranked))
picked = [ranked[round(i * (len(ranked) - 1) / max(n - 1, 1))] for i in range(n)]
print(json.dumps({"seconds": doc["seconds"], "fitting": len(doc["best"]), "best": picked}))
PY
  python3 -c 'import json,sys; [print(p["command_line"]) for p in json.load(open(sys.argv[1]))["best"]]' \
    "$work/$name.picked.json" > "$work/$name.plans"
  echo "$name: autoplan ranked $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["fitting"], "plans in", round(d["seconds"], 1))' "$work/$name.picked.json") s; $(wc -l < "$work/$name.plans") picked"
  for round in $(seq "$rounds"); do
    index=0
    while read -r plan; do
      index=$((index + 1))
      # shellcheck disable=SC2086  # the plan's overrides are words
      scripts/mpirun.sh "${bind_ranks[@]}" -np 4 build/meshtrain train "${model[@]}" $plan \
        --training.steps $((steps + 3)) \
        --metrics.file "$work/$name.$index.$round.jsonl" < /dev/null > "$work/$name.$index.$round.log" 2>&1 ||
        { echo "plan $index failed: $plan"; tail -5 "$work/$name.$index.$round.log"; exit 1; }
    done < "$work/$name.plans"
  done
  python3 bench/autoplan_compare.py "$work" "$name" "$steps" "$rounds"
done
