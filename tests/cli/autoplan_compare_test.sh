#!/usr/bin/env bash
# bench/autoplan_compare.py against figures worked out by hand: a kept run
# of 4 plans over 3 rounds whose medians, rank correlations and rounds'
# agreement are known; estimates given in a file replace autoplan's; a
# count of estimates that does not match the plans is refused. Then
# bench/autoplan_recheck.sh on a kept run of 2 plans a model: its estimates
# are meshtrain estimate's.
# Usage: autoplan_compare_test.sh SOURCE_DIR MESHTRAIN
set -euo pipefail
src=$1
meshtrain=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Autoplan's estimates 10, 20, 30, 40 ms for plans "a".."d".
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
plans = [{"step_us": 1e3 * e, "command_line": f"--plan {n}"} for e, n in zip([10, 20, 30, 40], "abcd")]
json.dump({"best": plans}, open(f"{work}/m.picked.json", "w"))
# Each round's steps: plan i's 2 steps; the last 1 counts (STEPS=1).
rounds = {  # plan -> its counted step per round
    1: [100, 110, 105],  # median 105
    2: [200, 190, 220],  # median 200
    3: [400, 300, 350],  # median 350
    4: [300, 420, 330],  # median 330
}
for i, steps in rounds.items():
    for r, s in enumerate(steps, 1):
        with open(f"{work}/m.{i}.{r}.jsonl", "w") as f:
            f.write(json.dumps({"step_ms": 9999}) + "\n")  # a warm-up step, not counted
            f.write(json.dumps({"step_ms": s}) + "\n")
PY
out=$(python3 "$src/bench/autoplan_compare.py" "$work" m 1 3)
echo "$out"
# Measured medians 105, 200, 350, 330 rank 1, 2, 4, 3 against estimates 1, 2, 3, 4:
# rho = 1 - 6 * (1 + 1) / (4 * 15) = 0.8. The plan estimated fastest is the fastest measured.
grep -q "m: Spearman rank correlation 0.800 " <<< "$out" || fail "Spearman of autoplan's estimates"
grep -q "measures 1.000x the fastest measured" <<< "$out" || fail "first plan's ratio"
grep -qE "^  3 +30.0 +350.0 +400.0 +300.0 +350.0  --plan c$" <<< "$out" || fail "plan 3's row"
# Rounds: r1 = 100 200 400 300 (ranks 1 2 4 3), r2 = 110 190 300 420 (1 2 3 4),
# r3 = 105 220 350 330 (1 2 4 3): pairs 0.8, 1.0, 0.8; mean 0.867.
grep -q "agree with each other at Spearman 0.867 (mean of 3 pairs; 0.800 to 1.000)" <<< "$out" ||
  fail "rounds' agreement"

# Estimates from a file: 40, 30, 20, 10 reverse autoplan's order.
echo "[40, 30, 20, 10]" > "$work/est.json"
out=$(python3 "$src/bench/autoplan_compare.py" "$work" m 1 3 "$work/est.json")
grep -q "m: Spearman rank correlation -0.800 " <<< "$out" || fail "Spearman of estimates from a file"
# Estimated fastest: plan d, measured 330 against the fastest 105.
grep -q "measures 3.143x the fastest measured" <<< "$out" || fail "first plan from a file"

echo "[1, 2]" > "$work/short.json"
if python3 "$src/bench/autoplan_compare.py" "$work" m 1 3 "$work/short.json" > "$work/err" 2>&1; then
  fail "2 estimates for 4 plans accepted"
fi
grep -q "gives 2 estimates for 4 plans" "$work/err" || fail "message for a short estimates file: $(cat "$work/err")"

# A kept run of bench/autoplan.sh, 2 plans a model, 1 step, 2 rounds, on cpu-2core.
keep="$work/keep"
mkdir "$keep"
echo "1 2 cpu-2core" > "$keep/run.txt"
plans=("--parallel.dp_shard 4" "--parallel.dp_replicate 2 --parallel.dp_shard 1 --parallel.tp 2")
for name in bench debug; do
  printf '%s\n' --config configs/debug.toml --model.n_layers 2 > "$keep/$name.flags"
  printf '%s\n' "${plans[@]}" > "$keep/$name.plans"
  python3 - "$keep" "$name" "${plans[@]}" <<'PY'
import json, sys
keep, name, plans = sys.argv[1], sys.argv[2], sys.argv[3:]
json.dump({"best": [{"step_us": 1.0, "command_line": p} for p in plans]}, open(f"{keep}/{name}.picked.json", "w"))
for i, s in enumerate([100, 200], 1):
    for r in (1, 2):
        open(f"{keep}/{name}.{i}.{r}.jsonl", "w").write(json.dumps({"step_ms": s + r}) + "\n")
PY
done
out=$(MESHTRAIN="$meshtrain" "$src/bench/autoplan_recheck.sh" "$keep")
echo "$out"
grep -q "debug: estimated again with cpu-2core" <<< "$out" || fail "recheck's profile"
# shellcheck disable=SC2086  # the plan's overrides are words
direct=$(cd "$src" && "$meshtrain" estimate --config configs/debug.toml --model.n_layers 2 ${plans[1]} --ranks 4 \
  --hardware cpu-2core --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["time"]["step_us"] / 1e3)')
python3 - "$keep/debug.recheck.json" "$direct" <<'PY' || fail "recheck's estimates are not meshtrain estimate's"
import json, sys
est = json.load(open(sys.argv[1]))
assert len(est) == 2 and all(e > 0 for e in est), est
assert abs(est[1] - float(sys.argv[2])) <= 1e-9 * est[1], (est, sys.argv[2])
PY
grep -qE "^  2 +[0-9.]+ +201.5 +201.0 +202.0  --parallel.dp_replicate 2" <<< "$out" || fail "recheck's row of plan 2"
if MESHTRAIN="$meshtrain" "$src/bench/autoplan_recheck.sh" "$work" > "$work/err" 2>&1; then
  fail "a folder with no kept run accepted"
fi
grep -q "is not a kept run of bench/autoplan.sh" "$work/err" || fail "message for a folder with no kept run"
echo "autoplan_compare: all checks passed"
