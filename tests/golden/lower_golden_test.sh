#!/usr/bin/env bash
# `meshtrain lower` of a 1-layer Llama under FSDP 2 x TP 2, rank 0, against
# the committed golden text (lower_fsdp2_tp2_1layer_rank0.txt): every node
# with its local shape and layout, every collective with its group, mesh
# dims, layouts and bytes, and the per-phase collective summary. A change to
# the plan, propagation or lowering shows here as a diff. The test never
# rewrites the golden: scripts/update-goldens.sh does, and prints the diff.
# Before the diff, the collectives of the lowered text are counted per phase,
# kind and mesh dim (and the FSDP traffic's bytes summed) and compared with
# what the layout implies, derived below from the model's parameter list
# (counts_check); the 1-layer golden and a 2-layer run (no golden) both, so
# the per-block terms are checked apart from the constant ones; and the
# summary lines must agree with the nodes.
# Usage: lower_golden_test.sh MESHTRAIN SOURCE_DIR
set -u
meshtrain=$1 src=$2
cd "$src" || { echo "FAIL: no source folder $src"; exit 1; }
# shellcheck source=tests/golden/lower_golden_args.sh
source tests/golden/lower_golden_args.sh
out=$("$meshtrain" "${golden_args[@]}") || { echo "FAIL: meshtrain lower exited non-zero"; exit 1; }
out2=$("$meshtrain" "${golden_args[@]}" --model.n_layers 2) ||
  { echo "FAIL: meshtrain lower (2 layers) exited non-zero"; exit 1; }

# counts_check LAYERS TEXT: TEXT (meshtrain lower's output for LAYERS blocks) has exactly the collectives derived here.
counts_check() {
  python3 - "$1" "$2" "${golden_model[@]}" <<'PY'
import collections, re, sys
L, text, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
m = {k[len("--model."):]: int(v) for k, v in zip(args[::2], args[1::2]) if k.startswith("--model.")}
d, h, kv, f, V = m["dim"], m["n_heads"], m["n_kv_heads"], m["ffn_dim"], m["vocab_size"]
hd, tp = d // h, 2  # head dim; --parallel.tp 2 on 4 ranks leaves dp_shard 2 (dp_replicate 1)
# The layout (docs/parallelism.md, docs/architecture.md): Megatron TP splits q, k, v, gate and up by output features,
# o and down by input features, the embedding table and lm_head (untied in configs/debug.toml) by vocabulary; the norm
# weights are replicated over tp. FSDP then shards each tp-local parameter over dp_shard, in units gathered and
# reduced as one: the table, each block's 9 weights (one bucket: [schedule] bucket_mode per_block), the final norm,
# lm_head: 3 + L units. Sequence and loss parallel are off, gradient clipping is on (max_grad_norm 1), f32.
table = V // tp * d                                          # the table's and lm_head's tp-local elements, each
block = (h * hd + 2 * kv * hd) // tp * d + d * (h * hd) // tp + 3 * (f // tp) * d + 2 * d  # q k v, o, gate up down, 2 norms
fsdp_bytes = 4 * (2 * table + L * block + d)                 # f32: every unit's tp-local elements
E = {
  # FSDP over dp_shard. Forward gathers each unit once, before its first use.
  ("forward", "all_gather", "dp_shard"): (3 + L, fsdp_bytes),
  # reshard_after_forward (true by default) frees them after forward, so backward gathers again each unit whose
  # backward reads its weight: every block (dx = dy W), the final norm (rms_norm_backward), lm_head (dx = dlogits W).
  # Not the table: the embedding's backward adds the output gradient into the tokens' rows without reading it.
  ("backward", "all_gather", "dp_shard"): (2 + L, fsdp_bytes - 4 * table),
  # Every unit's gradient reduce_scattered once, to the parameter's shard.
  ("backward", "reduce_scatter", "dp_shard"): (3 + L, fsdp_bytes),
  # The loss is a mean over every rank's valid targets: their count (f64) summed before cross_entropy, and the
  # loss itself (f32) summed so that every rank reports the global one: over tp too, where the rows are split.
  ("forward", "all_reduce", "dp_shard"): (1, None),
  ("forward", "all_reduce", "dp_shard+tp"): (1, None),
  # cross_entropy_backward reads forward's summed count: a scalar is redistributed once for all its readers.
  ("backward", "all_reduce", "dp_shard"): (0, None),
  # Clipping's global norm: this rank's sum of squares (f64) summed over dp_shard once.
  ("optimizer", "all_reduce", "dp_shard"): (1, None),
  # TP over tp. o and down give partial sums: one all_reduce per attention and per MLP block (Megatron's g).
  ("forward", "all_reduce", "tp"): (2 * L, None),
  # Backward's mirror (Megatron's f): the gradients of the column-parallel projections' input, partial over tp,
  # added within the block and all_reduced once per attention and per MLP block.
  ("backward", "all_reduce", "tp"): (2 * L, None),
  # The vocab-split table gathered whole for the lookup.
  ("forward", "all_gather", "tp"): (1, None),
  # cross_entropy and its backward work on rows: the logits go from vocab-split to row-split once (all_to_all, half
  # the bytes of gathering them whole), the targets (for each) and the final norm's output are split likewise where
  # they are (shard_locally: no bytes).
  ("forward", "all_to_all", "tp"): (1, None),
  ("forward", "shard_locally", "tp"): (1, None),
  ("backward", "shard_locally", "tp"): (2, None),
  # lm_head's weight gathered whole over tp for the row-split dx = dlogits W, and that dx gathered back to whole rows.
  ("backward", "all_gather", "tp"): (2, None),
  # lm_head's gradient from row-split dlogits is partial over tp: reduce_scattered to its vocab split.
  ("backward", "reduce_scatter", "tp"): (1, None),
  # Clipping's norm: each tp-split gradient's sum of squares is partial over tp. A block's 7 projections are
  # all_reduced one by one; the table's and lm_head's are added first and all_reduced once; the norms need none.
  ("optimizer", "all_reduce", "tp"): (7 * L + 1, None),
}
header = re.search(r"^# rank \d+ of mesh \((.*)\)$", text, re.M)
names = [kv.split("=")[0] for kv in header.group(1).split(", ")]
got, got_bytes = collections.Counter(), collections.Counter()
node = re.compile(r"= (\w+)\(.*\{(.*)\}  # (\w+) ")
for line in text.splitlines():
  n = node.search(line)
  if not n or "mesh_dims=" not in n.group(2):
    continue
  dims = re.search(r"\bmesh_dims=\[([\d, ]*)\]", n.group(2)).group(1)
  key = (n.group(3), n.group(1), "+".join(names[int(i)] for i in dims.split(", ")))
  got[key] += 1
  got_bytes[key] += int(re.search(r"(?:^|, )bytes=(\d+)", n.group(2)).group(1))
summary = {}
for s in re.finditer(r"^# (\w+) +(\w+) +over (\S+) +group [\d,]+ +(\d+) x, +(\d+) bytes$", text, re.M):
  summary[s.group(1, 2, 3)] = (int(s.group(4)), int(s.group(5)))
bad = []
for key in sorted(set(E) | set(got)):
  want, want_bytes = E.get(key, (0, None))
  line = f"{' '.join(key):40} {got[key]:3} x (derived {want}), {got_bytes[key]:6} bytes"
  if want_bytes is not None:
    line += f" (derived {want_bytes})"
  print("  " + line)
  if got[key] != want or (want_bytes is not None and got_bytes[key] != want_bytes):
    bad.append(line)
if summary != {k: (got[k], got_bytes[k]) for k in got}:
  bad.append(f"the summary lines {summary} disagree with the nodes {dict(got)}")
total = re.search(r"^# (\d+) collectives, (\d+) bytes$", text, re.M)
if not total or (int(total.group(1)), int(total.group(2))) != (sum(got.values()), sum(got_bytes.values())):
  bad.append(f"the total line disagrees with the nodes' {sum(got.values())} collectives")
if bad:
  sys.exit(f"FAIL ({L} layer(s)): the collectives differ from the layout's:\n  " + "\n  ".join(bad))
print(f"{L} layer(s): {sum(got.values())} collectives, as the layout implies")
PY
}
counts_check 1 "$out" || exit 1
counts_check 2 "$out2" || exit 1
if ! diff -u "$golden_file" <(printf '%s\n' "$out"); then
  echo "FAIL: the lowered graph differs from $golden_file (if meant: scripts/update-goldens.sh rewrites it and prints the diff)"
  exit 1
fi
echo "PASS: $(grep -c '' "$golden_file") lines, $(tail -1 "$golden_file")"
