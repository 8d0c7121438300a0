// SPDX-License-Identifier: Apache-2.0
// Fault injection for host stores (tiers/host_store.hpp): faulty_store<Store> forwards every call to a real store
// and counts it on a fault_schedule (faulty_table.hpp), usually the one its page table counts on, so that a sweep
// fails each call of a commit in turn. Armed at a copy, it fails before the copy reaches the store:
//   engine_error, out_of_memory, refusal   throw (a failed transfer, no pinned memory, a store that says no)
//   short_report                           copies all pages but the last and reports that many: a partial copy
//                                          (with one page, an error return: 0 copied)
// release() is counted and never fails: it is the undo the library relies on (noexcept in the concept).
#ifndef MEMDECAY_TESTS_SUPPORT_FAULTY_STORE_HPP
#define MEMDECAY_TESTS_SUPPORT_FAULTY_STORE_HPP

#include <cstddef>
#include <cstdint>
#include <span>

#include "support/faulty_table.hpp"

namespace fault_injection {

template <class Store>
class faulty_store {
 public:
  using sequence_id = typename Store::sequence_id;
  using device_block = typename Store::device_block;

  faulty_store(Store& inner, fault_schedule& schedule) : inner_(inner), schedule_(schedule) {}

  std::size_t copy_to_host(const sequence_id& seq, std::span<const std::uint64_t> origins,
                           std::span<const device_block> blocks) {
    if (schedule_.hit("copy_to_host", !origins.empty()))
      return inner_.copy_to_host(seq, origins.first(origins.size() - 1), blocks.first(blocks.size() - 1));
    return inner_.copy_to_host(seq, origins, blocks);
  }
  std::size_t copy_to_device(const sequence_id& seq, std::span<const std::uint64_t> origins,
                             std::span<const device_block> blocks) {
    if (schedule_.hit("copy_to_device", !origins.empty()))
      return inner_.copy_to_device(seq, origins.first(origins.size() - 1), blocks.first(blocks.size() - 1));
    return inner_.copy_to_device(seq, origins, blocks);
  }
  void release(const sequence_id& seq, std::span<const std::uint64_t> origins) noexcept {
    schedule_.pass("release");
    inner_.release(seq, origins);
  }

 private:
  Store& inner_;
  fault_schedule& schedule_;
};

}  // namespace fault_injection

#endif  // MEMDECAY_TESTS_SUPPORT_FAULTY_STORE_HPP
