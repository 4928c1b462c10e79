#!/usr/bin/env bash
# What `meshtrain train` writes fails loudly and loses nothing (issue 15,
# class 2): on a full disk (a small tmpfs) a checkpoint is an error naming
# it, with no partial file or temporary left and the earlier checkpoint
# intact, run.json (beside the metrics) an error before the first step, and a
# metrics file that cannot grow is an error at that step; a
# read-only checkpoint folder is found before the first step; an output
# that is also the input (metrics file or trace = the data file) is refused
# and the data file is untouched. The disk cases mount small tmpfs: as root,
# or else in a user and mount namespace of the test's own (unshare -rm) where
# the kernel allows one; where neither can, the test exits 77 after the other
# cases, which CTest reports as skipped (SKIP_RETURN_CODE), not passed.
# Usage: output_files_test.sh MESHTRAIN SOURCE_DIR
set -u
meshtrain=$1 src=$2
probe=$(mktemp -d)
if mount -t tmpfs -o size=64k tmpfs "$probe" 2>/dev/null; then
  umount "$probe"
elif [ -z "${OUTPUT_FILES_TEST_IN_NAMESPACE:-}" ] && unshare --user --map-root-user --mount true 2>/dev/null; then
  rmdir "$probe"
  echo "no tmpfs mounts here: running in a user and mount namespace of its own (unshare -rm)"
  OUTPUT_FILES_TEST_IN_NAMESPACE=1 exec unshare --user --map-root-user --mount "$0" "$@"
fi
rmdir "$probe"
dir=$(mktemp -d)
mounted=()
cleanup() { for m in "${mounted[@]}"; do umount "$m" 2>/dev/null; done; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
cd "$src"
model=(--config configs/debug.toml --model.dim 64 --model.n_layers 2 --model.n_heads 4 --model.n_kv_heads 2
       --model.ffn_dim 128 --data.seq_len 32 --data.batch_size 4 --metrics.file "")
train() { timeout 120 "$meshtrain" train "${model[@]}" "$@" 2>&1; }

# An output that is also the input.
cp data/corpus.txt "$dir/data.txt"
before=$(sha256sum < "$dir/data.txt")
out=$(train --data.path "$dir/data.txt" --training.steps 2 --checkpoint.folder "" --metrics.file "$dir/data.txt")
[ $? -ne 0 ] && grep -q 'metrics.file .* is also data.path' <<<"$out" || { echo "$out"; fail "metrics.file = data.path was not refused"; }
out=$(train --data.path "$dir/data.txt" --training.steps 2 --checkpoint.folder "" --trace "$dir/./data.txt")
[ $? -ne 0 ] && grep -q -- '--trace .* is also data.path' <<<"$out" || { echo "$out"; fail "--trace = data.path was not refused"; }
[ "$(sha256sum < "$dir/data.txt")" = "$before" ] || fail "the data file changed"
cp configs/debug.toml "$dir/config.toml"
out=$(timeout 120 "$meshtrain" train "${model[@]:2}" --config "$dir/config.toml" --training.steps 2 --checkpoint.folder "" \
      --metrics.file "$dir/config.toml" 2>&1)
[ $? -ne 0 ] && grep -q 'metrics.file .* is also the --config file' <<<"$out" || { echo "$out"; fail "metrics.file = --config was not refused"; }
cmp -s configs/debug.toml "$dir/config.toml" || fail "the config file changed"
echo "an output equal to an input (data, config) is refused; the inputs are untouched"

# Every command's outputs against its inputs (issue 31, item 4): export --out
# onto the checkpoint's shard or metadata, checkpoint.export onto an older
# checkpoint's shard, --dump-graph onto the data file or the shard being
# resumed, lower --out and estimate --trace onto the config or the hardware
# profile. Each refused, the input unchanged.
refused() {  # WORDS FILE ARGS...: meshtrain ARGS fails saying WORDS, FILE unchanged
  local words=$1 file=$2 sum out
  shift 2
  sum=$(sha256sum < "$file")
  out=$(timeout 120 "$meshtrain" "$@" 2>&1)
  [ $? -ne 0 ] && grep -qF -- "$words" <<<"$out" || { echo "$out"; fail "not refused: meshtrain $*"; }
  [ "$(sha256sum < "$file")" = "$sum" ] || fail "$file changed: meshtrain $*"
}
ckpt=$dir/ckpt
train --training.steps 2 --checkpoint.folder "$ckpt" --checkpoint.interval 1 >/dev/null || fail "training for the checkpoints failed"
shard=$ckpt/step_000001/rank_00000.safetensors
refused "is a file of the checkpoint being exported" "$shard" export --checkpoint "$ckpt/step_000001" --out "$shard"
refused "is a file of the checkpoint being exported" "$ckpt/step_000002/metadata.json" export --checkpoint "$ckpt" \
  --out "$ckpt/step_000002/metadata.json"
refused "is a file of a checkpoint in checkpoint.folder" "$shard" train "${model[@]}" --training.steps 3 \
  --checkpoint.folder "$ckpt" --checkpoint.export "$shard"
refused "--dump-graph $dir/data.txt is also data.path" "$dir/data.txt" train "${model[@]}" --data.path "$dir/data.txt" \
  --training.steps 1 --checkpoint.folder "" --dump-graph "$dir/data.txt"
refused "is a file of a checkpoint in checkpoint.folder" "$ckpt/step_000002/rank_00000.safetensors" train "${model[@]}" \
  --training.steps 3 --checkpoint.folder "$ckpt" --dump-graph "$ckpt/step_000002/rank_00000.safetensors"
cp configs/hardware/h100-sxm.toml "$dir/profile.toml"
refused "--out $dir/config.toml is also the --config file" "$dir/config.toml" lower --ranks 2 "${model[@]:2}" \
  --config "$dir/config.toml" --out "$dir/config.toml"
refused "is also schedule.hardware" "$dir/profile.toml" lower --ranks 2 "${model[@]}" --schedule.hardware "$dir/profile.toml" \
  --out "$dir/profile.toml"
refused "--trace $dir/config.toml is also the --config file" "$dir/config.toml" estimate --ranks 2 "${model[@]:2}" \
  --config "$dir/config.toml" --hardware h100-sxm --trace "$dir/config.toml"
refused "--trace $dir/profile.toml is also the --hardware profile" "$dir/profile.toml" estimate --ranks 2 "${model[@]}" \
  --hardware "$dir/profile.toml" --trace "$dir/profile.toml"
echo "no command's output replaces its inputs (checkpoints, data, config, hardware profile)"

# An output that names a FIFO (as it would a device such as /dev/null) is
# refused and the node stays what it was, never renamed over (issue 31).
mkfifo "$dir/out.fifo"
out=$(timeout 60 "$meshtrain" lower --ranks 2 "${model[@]}" --out "$dir/out.fifo" 2>&1)
[ $? -ne 0 ] && grep -q 'out.fifo: it is not a regular file' <<<"$out" || { echo "$out"; fail "lower --out FIFO was not refused"; }
out=$(timeout 60 "$meshtrain" estimate --ranks 2 "${model[@]}" --hardware cpu-2core --trace "$dir/out.fifo" 2>&1)
[ $? -ne 0 ] && grep -q 'out.fifo: it is not a regular file' <<<"$out" || { echo "$out"; fail "estimate --trace FIFO was not refused"; }
[ -p "$dir/out.fifo" ] || fail "the FIFO was replaced"
echo "an output that is a FIFO is refused and left as it was"

mount_tmpfs() {  # DIR SIZE [ro]
  mkdir -p "$1"
  mount -t tmpfs -o "size=$2${3:+,$3}" tmpfs "$1" 2>/dev/null || return 1
  mounted+=("$1")
}
if ! mount_tmpfs "$dir/full" 256k; then
  echo "SKIPPED the disk cases (a full disk, a read-only folder): cannot mount a tmpfs here, as root or in a user" \
    "namespace (unshare -rm); the cases above passed"
  exit 77
fi
# A checkpoint (about 1.4 MiB here: weights and AdamW moments) on a 256 KiB disk.
out=$(train --training.steps 2 --checkpoint.folder "$dir/full/ckpt")
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "$out"; fail "a checkpoint on a full disk: exit $rc"; }
grep -q 'writing checkpoint .*step_000002 failed: writing .*step_000002.tmp/rank_00000.safetensors failed: write: .*(the disk is full); nothing was written' <<<"$out" ||
  { echo "$out"; fail "no clear error for the checkpoint on a full disk"; }
grep -q '^saved' <<<"$out" && { echo "$out"; fail "a checkpoint that failed was reported saved"; }
[ -z "$(ls -A "$dir/full/ckpt")" ] || { ls -laR "$dir/full/ckpt"; fail "a partial checkpoint or temporary was left"; }
echo "checkpoint on a full disk: one clear error, nothing left under its name"

# The same with an earlier checkpoint that fits: it stays as it was, and
# the run resumed from it (step 1) fails saving step 2.
mount_tmpfs "$dir/mid" 2000k || fail "second tmpfs"
train --training.steps 1 --checkpoint.folder "$dir/mid/ckpt" > /dev/null || fail "a first checkpoint that fits"
first=$(cat "$dir/mid/ckpt/step_000001/"* | sha256sum)
out=$(train --training.steps 2 --checkpoint.folder "$dir/mid/ckpt" --checkpoint.interval 1)
[ $? -ne 0 ] || { echo "$out"; fail "the second checkpoint on a full disk did not fail"; }
grep -q 'resumed from .*step_000001' <<<"$out" || { echo "$out"; fail "the second run did not resume from step 1"; }
[ "$(cat "$dir/mid/ckpt/step_000001/"* | sha256sum)" = "$first" ] || fail "the earlier checkpoint changed"
[ "$(ls -A "$dir/mid/ckpt")" = "step_000001" ] || { ls -la "$dir/mid/ckpt"; fail "files left beside the earlier checkpoint"; }
echo "a failed checkpoint leaves the earlier one intact"

# A metrics file on a disk with no room left: run.json, written beside it as
# the run starts, fails before the first step.
mount_tmpfs "$dir/metrics" 64k || fail "third tmpfs"
dd if=/dev/zero of="$dir/metrics/filler" bs=4k 2>/dev/null
out=$(train --training.steps 3 --checkpoint.folder "" --metrics.file "$dir/metrics/m.jsonl")
[ $? -ne 0 ] && grep -q 'writing .*metrics/run.json failed: .*No space left' <<<"$out" ||
  { echo "$out"; fail "no clear error for run.json on a full disk"; }
grep -q '^step ' <<<"$out" && { echo "$out"; fail "training ran before run.json failed"; }
[ "$(ls -A "$dir/metrics")" = filler ] || { ls -la "$dir/metrics"; fail "files left beside the filler"; }
echo "run.json on a full disk: an error before the first step"
# Room for run.json (one 4 KiB block) and none for the metrics: an error at that step.
rm "$dir/metrics/filler"
dd if=/dev/zero of="$dir/metrics/filler" bs=4k count=$(($(df --output=avail -B4096 "$dir/metrics" | tail -1) - 1)) 2>/dev/null
out=$(train --training.steps 3 --checkpoint.folder "" --metrics.file "$dir/metrics/m.jsonl")
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "$out"; fail "metrics on a full disk: exit $rc"; }
grep -q 'writing metrics file .*m.jsonl failed at step [0-9]' <<<"$out" || { echo "$out"; fail "no clear error for the metrics file"; }
echo "metrics file on a full disk: an error at the step it failed"

# A read-only checkpoint folder, found before the first step.
mount_tmpfs "$dir/ro" 64k ro || fail "read-only tmpfs"
out=$(train --training.steps 3 --checkpoint.folder "$dir/ro")
[ $? -ne 0 ] && grep -q 'checkpoint.folder .* is not writable' <<<"$out" || { echo "$out"; fail "no error for a read-only checkpoint folder"; }
grep -q '^step ' <<<"$out" && { echo "$out"; fail "training ran before the read-only folder was found"; }
echo "read-only checkpoint folder: an error before the first step"
echo PASS
