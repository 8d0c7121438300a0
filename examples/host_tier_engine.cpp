// A small engine with a host tier (tiers/host_tier.hpp): real K and V arrays per page on the "device" (a vector of
// pages in device order, as a block table reads them) and in a "host" store keyed by the page's original index.
// Each step the agent appends a segment, the engine digests every page that filled, attends with the step's query
// over the device pages, feeds the mass back, and then carries out the demotion plan (copy to host, drop the rest)
// and the recall plan (copy back to its place, displace, drop). After every plan it checks that
//   * the device pages, in device order, are exactly the sequence's device pages, each with the K/V of its
//     original position (a recalled page is back where it was, its RoPE keys untouched);
//   * the host store holds exactly the sequence's host pages;
// and it counts the pages copied each way. The program returns 1 if any check fails.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <vector>

#include <memdecay/core/sequence.hpp>
#include <memdecay/tiers/host_tier.hpp>

namespace {

namespace md = memdecay;

constexpr std::size_t P = 8;    // tokens per page
constexpr std::size_t dim = 4;  // head dimension (one KV head, one query head)
using vec = std::vector<float>;

struct page_kv {
  std::uint64_t origin;
  vec keys, values;  // P x dim each
};

// The key and value of absolute position `pos`: a pure function, so the checks can rebuild any token.
float key_at(std::uint64_t pos, std::size_t j) {
  return std::sin(0.61f * static_cast<float>(pos * (j + 1)) + 0.3f * j);
}
float value_at(std::uint64_t pos, std::size_t j) { return std::cos(0.17f * static_cast<float>(pos + 3 * j)); }

page_kv make_page(std::uint64_t origin) {
  page_kv p{origin, vec(P * dim), vec(P * dim)};
  for (std::size_t t = 0; t < P; ++t)
    for (std::size_t j = 0; j < dim; ++j) {
      p.keys[t * dim + j] = key_at(origin * P + t, j);
      p.values[t * dim + j] = value_at(origin * P + t, j);
    }
  return p;
}

}  // namespace

int main() {
  md::sequence seq(
      md::config{.page_size = P, .protection = {.recent_tokens = P}, .budget = md::budget_config::pages(6, 5)});
  seq.enable_digests({.kv_heads = 1, .head_dim = dim});
  seq.enable_host_tier({.host_budget = md::budget_config::pages(6),
                        .min_host_priority = 0.5,  // scratchpad and tool_out pages are dropped
                        .hysteresis = 0.1,
                        .min_device_steps = 2});
  std::vector<page_kv> device;            // device order
  std::map<std::uint64_t, page_kv> host;  // by original page
  std::size_t to_host = 0, to_device = 0, failures = 0;
  auto check = [&](const char* when, int step) {
    const auto origins = seq.state().page_origins();
    std::size_t d = 0;
    for (std::size_t p = 0; p < seq.num_pages(); ++p) {
      if (seq.residency(p) == md::page_residency::host) {
        if (!host.count(origins[p])) ++failures, std::printf("step %d %s: host page %zu missing\n", step, when, p);
        continue;
      }
      const page_kv expected = make_page(origins[p]);
      const std::size_t n = seq.state().tokens_in_page(p) * dim;
      if (d >= device.size() || device[d].origin != origins[p] ||
          !std::equal(expected.keys.begin(), expected.keys.begin() + n, device[d].keys.begin()))
        ++failures, std::printf("step %d %s: device page %zu is not its original K/V\n", step, when, d);
      ++d;
    }
    if (d != device.size() || host.size() != seq.host_pages())
      ++failures, std::printf("step %d %s: %zu device, %zu host pages held\n", step, when, device.size(), host.size());
  };

  const md::region_id script[] = {md::regions::user,      md::regions::tool_in,    md::regions::tool_out,
                                  md::regions::retrieval, md::regions::scratchpad, md::regions::tool_out};
  for (int step = 1; step <= 30; ++step) {
    // The agent writes one page; the engine stores its K/V and, the page being full, its digest.
    seq.append(step == 1 ? md::regions::system : script[step % 6], P);
    device.push_back(make_page(seq.logical_len() / P - 1));
    seq.set_page_keys(seq.num_pages() - 1, device.back().keys);
    seq.advance_to(static_cast<md::step_t>(step));

    // The query: every fourth step asks about the document retrieved at step 3 (original page 2), otherwise about
    // the page just written.
    vec q(dim);
    const std::uint64_t asked = step % 4 == 0 ? 2 * P + 2 : static_cast<std::uint64_t>(step - 1) * P;
    for (std::size_t j = 0; j < dim; ++j) q[j] = 3.0f * key_at(asked, j);

    // Attention over the device pages, in device order: the mass the sequence observes.
    vec logits;
    for (const page_kv& pg : device)
      for (std::size_t t = 0; t < P; ++t) {
        float s = 0;
        for (std::size_t j = 0; j < dim; ++j) s += q[j] * pg.keys[t * dim + j];
        logits.push_back(s / std::sqrt(static_cast<float>(dim)));
      }
    const float top = *std::max_element(logits.begin(), logits.end());
    float sum = 0;
    for (float& l : logits) sum += (l = std::exp(l - top));
    for (float& l : logits) l /= sum;
    seq.observe_tokens(logits);

    // Demotion: copy plan.demoted to host, drop the other victims and plan.host_dropped.
    const auto plan = seq.select_for_budget();
    for (std::size_t p : plan.host_dropped) host.erase(seq.state().page_origins()[p]);
    std::vector<page_kv> kept;
    for (std::size_t p = 0, d = 0; p < seq.num_pages(); ++p) {
      if (seq.residency(p) == md::page_residency::host) continue;
      const bool leaves = std::binary_search(plan.pages.begin(), plan.pages.end(), p);
      if (!leaves)
        kept.push_back(device[d]);
      else if (std::binary_search(plan.demoted.begin(), plan.demoted.end(), p))
        host.emplace(device[d].origin, device[d]), ++to_host;
      ++d;
    }
    seq.commit(plan);
    device = std::move(kept);
    check("after demotion", step);

    // Recall with the same query: promoted pages go back to their place in device order.
    const auto recall = seq.select_recall(q);
    const auto origins = seq.state().page_origins();
    std::vector<page_kv> next;
    for (std::size_t p = 0, d = 0; p < seq.num_pages(); ++p) {
      const bool on_host = seq.residency(p) == md::page_residency::host;
      if (std::binary_search(recall.promote.begin(), recall.promote.end(), p)) {
        next.push_back(host.at(origins[p]));
        host.erase(origins[p]);
        ++to_device;
      } else if (!on_host) {
        if (std::binary_search(recall.demote.begin(), recall.demote.end(), p))
          host.emplace(device[d].origin, device[d]), ++to_host;
        else if (!std::binary_search(recall.drop.begin(), recall.drop.end(), p))
          next.push_back(device[d]);
        ++d;
      }
    }
    seq.commit_recall(recall);
    device = std::move(next);
    check("after recall", step);
    if (!recall.empty())
      std::printf("step %2d: recalled %zu page(s) (first: original page %llu), displaced %zu\n", step,
                  recall.promote.size(), static_cast<unsigned long long>(origins[recall.promote.front()]),
                  recall.demote.size() + recall.drop.size());
  }
  std::printf("%zu pages copied to host, %zu back to the device; %zu dropped; %zu device and %zu host pages held\n",
              to_host, to_device, static_cast<std::size_t>(seq.evicted_tokens() / P), seq.device_pages(),
              seq.host_pages());
  if (failures) return 1;
  std::printf("OK: every demoted page came back to its place with its original K/V\n");
  return 0;
}
