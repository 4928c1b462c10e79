#!/usr/bin/env bash
# Regenerate docs/configuration.md from the config key table (what
# `meshtrain train --help` lists), with the unit tests built in BUILD_DIR
# (default build). The unit test ConfigReference.MatchesDocs fails while the
# two differ; it writes what the page should be to configuration.md in its
# working folder, which this copies.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
(cd "$out" && "$OLDPWD/$build_dir/unit_tests" --gtest_filter=ConfigReference.MatchesDocs >/dev/null) || true
cp "$out/configuration.md" docs/configuration.md
echo "wrote docs/configuration.md"
