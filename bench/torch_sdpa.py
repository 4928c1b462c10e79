#!/usr/bin/env python3
"""PyTorch's fused causal attention (SDPA on its flash backend) on one GPU,
for bench/gpu.sh: forward and backward TFLOP/s on bf16 [B, H, T, D] heads,
counting FLOPs as meshtrain's profile does (forward 2 B H T (T + 1) D,
backward twice that). Key/value heads are repeated to the query heads first
(as Hugging Face's SDPA path does), outside the timing.
Usage: torch_sdpa.py BATCH HEADS KV_HEADS SEQ HEAD_DIM"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed_ms(fn, repeats=10):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main():
    b, h, hkv, t, d = (int(a) for a in sys.argv[1:6])
    torch.manual_seed(0)
    q = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, hkv, t, d, device="cuda", dtype=torch.bfloat16).repeat_interleave(h // hkv, dim=1)
            .requires_grad_() for _ in range(2))
    grad = torch.randn_like(q)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        forward = timed_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        both = timed_ms(lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                                    (q, k, v), grad))
    flops = 2.0 * b * h * t * (t + 1) * d
    print(json.dumps({"side": "torch flash SDPA", "forward_ms": forward, "backward_ms": both - forward,
                      "forward_tflops": flops / forward / 1e9, "backward_tflops": 2 * flops / (both - forward) / 1e9}))
    del out


if __name__ == "__main__":
    main()
