#!/usr/bin/env bash
# Datasets of many shards stream (issue 39): 4 GiB of 16 llm.c shards (uint16
# tokens, real bytes, not sparse) train on 4 data-parallel ranks with each
# rank's peak resident memory under 300 MiB: no rank holds the dataset (the
# shards are read once, streamed, then mapped one at a time, and each rank
# reads only its rows). A token past model.vocab_size near the end of the
# last shard is refused naming that shard, so the streamed pass read it all.
# Prints the peak resident memory of the largest rank and the wall time.
# Usage: big_dataset_test.sh "MPIRUN [FLAGS]" MESHTRAIN SOURCE_DIR
set -u
mpirun=$1 meshtrain=$2 src=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cd "$src"
python3 - "$dir/shards" <<'PY' || fail "cannot write 4 GiB of shards in $dir"
import os, random, struct, sys
out = sys.argv[1]
os.makedirs(out)
count = (256 * 1024 * 1024 - 1024) // 2  # tokens a 256 MiB shard holds
rng = random.Random(5)
block = struct.pack("<524288H", *[rng.randrange(500) for _ in range(524288)])  # 1 MiB of tokens below 500
for i in range(16):
    with open(f"{out}/train_{i:06d}.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, count, *([0] * 253)))
        for _ in range(255):
            f.write(block)
        tail = bytearray(block[: 1024 * 1024 - 1024])
        if i == 15:
            tail[-2:] = struct.pack("<H", 510)  # the last token: 510
        f.write(tail)
PY
[ "$(du -cb "$dir"/shards/*.bin | tail -1 | cut -f1)" = 4294967296 ] || fail "the shards are not 4 GiB"
model=(--config configs/debug.toml --model.dim 64 --model.n_layers 2 --model.n_heads 4 --model.n_kv_heads 2
       --model.ffn_dim 128 --model.vocab_size 512 --data.seq_len 64 --data.batch_size 8 --checkpoint.folder ""
       --metrics.file "" --metrics.log_every 1 --data.path "$dir/shards")

# Runs 4 ranks (output to $dir/out); prints the exit status, the largest rank's peak resident memory
# (RUSAGE_CHILDREN: the largest descendant's) and the wall time; exits with the status, or 3 at 300 MiB or more.
python3 - "$dir/out" $mpirun -np 4 "$meshtrain" train "${model[@]}" --parallel.dp_shard 4 --training.steps 3 <<'PY'
import resource, subprocess, sys, time
out, command = sys.argv[1], sys.argv[2:]
start = time.monotonic()
with open(out, "w") as log:
    rc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=600).returncode
peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(f"exit {rc}; the largest rank's peak resident memory {peak_mib:.0f} MiB (must be < 300); "
      f"wall time {time.monotonic() - start:.1f} s")
sys.exit(rc if rc != 0 else (0 if peak_mib < 300 else 3))
PY
rc=$?
[ $rc -eq 0 ] || { tail -20 "$dir/out"; fail "4 ranks on 4 GiB of shards: exit $rc (3: 300 MiB or more resident)"; }
grep -q '^step *3/' "$dir/out" || { tail -20 "$dir/out"; fail "no step 3 logged"; }
out=$(timeout 300 "$meshtrain" train "${model[@]}" --training.steps 1 --model.vocab_size 510 2>&1)
grep -qF "data file $dir/shards/train_000015.bin holds token 510 but model.vocab_size is 510" <<<"$out" ||
  { echo "$out" | tail -5; fail "token 510 at the end of the last shard was not found, or not named by its shard"; }
echo "ok: 4 GiB of 16 shards trained 3 steps on 4 ranks, each under 300 MiB resident"
