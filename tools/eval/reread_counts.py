#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How many of the refresh intervals a calibration fitted can be re-reads (docs/findings.md, claim 1).

The need-aligned family's lifetimes live in its inline re-reads (python/episodes.py: the interval from a fact's
planting or re-read to its next re-read is exponential with its region's half-life). A re-read refreshes at most the
fact's two tokens, so at most 2 x (re-reads of a region's facts) of the intervals memdecay-calibrate completes for
that region can be re-reads; the rest are other spikes of the model's attention crossing the refresh threshold.
Prints, per region, the re-reads in the episode files, that bound, and for each calibration file (memdecay-calibrate
-o, on traces recorded from the same episodes) the intervals it fitted and the largest share of them re-reads can be.

  tools/eval/reread_counts.py EPISODES.json... [--calibration MODEL=PATH]...
"""
import argparse
import collections
import json

REGIONS = ["system", "plan", "user", "tool_in", "tool_out", "retrieval", "scratchpad"]


def count_rereads(paths):
    """Re-reads per fact region over need-aligned episode files, and the number of episodes."""
    rereads = collections.Counter()
    episodes = 0
    for path in paths:
        data = json.load(open(path))
        if data.get("family") != "need-aligned":
            raise SystemExit(f"{path}: family {data.get('family')!r}, not need-aligned (no re-read chains)")
        for ep in data["episodes"]:
            episodes += 1
            for r in ep["rereads"]:
                rereads[r["fact_region"]] += 1
    return rereads, episodes


def fitted_intervals(path):
    """Completed intervals per region of a calibration file (memdecay-calibrate -o)."""
    return {r["name"]: r["fit"]["samples"] for r in json.load(open(path))["regions"]}


def table(rereads, fitted):
    """Markdown lines: per region, re-reads, the bound on re-read intervals, and per model the intervals fitted and
    the largest share of them that can be re-reads."""
    head = "| region | re-reads | re-read intervals, at most |"
    rule = "|---|---:|---:|"
    for model in fitted:
        head += f" {model}: intervals fitted | {model}: re-reads at most |"
        rule += "---:|---:|"
    lines = [head, rule]
    for region in REGIONS:
        bound = 2 * rereads[region]
        row = f"| {region} | {rereads[region]} | {bound} |"
        for samples in fitted.values():
            n = samples.get(region, 0)
            row += f" {n} | {min(1.0, bound / n):.0%} |" if n else f" {n} | - |"
        lines.append(row)
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("episodes", nargs="+", help="need-aligned episode files (python/episodes.py)")
    ap.add_argument("--calibration", action="append", default=[], metavar="MODEL=PATH")
    a = ap.parse_args()
    rereads, episodes = count_rereads(a.episodes)
    fitted = {}
    for spec in a.calibration:
        model, path = spec.split("=", 1)
        fitted[model] = fitted_intervals(path)
    print(f"{episodes} episodes\n")
    print("\n".join(table(rereads, fitted)))


if __name__ == "__main__":
    main()
