// SPDX-License-Identifier: Apache-2.0
// memdecay-eval engine: the bundled tiny decoder (python/model.py) in C++, with a paged KV cache whose blocks
// belong to memdecay's owning block_pool.
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
// tiny_lm is immutable after load() and may be shared by any number of threads. kv_session is one sequence's
// cache and is not thread-safe (not even its const answer(), which uses the session's scratch buffers).
//
// kv_session keeps K (RoPE applied when written, at the token's absolute position) and V of every layer in the
// blocks of its own memdecay::block_pool: one storage slab per block id x layer x {K, V} x page slot. It reads
// them through the pool's block table on every step, so after `policy.commit(plan, table(), sequence())` has
// removed pages it attends over exactly the surviving tokens, at their original positions, in block-table order.
// The convolution state (the last k-1 normed inputs per layer) lives outside the cache: the convolution always
// sees the true previous tokens, evicted or not.
#ifndef MEMDECAY_EVAL_ENGINE_TINY_LM_HPP
#define MEMDECAY_EVAL_ENGINE_TINY_LM_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include <memdecay/page_tables/block_pool.hpp>

#include "safetensors.hpp"

namespace memdecay_eval {

struct model_config {
  int vocab = 0, d_model = 0, n_layers = 0, n_heads = 0, conv_kernel = 0, mlp_hidden = 0, max_positions = 0;
  float rope_theta = 10000.0f, norm_eps = 1e-5f;
  [[nodiscard]] int head_dim() const noexcept { return n_heads > 0 ? d_model / n_heads : 0; }
};

struct vocab_layout {
  int pad = 0, bos = 0, query = 0;
  std::map<std::string, int> region_markers;
  int key_first = 0, key_count = 0, value_first = 0, value_count = 0, filler_first = 0, filler_count = 0;
};

namespace detail {

inline const nlohmann::json& field(const nlohmann::json& j, const char* name, const std::string& what) {
  if (!j.is_object()) throw std::runtime_error(what + " is not a JSON object");
  auto it = j.find(name);
  if (it == j.end()) throw std::runtime_error(what + ": missing field '" + name + "'");
  return *it;
}
inline int int_field(const nlohmann::json& j, const char* name, const std::string& what) {
  const auto& v = field(j, name, what);
  if (!v.is_number_integer()) throw std::runtime_error(what + ": field '" + name + "' is not an integer");
  const auto x = v.get<std::int64_t>();
  if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
    throw std::runtime_error(what + ": field '" + name + "' is out of range");
  return static_cast<int>(x);
}
inline float float_field(const nlohmann::json& j, const char* name, const std::string& what) {
  const auto& v = field(j, name, what);
  if (!v.is_number()) throw std::runtime_error(what + ": field '" + name + "' is not a number");
  return v.get<float>();
}
// A metadata entry holds JSON text; accept an already-parsed object too.
inline nlohmann::json json_text(const std::string& text, const std::string& what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(what + " is not valid JSON: " + e.what());
  }
}

}  // namespace detail

// Throws std::runtime_error naming the missing or mistyped field.
inline vocab_layout parse_vocab_layout(const nlohmann::json& j) {
  const std::string what = "vocab_layout";
  vocab_layout v;
  v.pad = detail::int_field(j, "pad", what);
  v.bos = detail::int_field(j, "bos", what);
  v.query = detail::int_field(j, "query", what);
  const auto& markers = detail::field(j, "region_markers", what);
  if (!markers.is_object()) throw std::runtime_error(what + ": field 'region_markers' is not an object");
  for (const auto& [name, id] : markers.items()) {
    if (!id.is_number_integer()) throw std::runtime_error(what + ": region_markers['" + name + "'] is not an integer");
    v.region_markers[name] = id.get<int>();
  }
  v.key_first = detail::int_field(j, "key_first", what);
  v.key_count = detail::int_field(j, "key_count", what);
  v.value_first = detail::int_field(j, "value_first", what);
  v.value_count = detail::int_field(j, "value_count", what);
  v.filler_first = detail::int_field(j, "filler_first", what);
  v.filler_count = detail::int_field(j, "filler_count", what);
  return v;
}

// Throws std::runtime_error naming the missing, mistyped or invalid field.
inline model_config parse_model_config(const nlohmann::json& j) {
  const std::string what = "model config";
  model_config c;
  c.vocab = detail::int_field(j, "vocab", what);
  c.d_model = detail::int_field(j, "d_model", what);
  c.n_layers = detail::int_field(j, "n_layers", what);
  c.n_heads = detail::int_field(j, "n_heads", what);
  c.conv_kernel = detail::int_field(j, "conv_kernel", what);
  c.mlp_hidden = detail::int_field(j, "mlp_hidden", what);
  c.max_positions = detail::int_field(j, "max_positions", what);
  c.rope_theta = detail::float_field(j, "rope_theta", what);
  c.norm_eps = detail::float_field(j, "norm_eps", what);
  auto positive = [&](int x, const char* name) {
    if (x <= 0) throw std::runtime_error(what + ": field '" + name + "' = " + std::to_string(x) + " (must be > 0)");
  };
  positive(c.vocab, "vocab");
  positive(c.d_model, "d_model");
  positive(c.n_layers, "n_layers");
  positive(c.n_heads, "n_heads");
  positive(c.conv_kernel, "conv_kernel");
  positive(c.mlp_hidden, "mlp_hidden");
  positive(c.max_positions, "max_positions");
  if (c.d_model % c.n_heads != 0 || (c.d_model / c.n_heads) % 2 != 0)
    throw std::runtime_error(what + ": d_model " + std::to_string(c.d_model) + " must split into " +
                             std::to_string(c.n_heads) + " heads of even size");
  if (!(c.rope_theta > 0.0f)) throw std::runtime_error(what + ": field 'rope_theta' must be > 0");
  if (!(c.norm_eps > 0.0f)) throw std::runtime_error(what + ": field 'norm_eps' must be > 0");
  return c;
}

class kv_session;

class tiny_lm {
 public:
  using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using vector = Eigen::VectorXf;
  struct layer_weights {
    vector norm1, conv_bias, norm2, b1, b2;
    matrix conv;  // [k, d]: row j is conv_weight[:, j]
    matrix wqkv;  // [3d, d]: wq, wk, wv stacked (torch Linear layout, [out, in])
    matrix wo, w1, w2;
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
    std::vector<std::pair<std::string, std::vector<std::int64_t>>> expected = {{"embed", {V, d}}, {"norm_f", {d}}};
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      for (auto& e : std::vector<std::pair<std::string, std::vector<std::int64_t>>>{{"norm1", {d}},
                                                                                    {"conv_weight", {d, k}},
                                                                                    {"conv_bias", {d}},
                                                                                    {"wq", {d, d}},
                                                                                    {"wk", {d, d}},
                                                                                    {"wv", {d, d}},
                                                                                    {"wo", {d, d}},
                                                                                    {"norm2", {d}},
                                                                                    {"w1", {f, d}},
                                                                                    {"b1", {f}},
                                                                                    {"w2", {d, f}},
                                                                                    {"b2", {d}}})
        expected.emplace_back(p + e.first, e.second);
    }
    for (const auto& [name, shape] : expected)
      if (!file.contains(name)) throw std::runtime_error(where + "tensor '" + name + "' is missing");
    for (const auto& [name, info] : file.tensors()) {
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
      lw.conv = load_matrix(p + "conv_weight", d, k).transpose();
      lw.conv_bias = load_vector(p + "conv_bias", d);
      lw.wqkv.resize(3 * d, d);
      lw.wqkv.topRows(d) = load_matrix(p + "wq", d, d);
      lw.wqkv.middleRows(d, d) = load_matrix(p + "wk", d, d);
      lw.wqkv.bottomRows(d) = load_matrix(p + "wv", d, d);
      lw.wo = load_matrix(p + "wo", d, d);
      lw.norm2 = load_vector(p + "norm2", d);
      lw.w1 = load_matrix(p + "w1", f, d);
      lw.b1 = load_vector(p + "b1", f);
      lw.w2 = load_matrix(p + "w2", d, f);
      lw.b2 = load_vector(p + "b2", d);
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
  };
  // The dense reference forward at positions 0..n-1 where query i attends to key j exactly when
  // visible(i, j) (full_logits: j <= i). The convolution always sees the true previous tokens. With
  // `keep_attention`, the attention probabilities of every layer, query and head are returned as well.
  [[nodiscard]] reference_result reference_forward(std::span<const std::int32_t> tokens,
                                                   const std::function<bool(std::size_t, std::size_t)>& visible,
                                                   bool keep_attention = false) const {
    const auto& c = config_;
    const std::size_t n = tokens.size(), d = static_cast<std::size_t>(c.d_model),
                      H = static_cast<std::size_t>(c.n_heads);
    const std::size_t hd = d / H, k = static_cast<std::size_t>(c.conv_kernel),
                      f = static_cast<std::size_t>(c.mlp_hidden);
    check_tokens(tokens, "full_logits");
    reference_result out;
    matrix x(n, d), h(n, d), e(n + k - 1, d), cv(n, d), qkv(n, 3 * d), att(n, d), u(n, f);
    for (std::size_t t = 0; t < n; ++t) x.row(static_cast<Eigen::Index>(t)) = w_.embed.row(tokens[t]);
    std::vector<char> mask(n * n);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) mask[i * n + j] = visible(i, j) ? 1 : 0;
    std::vector<float> scores(n);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (const auto& lw : w_.layers) {
      rmsnorm_rows(x.data(), n, lw.norm1.data(), h.data());
      std::fill(e.data(), e.data() + (k - 1) * d, 0.0f);
      std::copy(h.data(), h.data() + n * d, e.data() + (k - 1) * d);
      conv_rows(lw, e.data(), n, cv.data());
      qkv.noalias() = cv * lw.wqkv.transpose();
      for (std::size_t t = 0; t < n; ++t) {
        apply_rope(qkv.data() + t * 3 * d, static_cast<std::uint32_t>(t));
        apply_rope(qkv.data() + t * 3 * d + d, static_cast<std::uint32_t>(t));
      }
      std::vector<float> probs;
      if (keep_attention) probs.assign(n * H * n, 0.0f);
      att.setZero();
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t hh = 0; hh < H; ++hh) {
          const float* q = qkv.data() + i * 3 * d + hh * hd;
          float mx = -std::numeric_limits<float>::infinity();
          for (std::size_t j = 0; j < n; ++j) {
            if (!mask[i * n + j]) continue;
            const float* kk = qkv.data() + j * 3 * d + d + hh * hd;
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
            const float* vv = qkv.data() + j * 3 * d + 2 * d + hh * hd;
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
    const std::size_t H = static_cast<std::size_t>(config_.n_heads), hd = static_cast<std::size_t>(config_.head_dim());
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
  // x += w2 gelu(w1 (rmsnorm(x) * norm2) + b1) + b2 for n rows; h [n x d] and u [n x mlp_hidden] are scratch.
  void mlp_rows(const layer_weights& lw, float* x, std::size_t n, float* h, float* u) const {
    const auto d = static_cast<Eigen::Index>(config_.d_model), f = static_cast<Eigen::Index>(config_.mlp_hidden);
    const auto rows = static_cast<Eigen::Index>(n);
    rmsnorm_rows(x, n, lw.norm2.data(), h);
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

// One sequence's paged KV cache over an owning memdecay::block_pool (see the file comment).
class kv_session {
 public:
  using pool_type = memdecay::block_pool<std::int32_t, std::uint64_t>;

  // A session for at most `max_tokens` resident tokens in pages of `page_size` (a power of two) tokens.
  kv_session(const tiny_lm& model, std::size_t page_size, std::size_t max_tokens)
      : model_(&model), P_(page_size), max_tokens_(max_tokens), pool_(blocks_for(page_size, max_tokens), page_size) {
    const auto& c = model.config();
    d_ = static_cast<std::size_t>(c.d_model);
    L_ = static_cast<std::size_t>(c.n_layers);
    H_ = static_cast<std::size_t>(c.n_heads);
    hd_ = d_ / H_;
    k_ = static_cast<std::size_t>(c.conv_kernel);
    const std::size_t blocks = pool_.capacity();
    kv_.assign(blocks * L_ * 2 * P_ * d_, 0.0f);
    block_first_pos_.assign(blocks, 0);
    conv_state_.assign(L_ * (k_ - 1) * d_, 0.0f);
    pool_.open(sequence_id);
  }

  struct step_result {
    std::vector<float> last_logits;              // vocab entries, for the chunk's last token
    std::vector<std::vector<float>> layer_mass;  // [layer][resident token incl. the chunk, block-table order]:
                                                 // attention probability summed over heads and the chunk's
                                                 // queries, divided by heads * queries (each row sums to 1)
  };

  // Runs the chunk at the next absolute positions, writes its K/V into the pool and returns the last token's
  // logits and each layer's attention mass over the resident tokens (those before the chunk and the chunk,
  // causal within it). Throws std::runtime_error for an empty chunk, a token outside the vocabulary, or a
  // chunk that does not fit max_tokens resident tokens (the session is then unchanged).
  step_result append(std::span<const std::int32_t> tokens) {
    if (tokens.empty()) throw std::runtime_error("kv_session::append: empty chunk");
    model_->check_tokens(tokens, "kv_session::append");
    const std::size_t n = tokens.size(), r0 = resident_tokens();
    if (r0 + n > max_tokens_)
      throw std::runtime_error("kv_session::append: " + std::to_string(r0) + " resident + " + std::to_string(n) +
                               " new tokens exceed max_tokens " + std::to_string(max_tokens_));
    if (appended_ + n > std::numeric_limits<std::uint32_t>::max())
      throw std::runtime_error("kv_session::append: positions overflow");
    pool_.append_tokens(sequence_id, n);
    const auto table = pool_.block_table(sequence_id);
    for (std::size_t i = r0; i < r0 + n; ++i)
      if (i % P_ == 0)
        block_first_pos_[static_cast<std::size_t>(table[i / P_])] = static_cast<std::uint32_t>(appended_ + (i - r0));
    step_result out;
    out.last_logits.resize(static_cast<std::size_t>(model_->config().vocab));
    out.layer_mass.assign(L_, std::vector<float>(r0 + n, 0.0f));
    forward(tokens, static_cast<std::uint32_t>(appended_), conv_state_.data(), kv_.data(), 0, &out.layer_mass,
            out.last_logits.data());
    appended_ += n;
    return out;
  }

  // Greedy decoding of `max_new` tokens after `prompt` over the resident cache (the prompt at the next absolute
  // positions). The session is unchanged afterwards: the prompt's and the answer's K/V live in a side buffer.
  [[nodiscard]] std::vector<std::int32_t> answer(std::span<const std::int32_t> prompt, std::size_t max_new) const {
    if (prompt.empty()) throw std::runtime_error("kv_session::answer: empty prompt");
    model_->check_tokens(prompt, "kv_session::answer");
    std::vector<std::int32_t> out;
    if (max_new == 0) return out;
    out.reserve(max_new);
    conv_probe_ = conv_state_;
    const std::size_t V = static_cast<std::size_t>(model_->config().vocab);
    probe_logits_.resize(V);
    std::size_t side = 0;
    std::uint32_t pos = static_cast<std::uint32_t>(appended_);
    std::span<const std::int32_t> chunk = prompt;
    std::int32_t next = 0;
    for (std::size_t i = 0; i < max_new; ++i) {
      forward(chunk, pos, conv_probe_.data(), nullptr, side, nullptr, probe_logits_.data());
      side += chunk.size();
      pos += static_cast<std::uint32_t>(chunk.size());
      next = static_cast<std::int32_t>(std::max_element(probe_logits_.begin(), probe_logits_.end()) -
                                       probe_logits_.begin());
      out.push_back(next);
      chunk = std::span<const std::int32_t>(&next, 1);
    }
    return out;
  }

  [[nodiscard]] pool_type& table() noexcept { return pool_; }
  [[nodiscard]] const pool_type& table() const noexcept { return pool_; }
  [[nodiscard]] std::uint64_t sequence() const noexcept { return sequence_id; }
  [[nodiscard]] std::size_t resident_tokens() const { return pool_.num_tokens(sequence_id); }
  [[nodiscard]] std::size_t appended_tokens() const noexcept { return appended_; }
  [[nodiscard]] std::size_t page_size() const noexcept { return P_; }
  [[nodiscard]] std::size_t max_tokens() const noexcept { return max_tokens_; }
  [[nodiscard]] const tiny_lm& model() const noexcept { return *model_; }
  // Absolute positions of the resident tokens, in block-table order.
  [[nodiscard]] std::vector<std::uint32_t> resident_positions() const {
    const std::size_t r = resident_tokens();
    const auto table = pool_.block_table(sequence_id);
    std::vector<std::uint32_t> out(r);
    for (std::size_t i = 0; i < r; ++i)
      out[i] = block_first_pos_[static_cast<std::size_t>(table[i / P_])] + static_cast<std::uint32_t>(i % P_);
    return out;
  }

 private:
  static constexpr std::uint64_t sequence_id = 0;
  using matrix = tiny_lm::matrix;

  // Offset of the K (kv = 0) or V (kv = 1) row of `slot` in block `block`, layer `layer`.
  [[nodiscard]] std::size_t slab(std::size_t block, std::size_t layer, std::size_t kv) const noexcept {
    return ((block * L_ + layer) * 2 + kv) * P_ * d_;
  }
  static std::size_t blocks_for(std::size_t page_size, std::size_t max_tokens) {
    if (page_size == 0 || (page_size & (page_size - 1)) != 0)
      throw std::runtime_error("kv_session: page_size " + std::to_string(page_size) + " is not a power of two");
    if (max_tokens == 0) throw std::runtime_error("kv_session: max_tokens must be > 0");
    return (max_tokens + page_size - 1) / page_size;
  }
  static void grow(std::vector<float>& v, std::size_t size) {
    if (v.size() < size) v.resize(std::max(size, v.size() * 2));
  }

  // Runs `tokens` at positions first_pos.. through every layer. With `pool_kv` (append), the chunk is already in
  // the pool as its last tokens: its K/V are written there and query t sees resident tokens [0, r - n + t].
  // Without (answer), query t sees every resident token and the side buffer's [0, side_before + t]; the chunk's
  // K/V are appended to the side buffer. `mass` (append only) accumulates each layer's attention row.
  void forward(std::span<const std::int32_t> tokens, std::uint32_t first_pos, float* conv, float* pool_kv,
               std::size_t side_before, std::vector<std::vector<float>>* mass, float* logits) const {
    const auto& w = model_->weights();
    const std::size_t n = tokens.size(), d = d_, hd = hd_, k = k_;
    const std::size_t f = static_cast<std::size_t>(model_->config().mlp_hidden);
    const std::size_t resident = resident_tokens();
    const std::size_t r_before = pool_kv ? resident - n : resident;
    const std::size_t side_total = pool_kv ? 0 : side_before + n;
    const auto table = pool_.block_table(sequence_id);
    const auto rows = static_cast<Eigen::Index>(n);

    grow(x_, n * d);
    grow(h_, n * d);
    grow(e_, (n + k - 1) * d);
    grow(c_, n * d);
    grow(qkv_, n * 3 * d);
    grow(att_, n * d);
    grow(u_, n * f);
    grow(scores_, n * (resident + side_total));
    grow(acc_, n * hd);
    if (!pool_kv) {
      if (side_kv_.size() < 2 * L_) side_kv_.resize(2 * L_);
      for (auto& buffer : side_kv_) grow(buffer, side_total * d);  // keeps the rows already written
    }

    for (std::size_t t = 0; t < n; ++t) {
      const float* src = w.embed.data() + static_cast<std::size_t>(tokens[t]) * d;
      std::copy(src, src + d, x_.data() + t * d);
    }
    for (std::size_t l = 0; l < L_; ++l) {
      const auto& lw = w.layers[l];
      float* state = conv + l * (k - 1) * d;
      // Normed inputs, preceded by the k-1 previous ones; then the state keeps the last k-1 of them.
      model_->rmsnorm_rows(x_.data(), n, lw.norm1.data(), e_.data() + (k - 1) * d);
      std::copy(state, state + (k - 1) * d, e_.data());
      model_->conv_rows(lw, e_.data(), n, c_.data());
      std::copy(e_.data() + n * d, e_.data() + (n + k - 1) * d, state);
      Eigen::Map<matrix>(qkv_.data(), rows, 3 * static_cast<Eigen::Index>(d)).noalias() =
          Eigen::Map<const matrix>(c_.data(), rows, static_cast<Eigen::Index>(d)) * lw.wqkv.transpose();
      // RoPE on q and k, then the chunk's K/V go to their slots.
      for (std::size_t t = 0; t < n; ++t) {
        float* row = qkv_.data() + t * 3 * d;
        model_->apply_rope(row, first_pos + static_cast<std::uint32_t>(t));
        model_->apply_rope(row + d, first_pos + static_cast<std::uint32_t>(t));
        float *kdst, *vdst;
        if (pool_kv) {
          const std::size_t i = r_before + t;
          const std::size_t block = static_cast<std::size_t>(table[i / P_]), slot = i % P_;
          kdst = pool_kv + slab(block, l, 0) + slot * d;
          vdst = pool_kv + slab(block, l, 1) + slot * d;
        } else {
          kdst = side_kv_[2 * l].data() + (side_before + t) * d;
          vdst = side_kv_[2 * l + 1].data() + (side_before + t) * d;
        }
        std::copy(row + d, row + 2 * d, kdst);
        std::copy(row + 2 * d, row + 3 * d, vdst);
      }
      const attention_args args{l,
                                n,
                                table,
                                pool_kv ? pool_kv : kv_.data(),
                                pool_kv ? nullptr : side_kv_[2 * l].data(),
                                pool_kv ? nullptr : side_kv_[2 * l + 1].data(),
                                pool_kv != nullptr,
                                r_before,
                                resident,
                                side_before,
                                mass ? (*mass)[l].data() : nullptr};
      switch (hd) {  // fixed head sizes keep a head's query and output in registers
        case 16: n == 1 ? attention<16>(args) : attention_chunk<16>(args); break;
        case 32: n == 1 ? attention<32>(args) : attention_chunk<32>(args); break;
        case 48: n == 1 ? attention<48>(args) : attention_chunk<48>(args); break;
        case 64: n == 1 ? attention<64>(args) : attention_chunk<64>(args); break;
        default: n == 1 ? attention<Eigen::Dynamic>(args) : attention_chunk<Eigen::Dynamic>(args); break;
      }
      Eigen::Map<matrix>(x_.data(), rows, static_cast<Eigen::Index>(d)).noalias() +=
          Eigen::Map<const matrix>(att_.data(), rows, static_cast<Eigen::Index>(d)) * lw.wo.transpose();
      model_->mlp_rows(lw, x_.data(), n, h_.data(), u_.data());
    }
    model_->final_logits(x_.data() + (n - 1) * d, h_.data(), logits);
  }

  struct attention_args {
    std::size_t layer, n;
    std::span<const std::int32_t> table;
    const float *kv, *side_k, *side_v;
    bool pooled;  // append: the chunk is the pool's last n tokens; answer: it is the side buffer's last n
    std::size_t r_before, resident, side_before;
    float* mass;  // the layer's mass row (append) or null
  };

  // Attention of the chunk's n queries (rows of qkv_, RoPE applied) over the resident tokens, read through the
  // block table, and the side buffer; writes the merged heads to att_ and adds each query's probabilities,
  // divided by heads * n, to the mass row. Scores, probabilities and the weighted sum run one head at a time.
  // The same for a chunk of n > 1 queries, key-major: each K and V row is read once per head and used by every
  // query of the chunk that sees it (scores [query][column] in scores_, outputs accumulated in acc_).
  template <int HD>
  void attention_chunk(const attention_args& a) const {
    using vec = Eigen::Matrix<float, HD, 1>;
    using cmap = Eigen::Map<const vec>;
    using map = Eigen::Map<vec>;
    const std::size_t d = d_, H = H_, hd = hd_, n = a.n, l = a.layer;
    const auto hdi = static_cast<Eigen::Index>(hd);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const float share = 1.0f / static_cast<float>(H * n);
    // Query t sees resident columns [0, rq(t)) and side columns [0, sq(t)); C is the last query's total.
    const std::size_t r_last = a.pooled ? a.r_before + n : a.resident;
    const std::size_t C = r_last + (a.pooled ? 0 : a.side_before + n);
    auto first_query = [&](std::size_t column) -> std::size_t {  // the first query that sees `column`
      if (column < r_last) return a.pooled && column > a.r_before ? column - a.r_before : 0;
      const std::size_t s = column - r_last;
      return s > a.side_before ? s - a.side_before : 0;
    };
    auto cols_of = [&](std::size_t t) { return a.pooled ? a.r_before + t + 1 : a.resident + a.side_before + t + 1; };
    auto rq_of = [&](std::size_t t) { return a.pooled ? a.r_before + t + 1 : a.resident; };
    float* S = scores_.data();
    float* acc = acc_.data();
    for (std::size_t h = 0; h < H; ++h) {
      const std::size_t off = h * hd;
      // Scores.
      auto score_column = [&](std::size_t j, const float* krow) {
        const cmap k(krow, hdi);
        for (std::size_t t = first_query(j); t < n; ++t)
          S[t * C + j] = cmap(qkv_.data() + t * 3 * d + off, hdi).dot(k) * scale;
      };
      for (std::size_t b = 0, j = 0; j < r_last; ++b) {
        const std::size_t slots = std::min(P_, r_last - j);
        const float* kb = a.kv + slab(static_cast<std::size_t>(a.table[b]), l, 0) + off;
        for (std::size_t s = 0; s < slots; ++s, ++j) score_column(j, kb + s * d);
      }
      for (std::size_t j = r_last; j < C; ++j) score_column(j, a.side_k + (j - r_last) * d + off);
      // Softmax per query (over the columns it sees), and the mass.
      for (std::size_t t = 0; t < n; ++t) {
        float* st = S + t * C;
        const std::size_t cols = cols_of(t), rq = rq_of(t);
        // Columns a query sees: resident [0, rq), then side [r_last, r_last + cols - rq).
        float mx = -std::numeric_limits<float>::infinity();
        for (std::size_t i = 0; i < rq; ++i) mx = std::max(mx, st[i]);
        for (std::size_t i = r_last; i < r_last + cols - rq; ++i) mx = std::max(mx, st[i]);
        float sum = 0;
        for (std::size_t i = 0; i < rq; ++i) sum += (st[i] = std::exp(st[i] - mx));
        for (std::size_t i = r_last; i < r_last + cols - rq; ++i) sum += (st[i] = std::exp(st[i] - mx));
        for (std::size_t i = 0; i < rq; ++i) st[i] /= sum;
        for (std::size_t i = r_last; i < r_last + cols - rq; ++i) st[i] /= sum;
        if (a.mass)
          for (std::size_t i = 0; i < rq; ++i) a.mass[i] += st[i] * share;
      }
      // Outputs.
      std::fill(acc, acc + n * hd, 0.0f);
      auto value_column = [&](std::size_t j, const float* vrow) {
        const std::conditional_t<HD == Eigen::Dynamic, cmap, vec> v = cmap(vrow, hdi);  // fixed: in registers
        for (std::size_t t = first_query(j); t < n; ++t) map(acc + t * hd, hdi).noalias() += S[t * C + j] * v;
      };
      for (std::size_t b = 0, j = 0; j < r_last; ++b) {
        const std::size_t slots = std::min(P_, r_last - j);
        const float* vb = a.kv + slab(static_cast<std::size_t>(a.table[b]), l, 1) + off;
        for (std::size_t s = 0; s < slots; ++s, ++j) value_column(j, vb + s * d);
      }
      for (std::size_t j = r_last; j < C; ++j) value_column(j, a.side_v + (j - r_last) * d + off);
      for (std::size_t t = 0; t < n; ++t) std::copy(acc + t * hd, acc + (t + 1) * hd, att_.data() + t * d + off);
    }
  }

  template <int HD>
  void attention(const attention_args& a) const {
    using vec = Eigen::Matrix<float, HD, 1>;
    using cmap = Eigen::Map<const vec>;
    const std::size_t d = d_, H = H_, hd = hd_, n = a.n, l = a.layer;
    const auto hdi = static_cast<Eigen::Index>(hd);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const float share = 1.0f / static_cast<float>(H * n);
    for (std::size_t t = 0; t < n; ++t) {
      const float* q = qkv_.data() + t * 3 * d;
      float* o = att_.data() + t * d;
      const std::size_t rq = a.pooled ? a.r_before + t + 1 : a.resident;  // resident tokens this query sees
      const std::size_t sq = a.pooled ? 0 : a.side_before + t + 1;        // side tokens this query sees
      float* sc = scores_.data();
      for (std::size_t h = 0; h < H; ++h) {
        const std::size_t off = h * hd;
        auto run = [&](const auto& qh, auto acc) {  // acc by value: kept in registers
          float mx = -std::numeric_limits<float>::infinity();
          for (std::size_t b = 0, i = 0; i < rq; ++b) {
            const std::size_t slots = std::min(P_, rq - i);
            const float* kb = a.kv + slab(static_cast<std::size_t>(a.table[b]), l, 0) + off;
            for (std::size_t s = 0; s < slots; ++s, ++i)
              mx = std::max(mx, sc[i] = qh.dot(cmap(kb + s * d, hdi)) * scale);
          }
          for (std::size_t s = 0; s < sq; ++s)
            mx = std::max(mx, sc[rq + s] = qh.dot(cmap(a.side_k + s * d + off, hdi)) * scale);
          const std::size_t cols = rq + sq;
          float sum = 0;
          for (std::size_t i = 0; i < cols; ++i) sum += (sc[i] = std::exp(sc[i] - mx));
          for (std::size_t i = 0; i < cols; ++i) sc[i] /= sum;
          if (a.mass)
            for (std::size_t i = 0; i < rq; ++i) a.mass[i] += sc[i] * share;
          for (std::size_t b = 0, i = 0; i < rq; ++b) {
            const std::size_t slots = std::min(P_, rq - i);
            const float* vb = a.kv + slab(static_cast<std::size_t>(a.table[b]), l, 1) + off;
            for (std::size_t s = 0; s < slots; ++s, ++i) acc.noalias() += sc[i] * cmap(vb + s * d, hdi);
          }
          for (std::size_t s = 0; s < sq; ++s) acc.noalias() += sc[rq + s] * cmap(a.side_v + s * d + off, hdi);
          return acc;
        };
        if constexpr (HD == Eigen::Dynamic) {
          const Eigen::Map<const Eigen::VectorXf> qh(q + off, hdi);
          Eigen::Map<Eigen::VectorXf> acc(o + off, hdi);
          acc.setZero();
          run(qh, acc);
        } else {
          const vec qh = cmap(q + off);
          Eigen::Map<vec>(o + off) = run(qh, vec::Zero().eval());
        }
      }
    }
  }

  const tiny_lm* model_;
  std::size_t P_, max_tokens_;
  std::size_t d_ = 0, L_ = 0, H_ = 0, hd_ = 0, k_ = 0;
  pool_type pool_;
  std::vector<float> kv_;                       // [block][layer][K|V][slot][d_model]
  std::vector<std::uint32_t> block_first_pos_;  // absolute position of each block's slot 0
  std::vector<float> conv_state_;               // [layer][k-1][d_model]
  std::size_t appended_ = 0;
  // Scratch (reused across calls; grows only).
  mutable std::vector<float> x_, h_, e_, c_, qkv_, att_, u_, scores_, acc_, conv_probe_, probe_logits_;
  mutable std::vector<std::vector<float>> side_kv_;  // answer(): [layer][K|V] rows of the probe's tokens
};

}  // namespace memdecay_eval

#endif  // MEMDECAY_EVAL_ENGINE_TINY_LM_HPP
