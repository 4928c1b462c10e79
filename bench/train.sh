#!/usr/bin/env bash
# Single-rank training speed, meshtrain vs PyTorch (Debian's python3-torch),
# same model, batch and thread count, measured in the same run:
# Llama dim 256, 4 layers, 8 heads, vocab 256, seq 256, batch 8.
# Usage: bench/train.sh [THREADS] [STEPS] [float32|bfloat16]
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-$(nproc)}
steps=${2:-10}
dtype=${3:-float32}
[ -x build/meshtrain ] || scripts/setup.sh build
model='{"dim":256,"n_layers":4,"n_heads":8,"n_kv_heads":8,"ffn_dim":768,"vocab_size":256,"norm_eps":1e-5,"rope_theta":10000.0,"tie_embeddings":false,"seq_len":256,"batch_size":8}'
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head -c 400000 /dev/urandom | tr -dc 'a-z ' | head -c 200000 > "$work/text.txt" || true
OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads /usr/bin/time -f %M -o "$work/rss" build/meshtrain train --config configs/debug.toml \
  --model.n_layers 4 --model.n_heads 8 --model.n_kv_heads 8 --data.seq_len 256 --data.batch_size 8 \
  --data.path "$work/text.txt" --training.steps $((steps + 3)) --checkpoint.folder "" --metrics.file "$work/m.jsonl" \
  --metrics.log_every 1 --training.dtype "$dtype" > "$work/meshtrain.log"
ours=$(tail -n "$steps" "$work/m.jsonl" | python3 -c 'import sys,json; t=sorted(json.loads(l)["step_ms"] for l in sys.stdin); print(t[len(t)//2]/1000)')
peak=$(( $(cat "$work/rss") * 1024 ))  # peak resident set of the whole process
theirs=$(/usr/bin/python3 bench/torch_train_step.py "$model" "$threads" "$steps" "$dtype")
gflops=$(tail -n "$steps" "$work/m.jsonl" | python3 -c 'import sys,json; t=sorted(json.loads(l)["gflops_per_s"] for l in sys.stdin); print(t[len(t)//2])')
peak_gemm=$(OMP_NUM_THREADS=$threads build/gemm_peak "$dtype")
python3 - "$ours" "$peak" "$theirs" "$gflops" "$peak_gemm" <<'PY'
import json, sys
ours, peak, theirs = float(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
gflops, peak_gemm = float(sys.argv[4]), float(sys.argv[5])
tokens = theirs["tokens_per_step"]
print(f"{theirs['dtype']}, {theirs['threads']} threads, {tokens} tokens/step: meshtrain {tokens/ours:.0f} tok/s, "
      f"PyTorch {theirs['torch']} {tokens/theirs['median_step_s']:.0f} tok/s, ratio {theirs['median_step_s']/ours:.2f}x")
print(f"peak resident memory: meshtrain {peak/2**20:.0f} MiB, PyTorch {theirs['max_rss_bytes']/2**20:.0f} MiB "
      f"(ratio {peak/theirs['max_rss_bytes']:.2f})")
lib = "oneDNN" if theirs["dtype"] == "bfloat16" else "OpenBLAS"
print(f"a step reaches {gflops:.1f} GFLOP/s (op FLOP counts) = {100*gflops/peak_gemm:.0f}% of this machine's "
      f"{theirs['dtype']} GEMM peak ({peak_gemm:.1f} GFLOP/s, 2048^3 {lib})")
PY
