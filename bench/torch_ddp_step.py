#!/usr/bin/python3
"""PyTorch DDP's time per training step (gloo, one process per rank, spawned
here) for the same Llama as meshtrain's bench: each rank its contiguous rows
of the global batch, forward, backward (DDP averages the gradients across
ranks), clipping, AdamW. For bench/train_dp.sh. Prints JSON from rank 0:
the median step time, tokens per global step, the threads and BLAS it ran
with (the caller sets OPENBLAS_NUM_THREADS / OMP_NUM_THREADS)."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, "tests/parity")
sys.path.insert(0, "bench")
from make_reference import forward, param_shapes  # noqa: E402  the same architecture as the parity reference
from torch_train_step import blas_info  # noqa: E402


class Llama(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        torch.manual_seed(0)  # the same weights on every rank
        self.params = torch.nn.ParameterDict(
            {n.replace(".", "/"): torch.nn.Parameter(torch.ones(s) if "norm" in n else torch.randn(s) * 0.02)
             for n, s in param_shapes(cfg).items()})

    def forward(self, tokens, targets):
        return forward({n.replace("/", "."): p for n, p in self.params.items()}, self.cfg, tokens, targets)


def run(rank, world, cfg, threads, steps, port, out, dtype):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(threads)
    model = torch.nn.parallel.DistributedDataParallel(Llama(cfg))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    B, T = cfg["batch_size"], cfg["seq_len"]
    rows = B // world
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, cfg["vocab_size"], (B * T * (steps + 4) + 1,), generator=g)
    # bfloat16: PyTorch's CPU autocast (bf16 compute, f32 weights and gradients), as meshtrain's bf16 mode.
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")
    times = []
    for step in range(steps + 3):
        chunk = data[step * B * T: (step + 1) * B * T + 1]
        tokens, targets = chunk[:-1].view(B, T), chunk[1:].view(B, T)
        mine = slice(rank * rows, (rank + 1) * rows)
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        with autocast:
            loss = model(tokens[mine], targets[mine])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        times = sorted(times[3:])
        with open(out, "w") as f:
            json.dump({"median_step_s": times[len(times) // 2], "tokens_per_step": B * T, "ranks": world,
                       "threads": threads, "dtype": dtype, "torch": torch.__version__, **blas_info()}, f)
    dist.destroy_process_group()


def main():
    cfg = json.loads(sys.argv[1])
    threads, steps, world = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    dtype = sys.argv[5] if len(sys.argv) > 5 else "float32"
    out = f"/tmp/torch_ddp_{os.getpid()}.json"
    port = 29500 + os.getpid() % 1000
    mp.spawn(run, args=(world, cfg, threads, steps, port, out, dtype), nprocs=world, join=True)
    print(open(out).read())
    os.remove(out)


if __name__ == "__main__":
    main()
