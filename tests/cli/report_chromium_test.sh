#!/usr/bin/env bash
# The run report in a browser: a run's page of 10,000 logged steps, with
# validation every 250 steps, rendered by headless Chromium: the screenshot is
# a PNG, and the page's text (Chromium's DOM) holds every chart's title and
# the final training and validation losses and the step's estimate. The page is valid, self-contained
# HTML under 2 MB (check_report_html.py). The run is a 2-step `meshtrain
# train`, its metrics then replaced by 10,000 made-up lines. Skipped (exit 77)
# where there is no Chromium (Debian's package chromium; scripts/setup.sh).
# Usage: report_chromium_test.sh MESHTRAIN SOURCE_DIR
set -u
meshtrain=$1 src=$2
cd "$src"
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome) ||
  { echo "SKIP: no chromium (apt-get install chromium)"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

run=$dir/run
out=$("$meshtrain" train --config configs/debug.toml --model.dim 64 --model.n_layers 2 --model.n_heads 4 \
  --model.n_kv_heads 2 --model.ffn_dim 128 --data.seq_len 32 --training.steps 2 --checkpoint.folder "" \
  --metrics.file "$run/metrics.jsonl" 2>&1) || { echo "$out"; fail "train exited non-zero"; }
python3 - "$run/metrics.jsonl" <<'PY'
import json, math, sys
with open(sys.argv[1], "w") as f:
    for s in range(1, 10001):
        line = {"step": s, "loss": 5 * math.exp(-s / 3000) + 0.05 * math.sin(s), "lr": 1e-3 * min(1, s / 500),
                "grad_norm": 1 + 0.5 * math.sin(s / 13), "step_ms": 30 + 5 * math.sin(s / 7), "tokens_per_s": 8000,
                "peak_bytes": 50 << 20, "step_peak_bytes": 30 << 20, "gflops_per_s": 2, "estimated_step_ms": 20,
                "skipped_steps": 0}
        if s % 250 == 0:
            line["val_loss"] = line["loss"] + 0.125
        f.write(json.dumps(line) + "\n")
PY
"$meshtrain" report "$run" >/dev/null || fail "report exited non-zero"
page=$run/report.html
python3 tests/cli/check_report_html.py "$page" 2000000 || fail "the 10,000-step page is not valid HTML under 2 MB"
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --user-data-dir="$dir/profile" --window-size=1200,3000 \
  --screenshot="$dir/page.png" "file://$page" >"$dir/shot.log" 2>&1 || { tail "$dir/shot.log"; fail "no screenshot"; }
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --user-data-dir="$dir/profile" --dump-dom "file://$page" \
  >"$dir/dom.html" 2>"$dir/dom.log" || { tail "$dir/dom.log"; fail "no DOM"; }
python3 - "$dir/page.png" "$dir/dom.html" "$run/metrics.jsonl" "$run/run.json" <<'PY' || exit 1
import json, sys
from html.parser import HTMLParser
png = open(sys.argv[1], "rb").read()
if not png.startswith(b"\x89PNG\r\n\x1a\n") or len(png) < 10000:
    sys.exit("FAIL: the screenshot is no PNG of a page (%d bytes)" % len(png))
class Text(HTMLParser):
    parts = []
    def handle_data(self, data):
        self.parts.append(data)
t = Text()
t.feed(open(sys.argv[2]).read())
text = " ".join(" ".join(t.parts).split())
lines = [json.loads(l) for l in open(sys.argv[3])]
val = [l for l in lines if "val_loss" in l][-1]
estimate = json.load(open(sys.argv[4]))["estimate"]["step_ms"]
wanted = ["Loss", "Learning rate", "Gradient norm", "Throughput", "Peak memory", "Step time",
          "Final training loss %.4f at step %d" % (lines[-1]["loss"], lines[-1]["step"]),
          "Final validation loss %.4f at step %d" % (val["val_loss"], val["step"]), "estimate %.1f ms" % estimate]
missing = [w for w in wanted if w not in text]
if missing:
    sys.exit("FAIL: the rendered page's text lacks %s" % missing)
PY
echo "PASS: Chromium rendered the 10,000-step report ($(stat -c %s "$page") bytes) with every chart and the final losses"
