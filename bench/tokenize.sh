#!/usr/bin/env bash
# `meshtrain tokenize` against tiktoken and sentencepiece: tokens/s on the
# same text, on 1 thread and on THREADS (default: every core). The text is
# MB of tests/data/tokenizer_parity.py's varied corpus (code, a dozen
# scripts, whitespace runs, emoji, long pieces, some invalid UTF-8: replaced
# by U+FFFD on both sides), with a byte-level BPE of 16,000 tokens trained
# on it with Hugging Face tokenizers (the Llama 3 split pattern) and a
# SentencePiece BPE model of 8,000 pieces. meshtrain's time is the whole
# command (start, load the tokenizer, read and check the files, tokenize,
# write the shards); the references' is encode_ordinary_batch and
# encode(list, num_threads) on text already in memory. Each side runs ROUNDS
# times, alternating; the median is reported. The Python packages come from
# PyPI into build/tokenizer-parity-venv, as tests/data/tokenizer_parity_test.sh
# makes it.
# Usage: [ROUNDS=3] [MESHTRAIN=build/meshtrain] bench/tokenize.sh [MB] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
mb=${1:-32}
threads=${2:-$(nproc)}
meshtrain=${MESHTRAIN:-build/meshtrain}
[ -x "$meshtrain" ] || { scripts/setup.sh build; meshtrain=build/meshtrain; }
build=$(dirname "$meshtrain")
venv=$build/tokenizer-parity-venv
if [ ! -x "$venv/bin/python" ]; then
  tests/data/tokenizer_parity_test.sh "$meshtrain" "$(pwd)" "$build" >/dev/null ||
    { echo "bench/tokenize.sh: could not make $venv (PyPI reachable?)" >&2; exit 2; }
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "meshtrain tokenize against tiktoken and sentencepiece: $mb MB, 1 and $threads threads, $(date -u +%F)"
"$venv/bin/python" tests/data/tokenizer_parity.py bench "$(realpath "$meshtrain")" "$work" "$mb" "$threads" "${ROUNDS:-3}"
