#!/usr/bin/env bash
# A rank that hangs (issue 14, faults): 2 ranks train with comm.timeout_s 3;
# after step 5 one rank is stopped (SIGSTOP), alive but silent. The other
# must give up within the timeout: its error names the collective, it dumps
# its flight recorder, fr-analyze names the stopped rank (or the collective
# it stalled in), and the job ends
# non-zero within the timeout plus 10 s with no process left.
# Usage: hang_test.sh "MPIRUN [FLAGS]" MESHTRAIN SOURCE_DIR
source "$(dirname "$0")/common.sh"
trap '[ -n "$job" ] && kill -9 $job 2>/dev/null; pkill -9 -f -- "--checkpoint.folder $dir/ckpt " 2>/dev/null; rm -rf "$dir"' EXIT
$mpirun -np 2 -x MESHTRAIN_FR_DIR="$dir/fr" "$meshtrain" train --config configs/debug.toml --model.dim 64 \
  --model.n_layers 2 --model.n_heads 4 --model.n_kv_heads 2 --model.ffn_dim 128 --data.seq_len 32 \
  --training.steps 100000 --metrics.log_every 1 --metrics.file "" --comm.timeout_s 3 \
  --checkpoint.folder "$dir/ckpt" > "$dir/out" 2>&1 &
job=$!
for _ in $(seq 600); do
  grep -q "^step *5/" "$dir/out" && break
  kill -0 $job 2>/dev/null || { cat "$dir/out"; fail "the run ended before step 5"; }
  sleep 0.05
done
victim=$(pgrep -f -- "--checkpoint.folder $dir/ckpt" | while read -r p; do
  tr '\0' '\n' < /proc/$p/environ | grep -q '^OMPI_COMM_WORLD_RANK=1$' && echo "$p"; done)
[ -n "$victim" ] || fail "no rank 1 found"
kill -STOP "$victim"
stopped=$(date +%s%N)
for _ in $(seq 130); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
kill -0 $job 2>/dev/null && { cat "$dir/out"; fail "the job still runs 13 s after rank 1 stopped (timeout 3 s)"; }
wait $job
rc=$?
job=
took=$(( ($(date +%s%N) - stopped) / 1000000 ))
cat "$dir/out" | grep -v "^step"
echo "--- mpirun exit $rc, ${took} ms after rank 1 was stopped"
[ $rc -ne 0 ] || fail "exit 0 with a hung rank"
pgrep -f -- "--checkpoint.folder $dir/ckpt " >/dev/null && fail "a process is left running"
grep -q "timed out after 3000 ms on rank 0" "$dir/out" || fail "rank 0's error does not name the collective and the timeout"
[ "$(grep -c '^meshtrain: error:' "$dir/out")" -eq 1 ] || fail "the error is not printed once"
report=$("$meshtrain" fr-analyze "$dir/fr" 2>&1)
echo "$report"
# Rank 1, stopped, cannot dump, and fr-analyze names it; but mpirun's kill
# sends SIGCONT first, and rank 1 dumps once it has run on a little: if its
# dump ends before the collective rank 0 gave up on, rank 1 never joined it
# (seen in 3 of 6 runs on a loaded machine); if it agrees with rank 0 on a
# collective both issued, that one is reported as stalled; if it finished
# the one rank 0 gave up on, rank 1 is named late.
grep -q "^FIRST MISMATCH: .*rank(s) 1 of this group left no dump" <<<"$report" ||
  grep -q "^FIRST MISMATCH: .*: rank 1 never joined; rank 0 issued it" <<<"$report" ||
  grep -q "^FIRST MISMATCH: .*every rank issued it and none finished it" <<<"$report" ||
  grep -q "^FIRST MISMATCH: .*rank(s) 1 joined too late" <<<"$report" ||
  fail "fr-analyze names neither rank 1 nor the stalled collective"
echo PASS
