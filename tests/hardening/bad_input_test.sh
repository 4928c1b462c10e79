#!/usr/bin/env bash
# Bad input to every command is a clear error (issue 15): exit code 1 or 2,
# never a signal, a hang or a silently wrong answer, and a message that names
# what was wrong. Each case: the words the message must hold, then the
# command line. Work proportional to a number typed (a mesh of 30000 ranks)
# must finish at once.
# Usage: bad_input_test.sh MESHTRAIN SOURCE_DIR
set -u
meshtrain=$1 src=$2
cd "$src"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
# expect_error WORDS ARGS...: the command fails with 1 or 2 within 20 s, saying WORDS.
expect_error() {
  local words=$1
  shift
  local out rc
  out=$(timeout 20 "$meshtrain" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne 1 ] && [ "$rc" -ne 2 ]; then
    echo "FAIL (exit $rc, expected 1 or 2): meshtrain $*"; echo "$out" | tail -3; failures=$((failures + 1))
  elif ! grep -qF -- "$words" <<<"$out"; then
    echo "FAIL (message lacks '$words'): meshtrain $*"; echo "$out" | tail -3; failures=$((failures + 1))
  fi
}
# expect_fast WORDS ARGS...: the command succeeds within 5 s, printing WORDS.
expect_fast() {
  local words=$1
  shift
  local out rc
  out=$(timeout 5 "$meshtrain" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne 0 ] || ! grep -qF -- "$words" <<<"$out"; then
    echo "FAIL (exit $rc, or no '$words' within 5 s): meshtrain $*"; echo "$out" | tail -3; failures=$((failures + 1))
  fi
}

# Sizes from input (class 1).
expect_error "more elements than" plan --mesh 2 --shape 1000000,1000000,1000000,100 --from "S(0)" --to R
expect_error "is more elements than a step can hold" train --config configs/debug.toml --data.batch_size 4294967296 \
  --data.seq_len 4294967296
expect_error "more than 16777216 ranks" layout --mesh 65536,65536 --shape 8 --placements "S(0)R"
expect_error "'x' is not an integer" layout --mesh 4,x --shape 8 --placements "S(0)"
expect_error "--shape '8,-1' has a negative size" layout --mesh 4 --shape 8,-1 --placements "S(0)"
expect_error "lower: --ranks 4294967298 must be between 1 and 131072" lower --ranks 4294967298 --config configs/debug.toml
expect_error "estimate: --ranks 131073 must be between 1 and 131072" estimate --ranks 131073 --config configs/debug.toml \
  --hardware h100-sxm
# Work proportional to a number typed (class 6): a dim of 2^40 is a dim.
expect_fast "29999  [29999]" layout --mesh 30000 --shape 8 --placements "S(0)"
expect_fast "[1,1099511627776] [3,0]" layout --mesh 4 --shape 4,1099511627776 --placements "S(0)"
expect_fast "[183251937962]   [733007757142]" layout --mesh 2,3 --shape 1099511627776 --placements "_S(0, 20000004)S(0)"
# Messages that mislead (class 7).
mkdir -p "$dir/a_folder"
expect_error "is not a file" train --config "$dir/a_folder"
expect_error "does not exist" train --config "$dir/missing.toml"
printf 'name = "x"\n[device]\npeak_gflops_f32 = 100\nmemory_gbps = 1e-300\n' >"$dir/slow.toml"
expect_error "device.memory_gbps must be a number of at least 1e-06" estimate --config configs/debug.toml --ranks 2 \
  --hardware "$dir/slow.toml"

if [ "$failures" -ne 0 ]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "every bad input was a clear error; the large numbers took no time"
