#!/usr/bin/env bash
# Training speed on one GPU: meshtrain (--training.device cuda) next to
# PyTorch on the same card in the same run, eager (SDPA flash attention,
# fused AdamW) and torch.compile, in alternating rounds, on the Llama 3.2
# 1B shape of configs/llama3.2_1b.toml (bf16 compute over f32 weights,
# sequence 4096). Prints tokens/s, MFU (model FLOPs over the card's dense
# bf16 peak, PEAK_TFLOPS, default an H100 SXM's 989) and peak GPU memory,
# PyTorch's flash SDPA alone (TFLOP/s), then meshtrain's slowest ops (--profile,
# CUDA events).
# Usage: [ROUNDS=1] [MESHTRAIN=build/meshtrain] bench/gpu.sh [BATCH] [STEPS] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
batch=${1:-2} steps=${2:-8} out=${3:-$(mktemp -d)}
meshtrain=${MESHTRAIN:-build/meshtrain} rounds=${ROUNDS:-1} peak=${PEAK_TFLOPS:-989}
[[ $batch =~ ^[1-9][0-9]*$ && $steps =~ ^[1-9][0-9]*$ ]] || { echo "bench/gpu.sh: BATCH and STEPS must be positive integers" >&2; exit 2; }
mkdir -p "$out"
config=configs/llama3.2_1b.toml
model='{"dim": 2048, "n_layers": 16, "n_heads": 32, "n_kv_heads": 8, "ffn_dim": 8192, "vocab_size": 128256,
        "rope_theta": 500000.0, "norm_eps": 1e-5, "tie_embeddings": true, "seq_len": 4096}'
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/GPU: /'
python3 -c 'import torch; print("PyTorch", torch.__version__, "CUDA", torch.version.cuda)'

meshtrain_round() {
  "$meshtrain" train --config "$config" --data.batch_size "$batch" --training.steps $((steps + 3)) \
    --checkpoint.folder "" --metrics.file "$out/meshtrain.jsonl" --metrics.log_every 1 >"$out/meshtrain.log" 2>&1 ||
    { echo "meshtrain failed:"; tail -5 "$out/meshtrain.log"; return 1; }
  python3 - "$out/meshtrain.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][3:]  # after the warm-up (the first step runs uncaptured)
ms = sorted(r["step_ms"] for r in rows)
print(json.dumps({"side": "meshtrain", "median_step_s": ms[len(ms) // 2] / 1e3,
                  "tokens_per_step": None, "peak_bytes": max(r["peak_bytes"] for r in rows)}))
PY
}

for round in $(seq "$rounds"); do
  meshtrain_round | sed "s/\"tokens_per_step\": null/\"tokens_per_step\": $((batch * 4096))/" >>"$out/results.jsonl" || true
  for mode in eager compile; do
    timeout 600 python3 bench/torch_gpu_step.py "$model" "$batch" "$steps" "$mode" 2>"$out/torch_$mode.err" |
      tail -1 >>"$out/results.jsonl" || { echo "torch $mode failed:"; tail -3 "$out/torch_$mode.err"; }
  done
done

python3 - "$out/results.jsonl" "$peak" "$batch" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
peak = float(sys.argv[2]) * 1e12
d, L, ffn, V, T, kv = 2048, 16, 8192, 128256, 4096, 8 * 64
# Weights in matmuls per token (q, k, v, o, gate, up, down per layer; the LM head) and causal attention.
matmul_params = L * (d * d + 2 * d * kv + d * d + 3 * d * ffn) + d * V
flops_per_token = 6 * matmul_params + 6 * L * T * d
by_side = {}
for r in rows:
    by_side.setdefault(r["side"], []).append(r)
print(f"{'side':<16} {'tokens/s':>10} {'MFU':>6} {'peak GiB':>9}   (batch {sys.argv[3]} x 4096, median step of each round)")
for side, rs in by_side.items():
    tps = sorted(r["tokens_per_step"] / r["median_step_s"] for r in rs)[len(rs) // 2]
    print(f"{side:<16} {tps:>10.0f} {100 * tps * flops_per_token / peak:>5.1f}% {max(r['peak_bytes'] for r in rs) / 2**30:>9.2f}")
PY
echo "== attention alone: PyTorch's flash SDPA on the same shapes (meshtrain's attention is in the profile below)"
timeout 120 python3 bench/torch_sdpa.py "$batch" 32 8 4096 64 2>"$out/torch_sdpa.err" ||
  { echo "torch SDPA failed:"; tail -3 "$out/torch_sdpa.err"; }
echo "== meshtrain's slowest ops (--profile: each kernel timed between CUDA events, uncaptured)"
"$meshtrain" train --config "$config" --data.batch_size "$batch" --training.steps 3 --checkpoint.folder "" --profile \
  2>&1 | grep -A12 "^profile" || echo "(the profile run failed)"
