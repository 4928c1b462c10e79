# Sourced by the mpirun test scripts with their arguments ("MPIRUN [FLAGS]"
# MESHTRAIN SOURCE_DIR ...): sets $mpirun, $meshtrain and $src, makes the
# scratch folder $dir (removed on exit, with the background $job killed if one
# is set), defines fail and bad, and works in the source folder. Says which
# Open MPI transports the ranks may use where the environment picks them (the
# tests labelled tcp: OMPI_MCA_btl=tcp,self).
set -u
mpirun=$1 meshtrain=$2 src=$3
[ -z "${OMPI_MCA_btl:-}" ] || echo "transports: OMPI_MCA_pml=${OMPI_MCA_pml:-(default)} OMPI_MCA_btl=$OMPI_MCA_btl"
dir=$(mktemp -d)
job=
trap '[ -n "$job" ] && kill -9 $job 2>/dev/null; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# choose_subset [SUBSET]: the parity tests' optional last argument. `all` (the default) runs every case; `transport`
# (their runs over TCP alone, tests/CMakeLists.txt) only those whose messages differ from one another: the rest move
# the same ones. `full` says whether every case runs.
choose_subset() {
  subset=${1:-all}
  [ "$subset" = all ] || [ "$subset" = transport ] || { echo "$0: no subset '$subset' (all or transport)" >&2; exit 2; }
}
full() { [ "$subset" = all ]; }
# bad NP MESSAGE ARGS...: meshtrain train "${model[@]}" ARGS on NP ranks must print MESSAGE exactly once and every
# rank exit non-zero within 60 s (no hang).
bad() {
  local np=$1 message=$2 out rc
  shift 2
  out=$(timeout 60 $mpirun -np "$np" "$meshtrain" train "${model[@]}" "$@" 2>&1)
  rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "$out"; fail "$*: exit $rc (expected a non-zero exit, not a hang)"; }
  [ "$(grep -cF "$message" <<<"$out")" = 1 ] || { echo "$out"; fail "$*: '$message' is not printed exactly once"; }
}
# at_random_moment_after STEP OUT: waits (up to 12 s) until the background $job has logged STEP to OUT, then
# 0-30 ms more: a random moment inside a later step.
at_random_moment_after() {
  local step=$1 out=$2
  for _ in $(seq 600); do
    grep -q "^step *$step/" "$out" && break
    kill -0 $job 2>/dev/null || break
    sleep 0.02
  done
  sleep "0.0$((RANDOM % 3))$((RANDOM % 10))"
}
# What glibc, Open MPI and the shell print of a process that crashed (for grep -E).
crashed='corrupted|free\(\): |malloc\(\): |double free|Segmentation fault|Process received signal|\(Aborted\)|signal 11'
# same_checkpoint A B: checkpoint folders A and B hold the same files, bitwise, but for the trajectory in the
# metadata (a fresh run draws its own) and so the metadata's own checksum.
same_checkpoint() {
  local a=$1 b=$2 f
  [ "$(ls "$a")" = "$(ls "$b")" ] || return 1
  for f in "$a"/*; do
    [ "${f##*/}" = metadata.json ] || cmp -s "$f" "$b/${f##*/}" || return 1
  done
  diff <(grep -v -e '^ *"trajectory": ' -e '^ *"metadata_fnv1a64": ' "$a/metadata.json") \
       <(grep -v -e '^ *"trajectory": ' -e '^ *"metadata_fnv1a64": ' "$b/metadata.json") >/dev/null
}
cd "$src"
