#!/usr/bin/env bash
# Context parallelism's memory: the debug model (Llama dim 256, 6 layers, 16
# heads, vocab 256) on one sequence of SEQ tokens (default 8192), trained
# for 2 steps on one rank (cp 1) and on CP ranks (default 4) with the
# sequence split over them; prints each run's peak per rank, measured (the
# training run's) and estimated (meshtrain estimate on this machine's
# profile), and their ratio, which the issue asks to be at most 0.35 at
# CP 4. The two runs must also agree on the loss and gradient norm.
# CP_ATTENTION (allgather, ring or auto, the default) picks parallel.cp_attention.
# Usage: [CP_ATTENTION=MODE] bench/cp_memory.sh [SEQ] [CP]
set -euo pipefail
cd "$(dirname "$0")/.."
seq=${1:-8192}
cp=${2:-4}
[[ $seq =~ ^[1-9][0-9]*$ && $cp =~ ^[1-9][0-9]*$ ]] || { echo "bench/cp_memory.sh: SEQ and CP must be positive integers" >&2; exit 2; }
(( seq % (2 * cp) == 0 )) || { echo "bench/cp_memory.sh: SEQ $seq must divide by 2 x CP ($((2 * cp)))" >&2; exit 2; }
[ -x build/meshtrain ] || scripts/setup.sh build
model=(--config configs/debug.toml --data.seq_len "$seq" --data.batch_size 1 --training.steps 2 --checkpoint.folder ""
       --metrics.file "" --parallel.cp_attention "${CP_ATTENTION:-auto}")
peak() { sed -n 's/.*peak memory \([0-9.]*\) MiB.*/\1/p' | tail -1; }
estimated() { build/meshtrain estimate --hardware cpu-2core "${model[@]}" "$@" | sed -n 's/^memory: peak \([0-9.]*\) MiB.*/\1/p'; }
echo "debug model, one sequence of $seq tokens, 2 steps, cp_attention ${CP_ATTENTION:-auto} ($(date -u +%F), $(nproc) cores)"
one=$(build/meshtrain train "${model[@]}" 2>&1)
split=$(scripts/mpirun.sh -np "$cp" build/meshtrain train "${model[@]}" --parallel.cp "$cp" 2>&1)
last() { grep '^step' | tail -1 | awk '{print $4, $8}'; }
[ "$(last <<<"$one")" = "$(last <<<"$split")" ] || { echo "the last step's loss and gradient norm differ: $(last <<<"$one") vs $(last <<<"$split")" >&2; exit 1; }
m1=$(peak <<<"$one") mc=$(peak <<<"$split") e1=$(estimated --ranks 1) ec=$(estimated --ranks "$cp" --parallel.cp "$cp")
printf '%-22s %12s %12s\n' "peak per rank (MiB)" measured estimated
printf '%-22s %12s %12s\n' "cp 1, one rank" "$m1" "$e1"
printf '%-22s %12s %12s\n' "cp $cp, $cp ranks" "$mc" "$ec"
awk -v m1="$m1" -v mc="$mc" -v e1="$e1" -v ec="$ec" \
  'BEGIN { printf "%-22s %12.3f %12.3f   (the issue asks <= 0.35 at cp 4)\n", "ratio", mc / m1, ec / e1 }'
echo "the last step's loss and gradient norm, both runs: $(last <<<"$one")"
