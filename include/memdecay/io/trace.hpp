// SPDX-License-Identifier: Apache-2.0
// memdecay: agent traces: the in-memory model, the binary writer and the validating reader (format versions 1, 2).
//
// A trace file holds one or more episodes under a label (for example the context tier). An episode is a stream
// of events in time order:
//   segment   : `tokens` tokens of one region enter the KV cache at a step (absolute positions continue from the
//               previous segment);
//   attention : at a step, the attention mass one query put on every position appended so far, one row per layer
//               (dense, or sparse: positions and masses); positions are absolute, never resident indices;
//   probe     : at a step, a fact held by the tokens [first, first + length) of one region is queried;
//   reference : at a step, the workload referenced the tokens [first, first + length) again (version 2).
// docs/trace-format.md specifies every byte. The reader never trusts a count before checking that the bytes it
// announces are there, so arbitrary input is rejected with a message naming the byte offset, the episode, the
// event and the field; it never crashes and never allocates more than the file's size justifies.
//
//   auto file = memdecay::trace::read_file("tier-450.mdtrace");   // trace_error on any malformed byte
//   memdecay::trace::write_file("copy.mdtrace", file);             // validates before writing
//   auto r = memdecay::trace::parse(bytes);                        // non-throwing: r.file or r.error
#ifndef MEMDECAY_IO_TRACE_HPP
#define MEMDECAY_IO_TRACE_HPP

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "memdecay/detail/error.hpp"
#include "memdecay/core/region.hpp"
#include "memdecay/core/retention_score.hpp"

namespace memdecay::trace {

/// The first eight bytes of every trace file.
inline constexpr char magic[8] = {'M', 'D', 'T', 'R', 'A', 'C', 'E', '\0'};
/// The format version this header writes (and the newest it reads). Version 2 adds reference events.
inline constexpr std::uint32_t format_version = 2;
/// The oldest format version this header reads.
inline constexpr std::uint32_t oldest_format_version = 1;
/// Limits the reader enforces (a file beyond them is rejected, not truncated).
inline constexpr std::uint32_t max_layers = 4096;
inline constexpr std::size_t max_name_bytes = 65535;
inline constexpr std::size_t max_region_name_bytes = 255;
inline constexpr std::size_t max_regions = 256;

/// Event tags on disk.
enum class event_kind : std::uint8_t { segment = 1, attention = 2, probe = 3, reference = 4 };

/// `tokens` tokens of region `region` enter the cache at `step`, at the next absolute positions.
struct segment {
  step_t step = 0;
  region_id region = 0;
  std::uint32_t tokens = 0;
  friend bool operator==(const segment&, const segment&) = default;
};

/// One layer's attention row. Dense: mass[j] is the mass on absolute position j, for every j < context. Sparse:
/// mass[k] is the mass on positions[k] (strictly ascending, < context); every other position received 0.
struct attention_row {
  bool sparse = false;
  std::vector<std::uint32_t> positions;  ///< sparse rows only
  std::vector<float> mass;
  friend bool operator==(const attention_row&, const attention_row&) = default;

  /// Adds this row's mass, scaled by `weight`, into `out` (indexed by absolute position; size >= context).
  void accumulate(std::span<float> out, float weight = 1.0f) const noexcept {
    if (sparse) {
      for (std::size_t k = 0; k < positions.size(); ++k) out[positions[k]] += weight * mass[k];
    } else {
      for (std::size_t j = 0; j < mass.size(); ++j) out[j] += weight * mass[j];
    }
  }
};

/// The attention of one query at `step` over the `context` positions appended so far, one row per layer.
struct attention {
  step_t step = 0;
  std::uint32_t context = 0;
  std::vector<attention_row> layers;
  friend bool operator==(const attention&, const attention&) = default;

  /// The mean over layers, dense over [0, context).
  [[nodiscard]] std::vector<float> layer_mean() const {
    std::vector<float> out(context, 0.0f);
    if (layers.empty()) return out;
    const float w = 1.0f / static_cast<float>(layers.size());
    for (const auto& row : layers) row.accumulate(out, w);
    return out;
  }
};

/// A fact held by tokens [first, first + length) of region `region`, queried at `step`.
struct probe {
  step_t step = 0;
  std::uint32_t id = 0;  ///< unique within the episode
  region_id region = 0;
  std::uint32_t first = 0;
  std::uint32_t length = 0;
  friend bool operator==(const probe&, const probe&) = default;
};

/// The engine (or its orchestrator) referenced tokens [first, first + length) again at `step`: the agent re-read a
/// fact, quoted a tool output, reopened a document. What the model attends to is in the attention events; this is
/// what the workload itself did, which an engine that never sees attention can still log. Calibration's reference
/// estimator fits each region's lifetime to the intervals between a token's references (docs/calibration.md).
/// Format version 2.
struct reference {
  step_t step = 0;
  std::uint32_t first = 0;
  std::uint32_t length = 0;
  friend bool operator==(const reference&, const reference&) = default;
};

using event = std::variant<segment, attention, probe, reference>;

/// One agent episode.
struct episode {
  std::string name;
  std::uint64_t seed = 0;  ///< the generator's seed (0 when not generated)
  std::vector<event> events;
  friend bool operator==(const episode&, const episode&) = default;

  /// Every token the episode appends.
  [[nodiscard]] std::uint64_t total_tokens() const noexcept {
    std::uint64_t n = 0;
    for (const auto& e : events)
      if (const auto* s = std::get_if<segment>(&e)) n += s->tokens;
    return n;
  }
  [[nodiscard]] std::size_t count_probes() const noexcept {
    return static_cast<std::size_t>(
        std::count_if(events.begin(), events.end(), [](const event& e) { return std::holds_alternative<probe>(e); }));
  }
  [[nodiscard]] std::size_t count_references() const noexcept {
    return static_cast<std::size_t>(std::count_if(events.begin(), events.end(),
                                                  [](const event& e) { return std::holds_alternative<reference>(e); }));
  }
  [[nodiscard]] std::size_t count_attention() const noexcept {
    return static_cast<std::size_t>(std::count_if(events.begin(), events.end(),
                                                  [](const event& e) { return std::holds_alternative<attention>(e); }));
  }
  /// The region label of every token, in position order.
  [[nodiscard]] std::vector<region_id> labels() const {
    std::vector<region_id> out;
    for (const auto& e : events)
      if (const auto* s = std::get_if<segment>(&e)) out.insert(out.end(), s->tokens, s->region);
    return out;
  }
  /// The last step of any event (0 for an empty episode).
  [[nodiscard]] step_t last_step() const noexcept {
    step_t last = 0;
    for (const auto& e : events) last = std::max(last, std::visit([](const auto& v) { return v.step; }, e));
    return last;
  }
};

/// A trace file: a label (for example "tier-450"), the region names its ids refer to, the number of attention
/// layers every observation carries, and the episodes.
struct trace_file {
  std::string label;
  std::uint32_t layers = 1;
  std::vector<std::string> region_names;
  std::vector<episode> episodes;
  friend bool operator==(const trace_file&, const trace_file&) = default;

  [[nodiscard]] std::size_t count_probes() const noexcept {
    std::size_t n = 0;
    for (const auto& e : episodes) n += e.count_probes();
    return n;
  }
};

/// The region names of the default region table, in id order (what the generator writes).
inline std::vector<std::string> default_region_names() {
  std::vector<std::string> names;
  const auto table = default_region_table();
  for (const auto& p : table.params()) names.push_back(p.name);
  return names;
}

/// Where and why a trace is malformed.
struct error_info {
  std::uint64_t offset = 0;  ///< byte offset of the offending field (0 for in-memory validation)
  std::string message;       ///< names the episode, event and field, and the value
};

/// A malformed trace (reading) or an invalid in-memory trace (writing). An input_error, so callers that already
/// handle memdecay's tiers need nothing new.
class trace_error : public input_error {
 public:
  trace_error(const std::string& message, std::uint64_t offset) : input_error(message), offset_(offset) {}
  /// Byte offset of the offending field (0 when the error is not about a file's bytes).
  [[nodiscard]] std::uint64_t offset() const noexcept { return offset_; }

 private:
  std::uint64_t offset_;
};

namespace detail {

[[noreturn]] MEMDECAY_NOINLINE inline void raise_trace(const std::string& message, std::uint64_t offset) {
#if MEMDECAY_HAS_EXCEPTIONS
  throw trace_error(message, offset);
#else
  (void)offset;
  std::fprintf(stderr, "memdecay: fatal: %s\n", message.c_str());
  std::abort();
#endif
}

inline std::string num(std::uint64_t v) { return std::to_string(v); }
inline std::string fnum(double v) { return memdecay::detail::to_text(v); }

// The semantic checks shared by the reader and in-memory validation: one instance per episode.
class episode_checker {
 public:
  episode_checker(std::size_t regions, std::uint32_t layers) : regions_(regions), layers_(layers) {}

  // Each returns an empty string when the event is valid, else the reason (without location).
  std::string step(step_t s) {
    if (s < last_step_) return "step " + num(s) + " goes backwards (previous event at step " + num(last_step_) + ")";
    last_step_ = s;
    return {};
  }
  std::string segment(const trace::segment& s) {
    if (auto e = step(s.step); !e.empty()) return e;
    if (s.region >= regions_)
      return "region id " + num(s.region) + " is not in the region table (" + num(regions_) + " regions)";
    if (s.tokens == 0) return "segment has 0 tokens";
    if (appended_ + s.tokens > std::numeric_limits<std::uint32_t>::max())
      return "segment of " + num(s.tokens) + " tokens takes the episode past 2^32 - 1 tokens";
    runs_.push_back({static_cast<std::uint32_t>(appended_), s.region});
    appended_ += s.tokens;
    return {};
  }
  std::string attention_header(step_t s, std::uint32_t context, std::size_t layers) {
    if (auto e = step(s); !e.empty()) return e;
    if (context != appended_)
      return "attention context " + num(context) + " disagrees with the " + num(appended_) + " tokens appended so far";
    if (layers != layers_) return "attention has " + num(layers) + " layers, the file header says " + num(layers_);
    return {};
  }
  static std::string mass(float m, std::size_t k) {
    if (std::isnan(m)) return "mass[" + num(k) + "] is NaN";
    if (std::isinf(m)) return "mass[" + num(k) + "] is infinite";
    if (m < 0.0f) return "mass[" + num(k) + "] = " + fnum(m) + " is negative";
    return {};
  }
  static std::string sparse_position(std::uint32_t pos, std::size_t k, std::optional<std::uint32_t> previous,
                                     std::uint32_t context) {
    if (pos >= context)
      return "position[" + num(k) + "] = " + num(pos) + " is outside the context of " + num(context) + " tokens";
    if (previous && pos <= *previous)
      return "position[" + num(k) + "] = " + num(pos) + " is not above position[" + num(k - 1) +
             "] = " + num(*previous);
    return {};
  }
  std::string probe(const trace::probe& p) {
    if (auto e = step(p.step); !e.empty()) return e;
    if (p.region >= regions_)
      return "region id " + num(p.region) + " is not in the region table (" + num(regions_) + " regions)";
    if (p.length == 0) return "probe " + num(p.id) + " has length 0";
    if (std::uint64_t{p.first} + p.length > appended_)
      return "probe " + num(p.id) + " covers positions [" + num(p.first) + ", " +
             num(std::uint64_t{p.first} + p.length) + ") but only " + num(appended_) +
             " tokens were appended before it";
    if (!ids_.insert(p.id).second) return "probe id " + num(p.id) + " is repeated";
    // Every token of the fact must carry the probe's region: find the run holding `first` and walk forward.
    auto it = std::upper_bound(runs_.begin(), runs_.end(), p.first,
                               [](std::uint32_t pos, const run& r) { return pos < r.start; });
    --it;  // runs_ starts at 0 and first < appended_, so there is one
    const std::uint64_t end = std::uint64_t{p.first} + p.length;
    for (; it != runs_.end() && it->start < end; ++it)
      if (it->region != p.region)
        return "probe " + num(p.id) + " says region " + num(p.region) + " but position " +
               num(std::max<std::uint64_t>(it->start, p.first)) + " belongs to region " + num(it->region);
    return {};
  }
  std::string reference(const trace::reference& r) {
    if (auto e = step(r.step); !e.empty()) return e;
    if (r.length == 0) return "reference has length 0";
    if (std::uint64_t{r.first} + r.length > appended_)
      return "reference covers positions [" + num(r.first) + ", " + num(std::uint64_t{r.first} + r.length) +
             ") but only " + num(appended_) + " tokens were appended before it";
    return {};
  }
  [[nodiscard]] std::uint64_t appended() const noexcept { return appended_; }

 private:
  struct run {
    std::uint32_t start;
    region_id region;
  };
  std::size_t regions_;
  std::uint32_t layers_;
  step_t last_step_ = 0;
  std::uint64_t appended_ = 0;
  std::vector<run> runs_;
  std::set<std::uint32_t> ids_;
};

inline std::string check_header(const trace_file& f) {
  if (f.label.size() > max_name_bytes) return "label is " + num(f.label.size()) + " bytes (at most 65535)";
  if (f.layers == 0 || f.layers > max_layers) return "layers = " + num(f.layers) + " (must be in [1, 4096])";
  if (f.region_names.empty() || f.region_names.size() > max_regions)
    return "region count = " + num(f.region_names.size()) + " (must be in [1, 256])";
  for (std::size_t i = 0; i < f.region_names.size(); ++i) {
    const auto& n = f.region_names[i];
    if (n.empty() || n.size() > max_region_name_bytes)
      return "region " + num(i) + " name is " + num(n.size()) + " bytes (must be 1 to 255)";
    for (std::size_t j = 0; j < i; ++j)
      if (f.region_names[j] == n) return "region " + num(i) + " name '" + n + "' repeats region " + num(j);
  }
  return {};
}

// Little-endian primitives.
class byte_writer {
 public:
  void u8(std::uint8_t v) { out_.push_back(static_cast<std::byte>(v)); }
  void u16(std::uint16_t v) { put(v, 2); }
  void u32(std::uint32_t v) { put(v, 4); }
  void u64(std::uint64_t v) { put(v, 8); }
  void f32(float v) { u32(std::bit_cast<std::uint32_t>(v)); }
  void bytes(std::string_view s) {
    for (char c : s) out_.push_back(static_cast<std::byte>(c));
  }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  void put(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xff));
  }
  std::vector<std::byte> out_;
};

class byte_reader {
 public:
  explicit byte_reader(std::span<const std::byte> in) : in_(in) {}
  [[nodiscard]] std::uint64_t offset() const noexcept { return pos_; }
  [[nodiscard]] std::uint64_t remaining() const noexcept { return in_.size() - pos_; }
  [[nodiscard]] std::uint64_t size() const noexcept { return in_.size(); }
  bool has(std::uint64_t n) const noexcept { return remaining() >= n; }
  std::uint64_t get(int n) noexcept {  // callers check has(n) first
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= std::uint64_t{std::to_integer<std::uint8_t>(in_[pos_ + i])} << (8 * i);
    pos_ += static_cast<std::uint64_t>(n);
    return v;
  }
  std::string text(std::size_t n) {
    std::string s(n, '\0');
    for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>(std::to_integer<unsigned char>(in_[pos_ + i]));
    pos_ += n;
    return s;
  }

 private:
  std::span<const std::byte> in_;
  std::uint64_t pos_ = 0;
};

// Minimal encoded sizes, used to reject counts that cannot fit in the bytes left before allocating for them.
inline constexpr std::uint64_t min_event_bytes = 10;    // tag + step + region + tokens (segment)
inline constexpr std::uint64_t min_episode_bytes = 14;  // name length + seed + event count

class parser {
 public:
  explicit parser(std::span<const std::byte> in) : r_(in) {}

  std::optional<trace_file> run() {
    trace_file f;
    if (!header(f)) return std::nullopt;
    std::uint32_t episodes = 0;
    if (!u32(episodes, "episode count")) return std::nullopt;
    if (episodes > r_.remaining() / min_episode_bytes)
      return fail("episode count " + num(episodes) + " cannot fit in the " + num(r_.remaining()) + " bytes left");
    f.episodes.reserve(episodes);
    for (std::uint32_t e = 0; e < episodes; ++e) {
      where_ = "episode " + num(e) + ": ";
      f.episodes.emplace_back();
      if (!episode(f, f.episodes.back())) return std::nullopt;
    }
    where_.clear();
    field_at_ = r_.offset();
    if (r_.remaining() != 0) return fail(num(r_.remaining()) + " trailing bytes after the last episode");
    return f;
  }
  error_info error() const { return error_; }

 private:
  std::nullopt_t fail(const std::string& why) {
    error_ = {field_at_, "byte " + num(field_at_) + ": " + where_ + why};
    return std::nullopt;
  }
  bool read(int n, std::uint64_t& v, const char* field) {
    field_at_ = r_.offset();
    if (!r_.has(static_cast<std::uint64_t>(n))) {
      fail("truncated: " + std::string(field) + " needs " + num(static_cast<std::uint64_t>(n)) +
           " bytes, the file ends after " + num(r_.remaining()));
      return false;
    }
    v = r_.get(n);
    return true;
  }
  template <class T>
  bool uint(T& out, const char* field) {
    std::uint64_t v = 0;
    if (!read(static_cast<int>(sizeof(T)), v, field)) return false;
    out = static_cast<T>(v);
    return true;
  }
  bool u8(std::uint8_t& out, const char* field) { return uint(out, field); }
  bool u16(std::uint16_t& out, const char* field) { return uint(out, field); }
  bool u32(std::uint32_t& out, const char* field) { return uint(out, field); }
  bool u64(std::uint64_t& out, const char* field) { return uint(out, field); }
  bool f32(float& out, const char* field) {
    std::uint32_t bits = 0;
    if (!u32(bits, field)) return false;
    out = std::bit_cast<float>(bits);
    return true;
  }
  bool text(std::size_t n, std::string& out, const char* field) {
    field_at_ = r_.offset();
    if (!r_.has(n)) {
      fail("truncated: " + std::string(field) + " needs " + num(n) + " bytes, the file ends after " +
           num(r_.remaining()));
      return false;
    }
    out = r_.text(n);
    return true;
  }
  bool check(const std::string& why) {
    if (why.empty()) return true;
    fail(why);
    return false;
  }

  bool header(trace_file& f) {
    std::string m;
    if (!text(8, m, "magic")) return false;
    if (std::memcmp(m.data(), magic, 8) != 0) return check("bad magic (not a memdecay trace file)");
    std::uint32_t version = 0, flags = 0;
    if (!u32(version, "version")) return false;
    if (version < oldest_format_version || version > format_version)
      return check("unsupported version " + num(version) + " (this reader reads versions " +
                   num(oldest_format_version) + " to " + num(format_version) + ")");
    version_ = version;
    if (!u32(flags, "flags")) return false;
    if (flags != 0) return check("flags = " + num(flags) + " (reserved, must be 0)");
    if (!u32(f.layers, "layer count")) return false;
    if (f.layers == 0 || f.layers > max_layers)
      return check("layer count " + num(f.layers) + " (must be in [1, 4096])");
    std::uint16_t label_len = 0;
    if (!u16(label_len, "label length") || !text(label_len, f.label, "label")) return false;
    std::uint16_t regions = 0;
    if (!u16(regions, "region count")) return false;
    if (regions == 0 || regions > max_regions) return check("region count " + num(regions) + " (must be in [1, 256])");
    for (std::uint16_t i = 0; i < regions; ++i) {
      std::uint8_t len = 0;
      std::string name;
      if (!u8(len, "region name length")) return false;
      if (len == 0) return check("region " + num(i) + " has an empty name");
      if (!text(len, name, "region name")) return false;
      for (std::size_t j = 0; j < f.region_names.size(); ++j)
        if (f.region_names[j] == name)
          return check("region " + num(i) + " name '" + name + "' repeats region " + num(j));
      f.region_names.push_back(std::move(name));
    }
    return true;
  }

  bool episode(const trace_file& f, trace::episode& ep) {
    std::uint16_t name_len = 0;
    std::uint32_t events = 0;
    if (!u16(name_len, "episode name length") || !text(name_len, ep.name, "episode name") ||
        !u64(ep.seed, "episode seed") || !u32(events, "event count"))
      return false;
    if (events > r_.remaining() / min_event_bytes)
      return check("event count " + num(events) + " cannot fit in the " + num(r_.remaining()) + " bytes left");
    ep.events.reserve(events);
    episode_checker checker(f.region_names.size(), f.layers);
    const std::string episode_where = where_;
    for (std::uint32_t k = 0; k < events; ++k) {
      where_ = episode_where + "event " + num(k) + ": ";
      if (!event(f, checker, ep)) return false;
    }
    return true;
  }

  bool event(const trace_file& f, episode_checker& checker, trace::episode& ep) {
    std::uint8_t tag = 0;
    if (!u8(tag, "event tag")) return false;
    switch (static_cast<event_kind>(tag)) {
      case event_kind::segment: {
        trace::segment s;
        const auto at = r_.offset();
        if (!u32(s.step, "segment step") || !u8(s.region, "segment region") || !u32(s.tokens, "segment tokens"))
          return false;
        field_at_ = at;
        if (!check(checker.segment(s))) return false;
        ep.events.emplace_back(s);
        return true;
      }
      case event_kind::attention: {
        trace::attention a;
        const auto at = r_.offset();
        if (!u32(a.step, "attention step") || !u32(a.context, "attention context")) return false;
        field_at_ = at;
        if (!check(checker.attention_header(a.step, a.context, f.layers))) return false;
        if (r_.remaining() < f.layers) {  // every row takes at least its encoding byte
          field_at_ = r_.offset();
          return check("truncated: " + num(f.layers) + " attention rows need at least " + num(f.layers) +
                       " bytes, the file ends after " + num(r_.remaining()));
        }
        a.layers.resize(f.layers);
        const std::string event_where = where_;
        for (std::uint32_t l = 0; l < f.layers; ++l) {
          where_ = event_where + "layer " + num(l) + ": ";
          if (!row(a.context, a.layers[l])) return false;
        }
        where_ = event_where;
        ep.events.emplace_back(std::move(a));
        return true;
      }
      case event_kind::probe: {
        trace::probe p;
        const auto at = r_.offset();
        if (!u32(p.step, "probe step") || !u32(p.id, "probe id") || !u8(p.region, "probe region") ||
            !u32(p.first, "probe first position") || !u32(p.length, "probe length"))
          return false;
        field_at_ = at;
        if (!check(checker.probe(p))) return false;
        ep.events.emplace_back(p);
        return true;
      }
      case event_kind::reference: {
        if (version_ < 2) break;
        trace::reference x;
        const auto at = r_.offset();
        if (!u32(x.step, "reference step") || !u32(x.first, "reference first position") ||
            !u32(x.length, "reference length"))
          return false;
        field_at_ = at;
        if (!check(checker.reference(x))) return false;
        ep.events.emplace_back(x);
        return true;
      }
    }
    return check("unknown event tag " + num(tag) + (version_ < 2 ? " (version 1: 1 segment, 2 attention, 3 probe)"
                                                                  : " (1 segment, 2 attention, 3 probe, 4 reference)"));
  }

  bool row(std::uint32_t context, attention_row& out) {
    std::uint8_t encoding = 0;
    if (!u8(encoding, "row encoding")) return false;
    if (encoding > 1) return check("row encoding " + num(encoding) + " (0 dense, 1 sparse)");
    out.sparse = encoding == 1;
    std::uint32_t count = context;
    if (out.sparse) {
      if (!u32(count, "sparse entry count")) return false;
      if (count > context)
        return check("sparse entry count " + num(count) + " exceeds the context of " + num(context) + " tokens");
      if (std::uint64_t{count} * 8 > r_.remaining())
        return check("truncated: " + num(count) + " sparse entries need " + num(std::uint64_t{count} * 8) +
                     " bytes, the file ends after " + num(r_.remaining()));
      out.positions.resize(count);
      std::optional<std::uint32_t> previous;
      for (std::uint32_t k = 0; k < count; ++k) {
        if (!u32(out.positions[k], "sparse position")) return false;
        if (!check(episode_checker::sparse_position(out.positions[k], k, previous, context))) return false;
        previous = out.positions[k];
      }
    } else if (std::uint64_t{count} * 4 > r_.remaining()) {
      field_at_ = r_.offset();
      return check("truncated: a dense row over " + num(count) + " tokens needs " + num(std::uint64_t{count} * 4) +
                   " bytes, the file ends after " + num(r_.remaining()));
    }
    out.mass.resize(count);
    for (std::uint32_t k = 0; k < count; ++k) {
      if (!f32(out.mass[k], "mass")) return false;
      if (!check(episode_checker::mass(out.mass[k], k))) return false;
    }
    return true;
  }

  byte_reader r_;
  std::uint32_t version_ = format_version;
  std::string where_;
  std::uint64_t field_at_ = 0;
  error_info error_;
};

}  // namespace detail

/// The outcome of parse(): exactly one of `file` and `error` is set.
struct parse_result {
  std::optional<trace_file> file;
  std::optional<error_info> error;
  [[nodiscard]] bool ok() const noexcept { return file.has_value(); }
};

/// Parses a whole trace file. Never throws for malformed input (only std::bad_alloc when memory runs out, and no
/// allocation exceeds what the input's size justifies): a malformed file gives `error` with the byte offset.
[[nodiscard]] inline parse_result parse(std::span<const std::byte> bytes) {
  detail::parser p(bytes);
  parse_result r;
  r.file = p.run();
  if (!r.file) r.error = p.error();
  return r;
}

/// Parses a whole trace file; trace_error (with the byte offset) when it is malformed.
[[nodiscard]] inline trace_file parse_or_throw(std::span<const std::byte> bytes, std::string_view source = "trace") {
  auto r = parse(bytes);
  if (!r.ok()) detail::raise_trace("invalid trace '" + std::string(source) + "': " + r.error->message, r.error->offset);
  return std::move(*r.file);
}

/// Checks an in-memory trace against every rule the reader enforces. Returns the first violation, naming the
/// episode, event and field; nothing when the trace is valid.
[[nodiscard]] inline std::optional<error_info> check(const trace_file& f) {
  if (auto e = detail::check_header(f); !e.empty()) return error_info{0, e};
  for (std::size_t i = 0; i < f.episodes.size(); ++i) {
    const auto& ep = f.episodes[i];
    const std::string where = "episode " + detail::num(i) + ": ";
    if (ep.name.size() > max_name_bytes) return error_info{0, where + "name is longer than 65535 bytes"};
    if (ep.events.size() > std::numeric_limits<std::uint32_t>::max()) return error_info{0, where + "too many events"};
    detail::episode_checker checker(f.region_names.size(), f.layers);
    for (std::size_t k = 0; k < ep.events.size(); ++k) {
      const std::string at = where + "event " + detail::num(k) + ": ";
      std::string why;
      if (const auto* s = std::get_if<segment>(&ep.events[k])) {
        why = checker.segment(*s);
      } else if (const auto* p = std::get_if<probe>(&ep.events[k])) {
        why = checker.probe(*p);
      } else if (const auto* x = std::get_if<reference>(&ep.events[k])) {
        why = checker.reference(*x);
      } else {
        const auto& a = std::get<attention>(ep.events[k]);
        why = checker.attention_header(a.step, a.context, a.layers.size());
        for (std::size_t l = 0; why.empty() && l < a.layers.size(); ++l) {
          const auto& row = a.layers[l];
          const std::string layer = "layer " + detail::num(l) + ": ";
          if (row.sparse) {
            if (row.positions.size() != row.mass.size()) {
              why = layer + "sparse row has " + detail::num(row.positions.size()) + " positions and " +
                    detail::num(row.mass.size()) + " masses";
              break;
            }
            std::optional<std::uint32_t> previous;
            for (std::size_t j = 0; why.empty() && j < row.positions.size(); ++j) {
              why = detail::episode_checker::sparse_position(row.positions[j], j, previous, a.context);
              previous = row.positions[j];
            }
          } else if (!row.positions.empty()) {
            why = "dense row carries " + detail::num(row.positions.size()) + " positions";
          } else if (row.mass.size() != a.context) {
            why = "dense row has " + detail::num(row.mass.size()) + " masses for a context of " +
                  detail::num(a.context) + " tokens";
          }
          for (std::size_t j = 0; why.empty() && j < row.mass.size(); ++j)
            why = detail::episode_checker::mass(row.mass[j], j);
          if (!why.empty()) why = layer + why;
        }
      }
      if (!why.empty()) return error_info{0, at + why};
    }
  }
  return std::nullopt;
}

/// Encodes a trace (format version 2). trace_error, writing nothing, when check() finds it invalid.
[[nodiscard]] inline std::vector<std::byte> encode(const trace_file& f) {
  if (auto e = check(f)) detail::raise_trace("cannot encode trace '" + f.label + "': " + e->message, 0);
  detail::byte_writer w;
  w.bytes(std::string_view(magic, 8));
  w.u32(format_version);
  w.u32(0);
  w.u32(f.layers);
  w.u16(static_cast<std::uint16_t>(f.label.size()));
  w.bytes(f.label);
  w.u16(static_cast<std::uint16_t>(f.region_names.size()));
  for (const auto& n : f.region_names) {
    w.u8(static_cast<std::uint8_t>(n.size()));
    w.bytes(n);
  }
  w.u32(static_cast<std::uint32_t>(f.episodes.size()));
  for (const auto& ep : f.episodes) {
    w.u16(static_cast<std::uint16_t>(ep.name.size()));
    w.bytes(ep.name);
    w.u64(ep.seed);
    w.u32(static_cast<std::uint32_t>(ep.events.size()));
    for (const auto& ev : ep.events) {
      if (const auto* s = std::get_if<segment>(&ev)) {
        w.u8(static_cast<std::uint8_t>(event_kind::segment));
        w.u32(s->step);
        w.u8(s->region);
        w.u32(s->tokens);
      } else if (const auto* p = std::get_if<probe>(&ev)) {
        w.u8(static_cast<std::uint8_t>(event_kind::probe));
        w.u32(p->step);
        w.u32(p->id);
        w.u8(p->region);
        w.u32(p->first);
        w.u32(p->length);
      } else if (const auto* x = std::get_if<reference>(&ev)) {
        w.u8(static_cast<std::uint8_t>(event_kind::reference));
        w.u32(x->step);
        w.u32(x->first);
        w.u32(x->length);
      } else {
        const auto& a = std::get<attention>(ev);
        w.u8(static_cast<std::uint8_t>(event_kind::attention));
        w.u32(a.step);
        w.u32(a.context);
        for (const auto& row : a.layers) {
          w.u8(row.sparse ? 1 : 0);
          if (row.sparse) {
            w.u32(static_cast<std::uint32_t>(row.positions.size()));
            for (auto pos : row.positions) w.u32(pos);
          }
          for (float m : row.mass) w.f32(m);
        }
      }
    }
  }
  return w.take();
}

/// Reads a trace file; trace_error naming the path (and the byte offset) when it cannot be read or is malformed.
[[nodiscard]] inline trace_file read_file(const std::filesystem::path& path) {
  std::FILE* fp = std::fopen(path.string().c_str(), "rb");
  if (!fp) detail::raise_trace("cannot open trace '" + path.string() + "': " + std::strerror(errno), 0);
  std::vector<std::byte> bytes;
  std::byte buffer[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, fp)) > 0) bytes.insert(bytes.end(), buffer, buffer + n);
  const bool failed = std::ferror(fp) != 0;
  std::fclose(fp);
  if (failed) detail::raise_trace("cannot read trace '" + path.string() + "'", 0);
  return parse_or_throw(bytes, path.string());
}

/// Writes a trace file (validated first); trace_error when the trace is invalid or the file cannot be written.
inline void write_file(const std::filesystem::path& path, const trace_file& f) {
  const auto bytes = encode(f);
  std::FILE* fp = std::fopen(path.string().c_str(), "wb");
  if (!fp) detail::raise_trace("cannot create trace '" + path.string() + "': " + std::strerror(errno), 0);
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), fp) == bytes.size();
  if (std::fclose(fp) != 0 || !ok) detail::raise_trace("cannot write trace '" + path.string() + "'", 0);
}

}  // namespace memdecay::trace

#endif  // MEMDECAY_IO_TRACE_HPP
