#!/usr/bin/env bash
# Single-rank training speed, meshtrain vs PyTorch (Debian's python3-torch),
# same model, batch and thread count, measured in the same run:
# Llama dim 256, 4 layers, 8 heads, vocab 256, seq 256, batch 8.
# Usage: [ROUNDS=3] bench/train.sh [THREADS] [STEPS] [float32|bfloat16]
#
# PyTorch runs at its best: Debian's torch runs f32 matmuls on OpenBLAS, whose
# own threads oversubscribe the cores under torch's OpenMP threads, so the
# script first times every pair of torch.set_num_threads in {1, THREADS} and
# OpenBLAS threads in {1, THREADS} and compares against the fastest (printed).
# Both sides run under the caller's OPENBLAS_CORETYPE (printed, with the core
# type OpenBLAS then picked in each process; meshtrain's f32 and bf16 GEMMs
# are oneDNN's, so it affects PyTorch: OPENBLAS_CORETYPE=SkylakeX gives it
# AVX-512 kernels on a CPU OpenBLAS does not know).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-$(nproc)}
steps=${2:-10}
dtype=${3:-float32}
[[ $threads =~ ^[1-9][0-9]*$ && $steps =~ ^[1-9][0-9]*$ ]] || { echo "bench/train.sh: THREADS and STEPS must be positive integers" >&2; exit 2; }
[[ $dtype == float32 || $dtype == bfloat16 ]] || { echo "bench/train.sh: dtype must be float32 or bfloat16, not '$dtype'" >&2; exit 2; }
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  if command -v apt-get >/dev/null && { [ -z "$sudo" ] || command -v sudo >/dev/null; }; then
    echo "bench/train.sh: installing Debian's python3-torch (the baseline)"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-torch >/dev/null
  else
    echo "bench/train.sh: the baseline needs PyTorch for /usr/bin/python3: install Debian's python3-torch (apt-get install python3-torch)" >&2
    exit 2
  fi
fi
[ -x build/meshtrain ] && [ -x build/gemm_peak ] || scripts/setup.sh build
source bench/bench_model.sh
# torch_step TORCH_THREADS BLAS_THREADS: PyTorch's JSON line for the benchmark model.
torch_step() {
  OMP_NUM_THREADS=$1 OPENBLAS_NUM_THREADS=$2 /usr/bin/python3 bench/torch_train_step.py "$bench_model" "$1" "$steps" "$dtype"
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bench_text "$work/text.txt"
# PyTorch's thread settings, each timed once; the fastest is the baseline.
settings=("1 1")
[ "$threads" -eq 1 ] || settings+=("1 $threads" "$threads 1" "$threads $threads")
for setting in "${settings[@]}"; do
  read -r torch_threads blas_threads <<< "$setting"
  run=$(torch_step "$torch_threads" "$blas_threads")  # an assignment, so a failed run stops the script
  echo "$torch_threads $blas_threads $run" >> "$work/settings.txt"
done
read -r torch_threads blas_threads < <(python3 - "$work/settings.txt" <<'PY'
import json, sys
runs = [(int(t), int(b), json.loads(r)) for t, b, r in (l.split(" ", 2) for l in open(sys.argv[1]))]
for t, b, r in runs:
    print(f"PyTorch, torch threads {t}, OpenBLAS threads {b}: {r['median_step_s']:.3f} s/step", file=sys.stderr)
t, b, _ = min(runs, key=lambda run: run[2]["median_step_s"])
print(t, b)
PY
)
echo "PyTorch's fastest setting: torch.set_num_threads($torch_threads), OMP_NUM_THREADS=$torch_threads, OPENBLAS_NUM_THREADS=$blas_threads"

# Rounds alternate meshtrain and PyTorch (this host is noisy: the same run
# varies by up to +-30%); each round's figure is the median step time.
rounds=${ROUNDS:-3}
ours_all=() theirs_all=()
for round in $(seq "$rounds"); do
  ours=$(bench_meshtrain build/meshtrain "$threads" "$steps" "$dtype" "$work/text.txt" "$work")
  peak=$(( $(cat "$work/rss") * 1024 ))  # peak resident set of the whole process
  theirs=$(torch_step "$torch_threads" "$blas_threads")
  ours_all+=("$ours") theirs_all+=("$theirs")
done
gflops=$(tail -n "$steps" "$work/m.jsonl" | python3 -c 'import sys,json; t=sorted(json.loads(l)["gflops_per_s"] for l in sys.stdin); print(t[len(t)//2])')
peak_gemm=$(OMP_NUM_THREADS=$threads build/gemm_peak "$dtype")
our_core=$(OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads build/gemm_peak --blas-core)
python3 - "$threads" "$blas_threads" "$peak" "$gflops" "$peak_gemm" "$our_core" "${ours_all[*]}" "${theirs_all[@]}" <<'PY'
import json, os, statistics, sys
threads, blas_threads = int(sys.argv[1]), int(sys.argv[2])
peak, gflops, peak_gemm, our_core = int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
ours = [float(x) for x in sys.argv[7].split()]
theirs = [json.loads(x) for x in sys.argv[8:]]
tokens = theirs[0]["tokens_per_step"]
ratios = [t["median_step_s"] / o for o, t in zip(ours, theirs)]
for i, (o, t, r) in enumerate(zip(ours, theirs, ratios), 1):
    print(f"round {i}: meshtrain {tokens/o:.0f} tok/s, PyTorch {tokens/t['median_step_s']:.0f} tok/s, ratio {r:.2f}x")
t0 = theirs[0]
coretype = os.environ.get("OPENBLAS_CORETYPE")
print(f"both sides under OPENBLAS_CORETYPE={coretype if coretype is not None else '(unset: OpenBLAS picks by CPU)'}; "
      f"OpenBLAS core picked: PyTorch {t0.get('blas_core', 'not OpenBLAS')} ({t0['blas']}), meshtrain {our_core} "
      f"(its f64 GEMM only: f32 and bf16 run on oneDNN)")
print(f"{t0['dtype']}, {tokens} tokens/step; meshtrain {threads} threads, PyTorch torch threads {t0['threads']} + "
      f"OpenBLAS threads {blas_threads}: meshtrain {tokens/statistics.median(ours):.0f} tok/s, "
      f"PyTorch {t0['torch']} {tokens/statistics.median(t['median_step_s'] for t in theirs):.0f} tok/s (medians of "
      f"{len(ours)} rounds), ratio {statistics.median(ratios):.2f}x (median round; min {min(ratios):.2f}x)")
torch_rss = max(t["max_rss_bytes"] for t in theirs)
print(f"peak resident memory: meshtrain {peak/2**20:.0f} MiB, PyTorch {torch_rss/2**20:.0f} MiB "
      f"(ratio {peak/torch_rss:.2f})")
print(f"a step reaches {gflops:.1f} GFLOP/s (op FLOP counts) = {100*gflops/peak_gemm:.0f}% of this machine's "
      f"{t0['dtype']} GEMM peak ({peak_gemm:.1f} GFLOP/s, 2048^3 oneDNN, meshtrain's GEMM)")
PY
