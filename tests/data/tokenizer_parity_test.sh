#!/usr/bin/env bash
# Tokenizer parity: `meshtrain tokenize` gives the ids tiktoken and
# sentencepiece give, on a few MB of varied text built here, with tokenizers
# trained here (tests/data/tokenizer_parity.py says what it checks). The
# Python packages come from PyPI into a virtual environment under the build
# folder, kept between runs; without PyPI (or python3-venv) the test skips
# (exit 77), saying why. sentencepiece is pinned to 0.1.99, the release line
# of Debian 12's libsentencepiece (0.1.97), which meshtrain links: the 0.2
# releases segment long runs of characters differently with unigram models.
# Usage: tokenizer_parity_test.sh MESHTRAIN SOURCE_DIR BUILD_DIR
set -euo pipefail
meshtrain=$1 src=$2 build=$3
venv=$build/tokenizer-parity-venv
packages=(tiktoken==0.14.0 tokenizers==0.23.3 sentencepiece==0.1.99)
want="${packages[*]}"
if [ "$(cat "$venv/packages" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    echo "SKIP: python3 -m venv failed (Debian: install python3-venv; scripts/setup.sh does)"
    rm -rf "$venv"
    exit 77
  fi
  echo "installing ${packages[*]} from PyPI into $venv (once)"
  if ! timeout 600 "$venv/bin/pip" install -q --disable-pip-version-check "${packages[@]}"; then
    echo "SKIP: could not install ${packages[*]} from PyPI (no network?); nothing was compared"
    rm -rf "$venv"
    exit 77
  fi
  echo "$want" >"$venv/packages"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$venv/bin/python" "$src/tests/data/tokenizer_parity.py" "$meshtrain" "$work"
