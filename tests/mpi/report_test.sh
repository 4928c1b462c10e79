#!/usr/bin/env bash
# The run report of a 2-rank job (FSDP 2): rank 0 alone writes run.json and
# report.html beside the metrics (the job says so once); run.json holds both
# ranks' tables as the run ended, and the page shows both rows, the layout,
# and is valid, self-contained HTML (tests/cli/check_report_html.py).
# Usage: report_test.sh "MPIRUN [FLAGS]" MESHTRAIN SOURCE_DIR
source "$(dirname "$0")/common.sh"
out=$(timeout 120 $mpirun -np 2 "$meshtrain" train --config configs/debug.toml --model.dim 64 --model.n_layers 2 \
  --model.n_heads 4 --model.n_kv_heads 2 --model.ffn_dim 128 --data.seq_len 32 --training.steps 4 \
  --parallel.dp_shard 2 --checkpoint.folder "" --metrics.file "$dir/run/metrics.jsonl" 2>&1) ||
  { echo "$out"; fail "the 2-rank run exited non-zero"; }
[ "$(grep -c "^report: $dir/run/report.html" <<<"$out")" = 1 ] || { echo "$out"; fail "the report is not named once"; }
[ "$(ls "$dir/run")" = "$(printf 'metrics.jsonl\nreport.html\nrun.json')" ] || { ls -a "$dir/run"; fail "other files"; }
python3 tests/cli/check_report_html.py "$dir/run/report.html" || fail "report.html is not a valid page"
python3 - "$dir/run/run.json" "$dir/run/report.html" <<'PY' || exit 1
import json, sys
run = json.load(open(sys.argv[1]))
page = open(sys.argv[2]).read()
problems = []
if run["world_size"] != 2 or [r["rank"] for r in run["ranks"]] != [0, 1]:
    problems.append("run.json: world_size %s, ranks %s" % (run["world_size"], [r["rank"] for r in run["ranks"]]))
if run["ranks_when"] != "as the run ended" or not all(r["peak_bytes"] > 0 for r in run["ranks"]):
    problems.append("run.json: the ranks' tables are not the end's (%s)" % run["ranks_when"])
if "dp_shard" not in run["layout"]:
    problems.append("run.json: no layout: %r" % run["layout"])
for coordinate in ("dp_shard 0", "dp_shard 1"):
    if "<td>%s</td>" % coordinate not in page:
        problems.append("report.html: no row of %s" % coordinate)
if "<h2>Layout</h2>\n<p>2 ranks.</p>" not in page:
    problems.append("report.html: no layout of 2 ranks")
if problems:
    sys.exit("FAIL: " + "; ".join(problems))
PY
echo "PASS: one report of the 2-rank run, with both ranks' tables"
