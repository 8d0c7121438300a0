// SPDX-License-Identifier: Apache-2.0
// A stand-in for an engine's KV memory in the host-store tests: device blocks and host slots hold ints (a page's
// K/V stands for its origin), and int_copier is the copy callable of a tiers::host_block_store over them; fail_at
// makes the n-th copy (counting from 0) throw, as a failed DMA would.
#ifndef MEMDECAY_TESTS_SUPPORT_INT_MEMORY_HPP
#define MEMDECAY_TESTS_SUPPORT_INT_MEMORY_HPP

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include <memdecay/tiers/host_store.hpp>

namespace test_memory {

struct int_memory {
  std::vector<int> device, host;
  int copies = 0, fail_at = -1;
  int_memory(std::size_t device_blocks, std::size_t host_slots, int fill)
      : device(device_blocks, fill), host(host_slots, fill) {}
};

struct int_copier {
  int_memory* m;
  void operator()(memdecay::copy_direction dir, const std::int32_t& block, std::size_t slot) const {
    if (m->copies++ == m->fail_at) throw std::runtime_error("injected: DMA failed");
    auto& d = m->device[static_cast<std::size_t>(block)];
    auto& h = m->host[slot];
    (dir == memdecay::copy_direction::to_host ? h : d) = dir == memdecay::copy_direction::to_host ? d : h;
  }
};

/// A host store of int slots, keyed by 64-bit sequence ids, over int32 device blocks.
using int_store = memdecay::host_block_store<std::uint64_t, std::int32_t, int_copier>;

}  // namespace test_memory

#endif  // MEMDECAY_TESTS_SUPPORT_INT_MEMORY_HPP
