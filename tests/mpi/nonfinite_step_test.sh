#!/usr/bin/env bash
# A diverging run under mpirun (FSDP 2, learning rate 1e20): the step whose
# gradient norm is not finite applies no update on any rank; the job stops
# with one error saying so, printed once, every rank exiting non-zero (not
# a hang); the last good step's weights are kept as its checkpoint, with
# no later one, and every value in it is finite. With training.skip_nonfinite
# the same run goes on to its last step, counting the skipped steps.
# Usage: nonfinite_step_test.sh "MPIRUN [FLAGS]" MESHTRAIN SOURCE_DIR
source "$(dirname "$0")/common.sh"
out=$(timeout 120 $mpirun -np 2 "$meshtrain" train --config configs/debug.toml --model.dim 64 --model.n_layers 2 \
  --model.n_heads 4 --model.n_kv_heads 2 --model.ffn_dim 128 --data.seq_len 32 --optimizer.lr 1e20 \
  --lr_scheduler.warmup_steps 0 --training.steps 10 --checkpoint.folder "$dir/ckpt" --checkpoint.interval 0 \
  --metrics.file "" 2>&1)
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "$out"; fail "exit $rc (expected a non-zero exit, not a hang)"; }
[ "$(grep -c 'the update was not applied' <<<"$out")" = 1 ] || { echo "$out"; fail "the non-finite step's error is not printed exactly once"; }
step=$(sed -n 's/.*error: step \([0-9]*\): the gradient norm is.*/\1/p' <<<"$out")
[ -n "$step" ] && [ "$step" -ge 2 ] || { echo "$out"; fail "no step named, or the first step diverged"; }
good=$(printf 'step_%06d' $((step - 1)))
[ "$(ls "$dir/ckpt")" = "$good" ] || { ls "$dir/ckpt"; fail "expected only $good in the checkpoint folder"; }
"$meshtrain" export --checkpoint "$dir/ckpt/$good" --out "$dir/good.safetensors" >/dev/null || fail "export of $good failed"
python3 - "$dir/good.safetensors" <<'PY' || exit 1
import json, math, struct, sys
from array import array
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
body = data[8 + n:]
count = 0
for name, t in header.items():
    if name == "__metadata__":
        continue
    assert t["dtype"] == "F32", (name, t["dtype"])
    begin, end = t["data_offsets"]
    values = array("f")
    values.frombytes(body[begin:end])
    bad = sum(1 for v in values if not math.isfinite(v))
    if bad:
        sys.exit(f"FAIL: {name} holds {bad} non-finite values")
    count += len(values)
print(f"checkpoint exported: {count} values, all finite")
PY
echo "step $step: gradient norm not finite, one error, every rank exited $rc; $good kept"

# training.skip_nonfinite = true: the same run goes on to its last step on every rank, counting the skips.
out=$(timeout 120 $mpirun -np 2 "$meshtrain" train --config configs/debug.toml --model.dim 64 --model.n_layers 2 \
  --model.n_heads 4 --model.n_kv_heads 2 --model.ffn_dim 128 --data.seq_len 32 --optimizer.lr 1e20 \
  --lr_scheduler.warmup_steps 0 --training.steps 10 --training.skip_nonfinite true --checkpoint.folder "" \
  --metrics.file "$dir/metrics.jsonl" --metrics.log_every 1 2>&1)
rc=$?
[ $rc -eq 0 ] || { echo "$out"; fail "skip_nonfinite: exit $rc"; }
skipped=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])["skipped_steps"])' "$dir/metrics.jsonl")
[ "$skipped" = $((10 - step + 1)) ] || { echo "$out"; fail "skip_nonfinite: $skipped steps skipped, expected $((10 - step + 1))"; }
echo "skip_nonfinite: all 10 steps ran on both ranks, $skipped skipped (from step $step on)"
echo PASS
