#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Prints the tables of docs/findings.md from memdecay-eval's JSON and memdecay-calibrate's files.

    python3 tools/eval/findings.py full/small.json full/large.json \
        --calibration small=full/small.calibration.json --calibration large=full/large.calibration.json

(docs/findings.md lists the memdecay-eval and memdecay-calibrate commands that write these files.)
"""
import argparse
import json


# memdecay::default_region_table()'s half-lives (the paper's: system ~170, measured 148-189; scratchpad ~15).
DEFAULTS = {"system": 170, "plan": 120, "user": 80, "tool_in": 30, "tool_out": 40, "retrieval": 100, "scratchpad": 15}


def pct(k, n):
    return "-" if not n else f"{100.0 * k / n:.1f}%"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("eval_json", nargs="+", help="memdecay-eval --json files (one run, or one per model)")
    ap.add_argument("--calibration", action="append", default=[], metavar="MODEL=PATH")
    a = ap.parse_args()
    runs = [json.load(open(p)) for p in a.eval_json]
    ev = runs[0]
    rows = [r for run in runs for r in run["results"]]
    models = [m["name"] for run in runs for m in run["models"]]
    tiers = [t["label"] for t in ev["tiers"]]
    budgets = ev["settings"]["budgets"]
    tight = min(budgets)

    def cell(model, tier, budget, policy, page=16):
        for r in rows:
            if r["model"] == model and r["tier"] == tier and r["budget"] == budget and r["policy"] == policy \
                    and r["page_size"] == page:
                return r
        return None

    def pooled(model, budget, policy, page=16, part="unpinned"):
        k = n = 0
        for t in tiers:
            c = cell(model, t, budget, policy, page)
            if c:
                k += c[part]["recalled"]
                n += c[part]["probes"]
        return k, n

    for path, run in zip(a.eval_json, runs):
        print(f"{path}: models {', '.join(m['name'] for m in run['models'])}: {run['probe_answers']} probe answers, "
              f"{run['probes']} probes ({run['episode_runs']} model x episode runs), {run['seconds']:.0f} s on "
              f"{run['threads']} threads")
    print()

    # 1. Half-lives.
    if a.calibration:
        cals = {}
        for spec in a.calibration:
            name, path = spec.split("=", 1)
            cals[name] = {r["name"]: r for r in json.load(open(path))["regions"]}
        names = list(next(iter(cals.values())).keys())
        print("## Half-lives (steps)\n")
        print("| region | " + " | ".join(f"{m} (95% CI)" for m in cals) + " | default |")
        print("|---|" + "---:|" * (len(cals) + 1))
        for reg in names:
            out = []
            for m, c in cals.items():
                f = c[reg]["fit"]
                if f["status"] == "calibrated":
                    lo, hi = f["half_life_ci"]
                    out.append(f"{f['half_life']:.1f} [{lo:.1f}, {hi:.1f}]")
                else:
                    out.append("uncalibrated")
            print(f"| {reg} | " + " | ".join(out) + f" | {DEFAULTS.get(reg, '')} |")
        print()

    # 2. Pinned system probes at the tightest budget.
    print(f"## System probes recalled at budget {tight:g}\n")
    pols = ["memdecay-none", "memdecay-uniform", "memdecay-lifetime", "memdecay-zscore", "streaming_llm-unpinned",
            "h2o-unpinned", "streaming_llm", "h2o", "tova"]
    print("| model | tier | " + " | ".join(pols) + " | full cache |")
    print("|---|---|" + "---:|" * (len(pols) + 1))
    for m in models:
        for t in tiers:
            out = []
            for p in pols:
                c = cell(m, t, tight, p)
                out.append("-" if c is None else f"{c['regions']['system']['recalled']}/{c['regions']['system']['probes']}")
            full = cell(m, t, None, "full")
            print(f"| {m} | {t} | " + " | ".join(out) +
                  f" | {full['regions']['system']['recalled']}/{full['regions']['system']['probes']} |")
    print()

    # 3. Recency across tiers.
    print("## Recall by tier (all probes / unpinned)\n")
    pols = ["streaming_llm-unpinned", "streaming_llm", "memdecay-none", "memdecay-uniform", "h2o", "tova"]
    print("| model | policy | budget | " + " | ".join(tiers) + " |")
    print("|---|---|---:|" + "---:|" * len(tiers))
    for m in models:
        for p in pols:
            for b in budgets:
                out = []
                for t in tiers:
                    c = cell(m, t, b, p)
                    out.append("-" if c is None else
                               f"{pct(c['all']['recalled'], c['all']['probes'])} / "
                               f"{pct(c['unpinned']['recalled'], c['unpinned']['probes'])}")
                print(f"| {m} | {p} | {b:g} | " + " | ".join(out) + " |")
    print()

    # 4-5. Unpinned recall, tiers pooled.
    print("## Unpinned recall, tiers pooled (page size 16 unless noted)\n")
    pols = [("h2o", 16), ("memdecay-none", 16), ("memdecay-uniform", 16), ("memdecay-lifetime", 16),
            ("memdecay-zscore", 16), ("memdecay-none", 1), ("memdecay-uniform", 1), ("streaming_llm", 16),
            ("tova", 16)]
    print("| model | budget | " + " | ".join(p if s == 16 else f"{p} (page 1)" for p, s in pols) + " |")
    print("|---|---:|" + "---:|" * len(pols))
    for m in models:
        for b in budgets:
            out = [pct(*pooled(m, b, p, s)) for p, s in pols]
            print(f"| {m} | {b:g} | " + " | ".join(out) + " |")


if __name__ == "__main__":
    main()
