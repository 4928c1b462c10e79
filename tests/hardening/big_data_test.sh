#!/usr/bin/env bash
# A 4 GiB .txt trains in less than 1 GiB of resident memory (issue 31): the
# loader maps the file and keeps its bytes at their width instead of reading
# it whole as 8-byte tokens (32 GiB). The file is sparse (zeros) with a few
# bytes written far apart; a run whose model.vocab_size is the largest of
# them must fail naming it, so the streamed pass read up to the file's end.
# Prints the peak resident memory, the wall time and the time to step 1.
# Usage: big_data_test.sh MESHTRAIN SOURCE_DIR
set -u
meshtrain=$1 src=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cd "$src"
data=$dir/big.txt
truncate -s 4G "$data" || fail "cannot make a 4 GiB sparse file in $dir"
for offset in 0 1073741947 2147483655 3221226471; do
  printf 'meshtrain' | dd of="$data" bs=1 seek="$offset" conv=notrunc status=none || fail "cannot write at $offset"
done
printf '\310' | dd of="$data" bs=1 seek=$((4 * 1024 * 1024 * 1024 - 5)) conv=notrunc status=none  # byte 200
[ "$(stat -c %s "$data")" = 4294967296 ] || fail "the data file is not 4 GiB"
model=(--config configs/debug.toml --model.dim 64 --model.n_layers 2 --model.n_heads 4 --model.n_kv_heads 2
       --model.ffn_dim 128 --data.seq_len 32 --data.batch_size 4 --checkpoint.folder "" --metrics.file ""
       --metrics.log_every 1 --data.path "$data")

# measure COMMAND...: runs it (output to $dir/out) and prints its exit
# status, peak resident memory (RUSAGE_CHILDREN: the largest child's),
# wall time and when it logged step 1; exits with its status, or 3 when
# the peak is 1 GiB or more.
measure() {
  python3 - "$dir/out" "$@" <<'PY'
import resource, subprocess, sys, time
out, command = sys.argv[1], sys.argv[2:]
start, first_step = time.monotonic(), None
with open(out, "w") as log, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
    for line in p.stdout:
        log.write(line)
        if first_step is None and line.startswith("step"):
            first_step = f"{time.monotonic() - start:.1f} s"
    rc = p.wait(timeout=600)
wall = time.monotonic() - start
peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(f"exit {rc}; peak resident memory {peak_mib:.0f} MiB (must be < 1024); wall time {wall:.1f} s; "
      f"step 1 logged after {first_step}")
sys.exit(rc if rc != 0 else (0 if peak_mib < 1024 else 3))
PY
}

measure "$meshtrain" train "${model[@]}" --training.steps 3
rc=$?
[ $rc -eq 0 ] || { tail -20 "$dir/out"; fail "training 3 steps on the 4 GiB file: exit $rc (3: 1 GiB or more resident)"; }
grep -q '^step *3/' "$dir/out" || { tail -20 "$dir/out"; fail "no step 3 logged"; }
out=$(timeout 300 "$meshtrain" train "${model[@]}" --training.steps 1 --model.vocab_size 200 2>&1)
grep -qF "holds token 200 but model.vocab_size is 200" <<<"$out" ||
  { echo "$out" | tail -5; fail "the byte 200 near the end of the file was not found"; }
echo "ok: 4 GiB of .txt trained 3 steps under 1 GiB resident"
