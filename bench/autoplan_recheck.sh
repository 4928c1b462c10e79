#!/usr/bin/env bash
# Check the estimate again against a kept run of bench/autoplan.sh, without
# training: every plan that run trained is estimated again by this build
# (with PROFILE, default the profile that run estimated with), then compared
# with the steps that run measured, as bench/autoplan.sh compares them
# (bench/autoplan_compare.py). For trying a change to the estimator or the
# profile against measurements already taken.
# Usage: [MESHTRAIN=BINARY] bench/autoplan_recheck.sh KEEP_DIR [PROFILE]
#   KEEP_DIR: where `KEEP=KEEP_DIR bench/autoplan.sh` kept its run;
#   MESHTRAIN: the binary that estimates (default build/meshtrain).
set -euo pipefail
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: bench/autoplan_recheck.sh KEEP_DIR [PROFILE]" >&2; exit 2; }
keep=$(realpath -- "$1")
given_profile=${2:-}
[ -f "$given_profile" ] && given_profile=$(realpath -- "$given_profile")  # a file, not a built-in name
cd "$(dirname "$0")/.."
[ -f "$keep/run.txt" ] || { echo "bench/autoplan_recheck.sh: $keep is not a kept run of bench/autoplan.sh (no run.txt)" >&2; exit 2; }
meshtrain=${MESHTRAIN:-build/meshtrain}
[ -n "${MESHTRAIN:-}" ] || [ -x build/meshtrain ] || scripts/setup.sh build
read -r steps rounds kept_profile < "$keep/run.txt"
profile=${given_profile:-$kept_profile}
for name in bench debug; do
  mapfile -t model < "$keep/$name.flags"
  out="$keep/$name.recheck.json"
  while read -r plan; do
    # shellcheck disable=SC2086  # the plan's overrides are words
    "$meshtrain" estimate "${model[@]}" $plan --ranks 4 --hardware "$profile" --json |
      python3 -c 'import json, sys; print(json.load(sys.stdin)["time"]["step_us"] / 1e3)'
  done < "$keep/$name.plans" | python3 -c 'import json, sys; print(json.dumps([float(x) for x in sys.stdin]))' > "$out"
  echo "$name: estimated again with $profile"
  python3 bench/autoplan_compare.py "$keep" "$name" "$steps" "$rounds" "$out"
done
