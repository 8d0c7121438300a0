"""A LLaMA-architecture recall model: what llama.cpp's `llama` architecture runs (export_gguf.py writes it).

The bundled models (model.py) put a causal depthwise convolution before the attention projections; llama.cpp's
`llama` graph has none. This decoder is the plain LLaMA block, so the same weights run in PyTorch, in llama.cpp
and in memdecay-eval's engine (tools/eval/engine/tiny_lm.hpp with conv_kernel 0, gated MLP):

  x = embed[tok]
  for each layer:
    h = rmsnorm(x) * attn_norm
    q, k, v = h wq^T, h wk^T, h wv^T      n_heads query heads, n_kv_heads key/value heads (GQA), no bias
    q, k = rope(q), rope(k)                rotate-half pairs (i, i + hd/2) here; export_gguf.py permutes the rows
                                           of wq / wk for llama.cpp's adjacent pairs (as convert_hf_to_gguf does)
    x += softmax(q k^T / sqrt(hd) + causal) v  (query head j reads kv head j // (n_heads / n_kv_heads)) wo^T
    x += (silu(rmsnorm(x) * ffn_norm w_gate^T) * (rmsnorm(x) * ffn_norm w_up^T)) w_down^T
  logits = (rmsnorm(x) * norm_f) embed^T   (tied: the GGUF has no output.weight, llama.cpp reuses token_embd)

Without the convolution a value token learns its preceding key only through attention: layer 0 needs a
previous-token head and layer 1 an induction head (init_recall_circuit starts both near that circuit).
"""
import json
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import model as model_module
from model import apply_rope, rmsnorm, rope_tables, save_model  # noqa: F401 (save_model: shared)

SIZES = {
    "llama-small": dict(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=384),
    "llama-large": dict(d_model=192, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden=512),
}


def make_config(vocab, d_model, n_layers, n_heads, n_kv_heads, ffn_hidden, max_positions=2048):
    return {"arch": "llama", "vocab": vocab, "d_model": d_model, "n_layers": n_layers, "n_heads": n_heads,
            "n_kv_heads": n_kv_heads, "conv_kernel": 0, "mlp": "swiglu", "mlp_hidden": ffn_hidden,
            "rope_theta": 500000.0, "norm_eps": 1e-5, "max_positions": max_positions}


class LlamaLayer(nn.Module):
    def __init__(self, d, hd, H, KV, hidden):
        super().__init__()
        self.norm1 = nn.Parameter(torch.ones(d))
        self.wq = nn.Parameter(torch.empty(H * hd, d))
        self.wk = nn.Parameter(torch.empty(KV * hd, d))
        self.wv = nn.Parameter(torch.empty(KV * hd, d))
        self.wo = nn.Parameter(torch.empty(d, H * hd))
        self.norm2 = nn.Parameter(torch.ones(d))
        self.w_gate = nn.Parameter(torch.empty(hidden, d))
        self.w_up = nn.Parameter(torch.empty(hidden, d))
        self.w_down = nn.Parameter(torch.empty(d, hidden))


class LlamaLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = dict(config)
        c = self.config
        d, V, H, KV = c["d_model"], c["vocab"], c["n_heads"], c["n_kv_heads"]
        hd = d // H
        self.embed = nn.Parameter(torch.empty(V, d))
        self.layers = nn.ModuleList([LlamaLayer(d, hd, H, KV, c["mlp_hidden"]) for _ in range(c["n_layers"])])
        self.norm_f = nn.Parameter(torch.ones(d))
        cos, sin = rope_tables(c["max_positions"], hd, c["rope_theta"])
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_weights(self, seed):
        g = torch.Generator().manual_seed(seed)
        L2 = 2 * self.config["n_layers"]
        with torch.no_grad():
            self.embed.copy_(torch.randn(self.embed.shape, generator=g) * 0.02)
            for L in self.layers:
                for p in (L.wq, L.wk, L.wv, L.w_gate, L.w_up):
                    p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
                for p in (L.wo, L.w_down):
                    p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]) / math.sqrt(L2))

    def layer_kv(self, L, x, cos, sin):
        """The layer's normed input, and q, k, v ([B, heads, T, hd], RoPE applied) of x [B, T, d]."""
        c = self.config
        B, T, d = x.shape
        H, KV = c["n_heads"], c["n_kv_heads"]
        hd = d // H
        h = rmsnorm(x, L.norm1, c["norm_eps"])
        q = F.linear(h, L.wq).view(B, T, H, hd).transpose(1, 2)
        k = F.linear(h, L.wk).view(B, T, KV, hd).transpose(1, 2)
        v = F.linear(h, L.wv).view(B, T, KV, hd).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def mlp(self, L, x):
        h = rmsnorm(x, L.norm2, self.config["norm_eps"])
        return F.linear(F.silu(F.linear(h, L.w_gate)) * F.linear(h, L.w_up), L.w_down)

    def forward(self, tokens, return_attention=False, positions=None, hidden_only=False):
        c = self.config
        B, T = tokens.shape
        d, H, KV = c["d_model"], c["n_heads"], c["n_kv_heads"]
        hd, rep = d // H, H // KV
        if positions is None:
            cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        else:
            cos, sin = self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1)
        mask = torch.full((T, T), float("-inf")).triu(1)
        x = self.embed[tokens]
        attns = []
        for L in self.layers:
            q, k, v = self.layer_kv(L, x, cos, sin)
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1)
            if return_attention:
                attns.append(a.detach())
            x = x + F.linear((a @ v).transpose(1, 2).reshape(B, T, d), L.wo)
            x = x + self.mlp(L, x)
        h = rmsnorm(x, self.norm_f, c["norm_eps"])
        if hidden_only:
            return h
        logits = F.linear(h, self.embed)
        return (logits, attns) if return_attention else logits

    def named_tensors(self):
        return {n: p.detach().float().contiguous() for n, p in self.named_parameters()}


@torch.no_grad()
def probe_predictions(m, tokens, probes, query_token, hidden=None):
    """Greedy answers for probes [(at, key)] over `tokens`: each probe's `query key` at positions at, at + 1 over
    the prefix [0, at) of one full causal pass (the C++ protocol: probes forked from the live cache)."""
    c = m.config
    d, H, KV = c["d_model"], c["n_heads"], c["n_kv_heads"]
    hd, rep = d // H, H // KV
    N, P = len(tokens), len(probes)
    x = m.embed[torch.tensor(tokens)].unsqueeze(0)
    at = torch.tensor([p[0] for p in probes])
    xe = m.embed[torch.tensor([[query_token, p[1]] for p in probes])]  # [P, 2, d]
    pos_e = torch.stack([at, at + 1], 1)
    cos_e, sin_e = m.rope_cos[pos_e].unsqueeze(1), m.rope_sin[pos_e].unsqueeze(1)
    hide = torch.arange(N)[None, :] >= at[:, None]
    if hidden is not None:
        hide = hide | hidden
    causal = torch.full((N, N), float("-inf")).triu(1)
    for L in m.layers:
        q, k, v = m.layer_kv(L, x, m.rope_cos[:N], m.rope_sin[:N])
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        o = (torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + causal, -1) @ v).transpose(1, 2).reshape(1, N, d)
        qe, ke, ve = m.layer_kv(L, xe, cos_e, sin_e)
        ke, ve = ke.repeat_interleave(rep, 1), ve.repeat_interleave(rep, 1)
        sp = (qe @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(hide[:, None, None, :], float("-inf"))
        se = qe @ ke.transpose(-1, -2) / math.sqrt(hd) + torch.tensor([[0.0, float("-inf")], [0.0, 0.0]])
        a = torch.softmax(torch.cat([sp, se], -1), -1)
        oe = (a[..., :N] @ v + a[..., N:] @ ve).transpose(1, 2).reshape(P, 2, d)
        x = x + F.linear(o, L.wo)
        x = x + m.mlp(L, x)
        xe = xe + F.linear(oe, L.wo)
        xe = xe + m.mlp(L, xe)
    logits = F.linear(rmsnorm(xe[:, 1], m.norm_f, c["norm_eps"]), m.embed)
    return logits.argmax(-1).tolist()


def previous_token_weights(inv_freq, lengths=1760, pairs=None):
    """Weights w_i of rotary pairs for a head whose score sum_i w_i cos((s + 1 - t) theta_i) peaks at s = t - 1:
    the high-frequency pairs tell neighbours apart, the rest keep far positions from lining up again. Returns
    (weights, margin): the margin is the score at distance 1 less the best score at any other distance."""
    pairs = pairs if pairs is not None else list(range(len(inv_freq)))
    delta = np.arange(-lengths, 2, dtype=np.float64)  # s + 1 - t for s <= t
    best = None
    for n in range(1, len(pairs) + 1):
        w = np.zeros(len(inv_freq))
        w[pairs[:n]] = 1.0
        f = (w[None, :] * np.cos(delta[:, None] * inv_freq[None, :])).sum(1)
        at0 = f[delta == 0][0]
        margin = (at0 - f[delta != 0].max()) / w.sum()
        if best is None or margin > best[1]:
            best = (w, margin)
    return best


def init_recall_circuit(m, seed, prev_scale=9.0, induction_scale=3.0):
    """Starts layers 0 and 1 near a previous-token + induction circuit (training takes it from there).

    Embedding channels: A = [0, a) token identity, B = [a, 2a) empty (the previous token's slot), C = the last
    channels, one constant shared by every token (after RMSNorm a constant input the positional head reads).
    Layer 0: every head's q and k read C into the rotary pairs of previous_token_weights, k turned one position
    ahead, so the score peaks at the previous token; v reads A through an orthonormal split over the kv heads and
    wo writes it into B. Layer 1: q reads A and k reads B through one random map into the low-frequency pairs
    (those that turn by under a radian over 1,760 tokens), so `key` at a probe matches the value that followed an
    earlier `key`; v reads A and wo writes it back into A (the tied output then favours the value)."""
    c = m.config
    d, H, KV = c["d_model"], c["n_heads"], c["n_kv_heads"]
    hd, half_hd, rep = d // H, d // H // 2, H // KV
    if c["n_layers"] < 2:
        raise ValueError("the recall circuit needs two layers")
    n_const = 8
    a = (d - n_const) // 2
    A, Bs, C = slice(0, a), slice(a, 2 * a), slice(2 * a, d)
    g = torch.Generator().manual_seed(seed + 99)
    inv = c["rope_theta"] ** (-2.0 * np.arange(half_hd) / hd)
    w_prev, margin = previous_token_weights(inv, pairs=list(range(half_hd)))
    low = [i for i in range(half_hd) if inv[i] * 1760 < 1.0]
    with torch.no_grad():
        e = torch.randn(c["vocab"], a, generator=g)
        e = e / e.norm(dim=1, keepdim=True) * math.sqrt(a)  # equal norms: RMSNorm keeps C constant
        m.embed.zero_()
        m.embed[:, A] = e * 0.1
        m.embed[:, Bs] = torch.randn(c["vocab"], a, generator=g) * 0.002
        m.embed[:, C] = 0.1
        # Layer 0: previous-token heads.
        L = m.layers[0]
        L.wq.zero_(), L.wk.zero_(), L.wv.zero_(), L.wo.zero_()
        cn = 1.0 / n_const  # C reads as ~sqrt(d / (a + n_const)) per channel after RMSNorm; sum over C
        for j in range(H):
            for i in np.nonzero(w_prev)[0]:
                L.wq[j * hd + i, C] = prev_scale * cn * math.sqrt(w_prev[i])
        for kvh in range(KV):
            for i in np.nonzero(w_prev)[0]:
                s = prev_scale * cn * math.sqrt(w_prev[i])
                L.wk[kvh * hd + i, C] = s * math.cos(inv[i])
                L.wk[kvh * hd + i + half_hd, C] = s * math.sin(inv[i])
        Q, _ = torch.linalg.qr(torch.randn(KV * hd, a, generator=g))  # [KV hd, a], orthonormal columns
        for kvh in range(KV):
            L.wv[kvh * hd:(kvh + 1) * hd, A] = Q[kvh * hd:(kvh + 1) * hd]
        for j in range(H):
            kvh = j // rep
            # The normed input reads ~1 per channel, the embedding's A ~0.1: write B at the embedding's scale.
            L.wo[Bs, j * hd:(j + 1) * hd] = Q[kvh * hd:(kvh + 1) * hd].t() / rep * 0.07
        # Layer 1: induction heads.
        L = m.layers[1]
        L.wq.zero_(), L.wk.zero_(), L.wv.zero_(), L.wo.zero_()
        S = low + [i + half_hd for i in low]
        for kvh in range(KV):
            R = torch.randn(len(S), a, generator=g) / math.sqrt(a) * induction_scale
            for j in range(kvh * rep, (kvh + 1) * rep):
                L.wq[[j * hd + s for s in S], A] = R
            L.wk[[kvh * hd + s for s in S], Bs] = R
        Q2, _ = torch.linalg.qr(torch.randn(KV * hd, a, generator=g))
        for kvh in range(KV):
            L.wv[kvh * hd:(kvh + 1) * hd, A] = Q2[kvh * hd:(kvh + 1) * hd]
        for j in range(H):
            kvh = j // rep
            L.wo[A, j * hd:(j + 1) * hd] = Q2[kvh * hd:(kvh + 1) * hd].t() / rep
        for L in m.layers[:2]:
            L.w_down.mul_(0.1)
    return {"previous_token_pairs": [int(i) for i in np.nonzero(w_prev)[0]], "margin": float(margin),
            "low_pairs": low}


def load_model(path):
    return model_module.load_model(path, LlamaLM)
