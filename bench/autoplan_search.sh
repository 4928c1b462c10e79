#!/usr/bin/env bash
# `meshtrain autoplan`'s search time and its screen, same run: Llama 3.1 8B
# (configs/llama3_8b.toml, global batch BATCH, default 128) on RANKS ranks
# (default 64) of h100-sxm. Three searches: the default one (the screen on),
# --exhaustive (every plan estimated in full), and --exhaustive
# --check-screen (every costed plan's screen computed beside its full
# estimate). Printed: each search's seconds, plans costed and fastest plan;
# whether the screened search found the exhaustive one's best; and the
# screen's error against the full estimate, largest and median, for flat
# and pipelined plans (the screen drops a plan only when its step less 2%
# is no faster than the K best, so an error under 2% never drops a plan
# that the full estimate would keep).
# Usage: [RANKS=64] [BATCH=128] [THREADS=0] bench/autoplan_search.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${RANKS:-64}
batch=${BATCH:-128}
threads=${THREADS:-0}
[ -x build/meshtrain ] || scripts/setup.sh build
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
job=(--config configs/llama3_8b.toml --ranks "$ranks" --hardware h100-sxm --data.batch_size "$batch" --top 5
     --threads "$threads" --json)
echo "Llama 3.1 8B, batch $batch, on $ranks ranks of h100-sxm; $(nproc) cores, --threads $threads (0: all)"
build/meshtrain autoplan "${job[@]}" > "$work/screened.json" 2> /dev/null
build/meshtrain autoplan "${job[@]}" --exhaustive > "$work/exhaustive.json" 2> /dev/null
build/meshtrain autoplan "${job[@]}" --exhaustive --check-screen > "$work/checked.json" 2> /dev/null
python3 - "$work" <<'PY'
import json, statistics, sys
work = sys.argv[1]
runs = {name: json.load(open(f"{work}/{name}.json")) for name in ("screened", "exhaustive", "checked")}
for name in ("screened", "exhaustive"):
    r = runs[name]
    best = r["best"][0]
    print(f"{name:10s}: {r['seconds']:6.1f} s, {len(r['costed'])} plans costed of {r['layouts']} layouts; "
          f"best {best['tokens_per_s_per_device']:.0f} tokens/s: {best['command_line']}")
same = runs["screened"]["best"][0]["step_us"] == runs["exhaustive"]["best"][0]["step_us"]
print(f"the screened search's best is the exhaustive one's: {'yes' if same else 'NO'}")
errors = {"flat": [], "pipelined": []}
for c in runs["checked"]["costed"]:
    if "screen_step_us" not in c:
        continue
    kind = "pipelined" if int(c["overrides"].get("parallel.pp", "1")) > 1 else "flat"
    errors[kind].append((c["screen_step_us"] - c["step_us"]) / c["step_us"])
for kind, e in errors.items():
    if not e:
        print(f"screen, {kind}: no plan screened")
        continue
    worst = max(e, key=abs)
    over = sum(1 for x in e if x > 0.02)
    print(f"screen, {kind}: {len(e)} plans; error largest {100 * worst:+.3f}% (most above: {100 * max(e):+.3f}%), "
          f"median |error| {100 * statistics.median(abs(x) for x in e):.4f}%; above +2% (could drop a plan "
          f"wrongly): {over}")
PY
