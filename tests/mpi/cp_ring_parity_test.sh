#!/usr/bin/env bash
# Context parallelism's ring attention (parallel.cp_attention ring) under
# mpirun against one rank: each layer's keys and values passed around the cp
# ring by ring_shift while each block's attention runs, the partial results
# merged by their log-sum-exps, dK and dV passed back around with their
# blocks. CP 2, CP 4, CP 2 x FSDP 2, CP 2 x TP 2 with sequence and loss
# parallel, CP 2 with full activation checkpointing and 2 microbatches, CP 2
# in bf16, PP 2 x CP 2, a mixture of experts under CP 2 and under CP 2 x EP 2
# (ring and all-gather, the expert load as one rank's), with ep taking the
# cp ranks (CP 2 x EP 4 on dp_shard 2, CP 2 x EP 2 on dp_shard 1 each way,
# PP 2 x CP 2 x EP 2; CP 2 x EP 4's checkpoint resumed on one rank), CP 2 with
# cp_attention auto (which must say what it chose); the CP 2 ring's
# checkpoint resumed with the keys all-gathered. 20 steps with warmup,
# cosine decay, weight decay and active clipping; every step's loss and
# gradient norm and the final weights must match one rank's within the
# tolerances below. The lowered CP 2 step shifts the keys and values
# around the ring and gathers none of them.
# Usage: cp_ring_parity_test.sh "MPIRUN [FLAGS]" MESHTRAIN SOURCE_DIR [all|transport]
# transport: CP 2 and CP 4 (the ring's sends on 2 and 4 ranks), CP 2 x FSDP 2 (the weights gathered over dp_shard x
# cp), CP 2 x TP 2 with SP, PP 2 x CP 2 (the stages' sends beside the ring's), the mixture of experts under CP 2 x EP 2,
# ring and all-gather, and CP 2 x EP 4 (the all_gathers over cp and the experts' all_to_alls, over cp too).
source "$(dirname "$0")/common.sh"
choose_subset "${4:-}"
# The tolerances of cp_parity_test.sh (the same layouts all-gathering the keys), which these runs also meet.
f32=(1e-6 1e-6 5e-5 4e-6)
model=(--config configs/debug.toml --model.dim 64 --model.n_layers 2 --model.n_heads 4 --model.n_kv_heads 2
       --model.ffn_dim 128 --data.seq_len 64 --data.batch_size 4 --training.steps 20 --metrics.log_every 1)
ring=(--parallel.cp_attention ring)
source "$(dirname "$0")/parity_runs.sh"
run one 1
run cp2 2 --parallel.cp 2 "${ring[@]}"
compare cp2
run cp4 4 --parallel.cp 4 "${ring[@]}"
compare cp4
moe=(--model.n_layers 3 --model.n_experts 8 --model.n_experts_per_token 2 --model.moe_ffn_dim 32
     --model.first_dense_layers 1 --model.n_shared_experts 1 --model.router_aux_loss_coef 0.01)
run cp2_fsdp2 4 --parallel.cp 2 --parallel.dp_shard 2 "${ring[@]}"
compare cp2_fsdp2
run cp2_tp2_sp_lp 4 --parallel.cp 2 --parallel.tp 2 --parallel.sequence_parallel true --parallel.loss_parallel true \
  "${ring[@]}"
compare cp2_tp2_sp_lp
run one_accum4 1 --training.grad_accum_steps 4
run pp2_cp2 4 --parallel.pp 2 --parallel.pp_microbatches 4 --parallel.cp 2 "${ring[@]}"
compare pp2_cp2 one_accum4
if full; then
run one_accum2 1 --training.grad_accum_steps 2
run cp2_full_ac_accum2 2 --parallel.cp 2 --activation_checkpoint.mode full --training.grad_accum_steps 2 "${ring[@]}"
compare cp2_full_ac_accum2 one_accum2
run one_bf16 1 --training.dtype bfloat16
run cp2_bf16 2 --parallel.cp 2 --training.dtype bfloat16 "${ring[@]}"
# bf16: each block's partial output is rounded to bf16 before the merge. Tolerances of cp_parity_test.sh's bf16 run.
compare cp2_bf16 one_bf16 5e-4 5e-3 0.3 2e-2
fi
run moe_one 1 "${moe[@]}"
if full; then
run moe_cp2 2 "${moe[@]}" --parallel.cp 2 "${ring[@]}"
compare moe_cp2 moe_one
fi
# CP 2 x EP 2 (ep from dp_shard), each way: the experts split over ep, each cp rank's part of the sequence routed and
# dispatched on its own; the expert load logged as one rank's.
for mode in ring allgather; do
  run "moe_cp2_ep2_$mode" 4 "${moe[@]}" --parallel.cp 2 --parallel.dp_shard 2 --parallel.ep 2 --parallel.cp_attention "$mode"
  compare "moe_cp2_ep2_$mode" moe_one
  python3 - "$dir/moe_one.jsonl" "$dir/moe_cp2_ep2_$mode.jsonl" <<'PY' || fail "CP 2 x EP 2 ($mode) logged another expert load than one rank"
import json, sys
base, ours = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
assert all(o["moe"] == b["moe"] for b, o in zip(base, ours)), "expert load differs"
PY
done
# CP 2 x EP 4 on 4 ranks, ep taking every cp rank and 2 of dp_shard's (ep does not divide dp_shard 2): the experts
# split by expert over dp_shard_in_ep x cp, the rows dispatched to them by all_to_alls over both.
run moe_cp2_ep4 4 "${moe[@]}" --parallel.cp 2 --parallel.dp_shard 2 --parallel.ep 4 "${ring[@]}"
compare moe_cp2_ep4 moe_one
grep -q "mesh (dp_replicate=1, dp_shard=1, dp_shard_in_ep=2, cp=2, tp=1)" "$dir/moe_cp2_ep4.out" ||
  { cat "$dir/moe_cp2_ep4.out"; fail "CP 2 x EP 4 on dp_shard 2 is not laid out with ep over dp_shard x cp"; }
covered="CP 2, CP 4, CP 2 x FSDP 2, CP 2 x TP 2, PP 2 x CP 2, CP 2 x EP 2 and CP 2 x EP 4 (ep over dp_shard x cp)"
full || { echo "transport subset: $covered match one rank"; exit 0; }
# EP 2 taking the cp ranks alone (dp_shard 1), each way; PP 2 x CP 2 x EP 2 likewise; the CP 2 x EP 4 checkpoint
# resumed on one rank.
for mode in ring allgather; do
  run "moe_cp2_in_ep2_$mode" 2 "${moe[@]}" --parallel.cp 2 --parallel.dp_shard 1 --parallel.ep 2 \
    --parallel.cp_attention "$mode"
  compare "moe_cp2_in_ep2_$mode" moe_one
done
run moe_one_accum4 1 "${moe[@]}" --training.grad_accum_steps 4
run moe_pp2_cp2_in_ep2 4 "${moe[@]}" --parallel.pp 2 --parallel.pp_microbatches 4 --parallel.cp 2 \
  --parallel.dp_shard 1 --parallel.ep 2 "${ring[@]}"
compare moe_pp2_cp2_in_ep2 moe_one_accum4
resume moe_one_resumed moe_one 1 "${moe[@]}"
resume moe_cp2_ep4_as_one moe_cp2_ep4 1 "${moe[@]}"
compare moe_cp2_ep4_as_one moe_one_resumed
# auto: rank 0's step estimated both ways, the faster kept; train says which, once.
run cp2_auto 2 --parallel.cp 2 --parallel.cp_attention auto
compare cp2_auto
[ "$(grep -c "cp attention \(ring\|allgather\) (auto: rank 0's step estimated" "$dir/cp2_auto.out")" = 1 ] ||
  { cat "$dir/cp2_auto.out"; fail "train with parallel.cp_attention auto does not say once what it chose"; }
# The ring's checkpoint is the same as the all-gather's: CP 2 ring resumed with the keys all-gathered.
resume one_resumed one 1
resume cp2_as_allgather cp2 2 --parallel.cp 2 --parallel.cp_attention allgather
compare cp2_as_allgather one_resumed
# The lowered CP 2 step: each layer's keys and values shifted around the ring once in forward, and in backward the
# keys and values once more, dK and dV accumulators once a step and once to come home; no all_gather of them.
"$meshtrain" lower --ranks 2 "${model[@]}" --parallel.cp 2 "${ring[@]}" > "$dir/cp2.lowered" 2>&1 ||
  { cat "$dir/cp2.lowered"; fail "meshtrain lower of the CP 2 ring failed"; }
forward=$(grep -E '^# forward +ring_shift' "$dir/cp2.lowered" | awk '{print $8}')
backward=$(grep -E '^# backward +ring_shift' "$dir/cp2.lowered" | awk '{print $8}')
[ "$forward" = 4 ] && [ "$backward" = 12 ] ||
  { grep '^#' "$dir/cp2.lowered"; fail "the lowered CP 2 ring shifts $forward times in forward and $backward in backward, not 4 and 12 (2 layers)"; }
! grep -q 'reorder_sequence.*inverse=true' "$dir/cp2.lowered" ||
  fail "the lowered CP 2 ring puts the keys back in position order (as the all-gather does)"
echo "lower CP 2 ring: $forward ring shifts in forward, $backward in backward"
bad 2 "config key parallel.cp_attention: 'rings' is not one of allgather, ring" --parallel.cp 2 --parallel.cp_attention rings
