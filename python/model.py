"""The tiny decoder of the issue-8 contract (section 5); tools/eval/engine reproduces it in C++.

Pre-norm decoder, tied embeddings, RoPE (rotate-half / NeoX), a causal depthwise convolution (kernel 3) on the
normed input before the attention projections, exact-erf GELU MLP, no dropout. Parameter names and shapes:

  embed [V, d]
  layers.{l}.norm1 [d]        layers.{l}.conv_weight [d, k]   layers.{l}.conv_bias [d]
  layers.{l}.wq, wk, wv, wo [d, d] (torch Linear layout [out, in], no bias)
  layers.{l}.norm2 [d]        layers.{l}.w1 [4d, d]  layers.{l}.b1 [4d]  layers.{l}.w2 [d, 4d]  layers.{l}.b2 [d]
  norm_f [d]

Forward (per layer):
  h  = rmsnorm(x) * norm1                        rmsnorm(v) = v / sqrt(mean(v^2) + eps)
  c_t = conv_bias + sum_{j<k} conv_weight[:, j] * h_{t-(k-1)+j}   (zero before position 0)
  q, k, v = c wq^T, c wk^T, c wv^T ; q, k = rope(q), rope(k) per head at absolute positions
  x += softmax(q k^T / sqrt(hd) + causal) v  (heads merged) wo^T
  x += gelu_erf(rmsnorm(x) * norm2 w1^T + b1) w2^T + b2
logits = (rmsnorm(x) * norm_f) embed^T

RoPE: head_dim hd = d / H; for i < hd/2, angle = pos * theta^(-2i/hd) computed in float64, cos/sin rounded to
float32; pairs (i, i + hd/2): out_i = x_i cos - x_{i+hd/2} sin, out_{i+hd/2} = x_{i+hd/2} cos + x_i sin.
"""
import json
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

SIZES = {
    "tiny": dict(d_model=64, n_layers=2, n_heads=4),
    "small": dict(d_model=128, n_layers=2, n_heads=4),
    "large": dict(d_model=192, n_layers=4, n_heads=4),
}


def make_config(vocab, d_model, n_layers, n_heads, conv_kernel=3, max_positions=2048):
    return {"vocab": vocab, "d_model": d_model, "n_layers": n_layers, "n_heads": n_heads,
            "conv_kernel": conv_kernel, "mlp_hidden": 4 * d_model, "rope_theta": 10000.0, "norm_eps": 1e-5,
            "max_positions": max_positions}


def rope_tables(n_pos, head_dim, theta):
    half = head_dim // 2
    i = np.arange(half, dtype=np.float64)
    inv = theta ** (-2.0 * i / head_dim)
    ang = np.arange(n_pos, dtype=np.float64)[:, None] * inv[None, :]
    return torch.from_numpy(np.cos(ang).astype(np.float32)), torch.from_numpy(np.sin(ang).astype(np.float32))


def apply_rope(x, cos, sin):
    # x: [B, H, T, hd]; cos/sin: [T, hd/2]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class Layer(nn.Module):
    def __init__(self, d, k, hidden):
        super().__init__()
        self.norm1 = nn.Parameter(torch.ones(d))
        self.conv_weight = nn.Parameter(torch.zeros(d, k))
        self.conv_bias = nn.Parameter(torch.zeros(d))
        self.wq = nn.Parameter(torch.empty(d, d))
        self.wk = nn.Parameter(torch.empty(d, d))
        self.wv = nn.Parameter(torch.empty(d, d))
        self.wo = nn.Parameter(torch.empty(d, d))
        self.norm2 = nn.Parameter(torch.ones(d))
        self.w1 = nn.Parameter(torch.empty(hidden, d))
        self.b1 = nn.Parameter(torch.zeros(hidden))
        self.w2 = nn.Parameter(torch.empty(d, hidden))
        self.b2 = nn.Parameter(torch.zeros(d))


class TinyLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = dict(config)
        c = self.config
        d, V, k = c["d_model"], c["vocab"], c["conv_kernel"]
        self.embed = nn.Parameter(torch.empty(V, d))
        self.layers = nn.ModuleList([Layer(d, k, c["mlp_hidden"]) for _ in range(c["n_layers"])])
        self.norm_f = nn.Parameter(torch.ones(d))
        cos, sin = rope_tables(c["max_positions"], d // c["n_heads"], c["rope_theta"])
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_weights(self, seed):
        g = torch.Generator().manual_seed(seed)
        c = self.config
        d, k = c["d_model"], c["conv_kernel"]
        with torch.no_grad():
            self.embed.copy_(torch.randn(self.embed.shape, generator=g) * 0.02)
            for L in self.layers:
                for p in (L.wq, L.wk, L.wv, L.w1):
                    p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
                for p in (L.wo, L.w2):
                    p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]) / math.sqrt(2 * c["n_layers"]))
                # Depthwise conv: half the channels start as "current token", half as "previous token", plus noise.
                w = torch.randn(d, k, generator=g) * 0.1
                w[: d // 2, k - 1] += 1.0
                w[d // 2:, k - 2] += 1.0
                L.conv_weight.copy_(w)

    def forward(self, tokens, return_attention=False, positions=None, hidden_only=False):
        """tokens: LongTensor [B, T]. Returns logits [B, T, V] (and attention probs per layer [B, H, T, T]).
        positions (training only): LongTensor [B, T] of RoPE positions (default 0..T-1, as in the contract);
        hidden_only: return the final normed hidden states [B, T, d] instead of logits."""
        c = self.config
        B, T = tokens.shape
        d, H, k, eps = c["d_model"], c["n_heads"], c["conv_kernel"], c["norm_eps"]
        hd = d // H
        if positions is None:
            cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        else:
            cos, sin = self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1)
        mask = torch.full((T, T), float("-inf")).triu(1)
        x = self.embed[tokens]
        attns = []
        for L in self.layers:
            h = rmsnorm(x, L.norm1, eps)
            hc = F.pad(h.transpose(1, 2), (k - 1, 0))               # [B, d, T + k - 1]
            cvt = F.conv1d(hc, L.conv_weight.unsqueeze(1), L.conv_bias, groups=d).transpose(1, 2)  # [B, T, d]
            q = F.linear(cvt, L.wq).view(B, T, H, hd).transpose(1, 2)
            kk = F.linear(cvt, L.wk).view(B, T, H, hd).transpose(1, 2)
            v = F.linear(cvt, L.wv).view(B, T, H, hd).transpose(1, 2)
            q, kk = apply_rope(q, cos, sin), apply_rope(kk, cos, sin)
            s = q @ kk.transpose(-1, -2) / math.sqrt(hd) + mask
            a = torch.softmax(s, dim=-1)
            if return_attention:
                attns.append(a.detach())
            o = (a @ v).transpose(1, 2).reshape(B, T, d)
            x = x + F.linear(o, L.wo)
            h2 = rmsnorm(x, L.norm2, eps)
            x = x + F.linear(F.gelu(F.linear(h2, L.w1, L.b1)), L.w2, L.b2)
        if hidden_only:
            return rmsnorm(x, self.norm_f, eps)
        logits = F.linear(rmsnorm(x, self.norm_f, eps), self.embed)
        return (logits, attns) if return_attention else logits

    def named_tensors(self):
        return {n: p.detach().float().contiguous() for n, p in self.named_parameters()}


def save_model(model, path, vocab_layout, name):
    from safetensors_io import save
    save(path, model.named_tensors(), {"config": json.dumps(model.config), "vocab_layout": json.dumps(vocab_layout),
                                       "name": name})


def load_model(path, model_class=None):
    """(model, vocab_layout, name) of a file save_model wrote; model_class(config) builds it (default TinyLM)."""
    from safetensors_io import load
    tensors, meta = load(path)
    cfg = json.loads(meta["config"])
    m = (model_class or TinyLM)(cfg)
    sd = {k: torch.from_numpy(v) for k, v in tensors.items()}
    m.load_state_dict(sd, strict=True)
    m.eval()
    return m, json.loads(meta["vocab_layout"]), meta.get("name", "")


def init_recall_circuit(m, seed, alpha2=4.0, beta=1.0):
    """Optional initialisation that starts layer 0 near an associative-recall circuit (training takes it from
    there): embeddings whose two halves are equal; the conv passes the current token on the first half of the
    channels and the previous token on the second half; in every head of layer 0 the low-frequency RoPE dims
    (angle under ~1 rad at 1,760 tokens) of q read the current token and those of k the previous token through
    the same random projection (so a query at `key` matches the token after an earlier `key`), v reads the
    current token, and wo writes it back in embedding space. Everything else keeps its random init."""
    c = m.config
    d, H = c["d_model"], c["n_heads"]
    hd, half, k = d // H, d // 2, c["conv_kernel"]
    g = torch.Generator().manual_seed(seed + 99)
    inv = c["rope_theta"] ** (-2.0 * np.arange(hd // 2) / hd)
    low = [i for i in range(hd // 2) if inv[i] * 1760 < 1.0]
    S = low + [i + hd // 2 for i in low]
    alpha = math.sqrt(alpha2)
    with torch.no_grad():
        e0 = m.embed[:, :half].clone()
        m.embed[:, half:] = e0
        L = m.layers[0]
        w = torch.randn(d, k, generator=g) * 0.02
        w[:half, k - 1] += 1.0
        w[half:, k - 2] += 1.0
        L.conv_weight.copy_(w)
        for j in range(H):
            rows = [j * hd + s for s in S]
            R = torch.randn(len(S), half, generator=g) / math.sqrt(half)
            L.wq[rows] = 0.0
            L.wk[rows] = 0.0
            L.wq[rows, :half] = alpha * R
            L.wk[rows, half:] = alpha * R
            G = torch.randn(hd, half, generator=g) / math.sqrt(half)
            L.wv[j * hd:(j + 1) * hd] = 0.0
            L.wv[j * hd:(j + 1) * hd, :half] = G
            L.wo[:, j * hd:(j + 1) * hd] = beta * torch.cat([G.t(), G.t()], 0)
    return low
