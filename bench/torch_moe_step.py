#!/usr/bin/python3
"""PyTorch's time per training step of the MoE model of bench/moe_train.sh
(forward, backward, clipping, AdamW), as Hugging Face writes it: Llama
attention (PyTorch's scaled_dot_product_attention, causal, rotate-half RoPE)
and Mixtral's sparse block, MixtralSparseMoeBlock: a bias-free router, the
softmax in f32, top-k, the weights renormalised, and a loop over the experts
that each run their tokens (torch.where on the one-hot mask, index_add_
back). Weights as meshtrain initialises them (normal 0.02, norms 1).

Usage: torch_moe_step.py CONFIG_JSON THREADS STEPS MODE
  MODE: eager, or compile (torch.compile of the model; its compilation runs
  in the warm-up steps, which are not timed).
Prints one JSON line: the median of STEPS step times after 3 warm-up steps.
The caller sets OMP_NUM_THREADS to THREADS before the start."""
import json
import resource
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):  # transformers' LlamaRMSNorm
    def __init__(self, dim, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):  # transformers' LlamaAttention with SDPA
    def __init__(self, c):
        super().__init__()
        self.h, self.kv, self.hd = c["n_heads"], c["n_kv_heads"], c["dim"] // c["n_heads"]
        self.q_proj = nn.Linear(c["dim"], self.h * self.hd, bias=False)
        self.k_proj = nn.Linear(c["dim"], self.kv * self.hd, bias=False)
        self.v_proj = nn.Linear(c["dim"], self.kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.h * self.hd, c["dim"], bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.h != self.kv)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1))


class Expert(nn.Module):  # transformers' MixtralBlockSparseTop2MLP
    def __init__(self, dim, ffn):
        super().__init__()
        self.w1 = nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)
        self.w3 = nn.Linear(dim, ffn, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoeBlock(nn.Module):  # transformers' MixtralSparseMoeBlock
    def __init__(self, c):
        super().__init__()
        self.n_experts, self.top_k = c["n_experts"], c["n_experts_per_token"]
        self.gate = nn.Linear(c["dim"], self.n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(c["dim"], c["moe_ffn_dim"]) for _ in range(self.n_experts))

    def forward(self, hidden_states):
        B, T, D = hidden_states.shape
        hidden_states = hidden_states.view(-1, D)
        router_logits = self.gate(hidden_states)
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)
        routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(hidden_states.dtype)
        final = torch.zeros((B * T, D), dtype=hidden_states.dtype, device=hidden_states.device)
        expert_mask = F.one_hot(selected_experts, num_classes=self.n_experts).permute(2, 1, 0)
        for expert_idx in range(self.n_experts):
            idx, top_x = torch.where(expert_mask[expert_idx])
            current = hidden_states[None, top_x].reshape(-1, D)
            current = self.experts[expert_idx](current) * routing_weights[top_x, idx, None]
            final.index_add_(0, top_x, current.to(hidden_states.dtype))
        return final.view(B, T, D)


class Mlp(nn.Module):  # transformers' LlamaMLP
    def __init__(self, dim, ffn):
        super().__init__()
        self.gate_proj = nn.Linear(dim, ffn, bias=False)
        self.up_proj = nn.Linear(dim, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c, moe):
        super().__init__()
        self.input_layernorm = RMSNorm(c["dim"], c["norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["dim"], c["norm_eps"])
        self.mlp = SparseMoeBlock(c) if moe else Mlp(c["dim"], c["ffn_dim"])

    def forward(self, h, cos, sin):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["dim"])
        moe = c.get("n_experts", 0) > 0
        self.layers = nn.ModuleList(Layer(c, moe and i >= c.get("first_dense_layers", 0))
                                    for i in range(c["n_layers"]))
        self.norm = RMSNorm(c["dim"], c["norm_eps"])
        self.lm_head = nn.Linear(c["dim"], c["vocab_size"], bias=False)
        hd = c["dim"] // c["n_heads"]
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        emb = torch.outer(torch.arange(c["seq_len"], dtype=torch.float32), inv_freq).repeat(1, 2)
        self.register_buffer("cos", emb.cos()[None, None], persistent=False)
        self.register_buffer("sin", emb.sin()[None, None], persistent=False)

    def forward(self, tokens, targets):
        h = self.embed_tokens(tokens)
        for layer in self.layers:
            h = layer(h, self.cos, self.sin)
        logits = self.lm_head(self.norm(h))
        return F.cross_entropy(logits.view(-1, self.c["vocab_size"]), targets.reshape(-1))


def main():
    cfg = json.loads(sys.argv[1])
    threads, steps, mode = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    assert mode in ("eager", "compile"), mode
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Model(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    step_fn = torch.compile(model) if mode == "compile" else model
    B, T = cfg["batch_size"], cfg["seq_len"]
    data = torch.randint(0, cfg["vocab_size"], (B * T * (steps + 4) + 1,))
    times, losses = [], []
    for step in range(steps + 3):
        chunk = data[step * B * T: (step + 1) * B * T + 1]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = step_fn(chunk[:-1].view(B, T), chunk[1:].view(B, T))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    first = times[:3]
    times = sorted(times[3:])
    print(json.dumps({"median_step_s": times[len(times) // 2], "tokens_per_step": B * T, "threads": threads,
                      "mode": mode, "torch": torch.__version__, "warmup_s": sum(first),
                      "params": sum(p.numel() for p in model.parameters()), "last_loss": losses[-1],
                      "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


if __name__ == "__main__":
    main()
