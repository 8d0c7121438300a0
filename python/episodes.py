"""Seeded synthetic agent episodes in the token grammar of the issue-8 contract (sections 2 and 3).

Structure mirrors include/memdecay/trace_generator.hpp: a system prompt, the user's task, a plan, then actions
until the episode holds exactly `tier` tokens: tool calls (tool_in, then a long tool_out body), retrieved documents,
scratchpad bursts, user follow-ups and plan updates (weights 0.35/0.15/0.25/0.10/0.15), with the segment length
ranges of tier_config (450 and 1700 tokens); the last segment is trimmed so the episode length is exact.

Grammar:
  - token 0 is BOS; every segment starts with its region marker (the system segment right after BOS);
  - the rest of a segment is filler (uniform over the filler vocabulary) with units placed at random among it:
      fact     `key value`           (keys unique within an episode, values uniform)
      re-read  `query key value`     (a real re-reference of an earlier fact, only inside generated segments)
  - the system prompt holds 4-8 facts, spread over it; long bodies (tool_out, retrieval) hold with probability 0.9
    one dense cluster of 2-4 facts (0-3 filler tokens between them); short turns (user, plan, tool_in, scratchpad)
    hold one fact with probability 0.6, except the user's task, which holds 1-2.
  - Re-reads give the regions different lifetimes: each generated segment (plan 1-3, scratchpad 1-2, tool_in 0-1
    re-reads at 450; plan 2-4, scratchpad 1-3, tool_in 0-2 at 1700) re-reads earlier facts picked with weight
    0.5 ** (age / (h_r * tier)), age = tokens since the fact's last reference, h_r per region of the fact:
    system 2.0, plan 1.0, retrieval 0.8, user 0.3, tool_out 0.12, tool_in 0.03, scratchpad 0.03.
  - Evaluation probes (not in the tokens): each planted fact once, asked after `at` tokens, `at` drawn uniformly
    among the unit boundaries from the fact's end (planted_at) to the episode end (inclusive), so ages spread
    from 0 to the whole episode. A probe point never falls inside a fact or a re-read.

Eval episodes use the RNG stream (EVAL_STREAM, tier, seed, index); training uses (TRAIN_STREAM, tier, seed, index),
so the two are disjoint whatever the seeds.
"""
import argparse
import bisect
import json

import numpy as np

VOCAB_LAYOUT = {
    "pad": 0, "bos": 1, "query": 2,
    "region_markers": {"system": 8, "plan": 9, "user": 10, "tool_in": 11, "tool_out": 12, "retrieval": 13,
                       "scratchpad": 14},
    "key_first": 32, "key_count": 160, "value_first": 192, "value_count": 64,
    "filler_first": 256, "filler_count": 256,
}
VOCAB_SIZE = 512
GENERATED = {"plan", "tool_in", "scratchpad"}
EVAL_STREAM = 0xE7A1
TRAIN_STREAM = 0x7EA1

SHAPES = {
    "short": dict(system=(40, 56), task=(24, 40), plan=(16, 24), tool_in=(8, 16), tool_out=(48, 96),
                  retrieval=(48, 96), scratchpad=(16, 40), follow_up=(12, 24), plan_update=(8, 16)),
    "long": dict(system=(96, 144), task=(40, 80), plan=(24, 48), tool_in=(8, 24), tool_out=(128, 320),
                 retrieval=(128, 256), scratchpad=(24, 64), follow_up=(24, 56), plan_update=(16, 32)),
}
ACTION_WEIGHTS = np.array([0.35, 0.15, 0.25, 0.10, 0.15])
REREAD_HALF_LIFE = {"system": 2.0, "plan": 1.0, "retrieval": 0.8, "user": 0.3, "tool_out": 0.12, "tool_in": 0.03,
                    "scratchpad": 0.03}
REREADS = {"short": {"plan": (1, 3), "scratchpad": (1, 2), "tool_in": (0, 1)},
           "long": {"plan": (2, 4), "scratchpad": (1, 3), "tool_in": (0, 2)}}


def _plan_segments(tier, rng, shape):
    def ln(r):
        return int(rng.integers(r[0], r[1] + 1))
    segs = [["system", ln(shape["system"])], ["user", ln(shape["task"])], ["plan", ln(shape["plan"])]]
    total = sum(s[1] for s in segs)
    while total < tier:
        a = int(rng.choice(5, p=ACTION_WEIGHTS / ACTION_WEIGHTS.sum()))
        if a == 0:
            new = [["tool_in", ln(shape["tool_in"])], ["tool_out", ln(shape["tool_out"])]]
        elif a == 1:
            new = [["retrieval", ln(shape["retrieval"])]]
        elif a == 2:
            new = [["scratchpad", ln(shape["scratchpad"])]]
        elif a == 3:
            new = [["user", ln(shape["follow_up"])]]
        else:
            new = [["plan", ln(shape["plan_update"])]]
        segs += new
        total += sum(s[1] for s in new)
    excess = total - tier
    while excess > 0:
        if segs[-1][1] > excess:
            segs[-1][1] -= excess
            excess = 0
        else:
            excess -= segs[-1][1]
            segs.pop()
    return segs


def generate_episode(tier, rng):
    """One episode of exactly `tier` tokens. Returns a dict with tokens, segments, facts, boundaries, rereads."""
    V = VOCAB_LAYOUT
    kind = "long" if tier >= 1000 else "short"
    shape = SHAPES[kind]
    segs = _plan_segments(tier, rng, shape)
    keys = list(rng.permutation(V["key_count"]) + V["key_first"])
    filler = lambda: int(V["filler_first"] + rng.integers(V["filler_count"]))
    value = lambda: int(V["value_first"] + rng.integers(V["value_count"]))

    tokens, boundary, segments, facts, rereads = [], [], [], [], []
    last_ref = {}  # fact index -> position of its last reference (end)
    for si, (region, length) in enumerate(segs):
        first = len(tokens)
        head = [V["bos"], V["region_markers"][region]] if si == 0 else [V["region_markers"][region]]
        head = head[:length]
        content = length - len(head)
        # Units: lists of (tokens, fact_or_None) chunks; a cluster is one unit of several chunks.
        units = []
        nfacts = 0
        if region == "system":
            nfacts = int(rng.integers(4, 9))
            units += [[("fact", None)] for _ in range(nfacts)]
        elif region in ("tool_out", "retrieval"):
            if rng.random() < 0.9:
                n = int(rng.integers(2, 5))
                cl = []
                for f in range(n):
                    cl.append(("fact", None))
                    if f + 1 < n:
                        cl += [("filler", None)] * int(rng.integers(0, 4))
                units.append(cl)
        elif si == 1:  # the user's task
            units += [[("fact", None)] for _ in range(int(rng.integers(1, 3)))]
        elif rng.random() < 0.6:
            units.append([("fact", None)])
        if region in GENERATED:
            lo, hi = REREADS[kind][region]
            nr = int(rng.integers(lo, hi + 1))
            cand = [f for f in range(len(facts))]
            if cand and nr:
                age = np.array([first - last_ref[f] for f in cand], dtype=np.float64)
                w = np.array([0.5 ** (a / (REREAD_HALF_LIFE[facts[f]["region"]] * tier)) for f, a in zip(cand, age)])
                pick = rng.choice(len(cand), size=min(nr, len(cand)), replace=False, p=w / w.sum())
                units += [[("reread", cand[int(p)])] for p in pick]
        size = lambda u: sum(2 if k == "fact" else 3 if k == "reread" else 1 for k, _ in u)
        # Drop units that do not fit (re-reads first, then facts).
        rng.shuffle(units)
        units.sort(key=lambda u: 0 if u[0][0] == "fact" else 1)
        while units and sum(size(u) for u in units) > content:
            units.pop()
        if len(keys) < sum(1 for u in units for k, _ in u if k == "fact"):
            units = [u for u in units if u[0][0] == "reread"]
        rng.shuffle(units)
        nfill = content - sum(size(u) for u in units)
        slots = sorted(int(s) for s in rng.integers(0, nfill + 1, size=len(units)))
        # Emit.
        for t in head:
            tokens.append(t)
            boundary.append(True)
        ui = 0
        for fpos in range(nfill + 1):
            while ui < len(units) and slots[ui] == fpos:
                for k, arg in units[ui]:
                    p = len(tokens)
                    if k == "fact":
                        key, val = int(keys.pop()), value()
                        tokens += [key, val]
                        boundary += [True, False]
                        facts.append({"key": key, "answer": val, "region": region, "fact_first": p,
                                      "fact_length": 2, "planted_at": p + 2})
                        last_ref[len(facts) - 1] = p + 2
                    elif k == "reread":
                        f = facts[arg]
                        tokens += [V["query"], f["key"], f["answer"]]
                        boundary += [True, False, False]
                        rereads.append({"fact": arg, "at": p, "region": region})
                        last_ref[arg] = p + 3
                    else:
                        tokens.append(filler())
                        boundary.append(True)
                ui += 1
            if fpos < nfill:
                tokens.append(filler())
                boundary.append(True)
        assert len(tokens) == first + length, (region, length, len(tokens) - first)
        segments.append({"region": region, "first": first, "length": length, "generated": region in GENERATED})
    assert len(tokens) == tier
    boundary.append(True)  # position `tier`: the end of the episode
    return {"tokens": tokens, "segments": segments, "facts": facts, "boundary": boundary, "rereads": rereads}


def draw_probe_points(ep, rng, per_fact=1):
    """For each fact, `per_fact` probe points `at`, uniform over boundaries in [planted_at, len(tokens)]."""
    bpos = [i for i, b in enumerate(ep["boundary"]) if b]
    out = []
    for fi, f in enumerate(ep["facts"]):
        lo = bisect.bisect_left(bpos, f["planted_at"])
        for _ in range(per_fact):
            out.append((bpos[int(rng.integers(lo, len(bpos)))], fi))
    return out


def eval_episode(tier, seed, index):
    rng = np.random.default_rng([EVAL_STREAM, tier, seed, index])
    ep = generate_episode(tier, rng)
    probes = []
    for at, fi in sorted(draw_probe_points(ep, rng), key=lambda x: (x[0], x[1])):
        f = ep["facts"][fi]
        probes.append({"at": at, "key": f["key"], "answer": f["answer"], "region": f["region"],
                       "fact_first": f["fact_first"], "fact_length": f["fact_length"], "planted_at": f["planted_at"]})
    return {"tokens": ep["tokens"], "segments": ep["segments"], "probes": probes}


def eval_file(tier, seed, count):
    return {"format": "memdecay-episodes", "version": 1, "tier": tier, "seed": seed, "vocab_layout": VOCAB_LAYOUT,
            "episodes": [eval_episode(tier, seed, i) for i in range(count)]}


def training_sequence(tier, seed, index, probes_per_fact=2, length=None):
    """A training sequence: a fresh episode with probe triples `query key value` inserted inline at their probe
    points. Returns (tokens int64 [length], targets int64 [length]) where targets[i] is the token the model must
    predict at position i (the value after every `query key`), or -100. Cropped / padded to `length`."""
    rng = np.random.default_rng([TRAIN_STREAM, tier, seed, index])
    ep = generate_episode(tier, rng)
    pts = sorted(draw_probe_points(ep, rng, probes_per_fact))
    toks = ep["tokens"]
    out, pi = [], 0
    Q = VOCAB_LAYOUT["query"]
    for pos in range(len(toks) + 1):
        while pi < len(pts) and pts[pi][0] == pos:
            f = ep["facts"][pts[pi][1]]
            out += [Q, f["key"], f["answer"]]
            pi += 1
        if pos < len(toks):
            out.append(toks[pos])
    length = length or len(out)
    out = np.array(out[:length] + [VOCAB_LAYOUT["pad"]] * max(0, length - len(out)), dtype=np.int64)
    tgt = np.full(length, -100, dtype=np.int64)
    qpos = np.nonzero(out[:-2] == Q)[0]
    tgt[qpos + 1] = out[qpos + 2]
    return out, tgt


def main():
    ap = argparse.ArgumentParser(description="write the evaluation episode files")
    ap.add_argument("--out", default="models")
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--count", type=int, default=8)
    a = ap.parse_args()
    for tier in (450, 1700):
        data = eval_file(tier, a.seed, a.count)
        path = f"{a.out}/episodes-{tier}.json"
        with open(path, "w") as f:
            json.dump(data, f, separators=(",", ":"))
        n = sum(len(e["probes"]) for e in data["episodes"])
        by = {}
        for e in data["episodes"]:
            for p in e["probes"]:
                by[p["region"]] = by.get(p["region"], 0) + 1
        print(f"{path}: {len(data['episodes'])} episodes, {n} probes, per region {by}")


if __name__ == "__main__":
    main()
