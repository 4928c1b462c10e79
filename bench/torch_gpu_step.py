#!/usr/bin/env python3
"""PyTorch's training step on one GPU for bench/gpu.sh: Hugging Face's
LlamaForCausalLM of the same shape as meshtrain's model, f32 weights with
bf16 autocast (as meshtrain's bf16 mode), SDPA attention (flash on an H100),
clipping, fused AdamW; eager or torch.compile. Prints one JSON line: median
step time over the steps after the warm-up, tokens per step, peak memory.
Usage: torch_gpu_step.py MODEL_JSON BATCH STEPS eager|compile"""
import json
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    m = json.loads(sys.argv[1])
    batch, steps, mode = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=m["dim"], intermediate_size=m["ffn_dim"], num_hidden_layers=m["n_layers"],
                      num_attention_heads=m["n_heads"], num_key_value_heads=m["n_kv_heads"],
                      vocab_size=m["vocab_size"], rope_theta=m["rope_theta"], rms_norm_eps=m["norm_eps"],
                      tie_word_embeddings=m["tie_embeddings"], max_position_embeddings=m["seq_len"],
                      attn_implementation="sdpa")
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    run = torch.compile(model) if mode == "compile" else model
    tokens = torch.randint(0, 256, (batch, m["seq_len"]), device="cuda")
    warmup, times = 3, []
    for _ in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = run(input_ids=tokens, labels=tokens).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times = sorted(times[warmup:])
    print(json.dumps({"side": f"torch {mode}", "median_step_s": times[len(times) // 2],
                      "tokens_per_step": batch * m["seq_len"], "peak_bytes": torch.cuda.max_memory_allocated(),
                      "torch": torch.__version__, "loss": loss.item()}))


if __name__ == "__main__":
    main()
