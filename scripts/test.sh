#!/usr/bin/env bash
# Build and run the whole test suite:
#   1. Release build: unit tests, GPU tests (built with the CUDA toolkit,
#      skipped without a GPU), mpirun tests (2, 3 and 4 ranks), install test,
#      hardening tests that need a big file;
#   2. Debug build with AddressSanitizer + UBSan (no CUDA): the unit tests again;
#   3. the fuzzers of fuzz/ for 10 s each (scripts/fuzz.sh runs them longer).
# Labels let parts run apart: ctest -L unit | gpu | mpi | install | hardening; slow marks the
# long ones (ctest -LE slow leaves them out).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

scripts/setup.sh build -DMESHTRAIN_BUILD_TESTS=ON
(cd build && ctest -L unit -j "$jobs" --output-on-failure)
# Built where the CUDA toolkit is; each test skips, saying so, without a GPU.
(cd build && ctest -L gpu --output-on-failure --no-tests=ignore)
# The mpirun tests oversubscribe the cores already: one at a time.
(cd build && ctest -L 'mpi|install' --output-on-failure)
(cd build && ctest -L hardening --output-on-failure)

echo "== Debug + AddressSanitizer/UBSan build: unit tests"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMESHTRAIN_SANITIZE=ON -DMESHTRAIN_BUILD_TESTS=ON -DMESHTRAIN_CUDA=OFF >/dev/null
cmake --build build-asan -j "$jobs" --target unit_tests meshtrain
# (tokenizer_parity left out: it tokenizes 5 MB against Python references,
# minutes in a Debug build, and the release build above runs it.)
(cd build-asan && ctest -L unit -E '^tokenizer_parity$' -j "$jobs" --output-on-failure)

echo "== fuzzers (config, safetensors, token shard, layout, flight-recorder dumps, hardware profiles, checkpoints, pipeline schedules), 10 s each"
scripts/fuzz.sh 10
