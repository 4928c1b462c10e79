#!/usr/bin/env bash
# `meshtrain estimate` against published figures of the same layouts: the
# torchtitan paper's H100 rows (arXiv 2410.06511; the repository's
# benchmarks/llama3_h100_202412_torchtitan.md, torchtitan 9dec370, Dec 2024),
# tokens/s per GPU and peak memory, with the ratio estimate / published.
#
# What differs, so the ratios read right:
# - torchtitan's machines were HBM2e H100s (96 GB, 2.4 TB/s) at a 500 W
#   power limit; the h100-sxm profile is the 700 W HBM3 datasheet part.
# - The rows marked Float8 ran Float8 linears (and FP8 all-gathers for
#   FSDP); meshtrain estimates them with training.fp8 tensorwise: FP8 GEMMs at
#   the profile's FP8 peak, the weights gathered in bf16, each amax
#   all-reduced on its own. The 405B rows also ran async TP; meshtrain
#   estimates plain TP collectives there (the 70B rows with async TP set
#   estimate parallel.async_tp).
# - torchtitan's selective AC ("op") keeps every other matmul's output and
#   recomputes the rest, as configs/llama3_8b.toml does; the row keeping
#   every matmul (meshtrain's plain selective) is printed too.
# - The 405B rows give no microbatch count: torchtitan at 9dec370 took
#   pipeline_parallel_microbatches = the pipeline degree (8) when it was
#   not set (pipelining_utils.py; made stages-per-rank x degree in 90567fc,
#   Jan 2025), and 2 stages per rank for Interleaved 1F1B; the layers split
#   as meshtrain's default does (embedding and head a layer each). The
#   estimates with 32 microbatches (the local batch, one sequence each) are
#   printed too.
# - The context-parallel rows (the paper's 8B long-context table: FSDP + CP
#   on 8 GPUs, local batch 1, full AC, torch.compile and Float8; and its
#   405B 4D table: TP 8 x PP 8 x CP x FSDP, local batch 8, 1F1B) ran
#   PyTorch's CP over SDPA with its keys and values rotated; these estimates
#   all-gather them once per layer (parallel.cp_attention allgather). The
#   405B table names no precision: they are estimated in bf16.
# Usage: bench/published.sh [PROFILE] (default h100-sxm)
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-h100-sxm}
[ -x build/meshtrain ] || scripts/setup.sh build
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
estimate() {  # NAME PUBLISHED_TOKENS PUBLISHED_GIB ARGS...
  local name=$1 tokens=$2 gib=$3
  shift 3
  build/meshtrain estimate --hardware "$profile" --json "$@" > "$work/$name.json"
  echo "$name $tokens $gib"
}
{
  estimate "8B_FSDP8_8gpu_selAC_lbs2 (eager)" 5762 82.4 --config configs/llama3_8b.toml --ranks 8
  estimate "8B_FSDP8_8gpu_selAC_lbs2, every mm kept" 5762 82.4 --config configs/llama3_8b.toml --ranks 8 \
    --activation_checkpoint.selective_matmuls all
  estimate "8B_FSDP8_8gpu_selAC_lbs2 (compile)" 6667 77.0 --config configs/llama3_8b.toml --ranks 8
  estimate "8B_FSDP8_8gpu_selAC_lbs2 (compile, Float8)" 8532 76.8 --config configs/llama3_8b.toml --ranks 8 \
    --training.fp8 tensorwise
  # 70B on 256 GPUs, FSDP 32 x TP 8 with sequence and loss parallel, full AC, local batch 16: the paper's Table 4
  # (compile, Float8) without and with async TP, and the async-TP benchmark of June 2025 (bf16; it gives no memory).
  estimate "70B_FSDP32xTP8_256gpu_fullAC (compile, Float8)" 829 71.9 --config configs/llama3_70b.toml --ranks 256 \
    --training.fp8 tensorwise
  estimate "70B_FSDP32xTP8_256gpu_fullAC (Float8, async TP)" 876 67.6 --config configs/llama3_70b.toml --ranks 256 \
    --training.fp8 tensorwise --parallel.async_tp true
  estimate "70B_FSDP32xTP8_256gpu_fullAC (2025-06, bf16)" 597.3 nan --config configs/llama3_70b.toml --ranks 256
  estimate "70B_FSDP32xTP8_256gpu_fullAC (2025-06, bf16, async TP)" 652.4 nan --config configs/llama3_70b.toml \
    --ranks 256 --parallel.async_tp true
  estimate "8B_FSDP128_128gpu_selAC_lbs2 (compile)" 6514 62.0 --config configs/llama3_8b.toml --ranks 128 \
    --parallel.dp_shard 128 --data.batch_size 256
  # Long context: CP c x FSDP 8/c, one sequence per data-parallel rank, the keys all-gathered (the estimates in
  # docs/benchmarks.md; parallel.cp_attention auto may choose the ring).
  for row in "1 32768 3890 83.9" "2 65536 2540 84.2" "4 131072 1071 84.0" "8 262144 548 84.5"; do
    read -r cp seq tokens gib <<<"$row"
    estimate "8B_FSDP$((8 / cp))xCP${cp}_8gpu_fullAC_${seq} (Float8)" "$tokens" "$gib" --config configs/llama3_8b.toml \
      --ranks 8 --parallel.cp "$cp" --parallel.dp_shard $((8 / cp)) --data.seq_len "$seq" \
      --data.batch_size $((8 / cp)) --activation_checkpoint.mode full --activation_checkpoint.selective_matmuls all \
      --parallel.cp_attention allgather --training.fp8 tensorwise
  done
  # 405B with context parallelism (the paper's 4D table): TP 8 x PP 8 x CP c x FSDP 8/c on 512 GPUs, local batch 8,
  # 1F1B over the pipeline degree's 8 microbatches, full AC, in bf16 (the table names no Float8), keys all-gathered.
  for row in "1 32768 76 75.3" "2 65536 47 75.9" "4 131072 31 77.1" "8 262144 16 84.9"; do
    read -r cp seq tokens gib <<<"$row"
    estimate "405B_TP8xPP8xCP${cp}xFSDP$((8 / cp))_1F1B_${seq}" "$tokens" "$gib" --config configs/llama3_405b.toml \
      --ranks 512 --parallel.pp 8 --parallel.cp "$cp" --parallel.dp_shard $((8 / cp)) --data.seq_len "$seq" \
      --data.batch_size $((8 * 8 / cp)) --parallel.pp_microbatches 8 --parallel.pp_schedule 1f1b \
      --parallel.cp_attention allgather
  done
  pp=(--config configs/llama3_405b.toml --ranks 512 --parallel.pp 8 --parallel.dp_shard 8 --training.fp8 tensorwise)
  estimate "405B_FSDP8xTP8xPP8_1F1B_m8 (Float8)" 100 82.5 "${pp[@]}" --parallel.pp_schedule 1f1b \
    --parallel.pp_microbatches 8
  estimate "405B_FSDP8xTP8xPP8_interleaved_m8 (Float8)" 128 72.7 "${pp[@]}" --parallel.pp_schedule interleaved_1f1b \
    --parallel.pp_microbatches 8
  estimate "405B_FSDP8xTP8xPP8_1F1B_m32 (Float8)" 100 82.5 "${pp[@]}" --parallel.pp_schedule 1f1b \
    --parallel.pp_microbatches 32
  estimate "405B_FSDP8xTP8xPP8_interleaved_m32 (Float8)" 128 72.7 "${pp[@]}" --parallel.pp_schedule interleaved_1f1b \
    --parallel.pp_microbatches 32
} > "$work/rows.txt"
python3 - "$work" "$profile" <<'PY'
import json, sys
work, profile = sys.argv[1], sys.argv[2]
print(f"meshtrain estimate on {profile} against torchtitan's published H100 rows (ratio = estimate / published)")
print(f"{'row (published setting)':46} {'tok/s/GPU':>9} {'published':>9} {'ratio':>6}   {'GiB':>6} {'published':>9} {'ratio':>6}")
for line in open(f"{work}/rows.txt"):
    name, tokens, gib = line.rsplit(maxsplit=2)
    e = json.load(open(f"{work}/{name}.json"))
    t = e["tokens_per_s_per_device"]
    m = e["memory"]["peak_bytes"] / 2**30
    print(f"{name:46} {t:9.0f} {float(tokens):9.0f} {t / float(tokens):6.2f}   {m:6.1f} {float(gib):9.1f} {m / float(gib):6.2f}")
PY
# autoplan on the layouts' own jobs (AUTOPLAN=0 skips it): the fastest plan it finds for the model, ranks, batch and
# numerics of the 8B rows on 8 and 128 GPUs, the 70B row on 256 and the 405B row on 512, against the published plan's
# own estimate (above); each search stops after AUTOPLAN_SECONDS (default 600) with the best found so far.
[ "${AUTOPLAN:-1}" = 0 ] && exit 0
echo
echo "autoplan on $profile against the published plan's estimate (searches of at most ${AUTOPLAN_SECONDS:-600} s)"
search() {  # NAME PUBLISHED_ROW ARGS...
  local name=$1 row=$2
  shift 2
  build/meshtrain autoplan --hardware "$profile" --top 1 --max-seconds "${AUTOPLAN_SECONDS:-600}" --json "$@" \
    > "$work/autoplan.json" 2> /dev/null || { echo "$name: autoplan failed"; return; }
  python3 - "$work/autoplan.json" "$work/$row.json" "$name" <<'PY'
import json, sys
found, published, name = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
best = found["best"][0]
t, p = best["tokens_per_s_per_device"], published["tokens_per_s_per_device"]
state = "complete" if found["complete"] else f"stopped, {found['layouts_searched']} of {found['layouts']} layouts"
print(f"{name}: found {t:.0f} tokens/s/GPU against the published plan's {p:.0f} ({t / p:.3f}x; "
      f"{'>=' if t >= p else 'BELOW'}), {best['peak_bytes'] / 2**30:.1f} GiB, in {found['seconds']:.0f} s ({state}): "
      f"{best['command_line'] or '(the config as it is)'}")
PY
}
search "8B on 8" "8B_FSDP8_8gpu_selAC_lbs2 (compile)" --config configs/llama3_8b.toml --ranks 8
search "8B on 128" "8B_FSDP128_128gpu_selAC_lbs2 (compile)" --config configs/llama3_8b.toml --ranks 128 \
  --data.batch_size 256
search "70B on 256" "70B_FSDP32xTP8_256gpu_fullAC (compile, Float8)" --config configs/llama3_70b.toml --ranks 256 \
  --training.fp8 tensorwise
search "405B on 512" "405B_FSDP8xTP8xPP8_1F1B_m8 (Float8)" --config configs/llama3_405b.toml --ranks 512 \
  --training.fp8 tensorwise
