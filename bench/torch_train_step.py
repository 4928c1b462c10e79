#!/usr/bin/python3
"""PyTorch's time per training step for the same Llama as meshtrain's bench
(forward, backward, clipping, AdamW), for bench/train.sh. Prints JSON, with
the BLAS library this process loaded, its core type and thread count (the
caller sets OPENBLAS_NUM_THREADS / OMP_NUM_THREADS before the start)."""
import ctypes
import json
import resource
import sys
import time

import torch

sys.path.insert(0, "tests/parity")
from make_reference import forward, param_shapes  # noqa: E402  the same architecture as the parity reference


def blas_info():
    """The BLAS library mapped into this process and, for OpenBLAS, the core type and threads it chose."""
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "blas" in line.rsplit("/", 1)[-1]})
    info = {"blas": ",".join(paths) or "none found"}
    for path in paths:
        lib = ctypes.CDLL(path)
        if hasattr(lib, "openblas_get_corename"):
            lib.openblas_get_corename.restype = ctypes.c_char_p
            info.update(blas_core=lib.openblas_get_corename().decode(), blas_threads=lib.openblas_get_num_threads())
            break
    return info


def main():
    cfg = json.loads(sys.argv[1])
    threads, steps = int(sys.argv[2]), int(sys.argv[3])
    dtype = sys.argv[4] if len(sys.argv) > 4 else "float32"
    # bfloat16: PyTorch's CPU autocast (bf16 compute, f32 weights), as meshtrain's bf16 mode.
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    params = {n: (torch.ones(s) if "norm" in n else torch.randn(s) * 0.02).requires_grad_()
              for n, s in param_shapes(cfg).items()}
    opt = torch.optim.AdamW(params.values(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    B, T = cfg["batch_size"], cfg["seq_len"]
    data = torch.randint(0, cfg["vocab_size"], (B * T * (steps + 4) + 1,))
    times = []
    for step in range(steps + 3):
        chunk = data[step * B * T: (step + 1) * B * T + 1]
        t0 = time.perf_counter()
        opt.zero_grad()
        with autocast:
            loss = forward(params, cfg, chunk[:-1].view(B, T), chunk[1:].view(B, T))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    times = sorted(times[3:])
    print(json.dumps({"median_step_s": times[len(times) // 2], "tokens_per_step": B * T, "threads": threads,
                      "torch": torch.__version__, "dtype": dtype,
                      "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, **blas_info()}))


if __name__ == "__main__":
    main()
