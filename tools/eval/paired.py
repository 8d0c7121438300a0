#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Paired recall differences between policies of one memdecay-eval JSON file, tiers pooled, per model.

    python3 tools/eval/paired.py RUN.json A B [A B ...] [--budget 0.25] [--page 16]

Prints recall(A) - recall(B) in points with its 95% interval: the percentile bootstrap over episodes, stratified by
tier, with memdecay-eval's generator and seed (tools/eval/findings.py's bootstrap, equal to tools/eval/bootstrap.hpp),
for every model the file has. A difference whose interval contains 0 is a tie. docs/tiers.md's paired host-tier
numbers come from it (tools/eval/host-tier's host-need.json and host-control.json).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from findings import bootstrap  # noqa: E402


def strata(run, model, policy, budget, page):
    tiers = {}
    for r in run["results"]:
        if (r["model"], r["policy"], r["budget"], r["page_size"]) == (model, policy, budget, page):
            tiers[r["tier"]] = r["per_episode"]
    return tiers


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run")
    ap.add_argument("pairs", nargs="+", help="policy names, two by two: A B [A B ...]")
    ap.add_argument("--budget", type=float, default=0.25)
    ap.add_argument("--page", type=int, default=16)
    o = ap.parse_args()
    if len(o.pairs) % 2:
        ap.error("policies come in pairs")
    run = json.load(open(o.run))
    models = sorted({r["model"] for r in run["results"]})
    for model in models:
        for a, b in zip(o.pairs[0::2], o.pairs[1::2]):
            sa = strata(run, model, a, o.budget, o.page)
            sb = strata(run, model, b, o.budget, o.page)
            if not sa or sorted(sa) != sorted(sb):
                sys.exit(f"{o.run}: {model}: no common tiers for '{a}' and '{b}'")
            tiers = sorted(sa)
            est, lo, hi = bootstrap([sa[t] for t in tiers], [sb[t] for t in tiers])
            verdict = "tie" if lo <= 0 <= hi else ("ahead" if lo > 0 else "behind")
            print(f"{model}\t{a} - {b}\t{100 * est:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]\t{verdict}")


if __name__ == "__main__":
    main()
