# SPDX-License-Identifier: Apache-2.0
"""memdecay from PyTorch: the bundled small model (python/model.py) decodes agent episodes with a paged KV cache
whose pages memdecay evicts, in the shape of a kvpress press or a Hugging Face cache hook.

`PagedCache` is the engine's cache: per layer, the K (RoPE applied at each token's absolute position) and V of
the resident tokens, in page order, plus the convolution state (the last k-1 normed inputs, which eviction never
touches). Its pages belong to a `memdecay.BlockPool`. `MemDecayPress` is the hook: after each forward it gets
the layers' attention over the resident tokens, feeds it to a `memdecay.Sequence`, and when the cache is over
its budget selects victims and removes them from the pool and from the cache tensors together.

The protocol is memdecay-eval's (docs/eval.md), so the recall this prints for an episode file, a policy and a
budget is memdecay-eval's for the same ones (python/tests/test_torch_example.py checks it):

  * each episode is cut into steps: prefilled segments 32 tokens at a time, generated ones one token at a time,
    never across a segment boundary or a probe;
  * a step labels its tokens, runs them through the model over the resident cache, observes the attention summed
    over layers (each layer's row: the probability over heads and the step's queries, divided by heads x
    queries), advances the clock, and evicts down to the budget when over it;
  * after the step where a probe is due, the model is asked [query, key] over the resident cache (without
    changing it); the probe is recalled when the greedy next token is its answer.

  /usr/bin/python3 python/examples/paged_eviction.py --policy h2o --budget 0.25 --episodes 4
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.append(os.path.dirname(HERE))  # python/: model.py (after the installed or built memdecay package)
import model as M  # noqa: E402

import memdecay  # noqa: E402

# memdecay-eval's policies by name: the library policy, its parameters, and the config changes its row makes
# (tools/common/policy_catalogue.hpp; docs/policies.md states each beside its source).
POLICIES = {
    "memdecay-none": ("memdecay", {}, dict(normalization="none", alpha=1.0, tau=0.01)),
    "memdecay-uniform": ("memdecay", {}, dict(normalization="uniform", alpha=1.0, tau=2.0)),
    "memdecay-lifetime": ("memdecay", {}, dict(normalization="lifetime", alpha=1.0, tau=2.0)),
    "memdecay-zscore": ("memdecay", {}, dict(normalization="zscore", alpha=0.5, tau=2.0)),
    "h2o": ("h2o", dict(recent_tokens=0, recent_fraction=0.5), {}),
    "tova": ("tova", {}, {}),
    "streaming_llm": ("streaming_llm", dict(sink_tokens=4), {}),
    "random": ("random", {}, {}),
}
REGIONS = ["system", "plan", "user", "tool_in", "tool_out", "retrieval", "scratchpad"]


class PagedCache:
    """The resident K/V of one sequence, per layer, in page order, with the pool that owns its pages."""

    def __init__(self, model, page_size, max_tokens):
        c = model.config
        self.model, self.page_size = model, page_size
        self.d, self.H, self.k = c["d_model"], c["n_heads"], c["conv_kernel"]
        self.hd = self.d // self.H
        n_layers = c["n_layers"]
        self.keys = [torch.zeros(0, self.H, self.hd) for _ in range(n_layers)]    # [resident, H, hd] each
        self.values = [torch.zeros(0, self.H, self.hd) for _ in range(n_layers)]
        self.conv_state = [torch.zeros(self.k - 1, self.d) for _ in range(n_layers)]
        self.positions = torch.zeros(0, dtype=torch.long)
        self.appended = 0
        self.pool = memdecay.BlockPool(num_blocks=-(-max_tokens // page_size) + 1, page_size=page_size)
        self.pool.open(0)

    @property
    def resident(self):
        return int(self.positions.numel())

    @torch.no_grad()
    def forward(self, tokens, write):
        """Runs `tokens` at the next absolute positions over the resident cache. Returns the last token's logits
        and each layer's attention mass over resident + new tokens. write: keep the new K/V (a decode step) or
        not (a probe)."""
        m, eps = self.model, self.model.config["norm_eps"]
        n, H, hd, d, k = len(tokens), self.H, self.hd, self.d, self.k
        pos = torch.arange(self.appended, self.appended + n)
        cos, sin = m.rope_cos[pos], m.rope_sin[pos]
        x = m.embed[torch.tensor(tokens)]                                           # [n, d]
        causal = torch.full((n, n), float("-inf")).triu(1)
        masses = []
        new_state = []
        for li, L in enumerate(m.layers):
            h = M.rmsnorm(x, L.norm1, eps)
            seq = torch.cat([self.conv_state[li], h], 0)                           # [k-1+n, d]
            cv = F.conv1d(seq.t().unsqueeze(0), L.conv_weight.unsqueeze(1), L.conv_bias, groups=d)[0].t()
            new_state.append(seq[-(k - 1):].clone())
            q = F.linear(cv, L.wq).view(n, H, hd).transpose(0, 1)                  # [H, n, hd]
            kk = F.linear(cv, L.wk).view(n, H, hd).transpose(0, 1)
            v = F.linear(cv, L.wv).view(n, H, hd).transpose(0, 1)
            q, kk = M.apply_rope(q, cos, sin), M.apply_rope(kk, cos, sin)
            K = torch.cat([self.keys[li].transpose(0, 1), kk], 1)                  # [H, r+n, hd]
            V = torch.cat([self.values[li].transpose(0, 1), v], 1)
            s = q @ K.transpose(-1, -2) / math.sqrt(hd)
            s[:, :, self.resident:] += causal
            a = torch.softmax(s, -1)                                                # [H, n, r+n]
            masses.append(a.sum((0, 1)) / (H * n))
            x = x + F.linear((a @ V).transpose(0, 1).reshape(n, d), L.wo)
            x = x + F.linear(F.gelu(F.linear(M.rmsnorm(x, L.norm2, eps), L.w1, L.b1)), L.w2, L.b2)
            if write:
                self.keys[li] = K.transpose(0, 1).contiguous()
                self.values[li] = V.transpose(0, 1).contiguous()
        if write:
            self.conv_state = new_state
            self.positions = torch.cat([self.positions, pos])
            self.appended += n
            self.pool.append_tokens(0, n)
        logits = F.linear(M.rmsnorm(x[-1], m.norm_f, eps), m.embed)
        return logits, masses

    def answer(self, prompt):
        """The greedy next token after `prompt` over the resident cache; the cache is unchanged."""
        logits, _ = self.forward(prompt, write=False)
        return int(logits.argmax())

    def drop_pages(self, pages):
        """Removes logical pages from the tensors (the pool was told by the commit)."""
        P = self.page_size
        keep = torch.ones(self.resident, dtype=torch.bool)
        for p in map(int, pages):
            keep[p * P:(p + 1) * P] = False
        self.keys = [t[keep] for t in self.keys]
        self.values = [t[keep] for t in self.values]
        self.positions = self.positions[keep]


class MemDecayPress:
    """The hook (kvpress's press, a Hugging Face cache hook): labels what the engine appends, observes the
    attention of every forward, and evicts pages from the cache when it is over the budget."""

    def __init__(self, policy, budget_tokens, page_size=16, recent_tokens=16):
        name, params, changes = POLICIES[policy]
        config = memdecay.Config(page_size=page_size, budget=memdecay.Budget.tokens(budget_tokens),
                                 protection=memdecay.Protection(recent_tokens=recent_tokens), **changes)
        self.seq = memdecay.Sequence(config, policy=name, **params)
        self.evicted_pages = 0

    def on_append(self, region, count):
        self.seq.append(region, count)

    def after_forward(self, cache, layer_masses, step):
        mass = torch.stack(layer_masses).sum(0).numpy().astype(np.float32)  # summed over layers
        self.seq.observe_tokens(mass)
        self.seq.advance_to(step)
        if self.seq.kv_len > self.seq.config.budget.high:
            plan = self.seq.select_for_budget()
            if len(plan):
                self.seq.commit(plan, cache.pool, 0)   # the pool and memdecay's state, together
                cache.drop_pages(plan.pages)           # the K/V tensors, the same pages
                self.evicted_pages += len(plan)
        assert cache.resident == self.seq.kv_len
        assert np.array_equal(cache.positions.numpy(), self.seq.positions())


def schedule(ep, prefill_chunk):
    """memdecay-eval's steps (tools/eval/run_types.hpp make_schedule): (region, first, count, probes after)."""
    probes = sorted(range(len(ep["probes"])), key=lambda i: ep["probes"][i]["at"])
    steps, nxt = [], 0
    for seg in ep["segments"]:
        chunk = 1 if seg["generated"] else prefill_chunk
        pos, end = seg["first"], seg["first"] + seg["length"]
        while pos < end:
            n = min(chunk, end - pos)
            while nxt < len(probes) and ep["probes"][probes[nxt]]["at"] <= pos:
                nxt += 1
            if nxt < len(probes) and ep["probes"][probes[nxt]]["at"] < pos + n:
                n = ep["probes"][probes[nxt]]["at"] - pos
            after = []
            j = nxt
            while j < len(probes) and ep["probes"][probes[j]]["at"] == pos + n:
                after.append(probes[j])
                j += 1
            steps.append((seg["region"], pos, n, after))
            pos += n
    return steps


def run_episode(model, ep, query, policy, budget_fraction, page_size=16, prefill_chunk=32):
    """Per probe: recalled (bool), under `policy` at floor(budget_fraction x tokens); policy None: full cache."""
    n = len(ep["tokens"])
    budget = math.floor(budget_fraction * n)
    cache = PagedCache(model, page_size, n)
    press = MemDecayPress(policy, budget, page_size) if policy else None
    recalled = [False] * len(ep["probes"])
    for i, (region, first, count, after) in enumerate(schedule(ep, prefill_chunk)):
        if press:
            press.on_append(region, count)
        _, masses = cache.forward(ep["tokens"][first:first + count], write=True)
        if press:
            press.after_forward(cache, masses, i + 1)
        for k in after:
            p = ep["probes"][k]
            recalled[k] = cache.answer([query, p["key"]]) == p["answer"]
    return recalled, (press.evicted_pages if press else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models/small/model.safetensors"))
    ap.add_argument("--episodes-file", default=os.path.join(ROOT, "models/episodes-need-450.json"))
    ap.add_argument("--episodes", type=int, default=0, help="the first N episodes (0: all)")
    ap.add_argument("--policy", default="memdecay-none", choices=sorted(POLICIES))
    ap.add_argument("--budget", type=float, default=0.25)
    ap.add_argument("--json", help="write per-region counts here")
    a = ap.parse_args()
    torch.set_num_threads(1)
    model, _, name = M.load_model(a.model)
    data = json.load(open(a.episodes_file))
    episodes = data["episodes"][: a.episodes or None]
    query = data["vocab_layout"]["query"]
    counts = {r: [0, 0, 0] for r in REGIONS}  # recalled, full cache, probes
    evicted = 0
    for ep in episodes:
        got, pages = run_episode(model, ep, query, a.policy, a.budget, prefill_chunk=data["prefill_chunk"])
        full, _ = run_episode(model, ep, query, None, 1.0, prefill_chunk=data["prefill_chunk"])
        evicted += pages
        for p, ok, ceil in zip(ep["probes"], got, full):
            c = counts[p["region"]]
            c[0] += ok
            c[1] += ceil
            c[2] += 1
    total = [sum(c[i] for c in counts.values()) for i in range(3)]
    print(f"{name}, {len(episodes)} episodes of {os.path.basename(a.episodes_file)}, {a.policy} at "
          f"{a.budget:g} of each episode's tokens, pages of 16: {evicted} pages evicted")
    print(f"recall {total[0]}/{total[2]} ({100 * total[0] / max(1, total[2]):.1f}%), full cache {total[1]}/{total[2]}")
    for r in REGIONS:
        if counts[r][2]:
            print(f"  {r:<11} {counts[r][0]}/{counts[r][2]}   full cache {counts[r][1]}/{counts[r][2]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"policy": a.policy, "budget": a.budget, "episodes": len(episodes),
                       "regions": {r: dict(recalled=c[0], ceiling=c[1], probes=c[2]) for r, c in counts.items()}},
                      f, indent=1)


if __name__ == "__main__":
    main()
