#!/usr/bin/env bash
# Usage: timeout_test.sh "MPIRUN [FLAGS]" FAULT_PROGRAM MESHTRAIN
set -u
mpirun=$1 prog=$2 meshtrain=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
start=$(date +%s)
out=$(MESHTRAIN_FR_DIR=$dir timeout 90 $mpirun -np 4 -x MESHTRAIN_FR_DIR "$prog" 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "$out"
echo "--- mpirun exit $rc after ${elapsed}s"
[ $rc -ne 124 ] || fail "the job hung and was killed after 90 s"
[ $rc -ne 0 ] || fail "the job exited 0; the timed-out ranks should have ended it"
[ $elapsed -lt 30 ] || fail "the job took ${elapsed}s to end (timeout 2 s + dump grace 2 s)"
for r in 0 2 3; do
  grep -q "TIMEOUT-OK rank $r after" <<<"$out" || fail "rank $r did not raise TimeoutError"
done
grep -q "all_reduce (seq 4) on group 'world' (4 ranks) timed out after 2000 ms" <<<"$out" \
  || fail "the error does not name op, seq and group"
for r in 0 1 2 3; do [ -s "$dir/fr_rank$r.json" ] || fail "rank $r left no flight-recorder dump"; done
report=$("$meshtrain" fr-analyze "$dir")
arc=$?
echo "$report"
[ $arc -eq 1 ] || fail "fr-analyze exited $arc, expected 1 (mismatch found)"
grep -q "FIRST MISMATCH: group 'world' seq 4 all_reduce: rank 1 never joined" <<<"$report" \
  || fail "fr-analyze did not name rank 1"
sleep 1
# Zombies (exited, waiting for a parent to reap them) are not running processes.
live=$(ps -C mpi_fault_test -o pid=,stat= | awk '$2 !~ /^Z/')
[ -z "$live" ] || fail "processes left running: $live"

echo PASS
