"""Export a LLaMA-architecture recall model (llama_model.py) to GGUF with llama.cpp's own gguf-py, and the logits
fixture the llama.cpp tests compare llama.cpp's forward with.

  /usr/bin/python3 python/export_gguf.py models/llama-small/model.safetensors models/llama-small/model.gguf \
      --fixture models/fixtures/logits-llama-small.json

gguf-py comes from the pinned llama.cpp source (tools/fetch-llama-cpp puts it in .deps/llama.cpp/gguf-py;
--gguf-py names another). The file is architecture `llama`, all tensors f32, tied embeddings (no output.weight:
llama.cpp reuses token_embd), tokenizer model "none" with llama.vocab_size = 512 (token ids are fed directly; the
vocabulary layout is stored as memdecay.vocab_layout). wq / wk rows are permuted from rotate-half pairs to
llama.cpp's adjacent pairs (LLAMA_ROPE_TYPE_NORM), the permutation convert_hf_to_gguf.py applies: q . k is the
same, so attention and logits are too.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_model as LM  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rotate_half_to_adjacent(w, heads):
    """Rows of one projection [heads * hd, d] from pairs (i, i + hd/2) to pairs (2i, 2i + 1), per head."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def export(model_path, out_path, gguf_py):
    sys.path.insert(0, gguf_py)
    import gguf
    m, vocab_layout, name = LM.load_model(model_path)
    c = m.config
    d, H, KV = c["d_model"], c["n_heads"], c["n_kv_heads"]
    t = {k: v.numpy().astype(np.float32) for k, v in m.named_tensors().items()}
    w = gguf.GGUFWriter(out_path, "llama")
    w.add_name(f"memdecay {name}")
    w.add_description("memdecay's LLaMA-architecture recall model (synthetic agent episodes; docs/models.md)")
    w.add_context_length(c["max_positions"])
    w.add_embedding_length(d)
    w.add_block_count(c["n_layers"])
    w.add_feed_forward_length(c["mlp_hidden"])
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_rope_dimension_count(d // H)
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["norm_eps"])
    w.add_vocab_size(c["vocab"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("none")
    w.add_string("memdecay.vocab_layout", json.dumps(vocab_layout))
    w.add_tensor("token_embd.weight", t["embed"])
    for i in range(c["n_layers"]):
        p = f"layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", t[p + "norm1"])
        w.add_tensor(f"blk.{i}.attn_q.weight", rotate_half_to_adjacent(t[p + "wq"], H))
        w.add_tensor(f"blk.{i}.attn_k.weight", rotate_half_to_adjacent(t[p + "wk"], KV))
        w.add_tensor(f"blk.{i}.attn_v.weight", t[p + "wv"])
        w.add_tensor(f"blk.{i}.attn_output.weight", t[p + "wo"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", t[p + "norm2"])
        w.add_tensor(f"blk.{i}.ffn_gate.weight", t[p + "w_gate"])
        w.add_tensor(f"blk.{i}.ffn_up.weight", t[p + "w_up"])
        w.add_tensor(f"blk.{i}.ffn_down.weight", t[p + "w_down"])
    w.add_tensor("output_norm.weight", t["norm_f"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return m


@torch.no_grad()
def fixture(m, path, episodes):
    """The first 62 tokens of episode 0 of `episodes` and `query key` of the latest fact planted in them; the
    PyTorch logits of every position (full causal float32 forward), as the C++ tests read them."""
    with open(episodes) as f:
        data = json.load(f)
    ep = data["episodes"][0]
    q = data["vocab_layout"]["query"]
    facts = [p for p in ep["probes"] if p["fact_first"] + 2 <= 62]
    last = max(facts, key=lambda p: p["fact_first"])
    tokens = ep["tokens"][:62] + [q, last["key"]]
    logits = m(torch.tensor([tokens]))[0]
    with open(path, "w") as f:
        json.dump({"tokens": tokens, "answer": last["answer"], "predicted": int(logits[-1].argmax()),
                   "logits": [[round(float(x), 6) for x in row] for row in logits]}, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--gguf-py", default=os.path.join(ROOT, ".deps/llama.cpp/gguf-py"))
    ap.add_argument("--fixture", help="also write the PyTorch logits fixture here")
    ap.add_argument("--episodes", default=os.path.join(ROOT, "models/episodes-450.json"))
    a = ap.parse_args()
    m = export(a.model, a.out, a.gguf_py)
    if a.fixture:
        fixture(m, a.fixture, a.episodes)


if __name__ == "__main__":
    main()
