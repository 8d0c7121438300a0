// SPDX-License-Identifier: Apache-2.0
// The fuzzer's scalar model of memdecay's semantics: a deliberately naive re-statement of the documented rules,
// sharing no code with the library beyond the public value types it compares against.
//
//   * a token is a plain struct {region, absolute position, last refresh, EWMA}; a sequence is a vector of them;
//   * score   s = b * exp(-lambda * (now - last_refresh)) + alpha * a, in the sequence's Float, page = mean;
//   * status  pinned > sink > recent > partial > caller-protected > evictable (the documented order);
//   * victims sort every eligible (score, page) pair and take the first k;
//   * budget  watermarks computed with exact saturating arithmetic (no float-to-integer casts);
//   * errors  which calls the documentation says must be rejected, and with which error tier.
// Page scores are compared bit for bit, so the arithmetic here follows the formula term by term in the same
// Float (std::exp of Float, tokens summed in page order, divided by the token count).
#ifndef MEMDECAY_FUZZ_MODEL_HPP
#define MEMDECAY_FUZZ_MODEL_HPP

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace memdecay_fuzz {

/// What the documentation says a call must do.
enum class outcome { ok, config_error, input_error, usage_error };

inline const char* name(outcome o) {
  switch (o) {
    case outcome::ok: return "ok";
    case outcome::config_error: return "config_error";
    case outcome::input_error: return "input_error";
    case outcome::usage_error: return "usage_error";
  }
  return "?";
}

/// The model's own copy of a region's parameters and of a config (plain numbers; validated by model_config_check).
struct model_region {
  std::string name;
  double base = 1.0;
  double rate = 0.0;
  bool pinned = false;
};

struct model_override {
  std::string region;
  std::optional<double> base, rate, half_life;
  std::optional<bool> pinned;
};

enum class model_budget_unit { unlimited, tokens, pages, ratio };

struct model_config {
  double alpha = 1.0, beta = 0.9, tau = 0.01;
  std::optional<double> half_life;
  std::size_t page_size = 16;
  int normalization =
      0;  // 0 none, 1 uniform (the modes the model scores; 2 and 3 are valid, never drawn), else invalid
  std::size_t sink_pages = 0, recent_tokens = 0;
  model_budget_unit unit = model_budget_unit::unlimited;
  double high = 0.0;
  std::optional<double> low;
  std::vector<model_region> regions;
  std::vector<model_override> overrides;
  std::size_t fixed_page_size = 0;  // the sequence type's compile-time page size, 0 for dynamic
  bool float_scores = false;        // the sequence scores in float: every number must be finite as a float
};

inline bool finite_nonneg(double v) { return std::isfinite(v) && v >= 0.0; }

/// Whether the documented validation rules accept the config; on success `effective` holds the region table
/// after the overrides.
inline bool model_config_valid(const model_config& c, std::vector<model_region>& effective) {
  if (!finite_nonneg(c.alpha)) return false;
  if (!(c.beta >= 0.0 && c.beta < 1.0)) return false;
  if (c.half_life && !(std::isfinite(*c.half_life) && *c.half_life > 0.0)) return false;
  if (!finite_nonneg(c.tau)) return false;
  if (c.page_size == 0 || (c.page_size & (c.page_size - 1)) != 0 || c.page_size > (std::size_t{1} << 20)) return false;
  if (c.normalization < 0 || c.normalization > 3) return false;  // none, uniform, lifetime, zscore
  if (c.unit != model_budget_unit::unlimited) {
    const double lo = c.low.value_or(c.high);
    if (!finite_nonneg(c.high) || !finite_nonneg(lo) || lo > c.high) return false;
    if (c.unit == model_budget_unit::ratio && !(c.high > 0.0 && c.high <= 1.0)) return false;
    if (c.unit != model_budget_unit::ratio && (c.high != std::floor(c.high) || lo != std::floor(lo))) return false;
  }
  auto table_valid = [](const std::vector<model_region>& t) {
    if (t.empty() || t.size() > 256) return false;
    for (std::size_t i = 0; i < t.size(); ++i) {
      if (t[i].name.empty() || !finite_nonneg(t[i].base) || !finite_nonneg(t[i].rate)) return false;
      for (std::size_t j = 0; j < i; ++j)
        if (t[j].name == t[i].name) return false;
    }
    return true;
  };
  if (!table_valid(c.regions)) return false;
  effective = c.regions;
  for (const auto& o : c.overrides) {
    auto it =
        std::find_if(effective.begin(), effective.end(), [&](const model_region& r) { return r.name == o.region; });
    if (it == effective.end()) return false;
    if (o.rate && o.half_life) return false;
    if (o.base) it->base = *o.base;
    if (o.rate) it->rate = *o.rate;
    if (o.half_life) {
      if (!(std::isfinite(*o.half_life) && *o.half_life > 0.0)) return false;
      it->rate = std::log(2.0) / *o.half_life;
    }
    if (o.pinned) it->pinned = *o.pinned;
  }
  if (!table_valid(effective)) return false;
  if (c.fixed_page_size != 0 && c.page_size != c.fixed_page_size) return false;
  if (c.float_scores) {
    const auto fits = [](double v) { return std::isfinite(static_cast<float>(v)); };
    if (!fits(c.alpha)) return false;
    for (const auto& r : effective)
      if (!fits(r.base) || !fits(r.rate)) return false;
  }
  return true;
}

/// Saturating conversion of a non-negative double to a token count: floor(v), or the maximum when it does not fit.
inline std::uint64_t floor_tokens_saturating(double v) {
  const double f = std::floor(v);
  if (!(f < 18446744073709551616.0)) return std::numeric_limits<std::uint64_t>::max();
  return static_cast<std::uint64_t>(f);
}
inline std::uint64_t mul_saturating(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::numeric_limits<std::uint64_t>::max();
  return a * b;
}

enum class model_status : std::uint8_t { evictable, pinned, sink, recent, partial, protected_, host, recalled };

/// The host tier's rules (tiers/host_tier.hpp, docs/tiers.md): the host budget in the sequence budget's units (its
/// high watermark only), the region rule, the recall margins. Validated by model_tier_config_valid (tier_model.hpp).
struct model_tier_config {
  model_budget_unit unit = model_budget_unit::unlimited;
  double high = 0.0;
  double min_host_priority = 0.0;
  double hysteresis = 0.0;
  std::uint32_t min_device_steps = 4;
  std::size_t max_recall_pages = std::numeric_limits<std::size_t>::max();
  std::size_t displace_lowest = 0;  // > 0: only the k lowest-scoring evictable pages may make room for a recall
};

/// Where every held page lives (docs/tiers.md, "The model"): host pages stay in the layout at their original
/// index, so these columns run beside the pages and are compacted with them.
struct model_tier {
  static constexpr std::uint32_t never = std::numeric_limits<std::uint32_t>::max();
  model_tier_config cfg;
  std::vector<std::uint8_t> on_host;       // per held page
  std::vector<std::uint32_t> recalled_at;  // the step the page last came back, `never` if it did not
};

template <class Float>
struct model_sequence {
  struct token {
    std::uint8_t region;
    std::uint64_t position;  // absolute position: fixed at append, never changes
    std::uint32_t refreshed;
    Float ewma;
  };

  model_config cfg;
  std::vector<model_region> regions;  // effective table
  std::size_t P = 16;
  Float alpha{}, beta{}, tau{};
  std::vector<token> tokens;
  std::uint32_t now = 0;
  std::uint64_t logical_len = 0;
  std::uint64_t generation = 0;    // the documented rule: bumped by every call that mutates
  std::optional<model_tier> tier;  // enable_host_tier

  void init(const model_config& c, std::vector<model_region> effective) {
    cfg = c;
    regions = std::move(effective);
    P = c.page_size;
    alpha = static_cast<Float>(c.alpha);
    beta = static_cast<Float>(c.half_life ? std::exp2(-1.0 / *c.half_life) : c.beta);
    tau = static_cast<Float>(c.tau);
  }

  std::size_t kv_len() const { return tokens.size(); }
  std::size_t num_pages() const { return (tokens.size() + P - 1) / P; }
  std::size_t page_begin(std::size_t p) const { return p * P; }
  std::size_t page_count(std::size_t p) const { return std::min(P, tokens.size() - p * P); }
  // Residency: without a tier every held page is on the device.
  bool on_host(std::size_t p) const { return tier && tier->on_host[p] != 0; }
  std::size_t host_pages() const {
    return tier ? static_cast<std::size_t>(std::count(tier->on_host.begin(), tier->on_host.end(), 1)) : 0;
  }
  bool hosting() const { return host_pages() != 0; }
  std::size_t device_pages() const { return num_pages() - host_pages(); }
  std::size_t device_len() const { return kv_len() - host_pages() * P; }  // host pages are always full
  /// The index of held page p among the device pages (the engine's device page table).
  std::size_t device_index(std::size_t p) const {
    std::size_t d = 0;
    for (std::size_t q = 0; q < p; ++q) d += on_host(q) ? 0 : 1;
    return d;
  }
  /// The original page index of held page p (its first token's absolute position / P: pages leave whole).
  std::uint64_t origin(std::size_t p) const { return tokens[p * P].position / P; }

  // --- calls ----------------------------------------------------------------------------------------------------
  outcome append(const std::vector<std::pair<std::uint8_t, std::size_t>>& spans) {
    for (const auto& s : spans)
      if (s.first >= regions.size()) return outcome::input_error;
    std::size_t total = 0;
    for (const auto& s : spans) {
      for (std::size_t k = 0; k < s.second; ++k) tokens.push_back({s.first, logical_len++, now, Float{0}});
      total += s.second;
    }
    if (tier) {  // new pages enter on the device
      tier->on_host.resize(num_pages(), 0);
      tier->recalled_at.resize(num_pages(), model_tier::never);
    }
    if (total) ++generation;
    return outcome::ok;
  }
  outcome advance_to(std::uint32_t step) {
    if (step < now) return outcome::input_error;
    if (step != now) ++generation;
    now = step;
    return outcome::ok;
  }
  Float scale() const { return cfg.normalization == 1 ? static_cast<Float>(tokens.size()) : Float{1}; }
  /// Per-token mass over the device tokens (docs/tiers.md: observations cover the device only; host tokens
  /// receive none, i.e. zero). A held-length observation while pages are on the host is an input_error.
  outcome observe_tokens(const std::vector<Float>& mass) {
    if (!hosting()) return observe_held(mass);
    if (mass.size() != device_len()) return outcome::input_error;
    for (Float m : mass)
      if (!std::isfinite(m) || m < 0) return outcome::input_error;
    std::vector<Float> held(tokens.size(), Float{0});
    for (std::size_t p = 0, from = 0; p < num_pages(); ++p) {
      if (on_host(p)) continue;
      for (std::size_t i = page_begin(p); i < page_begin(p) + page_count(p); ++i) held[i] = mass[from++];
    }
    return observe_held(held);
  }
  outcome observe_held(const std::vector<Float>& mass) {
    if (mass.size() != tokens.size()) return outcome::input_error;
    for (Float m : mass)
      if (!std::isfinite(m) || m < 0) return outcome::input_error;
    const Float s = scale();
    for (Float m : mass)
      if (!std::isfinite(s * m)) return outcome::input_error;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const Float x = s * mass[i];
      tokens[i].ewma = std::fma(beta, tokens[i].ewma, (Float{1} - beta) * x);  // the spec: one rounding of the sum
      if (x > tau) tokens[i].refreshed = now;
    }
    ++generation;
    return outcome::ok;
  }
  /// Per-page mass over the device pages (host pages receive none).
  outcome observe_pages(const std::vector<Float>& device_page_mass) {
    if (device_page_mass.size() != device_pages()) return outcome::input_error;
    for (Float m : device_page_mass)
      if (!std::isfinite(m) || m < 0) return outcome::input_error;
    std::vector<Float> page_mass(num_pages(), Float{0});
    for (std::size_t p = 0, d = 0; p < num_pages(); ++p)
      if (!on_host(p)) page_mass[p] = device_page_mass[d++];
    std::vector<Float> per_token(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const std::size_t p = i / P;
      per_token[i] = page_mass[p] / static_cast<Float>(page_count(p));
    }
    return observe_held(per_token);
  }

  // --- scores and statuses --------------------------------------------------------------------------------------
  Float token_score(const token& t) const {
    const Float b = static_cast<Float>(regions[t.region].base);
    const Float lambda = static_cast<Float>(regions[t.region].rate);
    const Float age = static_cast<Float>(now - t.refreshed);
    const Float decay = b * std::exp(-lambda * age);
    const Float attention = alpha * t.ewma;
    return decay + attention;
  }
  std::vector<Float> page_scores() const {
    std::vector<Float> out(num_pages());
    for (std::size_t p = 0; p < out.size(); ++p) {
      Float sum = 0;
      for (std::size_t i = page_begin(p); i < page_begin(p) + page_count(p); ++i) sum += token_score(tokens[i]);
      out[p] = sum / static_cast<Float>(page_count(p));
    }
    return out;
  }
  std::vector<model_status> statuses(const std::vector<std::size_t>& caller_protected) const {
    std::vector<model_status> out(num_pages(), model_status::evictable);
    const std::size_t n = tokens.size();
    for (std::size_t p = 0; p < out.size(); ++p) {
      bool pinned = false, recent = false;
      for (std::size_t i = page_begin(p); i < page_begin(p) + page_count(p); ++i) {
        if (regions[tokens[i].region].pinned) pinned = true;
        if (cfg.recent_tokens > 0 && n - i <= cfg.recent_tokens) recent = true;  // i is among the last R tokens
      }
      if (pinned)
        out[p] = model_status::pinned;
      else if (p < cfg.sink_pages)
        out[p] = model_status::sink;
      else if (recent)
        out[p] = model_status::recent;
      else if (page_count(p) < P)
        out[p] = model_status::partial;
      else if (std::find(caller_protected.begin(), caller_protected.end(), p) != caller_protected.end())
        out[p] = model_status::protected_;
      // The host tier: a host page is not a device victim whatever else it is; a page recalled fewer than
      // min_device_steps steps ago is not evictable yet.
      if (on_host(p))
        out[p] = model_status::host;
      else if (tier && out[p] == model_status::evictable && tier->recalled_at[p] != model_tier::never &&
               now - tier->recalled_at[p] < tier->cfg.min_device_steps)
        out[p] = model_status::recalled;
    }
    return out;
  }

  struct selection {
    std::vector<std::size_t> pages;  // ascending
    std::vector<Float> scores;
    std::size_t requested = 0;
    std::size_t over_budget = 0;
    std::size_t eligible = 0;
  };
  /// Budget watermarks in tokens, with exact saturating arithmetic.
  std::pair<std::uint64_t, std::uint64_t> watermarks() const {
    const double lo = cfg.low.value_or(cfg.high);
    switch (cfg.unit) {
      case model_budget_unit::unlimited: break;
      case model_budget_unit::tokens: return {floor_tokens_saturating(cfg.high), floor_tokens_saturating(lo)};
      case model_budget_unit::pages:
        return {mul_saturating(floor_tokens_saturating(cfg.high), P), mul_saturating(floor_tokens_saturating(lo), P)};
      case model_budget_unit::ratio: {
        const double n = static_cast<double>(logical_len);
        return {floor_tokens_saturating(cfg.high * n), floor_tokens_saturating(lo * n)};
      }
    }
    return {std::numeric_limits<std::uint64_t>::max(), std::numeric_limits<std::uint64_t>::max()};
  }
  /// Victims by the documented rule, for the given page scores (the model's own, or the library's: the scores of
  /// the SIMD scorer differ from the scalar formula by a documented tolerance, so selection is checked exactly on
  /// the library's scores and the scores are checked against page_scores() within that tolerance).
  selection select_with(const std::vector<Float>& scores, std::size_t k,
                        const std::vector<std::size_t>& caller_protected) const {
    const auto status = statuses(caller_protected);
    std::vector<std::pair<Float, std::size_t>> eligible;
    for (std::size_t p = 0; p < scores.size(); ++p)
      if (status[p] == model_status::evictable) eligible.emplace_back(scores[p], p);
    std::sort(eligible.begin(), eligible.end(), [](const auto& a, const auto& b) {
      return a.first < b.first || (a.first == b.first && a.second < b.second);
    });
    selection s;
    s.requested = k;
    s.eligible = eligible.size();
    for (std::size_t j = 0; j < eligible.size() && j < k; ++j) s.pages.push_back(eligible[j].second);
    std::sort(s.pages.begin(), s.pages.end());
    for (std::size_t p : s.pages) s.scores.push_back(scores[p]);
    const std::uint64_t high = watermarks().first;
    const std::uint64_t after = device_len() - s.pages.size() * P;  // the budget counts device tokens
    s.over_budget = after <= high ? 0 : static_cast<std::size_t>((after - high + P - 1) / P);
    return s;
  }
  /// How many pages the budget asks for now.
  std::size_t budget_request() const {
    const auto [high, low] = watermarks();
    if (device_len() <= high) return 0;
    const std::uint64_t excess = device_len() - low;
    return static_cast<std::size_t>((excess + P - 1) / P);
  }

  /// The documented acceptance rule of commit(plan): current generation, same page size, strictly ascending
  /// resident full pages, each evictable under the config's protections (so never a host or recalled page). With
  /// a host tier: `demoted` strictly ascending and among the plan's pages, `host_dropped` strictly ascending host
  /// pages; without one both must be empty.
  outcome check_plan(std::uint64_t plan_generation, std::size_t plan_page_size, const std::vector<std::size_t>& pages,
                     const std::vector<std::size_t>& demoted = {},
                     const std::vector<std::size_t>& host_dropped = {}) const {
    if (plan_generation != generation || plan_page_size != P) return outcome::usage_error;
    if (!tier && (!demoted.empty() || !host_dropped.empty())) return outcome::usage_error;
    const auto status = statuses({});
    for (std::size_t k = 0; k < pages.size(); ++k) {
      if (pages[k] >= num_pages()) return outcome::usage_error;
      if (k > 0 && pages[k] <= pages[k - 1]) return outcome::usage_error;
      if (page_count(pages[k]) != P) return outcome::usage_error;
      if (status[pages[k]] != model_status::evictable) return outcome::usage_error;
    }
    for (std::size_t k = 0; k < demoted.size(); ++k) {
      if (k > 0 && demoted[k] <= demoted[k - 1]) return outcome::usage_error;
      if (!std::binary_search(pages.begin(), pages.end(), demoted[k])) return outcome::usage_error;
    }
    for (std::size_t k = 0; k < host_dropped.size(); ++k) {
      if (k > 0 && host_dropped[k] <= host_dropped[k - 1]) return outcome::usage_error;
      if (host_dropped[k] >= num_pages() || !on_host(host_dropped[k])) return outcome::usage_error;
    }
    return outcome::ok;
  }
  /// Held pages leave the sequence (strictly ascending, checked): tokens and tier columns compacted together.
  void remove(const std::vector<std::size_t>& pages) {
    if (pages.empty()) return;
    std::vector<token> kept;
    for (std::size_t i = 0; i < tokens.size(); ++i)
      if (!std::binary_search(pages.begin(), pages.end(), i / P)) kept.push_back(tokens[i]);
    if (tier) {
      model_tier next = *tier;
      next.on_host.clear();
      next.recalled_at.clear();
      for (std::size_t p = 0; p < tier->on_host.size(); ++p) {
        if (std::binary_search(pages.begin(), pages.end(), p)) continue;
        next.on_host.push_back(tier->on_host[p]);
        next.recalled_at.push_back(tier->recalled_at[p]);
      }
      tier = std::move(next);
    }
    tokens = std::move(kept);
    ++generation;
  }
  /// A checked eviction plan: the demoted victims go to host (and forget a recall), the other victims and the
  /// host-dropped pages leave. Each of the two steps is a new generation when it does something.
  void commit_plan(const std::vector<std::size_t>& pages, const std::vector<std::size_t>& demoted,
                   const std::vector<std::size_t>& host_dropped) {
    if (!tier) return remove(pages);
    std::vector<std::size_t> leaving;
    for (std::size_t p : pages)
      if (!std::binary_search(demoted.begin(), demoted.end(), p)) leaving.push_back(p);
    leaving.insert(leaving.end(), host_dropped.begin(), host_dropped.end());
    std::sort(leaving.begin(), leaving.end());
    for (std::size_t p : demoted) tier->on_host[p] = 1, tier->recalled_at[p] = model_tier::never;
    if (!demoted.empty()) ++generation;
    remove(leaving);
  }
};

/// The model of block_pool: a stack free list and one block list per sequence.
struct model_pool {
  std::size_t P = 16, capacity = 0;
  std::vector<std::int32_t> free;
  struct seq {
    std::uint64_t id;
    std::vector<std::int32_t> blocks;
    std::size_t tokens = 0;
  };
  std::vector<seq> seqs;

  void init(std::size_t blocks, std::size_t page_size) {
    P = page_size;
    capacity = blocks;
    free.clear();
    for (std::size_t i = blocks; i-- > 0;) free.push_back(static_cast<std::int32_t>(i));
  }
  seq* find(std::uint64_t id) {
    for (auto& s : seqs)
      if (s.id == id) return &s;
    return nullptr;
  }
  outcome open(std::uint64_t id) {
    if (find(id)) return outcome::usage_error;
    seqs.push_back({id, {}, 0});
    return outcome::ok;
  }
  outcome close(std::uint64_t id) {
    seq* s = find(id);
    if (!s) return outcome::usage_error;
    for (auto it = s->blocks.rbegin(); it != s->blocks.rend(); ++it) free.push_back(*it);
    seqs.erase(seqs.begin() + (s - seqs.data()));
    return outcome::ok;
  }
  outcome append(std::uint64_t id, std::size_t n) {
    seq* s = find(id);
    if (!s) return outcome::usage_error;
    // Exact arithmetic: a request that overflows the token count can never be met.
    if (n > std::numeric_limits<std::size_t>::max() - s->tokens) return outcome::input_error;
    const std::size_t total = s->tokens + n;
    const std::size_t need_pages = total / P + (total % P != 0 ? 1 : 0);
    const std::size_t needed = need_pages - s->blocks.size();  // total >= tokens, so need_pages >= blocks
    if (needed > free.size()) return outcome::input_error;
    for (std::size_t i = 0; i < needed; ++i) {
      s->blocks.push_back(free.back());
      free.pop_back();
    }
    s->tokens = total;
    return outcome::ok;
  }
  /// A recall through block_pool::insert_pages and remove_pages on sequence `id` (held pages in the caller's
  /// order: `device` says which of them are on the device now, `promote` / `displaced` are ascending held indices).
  /// With free blocks for every promotion the insertion comes first (fresh blocks: position k takes the k-th of
  /// the last n free blocks), then the removal (freed blocks pushed in page order); otherwise the removal first.
  /// Returns the fresh blocks in page order. The caller has checked that it fits.
  std::vector<std::int32_t> recall(std::uint64_t id, const std::vector<bool>& device,
                                   const std::vector<std::size_t>& promote, const std::vector<std::size_t>& displaced) {
    seq* s = find(id);
    const std::size_t n = promote.size();
    std::vector<std::int32_t> fresh;
    auto take = [&] {
      fresh.assign(free.end() - static_cast<std::ptrdiff_t>(n), free.end());
      free.resize(free.size() - n);
    };
    auto release = [&] {
      for (std::size_t p = 0, d = 0; p < device.size(); ++p) {
        if (!device[p]) continue;
        if (std::binary_search(displaced.begin(), displaced.end(), p)) free.push_back(s->blocks[d]);
        ++d;
      }
    };
    if (free.size() >= n) {
      take();
      release();
    } else {
      release();
      take();
    }
    std::vector<std::int32_t> table;
    for (std::size_t p = 0, d = 0, k = 0; p < device.size(); ++p) {
      if (std::binary_search(promote.begin(), promote.end(), p)) {
        table.push_back(fresh[k++]);
        continue;
      }
      if (!device[p]) continue;
      if (!std::binary_search(displaced.begin(), displaced.end(), p)) table.push_back(s->blocks[d]);
      ++d;
    }
    s->blocks = std::move(table);
    s->tokens = s->tokens + n * P - displaced.size() * P;
    return fresh;
  }
  outcome remove(std::uint64_t id, const std::vector<std::size_t>& pages) {
    seq* s = find(id);
    if (!s) return outcome::usage_error;
    for (std::size_t k = 0; k < pages.size(); ++k) {
      if (pages[k] >= s->blocks.size()) return outcome::usage_error;
      if (k > 0 && pages[k] <= pages[k - 1]) return outcome::usage_error;
      if ((pages[k] + 1) * P > s->tokens) return outcome::usage_error;
    }
    std::vector<std::int32_t> kept;
    for (std::size_t i = 0; i < s->blocks.size(); ++i) {
      if (std::binary_search(pages.begin(), pages.end(), i))
        free.push_back(s->blocks[i]);
      else
        kept.push_back(s->blocks[i]);
    }
    s->blocks = std::move(kept);
    s->tokens -= pages.size() * P;
    return outcome::ok;
  }
};

}  // namespace memdecay_fuzz

#endif  // MEMDECAY_FUZZ_MODEL_HPP
