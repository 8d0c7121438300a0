"""Seeded synthetic agent episodes in the token grammar of the issue-8 contract (sections 2 and 3).

Structure mirrors include/memdecay/io/trace_generator.hpp: a system prompt, the user's task, a plan, then actions
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

The need-aligned family (`--family need-aligned`, `models/episodes-need-{450,1700}.json`) keeps the segment plan,
the vocabulary and the unit grammar, but gives every region its own future need, as real agent contexts do: every
fact is referenced after intervals drawn from its region's lifetime profile, and its held-out probe is one more
reference drawn from the same profile (see generate_need_aligned_episode). The control family above (probe times
independent of the region) stays the region-agnostic control.

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
NEED_STREAM = 0x4EED
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


# ------------------------------------------------------------------------------------------------------------------
# The need-aligned family
# ------------------------------------------------------------------------------------------------------------------

# Half-life, in evaluation steps, of the interval between two references of a fact of each region (its planting
# or a re-read, to the next re-read or its probe): exponential intervals, so the hazard of the next need decays as
# MemDecay's b_r exp(-lambda_r dt) assumes. The order is the paper's premise (scratchpad and tool inputs needed
# only shortly after they are written, tool outputs soon after the call, user turns for a while, plans and
# retrieved documents for long, the system prompt throughout); the numbers are deliberately not the library's
# default half-lives, so a policy does not win by sharing the generator's constants.
REGION_HALF_LIFE_STEPS = {"system": 400.0, "plan": 200.0, "retrieval": 150.0, "user": 60.0, "tool_out": 30.0,
                          "tool_in": 12.0, "scratchpad": 8.0}
# After each reference a fact is referenced again inline with this probability; otherwise its next reference is
# its (held-out) probe. So a fact has on average one inline re-read before its probe.
CONTINUE_PROBABILITY = 0.5
# Independent draws of a fact's held-out next reference (each one probe; probes never enter the episode, so several
# draws of the same need only add statistical power). Equal times collapse into one probe.
PROBES_PER_FACT = 3
# The facts of the user's task are the long-range anchors: never re-read, asked once at the very end of the
# episode (the long-tier collapse of recency policies that the paper reports).
EVAL_PREFILL_CHUNK = 32  # the step clock above: memdecay-eval's default --prefill-chunk


def step_clock(segments, prefill_chunk=EVAL_PREFILL_CHUNK):
    """Per position (and one past the end), the evaluation step that processes it: prefilled segments in chunks of
    `prefill_chunk` tokens from the segment's start, generated ones one token per step. Also the end position of
    every step."""
    step_of, step_end = [], []
    for seg in segments:
        chunk = 1 if seg["generated"] else prefill_chunk
        for off in range(0, seg["length"], chunk):
            n = min(chunk, seg["length"] - off)
            step_of += [len(step_end)] * n
            step_end.append(seg["first"] + off + n)
    return step_of, step_end


def generate_need_aligned_episode(tier, rng):
    """One need-aligned episode of exactly `tier` tokens.

    Every fact (planted as in the control family: 4-8 in the system prompt, clusters in tool outputs and retrieved
    documents, single facts in short turns) draws a chain of references: after its planting and after each inline
    re-read, the interval to its next reference is exponential with its region's half-life
    (REGION_HALF_LIFE_STEPS, in steps of the evaluation's clock); the next reference is an inline re-read
    (`query key value`, in whatever segment is running then, except the system prompt) with probability
    CONTINUE_PROBABILITY, else the fact's held-out probe. A reference that falls after the episode's last step is
    dropped (the need lies beyond the episode). A re-read that finds its segment full waits for the next free
    position (counted in `delayed`). The user's task facts are anchors: no re-reads, one probe at the very end.
    """
    V = VOCAB_LAYOUT
    kind = "long" if tier >= 1000 else "short"
    shape = SHAPES[kind]
    plan = _plan_segments(tier, rng, shape)
    segments, first = [], 0
    for region, length in plan:
        segments.append({"region": region, "first": first, "length": length, "generated": region in GENERATED})
        first += length
    step_of, step_end = step_clock(segments)
    last_step = len(step_end) - 1
    keys = list(rng.permutation(V["key_count"]) + V["key_first"])
    filler = lambda: int(V["filler_first"] + rng.integers(V["filler_count"]))
    value = lambda: int(V["value_first"] + rng.integers(V["value_count"]))
    interval = lambda region: float(rng.exponential(REGION_HALF_LIFE_STEPS[region] / np.log(2.0)))

    tokens, boundary, facts, rereads = [], [], [], []
    due = []  # (step the re-read is due, fact index): pending inline re-reads
    probe_due = {}  # fact index -> step after which its probe is asked
    delayed = 0

    def schedule_next(fi, ref_step):
        f = facts[fi]
        if f["anchor"]:
            return
        t = ref_step + interval(f["region"])
        if t > last_step:
            return
        if rng.random() < CONTINUE_PROBABILITY:
            due.append((t, fi))
            due.sort()
        else:  # the held-out next reference, drawn PROBES_PER_FACT times (probes are side queries: independent)
            probe_due[fi] = (ref_step, sorted({int(np.ceil(t))} | {int(np.ceil(ref_step + interval(f["region"])))
                                                                   for _ in range(PROBES_PER_FACT - 1)}))

    for si, seg in enumerate(segments):
        region, length, first = seg["region"], seg["length"], seg["first"]
        head = [V["bos"], V["region_markers"][region]] if si == 0 else [V["region_markers"][region]]
        head = head[:length]
        for t in head:
            tokens.append(t)
            boundary.append(True)
        # This segment's facts, as in the control family, at random content offsets (shifted past re-reads).
        if region == "system":
            nfacts = int(rng.integers(4, 9))
        elif region in ("tool_out", "retrieval"):
            nfacts = int(rng.integers(2, 5)) if rng.random() < 0.9 else 0
        elif si == 1:
            nfacts = int(rng.integers(1, 3))
        else:
            nfacts = 1 if rng.random() < 0.6 else 0
        content = length - len(head)
        nfacts = min(nfacts, content // 2, len(keys))
        if region in ("tool_out", "retrieval") and nfacts:  # one dense cluster, as in the control family
            span = 2 * nfacts + 3 * (nfacts - 1)
            start = int(rng.integers(0, max(1, content - span) + 1))
            plant = sorted(min(content - 2, start + k * (2 + int(rng.integers(0, 4)))) for k in range(nfacts))
        else:
            plant = sorted(int(x) for x in rng.choice(max(1, content - 1), size=nfacts, replace=False)) if nfacts else []
        end = first + length
        pi = 0
        while len(tokens) < end:
            p = len(tokens)
            room = end - p
            off = p - first
            if region != "system" and due and due[0][0] <= step_of[p] and room >= 3:
                t, fi = due.pop(0)
                if step_of[p] > np.ceil(t):
                    delayed += 1
                f = facts[fi]
                tokens += [V["query"], f["key"], f["answer"]]
                boundary += [True, False, False]
                rereads.append({"fact": fi, "at": p, "region": region, "fact_region": f["region"]})
                schedule_next(fi, step_of[p + 2])
                continue
            if pi < len(plant) and plant[pi] <= off and room >= 2:
                pi += 1
                key, val = int(keys.pop()), value()
                tokens += [key, val]
                boundary += [True, False]
                fi = len(facts)
                facts.append({"key": key, "answer": val, "region": region, "fact_first": p, "fact_length": 2,
                              "planted_at": p + 2, "anchor": si == 1})
                schedule_next(fi, step_of[p + 1])
                continue
            tokens.append(filler())
            boundary.append(True)
    assert len(tokens) == tier
    boundary.append(True)
    delayed += len(due)  # re-reads still pending at the end never happened (their region's segments were full)
    # Probes: after the step each is due, at the first step end that is also a unit boundary (never inside a fact
    # or a re-read), so a probe never splits a step of the evaluation's clock.
    ends = [e for e in step_end if boundary[e]]
    probes = []
    for fi, f in enumerate(facts):
        planted = step_of[f["planted_at"] - 1]
        if f["anchor"]:
            asks, last_ref = [tier], planted
        elif fi in probe_due:
            last_ref, when = probe_due[fi]
            asks = sorted({ends[k] for k in (bisect.bisect_left(ends, step_end[t]) for t in when if t <= last_step)
                           if k < len(ends)})
        else:
            continue
        for at in asks:
            probes.append({"at": at, "key": f["key"], "answer": f["answer"], "region": f["region"],
                           "fact_first": f["fact_first"], "fact_length": 2, "planted_at": f["planted_at"],
                           "age_steps": step_of[at - 1] - planted,
                           "since_reference_steps": step_of[at - 1] - int(last_ref)})
    probes.sort(key=lambda q: (q["at"], q["fact_first"]))
    return {"tokens": tokens, "segments": segments, "probes": probes, "rereads": rereads, "delayed_rereads": delayed,
            "steps": len(step_end)}


def need_aligned_episode(tier, seed, index):
    rng = np.random.default_rng([NEED_STREAM, tier, seed, index])
    ep = generate_need_aligned_episode(tier, rng)
    return {"tokens": ep["tokens"], "segments": ep["segments"], "probes": ep["probes"],
            "rereads": [{"at": r["at"], "region": r["region"], "fact_region": r["fact_region"]} for r in ep["rereads"]],
            "steps": ep["steps"], "delayed_rereads": ep["delayed_rereads"]}


def need_aligned_file(tier, seed, count):
    return {"format": "memdecay-episodes", "version": 1, "tier": tier, "seed": seed, "family": "need-aligned",
            "region_half_life_steps": REGION_HALF_LIFE_STEPS, "continue_probability": CONTINUE_PROBABILITY,
            "prefill_chunk": EVAL_PREFILL_CHUNK, "vocab_layout": VOCAB_LAYOUT,
            "episodes": [need_aligned_episode(tier, seed, i) for i in range(count)]}


def describe(data):
    """Probes and probe ages (steps since the fact's last reference) per region: the profile of a file."""
    by = {}
    for e in data["episodes"]:
        for p in e["probes"]:
            by.setdefault(p["region"], []).append(p.get("since_reference_steps", -1))
    out = []
    for r in sorted(by, key=lambda r: list(VOCAB_LAYOUT["region_markers"]).index(r)):
        a = np.array(by[r])
        out.append(f"{r} {len(a)} (steps since the last reference: median {np.median(a):.0f}, p90 {np.percentile(a, 90):.0f})" if a.min() >= 0
                   else f"{r} {len(a)}")
    return ", ".join(out)


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
    ap.add_argument("--tiers", default="450,1700", help="comma-separated context tiers")
    ap.add_argument("--family", choices=["control", "need-aligned", "both"], default="both",
                    help="control: episodes-<tier>.json (probe times independent of the region); need-aligned: "
                         "episodes-need-<tier>.json (probes drawn from each region's lifetime profile)")
    a = ap.parse_args()
    for family in (["control", "need-aligned"] if a.family == "both" else [a.family]):
        for tier in (int(t) for t in a.tiers.split(",")):
            if family == "control":
                data, path = eval_file(tier, a.seed, a.count), f"{a.out}/episodes-{tier}.json"
            else:
                data, path = need_aligned_file(tier, a.seed, a.count), f"{a.out}/episodes-need-{tier}.json"
            with open(path, "w") as f:
                json.dump(data, f, separators=(",", ":"))
            n = sum(len(e["probes"]) for e in data["episodes"])
            print(f"{path}: {len(data['episodes'])} episodes, {n} probes: {describe(data)}")

if __name__ == "__main__":
    main()
