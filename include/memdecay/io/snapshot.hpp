// SPDX-License-Identifier: Apache-2.0
// memdecay: state snapshots, so that a sequence's policy state survives preemption, restart and migration.
//
//   std::vector<std::byte> bytes = memdecay::snapshot::save(seq);   // any policy's basic_sequence
//   ...                                                             // preempted, restarted, migrated
//   memdecay::policy_sequence<P> seq2(cfg, params);                 // the same config and parameters
//   memdecay::snapshot::load(seq2, bytes);                          // seq2.digest() == seq.digest()
//
// The format is docs/snapshot-format.md: little-endian, versioned, a header (magic, format version, library
// version, float type, page size, config digest, policy name) with its own CRC-32C, then the payload (the layout,
// the policy's named fields, the sequence digest) with a CRC-32C. A snapshot holds state, not configuration: the
// engine rebuilds the sequence from its own config and parameters, and load checks that they are the ones the
// snapshot was saved with (config digest, policy name, each policy parameter).
//
// load never half-applies: everything is parsed and checked into a copy first, and an error (input_error naming
// the field and its byte offset; usage_error for a managed target) leaves the target as it was. After a load the
// sequence is bit-identical to the saved one: the same digest(), the same victims for every later call (the
// conformance suite checks it for every policy; the checksums make sure the bytes are the saved ones).
#ifndef MEMDECAY_IO_SNAPSHOT_HPP
#define MEMDECAY_IO_SNAPSHOT_HPP

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "memdecay/core/sequence.hpp"
#include "memdecay/detail/crc32c.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/version.hpp"

namespace memdecay {

namespace snapshot {

/// The format version this library writes. It reads every version from oldest_readable_version up to it
/// (docs/snapshot-format.md, "Versioning": version 1 has no page-digest section and loads as a sequence without
/// digests; versions 1 and 2 have no host-tier section and load as a sequence without a host tier; version 3 has no
/// displace_lowest rule and loads with it 0).
inline constexpr std::uint32_t format_version = 4;
inline constexpr std::uint32_t oldest_readable_version = 1;
/// Whether this library reads snapshots of format `version`.
[[nodiscard]] constexpr bool readable_version(std::uint32_t version) noexcept {
  return version >= oldest_readable_version && version <= format_version;
}
/// The first 8 bytes of every snapshot.
inline constexpr std::array<char, 8> magic = {'M', 'D', 'S', 'N', 'A', 'P', '\r', '\n'};
/// Bytes of the fixed part of the header (the policy name follows it).
inline constexpr std::size_t header_bytes = 48;

}  // namespace snapshot

namespace detail {

// Little-endian encoding of one trivially copyable scalar (integers, enums, bool, float, double).
template <class T>
auto to_bits(T v) noexcept {
  if constexpr (std::is_enum_v<T>) {
    return static_cast<std::make_unsigned_t<std::underlying_type_t<T>>>(v);
  } else if constexpr (std::is_same_v<T, bool>) {
    return static_cast<std::uint8_t>(v);
  } else if constexpr (std::is_floating_point_v<T>) {
    if constexpr (sizeof(T) == 4)
      return std::bit_cast<std::uint32_t>(v);
    else
      return std::bit_cast<std::uint64_t>(v);
  } else {
    return static_cast<std::make_unsigned_t<T>>(v);
  }
}
template <class T, class U>
T from_bits(U u) noexcept {
  if constexpr (std::is_enum_v<T>) {
    return static_cast<T>(u);
  } else if constexpr (std::is_same_v<T, bool>) {
    return u != 0;
  } else if constexpr (std::is_floating_point_v<T>) {
    return std::bit_cast<T>(u);
  } else {
    return static_cast<T>(u);
  }
}

// The kind of a field's elements, stored beside their size so that a reader never misreads a column.
template <class T>
constexpr std::uint8_t element_kind() noexcept {
  if constexpr (std::is_floating_point_v<T>)
    return 2;
  else if constexpr (std::is_signed_v<T> && !std::is_enum_v<T>)
    return 1;
  else
    return 0;  // unsigned integers, enums, bool
}

template <class T>
void put_le(std::span<std::byte> out, std::size_t at, T v) noexcept {
  auto u = to_bits(v);
  for (std::size_t i = 0; i < sizeof(u); ++i) out[at + i] = static_cast<std::byte>((u >> (8 * i)) & 0xFFu);
}

/// The CRC-32C of a snapshot's header: bytes 0..43 and the policy name (the checksum field 44..47 left out).
inline std::uint32_t snapshot_header_crc(std::span<const std::byte> header_and_name) noexcept {
  return crc32c_extend(crc32c(header_and_name.first(44)), header_and_name.subspan(snapshot::header_bytes));
}

/// Writes the payload length and both checksums of a snapshot whose other bytes are final (the last step of
/// save; tests and the fuzzer use it to build crafted snapshots that pass the checksums).
inline void seal_snapshot(std::span<std::byte> bytes) noexcept {
  const std::size_t payload = snapshot::header_bytes + static_cast<std::size_t>(bytes[17]);
  const auto body = std::span<const std::byte>(bytes).subspan(payload);
  put_le(bytes, 32, static_cast<std::uint64_t>(body.size()));
  put_le(bytes, 40, crc32c(body));
  put_le(bytes, 44, snapshot_header_crc(std::span<const std::byte>(bytes).first(payload)));
}

// Whether T's in-memory bytes are its encoding (a little-endian host, no conversion; bool is checked on read).
template <class T>
inline constexpr bool raw_copy = std::endian::native == std::endian::little && sizeof(T) == sizeof(to_bits(T{}));

class snapshot_writer {
 public:
  static constexpr bool loading = false;
  snapshot_writer(std::size_t kv_len, std::size_t num_pages) : kv_len_(kv_len), num_pages_(num_pages) {
    out_.reserve(1024 + 24 * kv_len + 16 * num_pages);  // every shipped policy's fields fit (SnapKV's ring aside)
  }
  /// Writes into `buffer`'s memory (cleared; its capacity kept): a checkpoint taken every few seconds then touches
  /// no fresh pages.
  explicit snapshot_writer(std::vector<std::byte>&& buffer) noexcept
      : out_(std::move(buffer)), kv_len_(0), num_pages_(0) {
    out_.clear();
  }

  template <class T>
  void put(T v) {
    const std::size_t at = out_.size();
    out_.resize(at + sizeof(to_bits(v)));
    put_le(out_, at, v);
  }
  void put_bytes(std::span<const std::byte> b) { out_.insert(out_.end(), b.begin(), b.end()); }
  template <class T>
  void put_array(std::span<const T> v) {
    if constexpr (raw_copy<T>) {  // the bytes already are the little-endian encoding
      put_bytes(std::as_bytes(v));
    } else {
      for (const T& x : v) put(x);
    }
  }

  [[nodiscard]] std::size_t kv_len() const noexcept { return kv_len_; }
  [[nodiscard]] std::size_t num_pages() const noexcept { return num_pages_; }
  void set_layout(std::size_t kv_len, std::size_t num_pages) noexcept {
    kv_len_ = kv_len;
    num_pages_ = num_pages;
  }
  template <class T>
  void param(std::string_view name, T& v) {
    scalar(name, 1, v);
  }
  template <class T>
  void value(std::string_view name, T& v) {
    scalar(name, 2, v);
  }
  template <class T>
  void param_list(std::string_view name, std::vector<T>& v) {
    list(name, 1, v);
  }
  template <class T, class Alloc>
  void column(std::string_view name, std::vector<T, Alloc>& v, std::size_t /*expected*/) {
    list(name, 3, v);
  }
  template <class T, class Alloc>
  void column_with_infinities(std::string_view name, std::vector<T, Alloc>& v, std::size_t /*expected*/) {
    list(name, 3, v);
  }

  [[nodiscard]] std::uint32_t fields() const noexcept { return fields_; }
  std::vector<std::byte>& bytes() noexcept { return out_; }

 private:
  template <class T>
  void head(std::string_view name, std::uint8_t kind, std::uint64_t count) {
    put(static_cast<std::uint8_t>(name.size()));
    put_bytes(std::as_bytes(std::span<const char>(name.data(), name.size())));
    put(kind);
    put(static_cast<std::uint8_t>(sizeof(to_bits(T{}))));
    put(element_kind<T>());
    put(count);
    ++fields_;
  }
  template <class T>
  void scalar(std::string_view name, std::uint8_t kind, const T& v) {
    head<T>(name, kind, 1);
    put(v);
  }
  template <class T, class Alloc>
  void list(std::string_view name, std::uint8_t kind, const std::vector<T, Alloc>& v) {
    head<T>(name, kind, v.size());
    put_array(std::span<const T>(v));
  }

  std::vector<std::byte> out_;
  std::size_t kv_len_, num_pages_;
  std::uint32_t fields_ = 0;
};

class snapshot_reader {
 public:
  static constexpr bool loading = true;
  snapshot_reader(std::span<const std::byte> bytes, std::size_t base) : in_(bytes), base_(base) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    raise_input("snapshot " + field + " at offset " + to_text(base_ + pos_) + ": " + what);
  }
  void need(std::size_t n, const char* field) const {
    if (in_.size() - pos_ < n)
      fail(field, "truncated (" + to_text(n) + " bytes needed, " + to_text(in_.size() - pos_) + " left)");
  }
  template <class T>
  T get(const char* field) {
    using U = decltype(to_bits(T{}));
    need(sizeof(U), field);
    U u = 0;
    for (std::size_t i = 0; i < sizeof(U); ++i) u |= static_cast<U>(static_cast<U>(in_[pos_ + i]) << (8 * i));
    pos_ += sizeof(U);
    return from_bits<T>(u);
  }
  [[nodiscard]] std::size_t offset() const noexcept { return base_ + pos_; }
  void get_bytes(std::span<std::byte> out, const char* field) {
    need(out.size(), field);
    if (!out.empty()) std::memcpy(out.data(), in_.data() + pos_, out.size());
    pos_ += out.size();
  }
  [[nodiscard]] std::size_t left() const noexcept { return in_.size() - pos_; }
  void skip(std::size_t n, const char* field) {
    need(n, field);
    pos_ += n;
  }

  void set_layout(std::size_t kv_len, std::size_t num_pages) noexcept {
    kv_len_ = kv_len;
    num_pages_ = num_pages;
  }
  [[nodiscard]] std::size_t kv_len() const noexcept { return kv_len_; }
  [[nodiscard]] std::size_t num_pages() const noexcept { return num_pages_; }

  template <class T>
  void param(std::string_view name, T& v) {
    const T saved = scalar<T>(name, 1);
    if (to_bits(saved) != to_bits(v))
      fail(std::string(name), "policy parameter " + std::string(name) +
                                  " differs from the target's (build the "
                                  "target with the parameters the snapshot was saved with)");
  }
  template <class T>
  void value(std::string_view name, T& v) {
    const T x = scalar<T>(name, 2);
    if constexpr (std::is_floating_point_v<T>)
      if (!std::isfinite(x)) fail(std::string(name), "a NaN or infinite value");
    v = x;
  }
  template <class T>
  void param_list(std::string_view name, std::vector<T>& v) {
    std::vector<T> saved;
    list(name, 1, saved, v.size());
    for (std::size_t i = 0; i < v.size(); ++i)
      if (to_bits(saved[i]) != to_bits(v[i]))
        fail(std::string(name),
             "policy parameter " + std::string(name) + "[" + to_text(i) + "] differs from the target's");
  }
  /// A per-token or per-page column of `expected` elements; floats must be finite.
  template <class T, class Alloc>
  void column(std::string_view name, std::vector<T, Alloc>& v, std::size_t expected) {
    checked_column(name, v, expected, false);
  }
  /// The same, for a column where infinity is a legitimate value (keep scores); NaN is still rejected.
  template <class T, class Alloc>
  void column_with_infinities(std::string_view name, std::vector<T, Alloc>& v, std::size_t expected) {
    checked_column(name, v, expected, true);
  }
  [[nodiscard]] std::uint32_t fields() const noexcept { return fields_; }

 private:
  template <class T, class Alloc>
  void checked_column(std::string_view name, std::vector<T, Alloc>& v, std::size_t expected, bool infinities) {
    std::vector<T, Alloc> loaded;
    const std::size_t at = pos_;
    list(name, 3, loaded, expected);
    if constexpr (std::is_floating_point_v<T>) {
      // The infinities a column may hold are +inf (keep_score: never observed); -inf next to one makes a page's
      // mean NaN (found by tests/fuzz/snapshot_fuzzer.cpp).
      for (std::size_t i = 0; i < loaded.size(); ++i)
        if (std::isnan(loaded[i]) || (std::isinf(loaded[i]) && (!infinities || loaded[i] < 0))) {
          pos_ = at;
          fail(std::string(name), "element " + to_text(i) + " is " +
                                      (std::isnan(loaded[i]) ? "NaN" : loaded[i] < 0 ? "-infinite" : "infinite"));
        }
    } else {
      (void)infinities;
    }
    v = std::move(loaded);
  }
  template <class T>
  std::uint64_t head(std::string_view name, std::uint8_t kind) {
    const std::string field(name);
    const std::size_t at = pos_;
    const auto len = get<std::uint8_t>("field name length");
    need(len, "field name");
    const std::string_view found(reinterpret_cast<const char*>(in_.data() + pos_), len);
    if (found != name) {
      pos_ = at;
      fail("field " + to_text(fields_),
           "expected '" + field + "', found '" + std::string(found) + "' (a snapshot of another policy or format)");
    }
    pos_ += len;
    if (get<std::uint8_t>(field.c_str()) != kind) fail(field, "wrong field kind");
    if (get<std::uint8_t>(field.c_str()) != sizeof(to_bits(T{})) ||
        get<std::uint8_t>(field.c_str()) != element_kind<T>())
      fail(field, "wrong element type (a snapshot of another float type?)");
    ++fields_;
    return get<std::uint64_t>(field.c_str());
  }
  template <class T>
  T scalar(std::string_view name, std::uint8_t kind) {
    if (head<T>(name, kind) != 1) fail(std::string(name), "a scalar field with a count other than 1");
    if constexpr (std::is_same_v<T, bool>) {  // canonical: exactly 0 or 1, so that a load saves back the same bytes
      need(1, "bool");
      if (static_cast<std::uint8_t>(in_[pos_]) > 1) fail(std::string(name), "a bool other than 0 or 1");
    }
    return get<T>(std::string(name).c_str());
  }
  template <class T, class Alloc>
  void list(std::string_view name, std::uint8_t kind, std::vector<T, Alloc>& out, std::size_t expected) {
    const std::string field(name);
    const std::uint64_t count = head<T>(name, kind);
    if (count != expected)
      fail(field, to_text(count) + " elements, " + to_text(expected) + " expected for this layout");
    need(count * sizeof(to_bits(T{})), field.c_str());
    out.resize(count);
    if constexpr (raw_copy<T> && !std::is_same_v<T, bool>) {
      if (count) std::memcpy(out.data(), in_.data() + pos_, count * sizeof(T));
      pos_ += count * sizeof(T);
    } else {
      for (auto& x : out) x = get<T>(field.c_str());
    }
  }

  std::span<const std::byte> in_;
  std::size_t base_, pos_ = 0;
  std::size_t kv_len_ = 0, num_pages_ = 0;
  std::uint32_t fields_ = 0;
};

template <class Float>
constexpr std::uint8_t float_code() noexcept {
  return static_cast<std::uint8_t>(sizeof(Float));
}

inline std::uint32_t library_version_number() noexcept {
  return static_cast<std::uint32_t>(version.major) * 1000000u + static_cast<std::uint32_t>(version.minor) * 1000u +
         static_cast<std::uint32_t>(version.patch);
}

struct snapshot_access {
  template <class Seq>
  static std::vector<std::byte> save(const Seq& seq) {
    snapshot_writer w(seq.state_.kv_len(), seq.state_.num_pages());
    save_into(seq, w);
    return std::move(w.bytes());
  }
  /// Appends the snapshot of `seq` to the writer's bytes (a manager snapshot holds one per sequence).
  template <class Seq>
  static void save_into(const Seq& seq, snapshot_writer& w) {
    using P = typename Seq::policy_type;
    using Float = typename Seq::float_type;
    static_assert(
        requires(P & p, snapshot_writer & w) { p.snapshot_fields(w); },
        "this policy has no snapshot_fields(): it cannot be saved");
    const auto& st = seq.state_;
    const std::string_view name = P::name;
    const std::size_t base = w.bytes().size();
    const auto header = [&] { return std::span<std::byte>(w.bytes()).subspan(base); };
    w.set_layout(st.kv_len(), st.num_pages());
    // The header, with the checksums filled in at the end.
    w.bytes().resize(base + snapshot::header_bytes);
    std::memcpy(header().data(), snapshot::magic.data(), snapshot::magic.size());
    put_le(header(), 8, snapshot::format_version);
    put_le(header(), 12, library_version_number());
    put_le(header(), 16, float_code<Float>());
    put_le(header(), 17, static_cast<std::uint8_t>(name.size()));
    put_le(header(), 18, std::uint16_t{0});
    put_le(header(), 20, static_cast<std::uint32_t>(st.page_size()));
    put_le(header(), 24, seq.config_digest());
    w.put_bytes(std::as_bytes(std::span<const char>(name.data(), name.size())));
    // The layout.
    w.put(st.logical_len_);
    w.put(st.now_);
    w.put(st.generation_);
    w.put(static_cast<std::uint64_t>(st.kv_len()));
    w.put_array(std::span<const region_id>(st.region_));
    w.put(static_cast<std::uint64_t>(st.num_pages()));
    w.put_array(std::span<const std::uint64_t>(st.page_origin_));
    // The policy's fields: a count, filled in after them.
    const std::size_t count_at = w.bytes().size();
    w.put(std::uint32_t{0});
    const std::uint32_t fields_before = w.fields();
    const_cast<P&>(seq.policy_).snapshot_fields(w);  // the writer only reads the fields
    put_le(w.bytes(), count_at, w.fields() - fields_before);
    save_digests(seq, w);
    save_tier(seq, w);
    seal_snapshot(header());
  }

  // --- the page-digest section (format 2; docs/snapshot-format.md) ---
  template <class Seq>
  static void save_digests(const Seq& seq, snapshot_writer& w) {
    w.put(static_cast<std::uint8_t>(seq.digests_ ? 1 : 0));
    if (!seq.digests_) return;
    const page_digests& d = *seq.digests_;
    const digest_layout& l = d.layout();
    w.put(static_cast<std::uint64_t>(l.kv_heads));
    w.put(static_cast<std::uint64_t>(l.head_dim));
    w.put(static_cast<std::uint64_t>(l.query_heads));
    w.put(static_cast<std::uint8_t>(l.kind));
    w.put(static_cast<std::uint8_t>(l.storage));
    w.put(l.scale);
    w.put(static_cast<std::uint64_t>(d.num_pages()));
    w.put_array(d.presence());
    if (l.storage == digest_storage::f32)
      put_digest_values(w, l, d.raw_f32());
    else
      put_digest_values(w, l, d.raw_half());
  }
  // The stored values in the format's order: a min/max head's minima then its maxima (page_digests keeps them in
  // the kernels' layout, simd::interleave_min_max), a mean-key digest as stored.
  template <class Elem>
  static void put_digest_values(snapshot_writer& w, const digest_layout& l, std::span<const Elem> values) {
    if (l.kind != digest_kind::min_max) return w.put_array(values);
    const std::size_t D = l.head_dim;
    std::vector<Elem> head(2 * D);
    for (std::size_t at = 0; at < values.size(); at += 2 * D) {
      simd::split_min_max(values.data() + at, D, head.data(), head.data() + D);
      w.put_array(std::span<const Elem>(head));
    }
  }
  // The inverse, in place: a min/max head's minima then maxima into the kernels' layout.
  template <class Values>
  static void interleave_digest_values(const digest_layout& l, Values& values) {
    using Elem = typename Values::value_type;
    if (l.kind != digest_kind::min_max) return;
    const std::size_t D = l.head_dim;
    std::vector<Elem> head(2 * D);
    for (std::size_t at = 0; at < values.size(); at += 2 * D) {
      std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(at), 2 * D, head.begin());
      simd::interleave_min_max(head.data(), head.data() + D, D, values.data() + at);
    }
  }
  // --- the host-tier section (format 3; docs/snapshot-format.md) ---
  template <class Seq>
  static void save_tier(const Seq& seq, snapshot_writer& w) {
    w.put(static_cast<std::uint8_t>(seq.tier_ ? 1 : 0));
    if (!seq.tier_) return;
    const page_residencies& t = *seq.tier_;
    const host_tier_config& c = t.config();
    w.put(static_cast<std::uint8_t>(c.host_budget.unit));
    w.put(c.host_budget.high);
    w.put(c.min_host_priority);
    w.put(c.hysteresis);
    w.put(c.min_device_steps);
    w.put(static_cast<std::uint64_t>(c.max_recall_pages));
    w.put(static_cast<std::uint64_t>(c.displace_lowest));  // format 4
    w.put(static_cast<std::uint64_t>(t.size()));
    w.put_array(t.host_flags());
    w.put_array(t.recalled_at());
  }
  // Reads and checks the section into `out` (left empty without a tier). A host page is a full page without a
  // pinned token (only those leave the device) and was not recalled since it left; a recall lies in the past.
  template <class State, class Regions>
  static void load_tier(snapshot_reader& r, std::uint32_t version, const State& st, const Regions& regions,
                        std::optional<page_residencies>& out) {
    const auto present = r.get<std::uint8_t>("host tier");
    if (present > 1) r.fail("host tier", to_text(present) + " (0 or 1)");
    if (present == 0) return;
    host_tier_config c;
    const std::size_t config_at = r.offset();
    const auto unit = r.get<std::uint8_t>("host budget unit");
    if (unit > static_cast<std::uint8_t>(budget_unit::ratio)) r.fail("host budget unit", to_text(unit));
    c.host_budget.unit = static_cast<budget_unit>(unit);
    c.host_budget.high = r.get<double>("host budget");
    c.min_host_priority = r.get<double>("min host priority");
    c.hysteresis = r.get<double>("hysteresis");
    c.min_device_steps = r.get<step_t>("min device steps");
    const auto max_recall = r.get<std::uint64_t>("max recall pages");
    c.max_recall_pages = max_recall > std::numeric_limits<std::size_t>::max() ? std::numeric_limits<std::size_t>::max()
                                                                              : static_cast<std::size_t>(max_recall);
    if (version >= 4) {  // version 3: no displace_lowest rule (any page may be displaced)
      const auto lowest = r.get<std::uint64_t>("displace lowest");
      c.displace_lowest = lowest > std::numeric_limits<std::size_t>::max() ? std::numeric_limits<std::size_t>::max()
                                                                           : static_cast<std::size_t>(lowest);
    }
    if (const std::string why = c.problem(); !why.empty())
      raise_input("snapshot host tier at offset " + to_text(config_at) + ": " + why);
    const std::size_t pages = st.num_pages();
    if (r.get<std::uint64_t>("host tier pages") != pages)
      r.fail("host tier pages", "not the sequence's " + to_text(pages));
    std::vector<std::uint8_t> flags(pages);
    const std::size_t flags_at = r.offset();
    r.get_bytes(std::as_writable_bytes(std::span<std::uint8_t>(flags)), "host flags");
    if (pages > r.left() / sizeof(step_t)) r.fail("recalled at", "truncated");
    std::vector<step_t> recalled(pages);
    const std::size_t recalled_at = r.offset();
    for (auto& v : recalled) v = r.get<step_t>("recalled at");
    const auto labels = st.regions();
    for (std::size_t p = 0; p < pages; ++p) {
      auto bad = [&](std::size_t at, const std::string& why) {
        raise_input("snapshot host tier at offset " + to_text(at) + ": page " + to_text(p) + " " + why);
      };
      if (flags[p] > 1) bad(flags_at + p, "has host flag " + to_text(flags[p]) + " (0 or 1)");
      if (recalled[p] != page_residencies::never && recalled[p] > st.now())
        bad(recalled_at + p * sizeof(step_t), "was recalled at step " + to_text(recalled[p]) + ", after now");
      if (!flags[p]) continue;
      if (recalled[p] != page_residencies::never) bad(recalled_at + p * sizeof(step_t), "is on the host and recalled");
      if (st.tokens_in_page(p) != st.page_size()) bad(flags_at + p, "is on the host and not full");
      for (std::size_t i = p * st.page_size(); i < (p + 1) * st.page_size(); ++i)
        if (regions.pinned(labels[i])) bad(flags_at + p, "is on the host and holds a pinned token");
    }
    const auto hosted = static_cast<std::size_t>(std::count(flags.begin(), flags.end(), std::uint8_t{1}));
    if (const std::size_t holds = c.host_capacity_pages(st.page_size(), st.logical_len()); hosted > holds)
      raise_input("snapshot host tier at offset " + to_text(flags_at) + ": " + to_text(hosted) +
                  " pages on the host, more than its budget holds (" + to_text(holds) + ")");
    page_residencies t(c);
    t.restore(std::move(flags), std::move(recalled));
    out = std::move(t);
  }

  // Reads and checks the section into `out` (left empty when the snapshot has no digests); every check names the
  // field and its offset. The values must be as page_digests writes them: finite, a minimum at most its maximum.
  static void load_digests(snapshot_reader& r, std::size_t pages, std::optional<page_digests>& out) {
    const auto present = r.get<std::uint8_t>("digests");
    if (present > 1) r.fail("digests", to_text(present) + " (0 or 1)");
    if (present == 0) return;
    digest_layout l;
    const std::size_t layout_at = r.offset();
    l.kv_heads = static_cast<std::size_t>(r.get<std::uint64_t>("digest kv_heads"));
    l.head_dim = static_cast<std::size_t>(r.get<std::uint64_t>("digest head_dim"));
    l.query_heads = static_cast<std::size_t>(r.get<std::uint64_t>("digest query_heads"));
    l.kind = static_cast<digest_kind>(r.get<std::uint8_t>("digest kind"));
    l.storage = static_cast<digest_storage>(r.get<std::uint8_t>("digest storage"));
    l.scale = r.get<double>("digest scale");
    if (const std::string why = l.problem(); !why.empty())
      raise_input("snapshot digest layout at offset " + to_text(layout_at) + ": " + why);
    if (r.get<std::uint64_t>("digest pages") != pages) r.fail("digest pages", "not the sequence's " + to_text(pages));
    std::vector<std::uint8_t> presence(pages);
    const std::size_t presence_at = r.offset();
    r.get_bytes(std::as_writable_bytes(std::span<std::uint8_t>(presence)), "digest presence");
    for (std::size_t p = 0; p < pages; ++p)
      if (presence[p] > 1)
        raise_input("snapshot digest presence at offset " + to_text(presence_at + p) + ": " + to_text(presence[p]) +
                    " (0 or 1)");
    const std::size_t per_page = l.values_per_page();
    const std::size_t elem = l.storage == digest_storage::f32 ? 4 : 2;
    if (pages > r.left() / (per_page * elem)) r.fail("digest values", "truncated");
    page_digests::f32_values f32;
    page_digests::half_values half;
    const std::size_t values_at = r.offset();
    if (l.storage == digest_storage::f32) {
      f32.resize(pages * per_page);
      for (auto& v : f32) v = r.get<float>("digest values");
    } else {
      half.resize(pages * per_page);
      for (auto& v : half) v = r.get<std::uint16_t>("digest values");
    }
    const auto fmt = l.storage == digest_storage::bf16 ? half_format::bf16 : half_format::f16;
    auto value = [&](std::size_t i) { return f32.empty() ? simd::half_to_float(half[i], fmt) : f32[i]; };
    const std::size_t D = l.head_dim;
    for (std::size_t i = 0; i < pages * per_page; ++i)
      if (!std::isfinite(value(i)))
        raise_input("snapshot digest values at offset " + to_text(values_at + i * elem) + ": value " + to_text(i) +
                    " is not finite");
    if (l.kind == digest_kind::min_max)
      for (std::size_t block = 0; block < pages * l.kv_heads; ++block)
        for (std::size_t c = 0; c < D; ++c)
          if (value(block * 2 * D + c) > value(block * 2 * D + D + c))
            raise_input("snapshot digest values at offset " + to_text(values_at + (block * 2 * D + c) * elem) +
                        ": page " + to_text(block / l.kv_heads) + " head " + to_text(block % l.kv_heads) + " channel " +
                        to_text(c) + " has its minimum above its maximum");
    interleave_digest_values(l, f32);
    interleave_digest_values(l, half);
    out = page_digests::restore(l, std::move(presence), std::move(f32), std::move(half));
  }

  template <class Seq>
  static void load(Seq& target, std::span<const std::byte> bytes) {
    using P = typename Seq::policy_type;
    using Float = typename Seq::float_type;
    if (target.managed())
      raise_usage("snapshot load: the target is owned by a manager (load it before the manager opens it)");
    // --- the header ---
    snapshot_reader h(bytes, 0);
    h.need(snapshot::header_bytes, "header");
    if (std::memcmp(bytes.data(), snapshot::magic.data(), snapshot::magic.size()) != 0)
      h.fail("magic", "not a memdecay snapshot");
    (void)h.get<std::uint64_t>("magic");
    const auto version = h.get<std::uint32_t>("format version");
    const auto library = h.get<std::uint32_t>("library version");
    const auto float_bytes = h.get<std::uint8_t>("float type");
    const auto name_len = h.get<std::uint8_t>("policy name length");
    const auto reserved = h.get<std::uint16_t>("reserved");
    const auto page_size = h.get<std::uint32_t>("page size");
    const auto cfg_digest = h.get<std::uint64_t>("config digest");
    const auto payload_len = h.get<std::uint64_t>("payload length");
    const auto payload_crc = h.get<std::uint32_t>("payload checksum");
    const auto head_crc = h.get<std::uint32_t>("header checksum");
    h.need(name_len, "policy name");
    const std::size_t payload_at = snapshot::header_bytes + name_len;
    if (snapshot_header_crc(bytes.first(payload_at)) != head_crc)
      raise_input("snapshot header checksum at offset 44: the header is corrupted (CRC-32C mismatch)");
    if (!snapshot::readable_version(version))
      raise_input("snapshot format version at offset 8: " + to_text(version) + "; this library (" +
                  to_text(library_version_number()) + ") reads versions " + to_text(snapshot::oldest_readable_version) +
                  " to " + to_text(snapshot::format_version) + " (written by library " + to_text(library) + ")");
    if (reserved != 0) raise_input("snapshot reserved field at offset 18: " + to_text(reserved) + " (must be 0)");
    const std::string_view name(reinterpret_cast<const char*>(bytes.data() + snapshot::header_bytes), name_len);
    if (name != P::name)
      raise_input("snapshot policy at offset 48: '" + std::string(name) + "', the target's is '" +
                  std::string(P::name) + "'");
    if (float_bytes != float_code<Float>())
      raise_input("snapshot float type at offset 16: " + to_text(8 * float_bytes) + "-bit, the target's is " +
                  to_text(8 * sizeof(Float)) + "-bit");
    if (page_size != target.page_size())
      raise_input("snapshot page size at offset 20: " + to_text(page_size) + ", the target's is " +
                  to_text(target.page_size()));
    if (cfg_digest != target.config_digest())
      raise_input(
          "snapshot config digest at offset 24: the target's config differs from the one the snapshot was "
          "saved with (alpha, EWMA, tau, normalisation, protections, budget or region table)");
    if (bytes.size() - payload_at != payload_len)
      raise_input("snapshot payload length at offset 32: " + to_text(payload_len) + " bytes, " +
                  to_text(bytes.size() - payload_at) + " present (truncated or padded)");
    const auto body = bytes.subspan(payload_at);
    if (crc32c(body) != payload_crc)
      raise_input("snapshot payload checksum at offset 40: the payload is corrupted (CRC-32C mismatch)");

    // --- the payload, into copies ---
    snapshot_reader r(body, payload_at);
    typename Seq::state_type st(target.page_size());
    st.logical_len_ = r.get<std::uint64_t>("logical_len");
    st.now_ = r.get<step_t>("now");
    st.generation_ = r.get<std::uint64_t>("generation");
    const auto kv_len = r.get<std::uint64_t>("kv_len");
    if (kv_len > st.logical_len_ || kv_len > r.left())
      r.fail("kv_len", to_text(kv_len) + " resident tokens (logical length " + to_text(st.logical_len_) + ")");
    if ((st.logical_len_ - kv_len) % page_size != 0) r.fail("kv_len", "the evicted tokens are not whole pages");
    st.region_.resize(kv_len);
    r.get_bytes(std::as_writable_bytes(std::span<region_id>(st.region_)), "labels");
    const std::size_t regions = target.regions().size();
    region_id highest = 0;
    for (region_id l : st.region_) highest = std::max(highest, l);  // one vectorised pass; the culprit only if any
    if (kv_len > 0 && highest >= regions)
      for (std::size_t i = 0; i < kv_len; ++i)
        if (st.region_[i] >= regions)
          raise_input("snapshot labels at offset " + to_text(payload_at + 28 + i) + ": token " + to_text(i) +
                      " has region " + to_text(st.region_[i]) + ", which is not in the target's table");
    const auto pages = r.get<std::uint64_t>("num_pages");
    if (pages != (kv_len + page_size - 1) / page_size)
      r.fail("num_pages", to_text(pages) + " pages for " + to_text(kv_len) + " tokens");
    st.page_origin_.resize(pages);
    const std::uint64_t logical_pages = (st.logical_len_ + page_size - 1) / page_size;
    for (std::size_t p = 0; p < pages; ++p) {
      const auto o = r.get<std::uint64_t>("page origins");
      if (o >= logical_pages || (p > 0 && o <= st.page_origin_[p - 1]))
        r.fail("page origins", "page " + to_text(p) + " has origin " + to_text(o) + " (ascending, below " +
                                   to_text(logical_pages) + ")");
      st.page_origin_[p] = o;
    }
    if (kv_len % page_size != 0 && st.page_origin_.back() != st.logical_len_ / page_size)
      r.fail("page origins", "the partial last page is not the sequence's tail");
    r.set_layout(kv_len, pages);
    const auto fields = r.get<std::uint32_t>("field count");
    P policy = target.policy_;
    policy.snapshot_fields(r);
    if (r.fields() != fields)
      r.fail("field count", to_text(fields) + " fields saved, " + to_text(r.fields()) + " read");
    std::optional<page_digests> digests;
    if (version >= 2) load_digests(r, pages, digests);  // version 1: no digests (the migration)
    std::optional<page_residencies> tier;
    if (version >= 3) load_tier(r, version, st, target.regions_, tier);  // versions 1, 2: no host tier
    if (r.left() != 0) r.fail("end", to_text(r.left()) + " bytes after the last field");
    policy.reserve(kv_len);
    st.reserve_for(0);
    pinned_pages pinned(target.regions_);
    pinned.rebuild(st);
    target.state_ = std::move(st);  // noexcept moves: nothing can fail from here
    target.pinned_ = std::move(pinned);
    target.policy_ = std::move(policy);
    target.digests_ = std::move(digests);
    target.tier_ = std::move(tier);
    target.clock_moved_at_ = std::numeric_limits<std::uint64_t>::max();  // the loaded generation is a content one
    target.advance_columns_at_ = 0;
  }

  // --- the clock record of an incremental manager snapshot (io/manager_snapshot.hpp) ---
  // A sequence whose content_generation() did not move since the last snapshot differs from the saved one only in
  // its clock, its generation and its policy's scalars: the record holds those (the policy's parameters and values,
  // no columns).
  // With `advance_columns`, also the columns the policy's on_advance rewrites (P::advance_columns; MemDecay's
  // exp-free weights after a rebase): the record of a sequence that only advanced, and rebased.
  template <class Seq>
  static void save_clock(const Seq& seq, snapshot_writer& w, bool advance_columns = false) {
    using P = typename Seq::policy_type;
    w.put(seq.state_.now_);
    w.put(seq.state_.generation_);
    const std::size_t count_at = w.bytes().size();
    w.put(std::uint32_t{0});
    const std::uint32_t before = w.fields();
    scalars_only<snapshot_writer> f(w, advance_columns ? advance_columns_of<P>() : std::span<const std::string_view>{});
    const_cast<P&>(seq.policy_).snapshot_fields(f);
    put_le(w.bytes(), count_at, w.fields() - before);
  }
  /// Applies a clock record to `seq` (the sequence it was saved against). Leaves `seq` half-updated when it throws:
  /// the caller loads into a sequence it discards on error.
  template <class Seq>
  static void load_clock(Seq& seq, snapshot_reader& r, bool advance_columns = false) {
    using P = typename Seq::policy_type;
    const auto now = r.get<step_t>("sequence now");
    if (now < seq.state_.now_)
      r.fail("sequence now", "step " + to_text(now) + " is before the previous snapshot's " + to_text(seq.state_.now_));
    const auto generation = r.get<std::uint64_t>("sequence generation");
    if (generation < seq.state_.generation_)
      r.fail("sequence generation",
             to_text(generation) + " is before the previous snapshot's " + to_text(seq.state_.generation_));
    const auto fields = r.get<std::uint32_t>("field count");
    const std::uint32_t before = r.fields();
    r.set_layout(seq.state_.kv_len(), seq.state_.num_pages());
    seq.state_.now_ = now;
    seq.state_.generation_ = generation;
    scalars_only<snapshot_reader> f(r, advance_columns ? advance_columns_of<P>() : std::span<const std::string_view>{});
    seq.policy_.snapshot_fields(f);
    if (r.fields() - before != fields)
      r.fail("field count", to_text(fields) + " fields saved, " + to_text(r.fields() - before) + " read");
    seq.clock_moved_at_ = std::numeric_limits<std::uint64_t>::max();
    seq.advance_columns_at_ = 0;
  }

  /// The columns P's on_advance may rewrite (empty for a policy that does not declare them).
  template <class P>
  static std::span<const std::string_view> advance_columns_of() noexcept {
    if constexpr (requires { P::advance_columns; })
      return std::span<const std::string_view>(P::advance_columns);
    else
      return {};
  }

 private:
  // A policy's fields without its columns (they are the previous snapshot's).
  template <class Fields>
  struct scalars_only {
    static constexpr bool loading = Fields::loading;
    Fields& f;
    std::span<const std::string_view> columns;  // the columns that are in the record too
    scalars_only(Fields& fields, std::span<const std::string_view> kept) : f(fields), columns(kept) {}
    [[nodiscard]] std::size_t kv_len() const noexcept { return f.kv_len(); }
    [[nodiscard]] std::size_t num_pages() const noexcept { return f.num_pages(); }
    [[noreturn]] void fail(const std::string& field, const std::string& what) const { f.fail(field, what); }
    template <class T>
    void param(std::string_view name, T& v) {
      f.param(name, v);
    }
    template <class T>
    void value(std::string_view name, T& v) {
      f.value(name, v);
    }
    template <class T>
    void param_list(std::string_view name, std::vector<T>& v) {
      f.param_list(name, v);
    }
    template <class T, class Alloc>
    void column(std::string_view name, std::vector<T, Alloc>& v, std::size_t expected) {
      if (std::find(columns.begin(), columns.end(), name) != columns.end()) f.column(name, v, expected);
    }
    template <class T, class Alloc>
    void column_with_infinities(std::string_view name, std::vector<T, Alloc>& v, std::size_t expected) {
      if (std::find(columns.begin(), columns.end(), name) != columns.end()) f.column_with_infinities(name, v, expected);
    }
  };
};

}  // namespace detail

namespace snapshot {

/// The snapshot of `seq` (docs/snapshot-format.md).
template <template <class> class Policy, class Float, std::size_t PageSize>
[[nodiscard]] std::vector<std::byte> save(const basic_sequence<Policy, Float, PageSize>& seq) {
  return detail::snapshot_access::save(seq);
}

/// Restores `target` from `bytes`: `target` must have been built with the config and the policy parameters the
/// snapshot was saved with. input_error naming the field and the byte offset for a truncated, corrupted,
/// wrong-version, wrong-policy, wrong-config, wrong-float or wrong-page-size snapshot; usage_error for a target a
/// manager owns. Nothing changes when it throws.
template <template <class> class Policy, class Float, std::size_t PageSize>
void load(basic_sequence<Policy, Float, PageSize>& target, std::span<const std::byte> bytes) {
  detail::snapshot_access::load(target, bytes);
}

}  // namespace snapshot

}  // namespace memdecay

#endif  // MEMDECAY_IO_SNAPSHOT_HPP
