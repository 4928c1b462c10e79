#!/usr/bin/env bash
# validation.path: val_loss, the validation split's loss computed forward only on the training layout.
#   1. Against the training step's own forward on one rank: on a data file of exactly one batch every step trains
#      on that batch, so step 2's training loss is the loss of the validation run after step 1 (same weights, same
#      batch, validation.path the same file).
#   2. Against one rank: val_loss at every validation equals the single-rank run's on DDP 2, FSDP 2 x TP 2 with
#      sequence and loss parallel, 1F1B PP 2, PP 2 x FSDP 2, interleaved 1F1B and zero bubble with accumulation.
#   2b. A split of llm.c shards given as a glob: FSDP 2 against one rank.
#   3. No state touched: the training losses and gradient norms of a run with validations are bitwise those of the
#      same run without.
#   4. Bad input: a split shorter than one batch, tokens over the vocabulary, validation keys without a path.
# Usage: validation_test.sh "MPIRUN [FLAGS]" MESHTRAIN SOURCE_DIR
source "$(dirname "$0")/common.sh"
# The relative tolerance against one rank: the largest difference measured, 3.0e-8 (each batch's loss is an f32
# sum, in another order on other layouts) -> 2e-7 (6.7x).
tolerance=2e-7
model=(--config configs/debug.toml --model.dim 64 --model.n_layers 4 --model.n_heads 4 --model.n_kv_heads 2
       --model.ffn_dim 128 --data.seq_len 32 --data.batch_size 8 --training.steps 3 --checkpoint.folder ""
       --metrics.log_every 1)
# train NAME NP ARGS...: the small model on NP ranks, its metrics in $dir/NAME.jsonl.
train() {
  local name=$1 np=$2 launch=()
  shift 2
  [ "$np" -gt 1 ] && launch=($mpirun -np "$np")
  timeout 300 "${launch[@]}" "$meshtrain" train "${model[@]}" --metrics.file "$dir/$name.jsonl" "$@" \
    > "$dir/$name.out" 2>&1 || { cat "$dir/$name.out"; fail "$name exited non-zero"; }
}
# field NAME KEY: KEY of every logged step of run NAME, one per line (repr), "-" where absent.
field() {
  python3 -c "import json, sys
for line in open(sys.argv[1]): print(repr(json.loads(line).get(sys.argv[2], '-')))" "$dir/$1.jsonl" "$2"
}

# 1. The forward-only program against the training step's forward.
head -c $((8 * 32 + 1)) data/corpus.txt > "$dir/one_batch.txt"
train one_batch 1 --data.path "$dir/one_batch.txt" --validation.path "$dir/one_batch.txt" --validation.steps 1 \
  --validation.every 1 --training.steps 2
python3 - "$dir/one_batch.jsonl" <<'PY' || exit 1
import json, sys
steps = [json.loads(line) for line in open(sys.argv[1])]
val, train = steps[0]["val_loss"], steps[1]["loss"]
rel = abs(val - train) / abs(train)
print(f"val_loss after step 1 {val!r}, training loss of step 2 on the same batch {train!r}: relative {rel:.1e}")
# The training loss is the f32 graph output; val_loss one batch's, in f64 from the same f32.
if rel > 1e-7: sys.exit("FAIL: the forward-only loss is not the training step's")
PY

# 2. Every layout against one rank (validations after steps 2 and 3: every 2, and one after the last).
val=(--validation.path data/corpus.txt --validation.steps 3 --validation.every 2)
train one 1 "${val[@]}"
train one_accum 1 "${val[@]}" --training.grad_accum_steps 2 --data.batch_size 16
layouts=(
  "ddp 2 one --parallel.dp_replicate 2 --parallel.dp_shard 1"
  "fsdp_tp 4 one --parallel.dp_shard 2 --parallel.tp 2 --parallel.sequence_parallel true --parallel.loss_parallel true"
  "pp_1f1b 2 one --parallel.pp 2 --parallel.dp_shard 1 --parallel.pp_microbatches 4"
  "pp_fsdp 4 one --parallel.pp 2 --parallel.dp_shard 2 --parallel.pp_microbatches 2"
  "pp_interleaved 2 one --parallel.pp 2 --parallel.dp_shard 1 --parallel.pp_schedule interleaved_1f1b --parallel.pp_stages_per_rank 2 --parallel.pp_microbatches 4"
  "pp_zero_bubble 2 one_accum --parallel.pp 2 --parallel.dp_shard 1 --parallel.pp_schedule zero_bubble --parallel.pp_microbatches 4 --training.grad_accum_steps 2 --data.batch_size 16"
)
for layout in "${layouts[@]}"; do
  read -r name np reference args <<<"$layout"
  train "$name" "$np" "${val[@]}" $args
  python3 - "$name" "$dir/$name.jsonl" "$dir/$reference.jsonl" "$tolerance" <<'PY' || exit 1
import json, sys
name, tolerance = sys.argv[1], float(sys.argv[4])
ours, one = ([json.loads(line) for line in open(path)] for path in sys.argv[2:4])
pairs = [(m["step"], m["val_loss"], r["val_loss"]) for m, r in zip(ours, one) if "val_loss" in r]
if [p[0] for p in pairs] != [2, 3] or any("val_loss" in m for m in ours if m["step"] not in (2, 3)):
    sys.exit(f"FAIL: {name}: validations after steps {[m['step'] for m in ours if 'val_loss' in m]}, expected 2 and 3")
worst = max(abs(v - r) / abs(r) for _, v, r in pairs)
print(f"{name}: val_loss {[p[1] for p in pairs]} vs one rank's {[p[2] for p in pairs]}: worst relative {worst:.1e}")
if worst > tolerance: sys.exit(f"FAIL: {name}: val_loss off one rank's by {worst:.1e} (allowed {tolerance:g})")
PY
done

# 2b. A split of llm.c shards given as a glob (as meshtrain tokenize writes OUT/val_*.bin): FSDP 2 against one rank.
python3 - "$dir" <<'PY'
import struct, sys
text = open("data/corpus.txt", "rb").read()
for k, part in enumerate((text[:3000], text[3000:7000])):
    with open(f"{sys.argv[1]}/val_{k:06d}.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(part), *[0] * 253))
        f.write(struct.pack(f"<{len(part)}H", *part))
PY
shards=(--validation.path "$dir/val_*.bin" --validation.steps 3)
train shards_one 1 "${shards[@]}"
train shards_fsdp 2 "${shards[@]}" --parallel.dp_shard 2
python3 - "$dir/shards_fsdp.jsonl" "$dir/shards_one.jsonl" "$tolerance" <<'PY' || exit 1
import json, sys
ours, one = ([json.loads(line)["val_loss"] for line in open(p) if "val_loss" in line] for p in sys.argv[1:3])
worst = max(abs(a - b) / abs(b) for a, b in zip(ours, one))
print(f"shards (glob): FSDP 2 val_loss {ours} vs one rank's {one}: worst relative {worst:.1e}")
if len(ours) != 1 or len(one) != 1 or worst > float(sys.argv[3]): sys.exit("FAIL: val_loss over shards")
PY

# 3. Validations leave the training as it was.
train fsdp_tp_plain 4 --parallel.dp_shard 2 --parallel.tp 2 --parallel.sequence_parallel true --parallel.loss_parallel true
for key in loss grad_norm; do
  [ "$(field fsdp_tp "$key")" = "$(field fsdp_tp_plain "$key")" ] ||
    fail "FSDP 2 x TP 2: the $key of a run with validations differs from the same run's without"
done
echo "validations leave every step's loss and grad_norm bitwise as they were"

# 4. Bad input: one error each, printed once, every rank exiting.
head -c 100 data/corpus.txt > "$dir/short.txt"
bad 2 "validation.path: data file $dir/short.txt holds 100 tokens, fewer than one batch needs" \
  --parallel.dp_shard 2 --validation.path "$dir/short.txt"
printf 'caf\xc3\xa9 %.0s' $(seq 100) > "$dir/utf8.txt"
bad 2 "validation.path: data file $dir/utf8.txt holds token 195 but model.vocab_size is 128" \
  --parallel.dp_shard 2 --model.vocab_size 128 --data.path "$dir/one_batch.txt" --validation.path "$dir/utf8.txt"
bad 2 "validation.every = 5 applies to a validation, but validation.path is not set" --validation.every 5
echo "PASS"
