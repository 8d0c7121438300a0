"""Full-cache recall of a saved model on the evaluation episode files, asked the way the C++ evaluator asks:
after the first `at` episode tokens, the prompt [query, key], greedy next token == answer.

Exact and fast: one causal forward of the whole episode gives every layer's K/V (RoPE applied) and normed conv
inputs; each probe's two prompt tokens are then run on top of the prefix [0, at) (what a forked KV cache does).
`--naive` recomputes each probe with a full forward of tokens[:at] + [query, key] (slow; a cross-check).

  /usr/bin/python3 python/evaluate_full_cache.py models/small/model.safetensors [--json out.json]
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_model as LM  # noqa: E402
import model as M  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REGIONS = ["system", "plan", "user", "tool_in", "tool_out", "retrieval", "scratchpad"]


@torch.no_grad()
def probe_predictions(m, tokens, probes, query_token, hidden=None):
    """Greedy answers (list of ints) for probes [(at, key)] over the episode `tokens` (list of ints).
    hidden (optional, a sanity check of eviction): bool tensor [P, N], True where the probe must not see a
    prefix position (evicted just before the probe; the prefix's own states stay those of the full cache)."""
    c = m.config
    d, H, k, eps = c["d_model"], c["n_heads"], c["conv_kernel"], c["norm_eps"]
    hd = d // H
    N = len(tokens)
    x = m.embed[torch.tensor(tokens)].unsqueeze(0)
    cos, sin = m.rope_cos, m.rope_sin
    P = len(probes)
    at = torch.tensor([p[0] for p in probes])
    xe = m.embed[torch.tensor([[query_token, p[1]] for p in probes])]     # [P, 2, d]
    pos_e = torch.stack([at, at + 1], 1)                                    # [P, 2]
    cos_e, sin_e = cos[pos_e].unsqueeze(1), sin[pos_e].unsqueeze(1)         # [P, 1, 2, hd/2]
    mask_prefix = torch.arange(N)[None, :] >= at[:, None]                   # [P, N] True = not visible
    if hidden is not None:
        mask_prefix = mask_prefix | hidden
    for L in m.layers:
        # Prefix (the whole episode; causality makes position t independent of later tokens).
        h = M.rmsnorm(x, L.norm1, eps)
        hc = F.pad(h.transpose(1, 2), (k - 1, 0))
        cv = F.conv1d(hc, L.conv_weight.unsqueeze(1), L.conv_bias, groups=d).transpose(1, 2)
        q = F.linear(cv, L.wq).view(1, N, H, hd).transpose(1, 2)
        kk = F.linear(cv, L.wk).view(1, N, H, hd).transpose(1, 2)
        v = F.linear(cv, L.wv).view(1, N, H, hd).transpose(1, 2)
        q, kk = M.apply_rope(q, cos[:N], sin[:N]), M.apply_rope(kk, cos[:N], sin[:N])
        s = q @ kk.transpose(-1, -2) / math.sqrt(hd) + torch.full((N, N), float("-inf")).triu(1)
        o = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(1, N, d)
        # Probe tokens on top of prefix [0, at).
        he = M.rmsnorm(xe, L.norm1, eps)                                    # [P, 2, d]
        hpad = torch.cat([torch.zeros(k - 1, d), h[0]], 0)                  # index i + k - 1 = position i
        idx = at[:, None] + torch.arange(-(k - 1), 0)[None, :] + (k - 1)    # positions at-(k-1) .. at-1
        seq = torch.cat([hpad[idx], he], 1)                                 # [P, k-1+2, d]
        cve = F.conv1d(seq.transpose(1, 2), L.conv_weight.unsqueeze(1), L.conv_bias, groups=d).transpose(1, 2)
        qe = F.linear(cve, L.wq).view(P, 2, H, hd).transpose(1, 2)
        ke = F.linear(cve, L.wk).view(P, 2, H, hd).transpose(1, 2)
        ve = F.linear(cve, L.wv).view(P, 2, H, hd).transpose(1, 2)
        qe, ke = M.apply_rope(qe, cos_e, sin_e), M.apply_rope(ke, cos_e, sin_e)
        sp = qe @ kk.transpose(-1, -2) / math.sqrt(hd)                      # [P, H, 2, N]
        sp = sp.masked_fill(mask_prefix[:, None, None, :], float("-inf"))
        se = qe @ ke.transpose(-1, -2) / math.sqrt(hd) + torch.tensor([[0.0, float("-inf")], [0.0, 0.0]])
        a = torch.softmax(torch.cat([sp, se], -1), -1)
        oe = (a[..., :N] @ v + a[..., N:] @ ve).transpose(1, 2).reshape(P, 2, d)
        x = x + F.linear(o, L.wo)
        x = x + F.linear(F.gelu(F.linear(M.rmsnorm(x, L.norm2, eps), L.w1, L.b1)), L.w2, L.b2)
        xe = xe + F.linear(oe, L.wo)
        xe = xe + F.linear(F.gelu(F.linear(M.rmsnorm(xe, L.norm2, eps), L.w1, L.b1)), L.w2, L.b2)
    logits = F.linear(M.rmsnorm(xe[:, 1], m.norm_f, eps), m.embed)
    return logits.argmax(-1).tolist()


@torch.no_grad()
def probe_predictions_naive(m, tokens, probes, query_token):
    out = []
    for at, key in probes:
        seq = torch.tensor([tokens[:at] + [query_token, key]])
        out.append(int(m(seq)[0, -1].argmax()))
    return out


def evaluate_dropped(m, episodes_file, drop, keep_fact, seed=0):
    """Sanity check of how answers depend on residency: before each probe, hide a random `drop` fraction of the
    prefix (never BOS; the probed fact's two tokens kept if keep_fact, else hidden too, along with every inline
    re-read of its key). Not the C++ protocol (no online eviction); a quick robustness number."""
    import numpy as np
    with open(episodes_file) as f:
        data = json.load(f)
    qt = data["vocab_layout"]["query"]
    rng = np.random.default_rng(seed)
    ok = n = 0
    for ep in data["episodes"]:
        toks = ep["tokens"]
        N = len(toks)
        hidden = torch.from_numpy(rng.random((len(ep["probes"]), N)) < drop)
        hidden[:, 0] = False
        for i, p in enumerate(ep["probes"]):
            a = p["fact_first"]
            hidden[i, a:a + 2] = not keep_fact
            if not keep_fact:
                for j in range(1, N - 1):
                    if toks[j - 1] == qt and toks[j] == p["key"]:
                        hidden[i, j - 1:j + 2] = True
        pred = probe_predictions(m, toks, [(p["at"], p["key"]) for p in ep["probes"]], qt, hidden)
        ok += sum(int(y == p["answer"]) for p, y in zip(ep["probes"], pred))
        n += len(pred)
    return ok / n


def evaluate(m, episodes_file, naive=False):
    with open(episodes_file) as f:
        data = json.load(f)
    qt = data["vocab_layout"]["query"]
    per = {}
    for ep in data["episodes"]:
        probes = [(p["at"], p["key"]) for p in ep["probes"]]
        fn = probe_predictions_naive if naive else (
            LM.probe_predictions if m.config.get("arch") == "llama" else probe_predictions)
        pred = fn(m, ep["tokens"], probes, qt)
        for p, y in zip(ep["probes"], pred):
            r = per.setdefault(p["region"], [0, 0])
            r[0] += int(y == p["answer"])
            r[1] += 1
    total = [sum(v[0] for v in per.values()), sum(v[1] for v in per.values())]
    return {"tier": data["tier"], "correct": total[0], "probes": total[1],
            "recall": total[0] / max(1, total[1]),
            "regions": {r: {"correct": per[r][0], "probes": per[r][1], "recall": per[r][0] / per[r][1]}
                        for r in REGIONS if r in per}}


def load_any_model(path):
    """The conv decoder (model.py) or the LLaMA-architecture one (llama_model.py), by the file's config."""
    from safetensors_io import load
    _, meta = load(path)
    return (LM if json.loads(meta["config"]).get("arch") == "llama" else M).load_model(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--episodes", nargs="*", default=[os.path.join(ROOT, "models/episodes-450.json"),
                                                      os.path.join(ROOT, "models/episodes-1700.json")])
    ap.add_argument("--naive", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--robustness", action="store_true",
                    help="also: recall with 50%% of the other prefix tokens hidden, and with the fact hidden")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    m, _, name = load_any_model(a.model)
    results = []
    for e in a.episodes:
        r = evaluate(m, e, a.naive)
        results.append(r)
        regs = "  ".join(f"{k} {v['correct']}/{v['probes']}" for k, v in r["regions"].items())
        print(f"{name} tier {r['tier']}: recall {r['correct']}/{r['probes']} = {100 * r['recall']:.1f}%   {regs}")
    if a.robustness:
        for e in a.episodes:
            tier = json.load(open(e))["tier"]
            r1 = evaluate_dropped(m, e, 0.5, True)
            r2 = evaluate_dropped(m, e, 0.0, False)
            print(f"{name} tier {tier}: 50% of other tokens hidden, fact kept: {100 * r1:.1f}%; "
                  f"fact and its re-reads hidden: {100 * r2:.1f}% (chance 1/64)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": name, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
