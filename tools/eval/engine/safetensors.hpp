// SPDX-License-Identifier: Apache-2.0
// memdecay-eval engine: a strict reader of the safetensors format (F32 tensors only).
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON header, then the raw little-endian data
// section. The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative to
// the data section) and may hold "__metadata__" (string -> string). Every check throws std::runtime_error with a
// message that names the file and the offending field or tensor: a header length that does not fit the file,
// a header that is not a JSON object, a tensor entry with a missing or mistyped field, offsets that run past the
// data section (a truncated file) or overlap another tensor's, and a byte length that disagrees with the shape.
#ifndef MEMDECAY_EVAL_ENGINE_SAFETENSORS_HPP
#define MEMDECAY_EVAL_ENGINE_SAFETENSORS_HPP

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace memdecay_eval {

static_assert(std::endian::native == std::endian::little, "the safetensors reader assumes a little-endian host");

struct tensor_info {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets into the data section, [begin, end)
};

// The shape as text, e.g. "[128, 64]".
inline std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

class safetensors_file {
 public:
  // Reads and validates the whole file. Throws std::runtime_error naming the file and the problem.
  static safetensors_file read(const std::filesystem::path& path) {
    const std::string where = "safetensors '" + path.string() + "': ";
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error(where + "cannot open the file");
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw std::runtime_error(where + "read error");
    return parse(bytes, path.string());
  }

  // Parses an in-memory image of a file (`name` is used in messages).
  static safetensors_file parse(const std::vector<char>& bytes, const std::string& name) {
    const std::string where = "safetensors '" + name + "': ";
    if (bytes.size() < 8)
      throw std::runtime_error(where + "file has " + std::to_string(bytes.size()) +
                               " bytes, too short for the 8-byte header length");
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    if (n > bytes.size() - 8)
      throw std::runtime_error(where + "header length " + std::to_string(n) + " exceeds the " +
                               std::to_string(bytes.size() - 8) +
                               " bytes after the length field (truncated file or "
                               "bad header length)");
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(where + "header (" + std::to_string(n) + " bytes) is not valid JSON: " + e.what());
    }
    if (!header.is_object()) throw std::runtime_error(where + "header is not a JSON object");

    safetensors_file f;
    f.name_ = name;
    const std::size_t data_first = 8 + static_cast<std::size_t>(n);
    f.data_.assign(bytes.begin() + static_cast<std::ptrdiff_t>(data_first), bytes.end());
    const std::uint64_t data_size = f.data_.size();

    for (const auto& [key, value] : header.items()) {
      if (key == "__metadata__") {
        if (!value.is_object()) throw std::runtime_error(where + "__metadata__ is not an object");
        for (const auto& [mk, mv] : value.items()) {
          if (!mv.is_string()) throw std::runtime_error(where + "__metadata__ field '" + mk + "' is not a string");
          f.metadata_[mk] = mv.get<std::string>();
        }
        continue;
      }
      const std::string tw = where + "tensor '" + key + "': ";
      if (!value.is_object()) throw std::runtime_error(tw + "entry is not an object");
      tensor_info t;
      if (!value.contains("dtype") || !value["dtype"].is_string())
        throw std::runtime_error(tw + "missing or non-string field 'dtype'");
      t.dtype = value["dtype"].get<std::string>();
      if (!value.contains("shape") || !value["shape"].is_array())
        throw std::runtime_error(tw + "missing or non-array field 'shape'");
      std::uint64_t elements = 1;
      for (const auto& dim : value["shape"]) {
        if (!dim.is_number_unsigned()) throw std::runtime_error(tw + "field 'shape' holds a non-negative integer only");
        const auto d = dim.get<std::uint64_t>();
        if (d > (std::uint64_t{1} << 40) || (d != 0 && elements > (std::uint64_t{1} << 40) / d))
          throw std::runtime_error(tw + "field 'shape' is too large");
        elements *= d;
        t.shape.push_back(static_cast<std::int64_t>(d));
      }
      const auto& off = value.contains("data_offsets") ? value["data_offsets"] : nlohmann::json();
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        throw std::runtime_error(tw + "field 'data_offsets' must be two non-negative integers");
      t.begin = off[0].get<std::uint64_t>();
      t.end = off[1].get<std::uint64_t>();
      if (t.begin > t.end)
        throw std::runtime_error(tw + "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                                 ") are reversed");
      if (t.end > data_size)
        throw std::runtime_error(tw + "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                                 ") run past the data section (" + std::to_string(data_size) +
                                 " bytes): truncated file?");
      const std::uint64_t width = element_size(t.dtype);
      if (width != 0 && t.end - t.begin != elements * width)
        throw std::runtime_error(tw + "holds " + std::to_string(t.end - t.begin) + " bytes, but " + t.dtype + " " +
                                 shape_text(t.shape) + " needs " + std::to_string(elements * width));
      f.tensors_.emplace(key, std::move(t));
    }

    // No two tensors may share bytes.
    std::vector<std::pair<const std::string*, const tensor_info*>> order;
    for (const auto& [k, t] : f.tensors_) order.emplace_back(&k, &t);
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
      return a.second->begin != b.second->begin ? a.second->begin < b.second->begin : a.second->end < b.second->end;
    });
    const std::string* reach_name = nullptr;  // the tensor whose bytes reach furthest so far
    std::uint64_t reach = 0;
    for (const auto& [key, t] : order) {
      if (t->end == t->begin) continue;  // empty tensors hold no bytes
      if (reach_name != nullptr && t->begin < reach)
        throw std::runtime_error(where + "tensor '" + *key + "' overlaps tensor '" + *reach_name +
                                 "' in the data section");
      if (t->end > reach) reach = t->end, reach_name = key;
    }
    return f;
  }

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  [[nodiscard]] const std::map<std::string, tensor_info>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] bool contains(const std::string& tensor) const { return tensors_.contains(tensor); }

  // The tensor's values, checking that it exists, is F32 and has exactly `shape`.
  [[nodiscard]] std::vector<float> f32(const std::string& tensor, const std::vector<std::int64_t>& shape) const {
    const std::string tw = "safetensors '" + name_ + "': tensor '" + tensor + "': ";
    auto it = tensors_.find(tensor);
    if (it == tensors_.end()) throw std::runtime_error(tw + "missing");
    const auto& t = it->second;
    if (t.dtype != "F32") throw std::runtime_error(tw + "dtype " + t.dtype + ", expected F32");
    if (t.shape != shape)
      throw std::runtime_error(tw + "shape " + shape_text(t.shape) + ", expected " + shape_text(shape));
    std::vector<float> out((t.end - t.begin) / 4);
    if (!out.empty()) std::memcpy(out.data(), data_.data() + t.begin, t.end - t.begin);
    return out;
  }

  // Bytes per element of a safetensors dtype; 0 for one this reader does not know.
  [[nodiscard]] static std::uint64_t element_size(const std::string& dtype) {
    static const std::map<std::string, std::uint64_t> sizes = {
        {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
        {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8}};
    auto it = sizes.find(dtype);
    return it == sizes.end() ? 0 : it->second;
  }

 private:
  std::string name_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, tensor_info> tensors_;
  std::vector<char> data_;
};

}  // namespace memdecay_eval

#endif  // MEMDECAY_EVAL_ENGINE_SAFETENSORS_HPP
