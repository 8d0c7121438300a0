// SPDX-License-Identifier: Apache-2.0
// memdecay + llama.cpp: the attention llama.cpp computes, read from its eval callback.
//
// With flash attention off, llama.cpp's graph names each layer's attention probabilities `kq_soft_max-<layer>`:
// a GGML_OP_SOFT_MAX of shape [n_kv cells, n_tokens, n_head, n_stream] whose src[1] is the mask (0 visible, -inf
// hidden). attention_capture asks the scheduler for exactly those nodes (each one asked for splits the graph
// there, which is the cost of capture), sums each cell's probability over heads and the ubatch's tokens, divided
// by heads x tokens (so a layer's row sums to 1 over the cells), and keeps the mask of the first layer it sees
// for cell_mirror. Names repeat across graphs (`Qcur-0` is several nodes), so nodes are matched by op and name.
//
// With flash attention on there are no probabilities; asked for queries and keys instead, it takes each layer's
// `Qcur-<layer>` and `Kcur-<layer>` after RoPE (the GGML_OP_ROPE nodes: [head_dim, heads, n_tokens]), which the
// attention-free signal (page digests, digests/query_signal.hpp) needs. The llama graph names them so; other
// architectures may not, which complete() reports.
#ifndef MEMDECAY_LLAMA_CPP_ATTENTION_CAPTURE_HPP
#define MEMDECAY_LLAMA_CPP_ATTENTION_CAPTURE_HPP

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <ggml-backend.h>
#include <ggml.h>
#include <llama.h>

#include "memdecay/llama_cpp/cell_mirror.hpp"

namespace memdecay::llama_cpp {

/// Collects one ubatch's attention per layer (see the file comment). Install with install(params) before
/// llama_init_from_model; set `enabled` to false around decodes whose attention is not wanted (a probe on a
/// fork), which then runs llama.cpp's unsplit graph.
class attention_capture {
 public:
  /// `attention`: the kq_soft_max probabilities and the mask; `queries_and_keys`: Qcur and Kcur after RoPE.
  explicit attention_capture(std::size_t layers, bool attention = true, bool queries_and_keys = false)
      : layer_mass_(layers), seen_(layers, 0), q_(layers), k_(layers), q_seen_(layers, 0), k_seen_(layers, 0),
        attention_(attention), queries_and_keys_(queries_and_keys) {}
  attention_capture(const attention_capture&) = delete;
  attention_capture& operator=(const attention_capture&) = delete;

  /// Points the context's eval callback at this object (which must outlive the context).
  void install(llama_context_params& p) noexcept {
    p.cb_eval = &attention_capture::callback;
    p.cb_eval_user_data = this;
  }

  bool enabled = true;

  /// Forgets the last ubatch (call before each llama_decode).
  void reset() noexcept {
    for (auto& s : seen_) s = 0;
    for (auto& s : q_seen_) s = 0;
    for (auto& s : k_seen_) s = 0;
    mask_.cells = mask_.tokens = 0;
    mask_.bits.clear();
    tokens_ = 0;
    error_.clear();
  }
  /// Whether every layer reported for the last ubatch, and nothing went wrong; else what did.
  [[nodiscard]] std::string complete() const {
    if (!error_.empty()) return error_;
    for (std::size_t l = 0; l < seen_.size(); ++l) {
      if (attention_ && seen_[l] == 0)
        return "layer " + std::to_string(l) + " reported no kq_soft_max (flash attention on, or a graph whose "
               "attention nodes are named differently)";
      if (queries_and_keys_ && (q_seen_[l] == 0 || k_seen_[l] == 0))
        return "layer " + std::to_string(l) + " reported no Qcur / Kcur after RoPE (a graph that names them "
               "differently)";
    }
    return {};
  }
  /// Layer l's queries of the last ubatch after RoPE: tokens x heads x head_dim (llama.cpp's pair layout).
  [[nodiscard]] const std::vector<float>& layer_queries(std::size_t l) const noexcept { return q_[l]; }
  /// Layer l's keys of the last ubatch after RoPE: tokens x kv_heads x head_dim.
  [[nodiscard]] const std::vector<float>& layer_keys(std::size_t l) const noexcept { return k_[l]; }
  [[nodiscard]] std::size_t query_heads() const noexcept { return q_heads_; }
  [[nodiscard]] std::size_t kv_heads() const noexcept { return k_heads_; }
  [[nodiscard]] std::size_t head_dim() const noexcept { return head_dim_; }
  /// Layer l's per-cell mass of the last ubatch (n_kv cells, summing to 1).
  [[nodiscard]] const std::vector<float>& layer_mass(std::size_t l) const noexcept { return layer_mass_[l]; }
  [[nodiscard]] std::size_t layers() const noexcept { return layer_mass_.size(); }
  [[nodiscard]] const mask_view& mask() const noexcept { return mask_; }
  [[nodiscard]] std::size_t tokens() const noexcept { return tokens_; }
  /// Seconds spent inside the callback since construction (reading and reducing the probabilities).
  [[nodiscard]] double seconds() const noexcept { return seconds_; }

 private:
  static bool callback(ggml_tensor* t, bool ask, void* user) {
    auto* self = static_cast<attention_capture*>(user);
    const bool probabilities = self->enabled && self->attention_ && t->op == GGML_OP_SOFT_MAX &&
                               std::strncmp(t->name, "kq_soft_max-", 12) == 0;
    const bool qk = self->enabled && self->queries_and_keys_ && t->op == GGML_OP_ROPE &&
                    (std::strncmp(t->name, "Qcur-", 5) == 0 || std::strncmp(t->name, "Kcur-", 5) == 0);
    if (ask) return probabilities || qk;
    if (probabilities) self->take(t);
    if (qk) self->take_rope(t);
    return true;
  }

  // A host copy of `t`'s bytes (the CPU backend's tensors are host memory already).
  static const char* host_bytes(const ggml_tensor* t, std::vector<char>& scratch) {
    if (t->buffer == nullptr || ggml_backend_buffer_is_host(t->buffer)) return static_cast<const char*>(t->data);
    scratch.resize(ggml_nbytes(t));
    ggml_backend_tensor_get(t, scratch.data(), 0, scratch.size());
    return scratch.data();
  }

  void take(const ggml_tensor* t) {
    const auto start = std::chrono::steady_clock::now();
    char* end = nullptr;
    const long il = std::strtol(t->name + 12, &end, 10);
    if (end == t->name + 12 || il < 0 || static_cast<std::size_t>(il) >= layer_mass_.size()) {
      error_ = std::string("unexpected attention node '") + t->name + "'";
      return;
    }
    if (t->type != GGML_TYPE_F32) {
      error_ = std::string("attention node '") + t->name + "' is not f32";
      return;
    }
    const std::size_t cells = static_cast<std::size_t>(t->ne[0]), T = static_cast<std::size_t>(t->ne[1]),
                      H = static_cast<std::size_t>(t->ne[2]), S = static_cast<std::size_t>(t->ne[3]);
    if (S != 1) {
      error_ = "attention over " + std::to_string(S) + " streams (memdecay needs a unified KV cache: kv_unified)";
      return;
    }
    auto& out = layer_mass_[static_cast<std::size_t>(il)];
    out.assign(cells, 0.0f);
    const char* base = host_bytes(t, scratch_);
    auto& acc = acc_;  // reused across layers and ubatches: this runs inside every decode
    acc.assign(cells, 0.0);
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t q = 0; q < T; ++q) {
        const auto* row = reinterpret_cast<const float*>(base + h * t->nb[2] + q * t->nb[1]);
        for (std::size_t c = 0; c < cells; ++c) acc[c] += row[c];
      }
    const double inv = 1.0 / static_cast<double>(H * T);
    for (std::size_t c = 0; c < cells; ++c) out[c] = static_cast<float>(acc[c] * inv);
    seen_[static_cast<std::size_t>(il)] = 1;
    tokens_ = T;
    if (mask_.cells == 0 && t->src[1] != nullptr) read_mask(t->src[1], cells, T);
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  // Qcur / Kcur after RoPE, [head_dim, heads, tokens], into tokens x heads x head_dim floats.
  void take_rope(const ggml_tensor* t) {
    const auto start = std::chrono::steady_clock::now();
    const bool query = t->name[0] == 'Q';
    char* end = nullptr;
    const long il = std::strtol(t->name + 5, &end, 10);
    if (end == t->name + 5 || il < 0 || static_cast<std::size_t>(il) >= q_.size() || t->type != GGML_TYPE_F32) {
      error_ = std::string("unexpected RoPE node '") + t->name + "'";
      return;
    }
    const std::size_t hd = static_cast<std::size_t>(t->ne[0]), H = static_cast<std::size_t>(t->ne[1]),
                      T = static_cast<std::size_t>(t->ne[2]);
    if (head_dim_ != 0 && head_dim_ != hd) {
      error_ = std::string("node '") + t->name + "' has head_dim " + std::to_string(hd);
      return;
    }
    head_dim_ = hd;
    (query ? q_heads_ : k_heads_) = H;
    auto& out = (query ? q_ : k_)[static_cast<std::size_t>(il)];
    out.resize(T * H * hd);
    const char* base = host_bytes(t, scratch_);
    for (std::size_t tok = 0; tok < T; ++tok)
      for (std::size_t h = 0; h < H; ++h) {
        const auto* row = reinterpret_cast<const float*>(base + tok * t->nb[2] + h * t->nb[1]);
        std::memcpy(out.data() + (tok * H + h) * hd, row, hd * sizeof(float));
      }
    (query ? q_seen_ : k_seen_)[static_cast<std::size_t>(il)] = 1;
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  void read_mask(const ggml_tensor* m, std::size_t cells, std::size_t T) {
    if (static_cast<std::size_t>(m->ne[0]) != cells || static_cast<std::size_t>(m->ne[1]) < T) {
      error_ = "the attention mask's shape does not match the attention's";
      return;
    }
    const char* base = host_bytes(m, mask_scratch_);
    mask_.cells = cells;
    mask_.tokens = T;
    mask_.bits.assign(cells * T, 0);
    for (std::size_t q = 0; q < T; ++q)
      for (std::size_t c = 0; c < cells; ++c) {
        float v = 0.0f;
        if (m->type == GGML_TYPE_F32)
          v = *reinterpret_cast<const float*>(base + q * m->nb[1] + c * m->nb[0]);
        else if (m->type == GGML_TYPE_F16)
          v = ggml_fp16_to_fp32(*reinterpret_cast<const ggml_fp16_t*>(base + q * m->nb[1] + c * m->nb[0]));
        else {
          error_ = "the attention mask is neither f32 nor f16";
          return;
        }
        mask_.bits[q * cells + c] = std::isinf(v) && v < 0 ? 0 : 1;
      }
  }

  std::vector<std::vector<float>> layer_mass_;
  std::vector<std::uint8_t> seen_;
  std::vector<std::vector<float>> q_, k_;
  std::vector<std::uint8_t> q_seen_, k_seen_;
  bool attention_ = true, queries_and_keys_ = false;
  std::size_t q_heads_ = 0, k_heads_ = 0, head_dim_ = 0;
  mask_view mask_;
  std::size_t tokens_ = 0;
  std::string error_;
  std::vector<char> scratch_, mask_scratch_;
  std::vector<double> acc_;
  double seconds_ = 0.0;
};

}  // namespace memdecay::llama_cpp

#endif  // MEMDECAY_LLAMA_CPP_ATTENTION_CAPTURE_HPP
