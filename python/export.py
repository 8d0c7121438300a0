"""Export a model's weights (safetensors, contract section 1) and its logits fixture.

  /usr/bin/python3 python/export.py --random tiny --out models/fixtures/random-tiny.safetensors \
      --fixture models/fixtures/logits-random-tiny.json
  /usr/bin/python3 python/export.py --model models/small/model.safetensors --probe \
      --fixture models/fixtures/logits-small.json --long-fixture models/fixtures/logits-small-long.json

The fixture: {"tokens": [64 ints], "logits": [[V floats] x 64], "attention_layer0_head0_last": [64 floats]},
a full causal float32 forward (no cache) of the first 64 tokens of episode 0 of models/episodes-450.json
(or of --episodes); with --probe the first 62 tokens then [query, key] of the latest fact planted in them.
"attention_layer0_head0_last" is layer 0, head 0's attention row of the last position.
The long fixture: {"tokens": [episode 0 of episodes-1700.json + query, key] (1702 tokens),
"logits_last_positions": [the last 4 indices], "logits_last": [[V floats] x 4], "answer", "predicted"}.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import episodes  # noqa: E402
import model as M  # noqa: E402


def fixture_tokens(path, n=64, episode=0, probe=False):
    """The first n tokens of an episode; with probe=True the first n-2 tokens followed by [query, key] of the
    latest fact planted within them, so the last logits row answers a recall probe."""
    if os.path.exists(path):
        with open(path) as f:
            ep = json.load(f)["episodes"][episode]
    else:
        ep = episodes.eval_episode(450, 1000, episode)
    if not probe:
        return ep["tokens"][:n]
    facts = sorted((p for p in ep["probes"] if p["planted_at"] <= n - 2), key=lambda p: p["planted_at"])
    p = facts[-1]
    return ep["tokens"][:n - 2] + [episodes.VOCAB_LAYOUT["query"], p["key"]]


def write_long_fixture(m, episodes_file, path, episode=0, last=4):
    """A long-context check: a whole episode of the file (tier tokens) followed by [query, key] of its earliest
    fact; stores the logits of the last `last` positions only (the full table would be megabytes)."""
    with open(episodes_file) as f:
        ep = json.load(f)["episodes"][episode]
    p = min(ep["probes"], key=lambda p: p["planted_at"])
    toks = ep["tokens"] + [episodes.VOCAB_LAYOUT["query"], p["key"]]
    with torch.no_grad():
        logits = m(torch.tensor([toks], dtype=torch.long))[0]
    data = {"tokens": toks, "logits_last_positions": list(range(len(toks) - last, len(toks))),
            "logits_last": [[float(f"{v:.9g}") for v in row] for row in logits[-last:].tolist()],
            "answer": p["answer"], "predicted": int(logits[-1].argmax())}
    with open(path, "w") as f:
        json.dump(data, f, separators=(",", ":"))


def write_fixture(m, tokens, path):
    with torch.no_grad():
        logits, attns = m(torch.tensor([tokens], dtype=torch.long), return_attention=True)
    data = {"tokens": [int(t) for t in tokens],
            "logits": [[float(f"{v:.9g}") for v in row] for row in logits[0].tolist()],
            "attention_layer0_head0_last": [float(f"{v:.9g}") for v in attns[0][0, 0, -1].tolist()]}
    with open(path, "w") as f:
        json.dump(data, f, separators=(",", ":"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--random", choices=sorted(M.SIZES), help="write a random-init model of this size")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--model", help="an existing safetensors model (for --fixture)")
    ap.add_argument("--out", help="where to write the random-init model")
    ap.add_argument("--name", default=None)
    ap.add_argument("--fixture", help="where to write the logits fixture")
    ap.add_argument("--episodes", default="models/episodes-450.json")
    ap.add_argument("--probe", action="store_true", help="end the fixture tokens with [query, key] of a fact")
    ap.add_argument("--long-fixture", help="also write the long-context fixture here (1700-token episode)")
    ap.add_argument("--long-episodes", default="models/episodes-1700.json")
    a = ap.parse_args()
    if a.random:
        torch.manual_seed(a.seed)
        m = M.TinyLM(M.make_config(episodes.VOCAB_SIZE, **M.SIZES[a.random]))
        m.init_weights(a.seed)
        # Random-init norms/biases/conv too, so the fixture exercises every parameter.
        g = torch.Generator().manual_seed(a.seed + 1)
        with torch.no_grad():
            for n, p in m.named_parameters():
                if "norm" in n:
                    p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
                elif n.endswith(("b1", "b2", "conv_bias")):
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
            m.embed.mul_(10.0)  # larger logits, a sharper test
        m.eval()
        M.save_model(m, a.out, episodes.VOCAB_LAYOUT, a.name or ("random-" + a.random))
        m, _, _ = M.load_model(a.out)  # fixture from the round-tripped weights
    else:
        m, _, _ = M.load_model(a.model)
    if a.fixture:
        write_fixture(m, fixture_tokens(a.episodes, probe=a.probe), a.fixture)
    if a.long_fixture:
        write_long_fixture(m, a.long_episodes, a.long_fixture)


if __name__ == "__main__":
    main()
