#!/usr/bin/env bash
# Build the libFuzzer targets (fuzz/, clang with AddressSanitizer and UBSan)
# and run each for SECONDS (default 600), as many at once as there are cores.
#   scripts/fuzz.sh                  every fuzzer, 10 minutes each
#   scripts/fuzz.sh 10               every fuzzer, 10 seconds each (the test suite and CI do this:
#                                    mostly the seeds replayed and a few mutations, a smoke test)
#   scripts/fuzz.sh 60 layout config some of them
#   scripts/fuzz.sh 3600             the weekly run: an hour each (11 fuzzers: 6 hours on 2 cores,
#                                    1 hour on 11 or more); keep build-fuzz/corpus/ from one week to
#                                    the next, so that each run goes on from what the last one found
# Fuzzers: config safetensors token_shard layout fr_dump hardware checkpoint pp_schedule
# pp_builtin checkpoint_metadata report. Each starts from its seeds in fuzz/corpus/NAME (which
# hold the inputs of crashes found and fixed)
# and keeps what it finds in build-fuzz/corpus/NAME. A crash, a hang (over 10 s
# on one input), a leak or a sanitizer report fails the run; its input is kept
# under build-fuzz/artifacts/ and the line to reproduce it is printed.
# First, in a second or so, the harness itself is checked on a planted bug
# (fuzz/planted_assert_fuzzer.cpp, never fuzzed): an MT_CHECK's error must be
# accepted as a clear rejection, an MT_ASSERT's internal error must crash.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: SECONDS must be a positive integer, got '$seconds'" >&2; exit 2; }
all=(config safetensors token_shard layout fr_dump hardware checkpoint pp_schedule pp_builtin checkpoint_metadata report)
names=("$@")
((${#names[@]})) || names=("${all[@]}")
for n in "${names[@]}"; do
  [[ " ${all[*]} " == *" $n "* ]] || { echo "fuzz.sh: no fuzzer '$n' (there are: ${all[*]})" >&2; exit 2; }
done

source scripts/install-packages.sh
install_missing_packages clang libclang-rt-14-dev cmake make libopenmpi-dev libtomlplusplus-dev nlohmann-json3-dev \
  libfmt-dev
cmake -S fuzz -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target "${names[@]/%/_fuzzer}" planted_assert_fuzzer >/dev/null

# The harness: a planted MT_CHECK ('C') must exit 0, a planted MT_ASSERT ('A')
# must crash (the uncaught InternalError: libFuzzer's "deadly signal").
check_harness() {
  local dir=build-fuzz/planted status=0
  mkdir -p "$dir"
  printf 'C' >"$dir/check_input"
  printf 'A' >"$dir/assert_input"
  if ! build-fuzz/planted_assert_fuzzer -artifact_prefix="$dir/" "$dir/check_input" >"$dir/check.log" 2>&1; then
    echo "fuzz.sh: the harness failed on a planted MT_CHECK, a clear error it must accept (log: $dir/check.log)" >&2
    return 1
  fi
  build-fuzz/planted_assert_fuzzer -artifact_prefix="$dir/" "$dir/assert_input" >"$dir/assert.log" 2>&1 || status=$?
  if [ "$status" -eq 0 ] || ! grep -q 'planted internal error' "$dir/assert.log"; then
    echo "fuzz.sh: the harness did not crash on a planted MT_ASSERT (exit $status): internal errors would pass as" \
      "clear errors (log: $dir/assert.log)" >&2
    return 1
  fi
  echo "harness ok: a planted MT_CHECK is a clear rejection, a planted MT_ASSERT crashes (exit $status)"
}
check_harness || exit 1

mkdir -p build-fuzz/artifacts build-fuzz/logs
run_one() {
  local n=$1 corpus=build-fuzz/corpus/$1
  mkdir -p "$corpus"
  # -timeout: one input may take 10 s at most; -rss_limit_mb: 2 GiB of memory.
  build-fuzz/${n}_fuzzer "$corpus" "fuzz/corpus/$n" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$n-" >"build-fuzz/logs/$n.log" 2>&1
}
echo "fuzzing ${names[*]} for $seconds s each, $(nproc) at a time"
declare -A pid_of
failed=()
report() {  # name: its result, executions and coverage
  local n=$1 status=$2 log=build-fuzz/logs/$1.log
  local runs cov ft
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  if [ "$status" -eq 0 ]; then
    printf '  %-12s ok     %10s executions  coverage: %s edges, %s features\n' "$n" "${runs:-?}" "${cov:-?}" "${ft:-?}"
  else
    failed+=("$n")
    printf '  %-12s FAILED (exit %s) after %s executions; from its log:\n' "$n" "$status" "${runs:-?}"
    grep -E 'ERROR|SUMMARY|what\(\)|Test unit written' "$log" | head -8 | sed 's/^/      /'
    local input
    input=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    [ -z "$input" ] || echo "      reproduce: build-fuzz/${n}_fuzzer $input"
  fi
}
for n in "${names[@]}"; do
  while (($(jobs -rp | wc -l) >= $(nproc))); do sleep 1; done
  run_one "$n" &
  pid_of[$n]=$!
done
for n in "${names[@]}"; do
  status=0
  wait "${pid_of[$n]}" || status=$?
  report "$n" "$status"
done
if ((${#failed[@]})); then
  echo "fuzz.sh: ${#failed[@]} fuzzer(s) failed: ${failed[*]} (logs in build-fuzz/logs/)" >&2
  exit 1
fi
