#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Python statistics of the evaluation against memdecay-eval's own (CTest eval_python_statistics).

    check_eval_statistics.py MEMDECAY_EVAL EPISODES_FILE WORKDIR

Runs memdecay-eval on a few episodes, then checks that tools/eval/findings.py's bootstrap gives every row's recall
and 95% interval exactly as memdecay-eval printed them (tools/eval/bootstrap.hpp: the same generator, seed and
quantiles), that it is deterministic, and that tools/eval/paired.py reports a policy against itself as a tie of
exactly 0 and a pair of policies as the paired bootstrap of their per-episode counts. Exits 1 on any mismatch.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "eval"))
from findings import bootstrap  # noqa: E402

exe, episodes, workdir = sys.argv[1:4]
os.makedirs(workdir, exist_ok=True)
out = os.path.join(workdir, "run.json")
subprocess.run([exe, "--models", "small", "--episodes-file", episodes, "--episodes", "8", "-b", "0.25", "-p",
                "memdecay-lifetime,h2o", "--page-sizes", "16", "--baseline-page-sizes", "16", "--threads", "2",
                "--no-progress", "--json", out], check=True, stdout=subprocess.DEVNULL)
run = json.load(open(out))
failures = []
checked = 0
for r in run["results"]:
    if r["recall_ci95"] is None:
        continue
    est, lo, hi = bootstrap([r["per_episode"]])
    if bootstrap([r["per_episode"]]) != (est, lo, hi):
        failures.append(f"{r['policy']}: the bootstrap is not deterministic")
    want = (r["all"]["recall"], *r["recall_ci95"])
    if max(abs(x - y) for x, y in zip((est, lo, hi), want)) > 1e-12:
        failures.append(f"{r['tier']} {r['policy']}: findings.py {(est, lo, hi)}, memdecay-eval {want}")
    checked += 1
if checked < 2:
    failures.append(f"only {checked} rows with an interval")

paired = os.path.join(ROOT, "tools", "eval", "paired.py")


def paired_lines(*policies):
    res = subprocess.run([sys.executable, paired, out, *policies], check=True, capture_output=True, text=True)
    return [line.split("\t") for line in res.stdout.strip().splitlines()]


lines = paired_lines("memdecay-lifetime", "memdecay-lifetime")
if lines != [["small", "memdecay-lifetime - memdecay-lifetime", "+0.0 [+0.0, +0.0]", "tie"]]:
    failures.append(f"a policy against itself: {lines}")
lines = paired_lines("memdecay-lifetime", "h2o")


def strata(policy):
    return {r["tier"]: r["per_episode"] for r in run["results"] if r["policy"] == policy and r["page_size"] == 16}


a, b = strata("memdecay-lifetime"), strata("h2o")
tiers = sorted(a)
est, lo, hi = bootstrap([a[t] for t in tiers], [b[t] for t in tiers])
want = f"{100 * est:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
if len(lines) != 1 or lines[0][2] != want or lines[0][3] != ("tie" if lo <= 0 <= hi else "ahead" if lo > 0 else "behind"):
    failures.append(f"memdecay-lifetime - h2o: paired.py {lines}, expected {want}")

for f in failures:
    print("check_eval_statistics:", f, file=sys.stderr)
print(f"check_eval_statistics: {checked} rows and 2 pairs checked, {len(failures)} failures")
sys.exit(1 if failures else 0)
