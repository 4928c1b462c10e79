# Sourced by the parity tests after common.sh, with $model (meshtrain train's
# arguments for every run) and $f32 (the default tolerances: loss, grad_norm,
# weights max and l2) set:
#   run NAME NP [KEY VALUE ...]   trains on NP ranks, logging every step to $dir/NAME.jsonl, exporting the weights
#                                 to $dir/NAME.safetensors, and checks that its sharded checkpoint put back together
#                                 by meshtrain export is those weights bitwise;
#   resume NAME FROM NP [KEY VALUE ...]
#                                 copies FROM's checkpoint folder to NAME's and trains 2 more steps (to 22) from it on NP
#                                 ranks, logging and exporting as run does;
#   compare NAME [BASE [LOSS GRAD_NORM WEIGHT_MAX WEIGHT_L2]]
#                                 NAME's steps and weights against BASE's (default: one), tests/mpi/compare_runs.py.
run() {  # NAME NP [KEY VALUE ...]
  local name=$1 np=$2
  shift 2
  local launch=()
  [ "$np" -gt 1 ] && launch=($mpirun -np "$np")
  timeout 300 "${launch[@]}" "$meshtrain" train "${model[@]}" --metrics.file "$dir/$name.jsonl" \
    --checkpoint.folder "$dir/$name" --checkpoint.export "$dir/$name.safetensors" "$@" > "$dir/$name.out" 2>&1 ||
    { cat "$dir/$name.out"; fail "$name exited non-zero"; }
  tail -n 3 "$dir/$name.out"
  # The sharded checkpoint (every rank's pieces) put back together is the gathered export, bitwise.
  "$meshtrain" export --checkpoint "$dir/$name" --out "$dir/$name.from_shards.safetensors" > /dev/null ||
    fail "$name: export of its checkpoint failed"
  cmp -s "$dir/$name.safetensors" "$dir/$name.from_shards.safetensors" ||
    fail "$name: its sharded checkpoint exported differs from the weights gathered at the end"
}
resume() {  # NAME FROM NP [KEY VALUE ...]
  local name=$1 from=$2 np=$3
  shift 3
  cp -r "$dir/$from" "$dir/$name"
  timeout 300 $mpirun -np "$np" "$meshtrain" train "${model[@]}" --training.steps 22 --checkpoint.folder "$dir/$name" \
    --metrics.file "$dir/$name.jsonl" --checkpoint.export "$dir/$name.safetensors" "$@" > "$dir/$name.out" 2>&1 ||
    { cat "$dir/$name.out"; fail "$name exited non-zero"; }
}
# compare NAME [BASE [LOSS GRAD_NORM WEIGHT_MAX WEIGHT_L2 [AUX_LOSS]]]: against BASE's run (default: one), with f32's
# tolerances unless given (the load-balancing loss's, unless given, the loss's).
compare() {
  local base=${2:-one}
  local t=("${@:3}")
  [ ${#t[@]} -ge 4 ] || t=("${f32[@]}")
  python3 tests/mpi/compare_runs.py "$1" "$dir/$base.jsonl" "$dir/$1.jsonl" --tolerance "${t[0]}" \
    --grad-norm-tolerance "${t[1]}" --aux-loss-tolerance "${t[4]:-${t[0]}}" \
    --weights "$dir/$base.safetensors" "$dir/$1.safetensors" \
    --weight-tolerance "${t[2]}" --weight-l2-tolerance "${t[3]}" || exit 1
}
