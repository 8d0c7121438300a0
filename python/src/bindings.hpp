// SPDX-License-Identifier: Apache-2.0
// memdecay's Python module (_memdecay): what the binding files share. Each bind_* function adds one concern to
// the module (errors, configuration, page tables, sequences, the manager, exports).
//
// Arrays cross the boundary without copies where the C++ API takes a span: an adapter keeps the caller's NumPy
// arrays alive and edits them in place, and attention is read straight from a float32 buffer (NumPy, or anything
// numpy.asarray views without a copy: a PyTorch CPU tensor, an object with __array__ or the buffer protocol). A
// wrong dtype, shape, stride or a read-only array is a ValueError that names the argument.
#ifndef MEMDECAY_PYTHON_BINDINGS_HPP
#define MEMDECAY_PYTHON_BINDINGS_HPP

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <memdecay/core/attention_rows.hpp>
#include <memdecay/core/config.hpp>
#include <memdecay/digests/query_channels.hpp>
#include <memdecay/core/region.hpp>
#include <memdecay/detail/error.hpp>

namespace memdecay_bindings {}

namespace memdecay_python {

namespace py = pybind11;
// The policy-independent sequence and manager types (bindings/common) are shared with the C API.
using namespace memdecay_bindings;

void bind_errors(py::module_& m);
void bind_config(py::module_& m);
void bind_tables(py::module_& m);
void bind_sequence(py::module_& m);
void bind_manager(py::module_& m);
void bind_exports(py::module_& m);

/// A ValueError naming the argument.
[[noreturn]] inline void raise_argument(const std::string& name, const std::string& what) {
  throw py::value_error(name + ": " + what);
}

/// The dtype's name as NumPy prints it.
inline std::string dtype_name(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

/// `obj` as a C-contiguous NumPy array of T with `ndim` dimensions, viewing the caller's memory (no copy):
/// ValueError naming `name` otherwise. `writable`: the array must be writeable (the adapters edit it in place).
template <class T>
py::array_t<T> exact_array(const py::handle& obj, const char* name, py::ssize_t ndim, bool writable) {
  if (!py::isinstance<py::array>(obj))
    raise_argument(name, "expected a numpy.ndarray of " + py::str(py::dtype::of<T>()).cast<std::string>() + ", got " +
                             py::str(py::type::handle_of(obj)).cast<std::string>());
  auto a = py::reinterpret_borrow<py::array>(obj);
  if (!a.dtype().is(py::dtype::of<T>()))
    raise_argument(name, "dtype " + dtype_name(a) + ", expected " + py::str(py::dtype::of<T>()).cast<std::string>() +
                             " (the engine's own arrays are edited in place, so no conversion is made)");
  if (a.ndim() != ndim)
    raise_argument(name, std::to_string(a.ndim()) + " dimensions, expected " + std::to_string(ndim));
  if (!(a.flags() & py::array::c_style)) raise_argument(name, "not C-contiguous (a strided view cannot be edited)");
  if (writable && !a.writeable()) raise_argument(name, "read-only (the adapter writes into it)");
  return py::reinterpret_borrow<py::array_t<T>>(a);
}

/// Attention mass: a C-contiguous float32 array of `ndim` dimensions viewed in place; a float64 one is converted
/// once to float32 (the sequence's score type), any other dtype or layout is a ValueError naming `name`. Accepts
/// DLPack producers (__dlpack__: PyTorch CPU tensors, through numpy.from_dlpack) and what numpy.asarray accepts
/// without copying (__array__, the buffer protocol).
/// `obj` as a NumPy array: itself, a view of a DLPack producer (a PyTorch CPU tensor; not copied), or asarray.
inline py::array any_array(const py::handle& obj) {
  if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
  if (py::hasattr(obj, "__dlpack__")) return py::module_::import("numpy").attr("from_dlpack")(obj).cast<py::array>();
  return py::module_::import("numpy").attr("asarray")(obj).cast<py::array>();
}

/// `how` ("sum" or "mean") as a head_reduction; ValueError naming the argument otherwise.
inline memdecay::head_reduction reduction_of(const std::string& how) {
  if (how != "sum" && how != "mean") raise_argument("how", "'" + how + "' (sum or mean)");
  return how == "sum" ? memdecay::head_reduction::sum : memdecay::head_reduction::mean;
}

/// A NumPy array as attention_rows, viewed in place (the array must outlive the view): 1-D tokens or 2-D rows x
/// tokens with any positive row stride, of float32, float16, or 16-bit integers holding the bits of `format`
/// ("f16" or "bf16"; a torch.bfloat16 tensor's .view(torch.int16)). ValueError naming `name` otherwise.
inline memdecay::attention_rows rows_of(const py::array& a, memdecay::head_reduction how, const std::string& format,
                                        const char* name) {
  namespace md = memdecay;
  if (a.ndim() != 1 && a.ndim() != 2)
    raise_argument(name, std::to_string(a.ndim()) + " dimensions, expected 1 (tokens) or 2 (rows x tokens)");
  const auto kind = a.dtype().kind();
  const auto size = static_cast<std::size_t>(a.itemsize());
  std::string fmt = format;
  if (fmt.empty()) fmt = kind == 'f' && size == 4 ? "f32" : kind == 'f' && size == 2 ? "f16" : "?";
  const bool bits16 = (kind == 'i' || kind == 'u') && size == 2;
  const bool ok = (fmt == "f32" && kind == 'f' && size == 4) ||
                  (fmt == "f16" && ((kind == 'f' && size == 2) || bits16)) || (fmt == "bf16" && bits16);
  if (!ok)
    raise_argument(name, "dtype " + dtype_name(a) + " with format '" + format +
                             "' (float32, float16, or int16/uint16 bits with format='f16' or 'bf16')");
  const std::size_t rows = a.ndim() == 2 ? static_cast<std::size_t>(a.shape(0)) : 1;
  const std::size_t tokens = static_cast<std::size_t>(a.shape(a.ndim() - 1));
  if (tokens > 1 && static_cast<std::size_t>(a.strides(a.ndim() - 1)) != size)
    raise_argument(name, "tokens are not contiguous within a row (stride " + std::to_string(a.strides(a.ndim() - 1)) +
                             " bytes)");
  std::size_t stride = tokens;
  if (rows > 1) {
    const auto bytes = a.strides(0);
    if (bytes <= 0 || static_cast<std::size_t>(bytes) % size != 0)
      raise_argument(name, "row stride of " + std::to_string(bytes) + " bytes (a positive multiple of " +
                               std::to_string(size) + ")");
    stride = static_cast<std::size_t>(bytes) / size;
  }
  const std::size_t elements = rows == 0 || tokens == 0 ? 0 : (rows - 1) * stride + tokens;
  if (fmt == "f32")
    return {std::span<const float>(static_cast<const float*>(a.data()), elements), rows, tokens, stride, how};
  return {std::span<const std::uint16_t>(static_cast<const std::uint16_t*>(a.data()), elements),
          fmt == "f16" ? md::half_format::f16 : md::half_format::bf16, rows, tokens, stride, how};
}

inline py::array_t<float> mass_array(const py::handle& obj, const char* name, py::ssize_t ndim) {
  const py::array a = any_array(obj);
  if (a.ndim() != ndim)
    raise_argument(name, std::to_string(a.ndim()) + " dimensions, expected " + std::to_string(ndim));
  if (!(a.flags() & py::array::c_style)) raise_argument(name, "not C-contiguous (pass numpy.ascontiguousarray(x))");
  if (a.dtype().is(py::dtype::of<float>())) return py::reinterpret_borrow<py::array_t<float>>(a);
  if (a.dtype().is(py::dtype::of<double>())) return py::array_t<float>(a);  // the one documented copy
  raise_argument(name, "dtype " + dtype_name(a) + ", expected float32 (or float64, converted)");
}

/// A region given by id or by name, resolved in `table` (input_error for an unknown name or id).
inline memdecay::region_id region_of(const py::handle& region, const memdecay::region_table& table) {
  if (py::isinstance<py::str>(region)) {
    const auto name = region.cast<std::string>();
    if (auto id = table.find(name)) return *id;
    std::string known;
    for (const auto& p : table.params()) known += (known.empty() ? "" : " ") + p.name;
    throw memdecay::input_error("unknown region name '" + name + "' (known: " + known + ")");
  }
  const auto id = region.cast<long long>();
  if (id < 0 || id > 255) raise_argument("region", "id " + std::to_string(id) + " is not a region id (0..255)");
  const auto r = static_cast<memdecay::region_id>(id);
  (void)table.at(r);
  return r;
}

/// A list of page indices from any sequence of ints (a list, a NumPy array...).
inline std::vector<std::size_t> page_list(const py::handle& pages) {
  if (pages.is_none()) return {};
  return pages.cast<std::vector<std::size_t>>();
}

/// A std::vector as a new NumPy array (a copy: the library owns its state).
template <class T>
py::array_t<T> to_numpy(const std::vector<T>& v) {
  py::array_t<T> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

}  // namespace memdecay_python

#endif  // MEMDECAY_PYTHON_BINDINGS_HPP
