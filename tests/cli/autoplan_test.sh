#!/usr/bin/env bash
# `meshtrain autoplan` end to end on the debug model and 4 ranks of the
# cpu-2core profile: the table lists the plans it says it does, fastest
# first, each with overrides that `meshtrain train` takes; --json holds the
# same plans; --out writes a config that trains under mpirun on 4 ranks and
# whose layout is the plan ranked first; and a rank count with no legal plan
# is one error, exit 1, with nothing written.
# Usage: autoplan_test.sh "MPIRUN [FLAGS]" MESHTRAIN SOURCE_DIR
set -u
mpirun=$1 meshtrain=$2 src=$3
cd "$src"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
args=(autoplan --config configs/debug.toml --ranks 4 --hardware cpu-2core --top 4)
"$meshtrain" "${args[@]}" --out "$dir/best.toml" > "$dir/text" 2> "$dir/err" || { cat "$dir/text" "$dir/err"; fail "autoplan exited non-zero"; }
"$meshtrain" "${args[@]}" --json > "$dir/json" 2> /dev/null || fail "autoplan --json exited non-zero"
python3 - "$dir" <<'PY' || fail "the table and the JSON disagree"
import json, re, sys
d = sys.argv[1]
text = open(f"{d}/text").read().splitlines()
doc = json.load(open(f"{d}/json"))
rows = [l for l in text if re.match(r"^\s+\d+\s+\d+", l)]
assert len(rows) == 4 == len(doc["best"]), (len(rows), len(doc["best"]))
steps = [p["step_us"] for p in doc["best"]]
assert steps == sorted(steps), steps
for row, plan in zip(rows, doc["best"]):
    shown = re.sub(r" \(estimated as #\d+\)$", "", row.rstrip())  # a plan that estimates as the one above
    assert shown.endswith(plan["command_line"] or "(the config as it is)"), (row, plan["command_line"])
    assert abs(float(row.split()[1]) - plan["tokens_per_s_per_device"]) < 1, row
assert any(l.startswith("the fastest plan is bound by ") for l in text), text
assert f"wrote the fastest plan to {d}/best.toml" in text[-1], text[-1]
reasons = {x["reason"].split(":")[0] for x in doc["dropped"]}
assert doc["complete"] and doc["layouts"] == doc["layouts_searched"] > 0, doc["layouts"]
print("table and JSON agree:", len(doc["costed"]), "costed,", len(doc["dropped"]), "dropped:", sorted(reasons)[:4])
PY
first=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["best"][0]["command_line"])' "$dir/json")
# The written config trains on 4 ranks, on the layout of the first plan.
$mpirun -np 4 "$meshtrain" train --config "$dir/best.toml" --data.path "$src/data/corpus.txt" --training.steps 2 \
  --checkpoint.folder "" --metrics.file "" > "$dir/train" 2>&1 < /dev/null || { cat "$dir/train"; fail "the --out config did not train"; }
# shellcheck disable=SC2086  # the plan's overrides are words
"$meshtrain" lower --config configs/debug.toml --ranks 4 $first > "$dir/lower_plan" 2>&1 || fail "lower with the first plan's overrides"
"$meshtrain" lower --config "$dir/best.toml" --ranks 4 > "$dir/lower_out" 2>&1 || fail "lower with the --out config"
cmp -s <(grep -v '^# \|config' "$dir/lower_plan") <(grep -v '^# \|config' "$dir/lower_out") ||
  fail "the --out config does not lower as the first plan's overrides do"
# No legal plan: 7 ranks, a batch of 4.
"$meshtrain" autoplan --config configs/debug.toml --ranks 7 --hardware cpu-2core --data.batch_size 4 --out "$dir/none.toml" > "$dir/none" 2>&1
rc=$?
[ $rc -eq 1 ] || { cat "$dir/none"; fail "no legal plan exited $rc, not 1"; }
grep -q "error: autoplan: no plan lays the config out on 7 ranks" "$dir/none" || { cat "$dir/none"; fail "no legal plan: the message"; }
[ "$(grep -c 'error:' "$dir/none")" -eq 1 ] || fail "no legal plan: the error said more than once"
[ ! -e "$dir/none.toml" ] || fail "no legal plan wrote --out"
# An --out that cannot be written is refused before the search: exit 2.
"$meshtrain" "${args[@]}" --out "$dir" > "$dir/folder" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "error: --out $dir is a folder" "$dir/folder" || { cat "$dir/folder"; fail "--out a folder: exit $rc"; }
grep -q "layouts searched\|tokens/s/dev" "$dir/folder" && fail "--out a folder: searched before refusing it"
echo "PASS: autoplan table, JSON, --out trained on 4 ranks, no-plan error, --out a folder refused"
