// SPDX-License-Identifier: Apache-2.0
// memdecay: where demoted pages' K/V live. A host tier (tiers/host_tier.hpp) decides which pages go to host memory
// and which come back; a host store is the engine's memory for them. Passed to basic_sequence::commit(plan, table,
// seq, store) and commit_recall(plan, table, seq, store), it lets the library order the copies and the page-table
// changes of one commit so that a failure anywhere leaves the sequence, the table and the store as they were.
//
// A store keys pages by (sequence, origin): a page's original index in its sequence (sequence_state::
// page_origins), which never changes while the page is held, on the device or on the host, whatever leaves
// before it. Three calls:
//   copy_to_host(seq, origins, device_blocks)    stores the K/V of the device blocks as those pages' host copies;
//   copy_to_device(seq, origins, device_blocks)  copies those pages' host copies into the device blocks (the host
//                                                copies stay until released);
//   release(seq, origins)                        frees the host copies (noexcept: it is also the undo of a copy).
// A copy returns how many pages it copied, a prefix of the list: all of them, or fewer when it could not go on
// (out of host memory, a failed transfer). It may also throw, and then it has stored nothing (a copy_to_device
// that throws may have written part of the device blocks, which the library treats as garbage). A short count or
// an exception makes the library undo what the commit had done so far and raise (docs/tiers.md, "Host store").
//
// host_block_store is a store over a fixed number of host slots, with the engine's copy function moving the bytes
// (cudaMemcpyAsync into pinned memory, say): the bookkeeping an engine would otherwise write itself.
#ifndef MEMDECAY_TIERS_HOST_STORE_HPP
#define MEMDECAY_TIERS_HOST_STORE_HPP

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "memdecay/detail/error.hpp"

namespace memdecay {

/// The engine's host memory for one kind of device block (see the top of this header).
template <class S, class SequenceId, class DeviceBlock>
concept host_store = requires(S& store, const SequenceId& seq, std::span<const std::uint64_t> origins,
                              std::span<const DeviceBlock> blocks) {
  { store.copy_to_host(seq, origins, blocks) } -> std::convertible_to<std::size_t>;
  { store.copy_to_device(seq, origins, blocks) } -> std::convertible_to<std::size_t>;
  { store.release(seq, origins) }
  noexcept;
};

/// Which way a host_block_store's copy function moves a page.
enum class copy_direction : std::uint8_t { to_host, to_device };

/// A host_store over `capacity` host slots. `Copy` is called as copy(direction, device_block, host_slot) for one
/// page and moves its K/V; it throws on failure. copy_to_host takes a free slot per page (the last freed first)
/// and returns a short count when the slots run out; a copy that throws releases the slots of the pages copied
/// before it and rethrows, so a throwing call stores nothing.
template <class SequenceId, class DeviceBlock, class Copy>
requires std::invocable<Copy&, copy_direction, const DeviceBlock&, std::size_t>
class host_block_store {
 public:
  using sequence_id = SequenceId;
  using device_block = DeviceBlock;

  host_block_store(std::size_t capacity, Copy copy) : copy_(std::move(copy)), capacity_(capacity) {
    free_.reserve(capacity);
    for (std::size_t s = capacity; s-- > 0;) free_.push_back(s);  // slot 0 is taken first
  }

  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t free_slots() const noexcept { return free_.size(); }
  [[nodiscard]] std::size_t used_slots() const noexcept { return slots_.size(); }
  /// The free slots, the next one to be taken last.
  [[nodiscard]] std::span<const std::size_t> free_list() const noexcept { return free_; }
  /// The host slot holding page `origin` of `seq`, if the store holds it.
  [[nodiscard]] std::optional<std::size_t> slot_of(const SequenceId& seq, std::uint64_t origin) const {
    const auto it = slots_.find({seq, origin});
    return it == slots_.end() ? std::nullopt : std::optional<std::size_t>(it->second);
  }
  /// Every (sequence, origin) -> slot entry, ordered.
  [[nodiscard]] const std::map<std::pair<SequenceId, std::uint64_t>, std::size_t>& entries() const noexcept {
    return slots_;
  }

  /// Stores the pages' K/V; returns how many (a prefix) fit in the free slots. usage_error, storing nothing, for
  /// lists of different lengths or a page the store already holds.
  std::size_t copy_to_host(const SequenceId& seq, std::span<const std::uint64_t> origins,
                           std::span<const DeviceBlock> blocks) {
    check_lengths(origins.size(), blocks.size(), "copy_to_host");
    for (std::uint64_t o : origins)
      if (slots_.count({seq, o}))
        detail::raise_usage("host store: copy_to_host: page " + detail::to_text(o) + " is already on the host");
    std::size_t done = 0;
#if MEMDECAY_HAS_EXCEPTIONS
    try {
#endif
      for (; done < origins.size() && !free_.empty(); ++done) {
        const std::size_t slot = free_.back();
        copy_(copy_direction::to_host, blocks[done], slot);
        slots_.emplace(std::pair<SequenceId, std::uint64_t>(seq, origins[done]), slot);  // may throw bad_alloc
        free_.pop_back();
      }
#if MEMDECAY_HAS_EXCEPTIONS
    } catch (...) {
      release(seq, origins.first(done));
      throw;
    }
#endif
    return done;
  }
  /// Copies the pages' host copies into the device blocks; returns origins.size(). usage_error, copying nothing,
  /// for lists of different lengths or a page the store does not hold.
  std::size_t copy_to_device(const SequenceId& seq, std::span<const std::uint64_t> origins,
                             std::span<const DeviceBlock> blocks) {
    check_lengths(origins.size(), blocks.size(), "copy_to_device");
    std::vector<std::size_t> from;
    from.reserve(origins.size());
    for (std::uint64_t o : origins) {
      const auto slot = slot_of(seq, o);
      if (!slot) detail::raise_usage("host store: copy_to_device: page " + detail::to_text(o) + " is not on the host");
      from.push_back(*slot);
    }
    for (std::size_t k = 0; k < origins.size(); ++k) copy_(copy_direction::to_device, blocks[k], from[k]);
    return origins.size();
  }
  /// Frees the pages' slots (pages the store does not hold are skipped). The slots return in reverse, so that
  /// releasing what one copy_to_host took leaves the free list exactly as it was.
  void release(const SequenceId& seq, std::span<const std::uint64_t> origins) noexcept {
    for (auto it = origins.rbegin(); it != origins.rend(); ++it) {
      const auto found = slots_.find({seq, *it});
      if (found == slots_.end()) continue;
      free_.push_back(found->second);  // within the capacity reserved at construction
      slots_.erase(found);
    }
  }
  /// Frees every slot of `seq` (the sequence finished or was dropped).
  void close(const SequenceId& seq) noexcept {
    for (auto it = slots_.begin(); it != slots_.end();) {
      if (it->first.first == seq) {
        free_.push_back(it->second);
        it = slots_.erase(it);
      } else {
        ++it;
      }
    }
  }

 private:
  static void check_lengths(std::size_t origins, std::size_t blocks, const char* call) {
    if (origins != blocks)
      detail::raise_usage(std::string("host store: ") + call + ": " + detail::to_text(origins) + " origins, " +
                          detail::to_text(blocks) + " blocks");
  }

  Copy copy_;
  std::size_t capacity_;
  std::vector<std::size_t> free_;
  std::map<std::pair<SequenceId, std::uint64_t>, std::size_t> slots_;
};

}  // namespace memdecay

#endif  // MEMDECAY_TIERS_HOST_STORE_HPP
