#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Picks each tunable policy's parameters per model from the training split's trials (tools/eval/protocol).

Every trial is one memdecay-eval --json file named <policy>_<param>=<value>[_<param>=<value>].json. The score of a
trial is its recall pooled over tiers and budgets (all probes, page 16); the best trial wins, ties go to the trial
given first (the protocol gives each policy's source default first). Writes
`<model>_<param>=<value>` lines (alpha, tau, h2o, snapkv, scissorhands) for the protocol to source.
"""
import argparse
import json
import os

PARAM_NAMES = {"alpha": "alpha", "tau": "tau", "recent-fraction": "h2o", "window": "snapkv", "history": "scissorhands"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trials", nargs="+")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    best = {}  # (model, policy) -> (score, params, name)
    order = {}
    for i, path in enumerate(a.trials):
        name = os.path.basename(path)[:-len(".json")]
        policy, *kv = name.split("_")
        params = dict(x.split("=", 1) for x in kv)
        run = json.load(open(path))
        per_model = {}
        for r in run["results"]:
            if r["policy"] != policy or r["page_size"] != 16:
                continue
            k, n = per_model.get(r["model"], (0, 0))
            per_model[r["model"]] = (k + r["all"]["recalled"], n + r["all"]["probes"])
        for model, (k, n) in per_model.items():
            score = k / n if n else 0.0
            key = (model, policy)
            print(f"{model:6s} {name:40s} recall {100 * score:5.1f}% ({k}/{n})")
            if key not in best or score > best[key][0]:
                best[key] = (score, params, name)
            order.setdefault(key, i)
    with open(a.out, "w") as f:
        for (model, policy), (score, params, name) in sorted(best.items()):
            print(f"best {model:6s} {policy:18s} {name} ({100 * score:.1f}%)")
            for p, v in params.items():
                f.write(f"{model}_{PARAM_NAMES[p]}={v}\n")


if __name__ == "__main__":
    main()
