#!/usr/bin/env bash
# Install meshtrain from BUILD_DIR into a scratch prefix, then build and run
# a separate project that finds it with find_package(meshtrain).
set -eu
build=$1 here=$2
prefix=$(mktemp -d) work=$(mktemp -d)
trap 'rm -rf "$prefix" "$work"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
cmake -S "$here/consumer" -B "$work" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work" -j 2 >/dev/null
"$work/consumer"
