#!/usr/bin/env bash
# The run report end to end: `meshtrain train` with metrics.file writes
# run.json and report.html beside the metrics; `meshtrain report RUN_DIR -o`
# writes the page again elsewhere; both are valid, self-contained HTML
# (check_report_html.py) holding the final loss; a run that fails still
# writes its report, saying why. Refused with a clear error
# (exit 2): -o naming the metrics file or run.json, a metrics line that is
# not JSON (named by line), a folder that is no run. A metrics file cut off
# in its last line (a killed run) still gives a page, with a warning.
# Usage: report_test.sh MESHTRAIN SOURCE_DIR
set -u
meshtrain=$1 src=$2
cd "$src"
dir=$(mktemp -d)
trap '[ -n "${job:-}" ] && kill -9 $job 2>/dev/null; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
check_html() { python3 tests/cli/check_report_html.py "$1" || fail "$1 is not a valid self-contained page"; }
# expect_error WORDS ARGS...: meshtrain ARGS exits 2 saying WORDS.
expect_error() {
  local words=$1 out rc
  shift
  out=$("$meshtrain" "$@" 2>&1)
  rc=$?
  [ $rc -eq 2 ] && grep -qF -- "$words" <<<"$out" || { echo "$out"; fail "meshtrain $*: exit $rc, expected 2 saying '$words'"; }
}

run=$dir/run
out=$("$meshtrain" train --config configs/debug.toml --model.dim 64 --model.n_layers 2 --model.n_heads 4 \
  --model.n_kv_heads 2 --model.ffn_dim 128 --data.seq_len 32 --training.steps 5 --metrics.log_every 1 \
  --checkpoint.folder "" --metrics.file "$run/metrics.jsonl" 2>&1) || { echo "$out"; fail "train exited non-zero"; }
grep -qF "report: $run/report.html" <<<"$out" || { echo "$out"; fail "train does not name its report"; }
[ -s "$run/run.json" ] && [ -s "$run/report.html" ] || fail "train wrote no run.json or report.html beside the metrics"
check_html "$run/report.html"
loss=$(python3 -c 'import json,sys; print("%.4f" % json.loads(open(sys.argv[1]).read().splitlines()[-1])["loss"])' \
  "$run/metrics.jsonl")
grep -qF "$loss at step 5" "$run/report.html" || fail "report.html lacks the final loss $loss at step 5"
grep -qF '"status": "finished: 5 steps run"' "$run/run.json" || { cat "$run/run.json"; fail "run.json does not say the run finished"; }

out=$("$meshtrain" report "$run" -o "$dir/other.html" 2>&1) || { echo "$out"; fail "report -o exited non-zero"; }
grep -qF "report: 5 logged steps of $run to $dir/other.html" <<<"$out" || { echo "$out"; fail "report says nothing of its page"; }
check_html "$dir/other.html"
cmp -s "$run/report.html" "$dir/other.html" || fail "report rewrote the page train wrote otherwise"

expect_error "is also the metrics file" report "$run" -o "$run/metrics.jsonl"
expect_error "is also RUN_DIR's run.json" report "$run" -o "$run/run.json"
expect_error "is not a folder" report "$dir/none"
expect_error "holds neither run.json nor metrics.jsonl" report "$dir"
expect_error "metrics.file $dir/x/run.json: run.json is the name of a file" train --config configs/debug.toml \
  --training.steps 1 --metrics.file "$dir/x/run.json"

# A run that fails (a diverging step) still ends with its report, saying why.
out=$("$meshtrain" train --config configs/debug.toml --model.dim 64 --model.n_layers 2 --model.n_heads 4 \
  --model.n_kv_heads 2 --model.ffn_dim 128 --data.seq_len 32 --training.steps 6 --metrics.log_every 1 \
  --optimizer.lr 1e20 --lr_scheduler.warmup_steps 0 --checkpoint.folder "" --metrics.file "$dir/failed/m.jsonl" 2>&1)
[ $? -eq 2 ] || { echo "$out"; fail "the diverging run did not fail"; }
grep -qF '"status": "failed: step ' "$dir/failed/run.json" || { cat "$dir/failed/run.json"; fail "run.json does not say the run failed"; }
grep -qF "<td>failed: step " "$dir/failed/report.html" || fail "the failed run's report does not say it failed"
check_html "$dir/failed/report.html"

# A killed run: its last line cut off. A page, and a warning naming the line.
cp -r "$run" "$dir/killed"
printf '{"step": 6, "loss": 3.' >> "$dir/killed/metrics.jsonl"
out=$("$meshtrain" report "$dir/killed" 2>&1) || { echo "$out"; fail "report of a cut-off metrics file exited non-zero"; }
grep -qF "metrics.jsonl line 6: the last line is cut off" <<<"$out" || { echo "$out"; fail "no warning of the cut-off line"; }
check_html "$dir/killed/report.html"
# Garbage inside: refused, naming the file and line; the earlier page is left as it was.
sed -i '3s/.*/garbage/' "$dir/killed/metrics.jsonl"
before=$(md5sum < "$dir/killed/report.html")
expect_error "$dir/killed/metrics.jsonl line 3: not JSON" report "$dir/killed"
[ "$(md5sum < "$dir/killed/report.html")" = "$before" ] || fail "a refused report replaced the page"
# A run stopped by SIGTERM whose report cannot be written (a folder took its name) still exits 128 + 15, warning.
mkdir -p "$dir/stopped"
"$meshtrain" train --config configs/debug.toml --model.dim 64 --model.n_layers 2 --model.n_heads 4 \
  --model.n_kv_heads 2 --model.ffn_dim 128 --data.seq_len 32 --training.steps 100000 --checkpoint.folder "" \
  --metrics.file "$dir/stopped/m.jsonl" > "$dir/stopped.out" 2>&1 &
job=$!
for _ in $(seq 300); do grep -q "^step" "$dir/stopped.out" && break; sleep 0.05; done
mkdir "$dir/stopped/report.html"
kill -TERM $job
wait $job
rc=$?
[ $rc -eq 143 ] || { cat "$dir/stopped.out"; fail "a stopped run whose report failed exited $rc, not 143"; }
grep -qF "warning: the run report was not written: cannot write $dir/stopped/report.html" "$dir/stopped.out" ||
  { cat "$dir/stopped.out"; fail "no warning that the report was not written"; }
echo "PASS: train's report, report -o, and its refusals"
