// SPDX-License-Identifier: Apache-2.0
// memdecay-eval engine: the bundled tiny decoder's configuration and vocabulary layout, parsed from the JSON that
// a model file carries in its safetensors __metadata__ (docs/models.md).
#ifndef MEMDECAY_EVAL_ENGINE_MODEL_CONFIG_HPP
#define MEMDECAY_EVAL_ENGINE_MODEL_CONFIG_HPP

#include <map>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

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

}  // namespace memdecay_eval

#endif  // MEMDECAY_EVAL_ENGINE_MODEL_CONFIG_HPP
