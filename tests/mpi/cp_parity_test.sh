#!/usr/bin/env bash
# Context parallelism under mpirun against one rank: the sequence split over
# cp ranks in load-balanced chunks, attention all-gathering the keys and
# values. CP 2, CP 4, CP 2 x FSDP 2, CP 2 x DDP 2, CP 2 x TP 2 with sequence
# and loss parallel, CP 2 with full activation checkpointing and 2
# microbatches (against one rank accumulating 2), CP 2 x TP 2 with SP in
# bf16 (against one rank's bf16), PP 2 x CP 2 (against one rank
# accumulating its 4 microbatches), a mixture of experts under CP 2 and
# CP 2 x FSDP 2, and the CP 4 checkpoint resumed under
# CP 2 and one rank. 20 steps with warmup, cosine decay, weight decay and
# active clipping; every step's loss and gradient norm and the final weights
# must match one rank's within the tolerances below, and each sharded
# checkpoint, exported, must be the gathered weights bitwise. The lowered
# CP 2 step all-gathers the keys and values over cp. Bad input fails on
# every rank with one message.
# Usage: cp_parity_test.sh "MPIRUN [FLAGS]" MESHTRAIN SOURCE_DIR [all|transport]
# transport: CP 2, CP 4, CP 2 x FSDP 2, CP 2 x DDP 2, CP 2 x TP 2 with SP and PP 2 x CP 2 (the all_gathers over cp
# beside each layout's own messages; cp_ring_parity_test.sh's subset has the ring's and the experts').
source "$(dirname "$0")/common.sh"
choose_subset "${4:-}"
# The tolerances (compare_runs.py prints how close each run came), from the largest differences measured over these
# 20 steps on every f32 layout below (2026-11-27), with their margin: loss 1.1e-7 and grad_norm 1.2e-7 -> 1e-6 (9x,
# 8x); weights max 9.9e-6 (CP 4) -> 5e-5 (5x), l2 5.7e-7 (MoE CP 2) -> 4e-6 (7x).
f32=(1e-6 1e-6 5e-5 4e-6)
model=(--config configs/debug.toml --model.dim 64 --model.n_layers 2 --model.n_heads 4 --model.n_kv_heads 2
       --model.ffn_dim 128 --data.seq_len 64 --data.batch_size 4 --training.steps 20 --metrics.log_every 1
       --parallel.cp_attention allgather)
source "$(dirname "$0")/parity_runs.sh"
run one 1
run cp2 2 --parallel.cp 2
compare cp2
run cp4 4 --parallel.cp 4
compare cp4
run cp2_fsdp2 4 --parallel.cp 2 --parallel.dp_shard 2
compare cp2_fsdp2
run cp2_ddp2 4 --parallel.cp 2 --parallel.dp_replicate 2 --parallel.dp_shard 1
compare cp2_ddp2
run cp2_tp2_sp_lp 4 --parallel.cp 2 --parallel.tp 2 --parallel.sequence_parallel true --parallel.loss_parallel true
compare cp2_tp2_sp_lp
# A pipeline: PP 2 x CP 2, 1F1B over 4 microbatches, against one rank accumulating the same 4.
run one_accum4 1 --training.grad_accum_steps 4
run pp2_cp2 4 --parallel.pp 2 --parallel.pp_microbatches 4 --parallel.cp 2
compare pp2_cp2 one_accum4
covered="CP 2, CP 4, CP 2 x FSDP 2, CP 2 x DDP 2, CP 2 x TP 2, PP 2 x CP 2"
full || { echo "transport subset: $covered match one rank"; exit 0; }
run one_accum2 1 --training.grad_accum_steps 2
run cp2_full_ac_accum2 2 --parallel.cp 2 --activation_checkpoint.mode full --training.grad_accum_steps 2
compare cp2_full_ac_accum2 one_accum2
run one_bf16 1 --training.dtype bfloat16
run cp2_tp2_sp_bf16 4 --parallel.cp 2 --parallel.tp 2 --parallel.sequence_parallel true --training.dtype bfloat16
# Measured: loss 5.1e-5 -> 5e-4 (10x), grad_norm 8.1e-4 -> 5e-3 (6x), weights max 8.4e-2 -> 0.3 (3.6x), l2 3.5e-3
# -> 2e-2 (5.7x).
compare cp2_tp2_sp_bf16 one_bf16 5e-4 5e-3 0.3 2e-2
# A mixture of experts (Mixtral-shaped, as tests/mpi/moe_parity_test.sh): each cp rank routes its part of the
# sequence; CP 2 and CP 2 x FSDP 2 against one rank, the expert load logged the same.
moe=(--model.n_layers 3 --model.n_experts 8 --model.n_experts_per_token 2 --model.moe_ffn_dim 32
     --model.first_dense_layers 1 --model.n_shared_experts 1 --model.router_aux_loss_coef 0.01)
run moe_one 1 "${moe[@]}"
run moe_cp2 2 "${moe[@]}" --parallel.cp 2
compare moe_cp2 moe_one
run moe_cp2_fsdp2 4 "${moe[@]}" --parallel.cp 2
compare moe_cp2_fsdp2 moe_one
python3 - "$dir/moe_one.jsonl" "$dir/moe_cp2_fsdp2.jsonl" <<'PY' || fail "CP 2 x FSDP 2 logged another expert load than one rank"
import json, sys
base, ours = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
assert all(o["moe"] == b["moe"] for b, o in zip(base, ours)), "expert load differs"
print(f"moe_cp2_fsdp2: expert load as one rank's at all {len(ours)} steps")
PY
# The lowered CP 2 step: each layer's keys and values all-gathered over cp in forward (and again in backward, after
# the activations were freed), their gradients reduce-scattered back.
"$meshtrain" lower --ranks 2 "${model[@]}" --parallel.cp 2 > "$dir/cp2.lowered" 2>&1 ||
  { cat "$dir/cp2.lowered"; fail "meshtrain lower of CP 2 failed"; }
grep -q 'reorder_sequence' "$dir/cp2.lowered" || fail "the lowered CP 2 step has no reorder_sequence"
gathers=$(grep -c 'all_gather.*mesh_dims=\[2\]' "$dir/cp2.lowered")
[ "$gathers" -ge 4 ] || { grep all_gather "$dir/cp2.lowered"; fail "the lowered CP 2 step all-gathers $gathers times over cp, not at least 4 (2 layers x k, v)"; }
echo "lower CP 2: $gathers all_gathers over cp"
# The CP 4 checkpoint resumed under CP 2 and under one rank, 2 more steps each.
resume one_resumed one 1
resume cp4_as_cp2 cp4 2 --parallel.cp 2
compare cp4_as_cp2 one_resumed
resume cp4_as_one cp4 1
compare cp4_as_one one_resumed
bad 2 'config: data.seq_len 62 must divide by 2 x parallel.cp (4)' --parallel.cp 2 --data.seq_len 62
bad 3 'parallel.dp_replicate (1) x parallel.dp_shard (1) x parallel.cp (2) x parallel.tp (1) = 2, but the job has 3 ranks' \
  --parallel.cp 2 --parallel.dp_shard 1
bad 3 '3 ranks do not divide by parallel.dp_replicate (1) x parallel.cp (2) x parallel.tp (1)' --parallel.cp 2
bad 4 'model.n_kv_heads 1 must divide by parallel.tp 2' --parallel.cp 2 --parallel.tp 2 --model.n_kv_heads 1
bad 2 "config key parallel.cp: '0' is not a positive integer" --parallel.cp 0
bad 4 'parallel.ep 6 must divide parallel.dp_shard 2, or be parallel.cp 2 times a divisor of it (expert parallelism takes its ranks from dp_shard, or from all of cp and part of dp_shard)' \
  --parallel.cp 2 --parallel.ep 6 --model.n_experts 6
echo "PASS"
