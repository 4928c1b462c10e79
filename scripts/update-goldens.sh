#!/usr/bin/env bash
# Regenerate the golden files of tests/golden/ with MESHTRAIN (default
# build/meshtrain) and print their diff against the committed ones. The
# golden test (ctest -R lower_golden) never rewrites them; this script is the
# only way. Read the diff before committing it: the test also derives, in code,
# the collectives the layout implies (tests/golden/lower_golden_test.sh), so
# the script then runs the test on what it wrote, and a change in the counts
# fails until that derivation is changed too, with its reason.
#   scripts/update-goldens.sh [MESHTRAIN]
set -euo pipefail
meshtrain=${1:-build/meshtrain}
[[ "$meshtrain" = */* ]] || meshtrain=./$meshtrain
[ -x "$meshtrain" ] || { echo "update-goldens.sh: no executable $meshtrain (build it, or name it)" >&2; exit 2; }
meshtrain=$(realpath "$meshtrain")
cd "$(dirname "$0")/.."
# shellcheck source=tests/golden/lower_golden_args.sh
source tests/golden/lower_golden_args.sh
out=$("$meshtrain" "${golden_args[@]}")
if diff -u "$golden_file" <(printf '%s\n' "$out"); then
  echo "unchanged: $golden_file"
  exit 0
fi
printf '%s\n' "$out" > "$golden_file"
echo "updated $golden_file (the diff above); the golden test on it:"
if ! result=$(tests/golden/lower_golden_test.sh "$meshtrain" "$PWD" 2>&1); then
  echo "$result"
  echo "update-goldens.sh: the collective counts above differ from the derivation in tests/golden/lower_golden_test.sh;" \
    "if the change is meant, change the derivation (and docs/architecture.md's account of the golden) with the reason" >&2
  exit 1
fi
tail -n 1 <<<"$result"
