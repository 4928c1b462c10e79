#!/usr/bin/env bash
# How long the training loop stops for a checkpoint: synchronous saves
# against checkpoint.async (the state copied, then written on a thread while
# training goes on), same run, same model: the bundled Llama of
# configs/debug.toml (4.7M parameters: a checkpoint of weights and both AdamW
# moments is about 57 MB), a checkpoint every INTERVAL steps on RANKS
# ranks (FSDP). Each save's stall as the trainer reports it, the median and
# the total, and async / sync (target: at most 10%); and each whole run's
# wall time, since the writer thread shares the cores with the steps.
# Usage: bench/checkpoint.sh [STEPS=40] [INTERVAL=5] [RANKS=1]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-40} interval=${2:-5} ranks=${3:-1}
for v in "$steps" "$interval" "$ranks"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "bench/checkpoint.sh: STEPS, INTERVAL and RANKS must be positive integers" >&2; exit 2; }
done
scripts/setup.sh build > /dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
launch=()
[ "$ranks" -gt 1 ] && launch=(scripts/mpirun.sh -np "$ranks")
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); checkpoints in $work ($(df -T "$work" | awk 'NR==2 {print $2}'))"
echo "configs/debug.toml, $steps steps, a checkpoint every $interval, $ranks rank(s)"
for mode in false true; do
  t0=$(date +%s.%N)
  "${launch[@]}" build/meshtrain train --config configs/debug.toml --training.steps "$steps" \
    --checkpoint.interval "$interval" --checkpoint.async "$mode" --checkpoint.folder "$work/$mode" \
    --metrics.file "" --metrics.log_every "$steps" > "$work/$mode.out" 2>&1 || { cat "$work/$mode.out"; exit 1; }
  echo "$t0 $(date +%s.%N)" > "$work/$mode.wall"
  if [ "$mode" = false ]; then
    sed -n 's/^saved .* (\([0-9.]*\) ms)$/\1/p' "$work/$mode.out" > "$work/$mode.ms"
  else
    sed -n 's/.*the loop stopped \([0-9.]*\) ms to copy the state\( and \([0-9.]*\) ms for the save before\)\{0,1\}$/\1 \3/p' \
      "$work/$mode.out" | awk '{print $1 + $2}' > "$work/$mode.ms"
  fi
done
python3 - "$work" <<'PY'
import statistics, sys
work = sys.argv[1]
sync = [float(x) for x in open(f"{work}/false.ms")]
async_ = [float(x) for x in open(f"{work}/true.ms")]
wall = {}
for mode in ("false", "true"):
    t0, t1 = (float(x) for x in open(f"{work}/{mode}.wall").read().split())
    wall[mode] = t1 - t0
assert sync and len(sync) == len(async_), (sync, async_)
for name, ms in (("synchronous", sync), ("async", async_)):
    print(f"{name:12s} saves: {' '.join(f'{x:.1f}' for x in ms)} ms; median {statistics.median(ms):.1f} ms, total {sum(ms):.1f} ms")
print(f"async / sync: median {statistics.median(async_) / statistics.median(sync):.3f}, total {sum(async_) / sum(sync):.3f} (target <= 0.10)")
print(f"whole run (start-up, steps, saves; the writer thread shares the cores with training): "
      f"synchronous {wall['false']:.2f} s, async {wall['true']:.2f} s, ratio {wall['true'] / wall['false']:.3f}")
PY
