#!/usr/bin/env bash
# Single-rank training speed, meshtrain vs PyTorch (Debian's python3-torch),
# same model, batch and thread count, measured in the same run:
# Llama dim 256, 4 layers, 8 heads, vocab 256, seq 256, batch 8.
# Usage: [ROUNDS=3] bench/train.sh [THREADS] [STEPS] [float32|bfloat16]
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
# Rounds alternate meshtrain and PyTorch (this host is noisy: the same run
# varies by up to +-30%); each round's figure is the median step time.
rounds=${ROUNDS:-3}
ours_all=() theirs_all=()
for round in $(seq "$rounds"); do
  OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads /usr/bin/time -f %M -o "$work/rss" build/meshtrain train --config configs/debug.toml \
    --model.n_layers 4 --model.n_heads 8 --model.n_kv_heads 8 --data.seq_len 256 --data.batch_size 8 \
    --data.path "$work/text.txt" --training.steps $((steps + 3)) --checkpoint.folder "" --metrics.file "$work/m.jsonl" \
    --metrics.log_every 1 --training.dtype "$dtype" > "$work/meshtrain.log"
  ours=$(tail -n "$steps" "$work/m.jsonl" | python3 -c 'import sys,json; t=sorted(json.loads(l)["step_ms"] for l in sys.stdin); print(t[len(t)//2]/1000)')
  peak=$(( $(cat "$work/rss") * 1024 ))  # peak resident set of the whole process
  # PyTorch's best settings found here: torch.set_num_threads plus OMP_NUM_THREADS.
  theirs=$(OMP_NUM_THREADS=$threads /usr/bin/python3 bench/torch_train_step.py "$model" "$threads" "$steps" "$dtype")
  ours_all+=("$ours") theirs_all+=("$theirs")
done
gflops=$(tail -n "$steps" "$work/m.jsonl" | python3 -c 'import sys,json; t=sorted(json.loads(l)["gflops_per_s"] for l in sys.stdin); print(t[len(t)//2])')
peak_gemm=$(OMP_NUM_THREADS=$threads build/gemm_peak "$dtype")
python3 - "$peak" "$gflops" "$peak_gemm" "${ours_all[*]}" "${theirs_all[@]}" <<'PY'
import json, statistics, sys
peak, gflops, peak_gemm = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
ours = [float(x) for x in sys.argv[4].split()]
theirs = [json.loads(x) for x in sys.argv[5:]]
tokens = theirs[0]["tokens_per_step"]
ratios = [t["median_step_s"] / o for o, t in zip(ours, theirs)]
for i, (o, t, r) in enumerate(zip(ours, theirs, ratios), 1):
    print(f"round {i}: meshtrain {tokens/o:.0f} tok/s, PyTorch {tokens/t['median_step_s']:.0f} tok/s, ratio {r:.2f}x")
t0 = theirs[0]
print(f"{t0['dtype']}, {t0['threads']} threads, {tokens} tokens/step: meshtrain {tokens/statistics.median(ours):.0f} tok/s, "
      f"PyTorch {t0['torch']} {tokens/statistics.median(t['median_step_s'] for t in theirs):.0f} tok/s (medians of "
      f"{len(ours)} rounds), ratio {statistics.median(ratios):.2f}x (median round; min {min(ratios):.2f}x)")
torch_rss = max(t["max_rss_bytes"] for t in theirs)
print(f"peak resident memory: meshtrain {peak/2**20:.0f} MiB, PyTorch {torch_rss/2**20:.0f} MiB "
      f"(ratio {peak/torch_rss:.2f})")
lib = "oneDNN" if t0["dtype"] == "bfloat16" else "OpenBLAS"
print(f"a step reaches {gflops:.1f} GFLOP/s (op FLOP counts) = {100*gflops/peak_gemm:.0f}% of this machine's "
      f"{t0['dtype']} GEMM peak ({peak_gemm:.1f} GFLOP/s, 2048^3 {lib})")
PY
