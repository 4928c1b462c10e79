#!/usr/bin/env bash
# Datasets of many shards across ranks (docs/data.md): a glob of 6 llm.c
# shards (13 batches an epoch, one shard shorter than a batch), 20 steps, so
# training crosses shards and an epoch:
#   - FSDP 2 and FSDP 2 x TP 2 (each rank reading only its rows) give the
#     one-process run's loss and gradient norm at every step, within f32's
#     tolerance (other layouts reduce in another order: resume_test.sh's 1e-6);
#   - a 4-rank run killed after its step-15 checkpoint (epoch 1, mid-shard)
#     resumes on one process and on DDP 4 at the same token: steps 16-20 equal
#     the one-process run's;
#   - the folder itself (train_ and val_ shards) is refused, suggesting the glob.
# Usage: dataset_test.sh "MPIRUN [FLAGS]" MESHTRAIN SOURCE_DIR
source "$(dirname "$0")/common.sh"
shards=$dir/shards
python3 - "$shards" <<'PY'
import os, random, struct, sys
out = sys.argv[1]
os.makedirs(out)
rng = random.Random(7)
# 256 tokens a batch (8 x 32): 3, 2, 1, 0, 4 and 3 batches.
for i, n in enumerate([1000, 600, 300, 100, 1200, 800]):
    with open(f"{out}/train_{i:06d}.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *[rng.randrange(500) for _ in range(n)]))
with open(f"{out}/val_000000.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, 300, *([0] * 253)) + struct.pack("<300H", *range(300)))
PY
model=(--config configs/debug.toml --model.dim 64 --model.n_layers 2 --model.n_heads 8 --model.n_kv_heads 4
       --model.ffn_dim 160 --model.vocab_size 512 --data.seq_len 32 --data.batch_size 8 --training.steps 20
       --training.seed 3 --lr_scheduler.decay none --metrics.log_every 1 --checkpoint.interval 5 --data.path "$shards/train_*.bin")
run() {  # NAME NP [KEY VALUE ...]: trains in $dir/NAME, metrics to $dir/NAME.jsonl
  local name=$1 np=$2
  shift 2
  local launch=()
  [ "$np" -gt 1 ] && launch=($mpirun -np "$np")
  timeout 300 "${launch[@]}" "$meshtrain" train "${model[@]}" --metrics.file "$dir/$name.jsonl" \
    --checkpoint.folder "$dir/$name" "$@" > "$dir/$name.out" 2>&1 || { cat "$dir/$name.out"; fail "$name exited non-zero"; }
}
compare() {  # NAME STEPS: against the one-process run
  python3 tests/mpi/compare_runs.py "$1" "$dir/one.jsonl" "$dir/$1.jsonl" --tolerance 1e-6 --steps "$2" || exit 1
}

run one 1
grep -q '"data_epoch": 1,' "$dir/one/step_000015/metadata.json" &&
  grep -q '"data_shard": "train_0000' "$dir/one/step_000015/metadata.json" ||
  { cat "$dir/one/step_000015/metadata.json"; fail "step 15's cursor is not in epoch 1, named by its shard"; }
run fsdp2 2 --parallel.dp_shard 2
compare fsdp2 1-20
run fsdp2_tp2 4 --parallel.dp_shard 2 --parallel.tp 2
compare fsdp2_tp2 1-20

# Killed (SIGKILL to mpirun) once step 15's checkpoint is complete, on 4 ranks (training.steps 1000 so that it is
# still running: without decay the LR does not depend on it).
$mpirun -np 4 "$meshtrain" train "${model[@]}" --parallel.dp_shard 2 --parallel.tp 2 \
  --metrics.file "" --checkpoint.folder "$dir/killed" --training.steps 1000 > "$dir/killed.out" 2>&1 &
job=$!
for _ in $(seq 1200); do
  [ -f "$dir/killed/step_000015/metadata.json" ] && break
  kill -0 $job 2>/dev/null || break
  sleep 0.05
done
kill -9 $job 2>/dev/null
wait $job 2>/dev/null
job=
[ -f "$dir/killed/step_000015/metadata.json" ] || { cat "$dir/killed.out"; fail "the killed run saved no step 15"; }
for layout in "one_resumed 1" "ddp4_resumed 4 --parallel.dp_replicate 4 --parallel.dp_shard 1"; do
  name=${layout%% *}
  mkdir -p "$dir/$name"
  cp -r "$dir/killed/step_000015" "$dir/$name/"
  run $layout
  grep -q "resumed from $dir/$name/step_000015: step 15 done" "$dir/$name.out" ||
    { cat "$dir/$name.out"; fail "$name did not resume from step 15"; }
  compare "$name" 16-20
done

# The tokenize folder itself: refused (every rank finds it before any collective; none hangs), with the glob to give.
out=$(timeout 60 $mpirun -np 2 "$meshtrain" train "${model[@]}" --data.path "$shards" --checkpoint.folder "" \
      --metrics.file "" 2>&1)
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] &&
  grep -qF "holds both train_ and val_ shards (meshtrain tokenize's splits); give the training split's, data.path = \"$shards/train_*.bin\"" <<<"$out" ||
  { echo "$out"; fail "the tokenize folder: exit $rc, or no error suggesting the glob"; }
echo "ok: 6 shards on 1, 2 and 4 ranks agree at every step; killed at step 15 and resumed on 1 and 4 ranks, the same"
