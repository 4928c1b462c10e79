#!/usr/bin/env bash
# Ranks that disagree stop before training (issue 31, item 2): a rank given
# another optimizer.lr, training.seed, training.steps (which used to hang),
# max_grad_norm, checkpoint.load_step, a data file of the same size but other
# bytes, or --no-verify where the others verify: the job ends within 60 s,
# the error printed once, naming the key and each rank's value. Runs under
# OMPI_MCA_btl=tcp,self too (ranks on different hosts).
# Usage: rank_agreement_test.sh "MPIRUN [FLAGS]" MESHTRAIN SOURCE_DIR
source "$(dirname "$0")/common.sh"
meshtrain=$(realpath "$meshtrain")  # the last case runs each rank in a folder of its own
model=(--config "$PWD/configs/debug.toml" --model.dim 64 --model.n_layers 1 --model.n_heads 4 --model.n_kv_heads 2
       --model.ffn_dim 128 --data.seq_len 32 --data.batch_size 4 --training.steps 2 --checkpoint.folder "")
# differ MESSAGE "RANK0 ARGS" "RANK1 ARGS": two ranks, one app context each.
differ() {
  local message=$1 out rc
  read -r -a first <<<"$2"
  read -r -a second <<<"$3"
  out=$(timeout 60 $mpirun -np 1 "$meshtrain" train "${model[@]}" "${first[@]}" : \
    -np 1 "$meshtrain" train "${model[@]}" "${second[@]}" 2>&1)
  rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "$out"; fail "$2 / $3: exit $rc (expected a non-zero exit, not a hang)"; }
  [ "$(grep -cF -- "$message" <<<"$out")" = 1 ] || { echo "$out"; fail "$2 / $3: '$message' is not printed exactly once"; }
}
for btl in "" tcp,self; do
  export OMPI_MCA_btl=$btl
  [ -n "$btl" ] || unset OMPI_MCA_btl
  differ "the ranks disagree on optimizer.lr: rank 0 has 0.001; rank 1 has 0.002" "--optimizer.lr 1e-3" \
    "--optimizer.lr 2e-3"
  differ "the ranks disagree on training.seed: rank 0 has 0; rank 1 has 7" "" "--training.seed 7"
  differ "the ranks disagree on training.steps: rank 0 has 2; rank 1 has 3" "" "--training.steps 3"
  differ "the ranks disagree on training.max_grad_norm" "" "--training.max_grad_norm 0.5"
  differ "the ranks disagree on checkpoint.load_step" "" "--checkpoint.load_step 4"
  differ "--no-verify is given to some ranks and not to others" "" "--no-verify"
done
# A key set on one rank only that adds a file to compare (each rank still compares as many lines).
differ "the ranks disagree on validation.path: rank 0 has \"\"; rank 1 has \"data/corpus.txt\"" "" \
  "--validation.path data/corpus.txt"
# The same path, other bytes (each rank in a folder of its own; the config's data.path is relative).
mkdir -p "$dir/a" "$dir/b"
cp data/corpus.txt "$dir/a/corpus.txt"
python3 -c "import sys; d = bytearray(open(sys.argv[1], 'rb').read()); d[1000] ^= 1; open(sys.argv[2], 'wb').write(d)" \
  data/corpus.txt "$dir/b/corpus.txt"
out=$(timeout 60 $mpirun -np 1 -wdir "$dir/a" "$meshtrain" train "${model[@]}" --data.path corpus.txt : \
  -np 1 -wdir "$dir/b" "$meshtrain" train "${model[@]}" --data.path corpus.txt 2>&1)
[ "$(grep -cF "the ranks disagree on the contents of data.path: rank 0 has 69344 bytes" <<<"$out")" = 1 ] ||
  { echo "$out"; fail "a data file of the same size but other bytes was not named"; }
echo "every disagreement stopped the job with one error naming it"
