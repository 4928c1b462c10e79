#!/usr/bin/python3
"""Checks make_reference.py's mixture-of-experts code against Hugging Face transformers' own.

make_reference.py writes the Mixtral block (router, top-k, experts, the load-balancing loss) in plain PyTorch; this
script builds transformers' implementation with the same weights and compares, in float32:
  1. the sparse block: make_reference's router logits and routed output (moe_router + moe_routed, no shared experts:
     Mixtral has none) against transformers' Mixtral sparse block (MixtralSparseMoeBlock; transformers 5 stores the
     experts fused, gate_up_proj [E, 2F, D] = w1 over w3 and down_proj [E, D, F] = w2, older versions per expert as
     w1/w3/w2), on data/parity/moe.safetensors' layers and on a router scaled up so that routing is peaked;
     max abs difference < 1e-6;
  2. the aux loss: load_balancing_loss against transformers' load_balancing_loss_func, value (relative < 1e-6) and
     gradient with respect to the router logits (max abs < 1e-6);
  3. the whole model: make_reference.forward on the moe case with every layer sparse and no shared experts (Mixtral
     itself) against MixtralForCausalLM (eager attention and experts, output_router_logits, labels shifted as
     transformers does, so on 31 of the 32 positions): loss = cross-entropy + coef x aux (relative < 1e-6), the aux
     loss, and every parameter's gradient (max abs difference over the largest gradient < 1e-5), the per-expert names
     mapped to the fused ones;
  4. ties in top-k: on exact ties in the router probabilities make_reference.topk picks the lower expert index
     (meshtrain's rule), and prints which experts torch.topk (transformers' choice) picks: on CPU not always the
     lower ones, so the two differ only on exact ties; without ties they agree exactly (4096 random rows).

Run from the repository root with the reference's virtual environment plus transformers (not otherwise needed):
  /tmp/torchenv/bin/pip install transformers safetensors
  /tmp/torchenv/bin/python tests/parity/check_moe_reference.py
It prints each figure and exits non-zero if one is out of bounds. Measured with torch 2.15.0 on transformers 5.24.0:
1-3 all 0 except the aux loss of peaked logits (1.2e-7 relative: transformers 5 sums top-k counts with histc, not the
mean of the one-hot mask) and the model's gradients (6.4e-8 of the largest); on transformers 4.57.6 (per-expert
modules, the classic load_balancing_loss_func) every figure is 0.
"""
import os
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file
from transformers import MixtralConfig
from transformers.models.mixtral import modeling_mixtral as hf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_reference as ref  # noqa: E402

torch.set_num_threads(1)
C = ref.CASES["moe"][0]
E, K, D, FF = C["n_experts"], C["n_experts_per_token"], C["dim"], C["moe_ffn_dim"]
failures = []


def check(what, value, bound):
    ok = value < bound
    print(f"  {what}: {value:.3e} (bound {bound:g}){'' if ok else '  FAIL'}")
    if not ok:
        failures.append(what)


def hf_config(**over):
    kw = dict(vocab_size=C["vocab_size"], hidden_size=D, intermediate_size=FF, num_hidden_layers=C["n_layers"],
              num_attention_heads=C["n_heads"], num_key_value_heads=C["n_kv_heads"], rms_norm_eps=C["norm_eps"],
              num_local_experts=E, num_experts_per_tok=K, router_aux_loss_coef=C["router_aux_loss_coef"],
              output_router_logits=True, tie_word_embeddings=C["tie_embeddings"], router_jitter_noise=0.0,
              **({"rope_parameters": {"rope_type": "default", "rope_theta": C["rope_theta"]}}
                 if int(transformers.__version__.split(".")[0]) >= 5 else {"rope_theta": C["rope_theta"]}))
    kw.update(over)
    cfg = MixtralConfig(**kw)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"  # the loop over experts, not a grouped GEMM kernel
    return cfg


def load_block(block, w):
    """Copies per-expert weights w(name) (Mixtral's on-disk names under block_sparse_moe.) into transformers' block."""
    with torch.no_grad():
        block.gate.weight.copy_(w("gate.weight"))
        experts = block.experts
        if hasattr(experts, "gate_up_proj"):  # transformers 5: fused [E, 2F, D] (gate rows, then up) and [E, D, F]
            experts.gate_up_proj.copy_(torch.stack([torch.cat([w(f"experts.{e}.w1.weight"),
                                                               w(f"experts.{e}.w3.weight")]) for e in range(E)]))
            experts.down_proj.copy_(torch.stack([w(f"experts.{e}.w2.weight") for e in range(E)]))
        else:  # transformers 4: a ModuleList of MixtralBlockSparseTop2MLP
            for e in range(E):
                for m in ("w1", "w2", "w3"):
                    getattr(experts[e], m).weight.copy_(w(f"experts.{e}.{m}.weight"))


def hf_router_logits(block, x):
    out = block.gate(x)
    return out[0] if isinstance(out, tuple) else out


print(f"torch {torch.__version__}, transformers {transformers.__version__}, sparse block "
      f"{hf.MixtralSparseMoeBlock.__name__}")

# 1. The sparse block.
print("1. sparse block vs transformers' MixtralSparseMoeBlock (float32):")
weights = load_file("data/parity/moe.safetensors")
gen = torch.Generator().manual_seed(1)
x = torch.randn(4, 32, D, generator=gen)  # B x T tokens of unit scale, as after the RMSNorm
for layer in (i for i in range(C["n_layers"]) if ref.is_moe_layer(C, i)):
    for scale in (1.0, 50.0):  # as initialised (routing near uniform), and a router 50x larger (peaked)
        def w(name, layer=layer, scale=scale):
            t = weights[f"model.layers.{layer}.block_sparse_moe.{name}"]
            return t * scale if name == "gate.weight" else t
        block = hf.MixtralSparseMoeBlock(hf_config()).eval()
        load_block(block, w)
        with torch.no_grad():
            theirs = block(x)
            theirs = (theirs[0] if isinstance(theirs, tuple) else theirs).reshape(-1, D)  # 4.x: (out, logits)
            their_logits = hf_router_logits(block, x.reshape(-1, D))
            flat = x.reshape(-1, D)
            logits, rw, experts = ref.moe_router(flat, w("gate.weight"), K)
            ours = ref.moe_routed(flat, rw, experts, *([w(f"experts.{e}.{m}.weight") for e in range(E)]
                                                       for m in ("w1", "w3", "w2")))
        counts = torch.bincount(experts.reshape(-1), minlength=E).tolist()
        print(f" layer {layer}, router x{scale:g} (tokens per expert {counts}, output max |{theirs.abs().max():.3g}|):")
        check("router logits max abs diff", (logits - their_logits).abs().max().item(), 1e-6)
        check("routed output max abs diff", (ours - theirs).abs().max().item(), 1e-6)

# 2. The aux loss.
print("2. load_balancing_loss vs transformers' load_balancing_loss_func (float32):")
for scale in (1.0, 5.0):
    layers = [(torch.randn(128, E, generator=gen) * scale).requires_grad_() for _ in range(2)]
    ours = ref.load_balancing_loss(layers, E, K)
    g_ours = torch.autograd.grad(ours, layers)
    theirs = hf.load_balancing_loss_func(tuple(layers), E, K)
    g_theirs = torch.autograd.grad(theirs, layers)
    print(f" 2 layers x 128 tokens, logits x{scale:g}: ours {ours.item():.9g}, transformers' {theirs.item():.9g}")
    check("aux loss relative diff", abs(ours.item() - theirs.item()) / abs(theirs.item()), 1e-6)
    check("aux gradient max abs diff", max((a - b).abs().max().item() for a, b in zip(g_ours, g_theirs)), 1e-6)

# 3. The whole model, Mixtral-shaped: every layer sparse, no shared experts.
print("3. make_reference.forward vs transformers' MixtralForCausalLM (every layer sparse, no shared experts):")
c = dict(C, first_dense_layers=0, n_shared_experts=0)
params = ref.init_params(c, 0)
with torch.no_grad():  # a larger router, so that routing is far from uniform
    for name, p in params.items():
        if name.endswith("gate.weight"):
            p.mul_(25)
text = open("data/parity/text.txt", "rb").read()
inputs = torch.tensor(list(text[:4 * 32]), dtype=torch.long).view(4, 32)
# transformers predicts labels[:, 1:] from logits[:, :-1] (labels = input_ids): the same targets for us, the last
# position ignored
targets = torch.cat([inputs[:, 1:], torch.full((4, 1), -100)], dim=1)
loss, extra = ref.forward(params, c, inputs, targets)
loss.backward()
model = hf.MixtralForCausalLM(hf_config(num_hidden_layers=c["n_layers"])).float()
with torch.no_grad():
    for name, t in model.named_parameters():
        if ".mlp." not in name and "block_sparse_moe" not in name:
            t.copy_(params[name])
    for i in range(c["n_layers"]):
        layer = model.model.layers[i]
        load_block(layer.mlp if hasattr(layer, "mlp") else layer.block_sparse_moe,
                   lambda n, i=i: params[f"model.layers.{i}.block_sparse_moe.{n}"])
out = model(input_ids=inputs, labels=inputs)
out.loss.backward()
print(f" transformers: loss {out.loss.item():.9g}, aux {out.aux_loss.item():.9g}; "
      f"ours: loss {loss.item():.9g}, aux {extra['aux_loss']:.9g}")
print(f"  (routing: tokens per expert {extra['tokens_per_expert']})")
check("loss relative diff", abs(loss.item() - out.loss.item()) / out.loss.item(), 1e-6)
check("aux loss relative diff", abs(extra["aux_loss"] - out.aux_loss.item()) / out.aux_loss.item(), 1e-6)
hf_grads = {}
for i in range(c["n_layers"]):
    layer = model.model.layers[i]
    block = layer.mlp if hasattr(layer, "mlp") else layer.block_sparse_moe
    p = f"model.layers.{i}.block_sparse_moe."
    hf_grads[p + "gate.weight"] = block.gate.weight.grad
    if hasattr(block.experts, "gate_up_proj"):
        for e in range(E):
            hf_grads[p + f"experts.{e}.w1.weight"] = block.experts.gate_up_proj.grad[e, :FF]
            hf_grads[p + f"experts.{e}.w3.weight"] = block.experts.gate_up_proj.grad[e, FF:]
            hf_grads[p + f"experts.{e}.w2.weight"] = block.experts.down_proj.grad[e]
    else:
        for e in range(E):
            for m in ("w1", "w2", "w3"):
                hf_grads[p + f"experts.{e}.{m}.weight"] = getattr(block.experts[e], m).weight.grad
for name, t in model.named_parameters():
    if ".mlp." not in name and "block_sparse_moe" not in name:
        hf_grads[name] = t.grad
assert set(hf_grads) == set(params), set(hf_grads) ^ set(params)
top = max(g.abs().max().item() for g in hf_grads.values())
worst = max(((params[n].grad - hf_grads[n]).abs().max().item(), n) for n in params)
print(f"  gradients of {len(params)} tensors, largest |{top:.3g}|; worst {worst[1]}")
check("gradient max abs diff / largest gradient", worst[0] / top, 1e-5)

# 4. Ties in top-k.
print("4. exact ties in the router probabilities (k = 2 of 8, 256 equal rows): make_reference.topk vs torch.topk")
for logits in ([0, 1, 1, 1, 0, 0, 0, 0], [2, 1, 0, 0, 1, 0, 1, 0], [0] * 8, [0, 0, 0, 0, 0, 3, 3, 3],
               [0, 0, 0, 3, 0, 0, 0, 3], [1, 1, 0, 0, 0, 0, 0, 0]):
    probs = torch.softmax(torch.tensor([logits] * 256, dtype=torch.float32), dim=-1)
    lowest = sorted(range(E), key=lambda e: (-logits[e], e))[:K]  # ties to the lower expert index
    ours = {tuple(r) for r in ref.topk(probs, K)[1].tolist()}
    torchs = {tuple(r) for r in torch.topk(probs, K, dim=-1).indices.tolist()}
    same_values = torch.equal(ref.topk(probs, K)[0], torch.topk(probs, K, dim=-1).values)
    lower = {tuple(sorted(r)) for r in torchs} == {tuple(sorted(lowest))}
    print(f"  logits {logits}: lower-index rule {lowest}, make_reference.topk {sorted(ours)}, "
          f"torch.topk {sorted(torchs)}{'' if lower else ' (NOT the lower index)'}")
    if ours != {tuple(lowest)} or not same_values:
        failures.append(f"tie {logits}")
untied = torch.softmax(torch.randn(4096, E, generator=gen), dim=-1)
agree = all(torch.equal(a, b) for a, b in zip(ref.topk(untied, K), torch.topk(untied, K, dim=-1)))
print(f"  no ties (4096 random rows): make_reference.topk {'equals' if agree else 'DIFFERS FROM'} torch.topk")
if not agree:
    failures.append("topk without ties")

if failures:
    sys.exit(f"FAIL: {', '.join(failures)}")
print("PASS")
