#!/usr/bin/env bash
# Training speed of two meshtrain builds on the benchmark model, in rounds
# that alternate the two (this host is noisy): for a refactor that must not
# change speed. Each round's figure is the median step time.
# Usage: [ROUNDS=3] bench/compare_builds.sh OLD_BINARY NEW_BINARY [THREADS] [STEPS] [float32|bfloat16]
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: bench/compare_builds.sh OLD_BINARY NEW_BINARY [THREADS] [STEPS] [float32|bfloat16]" >&2; exit 2; }
old=$1 new=$2 threads=${3:-$(nproc)} steps=${4:-10} dtype=${5:-float32}
for b in "$old" "$new"; do [ -x "$b" ] || { echo "bench/compare_builds.sh: $b is not an executable" >&2; exit 2; }; done
source bench/bench_model.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bench_text "$work/text.txt"
olds=() news=()
for round in $(seq "${ROUNDS:-3}"); do
  olds+=("$(bench_meshtrain "$old" "$threads" "$steps" "$dtype" "$work/text.txt" "$work")")
  news+=("$(bench_meshtrain "$new" "$threads" "$steps" "$dtype" "$work/text.txt" "$work")")
done
python3 - "$dtype" "$threads" "${olds[*]}" "${news[*]}" <<'PY'
import statistics, sys
dtype, threads = sys.argv[1], sys.argv[2]
olds, news = ([float(x) for x in a.split()] for a in sys.argv[3:5])
for i, (o, n) in enumerate(zip(olds, news), 1):
    print(f"round {i}: old {o*1000:.1f} ms/step, new {n*1000:.1f} ms/step, new/old {n/o:.3f}")
print(f"{dtype}, {threads} threads: old {statistics.median(olds)*1000:.1f} ms, new {statistics.median(news)*1000:.1f} ms "
      f"(medians), new/old {statistics.median(n/o for o, n in zip(olds, news)):.3f} (median round)")
PY
