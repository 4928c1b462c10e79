#!/usr/bin/env bash
# The GPU checks, in two halves, because the GPU machine has the CUDA
# toolkit but none of Debian's packages meshtrain builds with:
#   scripts/gpu-check.sh pack      here, where the packages and nvcc are: builds
#                                  the GPU tests and meshtrain with CUDA and packs
#                                  them, with the shared libraries they load that a
#                                  CUDA machine lacks, into .gpu-pack/ (ignored by git)
#   scripts/gpu-check.sh run OUT   on the GPU machine, from the repository root with
#                                  .gpu-pack/ beside it: runs the GPU tests (the CUDA
#                                  kernels and executor against the CPU's), the
#                                  debug model on GPU and CPU, and bench/gpu.sh
#                                  (meshtrain against PyTorch on the card), writing
#                                  logs and results under OUT (PARTS=tests,parity,bench
#                                  picks some)
# Without a GPU, `run` says so and the tests skip; nothing fails for want of one.
set -euo pipefail
cd "$(dirname "$0")/.."
pack_dir=.gpu-pack

pack() {
  scripts/setup.sh build -DMESHTRAIN_BUILD_TESTS=ON -DMESHTRAIN_CUDA=ON >/dev/null
  cmake --build build -j "$(nproc)" --target gpu_tests meshtrain
  local stage
  stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$stage/lib"
  cp build/gpu_tests build/meshtrain "$stage/bin/"
  strip "$stage/bin/"*
  # Every shared library they load but glibc's, the compiler's runtime and
  # CUDA's own (the GPU machine has newer ones of each).
  ldd build/gpu_tests build/meshtrain | awk '/=> \// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux-x86-64|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt)\.so' |
    while read -r lib; do cp -L "$lib" "$stage/lib/"; done
  rm -rf "$pack_dir"
  mkdir -p "$pack_dir"
  tar -C "$stage" -cJf "$pack_dir/pack.tar.xz" bin lib
  git rev-parse HEAD >"$pack_dir/commit"
  rm -rf "$stage"
  echo "packed $(du -h "$pack_dir/pack.tar.xz" | cut -f1) into $pack_dir (commit $(cut -c1-10 "$pack_dir/commit"))"
}

run() {
  local out=${1:?usage: scripts/gpu-check.sh run OUT}
  mkdir -p "$out"
  [[ -f $pack_dir/pack.tar.xz ]] || { echo "no $pack_dir/pack.tar.xz: run 'scripts/gpu-check.sh pack' first" >&2; exit 2; }
  local root=/tmp/meshtrain-gpu
  rm -rf "$root" && mkdir -p "$root" && tar -C "$root" -xJf "$pack_dir/pack.tar.xz"
  # CUDA's libraries: the toolkit's, else the ones PyTorch's wheels bring.
  local cuda_libs=/usr/local/cuda/lib64
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13", "lib") for p in nvidia.__path__))' 2>/dev/null); do
    [[ -d $d ]] && cuda_libs="$cuda_libs:$d"
  done
  export LD_LIBRARY_PATH="$root/lib:$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  {
    echo "commit packed: $(cat $pack_dir/commit 2>/dev/null || echo unknown)"
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || echo "nvidia-smi: not found"
    ldd "$root/bin/gpu_tests" | grep -E 'not found|cublas|cudart' || true
  } | tee "$out/environment.txt"
  local status=0 parts=${PARTS:-tests,parity,bench}
  if [[ $parts == *tests* ]]; then
    echo "== GPU tests: CUDA kernels and executor against the CPU's"
    MESHTRAIN_SOURCE_DIR=$PWD timeout 300 "$root/bin/gpu_tests" --gtest_output="xml:$out/gpu_tests.xml" 2>&1 |
      tee "$out/gpu_tests.log" || status=1
  fi
  if [[ $parts == *parity* ]]; then
    echo "== the debug model, 20 steps on the GPU against the CPU (loss and grad norm every step)"
    for dtype in float32 bfloat16; do
      train_on_both "$root" "$out" "$dtype" || status=1
    done
  fi
  if [[ $parts == *bench* ]]; then
    echo "== bench/gpu.sh: meshtrain against PyTorch on this GPU"
    MESHTRAIN=$root/bin/meshtrain bench/gpu.sh 2 8 "$root/bench" 2>&1 | tee "$out/bench.txt" || status=1
  fi
  echo "== summary"
  {
    grep -s -E '^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|tests? (failed|skipped)' "$out/gpu_tests.log" || true
    grep -s -h -E '^(parity|done|GPU:)' "$out/train.log" || true
  } | tee "$out/summary.txt"
  return $status
}

# configs/debug.toml for 20 steps in `dtype` on the CPU and on the GPU; their
# metrics into OUT/metrics.jsonl, and a line comparing them.
train_on_both() {
  local root=$1 out=$2 dtype=$3 device
  for device in cpu cuda; do
    echo "-- $dtype on $device" >>"$out/train.log"
    timeout 120 "$root/bin/meshtrain" train --config configs/debug.toml --training.steps 20 --training.dtype "$dtype" \
      --training.device "$device" --checkpoint.folder "" --metrics.file "$root/$device.jsonl" --metrics.log_every 1 \
      >>"$out/train.log" 2>&1 || { echo "$dtype on $device failed (train.log)"; return 1; }
    sed "s/^{/{\"run\":\"$dtype-$device\",/" "$root/$device.jsonl" >>"$out/metrics.jsonl"
  done
  local tolerance=1e-5
  [[ $dtype == bfloat16 ]] && tolerance=2e-2
  python3 - "$root/cpu.jsonl" "$root/cuda.jsonl" "$dtype" "$tolerance" <<'PY' | tee -a "$out/train.log"
import json, sys
cpu, gpu = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
tol = float(sys.argv[4])
diff = {k: [abs(g[k] - c[k]) / abs(c[k]) for c, g in zip(cpu, gpu)] for k in ("loss", "grad_norm")}
worst = {k: max(v) for k, v in diff.items()}
for k, v in diff.items():
    over = [f"{c['step']} ({d:.1e})" for c, d in zip(cpu, v) if d > float(sys.argv[4])]
    if over: print(f"  {sys.argv[3]} {k} over the tolerance at steps " + ", ".join(over))
ok = len(cpu) == len(gpu) == 20 and all(v <= tol for v in worst.values())
print(f"parity {sys.argv[3]}: {len(gpu)} steps, worst relative difference loss {worst['loss']:.2e}, "
      f"grad norm {worst['grad_norm']:.2e} (tolerance {tol:g}): {'ok' if ok else 'FAILED'}; "
      f"last loss cpu {cpu[-1]['loss']:.6f} gpu {gpu[-1]['loss']:.6f}; "
      f"tokens/s cpu {cpu[-1]['tokens_per_s']:.0f} gpu {gpu[-1]['tokens_per_s']:.0f}")
sys.exit(0 if ok else 1)
PY
}

case ${1:-} in
  pack) pack ;;
  run) shift && run "$@" ;;
  *) sed -n '2,16p' "$0" >&2 && exit 2 ;;
esac
