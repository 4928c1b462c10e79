#!/usr/bin/env python3
"""Compares a training run with a reference run of the same global batch.

Every step the run logged (metrics JSONL, one record per step) must be in the
reference with its loss and gradient norm (and a mixture of experts'
load-balancing loss, aux_loss, where the reference logs it) within a relative
tolerance (0: bitwise); optionally the weights each run exported (safetensors, f32) must
agree tensor by tensor, relative to the tensor: the largest difference over
the tensor's largest magnitude (max norm), and the difference's L2 norm over
the tensor's (0: bitwise). Prints one line saying how close they are (the
worst of each measure, and what was allowed); exits non-zero naming the
first step or tensor that is not.

Usage: compare_runs.py NAME REFERENCE.jsonl RUN.jsonl [--tolerance T]
           [--grad-norm-tolerance G] [--aux-loss-tolerance A] [--steps FIRST-LAST]
           [--weights REFERENCE.safetensors RUN.safetensors]
           [--weight-tolerance W] [--weight-l2-tolerance L] [--note TEXT]
  --tolerance            loss (and, unless --grad-norm-tolerance or --aux-loss-tolerance, grad_norm and
                         aux_loss): |run - ref| <= T |ref|
  --weight-tolerance     each tensor: max |run - ref| <= W max |ref|
  --weight-l2-tolerance  each tensor: ||run - ref|| <= L ||ref|| (default: W)
  --steps                the steps RUN must have logged, in order (default: the reference's)
"""
import argparse
import json
import math
import struct
import sys

FLOOR = 1e-30  # the absolute floor of every relative comparison: a zero reference must be matched exactly


def metrics(path):
    return [json.loads(line) for line in open(path)]


def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        if entry["dtype"] != "F32":
            sys.exit(f"FAIL: {path}: {key} is {entry['dtype']}; only F32 exports are compared")
        begin, end = entry["data_offsets"]
        out[key] = struct.unpack(f"<{(end - begin) // 4}f", raw[8 + n + begin:8 + n + end])
    return out


def relative(diff, scale):
    return 0.0 if diff == 0 else diff / (scale + FLOOR)


def within(worst):
    return "bitwise" if worst == 0 else f"within {worst:.1e}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name")
    parser.add_argument("reference")
    parser.add_argument("run")
    parser.add_argument("--tolerance", type=float, default=1e-6)
    parser.add_argument("--grad-norm-tolerance", type=float)
    parser.add_argument("--aux-loss-tolerance", type=float)
    parser.add_argument("--steps")
    parser.add_argument("--weights", nargs=2, metavar=("REFERENCE", "RUN"))
    parser.add_argument("--weight-tolerance", type=float, default=1e-4)
    parser.add_argument("--weight-l2-tolerance", type=float)
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    name = args.name
    allowed = {"loss": args.tolerance,
               "grad_norm": args.tolerance if args.grad_norm_tolerance is None else args.grad_norm_tolerance,
               "aux_loss": args.tolerance if args.aux_loss_tolerance is None else args.aux_loss_tolerance}

    reference = {record["step"]: record for record in metrics(args.reference)}
    run = metrics(args.run)
    if args.steps:
        first, last = map(int, args.steps.split("-"))
        expected = list(range(first, last + 1))
    else:
        expected = sorted(reference)
    logged = [record["step"] for record in run]
    if logged != expected:
        sys.exit(f"FAIL: {name}: logged steps {logged}, expected {expected}")
    worst = {"loss": 0.0, "grad_norm": 0.0, "aux_loss": 0.0}
    for record in run:
        if record["step"] not in reference:
            sys.exit(f"FAIL: {name}: step {record['step']} is not in the reference {args.reference}")
        base = reference[record["step"]]
        # A mixture of experts' load-balancing loss, where the reference logs one, must be logged alike.
        keys = ("loss", "grad_norm", "aux_loss") if "aux_loss" in base else ("loss", "grad_norm")
        for key in keys:
            if key not in record:
                sys.exit(f"FAIL: {name} step {record['step']}: no {key} logged, which the reference logs")
            rel = relative(abs(base[key] - record[key]), abs(base[key]))
            worst[key] = max(worst[key], rel)
            if not rel <= allowed[key]:
                sys.exit(f"FAIL: {name} step {record['step']} {key}: {record[key]!r} vs the reference's "
                         f"{base[key]!r} (relative {rel:.2e}, allowed {allowed[key]:g})")
    steps = f"steps {expected[0]}-{expected[-1]}" if expected else "no steps"
    aux = any("aux_loss" in record for record in reference.values())
    if worst["loss"] == worst["grad_norm"] == worst["aux_loss"] == 0:
        said = f"{name}: {steps} bitwise (loss, grad_norm{', aux_loss' if aux else ''})"
    else:
        said = (f"{name}: {steps} loss {within(worst['loss'])}, grad_norm {within(worst['grad_norm'])}"
                + (f", aux_loss {within(worst['aux_loss'])}" if aux else "")
                + f" (relative; allowed {allowed['loss']:g}, {allowed['grad_norm']:g}"
                + (f", {allowed['aux_loss']:g})" if aux else ")"))

    if args.weights:
        w_max = args.weight_tolerance
        w_l2 = w_max if args.weight_l2_tolerance is None else args.weight_l2_tolerance
        p, q = tensors(args.weights[0]), tensors(args.weights[1])
        if p.keys() != q.keys():
            sys.exit(f"FAIL: {name}: the exported tensors differ: {sorted(p.keys() ^ q.keys())}")
        worst_max, worst_l2 = (0.0, ""), (0.0, "")
        for key in sorted(p):
            ref, got = p[key], q[key]
            if len(ref) != len(got):
                sys.exit(f"FAIL: {name}: {key} has {len(got)} elements, the reference's {len(ref)}")
            diffs = [abs(u - v) for u, v in zip(got, ref)]
            rel_max = relative(max(diffs, default=0.0), max((abs(v) for v in ref), default=0.0))
            rel_l2 = relative(math.sqrt(sum(d * d for d in diffs)), math.sqrt(sum(v * v for v in ref)))
            worst_max, worst_l2 = max(worst_max, (rel_max, key)), max(worst_l2, (rel_l2, key))
            if not rel_max <= w_max or not rel_l2 <= w_l2:
                sys.exit(f"FAIL: {name}: the exported {key} differs from the reference's by {rel_max:.2e} of its "
                         f"largest magnitude (allowed {w_max:g}) and {rel_l2:.2e} of its L2 norm (allowed {w_l2:g})")
        if worst_max[0] == 0:
            said += ", weights bitwise"
        else:
            said += (f", weights within {worst_max[0]:.1e} of a tensor's largest magnitude ({worst_max[1]}) and "
                     f"{worst_l2[0]:.1e} of its L2 norm ({worst_l2[1]}) (allowed {w_max:g}, {w_l2:g})")
    print(said + (f"; {args.note}" if args.note else ""))


if __name__ == "__main__":
    main()
