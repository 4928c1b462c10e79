#!/usr/bin/python3
"""Reference runs for meshtrain's parity tests, computed with PyTorch.

Builds the Hugging Face Llama architecture in plain PyTorch (RMSNorm,
rotate-half RoPE, grouped-query attention, SwiGLU MLP, tied or untied
embeddings), initialises it with a seed, saves the initial weights as
safetensors (Llama names), and trains 20 steps on a byte-level text with
torch.optim.AdamW (weight decay), PyTorch's own learning-rate schedulers
(LinearLR warmup then CosineAnnealingLR down to min_lr_ratio x lr, chained by
SequentialLR) and torch.nn.utils.clip_grad_norm_, batching as llm.c's loader
does. Writes, per case:
  data/parity/<case>.safetensors   initial weights
  data/parity/<case>.json          config and per-step loss, lr, grad norm
and data/parity/text.txt, the training text.

The cases: mha_untied and gqa_tied (f32, the whole batch at once);
accum (f32, the batch in train.grad_accum_steps microbatches, each one's
mean loss divided by their number and backpropagated, the gradients summed);
bf16 (train.dtype bfloat16, as meshtrain computes it: f32 master weights cast
to bf16 at each use, so a weight used twice, as the tied embedding, gets each
use's gradient summed in f32; every activation and activation gradient in
bf16; matmuls as PyTorch's bf16 GEMMs (f32 accumulation, rounded once),
attention as PyTorch's bf16 scaled_dot_product_attention; each other op
(embedding, RMSNorm, RoPE, SwiGLU) computed in f32 from its bf16 inputs and
rounded to bf16 once, forward and backward; the cross-entropy in f32 on the
bf16 logits; gradient norm, clipping and AdamW in f32).

Run from the repository root, with PyTorch (2.5 or later) from PyPI in a
virtual environment; the JSON records the version and the CPU capability
PyTorch's kernels ran with (bf16 figures depend slightly on them):
  python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch numpy
  /tmp/torchenv/bin/python tests/parity/make_reference.py
(the CPU-only build, `--index-url https://download.pytorch.org/whl/cpu`, is
smaller). Nothing else needs PyTorch: the tests read the committed files.
"""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

OUT = "data/parity"
STEPS = 20

MHA = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=4, ffn_dim=160, vocab_size=256, norm_eps=1e-5,
           rope_theta=10000.0, tie_embeddings=False)
GQA = dict(dim=64, n_layers=2, n_heads=8, n_kv_heads=2, ffn_dim=96, vocab_size=256, norm_eps=1e-6,
           rope_theta=500000.0, tie_embeddings=True)
TRAIN = dict(seq_len=32, batch_size=4, lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
             warmup_steps=5, decay="cosine", min_lr_ratio=0.1, max_grad_norm=0.5, steps=STEPS)
CASES = {
    "mha_untied": (MHA, TRAIN),
    "gqa_tied": (GQA, TRAIN),
    "accum": (dict(MHA, n_kv_heads=2, ffn_dim=128), dict(TRAIN, batch_size=8, grad_accum_steps=2)),
    "bf16": (dict(MHA, tie_embeddings=True), dict(TRAIN, dtype="bfloat16")),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def make_scheduler(opt, t):
    """meshtrain's schedule from PyTorch's schedulers: at step s (1-based) lr x s / warmup_steps up to
    s = warmup_steps, then cosine from lr down to min_lr_ratio x lr at s = steps. Scheduler epoch e is step e + 1:
    LinearLR's factors 1/w, 2/w, ... for epochs 0 .. w - 2, CosineAnnealingLR's epochs 0 .. steps - w from
    epoch w - 1 (step w, the peak) on."""
    assert t["decay"] == "cosine"
    w = t["warmup_steps"]
    warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1 / w, end_factor=1.0, total_iters=w - 1)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=t["steps"] - w,
                                                        eta_min=t["lr"] * t["min_lr_ratio"])
    return torch.optim.lr_scheduler.SequentialLR(opt, [warmup, cosine], milestones=[w - 1])


def param_shapes(c):
    d, kv = c["dim"], c["n_kv_heads"] * (c["dim"] // c["n_heads"])
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], d), "model.norm.weight": (d,)}
    for i in range(c["n_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                       p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (kv, d),
                       p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, d),
                       p + "mlp.gate_proj.weight": (c["ffn_dim"], d), p + "mlp.up_proj.weight": (c["ffn_dim"], d),
                       p + "mlp.down_proj.weight": (d, c["ffn_dim"])})
    if not c["tie_embeddings"]:
        shapes["lm_head.weight"] = (c["vocab_size"], d)
    return shapes


def rms_norm(x, w, eps):  # transformers' LlamaRMSNorm
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward(params, c, tokens, targets, compute=torch.float32):
    """The mean cross-entropy over the batch. In f32 every cast below is the identity."""
    B, T = tokens.shape
    hd = c["dim"] // c["n_heads"]
    low = compute != torch.float32

    def use(name):  # a weight as the compute sees it: a fresh cast per use
        return params[name].to(compute)

    def fused(fn, *xs):  # one of meshtrain's ops: in f32 on its inputs, the result rounded once
        return fn(*(x.float() for x in xs)).to(compute)

    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]

    def rope(x):
        return x * cos + rotate_half(x) * sin

    h = fused(lambda table: table[tokens], use("model.embed_tokens.weight"))
    mask = torch.full((T, T), float("-inf")).triu(1)
    rep = c["n_heads"] // c["n_kv_heads"]
    for i in range(c["n_layers"]):
        p = f"model.layers.{i}."
        x = fused(lambda a, w: rms_norm(a, w, c["norm_eps"]), h, use(p + "input_layernorm.weight"))
        q = (x @ use(p + "self_attn.q_proj.weight").T).view(B, T, c["n_heads"], hd)
        k = (x @ use(p + "self_attn.k_proj.weight").T).view(B, T, c["n_kv_heads"], hd)
        v = (x @ use(p + "self_attn.v_proj.weight").T).view(B, T, c["n_kv_heads"], hd)
        q, k = fused(rope, q), fused(rope, k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, hd]
        if low:  # PyTorch's attention kernel on the bf16 q, k, v (grouped-query heads inside it)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=rep > 1)
        else:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # transformers' repeat_kv
            o = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1) @ v
        o = o.transpose(1, 2).reshape(B, T, c["dim"])
        h = h + o @ use(p + "self_attn.o_proj.weight").T
        y = fused(lambda a, w: rms_norm(a, w, c["norm_eps"]), h, use(p + "post_attention_layernorm.weight"))
        gate, up = y @ use(p + "mlp.gate_proj.weight").T, y @ use(p + "mlp.up_proj.weight").T
        act = fused(lambda g, u: F.silu(g) * u, gate, up)
        h = h + act @ use(p + "mlp.down_proj.weight").T
    h = fused(lambda a, w: rms_norm(a, w, c["norm_eps"]), h, use("model.norm.weight"))
    logits = h @ use("model.embed_tokens.weight" if c["tie_embeddings"] else "lm_head.weight").T
    return F.cross_entropy(logits.float().view(-1, c["vocab_size"]), targets.reshape(-1), ignore_index=-100)


def save_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        data = tensors[name].detach().contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    with open("data/corpus.txt", "rb") as f:
        text = f.read()[:12000]
    with open(f"{OUT}/text.txt", "wb") as f:
        f.write(text)
    data = torch.tensor(list(text), dtype=torch.long)
    for name, (c, t) in CASES.items():
        B, T = t["batch_size"], t["seq_len"]
        accum, compute = t.get("grad_accum_steps", 1), DTYPES[t.get("dtype", "float32")]
        torch.manual_seed(0)
        params = {}
        for pname, shape in param_shapes(c).items():
            w = torch.ones(shape) if "norm" in pname else torch.randn(shape) * 0.02
            params[pname] = w.requires_grad_()
        save_safetensors(f"{OUT}/{name}.safetensors", params)
        opt = torch.optim.AdamW(params.values(), lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"],
                                weight_decay=t["weight_decay"])
        sched = make_scheduler(opt, t)
        cursor, record = 0, []
        for step in range(1, t["steps"] + 1):
            chunk = data[cursor:cursor + B * T + 1]
            tokens, targets = chunk[:-1].view(B, T), chunk[1:].view(B, T)
            cursor += B * T
            if cursor + B * T + 1 > len(data):
                cursor = 0
            lr = opt.param_groups[0]["lr"]
            opt.zero_grad()
            loss, mb = 0.0, B // accum
            for m in range(accum):  # microbatches: each one's mean loss / accum, gradients summed
                part = forward(params, c, tokens[m * mb:(m + 1) * mb], targets[m * mb:(m + 1) * mb], compute)
                part = part / accum if accum > 1 else part
                part.backward()
                loss = loss + part.detach()
            norm = torch.nn.utils.clip_grad_norm_(params.values(), t["max_grad_norm"])
            opt.step()
            sched.step()
            record.append({"step": step, "loss": loss.item(), "lr": lr, "grad_norm": norm.item()})
        assert any(r["grad_norm"] > t["max_grad_norm"] for r in record), "clipping never active"
        with open(f"{OUT}/{name}.json", "w") as f:
            json.dump({"torch_version": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                       "model": c, "train": t, "steps": record}, f, indent=1)
        print(name, " ".join(f"{r['loss']:.4f}" for r in record))


if __name__ == "__main__":
    main()
