#!/usr/bin/env bash
# Bad input to every command is a clear error (issue 15): exit code 1 or 2,
# never a signal, a hang or a silently wrong answer, and a message that names
# what was wrong. Each case: the words the message must hold, then the
# command line. Work proportional to a number typed (a mesh of 30000 ranks)
# must finish at once.
# Usage: bad_input_test.sh MESHTRAIN SOURCE_DIR
set -u
meshtrain=$1 src=$2
cd "$src"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
# expect_error WORDS ARGS...: the command fails with 1 or 2 within 20 s, saying WORDS.
expect_error() {
  local words=$1
  shift
  local out rc
  out=$(timeout 20 "$meshtrain" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne 1 ] && [ "$rc" -ne 2 ]; then
    echo "FAIL (exit $rc, expected 1 or 2): meshtrain $*"; echo "$out" | tail -3; failures=$((failures + 1))
  elif ! grep -qF -- "$words" <<<"$out"; then
    echo "FAIL (message lacks '$words'): meshtrain $*"; echo "$out" | tail -3; failures=$((failures + 1))
  fi
}
# expect_fast WORDS ARGS...: the command succeeds within 5 s, printing WORDS.
expect_fast() {
  local words=$1
  shift
  local out rc
  out=$(timeout 5 "$meshtrain" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne 0 ] || ! grep -qF -- "$words" <<<"$out"; then
    echo "FAIL (exit $rc, or no '$words' within 5 s): meshtrain $*"; echo "$out" | tail -3; failures=$((failures + 1))
  fi
}

# Degrees whose product overflows, keys that only a pipeline reads set
# without one, and a pipeline of no ranks (issue 31).
expect_error "x parallel.tp (2) = more than 2^63, but the job has 2 ranks" lower --ranks 2 \
  --config configs/debug.toml --parallel.dp_replicate 4611686018427387905 --parallel.dp_shard 4611686018427387905 \
  --parallel.tp 2
expect_error "parallel.pp_microbatches = 4 applies to a pipeline, but parallel.pp is 1" lower --ranks 1 \
  --config configs/debug.toml --parallel.pp_microbatches 4
expect_error "parallel.pp_schedule_csv = \"missing.csv\" applies to a pipeline" estimate --ranks 1 --hardware h100-sxm \
  --config configs/debug.toml --parallel.pp_schedule_csv missing.csv
expect_error "--stages: Value 0 not in range 1 to 1048576" pp-schedule --stages 0
# Readers bounded: a device or a FIFO as a hardware profile is refused, not
# read without end; a kernel time of 1e308 us, not a step of "inf s"; an
# llm.c shard with bytes past its header's count, not read short.
expect_error "--hardware /dev/zero: cannot read it" estimate --ranks 1 --config configs/debug.toml --hardware /dev/zero
mkfifo "$dir/profile.fifo"
expect_error "profile.fifo: cannot read it" estimate --ranks 1 --config configs/debug.toml --hardware "$dir/profile.fifo"
printf '{"kernels": {"matmul": 1e308}}' > "$dir/kernels.json"
expect_error "entry 'matmul' is 1e+308, not a time of 0 to 1e12 us" estimate --ranks 1 --config configs/debug.toml \
  --hardware cpu-2core --schedule.estimate benchmark --schedule.kernel_cache "$dir/kernels.json"
python3 - "$dir/two.bin" <<'PY'
import struct, sys
shard = struct.pack("<256i", 20240520, 1, 600, *([0] * 253)) + struct.pack("<600H", *([7] * 600))
open(sys.argv[1], "wb").write(shard + shard)  # a second shard appended
PY
expect_error "bytes past the shard" train --config configs/debug.toml --data.path "$dir/two.bin" --training.steps 1 \
  --data.batch_size 1 --data.seq_len 8 --checkpoint.folder "" --metrics.file ""

# Sizes from input (class 1).
expect_error "more elements than" plan --mesh 2 --shape 1000000,1000000,1000000,100 --from "S(0)" --to R
expect_error "is more elements than a step can hold" train --config configs/debug.toml --data.batch_size 4294967296 \
  --data.seq_len 4294967296
expect_error "more than 16777216 ranks" layout --mesh 65536,65536 --shape 8 --placements "S(0)R"
expect_error "'x' is not an integer" layout --mesh 4,x --shape 8 --placements "S(0)"
expect_error "--shape '8,-1' has a negative size" layout --mesh 4 --shape 8,-1 --placements "S(0)"
expect_error "lower: --ranks 4294967298 must be between 1 and 131072" lower --ranks 4294967298 --config configs/debug.toml
expect_error "estimate: --ranks 131073 must be between 1 and 131072" estimate --ranks 131073 --config configs/debug.toml \
  --hardware h100-sxm
# Work proportional to a number typed (class 6): a dim of 2^40 is a dim.
expect_fast "29999  [29999]" layout --mesh 30000 --shape 8 --placements "S(0)"
expect_fast "[1,1099511627776] [3,0]" layout --mesh 4 --shape 4,1099511627776 --placements "S(0)"
expect_fast "[183251937962]   [733007757142]" layout --mesh 2,3 --shape 1099511627776 --placements "_S(0, 20000004)S(0)"
# Messages that mislead, and files that are folders (class 7).
mkdir -p "$dir/a_folder"
expect_error "is not a file" train --config "$dir/a_folder"
expect_error "does not exist" train --config "$dir/missing.toml"
printf 'name = "x"\n[device]\npeak_gflops_f32 = 100\nmemory_gbps = 1e-300\n' >"$dir/slow.toml"
expect_error "device.memory_gbps must be a number of at least 1e-06" estimate --config configs/debug.toml --ranks 2 \
  --hardware "$dir/slow.toml"

small=(--config configs/debug.toml --training.steps 1 --model.n_layers 1 --model.dim 32 --model.n_heads 2
       --model.n_kv_heads 2 --model.ffn_dim 64 --data.seq_len 16 --data.batch_size 2 --metrics.file ""
       --checkpoint.folder "")
expect_error "model: n_layers 2000000000 is more than 4096" lower --ranks 1 "${small[@]}" --model.n_layers 2000000000
# A folder is a dataset of shards (docs/data.md): one with no .bin shard in it is refused.
expect_error "data.path $dir/a_folder is a directory with no .bin token shard in it" train "${small[@]}" --data.path "$dir/a_folder"
expect_error "'$dir/a_folder' is not a file; a safetensors file was expected" train "${small[@]}" \
  --checkpoint.init_from "$dir/a_folder"
expect_error "--trace $dir/a_folder is a folder" train "${small[@]}" --trace "$dir/a_folder"
expect_error "cannot write $dir/a_folder: it is a folder" lower --ranks 2 "${small[@]}" --out "$dir/a_folder"
expect_error "--hardware '$dir/a_folder' is a directory" estimate --ranks 2 "${small[@]}" --hardware "$dir/a_folder"
expect_error "schedule.hardware 'foo' is neither" lower --ranks 2 "${small[@]}" --schedule.hardware foo
expect_error "train: no-verify was given a disallowed flag override" train "${small[@]}" --no-verify=1
expect_error "lower: unexpected argument '--json'" lower --ranks 2 "${small[@]}" --json
printf 'name = "x"\n[device]\npeak_gflops_f32 = 100\nmemory_gbps = 10\ncompute_efficiency = 5\n' >"$dir/fast.toml"
expect_error "device.compute_efficiency is a fraction of the peak, at most 1" estimate --ranks 2 "${small[@]}" \
  --hardware "$dir/fast.toml"
printf 'name = "x"\n[device]\npeak_gflops_f32 = 100\nmemory_gbps = 10\n[device.op_efficiency]\nmatmull = 0.5\n' \
  >"$dir/typo.toml"
expect_error "device.op_efficiency.matmull names no op" estimate --ranks 2 "${small[@]}" --hardware "$dir/typo.toml"
expect_error "config key model.dim: '99999999999999999999' is not an integer below 2^63" train "${small[@]}" \
  --model.dim 99999999999999999999
expect_error "config: model.dim 2000000000 x 2000000000 (the widest of" estimate --ranks 8 "${small[@]}" \
  --hardware h100-sxm --model.dim 2000000000 --model.n_heads 1 --model.n_kv_heads 1
expect_error "--link '0:-1:0': the latency must be a number >= 0" plan --mesh 2 --shape 8 --from "S(0)" --to R \
  --link 0:-1:0
expect_error "both set mesh dim 0; give one per dim" plan --mesh 2 --shape 8 --from "S(0)" --to R --link 0:1:1 \
  --link 0:2:2
# Pipeline schedules (issue 13): every refusal names the key; large asks end at once.
expect_error "parallel.pp 2 must divide the job's 1 ranks" train --config configs/debug.toml --parallel.pp 2
expect_error "config key parallel.pp_layers_per_stage: '3,x' is not a list of positive integers" train \
  --config configs/debug.toml --parallel.pp_layers_per_stage 3,x
expect_error "config key parallel.pp_layers_per_stage: '3,0' is not a list of positive integers" train \
  --config configs/debug.toml --parallel.pp_layers_per_stage 3,0
expect_error "parallel.pp 2 must divide the job's 3 ranks" lower --config configs/debug.toml --ranks 3 --parallel.pp 2
expect_error "estimate --trace with parallel.pp 2" estimate --config configs/debug.toml --ranks 4 --hardware h100-sxm \
  --parallel.pp 2 --trace "$dir/t.json"
expect_error "parallel.pp 2 must divide the job's 3 ranks" estimate --config configs/debug.toml --ranks 3 \
  --hardware h100-sxm --parallel.pp 2
expect_error "pp-schedule --from-csv $dir/none.csv: cannot read it" pp-schedule --from-csv "$dir/none.csv"
expect_error "parallel.pp_schedule_csv $dir/none.csv: cannot read it" estimate --config configs/debug.toml --ranks 2 \
  --hardware h100-sxm --parallel.pp 2 --parallel.pp_schedule_csv "$dir/none.csv"
expect_error "pp_schedule 'ZB' is not a pipeline schedule; choose one of gpipe" pp-schedule --schedule ZB
expect_error "1f1b needs pp_microbatches >= pp (got 2 microbatches for 4 stages)" pp-schedule --microbatches 2
expect_error "splits into 2 runs unevenly" pp-schedule --schedule interleaved_1f1b --microbatches 9
expect_error "zbv puts exactly 2 stages on each rank" pp-schedule --schedule zbv --stages-per-rank 3
expect_error "more than 1048576 actions" pp-schedule --schedule gpipe --stages 1024 --microbatches 65536
expect_error "pp-schedule: --stages: Value 4294967296 not in range 1 to 1048576" pp-schedule --stages 4294967296
expect_error "pipeline costs must be finite, positive" pp-schedule --backward-weight 0
expect_fast "published formula: 0.0285" pp-schedule --schedule gpipe --stages 16 --microbatches 512
# training.device cuda where there is no GPU (or no CUDA in the build): one
# clear error before anything trains; a device that does not exist is named.
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect_error "no GPU: " train --config configs/debug.toml --training.device cuda
fi
expect_error "training.device: 'tpu' is not one of cpu, cuda" train --config configs/debug.toml --training.device tpu

# Resources (issue 31): a file-size limit (ulimit -f) reached while saving
# is an error naming the file (SIGXFSZ killed the process with no word), and
# nothing is left in the checkpoint folder.
out=$(ulimit -f 200; timeout 60 "$meshtrain" train --config configs/debug.toml --training.steps 1 --metrics.file "" \
      --checkpoint.folder "$dir/fsize" 2>&1)
rc=$?
if { [ $rc -ne 1 ] && [ $rc -ne 2 ]; } || ! grep -q "writing .*/fsize/step_000001.tmp/rank_00000.safetensors failed: write: File too large" <<<"$out" ||
   [ -n "$(ls -A "$dir/fsize")" ]; then
  echo "FAIL (exit $rc): ulimit -f while saving a checkpoint"; echo "$out" | tail -3; ls -A "$dir/fsize"
  failures=$((failures + 1))
fi

# A small stack, and more kernel threads than cores: oneDNN's kernel
# generation overflowed a 128 KiB stack, and libgomp crashed making 100000
# threads. A soft stack limit is raised, a hard one refused; the threads are
# capped to the cores. Each said in one line.
train_with() {  # WORDS EXIT SHELL-SETUP: meshtrain trains 1 step after SHELL-SETUP, exits EXIT and says WORDS
  local words=$1 expected=$2 setup=$3 out rc
  out=$(bash -c "$setup; exec timeout 120 \"\$0\" train --config configs/debug.toml --training.steps 1 --metrics.file '' \
        --checkpoint.folder ''" "$meshtrain" 2>&1)
  rc=$?
  if [ $rc -ne "$expected" ] || ! grep -qF -- "$words" <<<"$out"; then
    echo "FAIL (exit $rc, expected $expected, or no '$words'): $setup"; echo "$out" | tail -3; failures=$((failures + 1))
  fi
}
train_with "meshtrain: the stack limit (ulimit -s) was 64 KiB: raised to" 0 "ulimit -Ss 64"
train_with "meshtrain: error: the stack limit is 64 KiB and cannot be raised past 64 KiB (ulimit -Hs)" 2 "ulimit -s 64"
train_with "meshtrain: OMP_NUM_THREADS=100000 is more kernel threads than the" 0 "export OMP_NUM_THREADS=100000"

# The command line itself (CLI11's errors): exit code 2, the command named.
expect_error "meshtrain: error: layout: --mesh is required" layout --shape 8 --placements R
expect_error "unknown command 'frobnicate'" frobnicate
expect_error "meshtrain: error: fr-analyze:" fr-analyze
expect_error "plan: Could not convert: --devices-per-host = abc" plan --mesh 2 --shape 8 --from R --to R \
  --devices-per-host abc

if [ "$failures" -ne 0 ]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "every bad input was a clear error; the large numbers took no time"
