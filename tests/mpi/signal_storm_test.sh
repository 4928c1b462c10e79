#!/usr/bin/env bash
# Signals while training (issue 31): a signal delivered to a thread inside
# oneDNN's JIT GEMM, which points the stack pointer into the heap, corrupted
# the heap ("corrupted size vs. prev_size"); mpirun sends SIGCONT to its
# ranks when it is sent SIGTERM. Here SIGCONT and SIGURG (the two signals a
# training process has handlers for) go to the process every 2 ms for a
# whole run, on one process and on 2 ranks: before the fix every such run
# crashed within seconds. Each run must end as a quiet run of the same steps
# does, with bitwise the same losses and gradient norms.
# Usage: signal_storm_test.sh "MPIRUN [FLAGS]" MESHTRAIN SOURCE_DIR
source "$(dirname "$0")/common.sh"
model=(--config configs/debug.toml --model.dim 64 --model.n_layers 2 --model.n_heads 4 --model.n_kv_heads 2
       --model.ffn_dim 128 --data.seq_len 32 --training.steps 800 --metrics.log_every 1 --checkpoint.folder "")

# storm NAME [LAUNCHER...]: trains with metrics to $dir/NAME.jsonl while the processes are sent signals.
storm() {
  local name=$1 signal=CONT
  shift
  "$@" "$meshtrain" train "${model[@]}" --metrics.file "$dir/$name.jsonl" >"$dir/$name.out" 2>&1 &
  job=$!
  while kill -0 $job 2>/dev/null; do
    pkill -$signal -f "^$meshtrain train .*--metrics.file $dir/$name.jsonl"
    [ $signal = CONT ] && signal=URG || signal=CONT
    sleep 0.002
  done
  wait $job
  local rc=$?
  [ $rc -eq 0 ] || { cat "$dir/$name.out"; fail "$name: exit $rc under a storm of SIGCONT and SIGURG"; }
  job=
  ! grep -qE "$crashed" "$dir/$name.out" ||
    { cat "$dir/$name.out"; fail "$name: a crash under a storm of SIGCONT and SIGURG"; }
}
quiet() {  # NAME [LAUNCHER...]
  local name=$1
  shift
  "$@" "$meshtrain" train "${model[@]}" --metrics.file "$dir/$name.jsonl" >"$dir/$name.out" 2>&1 ||
    { cat "$dir/$name.out"; fail "$name exited non-zero"; }
}

quiet quiet1
storm storm1
python3 tests/mpi/compare_runs.py "one process under a signal storm" "$dir/quiet1.jsonl" "$dir/storm1.jsonl" --tolerance 0 --steps 1-800 ||
  exit 1
quiet quiet2 $mpirun -np 2
storm storm2 $mpirun -np 2
python3 tests/mpi/compare_runs.py "2 ranks under a signal storm" "$dir/quiet2.jsonl" "$dir/storm2.jsonl" --tolerance 0 --steps 1-800 ||
  exit 1
echo PASS
