#!/usr/bin/env bash
# Preemption, repeated (issue 31): TRIALS times (200 by default), a 2-rank
# job is sent what a scheduler sends when it preempts, at a random moment
# (after step 2 to 10 and 0-30 ms): SIGCONT and SIGTERM to every rank, and
# on odd trials SIGKILL 0.2 s later. Before the signals went to a thread of
# their own, SIGCONT landing in oneDNN's JIT GEMM corrupted the heap in 1 of
# 118 such trials (signal_storm_test.sh finds it every time). Every trial must end
# within 15 s with no rank reporting a crash or heap corruption; without
# the SIGKILL, mpirun exits 143, "stopped by SIGTERM" is said once, and the
# one checkpoint saved is that step's.
# Usage: preempt_trials_test.sh "MPIRUN [FLAGS]" MESHTRAIN SOURCE_DIR [TRIALS]
source "$(dirname "$0")/common.sh"
trials=${4:-200}
model=(--config configs/debug.toml --model.dim 64 --model.n_layers 2 --model.n_heads 4 --model.n_kv_heads 2
       --model.ffn_dim 128 --data.seq_len 32 --training.steps 100000 --metrics.log_every 1 --metrics.file ""
       --checkpoint.interval 0)
killed=0 stopped=0
for trial in $(seq "$trials"); do
  t=$dir/t$trial
  $mpirun -np 2 "$meshtrain" train "${model[@]}" --checkpoint.folder "$t" > "$t.out" 2>&1 &
  job=$!
  at=$((2 + RANDOM % 9))
  at_random_moment_after $at "$t.out"
  grep -q "^step *$at/" "$t.out" || { cat "$t.out"; fail "trial $trial: the run did not reach step $at"; }
  pattern="^$meshtrain train .*--checkpoint.folder $t\$"
  pkill -CONT -f "$pattern"
  pkill -TERM -f "$pattern"
  if [ $((trial % 2)) -eq 1 ]; then
    sleep 0.2
    pkill -KILL -f "$pattern"
  fi
  for _ in $(seq 150); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
  kill -0 $job 2>/dev/null && { cat "$t.out"; fail "trial $trial: mpirun still running 15 s after the signals"; }
  wait $job
  rc=$?
  job=
  pgrep -f "$pattern" >/dev/null && fail "trial $trial: a rank is left running"
  ! grep -qE "$crashed" "$t.out" ||
    { cat "$t.out"; fail "trial $trial: a rank crashed"; }
  if [ $((trial % 2)) -eq 1 ]; then
    killed=$((killed + 1))
  else
    [ $rc -eq 143 ] || { cat "$t.out"; fail "trial $trial: mpirun exit $rc after SIGTERM, expected 143"; }
    [ "$(grep -c "stopped by SIGTERM after step" "$t.out")" = 1 ] ||
      { cat "$t.out"; fail "trial $trial: 'stopped by SIGTERM' is not said once"; }
    step=$(sed -n 's/^stopped by SIGTERM after step \([0-9]*\) of.*/\1/p' "$t.out")
    [ "$(ls "$t")" = "$(printf 'step_%06d' "$step")" ] || { ls "$t"; fail "trial $trial: expected step $step's checkpoint alone"; }
    stopped=$((stopped + 1))
  fi
  rm -rf "$t" "$t.out"
done
echo "$trials preemptions: $stopped stopped and saved (exit 143), $killed killed 0.2 s after SIGTERM; no crash, no hang"
echo PASS
