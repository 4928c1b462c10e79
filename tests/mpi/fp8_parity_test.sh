#!/usr/bin/env bash
# FP8 training (training.fp8 tensorwise) under mpirun against FP8 on one
# rank: DDP 2, FSDP 2, FSDP 2 x TP 2 with sequence parallel, TP 4 and PP 2 x
# FSDP 2 with power-of-two scales, FSDP 2 x TP 2 with scales as computed.
# FSDP 2 gathering its weights in FP8 (training.fp8_all_gather) computes
# FSDP 2's numbers exactly, and the debug model's lowered bf16 FSDP 2 step
# gathers at most 0.55x the bytes.
# Every layout quantises each operand with the whole tensor's amax (an amax
# of a shard is all-reduced by max over the ranks it is split across): 20
# steps with warmup, cosine decay, weight decay and active clipping, every
# step's loss and gradient norm and the final weights checked.
#
# Quantising is not continuous: where a sum is taken in another order (a
# sharded matmul, the gradients' reduce-scatter, or one rank's GEMM on
# another number of threads), an operand on a rounding tie moves by a whole
# FP8 step, and with scales as computed an amax moved by an ulp moves every
# element. Free-running runs then drift apart, a layout from one rank as
# one rank on 2 threads from itself on 1 (measured 2026-11-27, 20 steps).
# - Power-of-two scales (an amax's ulp rarely moves one): DDP 2, FSDP 2 and
#   FSDP 2 x TP 2 match to 1.1e-7, TP 4 bitwise, PP 2 x FSDP 2 to 6.3e-6 in
#   the loss and 5.5e-5 in the grad norm (an element flipped at step 19).
#   Held to the issue's 1e-5 in the loss, 1e-4 in the grad norm; FP8 moves
#   step 1's loss by 1.3e-4, so a layout that skipped it fails.
# - Scales as computed: FSDP 2 x TP 2 drifts 2.0e-5 (loss) and 2.0e-4
#   (grad norm), one rank on 2 threads 6e-5 and 6e-4; both held to 2e-4 and
#   2e-3 (the final weights to 0.2 of a tensor's largest element, 1e-2 of its
#   L2 norm: AdamW moves a weight whose tiny gradient changed sign far).
# SpmdExecute.LlamaStepInFp8MatchesOneRank holds two steps of each layout
# with computed scales, from one state, to the plain step's 1e-6.
# Every run has one kernel thread per rank (OMP_NUM_THREADS=1, as multi-rank
# runs here have anyway) but the drift reference.
# Usage: fp8_parity_test.sh "MPIRUN [FLAGS]" MESHTRAIN SOURCE_DIR
source "$(dirname "$0")/common.sh"
export OMP_NUM_THREADS=1
# loss, grad_norm, weights max and l2 (relative)
f32=(1e-5 1e-4 1e-3 1e-4)
drift=(2e-4 2e-3 2e-1 1e-2)
base=(--config configs/debug.toml --model.dim 64 --model.n_layers 2 --model.n_heads 4 --model.n_kv_heads 2
      --model.ffn_dim 128 --data.seq_len 64 --data.batch_size 4 --training.steps 20 --metrics.log_every 1)
model=("${base[@]}" --training.fp8 tensorwise --training.fp8_pow2_scale true)
source "$(dirname "$0")/parity_runs.sh"
run one 1
run ddp2 2 --parallel.dp_replicate 2 --parallel.dp_shard 1
compare ddp2
run fsdp2 2
compare fsdp2
# FSDP gathering each weight in FP8 (quantised on its shard with the whole weight's scale): the same numbers.
run fsdp2_fp8_all_gather 2 --training.fp8_all_gather true
compare fsdp2_fp8_all_gather fsdp2 0 0 0 0
run fsdp2_tp2_sp 4 --parallel.tp 2 --parallel.sequence_parallel true
compare fsdp2_tp2_sp
run one_kv4 1 --model.n_kv_heads 4
run tp4 4 --parallel.tp 4 --parallel.dp_shard 1 --model.n_kv_heads 4
compare tp4 one_kv4
run one_accum2 1 --training.grad_accum_steps 2
run pp2_fsdp2 4 --parallel.pp 2 --parallel.pp_microbatches 2
compare pp2_fsdp2 one_accum2
# Scales as computed, and the drift of one rank across its thread counts (held to the same bound).
model=("${base[@]}" --training.fp8 tensorwise)
run computed 1
OMP_NUM_THREADS=2 run computed_2_threads 1
compare computed_2_threads computed "${drift[@]}"
run computed_fsdp2_tp2_sp 4 --parallel.tp 2 --parallel.sequence_parallel true
compare computed_fsdp2_tp2_sp computed "${drift[@]}"
# FP8 changes the numbers by far more than the layouts' bound: the plain run's losses differ.
model=("${base[@]}")
run plain 1
python3 - "$dir/computed.jsonl" "$dir/plain.jsonl" <<'PY' || fail "FP8 moved the losses by less than 10x the layouts' bound"
import json, sys
fp8, plain = ([json.loads(l)["loss"] for l in open(f) if '"loss"' in l] for f in sys.argv[1:3])
worst = max(abs(a - b) / abs(b) for a, b in zip(fp8, plain))
assert len(fp8) == len(plain) == 20 and worst > 1e-4, (worst, fp8, plain)
print(f"FP8 against the plain run: losses up to {worst:.1e} apart (relative) over 20 steps")
PY
# The debug model's lowered bf16 FSDP 2 step gathers half the bytes with fp8_all_gather (the norms' weights, the
# embedding and the LM head stay bf16).
gathered() {
  "$meshtrain" lower --ranks 2 --config configs/debug.toml --training.dtype bfloat16 --training.fp8 tensorwise "$@" \
    > "$dir/lowered" 2>&1 ||
    { cat "$dir/lowered"; fail "meshtrain lower $* failed"; }
  grep -E '^# (forward|backward) +all_gather' "$dir/lowered" | awk '{s += $(NF - 1)} END {print s}'
}
bf16_bytes=$(gathered) fp8_bytes=$(gathered --training.fp8_all_gather true)
python3 -c "import sys; r = $fp8_bytes / $bf16_bytes; print(f'FSDP 2 all_gather bytes per step: bf16 $bf16_bytes, FP8 $fp8_bytes ({r:.3f}x)'); sys.exit(r > 0.55)" ||
  fail "fp8_all_gather gathers $fp8_bytes bytes a step against bf16's $bf16_bytes: not half"
bad 2 "applies to FP8 training, but training.fp8 is none" --training.fp8_skip down_proj
bad 4 "config key training.fp8: 'rowwise' is not one of none, tensorwise" --training.fp8 rowwise --parallel.tp 2
