"""Self-checks: the torch model against a plain numpy transcription of contract section 5, the safetensors
round trip, and the episode files' invariants.  /usr/bin/python3 python/test_model.py"""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import episodes  # noqa: E402
import model as M  # noqa: E402
import safetensors_io as S  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def numpy_forward(t, cfg, toks):
    d, H, k, eps, theta = cfg["d_model"], cfg["n_heads"], cfg["conv_kernel"], cfg["norm_eps"], cfg["rope_theta"]
    hd = d // H
    T = len(toks)
    rms = lambda v, w: v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w
    x = t["embed"][toks].astype(np.float64)
    att0 = None
    for l in range(cfg["n_layers"]):
        p = lambda n: t[f"layers.{l}.{n}"].astype(np.float64)
        h = rms(x, p("norm1"))
        c = np.zeros_like(h)
        for tt in range(T):
            c[tt] = p("conv_bias")
            for j in range(k):
                src = tt - (k - 1) + j
                if src >= 0:
                    c[tt] += p("conv_weight")[:, j] * h[src]
        q, kk, v = c @ p("wq").T, c @ p("wk").T, c @ p("wv").T
        out = np.zeros_like(q)
        for hh in range(H):
            sl = slice(hh * hd, (hh + 1) * hd)
            qh, kh = q[:, sl].copy(), kk[:, sl].copy()
            for arr in (qh, kh):
                for pos in range(T):
                    for i in range(hd // 2):
                        a = pos * theta ** (-2 * i / hd)
                        x1, x2 = arr[pos, i], arr[pos, i + hd // 2]
                        arr[pos, i], arr[pos, i + hd // 2] = x1 * math.cos(a) - x2 * math.sin(a), x2 * math.cos(a) + x1 * math.sin(a)
            s = qh @ kh.T / math.sqrt(hd) + np.triu(np.full((T, T), -np.inf), 1)
            a = np.exp(s - s.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            if l == 0 and hh == 0:
                att0 = a[-1]
            out[:, sl] = a @ v[:, sl]
        x = x + out @ p("wo").T
        h2 = rms(x, p("norm2"))
        z = h2 @ p("w1").T + p("b1")
        g = 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
        x = x + g @ p("w2").T + p("b2")
    return rms(x, t["norm_f"]) @ t["embed"].astype(np.float64).T, att0


def main():
    path = os.path.join(ROOT, "models/fixtures/random-tiny.safetensors")
    t, meta = S.load(path)
    cfg = json.loads(meta["config"])
    fx = json.load(open(os.path.join(ROOT, "models/fixtures/logits-random-tiny.json")))
    ref, att = numpy_forward(t, cfg, fx["tokens"])
    err = np.abs(ref - np.array(fx["logits"])).max()
    aerr = np.abs(att - np.array(fx["attention_layer0_head0_last"])).max()
    print(f"fixture vs numpy float64 reference: max |dlogit| {err:.2e}, max |dattn| {aerr:.2e}")
    assert err < 1e-3 and aerr < 1e-5
    # Round trip.
    m, _, _ = M.load_model(path)
    S.save("/tmp/rt.safetensors", m.named_tensors(), meta)
    t2, meta2 = S.load("/tmp/rt.safetensors")
    assert meta2 == meta and all(np.array_equal(t[n], t2[n]) for n in t)
    # Episode files.
    for tier in (450, 1700):
        data = json.load(open(os.path.join(ROOT, f"models/episodes-{tier}.json")))
        assert data["format"] == "memdecay-episodes" and data["version"] == 1 and data["tier"] == tier
        for ep in data["episodes"]:
            tok = ep["tokens"]
            assert len(tok) == tier and tok[0] == episodes.VOCAB_LAYOUT["bos"]
            pos = 0
            for s in ep["segments"]:
                assert s["first"] == pos
                mk = tok[s["first"] + (1 if pos == 0 else 0)]
                assert mk == episodes.VOCAB_LAYOUT["region_markers"][s["region"]]
                pos += s["length"]
            assert pos == tier
            keys = set()
            for p in ep["probes"]:
                assert tok[p["fact_first"]] == p["key"] and tok[p["fact_first"] + 1] == p["answer"]
                assert p["planted_at"] == p["fact_first"] + 2 <= p["at"] <= tier
                assert p["key"] not in keys
                keys.add(p["key"])
    print("ok")


if __name__ == "__main__":
    main()
