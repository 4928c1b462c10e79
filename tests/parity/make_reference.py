#!/usr/bin/python3
"""Reference losses for meshtrain's parity test, computed with PyTorch.

Builds the Hugging Face Llama architecture in plain PyTorch (RMSNorm,
rotate-half RoPE, grouped-query attention, SwiGLU MLP, tied or untied
embeddings), initialises it with a seed, saves the initial weights as
safetensors (Llama names), and trains 20 steps on a byte-level text with
torch.optim.AdamW (weight decay), a warmup + cosine LambdaLR schedule and
gradient clipping, batching as llm.c's loader does. Writes, per case:
  data/parity/<case>.safetensors   initial weights
  data/parity/<case>.json          config and per-step loss, lr, grad norm
and data/parity/text.txt, the training text.

Run from the repository root with Debian's python3-torch:
  /usr/bin/python3 tests/parity/make_reference.py
"""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

OUT = "data/parity"
STEPS = 20

CASES = {
    "mha_untied": dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=4, ffn_dim=160, vocab_size=256,
                       norm_eps=1e-5, rope_theta=10000.0, tie_embeddings=False),
    "gqa_tied": dict(dim=64, n_layers=2, n_heads=8, n_kv_heads=2, ffn_dim=96, vocab_size=256,
                     norm_eps=1e-6, rope_theta=500000.0, tie_embeddings=True),
}
TRAIN = dict(seq_len=32, batch_size=4, lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
             warmup_steps=5, decay="cosine", min_lr_ratio=0.1, max_grad_norm=0.5, steps=STEPS)


def lr_at(step):  # 1-based, as meshtrain's TrainConfig::lr_at
    lr, warm, total, mn = TRAIN["lr"], TRAIN["warmup_steps"], TRAIN["steps"], TRAIN["min_lr_ratio"]
    if step <= warm:
        return lr * step / warm
    progress = (step - warm) / (total - warm)
    return lr * (mn + (1 - mn) * 0.5 * (1 + math.cos(math.pi * progress)))


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


def forward(params, c, tokens, targets):
    B, T = tokens.shape
    hd = c["dim"] // c["n_heads"]
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
    h = params["model.embed_tokens.weight"][tokens]
    mask = torch.full((T, T), float("-inf")).triu(1)
    rep = c["n_heads"] // c["n_kv_heads"]
    for i in range(c["n_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, params[p + "input_layernorm.weight"], c["norm_eps"])
        q = (x @ params[p + "self_attn.q_proj.weight"].T).view(B, T, c["n_heads"], hd)
        k = (x @ params[p + "self_attn.k_proj.weight"].T).view(B, T, c["n_kv_heads"], hd)
        v = (x @ params[p + "self_attn.v_proj.weight"].T).view(B, T, c["n_kv_heads"], hd)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, hd]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # transformers' repeat_kv
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, c["dim"])
        h = h + o @ params[p + "self_attn.o_proj.weight"].T
        y = rms_norm(h, params[p + "post_attention_layernorm.weight"], c["norm_eps"])
        act = F.silu(y @ params[p + "mlp.gate_proj.weight"].T) * (y @ params[p + "mlp.up_proj.weight"].T)
        h = h + act @ params[p + "mlp.down_proj.weight"].T
    h = rms_norm(h, params["model.norm.weight"], c["norm_eps"])
    head = params["model.embed_tokens.weight" if c["tie_embeddings"] else "lm_head.weight"]
    logits = h @ head.T
    return F.cross_entropy(logits.view(-1, c["vocab_size"]), targets.reshape(-1), ignore_index=-100)


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
    B, T = TRAIN["batch_size"], TRAIN["seq_len"]
    for name, c in CASES.items():
        torch.manual_seed(0)
        params = {}
        for pname, shape in param_shapes(c).items():
            t = torch.ones(shape) if "norm" in pname else torch.randn(shape) * 0.02
            params[pname] = t.requires_grad_()
        save_safetensors(f"{OUT}/{name}.safetensors", params)
        opt = torch.optim.AdamW(params.values(), lr=TRAIN["lr"], betas=(TRAIN["beta1"], TRAIN["beta2"]),
                                eps=TRAIN["eps"], weight_decay=TRAIN["weight_decay"])
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: lr_at(e + 1) / TRAIN["lr"])
        cursor, record = 0, []
        for step in range(1, STEPS + 1):
            chunk = data[cursor:cursor + B * T + 1]
            tokens, targets = chunk[:-1].view(B, T), chunk[1:].view(B, T)
            cursor += B * T
            if cursor + B * T + 1 > len(data):
                cursor = 0
            lr = opt.param_groups[0]["lr"]
            opt.zero_grad()
            loss = forward(params, c, tokens, targets)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params.values(), TRAIN["max_grad_norm"])
            opt.step()
            sched.step()
            record.append({"step": step, "loss": loss.item(), "lr": lr, "grad_norm": norm.item()})
        assert any(r["grad_norm"] > TRAIN["max_grad_norm"] for r in record), "clipping never active"
        with open(f"{OUT}/{name}.json", "w") as f:
            json.dump({"torch_version": torch.__version__, "model": c, "train": TRAIN, "steps": record}, f, indent=1)
        print(name, " ".join(f"{r['loss']:.4f}" for r in record))


if __name__ == "__main__":
    main()
