#!/usr/bin/env python3
"""Summarises an Nsight Compute CSV (gpu__time_duration per kernel) of `llmk bench` runs into
where the time of one forward pass goes, by kernel, with the share of the total.

    python3 bench/profile_summary.py ncu.csv --passes N
The CSV holds N identical forward passes; the table is their average.
"""
import argparse
import collections
import csv
import re


def short(name):
    name = re.sub(r"^void ", "", name)
    name = name.replace("(anonymous namespace)", "").replace("<unnamed>", "")
    name = re.sub(r"\(.*$", "", name)      # arguments
    base = re.sub(r"<.*$", "", name)        # template arguments
    return base.split("::")[-1] if "::" in base else base


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--passes", type=int, required=True)
    args = ap.parse_args()
    rows = []
    with open(args.csv) as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "nsecond")
        us = v / 1000 if unit.startswith("n") else v if unit.startswith("u") else v * 1000
        rows.append((short(r["Kernel Name"]), us))
    total = sum(us for _, us in rows) / args.passes
    by = collections.defaultdict(lambda: [0, 0.0])
    for k, us in rows:
        by[k][0] += 1
        by[k][1] += us
    print(f"{len(rows)} kernels over {args.passes} passes; per pass: {len(rows) / args.passes:.0f} "
          f"kernels, {total:.1f} us of kernel time")
    print("| kernel | launches/pass | us/pass | share |")
    print("|---|---|---|---|")
    for k, (n, us) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"| {k} | {n / args.passes:.0f} | {us / args.passes:.1f} | {100 * us / args.passes / total:.1f}% |")


if __name__ == "__main__":
    main()
