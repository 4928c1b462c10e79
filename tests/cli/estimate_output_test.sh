#!/usr/bin/env bash
# `meshtrain estimate`'s successful output, checked against figures counted by
# hand for the debug model (configs/debug.toml: dim 256, 6 layers, 16 heads
# and 16 kv heads, ffn 768, vocab 256, untied head; batch 8 x seq 128) on
# FSDP 2 x TP 2 (4 ranks) of h100-sxm, rank 0:
#   - FLOPs per token (torchtitan's formula): a layer's q, k, v, o 4 x 256 x
#     256 = 262144 and w1, w2, w3 3 x 768 x 256 = 589824 and two norms 512:
#     852480; 6 layers 5114880, the final norm 256 and the head 65536: 5180672
#     parameters but the embedding's; 6 x 5180672 + 12 x 6 layers x 16 heads x
#     16 head_dim x 128 tokens = 31084032 + 2359296 = 33443328.
#   - Parameters held by rank 0: the 2D weights (5180672 + 65536 embedding -
#     13 norms x 256) over 4 ranks, the 13 norms over dp_shard 2 only (TP
#     replicates them): (5242880 / 4 + 3328 / 2) x 4 bytes = 5249536; AdamW's
#     two f32 moments twice that; the inputs those three and the batch: rank
#     0's 4 x 128 tokens and targets (i64) and the lr (f64) and step (i64).
#   - Tokens/s per device: 1024 tokens a step over 4 devices over the step's
#     time; MFU those tokens' FLOPs over the H100's dense f32 peak (66.9 TFLOP/s).
# And the three outputs agree: the text's figures are the JSON's, the memory
# at the peak adds up to the peak, the step is its compute and its exposed
# communication, and the --trace timeline's compute track covers the step
# without overlaps and pairs a begin and an end for each of its collectives.
# Usage: estimate_output_test.sh MESHTRAIN SOURCE_DIR
set -u
meshtrain=$1 src=$2
cd "$src"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
args=(estimate --config configs/debug.toml --ranks 4 --parallel.tp 2 --hardware h100-sxm)
"$meshtrain" "${args[@]}" > "$dir/text" 2>&1 || { cat "$dir/text"; fail "estimate (text) exited non-zero"; }
"$meshtrain" "${args[@]}" --json --trace "$dir/trace.json" > "$dir/json" 2>&1 ||
  { cat "$dir/json"; fail "estimate --json --trace exited non-zero"; }
python3 - "$dir/text" "$dir/json" "$dir/trace.json" <<'PY' || exit 1
import json, math, re, sys
text = open(sys.argv[1]).read()
e = json.load(open(sys.argv[2]))
trace = json.load(open(sys.argv[3]))
failures = []
def expect(what, got, want, rel=0.0):
    ok = got == want if rel == 0 else abs(got - want) <= rel * abs(want)
    if not ok:
        failures.append(f"{what}: {got!r}, expected {want!r}" + (f" (within {rel:g})" if rel else ""))

flops_per_token = 6 * 5180672 + 12 * 6 * 16 * 16 * 128
params = (5242880 // 4 + 3328 // 2) * 4
expect("flops_per_token", e["flops_per_token"], flops_per_token)
expect("parameters at the peak", e["memory"]["at_peak"]["parameters"], params)
expect("optimizer states at the peak", e["memory"]["at_peak"]["optimizer states"], 2 * params)
expect("input_bytes", e["memory"]["input_bytes"], 3 * params + 2 * 4 * 128 * 8 + 8 + 8)
expect("tokens_per_step", e["tokens_per_step"], 1024)
step_s = e["time"]["step_us"] * 1e-6
expect("tokens_per_s_per_device", e["tokens_per_s_per_device"], 1024 / 4 / step_s, 1e-12)
expect("mfu", e["mfu"], flops_per_token * 1024 / 4 / step_s / 66.9e12, 1e-12)
expect("peak_gflops", e["peak_gflops"], 66900)
t = e["time"]
expect("step_us = compute + exposed", t["step_us"], t["compute_us"] + t["exposed_us"], 1e-12)
expect("the peak's kinds add up to the peak", sum(e["memory"]["at_peak"].values()), e["memory"]["peak_bytes"], 1e-12)
expect("fits", e["memory"]["fits"], e["memory"]["peak_bytes"] <= e["memory"]["device_bytes"])

# The text says the same figures, rounded as printed.
def number(pattern):
    m = re.search(pattern, text)
    if not m:
        failures.append(f"the text has no match for {pattern!r}")
        return math.nan
    return float(m.group(1))
expect("text: step us", number(r"time: step ([0-9.]+) us"), round(t["step_us"], 1))
expect("text: compute us", number(r"compute ([0-9.]+) us"), round(t["compute_us"], 1))
expect("text: exposed us", number(r"exposed ([0-9.]+) us"), round(t["exposed_us"], 1))
expect("text: tokens/s", number(r"([0-9]+) tokens/s per device"), round(e["tokens_per_s_per_device"]))
expect("text: MFU %", number(r"MFU ([0-9.]+)%"), round(100 * e["mfu"], 1))
expect("text: collectives", number(r"([0-9]+) collectives"), e["collectives"])
expect("text: peak MiB", number(r"memory: peak ([0-9.]+) MiB"), round(e["memory"]["peak_bytes"] / 2**20, 1))

# The trace: one compute track that runs the whole step, and each collective begun and ended once.
events = trace["traceEvents"]
spans = sorted((ev for ev in events if ev["ph"] == "X"), key=lambda ev: ev["ts"])
if not spans:
    failures.append("the trace has no compute spans")
else:
    expect("trace: compute spans on one track", {(ev["pid"], ev["tid"]) for ev in spans}, {(0, 1)})
    overlaps = sum(1 for a, b in zip(spans, spans[1:]) if b["ts"] < a["ts"] + a["dur"] - 1e-9 * t["step_us"])
    expect("trace: overlapping compute spans", overlaps, 0)
    expect("trace: the spans' total", sum(ev["dur"] for ev in spans), t["step_us"], 1e-9)
    expect("trace: the last span's end", max(ev["ts"] + ev["dur"] for ev in spans), t["step_us"], 1e-9)
begins = {ev["id"]: ev["ts"] for ev in events if ev["ph"] == "b"}
ends = {ev["id"]: ev["ts"] for ev in events if ev["ph"] == "e"}
expect("trace: collectives begun", len(begins), e["collectives"])
expect("trace: the collectives ended are those begun", sorted(ends), sorted(begins))
expect("trace: collectives ending before they begin", sum(1 for i in begins if ends.get(i, math.inf) < begins[i]), 0)

if failures:
    sys.exit("FAIL: meshtrain estimate:\n  " + "\n  ".join(failures))
print(f"PASS: estimate on FSDP 2 x TP 2: {flops_per_token} FLOPs/token, {params} parameter bytes on rank 0, "
      f"step {t['step_us']:.1f} us, MFU {100 * e['mfu']:.1f}%; the text, JSON and trace ({len(spans)} spans, "
      f"{len(begins)} collectives) agree")
PY
