#!/usr/bin/env bash
# `meshtrain autoplan` against measurement, same run: for the benchmark
# model (Llama dim 256, 4 layers, 8 heads, seq 256, batch 8) and the debug
# model (configs/debug.toml: dim 256, 6 layers, 16 heads, seq 128, batch 8)
# on 4 ranks, autoplan ranks every plan on a hardware profile of this
# machine; TOP of them (default 12) of distinct estimates, spread evenly over
# its ranking from its first, are then trained under mpirun (STEPS steps
# after 3 warm-up steps, the median step; ROUNDS runs of each, the plans
# alternating, the median of those, as this host's step times vary by +-30%
# from run to run). Printed per model: every plan's estimated and measured
# step, the Spearman rank correlation between them (target >= 0.8), and the
# measured step of the plan ranked first against the fastest measured
# (target within 10%). With 2 rounds or more it also prints how well the
# measurement agrees with itself: the mean Spearman correlation between the
# rounds' step times, a ceiling on what any estimate can reach against them.
# KEEP=DIR keeps the profile, autoplan's JSON, the plans and every run's
# metrics there (the estimate can then be re-checked against them).
# Usage: [ROUNDS=2] [TOP=12] [KEEP=DIR] bench/autoplan.sh [PROFILE] [STEPS]
#   PROFILE: `here` (the default: bench/calibrate.sh measures this host first,
#   about 2 minutes), a built-in name (cpu-2core) or a profile file.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-here}
steps=${2:-6}
rounds=${ROUNDS:-2}
top=${TOP:-12}
[[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "bench/autoplan.sh: STEPS must be a positive integer" >&2; exit 2; }
[ -x build/meshtrain ] || scripts/setup.sh build
source bench/bench_model.sh
if [ -n "${KEEP:-}" ]; then
  mkdir -p "$KEEP"
  work=$(cd "$KEEP" && pwd)
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
echo "profile $profile; 4 ranks on $(nproc) cores; $steps steps after 3 warm-up steps, $rounds rounds; top $top"
for name in bench debug; do
  declare -n model=$name
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
      scripts/mpirun.sh -np 4 build/meshtrain train "${model[@]}" $plan --training.steps $((steps + 3)) \
        --metrics.file "$work/$name.$index.$round.jsonl" < /dev/null > "$work/$name.$index.$round.log" 2>&1 ||
        { echo "plan $index failed: $plan"; tail -5 "$work/$name.$index.$round.log"; exit 1; }
    done < "$work/$name.plans"
  done
  python3 - "$work" "$name" "$steps" "$rounds" <<'PY'
import json, statistics, sys
work, name, steps, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
best = json.load(open(f"{work}/{name}.picked.json"))["best"]
def per_round(i):  # plan i's median step in each round
    runs = []
    for r in range(1, rounds + 1):
        rows = [json.loads(l) for l in open(f"{work}/{name}.{i}.{r}.jsonl")]
        runs.append(statistics.median(x["step_ms"] for x in rows[-steps:]))
    return runs
est = [p["step_us"] / 1e3 for p in best]
by_round = [per_round(i + 1) for i in range(len(best))]
meas = [statistics.median(runs) for runs in by_round]
def ranks(xs):  # average ranks for ties
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r
def spearman(a, b):
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    return cov / (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
print(f"{'#':>3} {'estimated ms':>12} {'measured ms':>11} {'rounds ms':>{7 * rounds}}  plan")
for i, p in enumerate(best):
    each = " ".join(f"{x:6.1f}" for x in by_round[i])
    print(f"{i + 1:>3} {est[i]:>12.1f} {meas[i]:>11.1f} {each:>{7 * rounds}}  {p['command_line'] or '(the config as it is)'}")
rho = spearman(est, meas)
first = meas[0] / min(meas)
print(f"{name}: Spearman rank correlation {rho:.3f} (target >= 0.8); the plan ranked first measures "
      f"{first:.3f}x the fastest measured (target <= 1.10)")
if rounds >= 2:
    # The measurement against itself: every pair of rounds' step times, ranked.
    pairs = [spearman([runs[a] for runs in by_round], [runs[b] for runs in by_round])
             for a in range(rounds) for b in range(a + 1, rounds)]
    spread = statistics.median((max(runs) - min(runs)) / statistics.median(runs) for runs in by_round)
    print(f"{name}: the rounds agree with each other at Spearman {statistics.mean(pairs):.3f} (mean of "
          f"{len(pairs)} pairs; {min(pairs):.3f} to {max(pairs):.3f}); a plan's rounds spread by "
          f"{100 * spread:.1f}% of its step at the median")
PY
done
