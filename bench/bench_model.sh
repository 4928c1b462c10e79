# Sourced by the training benchmarks: the benchmark model (Llama dim 256,
# 4 layers, 8 heads, vocab 256, seq 256, batch 8) and one timed meshtrain run.
# The MoE variant's block, every layer's MLP (bench/moe_train.sh's default,
# bench/moe_dp.sh's, calibrate.sh's grouped GEMMs): Mixtral's, 8 experts, top-2.
bench_moe=(--model.n_experts 8 --model.n_experts_per_token 2 --model.moe_ffn_dim 256)
bench_model='{"dim":256,"n_layers":4,"n_heads":8,"n_kv_heads":8,"ffn_dim":768,"vocab_size":256,"norm_eps":1e-5,"rope_theta":10000.0,"tie_embeddings":false,"seq_len":256,"batch_size":8}'

# mpirun's flags that bind each rank to a core, in turn (two to a core where
# ranks outnumber cores): unbound, the kernel moves ranks between cores at
# will, and a plan's step moved by up to +-30% from run to run.
bind_ranks=(--bind-to core:overload-allowed --map-by core)

# bench_text FILE: 200 kB of random lowercase text to train on.
bench_text() {
  head -c 400000 /dev/urandom | tr -dc 'a-z ' | head -c 200000 > "$1" || true
}

# bench_meshtrain BINARY THREADS STEPS DTYPE TEXT WORKDIR: trains STEPS + 3
# steps of the benchmark model; prints the median step time in seconds of the
# last STEPS and leaves the peak RSS (KiB) in WORKDIR/rss and the metrics in
# WORKDIR/m.jsonl.
bench_meshtrain() {
  local binary=$1 threads=$2 steps=$3 dtype=$4 text=$5 work=$6
  OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads /usr/bin/time -f %M -o "$work/rss" "$binary" train \
    --config configs/debug.toml --model.n_layers 4 --model.n_heads 8 --model.n_kv_heads 8 --data.seq_len 256 \
    --data.batch_size 8 --data.path "$text" --training.steps $((steps + 3)) --checkpoint.folder "" \
    --metrics.file "$work/m.jsonl" --metrics.log_every 1 --training.dtype "$dtype" > "$work/meshtrain.log"
  tail -n "$steps" "$work/m.jsonl" |
    python3 -c 'import sys,json; t=sorted(json.loads(l)["step_ms"] for l in sys.stdin); print(t[len(t)//2]/1000)'
}

# bench_profile NAME WORKDIR: the hardware profile to estimate with. NAME is a
# built-in profile or a file, or `here`: this host calibrated now
# (bench/calibrate.sh, about 2 minutes) into WORKDIR/here.toml, as a VM can
# move between hosts of different speeds. Prints what to pass to --hardware.
bench_profile() {
  local name=$1 work=$2
  if [ "$name" != here ]; then echo "$name"; return; fi
  bench/calibrate.sh "$work/here.toml" here > /dev/null || return 1
  grep -A3 '^\[device\]' "$work/here.toml" | sed 's/^/calibrated: /' >&2
  echo "$work/here.toml"
}
