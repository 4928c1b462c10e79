# Sourced by tests/golden/lower_golden_test.sh and scripts/update-goldens.sh:
# the golden's file and the `meshtrain lower` arguments that print it (a
# 1-layer Llama under FSDP 2 x TP 2, rank 0 of 4). The model's sizes are
# also the test's inputs for the collective counts and bytes it derives.
golden_file=tests/golden/lower_fsdp2_tp2_1layer_rank0.txt
golden_model=(--config configs/debug.toml --parallel.tp 2 --model.dim 16 --model.n_heads 4 --model.n_kv_heads 2
              --model.ffn_dim 32 --model.vocab_size 32 --data.batch_size 4 --data.seq_len 16)
golden_args=(lower --ranks 4 --rank 0 "${golden_model[@]}" --model.n_layers 1)
