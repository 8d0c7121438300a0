// SPDX-License-Identifier: Apache-2.0
// The fuzzer's model of the host tier (docs/tiers.md, tiers/host_tier.hpp), a naive restatement beside model.hpp's
// residency columns (model_sequence::tier: the tier and the last recall of every held page; its origin is its first
// token's position / P). The checks are those of tests/conformance/tier_conformance_test.cpp's scalar model, stated
// once for the fuzzer:
//   * demotion: the victims are the device's k lowest evictable pages (model_sequence::select_with, unchanged); of
//     the host pool (host pages + the victims the region rule admits) the lowest (score, page) beyond the host
//     budget are dropped, the rest of the admitted victims demoted;
//   * recall: host pages with a digest, best bound first (ties to the lower page), each while it beats the weakest
//     evictable device page with a digest still kept by more than the hysteresis, into room under the device
//     budget's high watermark first, then by displacing that page (demoted if the region rule admits it, else
//     dropped), at most max_recall_pages;
//   * commit_recall's acceptance rule, the device page table's insertions and removals (block_pool: fresh blocks
//     from the end of the free list, freed blocks pushed in page order), and a host_block_store's slots.
#ifndef MEMDECAY_FUZZ_TIER_MODEL_HPP
#define MEMDECAY_FUZZ_TIER_MODEL_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "model.hpp"

namespace memdecay_fuzz {

/// host_tier_config::validate: a known unit, a finite non-negative high watermark (any unit: a fraction of a page or
/// a ratio above 1 is fine, in_tokens floors and saturates), a finite min_host_priority, a finite non-negative
/// hysteresis, at least one promotion per plan.
inline bool model_tier_config_valid(const model_tier_config& c) {
  if (c.unit != model_budget_unit::unlimited && !(std::isfinite(c.high) && c.high >= 0.0)) return false;
  if (!std::isfinite(c.min_host_priority)) return false;
  if (!(std::isfinite(c.hysteresis) && c.hysteresis >= 0.0)) return false;
  return c.max_recall_pages != 0;
}

/// The host tier's capacity in pages: its high watermark in tokens (saturating, as the device budget's) / P.
inline std::size_t model_host_capacity(const model_tier_config& c, std::size_t P, std::uint64_t logical_len) {
  std::uint64_t tokens = std::numeric_limits<std::uint64_t>::max();
  switch (c.unit) {
    case model_budget_unit::unlimited: break;
    case model_budget_unit::tokens: tokens = floor_tokens_saturating(c.high); break;
    case model_budget_unit::pages: tokens = mul_saturating(floor_tokens_saturating(c.high), P); break;
    case model_budget_unit::ratio: tokens = floor_tokens_saturating(c.high * static_cast<double>(logical_len)); break;
  }
  return static_cast<std::size_t>(tokens / P);
}

/// The region rule: a page may go to host when one of its tokens' regions has base priority >= min_host_priority.
template <class Float>
bool model_worthy(const model_sequence<Float>& m, std::size_t p) {
  for (std::size_t i = m.page_begin(p); i < m.page_begin(p) + m.page_count(p); ++i)
    if (m.regions[m.tokens[i].region].base >= m.tier->cfg.min_host_priority) return true;
  return false;
}

/// Which victims go to host and which host pages are dropped for them, on the given page scores.
struct model_demotion {
  std::vector<std::size_t> demoted, host_dropped;
};
template <class Float>
model_demotion model_split(const model_sequence<Float>& m, const std::vector<std::size_t>& victims,
                           const std::vector<Float>& scores) {
  model_demotion out;
  if (!m.tier) return out;
  std::vector<std::pair<Float, std::size_t>> pool;
  for (std::size_t p = 0; p < m.num_pages(); ++p)
    if (m.on_host(p)) pool.emplace_back(scores[p], p);
  for (std::size_t v : victims)
    if (model_worthy(m, v)) pool.emplace_back(scores[v], v);
  std::sort(pool.begin(), pool.end(), [](const auto& a, const auto& b) {
    return a.first < b.first || (a.first == b.first && a.second < b.second);
  });
  const std::size_t capacity = model_host_capacity(m.tier->cfg, m.P, m.logical_len);
  const std::size_t cut = pool.size() > capacity ? pool.size() - capacity : 0;
  for (std::size_t i = 0; i < pool.size(); ++i) {
    const std::size_t p = pool[i].second;
    const bool stays = i >= cut;
    if (m.on_host(p) && !stays) out.host_dropped.push_back(p);
    if (!m.on_host(p) && stays) out.demoted.push_back(p);
  }
  std::sort(out.demoted.begin(), out.demoted.end());
  std::sort(out.host_dropped.begin(), out.host_dropped.end());
  return out;
}

/// A recall decision as the model makes it (indices are held pages, each list ascending).
struct model_recall {
  std::vector<std::size_t> promote, demote, drop;
  std::vector<float> promote_bounds;
};
/// `best`: each held page's best query-head bound (the library's query_page_bounds, maxed over heads as
/// std::max does: a NaN head never wins); `has_digest`: which pages have one (pages without are left out).
template <class Float>
model_recall model_select_recall(const model_sequence<Float>& m, const std::vector<float>& best,
                                 const std::vector<bool>& has_digest, const std::vector<std::size_t>& prot,
                                 const std::vector<Float>& scores) {
  model_recall out;
  auto status = m.statuses(prot);
  if (const std::size_t k = m.tier->cfg.displace_lowest; k != 0) {  // the rest of the evictable pages stay
    const auto lowest = m.select_with(scores, k, prot).pages;
    for (std::size_t p = 0; p < status.size(); ++p)
      if (status[p] == model_status::evictable && !std::binary_search(lowest.begin(), lowest.end(), p))
        status[p] = model_status::protected_;
  }
  std::vector<std::pair<float, std::size_t>> host, device;
  for (std::size_t p = 0; p < m.num_pages(); ++p) {
    if (!has_digest[p] || std::isnan(best[p])) continue;
    if (status[p] == model_status::host) host.emplace_back(best[p], p);
    if (status[p] == model_status::evictable) device.emplace_back(best[p], p);
  }
  std::sort(host.begin(), host.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  std::sort(device.begin(), device.end(), [](const auto& a, const auto& b) {
    return a.first < b.first || (a.first == b.first && a.second < b.second);
  });
  const std::uint64_t high = m.watermarks().first;
  std::uint64_t room = high > m.device_len() ? (high - m.device_len()) / m.P : 0;
  std::size_t next = 0;
  std::vector<std::pair<std::size_t, float>> promoted;
  for (const auto& [bound, h] : host) {
    if (promoted.size() == m.tier->cfg.max_recall_pages) break;
    const bool has_weakest = next < device.size();
    if (has_weakest && !(static_cast<double>(bound) > static_cast<double>(device[next].first) + m.tier->cfg.hysteresis))
      break;
    if (room > 0) {
      --room;
    } else {
      if (!has_weakest) break;
      const std::size_t d = device[next++].second;
      (model_worthy(m, d) ? out.demote : out.drop).push_back(d);
    }
    promoted.emplace_back(h, bound);
  }
  std::sort(promoted.begin(), promoted.end());
  for (const auto& [p, b] : promoted) out.promote.push_back(p), out.promote_bounds.push_back(b);
  std::sort(out.demote.begin(), out.demote.end());
  std::sort(out.drop.begin(), out.drop.end());
  return out;
}

/// commit_recall's acceptance rule (docs/tiers.md, "Errors"): usage_error without a tier, for a stale plan or another
/// page size, bounds not aligned with the promotions, lists that are not strictly ascending, a promotion of a device
/// page, a displaced page that may not leave the device (not evictable now: pinned, protected, partial, host,
/// recalled, or named twice), or a plan that leaves more on the host than its budget; input_error for a promoted
/// page that does not exist.
template <class Float>
outcome model_check_recall(const model_sequence<Float>& m, std::uint64_t generation, std::size_t page_size,
                           const model_recall& plan) {
  if (!m.tier) return outcome::usage_error;
  if (generation != m.generation || page_size != m.P) return outcome::usage_error;
  if (plan.promote_bounds.size() != plan.promote.size()) return outcome::usage_error;
  auto ascending = [](const std::vector<std::size_t>& v) {
    for (std::size_t k = 1; k < v.size(); ++k)
      if (v[k] <= v[k - 1]) return false;
    return true;
  };
  if (!ascending(plan.promote) || !ascending(plan.demote) || !ascending(plan.drop)) return outcome::usage_error;
  for (std::size_t p : plan.promote) {
    if (p >= m.num_pages()) return outcome::input_error;
    if (!m.on_host(p)) return outcome::usage_error;
  }
  std::vector<std::size_t> leaving;
  std::merge(plan.demote.begin(), plan.demote.end(), plan.drop.begin(), plan.drop.end(), std::back_inserter(leaving));
  if (!ascending(leaving)) return outcome::usage_error;  // a page both demoted and dropped
  const auto status = m.statuses({});
  for (std::size_t p : leaving)
    if (p >= m.num_pages() || m.page_count(p) != m.P || status[p] != model_status::evictable)
      return outcome::usage_error;
  const std::size_t capacity = model_host_capacity(m.tier->cfg, m.P, m.logical_len);
  if (m.host_pages() - plan.promote.size() + plan.demote.size() > capacity) return outcome::usage_error;
  return outcome::ok;
}

/// A checked recall: promoted pages return to the device (recalled now), demoted ones go to host, dropped ones
/// leave. A plan that moves nothing changes nothing; otherwise the residency change and the removal are each a new
/// generation.
template <class Float>
void model_apply_recall(model_sequence<Float>& m, const model_recall& plan) {
  if (plan.promote.empty() && plan.demote.empty() && plan.drop.empty()) return;
  for (std::size_t p : plan.promote) m.tier->on_host[p] = 0, m.tier->recalled_at[p] = m.now;
  for (std::size_t p : plan.demote) m.tier->on_host[p] = 1, m.tier->recalled_at[p] = model_tier::never;
  ++m.generation;
  m.remove(plan.drop);
}

/// A host_block_store's bookkeeping: (origin) -> slot for sequence 0, and the free list (the last freed taken
/// first; slot 0 first on a fresh store).
struct model_store {
  std::map<std::uint64_t, std::size_t> slots;
  std::vector<std::size_t> free;
  void init(std::size_t capacity) {
    slots.clear();
    free.clear();
    for (std::size_t s = capacity; s-- > 0;) free.push_back(s);
  }
  bool holds(std::uint64_t origin) const { return slots.count(origin) != 0; }
  /// copy_to_host of every origin, or the outcome the library turns a refusal into: usage_error (the store's own)
  /// for a page it already holds, input_error for a short count (too few free slots), both changing nothing.
  outcome check_to_host(const std::vector<std::uint64_t>& origins) const {
    for (std::uint64_t o : origins)
      if (holds(o)) return outcome::usage_error;
    return origins.size() > free.size() ? outcome::input_error : outcome::ok;
  }
  void to_host(const std::vector<std::uint64_t>& origins) {
    for (std::uint64_t o : origins) {
      slots.emplace(o, free.back());
      free.pop_back();
    }
  }
  /// copy_to_device needs every page's host copy (usage_error from the store otherwise).
  outcome check_to_device(const std::vector<std::uint64_t>& origins) const {
    for (std::uint64_t o : origins)
      if (!holds(o)) return outcome::usage_error;
    return outcome::ok;
  }
  void release(const std::vector<std::uint64_t>& origins) {
    for (auto it = origins.rbegin(); it != origins.rend(); ++it) {
      const auto found = slots.find(*it);
      if (found == slots.end()) continue;
      free.push_back(found->second);
      slots.erase(found);
    }
  }
};

}  // namespace memdecay_fuzz

#endif  // MEMDECAY_FUZZ_TIER_MODEL_HPP
