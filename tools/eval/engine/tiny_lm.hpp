// SPDX-License-Identifier: Apache-2.0
// memdecay-eval engine: the bundled tiny decoders (python/model.py, python/llama_model.py) in C++: loading a model
// file, the reference forward pass and the building blocks the paged session (kv_session.hpp) shares with it.
//
// The model (docs/models.md; python/model.py is the definition): pre-norm decoder with tied embeddings.
//   x = embed[tok]
//   per layer: h = rmsnorm(x) * norm1
//              c_t = conv_bias + sum_j conv_weight[:, j] * h_{t-(k-1)+j}   (causal depthwise, zeros before pos 0)
//              q, k, v = c wq^T, c wk^T, c wv^T;  q, k = rope(q), rope(k)   (NeoX rotate-half, absolute positions)
//              x += softmax(q k^T / sqrt(hd) + causal) v  wo^T
//              x += gelu_erf(rmsnorm(x) * norm2 w1^T + b1) w2^T + b2
//   logits = (rmsnorm(x) * norm_f) embed^T
//
// The LLaMA architecture (config "arch": "llama"; python/llama_model.py LlamaLM is the definition) is the same
// decoder without the convolution (c = h), with grouped-query attention and a SwiGLU MLP without biases:
//              q = h wq^T (n_heads heads), k, v = h wk^T, h wv^T (n_kv_heads heads); query head j reads kv head
//              j / (n_heads / n_kv_heads)
//              x += w_down( silu(w_gate (rmsnorm(x) * norm2)) * (w_up (rmsnorm(x) * norm2)) )
// The two differences are independent switches of the code (model_config::has_conv(), model_config::mlp), and
// with n_kv_heads == n_heads, a conv kernel and the GELU MLP every computation is the one the bundled models
// always ran (same operations in the same order).
//
// tiny_lm is immutable after load() and may be shared by any number of threads. Its paged-KV session is
// kv_session.hpp; its configuration, model_config.hpp.
#ifndef MEMDECAY_EVAL_ENGINE_TINY_LM_HPP
#define MEMDECAY_EVAL_ENGINE_TINY_LM_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "model_config.hpp"
#include "safetensors.hpp"

namespace memdecay_eval {

class tiny_lm {
 public:
  using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using vector = Eigen::VectorXf;
  struct layer_weights {
    vector norm1, conv_bias, norm2, b1, b2;  // conv_bias: conv arch only; b1, b2: GELU MLP only
    matrix conv;                             // [k, d]: row j is conv_weight[:, j] (conv arch only)
    matrix wqkv;    // [(H + 2 KV) hd, d]: wq, wk, wv stacked (torch Linear layout, [out, in]); [3d, d] without GQA
    matrix wo;      // [d, H hd]
    matrix w1, w2;  // GELU MLP: [f, d], [d, f]
    matrix w_gate, w_up, w_down;  // SwiGLU MLP: [f, d], [f, d], [d, f]
  };
  struct weights_type {
    matrix embed;  // [V, d]
    std::vector<layer_weights> layers;
    vector norm_f;
  };

  // Loads and validates a model file (section 1 of the issue-8 contract). Throws std::runtime_error with a
  // message naming the file and the tensor or field at fault.
  static tiny_lm load(const std::filesystem::path& path) {
    const auto file = safetensors_file::read(path);
    const std::string where = "model '" + path.string() + "': ";
    auto meta = [&](const char* key) -> const std::string& {
      auto it = file.metadata().find(key);
      if (it == file.metadata().end()) throw std::runtime_error(where + "__metadata__ has no '" + key + "'");
      return it->second;
    };
    tiny_lm m;
    try {
      m.config_ = parse_model_config(detail::json_text(meta("config"), "__metadata__ 'config'"));
      m.vocab_ = parse_vocab_layout(detail::json_text(meta("vocab_layout"), "__metadata__ 'vocab_layout'"));
    } catch (const std::runtime_error& e) {
      if (std::string(e.what()).starts_with(where)) throw;
      throw std::runtime_error(where + e.what());
    }
    auto it = file.metadata().find("name");
    m.name_ = it != file.metadata().end() ? it->second : path.parent_path().filename().string();
    m.check_vocab(where);

    const auto& c = m.config_;
    const std::int64_t V = c.vocab, d = c.d_model, k = c.conv_kernel, f = c.mlp_hidden;
    const std::int64_t qd = std::int64_t{c.n_heads} * c.head_dim(), kvd = std::int64_t{c.n_kv_heads} * c.head_dim();
    using tensor_list = std::vector<std::pair<std::string, std::vector<std::int64_t>>>;
    tensor_list expected = {{"embed", {V, d}}, {"norm_f", {d}}};
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      tensor_list layer = {{"norm1", {d}}};
      if (c.has_conv()) layer.insert(layer.end(), {{"conv_weight", {d, k}}, {"conv_bias", {d}}});
      layer.insert(layer.end(), {{"wq", {qd, d}}, {"wk", {kvd, d}}, {"wv", {kvd, d}}, {"wo", {d, qd}}, {"norm2", {d}}});
      if (c.mlp == mlp_kind::gelu)
        layer.insert(layer.end(), {{"w1", {f, d}}, {"b1", {f}}, {"w2", {d, f}}, {"b2", {d}}});
      else
        layer.insert(layer.end(), {{"w_gate", {f, d}}, {"w_up", {f, d}}, {"w_down", {d, f}}});
      for (auto& e : layer) expected.emplace_back(p + e.first, e.second);
    }
    for (const auto& [name, shape] : expected)
      if (!file.contains(name)) throw std::runtime_error(where + "tensor '" + name + "' is missing");
    for (const auto& tensor : file.tensors()) {
      const std::string& name = tensor.first;  // a structured binding cannot be captured before C++20 in clang 14
      const bool known = std::any_of(expected.begin(), expected.end(), [&](const auto& e) { return e.first == name; });
      if (!known) throw std::runtime_error(where + "unexpected tensor '" + name + "' (not part of the model)");
    }
    auto load_matrix = [&](const std::string& name, std::int64_t rows, std::int64_t cols) {
      const auto values = file.f32(name, {rows, cols});
      return matrix(Eigen::Map<const matrix>(values.data(), rows, cols));
    };
    auto load_vector = [&](const std::string& name, std::int64_t n) {
      const auto values = file.f32(name, {n});
      return vector(Eigen::Map<const vector>(values.data(), n));
    };
    m.w_.embed = load_matrix("embed", V, d);
    m.w_.norm_f = load_vector("norm_f", d);
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      layer_weights lw;
      lw.norm1 = load_vector(p + "norm1", d);
      if (c.has_conv()) {
        lw.conv = load_matrix(p + "conv_weight", d, k).transpose();
        lw.conv_bias = load_vector(p + "conv_bias", d);
      }
      lw.wqkv.resize(qd + 2 * kvd, d);
      lw.wqkv.topRows(qd) = load_matrix(p + "wq", qd, d);
      lw.wqkv.middleRows(qd, kvd) = load_matrix(p + "wk", kvd, d);
      lw.wqkv.bottomRows(kvd) = load_matrix(p + "wv", kvd, d);
      lw.wo = load_matrix(p + "wo", d, qd);
      lw.norm2 = load_vector(p + "norm2", d);
      if (c.mlp == mlp_kind::gelu) {
        lw.w1 = load_matrix(p + "w1", f, d);
        lw.b1 = load_vector(p + "b1", f);
        lw.w2 = load_matrix(p + "w2", d, f);
        lw.b2 = load_vector(p + "b2", d);
      } else {
        lw.w_gate = load_matrix(p + "w_gate", f, d);
        lw.w_up = load_matrix(p + "w_up", f, d);
        lw.w_down = load_matrix(p + "w_down", d, f);
      }
      m.w_.layers.push_back(std::move(lw));
    }
    m.build_rope_table();
    return m;
  }

  [[nodiscard]] const model_config& config() const noexcept { return config_; }
  [[nodiscard]] const vocab_layout& vocab() const noexcept { return vocab_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] const weights_type& weights() const noexcept { return w_; }

  // Reference forward without a cache: logits [tokens.size() x vocab], row-major; positions 0, 1, ...
  [[nodiscard]] std::vector<float> full_logits(std::span<const std::int32_t> tokens) const {
    return reference_forward(tokens, [](std::size_t q, std::size_t k) { return k <= q; }).logits;
  }

  struct reference_result {
    std::vector<float> logits;                  // [n x vocab]
    std::vector<std::vector<float>> attention;  // [layer][query * heads * n + head * n + key] when asked for
                                                // (heads: the n_heads query heads)
  };
  // The dense reference forward at positions 0..n-1 where query i attends to key j exactly when
  // visible(i, j) (full_logits: j <= i). The convolution always sees the true previous tokens. With
  // `keep_attention`, the attention probabilities of every layer, query and (query) head are returned as well.
  [[nodiscard]] reference_result reference_forward(std::span<const std::int32_t> tokens,
                                                   const std::function<bool(std::size_t, std::size_t)>& visible,
                                                   bool keep_attention = false) const {
    const auto& c = config_;
    const std::size_t n = tokens.size(), d = static_cast<std::size_t>(c.d_model),
                      H = static_cast<std::size_t>(c.n_heads);
    const std::size_t hd = d / H, k = static_cast<std::size_t>(c.conv_kernel);
    const bool conv = c.has_conv();
    const std::size_t rep = static_cast<std::size_t>(c.group_size());  // query heads per kv head
    const std::size_t qd = H * hd, kvd = static_cast<std::size_t>(c.n_kv_heads) * hd, w = qd + 2 * kvd;  // qkv row
    check_tokens(tokens, "full_logits");
    reference_result out;
    matrix x(n, d), h(n, d), e(conv ? n + k - 1 : 0, d), cv(conv ? n : 0, d), qkv(n, w), att(n, d),
        u(n, mlp_scratch_per_row());
    for (std::size_t t = 0; t < n; ++t) x.row(static_cast<Eigen::Index>(t)) = w_.embed.row(tokens[t]);
    std::vector<char> mask(n * n);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) mask[i * n + j] = visible(i, j) ? 1 : 0;
    std::vector<float> scores(n);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (const auto& lw : w_.layers) {
      rmsnorm_rows(x.data(), n, lw.norm1.data(), h.data());
      if (conv) {
        std::fill(e.data(), e.data() + (k - 1) * d, 0.0f);
        std::copy(h.data(), h.data() + n * d, e.data() + (k - 1) * d);
        conv_rows(lw, e.data(), n, cv.data());
      }
      qkv.noalias() = (conv ? cv : h) * lw.wqkv.transpose();
      for (std::size_t t = 0; t < n; ++t) {
        apply_rope(qkv.data() + t * w, static_cast<std::uint32_t>(t), H);
        apply_rope(qkv.data() + t * w + qd, static_cast<std::uint32_t>(t), static_cast<std::size_t>(c.n_kv_heads));
      }
      std::vector<float> probs;
      if (keep_attention) probs.assign(n * H * n, 0.0f);
      att.setZero();
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t hh = 0; hh < H; ++hh) {
          const float* q = qkv.data() + i * w + hh * hd;
          const std::size_t kvo = (hh / rep) * hd;  // this query head's kv head
          float mx = -std::numeric_limits<float>::infinity();
          for (std::size_t j = 0; j < n; ++j) {
            if (!mask[i * n + j]) continue;
            const float* kk = qkv.data() + j * w + qd + kvo;
            float s = 0;
            for (std::size_t a = 0; a < hd; ++a) s += q[a] * kk[a];
            scores[j] = s * scale;
            mx = std::max(mx, scores[j]);
          }
          float sum = 0;
          for (std::size_t j = 0; j < n; ++j)
            if (mask[i * n + j]) sum += (scores[j] = std::exp(scores[j] - mx));
          float* o = att.data() + i * d + hh * hd;
          for (std::size_t j = 0; j < n; ++j) {
            if (!mask[i * n + j]) continue;
            const float p = scores[j] / sum;
            if (keep_attention) probs[i * H * n + hh * n + j] = p;
            const float* vv = qkv.data() + j * w + qd + kvd + kvo;
            for (std::size_t a = 0; a < hd; ++a) o[a] += p * vv[a];
          }
        }
      if (keep_attention) out.attention.push_back(std::move(probs));
      x.noalias() += att * lw.wo.transpose();
      mlp_rows(lw, x.data(), n, h.data(), u.data());
    }
    out.logits.resize(n * static_cast<std::size_t>(c.vocab));
    for (std::size_t t = 0; t < n; ++t) final_logits(x.data() + t * d, h.data(), out.logits.data() + t * c.vocab);
    return out;
  }

  // --- building blocks shared by the reference and kv_session (row-major float arrays) ------------------------

  // out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, for n rows of d_model.
  void rmsnorm_rows(const float* x, std::size_t n, const float* w, float* out) const {
    const std::size_t d = static_cast<std::size_t>(config_.d_model);
    for (std::size_t t = 0; t < n; ++t) {
      const float* xr = x + t * d;
      float* o = out + t * d;
      float ss = 0;
      for (std::size_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
      const float r = 1.0f / std::sqrt(ss / static_cast<float>(d) + config_.norm_eps);
      for (std::size_t i = 0; i < d; ++i) o[i] = xr[i] * r * w[i];
    }
  }
  // Causal depthwise convolution: `e` holds k-1 previous normed rows followed by the n current ones.
  void conv_rows(const layer_weights& lw, const float* e, std::size_t n, float* out) const {
    const std::size_t d = static_cast<std::size_t>(config_.d_model), k = static_cast<std::size_t>(config_.conv_kernel);
    for (std::size_t t = 0; t < n; ++t) {
      float* o = out + t * d;
      for (std::size_t i = 0; i < d; ++i) o[i] = lw.conv_bias[static_cast<Eigen::Index>(i)];
      for (std::size_t j = 0; j < k; ++j) {
        const float* w = lw.conv.data() + j * d;
        const float* in = e + (t + j) * d;
        for (std::size_t i = 0; i < d; ++i) o[i] += w[i] * in[i];
      }
    }
  }
  // Rotates the d_model-wide row (all heads) in place for absolute position `pos` (NeoX rotate-half per head).
  void apply_rope(float* row, std::uint32_t pos) const {
    apply_rope(row, pos, static_cast<std::size_t>(config_.n_heads));
  }
  // The same for a row of `H` heads of head_dim (the kv heads' keys: n_kv_heads x head_dim).
  void apply_rope(float* row, std::uint32_t pos, std::size_t H) const {
    const std::size_t hd = static_cast<std::size_t>(config_.head_dim());
    const std::size_t half = hd / 2;
    const float *cs, *sn;
    float cbuf[128], sbuf[128];
    if (pos < static_cast<std::uint32_t>(config_.max_positions)) {
      cs = rope_cos_.data() + static_cast<std::size_t>(pos) * half;
      sn = rope_sin_.data() + static_cast<std::size_t>(pos) * half;
    } else {  // past the table: the same formula, computed on the fly
      if (half > 128) throw std::runtime_error("position " + std::to_string(pos) + " is past max_positions");
      for (std::size_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(pos) * inv_freq_[i];
        cbuf[i] = static_cast<float>(std::cos(angle));
        sbuf[i] = static_cast<float>(std::sin(angle));
      }
      cs = cbuf;
      sn = sbuf;
    }
    for (std::size_t h = 0; h < H; ++h) {
      float* x = row + h * hd;
      for (std::size_t i = 0; i < half; ++i) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cs[i] - b * sn[i];
        x[i + half] = b * cs[i] + a * sn[i];
      }
    }
  }
  // Floats of mlp_rows' scratch `u` per row: mlp_hidden (GELU), 2 x mlp_hidden (SwiGLU: gate and up).
  [[nodiscard]] std::size_t mlp_scratch_per_row() const noexcept {
    return static_cast<std::size_t>(config_.mlp_hidden) * (config_.mlp == mlp_kind::swiglu ? 2 : 1);
  }
  // x += w2 gelu(w1 (rmsnorm(x) * norm2) + b1) + b2 for n rows (GELU MLP), or
  // x += w_down (silu(w_gate (rmsnorm(x) * norm2)) * (w_up (rmsnorm(x) * norm2))) (SwiGLU);
  // h [n x d] and u [n x mlp_scratch_per_row()] are scratch.
  void mlp_rows(const layer_weights& lw, float* x, std::size_t n, float* h, float* u) const {
    const auto d = static_cast<Eigen::Index>(config_.d_model), f = static_cast<Eigen::Index>(config_.mlp_hidden);
    const auto rows = static_cast<Eigen::Index>(n);
    rmsnorm_rows(x, n, lw.norm2.data(), h);
    if (config_.mlp == mlp_kind::swiglu) {
      Eigen::Map<matrix> gate(u, rows, f), up(u + n * static_cast<std::size_t>(f), rows, f);
      const Eigen::Map<const matrix> hn(h, rows, d);
      gate.noalias() = hn * lw.w_gate.transpose();
      up.noalias() = hn * lw.w_up.transpose();
      for (Eigen::Index t = 0; t < rows; ++t)
        for (Eigen::Index i = 0; i < f; ++i) {
          const float z = gate(t, i);
          gate(t, i) = z / (1.0f + std::exp(-z)) * up(t, i);  // silu(z) = z sigmoid(z)
        }
      Eigen::Map<matrix>(x, rows, d).noalias() += Eigen::Map<const matrix>(u, rows, f) * lw.w_down.transpose();
      return;
    }
    Eigen::Map<matrix> hu(u, rows, f);
    hu.noalias() = Eigen::Map<const matrix>(h, rows, d) * lw.w1.transpose();
    for (Eigen::Index t = 0; t < rows; ++t) {
      float* r = u + t * f;
      for (Eigen::Index i = 0; i < f; ++i) {
        const float z = r[i] + lw.b1[i];
        r[i] = 0.5f * z * (1.0f + std::erf(z * 0.70710678118654752440f));
      }
    }
    Eigen::Map<matrix> hx(x, rows, d);
    hx.noalias() += Eigen::Map<const matrix>(u, rows, f) * lw.w2.transpose();
    hx.rowwise() += lw.b2.transpose();
  }
  // logits (vocab) of one final hidden row; h (d_model) is scratch.
  void final_logits(const float* x, float* h, float* logits) const {
    rmsnorm_rows(x, 1, w_.norm_f.data(), h);
    Eigen::Map<vector>(logits, config_.vocab).noalias() = w_.embed * Eigen::Map<const vector>(h, config_.d_model);
  }
  void check_tokens(std::span<const std::int32_t> tokens, const char* what) const {
    for (std::size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] < 0 || tokens[i] >= config_.vocab)
        throw std::runtime_error(std::string(what) + ": token " + std::to_string(tokens[i]) + " at index " +
                                 std::to_string(i) + " is outside the vocabulary (" + std::to_string(config_.vocab) +
                                 ")");
  }

 private:
  tiny_lm() = default;

  void check_vocab(const std::string& where) const {
    const auto& v = vocab_;
    auto inside = [&](int first, int count, const char* name) {
      if (first < 0 || count < 0 || first + count > config_.vocab)
        throw std::runtime_error(where + "vocab_layout range '" + name + "' [" + std::to_string(first) + ", " +
                                 std::to_string(first + count) + ") is outside the vocabulary (" +
                                 std::to_string(config_.vocab) + ")");
    };
    inside(v.pad, 1, "pad");
    inside(v.bos, 1, "bos");
    inside(v.query, 1, "query");
    for (const auto& [name, id] : v.region_markers) inside(id, 1, ("region_markers." + name).c_str());
    inside(v.key_first, v.key_count, "key");
    inside(v.value_first, v.value_count, "value");
    inside(v.filler_first, v.filler_count, "filler");
  }

  // cos/sin of pos * theta^(-2i/hd), computed in double and rounded to float (python/model.py rope_tables).
  void build_rope_table() {
    const std::size_t hd = static_cast<std::size_t>(config_.head_dim()), half = hd / 2;
    inv_freq_.resize(half);
    for (std::size_t i = 0; i < half; ++i)
      inv_freq_[i] =
          std::pow(static_cast<double>(config_.rope_theta), -2.0 * static_cast<double>(i) / static_cast<double>(hd));
    const std::size_t P = static_cast<std::size_t>(config_.max_positions);
    rope_cos_.resize(P * half);
    rope_sin_.resize(P * half);
    for (std::size_t p = 0; p < P; ++p)
      for (std::size_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(p) * inv_freq_[i];
        rope_cos_[p * half + i] = static_cast<float>(std::cos(angle));
        rope_sin_[p * half + i] = static_cast<float>(std::sin(angle));
      }
  }

  model_config config_;
  vocab_layout vocab_;
  std::string name_;
  weights_type w_;
  std::vector<double> inv_freq_;
  std::vector<float> rope_cos_, rope_sin_;
};

}  // namespace memdecay_eval

#endif  // MEMDECAY_EVAL_ENGINE_TINY_LM_HPP
