#!/usr/bin/env python3
"""Estimated against measured step times of the plans bench/autoplan.sh trained.

Usage: autoplan_compare.py WORK NAME STEPS ROUNDS [ESTIMATES.json]

WORK holds NAME.picked.json (autoplan's plans, their estimates) and each
run's metrics, NAME.I.R.jsonl (plan I, round R). A plan's measured step is
the median of its last STEPS steps in each round, then the median over its
rounds. ESTIMATES.json, a list of step times in ms (one per plan, in the
picked order), replaces autoplan's estimates: bench/autoplan_recheck.sh
passes the steps a changed estimator or profile gives the same plans.

Prints every plan's estimated and measured step, the Spearman rank
correlation between them (target >= 0.8) and the measured step of the plan
estimated fastest against the fastest measured (target <= 1.10). With 2
rounds or more, also how well the measurement agrees with itself: the mean
Spearman correlation between pairs of rounds, a ceiling on what any
estimate can reach against single rounds.
"""
import json
import statistics
import sys


def ranks(xs):
    """Ranks from 1, ties given their mean rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a, b):
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    den = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / den if den > 0 else 0.0


def main():
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    work, name, steps, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    best = json.load(open(f"{work}/{name}.picked.json"))["best"]
    est = [p["step_us"] / 1e3 for p in best]
    if len(sys.argv) == 6:
        est = json.load(open(sys.argv[5]))
        if len(est) != len(best):
            sys.exit(f"{sys.argv[5]} gives {len(est)} estimates for {len(best)} plans")

    def per_round(i):  # plan i's median step in each round
        runs = []
        for r in range(1, rounds + 1):
            rows = [json.loads(line) for line in open(f"{work}/{name}.{i}.{r}.jsonl")]
            runs.append(statistics.median(x["step_ms"] for x in rows[-steps:]))
        return runs

    by_round = [per_round(i + 1) for i in range(len(best))]
    meas = [statistics.median(runs) for runs in by_round]
    width = 7 * rounds
    print(f"{'#':>3} {'estimated ms':>12} {'measured ms':>11} {'rounds ms':>{width}}  plan")
    for i, p in enumerate(best):
        each = " ".join(f"{x:6.1f}" for x in by_round[i])
        plan = p["command_line"] or "(the config as it is)"
        print(f"{i + 1:>3} {est[i]:>12.1f} {meas[i]:>11.1f} {each:>{width}}  {plan}")
    rho = spearman(est, meas)
    first = meas[min(range(len(est)), key=lambda i: est[i])] / min(meas)
    print(f"{name}: Spearman rank correlation {rho:.3f} (target >= 0.8); the plan estimated fastest measures "
          f"{first:.3f}x the fastest measured (target <= 1.10)")
    if rounds >= 2:
        pairs = [spearman([runs[a] for runs in by_round], [runs[b] for runs in by_round])
                 for a in range(rounds) for b in range(a + 1, rounds)]
        spread = statistics.median((max(runs) - min(runs)) / statistics.median(runs) for runs in by_round)
        print(f"{name}: the rounds agree with each other at Spearman {statistics.mean(pairs):.3f} (mean of "
              f"{len(pairs)} pairs; {min(pairs):.3f} to {max(pairs):.3f}); a plan's rounds spread by "
              f"{100 * spread:.1f}% of its step at the median")


if __name__ == "__main__":
    main()
