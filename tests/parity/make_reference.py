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
bf16 logits; gradient norm, clipping and AdamW in f32); moe (f32, the whole
batch at once): a Mixtral-shaped mixture of experts. Its layers below
model.first_dense_layers keep the dense MLP (mlp.*); the others have Hugging
Face Mixtral's sparse block, under its on-disk names
model.layers.{i}.block_sparse_moe.*: a bias-free router gate.weight [E, dim],
softmax of its logits in f32, top-k (k = model.n_experts_per_token; ties to
the lower expert, as meshtrain breaks them, by a stable sort: torch.topk,
which transformers uses, leaves them unspecified and on CPU does not pick the
lower; on floats from training ties practically never happen, and moe's seed
keeps every token's top-k 4.4e-6 or more from one), the k weights
renormalised to sum to 1; experts
experts.{e}.w1/w3/w2.weight (gate, up, down SwiGLU of model.moe_ffn_dim),
computed as Hugging Face does (a loop over the experts, index_select of the
tokens routed to each, index_add of the weighted outputs; every expert runs,
so one no token chose gets a zero gradient and AdamW still steps it); plus
DeepSeek's shared experts, shared_experts.w1/w3/w2.weight, one SwiGLU of
model.n_shared_experts x moe_ffn_dim added unweighted. The loss optimised is
the mean cross-entropy + model.router_aux_loss_coef x Hugging Face's
load_balancing_loss_func over every MoE layer's router logits (all B x T
tokens, no mask). Its JSON's steps also hold ce_loss, aux_loss and, per MoE
layer, tokens_per_expert (each expert's count of the B x T x k slots) and
router_margin (the least gap between a token's k-th and (k+1)-th router
probability: how far the routing is from a tie). The block and the aux loss
are checked against transformers' own code by check_moe_reference.py.

Run from the repository root, with PyTorch (2.5 or later) from PyPI in a
virtual environment; the JSON records the version and the CPU capability
PyTorch's kernels ran with (bf16 figures depend slightly on them):
  python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch numpy
  /tmp/torchenv/bin/python tests/parity/make_reference.py [CASE ...]
(the CPU-only build, `--index-url https://download.pytorch.org/whl/cpu`, is
smaller). Named cases are made alone (e.g. `make_reference.py moe`), leaving
the other cases' files as they are; with none, every case. Nothing else needs
PyTorch: the tests read the committed files.
"""
import argparse
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
    "moe": (dict(dim=64, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=256, norm_eps=1e-5,
                 rope_theta=10000.0, tie_embeddings=False, n_experts=8, n_experts_per_token=2, moe_ffn_dim=32,
                 first_dense_layers=1, n_shared_experts=1, router_aux_loss_coef=0.01), TRAIN),
}
# torch.manual_seed per case (default 0). moe's: of seeds 0-63 the one whose 20 steps keep every token's k-th and
# (k+1)-th router probabilities furthest apart (4.4e-6 at the closest; seed 0 comes within 1.5e-8, 2 ulps, at step 20,
# where a float64 run routes one token differently), so that a faithful f32 implementation routes as PyTorch does.
SEEDS = {"moe": 51}
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


def is_moe_layer(c, i):
    return c.get("n_experts", 0) > 0 and i >= c.get("first_dense_layers", 0)


def param_shapes(c):
    d, kv = c["dim"], c["n_kv_heads"] * (c["dim"] // c["n_heads"])
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], d), "model.norm.weight": (d,)}
    for i in range(c["n_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                       p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (kv, d),
                       p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, d)})
        if not is_moe_layer(c, i):
            shapes.update({p + "mlp.gate_proj.weight": (c["ffn_dim"], d), p + "mlp.up_proj.weight": (c["ffn_dim"], d),
                           p + "mlp.down_proj.weight": (d, c["ffn_dim"])})
            continue
        p, f = p + "block_sparse_moe.", c["moe_ffn_dim"]  # Hugging Face Mixtral's on-disk names
        shapes[p + "gate.weight"] = (c["n_experts"], d)
        for e in range(c["n_experts"]):
            shapes.update({p + f"experts.{e}.w1.weight": (f, d), p + f"experts.{e}.w3.weight": (f, d),
                           p + f"experts.{e}.w2.weight": (d, f)})
        if c.get("n_shared_experts", 0) > 0:
            fs = c["n_shared_experts"] * f
            shapes.update({p + "shared_experts.w1.weight": (fs, d), p + "shared_experts.w3.weight": (fs, d),
                           p + "shared_experts.w2.weight": (d, fs)})
    if not c["tie_embeddings"]:
        shapes["lm_head.weight"] = (c["vocab_size"], d)
    return shapes


def rms_norm(x, w, eps):  # transformers' LlamaRMSNorm
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def swiglu(x, w1, w3, w2):  # w1 gate, w3 up, w2 down (Mixtral's expert MLP)
    return (F.silu(x @ w1.T) * (x @ w3.T)) @ w2.T


def topk(probs, k):
    """torch.topk(probs, k) (the k largest, largest first) but with ties to the lower expert index, meshtrain's rule: a
    stable descending sort. torch.topk leaves ties unspecified (on CPU it does not pick the lower index: among 8
    equal values it gives experts 6 and 5; check_moe_reference.py shows it); without a tie the two agree exactly."""
    values, indices = torch.sort(probs, dim=-1, descending=True, stable=True)
    return values[..., :k], indices[..., :k]


def moe_router(x, gate, k):
    """Hugging Face Mixtral's router on x [N, D]: the logits [N, E] (x @ gate^T, no bias), softmax over the experts
    in float32, the top k of the probabilities (ties to the lower expert), the chosen weights renormalised to sum to 1
    and cast back to x's dtype. Returns (logits, weights [N, k], experts [N, k])."""
    logits = x @ gate.T
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, experts = topk(probs, k)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return logits, weights.to(x.dtype), experts


def moe_routed(x, weights, experts, w1, w3, w2):
    """Mixtral's routed sum, as Hugging Face computes it: a loop over the experts, each taking the tokens routed to it
    (index_select), its SwiGLU output scaled by the token's routing weight and index_added into the output. Every
    expert runs, on no tokens if none chose it, so each has a gradient (zero then) and AdamW steps all of them, as
    meshtrain does. w1, w3, w2: lists of the experts' weights."""
    out = torch.zeros_like(x)
    mask = F.one_hot(experts, len(w1)).permute(2, 1, 0)  # [E, k, N]
    for e in range(len(w1)):
        slot, token = torch.where(mask[e])
        y = swiglu(x.index_select(0, token), w1[e], w3[e], w2[e]) * weights[token, slot, None]
        out = out.index_add(0, token, y.to(x.dtype))
    return out


def moe_block(x, w, c):
    """The sparse block on x [N, D], w(name) giving the block's weights by their names under block_sparse_moe.: the
    routed sum plus the shared experts' SwiGLU (DeepSeek's, unweighted). Returns (output, router logits, tokens per
    expert: each expert's count of the N x k slots)."""
    E = c["n_experts"]
    logits, weights, experts = moe_router(x, w("gate.weight"), c["n_experts_per_token"])
    w1, w3, w2 = ([w(f"experts.{e}.{m}.weight") for e in range(E)] for m in ("w1", "w3", "w2"))
    out = moe_routed(x, weights, experts, w1, w3, w2)
    if c.get("n_shared_experts", 0) > 0:
        out = out + swiglu(x, *(w(f"shared_experts.{m}.weight") for m in ("w1", "w3", "w2")))
    return out, logits, torch.bincount(experts.reshape(-1), minlength=E)


def load_balancing_loss(gate_logits, n_experts, k):
    """Hugging Face's load_balancing_loss_func (Switch Transformer's) with no attention mask, in its classic form:
    every MoE layer's router logits concatenated [L x N, E], softmax, the top-k one-hot mask [L x N, k, E];
    tokens_per_expert the mask's mean over the rows [k, E], router_prob_per_expert the probabilities' mean [E];
    sum(tokens_per_expert x router_prob_per_expert) x n_experts. The gradient flows through the probabilities. (Its
    top-k is topk's, ties to the lower expert, where transformers' torch.topk may pick another.)"""
    probs = torch.softmax(torch.cat(gate_logits, dim=0), dim=-1)
    _, selected = topk(probs, k)
    tokens_per_expert = F.one_hot(selected, n_experts).float().mean(dim=0)
    router_prob_per_expert = probs.mean(dim=0)
    return (tokens_per_expert * router_prob_per_expert.unsqueeze(0)).sum() * n_experts


def forward(params, c, tokens, targets, compute=torch.float32):
    """The loss to optimise and a dict of what else the step records. Dense: the mean cross-entropy over the batch
    (and {}). MoE: the cross-entropy + router_aux_loss_coef x the load-balancing loss over every MoE layer and all B x T
    tokens (and ce_loss, aux_loss, and per MoE layer tokens_per_expert and router_margin). In f32 every cast below is
    the identity."""
    B, T = tokens.shape
    moe = c.get("n_experts", 0) > 0
    assert not moe or compute == torch.float32, "the MoE reference is f32 only"
    gate_logits, counts, margins = [], {}, {}
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
        if is_moe_layer(c, i):
            out, layer_logits, counts[str(i)] = moe_block(y.reshape(B * T, c["dim"]),
                                                          lambda n: use(p + "block_sparse_moe." + n), c)
            gate_logits.append(layer_logits)
            top = torch.topk(torch.softmax(layer_logits.detach(), dim=-1), c["n_experts_per_token"] + 1, dim=-1).values
            margins[str(i)] = (top[:, -2] - top[:, -1]).min().item()
            h = h + out.view(B, T, c["dim"])
            continue
        gate, up = y @ use(p + "mlp.gate_proj.weight").T, y @ use(p + "mlp.up_proj.weight").T
        act = fused(lambda g, u: F.silu(g) * u, gate, up)
        h = h + act @ use(p + "mlp.down_proj.weight").T
    h = fused(lambda a, w: rms_norm(a, w, c["norm_eps"]), h, use("model.norm.weight"))
    logits = h @ use("model.embed_tokens.weight" if c["tie_embeddings"] else "lm_head.weight").T
    ce = F.cross_entropy(logits.float().view(-1, c["vocab_size"]), targets.reshape(-1), ignore_index=-100)
    if not moe:
        return ce, {}
    aux = load_balancing_loss(gate_logits, c["n_experts"], c["n_experts_per_token"])
    return ce + c.get("router_aux_loss_coef", 0.0) * aux, {
        "ce_loss": ce.item(), "aux_loss": aux.item(), "tokens_per_expert": {i: n.tolist() for i, n in counts.items()},
        "router_margin": margins}


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


def init_params(c, seed):
    """normal(0, 0.02) weights, ones for the norms, drawn in param_shapes' order after torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    params = {}
    for pname, shape in param_shapes(c).items():
        w = torch.ones(shape) if "norm" in pname else torch.randn(shape) * 0.02
        params[pname] = w.requires_grad_()
    return params


def train(c, t, data, params):
    """t["steps"] steps from params (trained in place) on data, llm.c's batches; returns the per-step records."""
    B, T = t["batch_size"], t["seq_len"]
    accum, compute = t.get("grad_accum_steps", 1), DTYPES[t.get("dtype", "float32")]
    opt = torch.optim.AdamW(params.values(), lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"],
                            weight_decay=t["weight_decay"])
    sched = make_scheduler(opt, t)
    assert c.get("n_experts", 0) == 0 or accum == 1, "the MoE reference takes the whole batch at once"
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
            part, extra = forward(params, c, tokens[m * mb:(m + 1) * mb], targets[m * mb:(m + 1) * mb], compute)
            part = part / accum if accum > 1 else part
            part.backward()
            loss = loss + part.detach()
        assert all(p.grad is not None for p in params.values())
        norm = torch.nn.utils.clip_grad_norm_(params.values(), t["max_grad_norm"])
        opt.step()
        sched.step()
        r = {"step": step, "loss": loss.item()}
        r.update({k: extra[k] for k in ("ce_loss", "aux_loss") if k in extra})
        r.update({"lr": lr, "grad_norm": norm.item()})
        r.update({k: extra[k] for k in ("tokens_per_expert", "router_margin") if k in extra})
        record.append(r)
    return record


def main():
    ap = argparse.ArgumentParser(description="Make data/parity's PyTorch references.")
    ap.add_argument("cases", nargs="*", metavar="CASE", help=f"the cases to make (default: all): {', '.join(CASES)}")
    chosen = ap.parse_args().cases or list(CASES)
    for name in chosen:
        if name not in CASES:
            ap.error(f"no case {name!r}; the cases: {', '.join(CASES)}")
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    with open("data/corpus.txt", "rb") as f:
        text = f.read()[:12000]
    with open(f"{OUT}/text.txt", "wb") as f:
        f.write(text)
    data = torch.tensor(list(text), dtype=torch.long)
    for name in chosen:
        c, t = CASES[name]
        params = init_params(c, SEEDS.get(name, 0))
        save_safetensors(f"{OUT}/{name}.safetensors", params)
        record = train(c, t, data, params)
        assert any(r["grad_norm"] > t["max_grad_norm"] for r in record), "clipping never active"
        with open(f"{OUT}/{name}.json", "w") as f:
            head = {"torch_version": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}
            head.update({"seed": SEEDS[name]} if name in SEEDS else {})
            json.dump(dict(head, model=c, train=t, steps=record), f, indent=1)
        print(name, " ".join(f"{r['loss']:.4f}" for r in record))


if __name__ == "__main__":
    main()
