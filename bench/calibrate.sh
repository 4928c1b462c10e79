#!/usr/bin/env bash
# A hardware profile of this machine for `meshtrain estimate`, from
# measurements taken here: the GEMM peak (gemm_peak, all cores, f32 and
# bf16), each compute-heavy op's rate and the memory-bound ops' bandwidth on
# one rank of a 2-rank run of the benchmark model, a core each (`train
# --profile`; as a share of the host's peak: rate x 2 / peak; the grouped
# GEMMs from the same model with every MLP a Mixtral block), each of
# those ops' fixed time per call (the same run again at one sequence of 128
# a rank, a line fitted through the two mean calls: op_call_us), and
# meshtrain's own collectives in groups of 2 and 4 in jobs of 2 and 4 ranks
# (`bench comm --group-size`, 4 KiB to 64 MiB), in a group of 2 while the 2
# other ranks of 4 compute (--others-compute), and how far the slowest rank of
# a group of 2 or 4 trails when 4 ranks compute side by side (benchmark mode,
# sync_lateness). The job's ranks share this one host (shared_host): a rank
# of an N-rank job gets 1/N of the peaks, and while others wait (a
# pipeline's bubble) up to its threads' share of the host's cores (cores).
# Usage: bench/calibrate.sh [OUT.toml] [NAME]   (default runs/hardware/local.toml, "local-cpu")
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/hardware/local.toml}
name=${2:-local-cpu}
[ -x build/meshtrain ] && [ -x build/gemm_peak ] || scripts/setup.sh build
source bench/bench_model.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
threads=$(nproc)
echo "calibrate: GEMM peak on $threads cores" >&2
# Three runs each, the best kept by gflops() below: the host's other work only
# slows a run (one run here varies by up to 7%).
for run in 1 2 3; do
  OMP_NUM_THREADS=$threads build/gemm_peak float32 >> "$work/f32"
  OMP_NUM_THREADS=$threads build/gemm_peak bfloat16 >> "$work/bf16"
done
echo "calibrate: op rates of one rank of 2 (one core each) training the benchmark model (f32, DDP)" >&2
bench_text "$work/text.txt"
# `train --profile` of the benchmark model on 2 ranks (DDP 2) into FILE:
# profile FILE SEQ_LEN BATCH STEPS [OVERRIDES...]
profile() {
  scripts/mpirun.sh -np 2 build/meshtrain train --config configs/debug.toml --model.n_layers 4 --model.n_heads 8 \
    --model.n_kv_heads 8 --data.seq_len "$2" --data.batch_size "$3" --data.path "$work/text.txt" --training.steps "$4" \
    --parallel.dp_replicate 2 --parallel.dp_shard 1 --checkpoint.folder "" --metrics.file "" --profile "${@:5}" > "$1"
}
profile "$work/profile.txt" 256 8 12
profile "$work/profile_moe.txt" 256 8 12 "${bench_moe[@]}"
# A small GEMM runs below a large one's rate: the same at a pipeline's
# smallest microbatch (one sequence of 128 a rank), for each op's fixed time
# per call.
echo "calibrate: op rates of the same at one sequence of 128 a rank" >&2
profile "$work/profile_small.txt" 128 2 24
profile "$work/profile_moe_small.txt" 128 2 24 "${bench_moe[@]}"
# A group's time depends on the ranks sharing the host: a pair in a 4-rank
# job waits for cores the other pair holds. Each (group, job) measured apart;
# each size's time is its fastest round (preemption by the host's other
# work only adds; the step's own sharing of the cores is the estimator's).
for job in "2 2" "2 4" "4 4"; do
  read -r group np <<< "$job"
  echo "calibrate: meshtrain's collectives in groups of $group in a job of $np ranks" >&2
  scripts/mpirun.sh -np "$np" build/meshtrain bench comm --ops all_gather,reduce_scatter,all_reduce,all_to_all \
    --min-bytes 4K --max-bytes 64M --rounds 9 --group-size "$group" --json > "$work/comm_${group}_$np.json"
done
# A pipeline stage's collectives run while the other stages compute: a rank
# that shares its core with a computing one waits for its turn before it
# sees its peer's data. Measured with the 2 other ranks of 4 computing, each
# of the pair sharing its core with one of them (bound, 2 ranks a core), and
# 1 ms of compute before each collective as in a stage's program.
echo "calibrate: meshtrain's collectives in a group of 2 while the 2 other ranks compute" >&2
scripts/mpirun.sh "${bind_ranks[@]}" -np 4 build/meshtrain bench comm --ops all_gather,reduce_scatter,all_reduce,all_to_all \
  --min-bytes 4K --max-bytes 64M --rounds 9 --group-size 2 --others-compute --compute-us 1000 --json > "$work/comm_2_4_others.json"
# Ranks that share the cores advance unevenly, and a collective waits for its
# group's slowest rank: benchmark mode measures how far it trails in groups of
# 2 and 4 (DP 2 x TP 2), and keeps it in its kernel cache.
echo "calibrate: how far the slowest rank of a group trails, 4 ranks side by side (benchmark mode)" >&2
scripts/mpirun.sh -np 4 build/meshtrain train --config configs/debug.toml --model.n_layers 4 --model.n_heads 8 \
  --model.n_kv_heads 8 --data.seq_len 256 --data.batch_size 8 --data.path "$work/text.txt" --training.steps 1 \
  --parallel.dp_shard 2 --parallel.tp 2 --checkpoint.folder "" --metrics.file "" --schedule.estimate benchmark \
  --schedule.hardware cpu-2core --schedule.kernel_cache "$work/kernels.json" > "$work/lateness.log" 2>&1 ||
  { cat "$work/lateness.log" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
python3 - "$work" "$name" "$(hostname)" "$(lscpu | sed -n 's/^Model name: *//p' | head -1)" "$threads" > "$out" <<'PY'
import json, re, sys, datetime
work, name, host, cpu, threads = sys.argv[1:]
def gflops(path):  # gemm_peak prints GFLOP/s, once a run: the best run's
    return max(float(x) for x in open(path).read().split())
f32, bf16 = gflops(f"{work}/f32"), gflops(f"{work}/bf16")
# train --profile rows: op, calls, ms, share, GFLOP/s, GB/s
def profile(path):
    ops = {}
    for line in open(path):
        m = re.match(r"^(?:profile \(steps 2\.\.\):)?\s+([a-z_]+)\s+(\d+)\s+([0-9.]+)\s+[0-9.]+%\s+([0-9.]+)\s+([0-9.]+)\s*$", line)
        if m and m.group(1) != "op":
            op, calls, ms, gf, gb = m.group(1), int(m.group(2)), float(m.group(3)), float(m.group(4)), float(m.group(5))
            ops[op] = (ms * 1e-3, gf * ms * 1e-3, gb * ms * 1e-3, calls)  # seconds, GFLOP, GB, calls
    return ops
ops, small = profile(f"{work}/profile.txt"), profile(f"{work}/profile_small.txt")
# The grouped GEMMs run only in an MoE model: theirs from its runs.
grouped = ["grouped_matmul", "grouped_matmul_wgrad"]
for mine, path in ((ops, "profile_moe.txt"), (small, "profile_moe_small.txt")):
    mine.update({op: row for op, row in profile(f"{work}/{path}").items() if op in grouped})
# The GEMMs and the attention, compute-bound: their own efficiencies. The rest
# (elementwise, norms, the optimizer) are memory-bound: one bandwidth.
heavy = ["matmul", "rows_matmul", "grouped_matmul", "grouped_matmul_wgrad", "attention", "attention_backward"]
skip = {"wait", "all_gather", "reduce_scatter", "all_reduce", "all_to_all"}  # communication: its own table
light = [op for op in ops if op not in heavy and op not in skip and ops[op][2] > 0]
share = 2  # the rank had one of the 2 ranks' share of the host
memory_gbps = share * sum(ops[o][2] for o in light) / sum(ops[o][0] for o in light)
print(f'name = "{name}"')
print(f'description = "{cpu}, {threads} cores ({host}); calibrated by bench/calibrate.sh on {datetime.date.today()}"')
print("[device]")
print(f"peak_gflops_f32 = {f32:.1f}")
print(f"peak_gflops_bf16 = {bf16:.1f}")
print(f"memory_gbps = {memory_gbps:.2f}  # the memory-bound ops' bytes over their time, x 2 ranks")
print("compute_efficiency = 1.0")
print("memory_efficiency = 1.0")
print("shared_host = true")
print(f"cores = {threads}  # a rank computing while others wait (a pipeline's bubble) may take up to its threads' cores")
# Per heavy op, a call's time t = GFLOP / rate + fixed, through its mean call
# at both sizes (the large run's rate alone where the fit fails).
fits = {}
for op in heavy:
    if op not in ops or ops[op][0] <= 0:
        continue
    (t1, f1, _, n1), rate = ops[op], ops[op][1] / ops[op][0]
    fixed = 0.0
    if op in small and small[op][3] > 0:
        t2, f2, _, n2 = small[op]
        t1, f1, t2, f2 = t1 / n1, f1 / n1, t2 / n2, f2 / n2
        if t1 > t2 and f1 > f2:
            fit_rate = (f1 - f2) / (t1 - t2)
            if t2 > f2 / fit_rate:  # a positive fixed time
                rate, fixed = fit_rate, t2 - f2 / fit_rate
    fits[op] = (min(1.0, share * rate / f32), fixed * 1e6 / share)
print("[device.op_efficiency]  # the rank's measured rate / its share (1/2) of the f32 GEMM peak")
for op, (efficiency, _) in fits.items():
    print(f"{op} = {efficiency:.4f}")  # a fraction: at most 1
print("[device.op_call_us]  # a call's fixed time beyond its FLOPs at that rate, x 1/2 (the rank's share)")
for op, (_, us) in fits.items():
    print(f"{op} = {us:.2f}")
for group in json.load(open(f"{work}/kernels.json")).get("sync_lateness", []):
    print("[[device.sync_lateness]]  # how far a group's slowest rank trails its mean: share x interval")
    print(f"world = {group['world']}")
    print(f"ranks = {group['ranks']}")
    print("interval_us = [" + ", ".join(f"{t:.0f}" for t in group["interval_us"]) + "]")
    print("share = [" + ", ".join(f"{x:.4f}" for x in group["share"]) + "]")
print("[collectives]")
print('model = "measured"')
for group, np_, others in ((2, 2, ""), (2, 4, ""), (4, 4, ""), (2, 4, "_others")):
    rows = json.load(open(f"{work}/comm_{group}_{np_}{others}.json"))["results"]
    for op in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all"):
        pts = sorted((r["bytes"], r["min_time_us"]) for r in rows if r["op"] == op)
        if not pts:
            continue
        print("[[collectives.table]]")
        print(f'op = "{op}"')
        print(f"ranks = {group}")
        print(f"world = {np_}")
        if others:
            print("others_compute = true  # measured while the job's other ranks computed")
        print("bytes = [" + ", ".join(str(int(b)) for b, _ in pts) + "]")
        print("us = [" + ", ".join(f"{t:.2f}" for _, t in pts) + "]")
PY
echo "calibrate: wrote $out" >&2
cat "$out"
