// SPDX-License-Identifier: Apache-2.0
#include "text_params.hpp"

#include <cerrno>
#include <charconv>
#include <cstdlib>

namespace memdecay_c {

namespace {

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

[[noreturn]] void bad_value(const std::string& key, const std::string& value, const char* expected) {
  throw memdecay::config_error("parameter " + key + " = '" + value + "' (expected " + expected + ")");
}

template <class Int>
bool parse_int(const std::string& text, Int& out) {
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc{} && p == end && !text.empty();
}

}  // namespace

text_params::text_params(const char* text) {
  if (!text || trimmed(text).empty()) return;
  const std::string all(text);
  for (std::size_t start = 0;;) {
    const auto comma = all.find(',', start);
    const std::string entry = trimmed(all.substr(start, comma - start));  // to the end when there is no comma
    const auto eq = entry.find('=');
    if (eq == std::string::npos)
      throw memdecay::config_error("params '" + all + "': entry '" + entry + "' has no '=' (expected key=value)");
    const std::string key = trimmed(entry.substr(0, eq));
    if (key.empty()) throw memdecay::config_error("params '" + all + "': entry '" + entry + "' has no key");
    if (!values_.emplace(key, trimmed(entry.substr(eq + 1))).second)
      throw memdecay::config_error("params '" + all + "': " + key + " is given twice");
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}

const std::string* text_params::find(const std::string& key) {
  auto it = values_.find(key);
  if (it == values_.end()) return nullptr;
  taken_.insert(key);
  return &it->second;
}

void text_params::take(const std::string& key, bool& out) {
  const std::string* v = find(key);
  if (!v) return;
  if (*v == "true" || *v == "1")
    out = true;
  else if (*v == "false" || *v == "0")
    out = false;
  else
    bad_value(key, *v, "true, false, 1 or 0");
}

void text_params::take(const std::string& key, std::uint64_t& out) {
  const std::string* v = find(key);
  if (v && !parse_int(*v, out)) bad_value(key, *v, "a non-negative integer");
}

void text_params::take(const std::string& key, double& out) {
  const std::string* v = find(key);
  if (!v) return;
  char* end = nullptr;
  errno = 0;
  const double d = v->empty() ? 0.0 : std::strtod(v->c_str(), &end);
  if (v->empty() || end != v->c_str() + v->size() || errno == ERANGE) bad_value(key, *v, "a number");
  out = d;
}

void text_params::take(const std::string& key, std::string& out) {
  if (const std::string* v = find(key)) out = *v;
}

void text_params::take(const std::string& key, std::vector<int>& out) {
  const std::string* v = find(key);
  if (!v) return;
  std::vector<int> values;
  std::size_t start = 0;
  while (start <= v->size() && !v->empty()) {
    const auto colon = v->find(':', start);
    const std::string item = trimmed(v->substr(start, colon == std::string::npos ? std::string::npos : colon - start));
    int x = 0;
    if (!parse_int(item, x)) bad_value(key, *v, "integers separated by ':'");
    values.push_back(x);
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  out = std::move(values);
}

std::vector<std::string> text_params::unused() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : values_)
    if (!taken_.contains(k)) out.push_back(k);
  return out;
}

}  // namespace memdecay_c
