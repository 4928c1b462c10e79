#!/usr/bin/env bash
# Preemption: a signal to a training job stops it after the running step
# with a checkpoint of that step and an exit status of 128 + the signal.
#   1. one process, SIGTERM: exit 143;
#   2. two ranks under mpirun, SIGTERM to both ranks (as a scheduler that
#      preempts a job signals all its processes): the ranks agree on the
#      step, "stopped by SIGTERM" is printed once, mpirun exits 143;
#   3. two ranks, SIGUSR1 to mpirun, which forwards it at once: the same,
#      exit 138;
#   4. two ranks, SIGTERM to mpirun alone: mpirun stops forwarding output at
#      once, sends SIGTERM to the ranks after OMPI_MCA_odls_base_sigkill_timeout
#      (here 5 s) and SIGKILL as long after: the checkpoint is saved in that
#      time and no process is left.
# Each time the checkpoint is the only one in the folder, its weight files
# bitwise the final checkpoint's of an uninterrupted run of as many steps,
# and its metadata the same but for the run's total step count.
# Usage: preempt_test.sh "MPIRUN [FLAGS]" MESHTRAIN SOURCE_DIR
source "$(dirname "$0")/common.sh"
fail() { echo "FAIL: $*"; cat "$dir/out" 2>/dev/null; exit 1; }
model=(--config configs/debug.toml --model.dim 64 --model.n_layers 2 --model.n_heads 4 --model.n_kv_heads 2
       --model.ffn_dim 128 --data.seq_len 32 --lr_scheduler.decay none --metrics.file "" --metrics.log_every 1
       --checkpoint.interval 0)  # a constant rate after warm-up: the first N steps do not depend on the total

# preempt SIGNAL TARGET COMMAND...: starts COMMAND in the background, waits
# until it has logged step 3, sends SIGNAL to TARGET (job: the process
# started; ranks: every meshtrain process of the run); sets rc, and unless
# SIGTERM went to mpirun (whose output ends then) the step it says it
# stopped after, said exactly once.
preempt() {
  local signal=$1 target=$2
  shift 2
  "$@" >"$dir/out" 2>&1 &
  job=$!
  for _ in $(seq 600); do
    grep -q '^step *3/' "$dir/out" && break
    kill -0 $job 2>/dev/null || break
    sleep 0.1
  done
  grep -q '^step *3/' "$dir/out" || fail "the run did not reach step 3"
  if [ "$target" = ranks ]; then pkill -$signal -f "^$meshtrain train .*--checkpoint.folder $dir/"; else kill -$signal $job; fi
  for _ in $(seq 600); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
  kill -0 $job 2>/dev/null && fail "still running 60 s after SIG$signal"
  wait $job
  rc=$?
  job=
  pgrep -f "^$meshtrain train .*--checkpoint.folder $dir/" >/dev/null && fail "SIG$signal: a process is left running"
  [ "$signal" = TERM ] && [ "$1" != "$meshtrain" ] && [ "$target" = job ] && return
  [ "$(grep -c "stopped by SIG$signal after step" "$dir/out")" = 1 ] || fail "'stopped by SIG$signal' is not printed exactly once"
  stopped=$(sed -n "s/^stopped by SIG$signal after step \([0-9]*\) of.*/\1/p" "$dir/out")
  [ "$stopped" -ge 3 ] && [ "$stopped" -lt 100000 ] || fail "stopped after step '$stopped'"
}

# same_weights_as_straight_run CHECKPOINT N [LAUNCHER...]: CHECKPOINT holds
# the weights after step N: it is bitwise the final checkpoint of an
# uninterrupted N-step run (the learning rate does not depend on the total).
same_weights_as_straight_run() {
  local saved=$1 steps=$2 runner=("${@:3}")
  "${runner[@]}" "$meshtrain" train "${model[@]}" --training.steps "$steps" --checkpoint.folder "$dir/straight" \
    >"$dir/straight.out" 2>&1 || { cat "$dir/straight.out"; fail "the straight run of $steps steps failed"; }
  local straight=$dir/straight/$(basename "$saved") f
  [ "$(ls "$saved")" = "$(ls "$straight")" ] || fail "$saved holds other files than an uninterrupted run's"
  for f in "$saved"/*.safetensors; do
    cmp -s "$f" "$straight/${f##*/}" || fail "$f differs from an uninterrupted run of $steps steps"
  done
  # The metadata records the run's total step count (100000 here, $steps
  # there) beside the step, and each fresh run's trajectory, and so its own
  # checksum differs; all else in it is the same.
  local skip=(-e '^ *"steps": [0-9]*,$' -e '^ *"trajectory": ' -e '^ *"metadata_fnv1a64": ')
  diff <(grep -v "${skip[@]}" "$saved/metadata.json") <(grep -v "${skip[@]}" "$straight/metadata.json") >/dev/null ||
    fail "$saved/metadata.json differs from an uninterrupted run's in more than the total step count"
  [ "$(grep -c '^ *"steps": [0-9]*,$' "$saved/metadata.json")" = 1 ] ||
    fail "$saved/metadata.json does not record the total step count once"
  rm -rf "$dir/straight"
}

preempt TERM job "$meshtrain" train "${model[@]}" --training.steps 100000 --checkpoint.folder "$dir/one"
[ $rc -eq 143 ] || fail "one process: exit $rc, expected 143"
saved=$(printf '%s/one/step_%06d' "$dir" "$stopped")
[ "$(ls "$dir/one")" = "$(basename "$saved")" ] || { ls "$dir/one"; fail "one process: expected only $(basename "$saved")"; }
same_weights_as_straight_run "$saved" "$stopped"
echo "one process, SIGTERM: exit 143 after step $stopped, $(basename "$saved") saved, bitwise the weights of a $stopped-step run"

# signal target expected-exit
for run in "TERM ranks 143" "USR1 job 138"; do
  read -r signal target expected <<<"$run"
  preempt $signal $target $mpirun -np 2 "$meshtrain" train "${model[@]}" --training.steps 100000 --checkpoint.folder "$dir/$signal"
  [ $rc -eq $expected ] || fail "two ranks, SIG$signal to $target: mpirun exit $rc, expected $expected"
  saved=$(printf '%s/%s/step_%06d' "$dir" $signal "$stopped")
  [ "$(ls "$dir/$signal")" = "$(basename "$saved")" ] || { ls "$dir/$signal"; fail "SIG$signal: expected only $(basename "$saved")"; }
  same_weights_as_straight_run "$saved" "$stopped" $mpirun -np 2
  echo "two ranks, SIG$signal to ${target/job/mpirun}: mpirun exit $rc, both stopped after step $stopped, $(basename "$saved") saved, bitwise a $stopped-step run's"
done

export OMPI_MCA_odls_base_sigkill_timeout=5
start=$(date +%s)
preempt TERM job $mpirun -np 2 "$meshtrain" train "${model[@]}" --training.steps 100000 --checkpoint.folder "$dir/mpirun"
took=$(($(date +%s) - start))
[ $rc -ne 0 ] || fail "SIGTERM to mpirun: exit 0"
saved=$(ls "$dir/mpirun")
[[ "$saved" =~ ^step_[0-9]{6}$ ]] || fail "SIGTERM to mpirun: expected one checkpoint, found '$saved'"
stopped=$((10#${saved:5:6}))
[ "$stopped" -ge 3 ] || fail "SIGTERM to mpirun: saved step $stopped"
same_weights_as_straight_run "$dir/mpirun/$saved" "$stopped" $mpirun -np 2
echo "two ranks, SIGTERM to mpirun: exit $rc after ${took} s, $saved saved, bitwise a $stopped-step run's, no process left"
echo PASS
