#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Prints the tables of docs/findings.md from the files tools/eval/protocol writes (BUILD/protocol).

    python3 tools/eval/findings.py build/release/protocol

Every interval is the 95% percentile bootstrap over episodes, stratified by tier, with the generator and seed of
memdecay-eval (tools/eval/bootstrap.hpp: splitmix64, 2000 resamples), so the numbers equal memdecay-eval's own.
A difference whose interval contains 0 is a tie.
"""
import argparse
import glob
import json
import os
import reread_counts  # tools/eval/, beside this script

MASK = (1 << 64) - 1
SEED = 0x6D656D6465636179
RESAMPLES = 2000
REGIONS = ["system", "plan", "user", "tool_in", "tool_out", "retrieval", "scratchpad"]
DEFAULT_HALF_LIFE = {"system": 170, "plan": 120, "user": 80, "tool_in": 30, "tool_out": 40, "retrieval": 100,
                     "scratchpad": 15}
GENERATING_HALF_LIFE = {"system": 400, "plan": 200, "retrieval": 150, "user": 60, "tool_out": 30, "tool_in": 12,
                        "scratchpad": 8}  # python/episodes.py REGION_HALF_LIFE_STEPS


class SplitMix64:
    def __init__(self, seed):
        self.s = seed & MASK

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)


def quantile(v, q):
    v = sorted(v)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (pos - lo) * (v[hi] - v[lo])


def bootstrap(b, a=None, which=(0, 1)):
    """b, a: strata (lists per tier) of per-episode [probes, recalled, survived, unpinned probes, unpinned recalled].
    Returns (estimate, lower, upper) of recall(b) - recall(a) (or of recall(b)). Episodes without probes (of the
    measure `which` reads) are left out of the resampling, as in tools/eval/bootstrap.hpp."""
    t, h = which
    asked = [[k for k in range(len(eps)) if eps[k][t] > 0 or (a is not None and a[s][k][t] > 0)]
             for s, eps in enumerate(b)]

    def stat(pick):
        hb = tb = ha = ta = 0
        for s in range(len(b)):
            for k in range(len(asked[s])):
                e = pick(s, k)
                hb += b[s][e][h]
                tb += b[s][e][t]
                if a is not None:
                    ha += a[s][e][h]
                    ta += a[s][e][t]
        rb = hb / tb if tb else 0.0
        return rb - ((ha / ta if ta else 0.0) if a is not None else 0.0)

    est = stat(lambda s, k: asked[s][k])
    rng = SplitMix64(SEED)
    reps = [stat(lambda s, k: asked[s][rng.next() % len(asked[s])]) for _ in range(RESAMPLES)]
    return est, quantile(reps, 0.025), quantile(reps, 0.975)


class Results:
    def __init__(self, paths):
        self.rows = []
        self.runs = []
        for p in paths:
            run = json.load(open(p))
            tag = os.path.basename(p)[:-5]
            self.runs.append((tag, run))
            for r in run["results"]:
                r["run"] = tag
                self.rows.append(r)

    def strata(self, run, model, policy, page, budget):
        out = [r["per_episode"] for r in self.rows
               if r["run"] == run and r["model"] == model and r["policy"] == policy and r["page_size"] == page
               and r["budget"] == budget]
        return out or None

    def pooled(self, run, model, policy, page, budget, key="all"):
        k = n = 0
        for r in self.rows:
            if r["run"] == run and r["model"] == model and r["policy"] == policy and r["page_size"] == page and \
                    r["budget"] == budget:
                k += r[key]["recalled"]
                n += r[key]["probes"]
        return (k, n) if n else None

    def region(self, run, model, policy, page, budget, region):
        k = n = 0
        for r in self.rows:
            if r["run"] == run and r["model"] == model and r["policy"] == policy and r["page_size"] == page and \
                    r["budget"] == budget:
                k += r["regions"][region]["recalled"]
                n += r["regions"][region]["probes"]
        return (k, n) if n else None


def pct(x):
    return "-" if x is None else f"{100 * x:.1f}"


def ci(t):
    return f"{100 * t[0]:.1f} [{100 * t[1]:.1f}, {100 * t[2]:.1f}]"


def dci(t):
    verdict = "tie" if t[1] <= 0 <= t[2] else ("ahead" if t[0] > 0 else "behind")
    return f"{100 * t[0]:+.1f} [{100 * t[1]:+.1f}, {100 * t[2]:+.1f}] {verdict}"


BUDGETS = [0.25, 0.5]
MODELS = ["small", "large"]
FAMILIES = [("need", "need-aligned"), ("control", "region-agnostic control")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("protocol_dir")
    a = ap.parse_args()
    d = a.protocol_dir
    res = Results(sorted(glob.glob(os.path.join(d, "runs", "*.json"))))
    out = []
    say = out.append

    for tag, run in res.runs:
        say(f"- `{tag}`: {run['probes']} probes, {run['probe_answers']} probe answers, {run['seconds']:.0f} s on "
            f"{run['threads']} threads")
    say("")

    for fam, title in FAMILIES:
        say(f"### Recall, {title} family (tiers pooled; % [95% CI]; share of the oracle's recall)\n")
        policies = []
        for r in res.rows:
            if r["run"] == fam and r["policy"] != "full" and (r["policy"], r["page_size"]) not in policies:
                policies.append((r["policy"], r["page_size"]))
        head = "| policy | page | " + " | ".join(f"{m} {int(b * 100)}%" for m in MODELS for b in BUDGETS) + " |"
        say(head)
        say("|---|---:|" + "---:|" * (len(MODELS) * len(BUDGETS)))
        for pol, page in policies:
            cells = []
            for m in MODELS:
                for b in BUDGETS:
                    st = res.strata(fam, m, pol, page, b)
                    orc = res.pooled(fam, m, "oracle", page, b)
                    if not st:
                        cells.append("-")
                        continue
                    t = bootstrap(st)
                    share = f"; {100 * t[0] / (orc[0] / orc[1]):.0f}%" if orc and orc[0] else ""
                    cells.append(ci(t) + share)
            say(f"| {pol} | {page} | " + " | ".join(cells) + " |")
        say("")

    say("### MemDecay against every faithful baseline at page size 16 (difference in recall points, paired 95% CI)\n")
    say("MemDecay here is `memdecay-lifetime` with the library's defaults (alpha 1, tau 2); `tuned` is the same mode "
        "with alpha and tau fitted on the training split, against the baselines with their parameters fitted the "
        "same way.\n")
    for fam, title in FAMILIES:
        say(f"**{title}**\n")
        say("| baseline | " + " | ".join(f"{m} {int(b * 100)}%" for m in MODELS for b in BUDGETS) + " |")
        say("|---|" + "---:|" * (len(MODELS) * len(BUDGETS)))
        baselines = []
        for r in res.rows:
            if r["run"] == fam and r["page_size"] == 16 and not r["policy"].startswith("memdecay") and \
                    r["policy"] not in ("full", "oracle") and r["policy"] not in baselines:
                baselines.append(r["policy"])
        for base in baselines:
            cells = []
            for m in MODELS:
                for b in BUDGETS:
                    x = res.strata(fam, m, "memdecay-lifetime", 16, b)
                    y = res.strata(fam, m, base, 16, b)
                    cells.append(dci(bootstrap(x, y)) if x and y else "-")
            say(f"| {base} | " + " | ".join(cells) + " |")
        for base in ["h2o", "snapkv", "scissorhands"]:
            cells = []
            for m in MODELS:
                run = f"{fam}-{m}-tuned"
                for b in BUDGETS:
                    x = res.strata(run, m, "memdecay-lifetime", 16, b)
                    y = res.strata(run, m, base, 16, b)
                    cells.append(dci(bootstrap(x, y)) if x and y else "-")
            say(f"| tuned MemDecay vs tuned {base} | " + " | ".join(cells) + " |")
        for suffix, label in [("calibrated", "calibrated + tuned"), ("tuned", "tuned")]:
            cells = []
            for m in MODELS:
                for b in BUDGETS:
                    x = res.strata(f"{fam}-{m}-{suffix}", m, "memdecay-lifetime", 16, b)
                    cells.append(ci(bootstrap(x)) if x else "-")
            say(f"| ({label} MemDecay's recall) | " + " | ".join(cells) + " |")
        say("")

    say("### Recall per region of the fact, need-aligned family, 25% budget, page 16 (tiers pooled)\n")
    say("| model | policy | " + " | ".join(REGIONS) + " |")
    say("|---|---|" + "---:|" * len(REGIONS))
    for m in MODELS:
        for pol in ["oracle", "memdecay-lifetime", "memdecay-lifetime+prior-only", "memdecay-none", "h2o", "tova",
                    "streaming_llm-unpinned", "norm_sum"]:
            cells = []
            for g in REGIONS:
                x = res.region("need", m, pol, 16, 0.25, g)
                cells.append("-" if not x else f"{100 * x[0] / x[1]:.0f}% ({x[1]})")
            say(f"| {m} | {pol} | " + " | ".join(cells) + " |")
    say("")

    say("### Per tier at the 25% budget, page 16: recall of all probes (the paper's long-tier recency collapse)\n")
    tiers = {"need": ["need-aligned-450", "need-aligned-1700"], "control": ["tier-450", "tier-1700"]}
    say("| family | model | policy | " + " | ".join(t.split("-")[-1] + " tokens" for t in tiers["need"]) + " |")
    say("|---|---|---|---:|---:|")
    for fam, _ in FAMILIES:
        for m in MODELS:
            for pol in ["oracle", "memdecay-lifetime", "memdecay-none", "streaming_llm-unpinned", "h2o", "tova"]:
                cells = []
                for t in tiers[fam]:
                    st = [r["per_episode"] for r in res.rows if r["run"] == fam and r["model"] == m and
                          r["policy"] == pol and r["page_size"] == 16 and r["budget"] == 0.25 and r["tier"] == t]
                    cells.append(ci(bootstrap(st)) if st else "-")
                say(f"| {fam} | {m} | {pol} | " + " | ".join(cells) + " |")
    say("")
    say("### Unpinned recall: MemDecay against H2O (the paper's unpinned gap), page 16, paired 95% CI\n")
    say("| family | model | budget | memdecay-none | memdecay-lifetime | h2o | none - h2o | lifetime - h2o |")
    say("|---|---|---:|---:|---:|---:|---:|---:|")
    for fam, _ in FAMILIES:
        for m in MODELS:
            for b in BUDGETS:
                sn = res.strata(fam, m, "memdecay-none", 16, b)
                sl = res.strata(fam, m, "memdecay-lifetime", 16, b)
                sh = res.strata(fam, m, "h2o", 16, b)
                if not (sn and sl and sh):
                    continue
                u = (3, 4)
                say(f"| {fam} | {m} | {int(b * 100)}% | {ci(bootstrap(sn, which=u))} | {ci(bootstrap(sl, which=u))} | "
                    f"{ci(bootstrap(sh, which=u))} | {dci(bootstrap(sn, sh, which=u))} | {dci(bootstrap(sl, sh, which=u))} |")
    say("")

    tuned = os.path.join(d, "tuned.txt")
    if os.path.exists(tuned):
        say("### Parameters chosen on the training split\n")
        say("```")
        say("".join(l for l in open(tuned) if l.startswith("best")).rstrip())
        say("```\n")
    say("### Calibrated half-lives (steps; generating profile beside)\n")
    say("Attention (refresh intervals) on the training split's full-cache traces, per model; references (the inline "
        "re-reads an engine logs) on the calibration split, the same for both models.\n")
    cal = {}
    for m in MODELS:
        p = os.path.join(d, f"{m}.calibration.json")
        if os.path.exists(p):
            cal[m] = {r["name"]: r for r in json.load(open(p)).get("regions", [])}
    ref_path = os.path.join(d, "references.calibration.json")
    ref = {r["name"]: r for r in json.load(open(ref_path)).get("regions", [])} if os.path.exists(ref_path) else {}
    say("| region | generating | default | " + " | ".join(f"{m}: attention" for m in MODELS) +
        " | references | references / generating |")
    say("|---|---:|---:|" + "---:|" * len(MODELS) + "---:|---:|")

    def fitted(r):
        fit = (r or {}).get("fit") or {}
        if not r:
            return "-"
        if fit.get("status") == "calibrated":
            iv = fit.get("half_life_ci")
            if isinstance(iv, dict):
                iv = [iv.get("lower"), iv.get("upper")]
            return (f"{fit['half_life']:.1f} [{iv[0]:.1f}, {iv[1]:.1f}]" if iv and iv[0] is not None
                    else f"{fit['half_life']:.1f}")
        # the reason's head: "too noisy", "no decay measured", "too few refresh intervals", "unstable"
        return "uncalibrated (" + str(fit.get("reason", "")).split(":")[0].split(" (")[0] + ")"

    for g in REGIONS:
        cells = [fitted(cal.get(m, {}).get(g)) for m in MODELS]
        r = ref.get(g)
        cells.append(fitted(r))
        fit = (r or {}).get("fit") or {}
        calibrated = fit.get("status") == "calibrated"
        cells.append(f"{fit['half_life'] / GENERATING_HALF_LIFE[g]:.2f}" if calibrated else "-")
        say(f"| {g} | {GENERATING_HALF_LIFE[g]} | {DEFAULT_HALF_LIFE[g]} | " + " | ".join(cells) + " |")
    train = sorted(glob.glob(os.path.join(d, "train", "episodes-need-*.json")))
    if train and cal:
        rereads, episodes = reread_counts.count_rereads(train)
        fitted = {m: {g: (r.get("fit") or {}).get("samples", 0) for g, r in regions.items()} for m, regions in cal.items()}
        say(f"\n### Refresh intervals fitted, and how many can be re-reads ({episodes} training episodes)\n")
        say("\n".join(reread_counts.table(rereads, fitted)))
    print("\n".join(out))


if __name__ == "__main__":
    main()
