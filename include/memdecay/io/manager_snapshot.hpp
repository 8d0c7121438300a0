// SPDX-License-Identifier: Apache-2.0
// memdecay: snapshots of a whole manager (every open sequence, the shared pages, this step's protections, the
// clock), full or incremental, so that an engine can checkpoint its eviction state every few seconds.
//
//   memdecay::snapshot::checkpoint cp;                          // empty: the first save is full
//   auto base = memdecay::snapshot::save(mgr, cp);              // every sequence
//   ...                                                         // steps
//   auto delta = memdecay::snapshot::save(mgr, cp);             // only what changed since the last save
//   ...                                                         // the worker restarts
//   memdecay::manager restored(mgr_cfg);                        // the same manager_config
//   memdecay::snapshot::load(restored, std::vector{base, delta}, [&](std::uint64_t id) { return config_of(id); });
//
// The format is docs/snapshot-format.md (part 2): a header like a sequence snapshot's (magic, version, policy, float
// type, page size, the snapshot's id and the id of the one it follows, two CRC-32Cs), then the manager's state and
// one record per open sequence, ascending ids. A record is the sequence's own snapshot (io/snapshot.hpp), or, in
// an incremental snapshot, "unchanged" (the sequence is as the previous snapshot saved it), or a clock record: the
// sequence changed only by advance_to (its content_generation() did not move), so the record holds its clock, its
// generation and its policy's scalars, a few hundred bytes instead of ~17 per token (a rebased record adds the
// columns the policy's on_advance rewrote: MemDecay's exp-free weights, 4 bytes per token). Between two checkpoints of a
// serving engine most sequences are waiting or preempted: their clocks move, nothing else does.
//
// Like a sequence snapshot it holds state, not configuration: load asks the engine for each sequence's config
// (and policy parameters) and checks them against the snapshot, and checks the manager's page size and global
// budget. load never half-applies: the chain is rebuilt into a new manager that replaces the target's contents
// only when every element has been checked (references to the target's old sequences are then dangling, as after
// close()). A loaded manager has the same digest() as the saved one and selects the same victims for every later
// call.
#ifndef MEMDECAY_IO_MANAGER_SNAPSHOT_HPP
#define MEMDECAY_IO_MANAGER_SNAPSHOT_HPP

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "memdecay/core/manager.hpp"
#include "memdecay/detail/crc32c.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/io/snapshot.hpp"

namespace memdecay {

namespace snapshot {

/// The first 8 bytes of every manager snapshot.
inline constexpr std::array<char, 8> manager_magic = {'M', 'D', 'M', 'G', 'R', 'S', '\r', '\n'};
/// Bytes of the fixed part of a manager snapshot's header (the policy name follows it).
inline constexpr std::size_t manager_header_bytes = 56;

/// How a manager snapshot holds one sequence.
enum class record_kind : std::uint8_t {
  full = 0,       ///< the sequence's own snapshot
  clock = 1,      ///< only its clock, generation and policy scalars moved since the previous snapshot
  unchanged = 2,  ///< exactly as the previous snapshot saved it
  rebased = 3,    ///< a clock record with the columns the policy's on_advance rewrote (MemDecay: a rebase)
};

/// What an incremental save compares with: the sequences of one manager as its last save (with this checkpoint)
/// saw them. An empty checkpoint makes the next save full; every save updates it. Copyable: an engine that keeps
/// two chains (say, one per storage tier) keeps two checkpoints.
class checkpoint {
 public:
  /// Whether the next save will be full.
  [[nodiscard]] bool empty() const noexcept { return last_id_ == 0; }
  /// The id of the last snapshot saved with this checkpoint (0 before the first).
  [[nodiscard]] std::uint64_t last_snapshot() const noexcept { return last_id_; }
  /// Makes the next save full (for example after the chain's storage was lost).
  void reset() noexcept {
    owner_ = 0;
    last_id_ = 0;
    marks_.clear();
  }

 private:
  friend struct detail::manager_snapshot_access;
  struct mark {
    std::uint64_t id, serial, generation, content_generation;
  };
  std::uint64_t owner_ = 0;  // the instance of the manager the marks are of
  std::uint64_t last_id_ = 0;
  std::vector<mark> marks_;  // ascending ids
};

}  // namespace snapshot

namespace detail {

struct manager_snapshot_access {
  template <class Mgr>
  static std::vector<std::byte> save(const Mgr& mgr, snapshot::checkpoint* since, std::vector<std::byte> buffer = {}) {
    using Seq = typename Mgr::sequence_type;
    using Float = typename Seq::float_type;
    using P = typename Seq::policy_type;
    const bool incremental = since != nullptr && !since->empty();
    if (incremental && since->owner_ != mgr.instance_)
      raise_usage("manager snapshot: the checkpoint belongs to another manager (reset() it, or use one per manager)");
    std::size_t tokens = 0;
    for (const auto& [id, e] : mgr.entries_) tokens += e.seq->kv_len();
    snapshot_writer w(std::move(buffer));
    w.bytes().reserve(snapshot::manager_header_bytes + 64 * mgr.entries_.size() + (incremental ? 0 : 20 * tokens));
    const std::string_view name = P::name;
    w.bytes().resize(snapshot::manager_header_bytes);
    w.put_bytes(std::as_bytes(std::span<const char>(name.data(), name.size())));
    const std::size_t payload_at = w.bytes().size();

    w.put(static_cast<std::uint64_t>(mgr.config_.global.high));
    w.put(static_cast<std::uint64_t>(mgr.config_.global.low));
    w.put(mgr.now_);
    w.put(mgr.next_key_);
    w.put(static_cast<std::uint64_t>(mgr.entries_.size()));
    std::vector<snapshot::checkpoint::mark> marks;
    marks.reserve(mgr.entries_.size());
    std::vector<std::uint64_t> external;
    const std::vector<snapshot::checkpoint::mark> none;
    const auto& saved = incremental ? since->marks_ : none;
    auto previous = saved.cbegin();
    const auto previous_end = saved.cend();
    for (const auto& [id, e] : mgr.entries_) {
      const Seq& seq = *e.seq;
      const std::uint64_t key = id_bits(id);
      while (incremental && previous != previous_end && previous->id < key) ++previous;
      snapshot::record_kind kind = snapshot::record_kind::full;
      if (incremental && previous != previous_end && previous->id == key && previous->serial == e.serial) {
        if (previous->generation == seq.generation())
          kind = snapshot::record_kind::unchanged;
        else if (previous->content_generation == seq.content_generation())
          kind = seq.advance_columns_generation() > previous->generation ? snapshot::record_kind::rebased
                                                                         : snapshot::record_kind::clock;
      }
      w.put(key);
      w.put(static_cast<std::uint8_t>(kind));
      w.put(static_cast<std::uint64_t>(e.protected_origins.size()));
      for (std::uint64_t o : e.protected_origins) w.put(o);
      w.put(static_cast<std::uint64_t>(e.shared.size()));
      for (const auto& [origin, block] : e.shared) {
        w.put(origin);
        w.put(block);
      }
      if (kind == snapshot::record_kind::full) {
        const std::size_t length_at = w.bytes().size();
        w.put(std::uint64_t{0});
        snapshot_access::save_into(seq, w);
        put_le(w.bytes(), length_at, static_cast<std::uint64_t>(w.bytes().size() - length_at - 8));
      } else if (kind != snapshot::record_kind::unchanged) {
        snapshot_access::save_clock(seq, w, kind == snapshot::record_kind::rebased);
      }
      marks.push_back({key, e.serial, seq.generation(), seq.content_generation()});
    }
    for (const auto& [block, holders] : mgr.blocks_)
      if (holders.external) external.push_back(block);
    w.put(static_cast<std::uint64_t>(external.size()));
    for (std::uint64_t block : external) w.put(block);

    auto& out = w.bytes();
    const auto body = std::span<const std::byte>(out).subspan(payload_at);
    const std::uint32_t payload_crc = crc32c(body);
    const std::uint64_t base_id = incremental ? since->last_id_ : 0;
    const std::uint64_t id =
        policy_support::splitmix64(base_id ^ (std::uint64_t{payload_crc} << 17) ^ body.size()) | 1u;
    std::memcpy(out.data(), snapshot::manager_magic.data(), snapshot::manager_magic.size());
    put_le(out, 8, snapshot::format_version);
    put_le(out, 12, library_version_number());
    put_le(out, 16, float_code<Float>());
    put_le(out, 17, static_cast<std::uint8_t>(name.size()));
    put_le(out, 18, static_cast<std::uint8_t>(incremental ? 1 : 0));
    put_le(out, 19, std::uint8_t{0});
    put_le(out, 20, static_cast<std::uint32_t>(mgr.page_size()));
    put_le(out, 24, id);
    put_le(out, 32, base_id);
    put_le(out, 40, static_cast<std::uint64_t>(body.size()));
    put_le(out, 48, payload_crc);
    put_le(out, 52, header_crc(std::span<const std::byte>(out).first(payload_at)));
    if (since) {  // nothing can fail from here
      since->owner_ = mgr.instance_;
      since->last_id_ = id;
      since->marks_ = std::move(marks);
    }
    return std::move(out);
  }

  template <class Mgr, class Configure>
  static void load(Mgr& target, std::span<const std::span<const std::byte>> chain, Configure& configure) {
    using Seq = typename Mgr::sequence_type;
    using Id = typename Mgr::sequence_id;
    if (chain.empty()) raise_input("manager snapshot: an empty chain (the first element must be a full snapshot)");
    // Pass 1: every element's header, checksums and structure; the records located, nothing built yet.
    std::vector<element> elements(chain.size());
    for (std::size_t k = 0; k < chain.size(); ++k) {
      elements[k].where = chain.size() == 1 ? "manager snapshot"
                                            : "manager snapshot " + to_text(k + 1) + " of " + to_text(chain.size());
      parse<Mgr>(target, chain[k], k, k + 1 == chain.size(), k > 0 ? &elements[k - 1] : nullptr, elements[k]);
    }
    // Pass 2: the sequences of the last element, each from its last full record and the clock records after it
    // (a sequence closed, or replaced by a reopened id, before the last element is never built).
    const element& last = elements.back();
    Mgr built(target.config_);
    built.openings_ = target.openings_;  // the target's old checkpoints then see every loaded sequence as new
    built.now_ = last.now;
    built.next_key_ = last.next_key;
    for (const entry& e : last.entries) {
      const Id sid = from_bits<Id>(static_cast<decltype(to_bits(Id{}))>(e.key));
      const std::string who = "sequence " + to_text(sid);
      std::size_t k = elements.size() - 1;
      while (find(elements[k], e.key)->kind != snapshot::record_kind::full) --k;  // pass 1 made sure one exists
      const entry& full = *find(elements[k], e.key);
      auto seq = make_sequence<Seq>(sid, configure, built.page_size(), elements[k].where);
#if MEMDECAY_HAS_EXCEPTIONS
      try {
        snapshot_access::load(*seq, full.record);
      } catch (const input_error& error) {  // the sequence's own offsets, inside its record: say where that is
        raise_input(elements[k].where + " " + who + " (its record at offset " + to_text(full.record_at) +
                    "): " + error.what());
      }
#else
      snapshot_access::load(*seq, full.record);
#endif
      for (std::size_t j = k + 1; j < elements.size(); ++j) {
        const entry& later = *find(elements[j], e.key);
        if (later.kind == snapshot::record_kind::unchanged) continue;
        snapshot_reader r(later.record, later.record_at);
        snapshot_access::load_clock(*seq, r, later.kind == snapshot::record_kind::rebased);
        if (r.left() != 0) fail(elements[j].where, r.offset(), "clock record", who + ": bytes after its fields");
      }
      // The layout is known: the page flags must name resident pages, and a shared one a device page (a host
      // page holds no device block).
      const auto origins = seq->state().page_origins();
      const auto resident = [&](std::uint64_t o) { return std::binary_search(origins.begin(), origins.end(), o); };
      const auto on_device = [&](std::uint64_t o) {
        const auto at = static_cast<std::size_t>(std::lower_bound(origins.begin(), origins.end(), o) - origins.begin());
        return !seq->has_host_tier() || !seq->host_tier().on_host(at);
      };
      for (std::size_t i = 0; i < e.protect.size(); ++i)
        if ((i > 0 && e.protect[i] <= e.protect[i - 1]) || !resident(e.protect[i]))
          fail(last.where, e.protected_at + 8 + 8 * i, "protected origin",
               who + ": " + to_text(e.protect[i]) + " (ascending origins of resident pages)");
      for (std::size_t i = 0; i < e.shared.size(); ++i) {
        const auto [o, b] = e.shared[i];
        if ((i > 0 && o <= e.shared[i - 1].first) || !resident(o) || !on_device(o))
          fail(last.where, e.shared_at + 8 + 16 * i, "shared origin",
               who + ": " + to_text(o) + " (ascending origins of resident device pages)");
        if (b >= built.next_key_)
          fail(last.where, e.shared_at + 16 + 16 * i, "shared block",
               who + ": key " + to_text(b) + " is not issued yet");
      }
      auto& slot = built.entries_.emplace(sid, typename Mgr::entry{}).first->second;
      seq->mark_.owned = true;
      slot.seq = std::move(seq);
      slot.serial = ++built.openings_;
      slot.protected_origins.insert(e.protect.begin(), e.protect.end());
      for (const auto& [o, b] : e.shared) built.link(slot, o, b);
    }
    for (std::size_t i = 0; i < last.external.size(); ++i) {
      auto it = built.blocks_.find(last.external[i]);
      if (it == built.blocks_.end() || it->second.external)
        fail(last.where, last.external_at + 8 + 8 * i, "external block",
             to_text(last.external[i]) + " is held by no page, or listed twice");
      it->second.external = true;
    }
    if (const std::size_t hosted = built.host_pages(); hosted > target.config_.host_pool)
      raise_input(elements.back().where + ": " + to_text(hosted) +
                  " pages on the host tiers, more than the host pool (" + to_text(target.config_.host_pool) + ")");
    built.instance_ = target.instance_;  // the target keeps its instance: its checkpoints stay its own
    target = std::move(built);           // noexcept moves
  }

 private:
  // One sequence's entry in a parsed element: where its record is (a full record's sequence snapshot, or a clock
  // record's bytes), and for the last element its page flags.
  struct entry {
    std::uint64_t key = 0;
    snapshot::record_kind kind = snapshot::record_kind::full;
    std::span<const std::byte> record;
    std::size_t record_at = 0;
    std::vector<std::uint64_t> protect;
    std::size_t protected_at = 0;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> shared;
    std::size_t shared_at = 0;
  };
  struct element {
    std::string where;
    std::uint64_t id = 0;
    step_t now = 0;
    std::uint64_t next_key = 0;
    std::vector<entry> entries;  // ascending keys
    std::vector<std::uint64_t> external;
    std::size_t external_at = 0;
  };
  static const entry* find(const element& el, std::uint64_t key) noexcept {
    auto it = std::lower_bound(el.entries.begin(), el.entries.end(), key,
                               [](const entry& e, std::uint64_t k) { return e.key < k; });
    return it != el.entries.end() && it->key == key ? &*it : nullptr;
  }

  template <class Id>
  static std::uint64_t id_bits(Id id) noexcept {
    return static_cast<std::uint64_t>(to_bits(id));
  }
  static std::uint32_t header_crc(std::span<const std::byte> header_and_name) noexcept {
    return crc32c_extend(crc32c(header_and_name.first(52)), header_and_name.subspan(snapshot::manager_header_bytes));
  }
  [[noreturn]] static void fail(const std::string& where, std::size_t offset, const std::string& field,
                                const std::string& what) {
    raise_input(where + " " + field + " at offset " + to_text(offset) + ": " + what);
  }

  // The end of a clock record's policy fields (their heads say their sizes; the policy reads them in pass 2).
  static void skip_fields(snapshot_reader& r, std::uint32_t fields) {
    for (std::uint32_t f = 0; f < fields; ++f) {
      const auto name = r.get<std::uint8_t>("field name length");
      r.skip(name, "field name");
      (void)r.get<std::uint8_t>("field kind");
      const auto size = r.get<std::uint8_t>("element size");
      (void)r.get<std::uint8_t>("element kind");
      const auto count = r.get<std::uint64_t>("element count");
      if (size != 1 && size != 2 && size != 4 && size != 8) r.fail("element size", to_text(size) + " bytes");
      if (count > r.left() / size) r.fail("element count", to_text(count) + " elements cannot fit");
      r.skip(static_cast<std::size_t>(count * size), "elements");
    }
  }

  // Pass 1 for one element: everything that can be checked without building a sequence.
  template <class Mgr>
  static void parse(const Mgr& target, std::span<const std::byte> bytes, std::size_t k, bool is_last,
                    const element* previous, element& out) {
    using Seq = typename Mgr::sequence_type;
    using Id = typename Mgr::sequence_id;
    using Float = typename Seq::float_type;
    using P = typename Seq::policy_type;
    const std::string& where = out.where;
    const std::size_t target_page_size = target.page_size();
    const std::uint64_t previous_id = previous ? previous->id : 0;
    // --- the header ---
    if (bytes.size() < snapshot::manager_header_bytes)
      fail(where, 0, "header",
           "truncated (" + to_text(bytes.size()) + " bytes, the header alone is " +
               to_text(snapshot::manager_header_bytes) + ")");
    if (std::memcmp(bytes.data(), snapshot::manager_magic.data(), snapshot::manager_magic.size()) != 0)
      fail(where, 0, "magic",
           std::memcmp(bytes.data(), snapshot::magic.data(), snapshot::magic.size()) == 0
               ? "a sequence snapshot, not a manager's (load it with snapshot::load(sequence, bytes))"
               : "not a memdecay manager snapshot");
    snapshot_reader h(bytes, 0);
    (void)h.get<std::uint64_t>("magic");
    const auto version = h.get<std::uint32_t>("format version");
    const auto library = h.get<std::uint32_t>("library version");
    const auto float_bytes = h.get<std::uint8_t>("float type");
    const auto name_len = h.get<std::uint8_t>("policy name length");
    const auto kind = h.get<std::uint8_t>("kind");
    const auto reserved = h.get<std::uint8_t>("reserved");
    const auto page_size = h.get<std::uint32_t>("page size");
    const auto id = h.get<std::uint64_t>("snapshot id");
    const auto base_id = h.get<std::uint64_t>("base id");
    const auto payload_len = h.get<std::uint64_t>("payload length");
    const auto payload_crc = h.get<std::uint32_t>("payload checksum");
    const auto head_crc = h.get<std::uint32_t>("header checksum");
    const std::size_t payload_at = snapshot::manager_header_bytes + name_len;
    if (bytes.size() < payload_at) fail(where, snapshot::manager_header_bytes, "policy name", "truncated");
    if (header_crc(bytes.first(payload_at)) != head_crc)
      fail(where, 52, "header checksum", "the header is corrupted (CRC-32C mismatch)");
    if (!snapshot::readable_version(version))
      fail(where, 8, "format version",
           to_text(version) + "; this library (" + to_text(library_version_number()) + ") reads versions " +
               to_text(snapshot::oldest_readable_version) + " to " + to_text(snapshot::format_version) +
               " (written by library " + to_text(library) + ")");
    if (reserved != 0) fail(where, 19, "reserved field", to_text(reserved) + " (must be 0)");
    const std::string_view name(reinterpret_cast<const char*>(bytes.data() + snapshot::manager_header_bytes), name_len);
    if (name != P::name)
      fail(where, 56, "policy", "'" + std::string(name) + "', the target's is '" + std::string(P::name) + "'");
    if (float_bytes != float_code<Float>())
      fail(where, 16, "float type",
           to_text(8 * float_bytes) + "-bit, the target's is " + to_text(8 * sizeof(Float)) + "-bit");
    if (page_size != target_page_size)
      fail(where, 20, "page size", to_text(page_size) + ", the target's is " + to_text(target_page_size));
    if (kind > 1) fail(where, 18, "kind", to_text(kind) + " (0 full, 1 incremental)");
    if (k == 0 && kind != 0)
      fail(where, 18, "kind", "an incremental snapshot first (a chain starts with a full snapshot)");
    if (k > 0 && kind == 0)
      fail(where, 18, "kind", "a full snapshot after the first (load a chain from its last full snapshot)");
    if (kind == 1 && base_id != previous_id)
      fail(where, 32, "base id",
           "follows snapshot " + to_text(base_id) + ", but the previous one in the chain is " + to_text(previous_id) +
               " (a missing or reordered delta)");
    if (kind == 0 && base_id != 0) fail(where, 32, "base id", "a full snapshot must follow none (0)");
    if (bytes.size() - payload_at != payload_len)
      fail(where, 40, "payload length",
           to_text(payload_len) + " bytes, " + to_text(bytes.size() - payload_at) + " present (truncated or padded)");
    const auto body = bytes.subspan(payload_at);
    if (crc32c(body) != payload_crc) fail(where, 48, "payload checksum", "the payload is corrupted (CRC-32C mismatch)");

    out.id = id;

    // --- the manager ---
    snapshot_reader r(body, payload_at);
    const auto at = [&] { return r.offset(); };
    const auto high = r.get<std::uint64_t>("global high");
    const auto low = r.get<std::uint64_t>("global low");
    if (high != target.config_.global.high || low != target.config_.global.low)
      fail(where, payload_at, "global budget",
           "high " + to_text(high) + ", low " + to_text(low) + "; the target's is high " +
               to_text(target.config_.global.high) + ", low " + to_text(target.config_.global.low));
    out.now = r.get<step_t>("now");
    if (previous && out.now < previous->now)
      fail(where, at() - 4, "now", "step " + to_text(out.now) + " is before the previous snapshot's");
    out.next_key = r.get<std::uint64_t>("next key");
    if (out.next_key < (std::uint64_t{1} << 63)) fail(where, at() - 8, "next key", "below 2^63");
    const auto count = r.get<std::uint64_t>("sequence count");
    if (count > r.left() / 25) fail(where, at() - 8, "sequence count", to_text(count) + " sequences cannot fit");
    out.entries.reserve(static_cast<std::size_t>(count));
    for (std::uint64_t s = 0; s < count; ++s) {
      entry e;
      const std::size_t record_at = at();
      e.key = r.get<std::uint64_t>("sequence id");
      const Id sid = from_bits<Id>(static_cast<decltype(to_bits(Id{}))>(e.key));
      if (id_bits(sid) != e.key) fail(where, record_at, "sequence id", to_text(e.key) + " does not fit the id type");
      if (s > 0 && e.key <= out.entries.back().key) fail(where, record_at, "sequence id", "ids must ascend");
      const std::string who = "sequence " + to_text(sid);
      const auto record = r.get<std::uint8_t>("record kind");
      if (record > 3 || (kind == 0 && record != 0))
        fail(where, at() - 1, "record kind",
             who + ": " + to_text(record) +
                 (kind == 0 ? " in a full snapshot (only 0)" : " (0 full, 1 clock, 2 unchanged, 3 rebased)"));
      e.kind = static_cast<snapshot::record_kind>(record);
      if (e.kind != snapshot::record_kind::full && (!previous || !find(*previous, e.key)))
        fail(where, record_at, "record kind",
             who + " has a " +
                 (record == 2   ? "unchanged"
                  : record == 1 ? "clock"
                                : "rebased") +
                 " record, but the previous snapshot does not hold it");
      e.protected_at = at();
      const auto protected_count = r.get<std::uint64_t>("protected count");
      if (protected_count > r.left() / 8) fail(where, e.protected_at, "protected count", who + ": too many");
      if (is_last) {
        e.protect.resize(static_cast<std::size_t>(protected_count));
        for (auto& o : e.protect) o = r.get<std::uint64_t>("protected origin");
      } else {
        r.skip(static_cast<std::size_t>(protected_count * 8), "protected origins");
      }
      e.shared_at = at();
      const auto shared_count = r.get<std::uint64_t>("shared count");
      if (shared_count > r.left() / 16) fail(where, e.shared_at, "shared count", who + ": too many");
      if (is_last) {
        e.shared.resize(static_cast<std::size_t>(shared_count));
        for (auto& [o, b] : e.shared) {
          o = r.get<std::uint64_t>("shared origin");
          b = r.get<std::uint64_t>("shared block");
        }
      } else {
        r.skip(static_cast<std::size_t>(shared_count * 16), "shared pages");
      }
      if (e.kind == snapshot::record_kind::full) {
        const std::size_t length_at = at();
        const auto length = r.get<std::uint64_t>("record length");
        if (length > r.left())
          fail(where, length_at, "record length",
               who + ": " + to_text(length) + " bytes, " + to_text(r.left()) + " left");
        e.record_at = at();
        e.record = body.subspan(e.record_at - payload_at, static_cast<std::size_t>(length));
        r.skip(static_cast<std::size_t>(length), "record");
      } else if (e.kind != snapshot::record_kind::unchanged) {  // clock or rebased: the same layout
        e.record_at = at();
        (void)r.get<step_t>("sequence now");
        (void)r.get<std::uint64_t>("sequence generation");
        skip_fields(r, r.get<std::uint32_t>("field count"));
        e.record = body.subspan(e.record_at - payload_at, at() - e.record_at);
      }
      out.entries.push_back(std::move(e));
    }
    out.external_at = at();
    const auto externals = r.get<std::uint64_t>("external count");
    if (externals > r.left() / 8) fail(where, out.external_at, "external count", "too many");
    out.external.resize(static_cast<std::size_t>(externals));
    for (auto& b : out.external) b = r.get<std::uint64_t>("external block");
    if (r.left() != 0) fail(where, at(), "end", to_text(r.left()) + " bytes after the last field");
  }

  // The engine's config (and policy parameters) for sequence `id`, as a new unmanaged sequence.
  template <class Seq, class Id, class Configure>
  static std::unique_ptr<Seq> make_sequence(Id id, Configure& configure, std::size_t page_size,
                                            const std::string& where) {
    auto made = configure(id);
    config cfg;
    typename Seq::params_type params{};
    if constexpr (std::is_convertible_v<decltype(made), const config&>) {
      cfg = std::move(made);
    } else {
      cfg = std::move(made.first);
      params = std::move(made.second);
    }
    if (cfg.page_size != page_size)
      raise_config(where + ": sequence " + to_text(id) + " page_size = " + to_text(cfg.page_size) +
                   ", the manager's is " + to_text(page_size));
    return std::make_unique<Seq>(std::move(cfg), params);
  }
};

}  // namespace detail

namespace snapshot {

/// A full snapshot of `mgr`: every open sequence, its protections and shared pages, the clock.
template <class Sequence, std::integral SequenceId>
[[nodiscard]] std::vector<std::byte> save(const basic_manager<Sequence, SequenceId>& mgr) {
  return detail::manager_snapshot_access::save(mgr, nullptr);
}

/// A snapshot of `mgr` against `since`: full while `since` is empty, else incremental (only the sequences that
/// changed since the last save with `since`; the others as clock or unchanged records). Updates `since` (only on
/// success). usage_error if `since` holds another manager's last snapshot.
template <class Sequence, std::integral SequenceId>
[[nodiscard]] std::vector<std::byte> save(const basic_manager<Sequence, SequenceId>& mgr, checkpoint& since) {
  return detail::manager_snapshot_access::save(mgr, &since);
}

/// save(mgr, since) into `out` (overwritten; its capacity reused, so that a periodic checkpoint touches no fresh
/// memory). On error `out` is left empty.
template <class Sequence, std::integral SequenceId>
void save(const basic_manager<Sequence, SequenceId>& mgr, checkpoint& since, std::vector<std::byte>& out) {
  out = detail::manager_snapshot_access::save(mgr, &since, std::move(out));
}

/// Replaces the contents of `target` with the state a chain of snapshots holds: a full snapshot, then the
/// incremental ones saved after it, in order. `configure(id)` gives sequence `id`'s config, or a
/// std::pair<config, params_type> with its policy parameters; each is checked against the snapshot.
/// input_error naming the element, the field and the byte offset for a truncated, corrupted, reordered,
/// wrong-version, wrong-policy, wrong-config, wrong-page-size or wrong-budget chain; config_error for a config
/// `configure` returns that is invalid. Nothing changes when it throws.
template <class Sequence, std::integral SequenceId, class Chain, class Configure>
requires std::ranges::forward_range<Chain> &&
    std::convertible_to<std::ranges::range_reference_t<Chain>, std::span<const std::byte>> &&
    std::invocable<Configure&, SequenceId>
void load(basic_manager<Sequence, SequenceId>& target, const Chain& chain, Configure&& configure) {
  std::vector<std::span<const std::byte>> spans;
  for (const auto& element : chain) spans.push_back(std::span<const std::byte>(element));
  detail::manager_snapshot_access::load(target, std::span<const std::span<const std::byte>>(spans), configure);
}

/// load() from one full snapshot.
template <class Sequence, std::integral SequenceId, class Configure>
requires std::invocable<Configure&, SequenceId>
void load(basic_manager<Sequence, SequenceId>& target, std::span<const std::byte> bytes, Configure&& configure) {
  const std::span<const std::byte> one[] = {bytes};
  detail::manager_snapshot_access::load(target, std::span<const std::span<const std::byte>>(one), configure);
}

/// load() from one full snapshot, every sequence with the same config and policy parameters.
template <class Sequence, std::integral SequenceId>
void load(basic_manager<Sequence, SequenceId>& target, std::span<const std::byte> bytes, const config& cfg,
          const typename Sequence::params_type& params = {}) {
  load(target, bytes, [&](SequenceId) { return std::pair<config, typename Sequence::params_type>(cfg, params); });
}

/// load() where every sequence has the same config and policy parameters.
template <class Sequence, std::integral SequenceId, class Chain>
requires std::ranges::forward_range<Chain> &&
    std::convertible_to<std::ranges::range_reference_t<Chain>, std::span<const std::byte>>
void load(basic_manager<Sequence, SequenceId>& target, const Chain& chain, const config& cfg,
          const typename Sequence::params_type& params = {}) {
  load(target, chain, [&](SequenceId) { return std::pair<config, typename Sequence::params_type>(cfg, params); });
}

}  // namespace snapshot

}  // namespace memdecay

#endif  // MEMDECAY_IO_MANAGER_SNAPSHOT_HPP
