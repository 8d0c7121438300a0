// SPDX-License-Identifier: Apache-2.0
// memdecay-eval engine: the bundled tiny decoder's configuration and vocabulary layout, parsed from the JSON that
// a model file carries in its safetensors __metadata__ (docs/models.md).
//
// Two architectures (config field "arch"; a file without it is the first):
//   "conv"  the bundled models (python/model.py): a causal depthwise convolution of conv_kernel > 0 taps before
//           the attention projections, GELU MLP with biases ("mlp": "gelu", the default);
//   "llama" python/llama_model.py: no convolution (conv_kernel 0), SwiGLU MLP without biases ("mlp": "swiglu",
//           the default for this arch), grouped-query attention with n_kv_heads key/value heads.
// n_kv_heads (default n_heads) must divide n_heads: query head j reads kv head j / (n_heads / n_kv_heads).
#ifndef MEMDECAY_EVAL_ENGINE_MODEL_CONFIG_HPP
#define MEMDECAY_EVAL_ENGINE_MODEL_CONFIG_HPP

#include <cstdint>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace memdecay_eval {

// The block's layout: the bundled conv decoder (python/model.py) or the plain LLaMA block (python/llama_model.py).
enum class model_arch { conv, llama };
// The MLP: gelu_erf(w1 h + b1) w2 + b2, or w_down (silu(w_gate h) * (w_up h)) without biases.
enum class mlp_kind { gelu, swiglu };

[[nodiscard]] inline const char* to_string(model_arch a) noexcept { return a == model_arch::llama ? "llama" : "conv"; }
[[nodiscard]] inline const char* to_string(mlp_kind m) noexcept { return m == mlp_kind::swiglu ? "swiglu" : "gelu"; }

struct model_config {
  int vocab = 0, d_model = 0, n_layers = 0, n_heads = 0, conv_kernel = 0, mlp_hidden = 0, max_positions = 0;
  int n_kv_heads = 0;  // key/value heads (grouped-query attention); n_heads when the file does not say
  float rope_theta = 10000.0f, norm_eps = 1e-5f;
  model_arch arch = model_arch::conv;
  mlp_kind mlp = mlp_kind::gelu;
  [[nodiscard]] int head_dim() const noexcept { return n_heads > 0 ? d_model / n_heads : 0; }
  // Query heads per key/value head (1 without grouped-query attention).
  [[nodiscard]] int group_size() const noexcept { return n_kv_heads > 0 ? n_heads / n_kv_heads : 0; }
  [[nodiscard]] bool has_conv() const noexcept { return arch == model_arch::conv; }
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
inline std::string string_field(const nlohmann::json& j, const char* name, const std::string& what) {
  const auto& v = field(j, name, what);
  if (!v.is_string()) throw std::runtime_error(what + ": field '" + name + "' is not a string");
  return v.get<std::string>();
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
  if (j.is_object() && j.contains("arch")) {
    const std::string arch = detail::string_field(j, "arch", what);
    if (arch == "conv")
      c.arch = model_arch::conv;
    else if (arch == "llama")
      c.arch = model_arch::llama;
    else
      throw std::runtime_error(what + ": field 'arch' = '" + arch + "' is not a known architecture (conv, llama)");
  }
  c.mlp = c.arch == model_arch::llama ? mlp_kind::swiglu : mlp_kind::gelu;
  if (j.is_object() && j.contains("mlp")) {
    const std::string mlp = detail::string_field(j, "mlp", what);
    if (mlp == "gelu")
      c.mlp = mlp_kind::gelu;
    else if (mlp == "swiglu")
      c.mlp = mlp_kind::swiglu;
    else
      throw std::runtime_error(what + ": field 'mlp' = '" + mlp + "' is not a known MLP (gelu, swiglu)");
  }
  c.vocab = detail::int_field(j, "vocab", what);
  c.d_model = detail::int_field(j, "d_model", what);
  c.n_layers = detail::int_field(j, "n_layers", what);
  c.n_heads = detail::int_field(j, "n_heads", what);
  c.n_kv_heads = j.contains("n_kv_heads") ? detail::int_field(j, "n_kv_heads", what) : c.n_heads;
  // The llama block has no convolution: conv_kernel may be left out, and must be 0 when given.
  c.conv_kernel =
      c.arch == model_arch::llama && !j.contains("conv_kernel") ? 0 : detail::int_field(j, "conv_kernel", what);
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
  positive(c.n_kv_heads, "n_kv_heads");
  if (c.arch == model_arch::conv)
    positive(c.conv_kernel, "conv_kernel");
  else if (c.conv_kernel != 0)
    throw std::runtime_error(what + ": field 'conv_kernel' = " + std::to_string(c.conv_kernel) +
                             " (arch 'llama' has no convolution: must be 0)");
  positive(c.mlp_hidden, "mlp_hidden");
  positive(c.max_positions, "max_positions");
  if (c.d_model % c.n_heads != 0 || (c.d_model / c.n_heads) % 2 != 0)
    throw std::runtime_error(what + ": d_model " + std::to_string(c.d_model) + " must split into " +
                             std::to_string(c.n_heads) + " heads of even size");
  if (c.n_heads % c.n_kv_heads != 0)
    throw std::runtime_error(what + ": field 'n_kv_heads' = " + std::to_string(c.n_kv_heads) +
                             " must divide n_heads = " + std::to_string(c.n_heads));
  if (!(c.rope_theta > 0.0f)) throw std::runtime_error(what + ": field 'rope_theta' must be > 0");
  if (!(c.norm_eps > 0.0f)) throw std::runtime_error(what + ": field 'norm_eps' must be > 0");
  return c;
}

}  // namespace memdecay_eval

#endif  // MEMDECAY_EVAL_ENGINE_MODEL_CONFIG_HPP
