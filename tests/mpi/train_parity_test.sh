#!/usr/bin/env bash
# meshtrain train under mpirun against one rank: DDP 2, FSDP 2 and 4, HSDP
# 2x2, FSDP 2 x TP 2, DDP 2 x TP 2 with sequence and loss parallel, TP 4,
# FSDP 2 with reshard_after_forward false, FSDP 2 with 2 microbatches of
# gradient accumulation, and FSDP 3
# (uneven parameter shards) on a small Llama (8 query heads over 4 kv heads),
# 20 steps with warmup, cosine decay, weight decay and active clipping.
# Every step's loss and gradient norm must match the single-rank run, and the
# gathered weights (checkpoint.export) the single-rank ones tensor by tensor,
# within the tolerances below; each run's sharded checkpoint, put back
# together by meshtrain export, must be those gathered weights bitwise.
# FSDP 2 x TP 2 in bf16 (gathered and reduced in bf16) must track one rank's
# bf16 run likewise. Bad [parallel] input must fail on every rank with one
# message. FSDP 2 x TP 2 from the committed PyTorch reference's weights
# matches its losses and gradient norms.
# Usage: train_parity_test.sh "MPIRUN [FLAGS]" MESHTRAIN SOURCE_DIR
source "$(dirname "$0")/common.sh"
# The tolerances (tests/mpi/compare_runs.py prints how close each run came), from the largest differences measured
# over these 20 steps on every layout below, on an AVX-512 CPU (with AVX512_BF16) and on an AVX2-only one (QEMU
# -cpu Haswell: oneDNN's AVX2 GEMMs, the generic bf16 attention and widened bf16 GEMMs), over shared memory and TCP,
# each with its margin. Relative: loss and grad_norm to the reference's; weights to each tensor's largest magnitude
# (max) and to its L2 norm (l2).
# f32: loss and grad_norm 1.2e-7 (an f32 ulp or two) -> 1e-6 (8.4x); weights max 1.2e-5 (DDP 2 x TP 2 with SP and
# LP) -> 1e-4 (8.3x), l2 5.1e-7 (FSDP 3) -> 4e-6 (7.8x).
f32=(1e-6 1e-6 1e-4 4e-6)
# bf16 FSDP 2 x TP 2 against one rank's bf16 run (the reductions in bf16 and in another order): loss 6.1e-5 (AVX2)
# -> 5e-4 (8.1x), grad_norm 6.9e-4 -> 5e-3 (7.3x), weights max 4.2e-2 (the embedding's rarely seen rows) -> 0.3
# (7.1x), l2 1.8e-3 -> 1.5e-2 (8.5x).
bf16=(5e-4 5e-3 0.3 1.5e-2)
# Against PyTorch's f32 run: loss 1.4e-7 -> 1e-6 (7.4x), grad_norm 4.3e-7 -> 4e-6 (9.4x), on both CPUs.
torch_loss=1e-6 torch_grad_norm=4e-6
model=(--config configs/debug.toml --model.dim 64 --model.n_layers 2 --model.n_heads 8 --model.n_kv_heads 4
       --model.ffn_dim 160 --data.seq_len 32 --data.batch_size 8 --training.steps 20 --metrics.log_every 1)
source "$(dirname "$0")/parity_runs.sh"
run one 1
run ddp2 2 --parallel.dp_replicate 2 --parallel.dp_shard 1
compare ddp2
run fsdp2 2
compare fsdp2
run hsdp 4 --parallel.dp_replicate 2 --parallel.dp_shard 2
compare hsdp
run fsdp4 4
compare fsdp4
run fsdp2_tp2 4 --parallel.tp 2
compare fsdp2_tp2
run ddp2_tp2_sp_lp 4 --parallel.dp_replicate 2 --parallel.dp_shard 1 --parallel.tp 2 --parallel.sequence_parallel true \
  --parallel.loss_parallel true
compare ddp2_tp2_sp_lp
run tp4 4 --parallel.dp_shard 1 --parallel.tp 4
compare tp4
# FSDP 2 keeping the gathered weights from forward to backward.
run fsdp2_keep 2 --parallel.reshard_after_forward false
compare fsdp2_keep
# Gradient accumulation: each rank's 4 sequences in 2 microbatches, against the whole batch at once.
run fsdp2_accum2 2 --training.grad_accum_steps 2
compare fsdp2_accum2
# bf16 compute (parameters gathered in bf16, gradients reduced in bf16) tracks one rank's bf16 run.
run one_bf16 1 --training.dtype bfloat16
run fsdp2_tp2_bf16 4 --parallel.tp 2 --training.dtype bfloat16 --training.reduce_dtype bfloat16
compare fsdp2_tp2_bf16 one_bf16 "${bf16[@]}"
# FSDP 3 needs a global batch that 3 divides: compare it with its own single-rank run.
mv "$dir/one.jsonl" "$dir/one8.jsonl"; mv "$dir/one" "$dir/one8"
run one 1 --data.batch_size 6
run fsdp3 3 --data.batch_size 6
compare fsdp3
# Against PyTorch (the committed reference, tests/parity/make_reference.py): FSDP 2 x TP 2 on 4 processes
# from the reference's initial weights, every step's loss and gradient norm within the tolerances above.
ref=data/parity/mha_untied.json
mapfile -t ref_args < <(python3 - "$ref" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
keys = {"seq_len": "data.seq_len", "batch_size": "data.batch_size", "lr": "optimizer.lr", "beta1": "optimizer.beta1",
        "beta2": "optimizer.beta2", "eps": "optimizer.eps", "weight_decay": "optimizer.weight_decay",
        "warmup_steps": "lr_scheduler.warmup_steps", "decay": "lr_scheduler.decay",
        "min_lr_ratio": "lr_scheduler.min_lr_ratio", "max_grad_norm": "training.max_grad_norm", "steps": "training.steps"}
text = lambda v: str(v).lower() if isinstance(v, bool) else str(v)
for k, v in r["model"].items(): print(f"--model.{k}"); print(text(v))
for k, v in r["train"].items(): print(f"--{keys[k]}"); print(text(v))
PY
)
timeout 300 $mpirun -np 4 "$meshtrain" train --config configs/debug.toml "${ref_args[@]}" --parallel.tp 2 \
  --data.path data/parity/text.txt --checkpoint.init_from data/parity/mha_untied.safetensors --checkpoint.folder "" \
  --metrics.file "$dir/torch_ref.jsonl" --metrics.log_every 1 > "$dir/torch_ref.out" 2>&1 \
  || { cat "$dir/torch_ref.out"; fail "FSDP 2 x TP 2 from the PyTorch reference's weights exited non-zero"; }
python3 - "$ref" "$dir/torch_ref.jsonl" "$torch_loss" "$torch_grad_norm" <<'PY' || exit 1
import json, sys
ref = json.load(open(sys.argv[1]))["steps"]
ours = [json.loads(l) for l in open(sys.argv[2])]
allowed = {"loss": float(sys.argv[3]), "grad_norm": float(sys.argv[4])}
assert len(ours) == len(ref) == 20, f"{len(ours)} steps logged, the reference has {len(ref)}"
worst = {"loss": 0.0, "grad_norm": 0.0}
for r, m in zip(ref, ours):
    for key in worst:
        rel = abs(m[key] - r[key]) / abs(r[key])
        worst[key] = max(worst[key], rel)
        if not rel <= allowed[key]:
            sys.exit(f"FAIL: FSDP 2 x TP 2 step {r['step']} {key} {m[key]} vs PyTorch's {r[key]} "
                     f"(relative {rel:.2e}, allowed {allowed[key]:g})")
print(f"FSDP 2 x TP 2 (4 processes) vs PyTorch: 20 steps, worst relative difference: loss {worst['loss']:.1e}, "
      f"grad_norm {worst['grad_norm']:.1e} (allowed {allowed['loss']:g}, {allowed['grad_norm']:g})")
PY
# Bad input: one message (from rank 0), every rank exits non-zero, no hang.
out=$(timeout 60 $mpirun -np 2 "$meshtrain" train "${model[@]}" --parallel.dp_shard 3 2>&1)
rc=$?
echo "$out"
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "bad parallel.dp_shard: exit $rc (expected a non-zero exit, not a hang)"
[ "$(grep -c 'parallel.dp_replicate (1) x parallel.dp_shard (3) x parallel.tp (1) = 3, but the job has 2 ranks' <<<"$out")" = 1 ] \
  || fail "the error is not printed exactly once"
out=$(timeout 60 $mpirun -np 2 "$meshtrain" train "${model[@]}" --data.batch_size 5 2>&1)
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "odd batch: exit $rc"
[ "$(grep -c 'data.batch_size 5 (the global batch, in sequences) must divide by the data-parallel degree 2' <<<"$out")" = 1 ] \
  || { echo "$out"; fail "the batch error is not printed exactly once"; }
# What each rank runs is what `meshtrain lower` prints for it without running anything.
timeout 120 $mpirun -np 4 "$meshtrain" train "${model[@]}" --parallel.tp 2 --training.steps 1 --metrics.file "" \
  --checkpoint.folder "" --dump-graph "$dir/dump{rank}.txt" --trace "$dir/trace.json" > "$dir/dump.out" 2>&1 \
  || { cat "$dir/dump.out"; fail "--dump-graph run"; }
for r in 0 1 2 3; do
  [ -s "$dir/dump$r.txt" ] || fail "rank $r wrote no --dump-graph file"
  "$meshtrain" lower --ranks 4 --rank $r "${model[@]}" --parallel.tp 2 | grep -v '^#' > "$dir/lower$r.txt"
  diff -q "$dir/dump$r.txt" "$dir/lower$r.txt" > /dev/null || { diff "$dir/dump$r.txt" "$dir/lower$r.txt" | head; fail "rank $r: --dump-graph differs from meshtrain lower --rank $r"; }
done
cmp -s "$dir/dump0.txt" "$dir/dump1.txt" && fail "ranks 0 and 1 dumped the same graph (rank 1's groups differ)"
echo "dump-graph: each of 4 ranks runs the graph meshtrain lower prints for it ($(grep -c '' "$dir/dump1.txt") lines)"
# --trace: one document with every rank's step, each collective of rank r's graph on its communication track.
waits=$(for r in 0 1 2 3; do grep -c ' = wait(' "$dir/dump$r.txt"; done | tr '\n' ' ')
python3 - "$dir/trace.json" $waits <<'PY' || fail "--trace"
import collections, json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
for rank, waits in enumerate(map(int, sys.argv[2:])):
    mine = [e for e in events if e["pid"] == rank]
    phases = collections.Counter(e["ph"] for e in mine)
    assert phases["b"] == phases["e"] == waits, (rank, phases, waits)
    assert phases["X"] > waits, (rank, phases)
    assert all(e["dur"] >= 0 for e in mine if e["ph"] == "X")
print(f"trace: 4 ranks, {len(events)} events, every collective from its start to its wait")
PY
bad 3 'model.n_heads 8 must divide by parallel.tp 3' --parallel.tp 3
bad 2 'model.n_kv_heads 3 must divide by parallel.tp 2' --parallel.tp 2 --model.n_heads 6 --model.n_kv_heads 3 --model.dim 48
bad 2 'model.vocab_size 255 must divide by parallel.tp 2' --parallel.tp 2 --model.vocab_size 255
bad 2 'parallel.sequence_parallel needs parallel.tp > 1' --parallel.sequence_parallel true
bad 2 'parallel.loss_parallel needs parallel.tp > 1' --parallel.loss_parallel true
bad 2 'data.batch_size 8 must divide by the data-parallel degree 2 x training.grad_accum_steps 8' \
  --training.grad_accum_steps 8
echo "PASS"
