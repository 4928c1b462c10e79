#!/usr/bin/env bash
# `meshtrain lower` of a 1-layer Llama under FSDP 2 x TP 2, rank 0, against
# the committed golden text (lower_fsdp2_tp2_1layer_rank0.txt): every node
# with its local shape and layout, every collective with its group, mesh
# dims, layouts and bytes, and the per-phase collective summary. A change to
# the plan, propagation or lowering shows here as a diff; if it is meant,
# regenerate with UPDATE=1 and check the summary's counts by hand
# (docs/architecture.md says what each is).
# Usage: lower_golden_test.sh MESHTRAIN SOURCE_DIR
set -u
meshtrain=$1 src=$2
golden=$src/tests/golden/lower_fsdp2_tp2_1layer_rank0.txt
cd "$src"
out=$("$meshtrain" lower --ranks 4 --rank 0 --config configs/debug.toml --parallel.tp 2 --model.n_layers 1 \
  --model.dim 16 --model.n_heads 4 --model.n_kv_heads 2 --model.ffn_dim 32 --model.vocab_size 32 \
  --data.batch_size 4 --data.seq_len 16) || { echo "FAIL: meshtrain lower exited non-zero"; exit 1; }
if [ "${UPDATE:-0}" = 1 ]; then
  printf '%s\n' "$out" > "$golden"
  echo "updated $golden"
  exit 0
fi
if ! diff -u "$golden" <(printf '%s\n' "$out"); then
  echo "FAIL: the lowered graph differs from $golden (UPDATE=1 $0 ... rewrites it)"
  exit 1
fi
echo "PASS: $(grep -c '' "$golden") lines, $(tail -1 "$golden")"
