#!/usr/bin/env python3
"""Compares a training run with a reference run of the same global batch.

Every step the run logged (metrics JSONL, one record per step) must be in the
reference with its loss and gradient norm within a relative tolerance (0:
bitwise); optionally the weights each run exported (safetensors, f32) must
agree within an absolute tolerance. Prints one line saying how close they
are; exits non-zero naming the first step or tensor that is not.

Usage: compare_runs.py NAME REFERENCE.jsonl RUN.jsonl [--tolerance T]
           [--steps FIRST-LAST] [--weights REFERENCE.safetensors RUN.safetensors]
           [--weight-tolerance W] [--note TEXT]
  --steps  the steps RUN must have logged, in order (default: the reference's)
"""
import argparse
import json
import struct
import sys


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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name")
    parser.add_argument("reference")
    parser.add_argument("run")
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--steps")
    parser.add_argument("--weights", nargs=2, metavar=("REFERENCE", "RUN"))
    parser.add_argument("--weight-tolerance", type=float, default=1e-5)
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    name = args.name

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
    worst = 0.0
    for record in run:
        if record["step"] not in reference:
            sys.exit(f"FAIL: {name}: step {record['step']} is not in the reference {args.reference}")
        base = reference[record["step"]]
        for key in ("loss", "grad_norm"):
            if args.tolerance == 0 and base[key] == record[key]:
                continue
            rel = abs(base[key] - record[key]) / abs(base[key])
            worst = max(worst, rel)
            if args.tolerance == 0 or not rel <= args.tolerance:
                sys.exit(f"FAIL: {name} step {record['step']} {key}: {record[key]!r} vs the reference's "
                         f"{base[key]!r} (relative {rel:.2e}, allowed {args.tolerance:g})")
    steps = f"steps {expected[0]}-{expected[-1]}" if expected else "no steps"
    said = f"{name}: {steps} " + ("bitwise" if worst == 0 else f"within {worst:.1e} relative") + \
        " (loss, grad_norm)"

    if args.weights:
        p, q = tensors(args.weights[0]), tensors(args.weights[1])
        if p.keys() != q.keys():
            sys.exit(f"FAIL: {name}: the exported tensors differ: {sorted(p.keys() ^ q.keys())}")
        dmax = 0.0
        for key in p:
            if len(p[key]) != len(q[key]):
                sys.exit(f"FAIL: {name}: {key} has {len(q[key])} elements, the reference's {len(p[key])}")
            dmax = max([dmax] + [abs(u - v) for u, v in zip(p[key], q[key])])
        if not dmax <= args.weight_tolerance:
            sys.exit(f"FAIL: {name}: the exported weights differ from the reference's by {dmax:.2e} "
                     f"(allowed {args.weight_tolerance:g})")
        said += f", weights within {dmax:.1e}"
    print(said + (f"; {args.note}" if args.note else ""))


if __name__ == "__main__":
    main()
