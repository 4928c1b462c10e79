#!/usr/bin/env bash
# Pipeline parallelism under mpirun against one rank accumulating the same
# microbatches (and, for two, one rank taking the batch at once): every schedule (gpipe, 1f1b, interleaved_1f1b, zero_bubble,
# zbv) on 2 ranks (a 2-layer Llama: 2 stages, or 4 with 2 per rank, where the
# first stage is the embedding alone and the last the head alone) and on 4
# ranks (a 6-layer one: interleaved and zbv with 2 stages per rank), 20 steps
# with warmup, cosine decay, weight decay and active clipping. Every step's
# loss and gradient norm, and the weights gathered after the last step
# (checkpoint.export), must be bitwise the single-rank run's (each microbatch
# runs the same kernels on one thread, and the gradients add up in the same
# order). Explicit layers per stage, activation checkpointing (full and
# selective) and bf16 compute, likewise; and, within
# the tolerances below, PP 2 composed with FSDP 2 (and TP 2, HSDP 2 x 2, and
# DDP 2 x TP 2 with sequence and loss parallel) on 4 and 8 processes; with
# gradient accumulation (the schedule run twice a step). Sharded checkpoints
# of a pipeline: put together they are the gathered weights; resumed on the
# same layout, on another and on one rank (and one rank's on a pipeline) the
# steps after are the straight run's. The last step's measured timeline
# (--trace) holds every rank's actions. Bad input fails on every rank with
# one message, no hang.
# Usage: pipeline_parity_test.sh "MPIRUN [FLAGS]" MESHTRAIN SOURCE_DIR [all|transport]
# transport: every schedule on 2 and 4 ranks and the compositions with FSDP, TP and HSDP (the rest, schedules from a
# file, accumulation, checkpointing, checkpoints, traces, bf16 and bad input, moves the same messages as those).
source "$(dirname "$0")/common.sh"
choose_subset "${4:-}"
# The tolerances where the runs are not bitwise (tests/mpi/compare_runs.py prints how close each run came): loss,
# grad_norm, weights relative to each tensor's largest magnitude (max) and to its L2 norm (l2). From the largest
# differences measured over these 20 steps on an AVX-512 CPU (with AVX512_BF16) and on an AVX2-only one (QEMU -cpu
# Haswell), over shared memory and TCP, each with its margin. Every pipeline alone against one rank accumulating the
# same microbatches, in f32 and bf16, came out bitwise on both.
bitwise=(0 0 0 0)
# f32, with data or tensor parallelism (reductions in another order) or against one rank taking the batch at once:
# loss and grad_norm 1.2e-7 -> 1e-6 (8.4x); weights max 1.5e-5 (PP 2 x DDP 2 x TP 2 with SP and LP, AVX2) -> 1e-4
# (6.6x), l2 5.6e-7 -> 4e-6 (7.1x).
f32=(1e-6 1e-6 1e-4 4e-6)
# bf16 PP 2 x FSDP 2 against one rank's bf16 run: loss 4.7e-5 -> 4e-4 (8.5x), grad_norm 3.5e-4 -> 3e-3 (8.5x),
# weights max 8.4e-2 (the embedding's rarely seen rows) -> 0.5 (6x), l2 2.8e-3 (AVX2) -> 2e-2 (7.1x).
bf16=(4e-4 3e-3 0.5 2e-2)
model=(--config configs/debug.toml --model.dim 64 --model.n_heads 8 --model.n_kv_heads 4 --model.ffn_dim 160
       --data.seq_len 32 --data.batch_size 8 --training.steps 20 --metrics.log_every 1 --checkpoint.folder "")
run() {  # NAME NP [KEY VALUE ...]
  local name=$1 np=$2
  shift 2
  # Every rank runs its kernels on one thread, as the one-rank runs do (and each rank of a 2-core machine would): a
  # GEMM split over threads may sum in another order (oneDNN's f32 GEMM does on an AVX2 CPU), and the comparisons
  # below are bitwise where they can be, on any machine.
  local launch=(env OMP_NUM_THREADS=1)
  [ "$np" -gt 1 ] && launch+=($mpirun -np "$np")
  timeout 300 "${launch[@]}" "$meshtrain" train "${model[@]}" --metrics.file "$dir/$name.jsonl" \
    --checkpoint.export "$dir/$name.safetensors" "$@" > "$dir/$name.out" 2>&1 ||
    { cat "$dir/$name.out"; fail "$name exited non-zero"; }
}
compare() {  # NAME BASE LOSS GRAD_NORM WEIGHT_MAX WEIGHT_L2: every step's loss and gradient norm, the exported weights
  python3 tests/mpi/compare_runs.py "$1" "$dir/$2.jsonl" "$dir/$1.jsonl" --tolerance "$3" --grad-norm-tolerance "$4" \
    --weights "$dir/$2.safetensors" "$dir/$1.safetensors" --weight-tolerance "$5" --weight-l2-tolerance "$6" \
    --note "$(grep -m1 '^layout:' "$dir/$1.out" | cut -c9-)" || exit 1
}
# 2 ranks, 4 microbatches of 2 sequences.
run one_l2 1 --model.n_layers 2 --training.grad_accum_steps 4
for schedule in gpipe 1f1b interleaved_1f1b zero_bubble zbv; do
  run "pp2_$schedule" 2 --model.n_layers 2 --parallel.pp 2 --parallel.pp_schedule $schedule --parallel.pp_microbatches 4
  compare "pp2_$schedule" one_l2 "${bitwise[@]}"
done
# And against one rank taking the whole batch at once (the loss's mean and the gradients summed in another order).
run one_l2_whole 1 --model.n_layers 2
compare pp2_1f1b one_l2_whole "${f32[@]}"
compare pp2_zbv one_l2_whole "${f32[@]}"
if full; then
# Schedules of one's own (parallel.pp_schedule_csv): one written by hand, and zero-bubble with 2 stages per rank as
# `meshtrain pp-schedule --csv` writes it; their stages per rank and microbatches are read from the file.
printf '0F0,0F1,0F2,0B0,0F3,0B1,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n' > "$dir/own.csv"
run pp2_csv 2 --model.n_layers 2 --parallel.pp 2 --parallel.pp_schedule_csv "$dir/own.csv"
compare pp2_csv one_l2 "${bitwise[@]}"
"$meshtrain" pp-schedule --schedule zero_bubble --stages 2 --stages-per-rank 2 --microbatches 4 --csv > "$dir/zb.csv" ||
  fail "pp-schedule --csv"
run pp2_csv_zb 2 --model.n_layers 2 --parallel.pp 2 --parallel.pp_schedule_csv "$dir/zb.csv"
compare pp2_csv_zb one_l2 "${bitwise[@]}"
grep -q "pipeline csv of 4 stages (2 per rank), 4 microbatches" "$dir/pp2_csv_zb.out" ||
  { grep layout "$dir/pp2_csv_zb.out"; fail "the CSV schedule's stages and microbatches are not the file's"; }
# Gradient accumulation: the schedule runs twice a step over 2 microbatches each (the step's 4, as one rank's).
run pp2_accum2 2 --model.n_layers 2 --parallel.pp 2 --parallel.pp_microbatches 2 --training.grad_accum_steps 2
compare pp2_accum2 one_l2 "${bitwise[@]}"
# Activation checkpointing in each stage (full, and selective keeping every other matmul's output): the forward is
# recomputed in the backward with the same kernels, so bitwise still.
run pp2_ac_full 2 --model.n_layers 2 --parallel.pp 2 --parallel.pp_schedule 1f1b --parallel.pp_microbatches 4 \
  --activation_checkpoint.mode full
compare pp2_ac_full one_l2 "${bitwise[@]}"
run pp2_ac_selective 2 --model.n_layers 2 --parallel.pp 2 --parallel.pp_schedule zero_bubble \
  --parallel.pp_microbatches 4 --activation_checkpoint.mode selective --activation_checkpoint.selective_matmuls every_other
compare pp2_ac_selective one_l2 "${bitwise[@]}"
# Layers per stage given: the embedding and one block, then one block and the head.
run pp2_layers 2 --model.n_layers 2 --parallel.pp 2 --parallel.pp_microbatches 4 --parallel.pp_layers_per_stage 2,2
compare pp2_layers one_l2 "${bitwise[@]}"
fi
# 4 ranks, 8 microbatches of one sequence; a 6-layer model so that 8 stages have a layer each but the ends.
run one_l6 1 --model.n_layers 6 --training.grad_accum_steps 8
for schedule in gpipe 1f1b interleaved_1f1b zero_bubble zbv; do
  run "pp4_$schedule" 4 --model.n_layers 6 --parallel.pp 4 --parallel.pp_schedule $schedule --parallel.pp_microbatches 8
  compare "pp4_$schedule" one_l6 "${bitwise[@]}"
done
# Composed with FSDP and TP: PP 2 x FSDP 2 (4 processes) and PP 2 x FSDP 2 x TP 2 (8), each stage laid out on
# its ranks by the [parallel] plan; with sequence and loss parallel too.
run pp2_fsdp2_interleaved 4 --model.n_layers 2 --parallel.pp 2 --parallel.pp_schedule interleaved_1f1b \
  --parallel.pp_microbatches 2
compare pp2_fsdp2_interleaved one_l2 "${f32[@]}"
for schedule in 1f1b zero_bubble; do
  run "pp2_fsdp2_tp2_$schedule" 8 --model.n_layers 2 --parallel.pp 2 --parallel.tp 2 --parallel.pp_schedule $schedule \
    --parallel.pp_microbatches 2
  compare "pp2_fsdp2_tp2_$schedule" one_l2 "${f32[@]}"
done
run pp2_fsdp2_zb_accum2 4 --model.n_layers 2 --parallel.pp 2 --parallel.pp_schedule zero_bubble \
  --parallel.pp_microbatches 2 --training.grad_accum_steps 2
compare pp2_fsdp2_zb_accum2 one_l2 "${f32[@]}"
# At most one of a rank's two stages gathered at once (pp_max_active_stages 1: each gathered again before its next
# use), with 2 runs of the schedule a step.
run pp2_fsdp2_interleaved_active1 4 --model.n_layers 2 --parallel.pp 2 --parallel.pp_schedule interleaved_1f1b \
  --parallel.pp_microbatches 2 --parallel.pp_max_active_stages 1 --training.grad_accum_steps 2
compare pp2_fsdp2_interleaved_active1 one_l2 "${f32[@]}"
run pp2_hsdp 8 --model.n_layers 2 --parallel.pp 2 --parallel.dp_replicate 2 --parallel.dp_shard 2 \
  --parallel.pp_microbatches 2
compare pp2_hsdp one_l2 "${f32[@]}"
run pp2_ddp2_tp2_sp_lp 8 --model.n_layers 2 --parallel.pp 2 --parallel.tp 2 --parallel.dp_replicate 2 \
  --parallel.dp_shard 1 --parallel.sequence_parallel true --parallel.loss_parallel true --parallel.pp_microbatches 2
compare pp2_ddp2_tp2_sp_lp one_l2 "${f32[@]}"
# Wider layers (dim 512), where a stage's backward reads weights in other layouts than its forward: with
# parallel.pp_keep_backward_layouts those gathers move into the unshard program too, run once a step: FSDP 2 x CP 2
# and CP 2 x TP 2.
wide=(--model.dim 512 --model.ffn_dim 1536 --model.n_layers 2)
run one_wide 1 "${wide[@]}" --training.grad_accum_steps 2
for par in "--parallel.cp 2 --parallel.dp_shard 2 --parallel.tp 1" "--parallel.cp 2 --parallel.tp 2 --parallel.dp_shard 1"; do
  name="pp2_wide_kept_$(echo "$par" | tr -d ' -' | sed 's/parallel\./_/g')"
  keep=(--parallel.pp 2 --parallel.pp_microbatches 2 --parallel.pp_keep_backward_layouts true)
  # shellcheck disable=SC2086  # $par is the plan's flags, split on purpose
  run "$name" 8 "${wide[@]}" "${keep[@]}" $par
  # shellcheck disable=SC2086
  grep -q '# backward' <("$meshtrain" lower --ranks 8 --rank 4 "${model[@]}" "${wide[@]}" "${keep[@]}" $par |
    awk '/# stage 1 unshard/{f=1;next} /# stage 1 /{f=0} f') ||
    fail "$name: no backward redistribution moved into stage 1's unshard program; the case tests nothing"
  compare "$name" one_wide "${f32[@]}"
done
full || { echo "transport subset: the schedules and their compositions match one rank"; exit 0; }
# Checkpoints: PP 2 x FSDP 2 saves at steps 10 and 20; its sharded checkpoint put together is the gathered export,
# bitwise; resumed from step 10 on the same layout it repeats steps 11-20 bitwise, and on PP 2 x TP 2 x FSDP 2 and
# on one rank (other layouts) within f32's loss and grad_norm tolerance (measured 1.0e-7); one rank's checkpoint
# resumes on PP 2 bitwise.
steps_after_10() {  # NAME BASE TOLERANCE: steps 11-20 of NAME's metrics against BASE's
  python3 tests/mpi/compare_runs.py "$1 resumed at step 10" "$dir/$2.jsonl" "$dir/$1.jsonl" --tolerance "$3" \
    --steps 11-20 || exit 1
}
run pp2_fsdp2_ck 4 --model.n_layers 2 --parallel.pp 2 --parallel.pp_microbatches 2 --checkpoint.folder "$dir/ck" \
  --checkpoint.interval 10
compare pp2_fsdp2_ck one_l2 "${f32[@]}"
"$meshtrain" export --checkpoint "$dir/ck" --out "$dir/ck_from_shards.safetensors" > /dev/null ||
  fail "export of the pipeline's checkpoint failed"
cmp -s "$dir/ck_from_shards.safetensors" "$dir/pp2_fsdp2_ck.safetensors" ||
  fail "the pipeline's sharded checkpoint exported differs from the weights gathered at the end"
grep -q '"pipeline_rank": 1' "$dir/ck/step_000020/metadata.json" || fail "the metadata names no pipeline rank"
for target in "pp2_fsdp2_resumed 4 --parallel.pp 2 --parallel.pp_microbatches 2 0" \
              "pp2_tp2_fsdp2_resumed 8 --parallel.pp 2 --parallel.tp 2 --parallel.pp_microbatches 2 ${f32[0]}" \
              "one_from_pp 1 --training.grad_accum_steps 4 ${f32[0]}"; do
  set -- $target
  name=$1 np=$2 tolerance=${*: -1}
  args=("${@:3:$#-3}")
  rm -rf "$dir/ck_$name"; mkdir -p "$dir/ck_$name"; cp -r "$dir/ck/step_000010" "$dir/ck_$name/"
  run "$name" "$np" --model.n_layers 2 --checkpoint.folder "$dir/ck_$name" "${args[@]}"
  steps_after_10 "$name" pp2_fsdp2_ck "$tolerance"
done
run one_ck 1 --model.n_layers 2 --training.grad_accum_steps 4 --checkpoint.folder "$dir/ck_one" --checkpoint.interval 10
rm -rf "$dir/ck_one/step_000020"
run pp2_from_one 2 --model.n_layers 2 --parallel.pp 2 --parallel.pp_microbatches 4 --checkpoint.folder "$dir/ck_one"
steps_after_10 pp2_from_one one_ck 0
# The last step's measured timeline (--trace): on every rank each F, I and W of its stage once, one after another
# on the compute track, the waits for receives and FSDP's gathers and reductions on the communication track.
timeout 120 $mpirun -np 4 "$meshtrain" train "${model[@]}" --model.n_layers 2 --training.steps 2 --parallel.pp 2 \
  --parallel.pp_schedule zero_bubble --parallel.pp_microbatches 2 --trace "$dir/pp.trace.json" \
  --dump-graph "$dir/pp_dump{rank}.txt" > "$dir/trace.out" 2>&1 ||
  { cat "$dir/trace.out"; fail "the traced pipeline run exited non-zero"; }
# Each rank ran the programs `meshtrain lower` prints for it.
for r in 0 1 2 3; do
  "$meshtrain" lower --ranks 4 --rank $r "${model[@]}" --model.n_layers 2 --parallel.pp 2 --parallel.pp_schedule zero_bubble \
    --parallel.pp_microbatches 2 --out "$dir/pp_lower$r.txt" > /dev/null || fail "meshtrain lower --rank $r of the pipeline"
  grep -q "^# stage $((r / 2)) backward_weight" "$dir/pp_lower$r.txt" || fail "rank $r: lower prints no backward_weight program"
  diff -q "$dir/pp_dump$r.txt" "$dir/pp_lower$r.txt" > /dev/null ||
    { diff "$dir/pp_dump$r.txt" "$dir/pp_lower$r.txt" | head; fail "rank $r: --dump-graph differs from meshtrain lower"; }
done
cmp -s "$dir/pp_lower0.txt" "$dir/pp_lower2.txt" && fail "ranks 0 and 2 (stages 0 and 1) printed the same programs"
echo "lower: each of 4 pipeline ranks runs the programs meshtrain lower prints for it ($(grep -c '' "$dir/pp_lower3.txt") lines on rank 3)"
python3 - "$dir/pp.trace.json" <<'PY' || exit 1
import json, re, sys
events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
for rank in range(4):
    mine = [e for e in events if e["pid"] == rank]
    compute = sorted((e for e in mine if e["tid"] == 1), key=lambda e: e["ts"])
    names = [e["name"] for e in compute]
    stage = rank // 2
    for kind in "FIW":
        got = sorted(n for n in names if re.fullmatch(rf"{stage}{kind}\d+", n))
        assert got == [f"{stage}{kind}{m}" for m in range(2)], (rank, kind, names)
    assert names.count("norm and update") == 1, (rank, names)
    for a, b in zip(compute, compute[1:]):
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (rank, a, b)
    comm = [e["name"] for e in mine if e["tid"] == 2]
    assert f"{stage}UNSHARD" in comm and f"{stage}REDUCE_GRAD" in comm, (rank, comm)
    assert any(n.startswith("wait ") for n in comm), (rank, comm)
print(f"trace: 4 ranks, {len(events)} spans, each rank's F, I and W once in order, its waits, gathers and reductions")
PY
# bf16 compute: the activations and their gradients cross the stages in bf16.
run one_bf16 1 --model.n_layers 2 --training.grad_accum_steps 4 --training.dtype bfloat16
run pp2_bf16 2 --model.n_layers 2 --parallel.pp 2 --parallel.pp_microbatches 4 --training.dtype bfloat16
compare pp2_bf16 one_bf16 "${bitwise[@]}"
# With FSDP the weights' bf16 copies are gathered (once a step): the reductions differ in order, so within the bf16
# tolerances above (train_parity_test.sh holds FSDP 2 x TP 2 in bf16 to its own measured ones).
run pp2_fsdp2_bf16 4 --model.n_layers 2 --parallel.pp 2 --parallel.pp_microbatches 2 --training.dtype bfloat16
compare pp2_fsdp2_bf16 one_bf16 "${bf16[@]}"

model+=(--model.n_layers 2)
bad 2 "config key parallel.pp_schedule: 'looped' is not one of gpipe, 1f1b" --parallel.pp 2 --parallel.pp_schedule looped
bad 2 'parallel.pp_layers_per_stage [2, 1] adds up to 3, but the model has 4 units' --parallel.pp 2 \
  --parallel.pp_layers_per_stage 2,1
bad 2 'parallel.pp_layers_per_stage lists 3 stages' --parallel.pp 2 --parallel.pp_layers_per_stage 1,2,1
bad 2 '[parallel] pp_schedule 1f1b needs pp_microbatches >= pp' --parallel.pp 2 --parallel.pp_microbatches 1
bad 2 'data.batch_size 8 must divide by parallel.pp_microbatches 3' --parallel.pp 2 --parallel.pp_microbatches 3
bad 2 "fewer than the 8 pipeline stages" --parallel.pp 2 --parallel.pp_schedule interleaved_1f1b --parallel.pp_stages_per_rank 4
bad 3 "parallel.pp 2 must divide the job's 3 ranks" --parallel.pp 2
bad 4 'data.batch_size 8 must divide by parallel.pp_microbatches 8 x the data-parallel degree 2' --parallel.pp 2 \
  --parallel.pp_microbatches 8
bad 6 'model.n_heads 8 must divide by parallel.tp 3' --parallel.pp 2 --parallel.tp 3
bad 2 'data.batch_size 8 must divide by parallel.pp_microbatches 4 x training.grad_accum_steps 4' --parallel.pp 2 \
  --parallel.pp_microbatches 4 --training.grad_accum_steps 4
bad 2 'model.tie_embeddings with parallel.pp 2' --parallel.pp 2 --model.tie_embeddings true
bad 2 "pp_microbatches 2 with pp_schedule_csv $dir/own.csv, whose actions run 4 microbatches" --parallel.pp 2 \
  --parallel.pp_schedule_csv "$dir/own.csv" --parallel.pp_microbatches 2
printf '0F0,0B0\n0F1,1B0\n' > "$dir/two_ranks_one_stage.csv"
bad 2 "line 2, cell 1: stage 0 is on rank 0 (line 1) already" --parallel.pp 2 \
  --parallel.pp_schedule_csv "$dir/two_ranks_one_stage.csv"
echo "bad input: 13 cases, each one message and every rank exiting non-zero"
