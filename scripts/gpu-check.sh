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
#                                  debug model on GPU and CPU (step by step from the
#                                  CPU's checkpoints, and straight), and bench/gpu.sh
#                                  (meshtrain against PyTorch on the card), writing
#                                  logs and results under OUT (PARTS=tests,parity,bench
#                                  picks some)
# Without a GPU, `run` says so and the tests skip; nothing fails for want of one.
set -euo pipefail
cd "$(dirname "$0")/.."
pack_dir=${GPU_PACK:-.gpu-pack}  # where pack puts the build and run takes it from

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

# configs/debug.toml for 20 steps in `dtype` on the CPU (a checkpoint after every step) and on the GPU,
# checked two ways:
#  - step by step: each GPU step from the CPU's state before it (step 1 from the seeded weights, step
#    k + 1 resumed from the CPU's checkpoint of step k), its loss and grad norm against the CPU's: the
#    GPU's arithmetic, within the tolerance at every step;
#  - free-running: 20 GPU steps straight, each loss within the tolerance. Its grad norms are printed,
#    not checked: step 11 is a gradient-norm spike that magnifies summation-order differences
#    hundredfold (two CPUs' runs differ there by 3.5e-4 in f32), which step by step does not.
# Metrics into OUT/metrics.jsonl, the verdict into OUT/train.log.
train_on_both() {
  local root=$1 out=$2 dtype=$3 meshtrain=${MESHTRAIN_BIN:-$1/bin/meshtrain} device=${PARITY_DEVICE:-cuda}
  local work=$root/parity-$dtype
  rm -rf "$work" && mkdir -p "$work/from"
  local args=(train --config configs/debug.toml --training.steps 20 --training.dtype "$dtype" --metrics.log_every 1)
  echo "-- $dtype on cpu (a checkpoint after every step)" >>"$out/train.log"
  timeout 120 "$meshtrain" "${args[@]}" --training.device cpu --checkpoint.folder "$work/cpu" --checkpoint.interval 1 \
    --metrics.file "$work/cpu.jsonl" >>"$out/train.log" 2>&1 || { echo "$dtype on cpu failed (train.log)"; return 1; }
  echo "-- $dtype on $device, 20 steps straight" >>"$out/train.log"
  timeout 120 "$meshtrain" "${args[@]}" --training.device "$device" --checkpoint.folder "" \
    --metrics.file "$work/free.jsonl" >>"$out/train.log" 2>&1 || { echo "$dtype on $device failed (train.log)"; return 1; }
  head -1 "$work/free.jsonl" >"$work/stepwise.jsonl"
  echo "-- $dtype on $device, each step k + 1 from the CPU's checkpoint of step k" >>"$out/train.log"
  local step from
  for step in $(seq 1 19); do
    from=$work/from/$step && mkdir -p "$from"
    cp -al "$work/cpu/$(printf 'step_%06d' "$step")" "$from/"
    timeout 60 "$meshtrain" "${args[@]}" --training.device "$device" --checkpoint.folder "$from" \
      --metrics.file "$from/metrics.jsonl" >"$from/log" 2>&1 || { cat "$from/log" >>"$out/train.log"; echo "$dtype on $device from step $step failed (train.log)"; return 1; }
    head -1 "$from/metrics.jsonl" >>"$work/stepwise.jsonl"
    rm -rf "$from"
  done
  for run in cpu free stepwise; do sed "s/^{/{\"run\":\"$dtype-$run\",/" "$work/$run.jsonl" >>"$out/metrics.jsonl"; done
  local tolerance=1e-5
  [[ $dtype == bfloat16 ]] && tolerance=2e-2
  python3 - "$work" "$dtype" "$tolerance" <<'PY' | tee -a "$out/train.log"
import json, sys
work, dtype, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
cpu, free, stepwise = ([json.loads(l) for l in open(f"{work}/{r}.jsonl")] for r in ("cpu", "free", "stepwise"))
def differences(run, key):
    return [(c["step"], abs(g[key] - c[key]) / abs(c[key])) for c, g in zip(cpu, run)]
def worst(run, key):
    return max(differences(run, key), key=lambda d: d[1])
checked = {("step by step", "loss"): stepwise, ("step by step", "grad_norm"): stepwise, ("free-running", "loss"): free}
ok = len(cpu) == len(free) == len(stepwise) == 20 and all(g["step"] == c["step"] for c, g in zip(cpu, stepwise))
for (how, key), run in checked.items():
    over = [f"{s} ({d:.1e})" for s, d in differences(run, key) if d > tol]
    if over: print(f"  {dtype} {how} {key} over the tolerance at steps " + ", ".join(over))
    ok = ok and not over
(ls, l), (gs, g) = worst(stepwise, "loss"), worst(stepwise, "grad_norm")
(fs, f), (fgs, fg) = worst(free, "loss"), worst(free, "grad_norm")
print(f"parity {dtype}: {len(stepwise)} steps, each from the CPU's state: worst relative difference loss {l:.2e} "
      f"(step {ls}), grad norm {g:.2e} (step {gs}); 20 steps straight: loss {f:.2e} (step {fs}), grad norm "
      f"{fg:.2e} (step {fgs}, not checked); tolerance {tol:g}: {'ok' if ok else 'FAILED'}; "
      f"tokens/s cpu {cpu[-1]['tokens_per_s']:.0f} gpu {free[-1]['tokens_per_s']:.0f}")
sys.exit(0 if ok else 1)
PY
}

case ${1:-} in
  pack) pack ;;
  run) shift && run "$@" ;;
  *) sed -n '2,16p' "$0" >&2 && exit 2 ;;
esac
