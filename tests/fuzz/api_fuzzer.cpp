// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: random sequences of public API calls on memdecay::sequence (float, page size chosen at run
// time) or memdecay::basic_sequence<memdecay::policies::memdecay, double, 16>, plus the memdecay::block_pool that mirrors it, run against the
// scalar model in model.hpp. Aborts on:
//   * a call whose outcome (ok / config_error / input_error / usage_error) differs from the documented one, or
//     whose message does not carry its tier's prefix;
//   * any difference in state after a call (labels, refresh steps, EWMA bits, absolute positions, clock, lengths,
//     page scores bit for bit, page statuses, the pool's block tables and free count);
//   * any difference in victims, their scores, `requested` or `pages_over_budget`;
//   * a broken invariant: a victim that is not evictable, a feasible budget plan that leaves the sequence above
//     its low watermark, a NaN page score, a rejected call that changes the digest, the generation or the pool,
//     a select that changes anything, a digest change without a generation change, an inconsistent pool.
//
// Input layout (all reads past the end give zero bytes, so every input is valid): a config header, then
// operations, one opcode byte each followed by its arguments (see run_ops). tests/fuzz/README.md has the details.
#include <Eigen/Core>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "memdecay/page_tables/block_pool.hpp"
#include "memdecay/core/sequence.hpp"
#include "memdecay/io/snapshot.hpp"
#include "memdecay/tiers/host_store.hpp"
#include "memdecay/tiers/host_tier.hpp"
#include "common.hpp"
#include "model.hpp"
#include "tier_bridge.hpp"
#include "tier_model.hpp"

namespace {

using namespace memdecay_fuzz;

// ------------------------------------------------------------------------------------------------------------------
// The config header.
constexpr double k_ln2 = 0.69314718055994530942;

model_config read_config(reader& in, std::size_t fixed_page_size, bool float_scores) {
  model_config c;
  c.fixed_page_size = fixed_page_size;
  c.float_scores = float_scores;
  const std::uint8_t invalid_ok = in.u8();  // low bits decide how often invalid values are drawn
  const bool allow_bad = (invalid_ok & 7) == 0;
  static const double alphas[] = {0.0, 0.25, 1.0, 1.0, 4.0, 1e6, 1e30, 1e39, 1e300};
  static const double bad_alphas[] = {-1.0, nan_d, inf_d};
  c.alpha = allow_bad && in.flip(4) ? in.pick(bad_alphas) : in.pick(alphas);
  static const double betas[] = {0.0, 0.5, 0.9, 0.9, 0.99, 0.999999, 0.1};
  static const double bad_betas[] = {1.0, -0.1, nan_d, 2.0};
  c.beta = allow_bad && in.flip(4) ? in.pick(bad_betas) : in.pick(betas);
  if (in.flip(6)) {
    static const double half_lives[] = {1.0, 10.0, 1e-300, 1e300, 0.0, -1.0, inf_d, nan_d};
    c.half_life = half_lives[in.u8() % (allow_bad ? 8 : 4)];
  }
  static const double taus[] = {0.0, 0.01, 0.5, 1.0, 2.0, 1e30};
  static const double bad_taus[] = {-1.0, nan_d, inf_d};
  c.tau = allow_bad && in.flip(4) ? in.pick(bad_taus) : in.pick(taus);
  if (fixed_page_size) {
    c.page_size = allow_bad && in.flip(4) ? 8 : fixed_page_size;
  } else {
    static const std::size_t sizes[] = {1, 2, 4, 4, 8, 8, 16, 16, 32};
    static const std::size_t bad_sizes[] = {0, 3, 12, std::size_t{1} << 21};
    c.page_size = allow_bad && in.flip(4) ? in.pick(bad_sizes) : in.pick(sizes);
  }
  // none and uniform (the modes the model scores); 0x7F is no mode at all.
  static const int bad_modes[] = {0x7F};
  c.normalization = allow_bad && in.flip(8) ? in.pick(bad_modes) : in.u8() % 2;
  c.sink_pages = in.u8() % 3 == 0 ? in.u8() % 4 : 0;
  switch (in.u8() % 4) {
    case 0: c.recent_tokens = 0; break;
    case 1: c.recent_tokens = in.u8() % 40; break;
    case 2: c.recent_tokens = c.page_size * (in.u8() % 3); break;
    default: c.recent_tokens = in.flip(4) ? std::numeric_limits<std::size_t>::max() : 0; break;
  }
  const std::uint8_t unit = in.u8() % 4;
  c.unit = static_cast<model_budget_unit>(unit);
  switch (c.unit) {
    case model_budget_unit::unlimited: break;
    case model_budget_unit::tokens: {
      static const double highs[] = {0,   1,   15,  16,   32,   48,    64,
                                     100, 128, 256, 1000, 1e20, 1e300, 18446744073709551616.0};
      static const double bad[] = {1.5, -1.0, nan_d, inf_d};
      c.high = allow_bad && in.flip(4) ? in.pick(bad) : in.pick(highs);
      break;
    }
    case model_budget_unit::pages: {
      static const double highs[] = {0, 1, 2, 3, 4, 6, 8, 16, 1152921504606846976.0 /* 2^60 */, 1e300};
      static const double bad[] = {2.5, -1.0, nan_d};
      c.high = allow_bad && in.flip(4) ? in.pick(bad) : in.pick(highs);
      break;
    }
    case model_budget_unit::ratio: {
      static const double highs[] = {0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1e-9};
      static const double bad[] = {0.0, 1.5, -0.5, nan_d};
      c.high = allow_bad && in.flip(4) ? in.pick(bad) : in.pick(highs);
      break;
    }
  }
  if (c.unit != model_budget_unit::unlimited && in.flip(2)) {
    switch (in.u8() % 5) {
      case 0: c.low = c.high; break;
      case 1: c.low = c.unit == model_budget_unit::ratio ? c.high / 2 : std::floor(c.high / 2); break;
      case 2: c.low = 0.0; break;
      case 3:
        c.low = c.unit == model_budget_unit::tokens ? std::max(0.0, c.high - 16) : std::floor(c.high * 0.75);
        break;
      default: c.low = allow_bad ? c.high + 1 : c.high; break;
    }
  }
  // Regions: the default seven (as the library documents them), or a table of the fuzzer's own.
  const std::uint8_t table_kind = in.u8() % 3;
  if (table_kind != 0) {
    const char* names[] = {"system", "plan", "user", "tool_in", "tool_out", "retrieval", "scratchpad"};
    const double bases[] = {1.00, 0.90, 0.80, 0.50, 0.40, 0.60, 0.30};
    const double half[] = {170.0, 120.0, 80.0, 30.0, 40.0, 100.0, 15.0};
    for (int i = 0; i < 7; ++i) c.regions.push_back({names[i], bases[i], k_ln2 / half[i], i == 0});
  } else {
    const std::size_t n = 1 + in.u8() % 8;
    static const double bases[] = {0.0, 0.1, 0.5, 1.0, 1.0, 2.0, 1e30, 1e39, 1e300};
    static const double bad_bases[] = {-1.0, nan_d, inf_d};
    static const double rates[] = {0.0, 0.001, 0.0462, 0.5, 1.0, 100.0, 1e39, 1e300};
    static const double bad_rates[] = {-0.5, nan_d, inf_d};
    for (std::size_t i = 0; i < n; ++i) {
      model_region r;
      r.name = "r" + std::to_string(i);
      if (allow_bad && in.flip(16)) r.name = in.flip(2) ? "" : "r0";
      r.base = allow_bad && in.flip(8) ? in.pick(bad_bases) : in.pick(bases);
      r.rate = allow_bad && in.flip(8) ? in.pick(bad_rates) : in.pick(rates);
      r.pinned = in.flip(5);
      c.regions.push_back(r);
    }
  }
  const std::size_t n_overrides = in.u8() % 4 == 0 ? 1 + in.u8() % 2 : 0;
  for (std::size_t k = 0; k < n_overrides; ++k) {
    static const char* targets[] = {"plan", "system", "user", "r0", "r1", "scratchpad", "nosuch"};
    model_override o;
    o.region = targets[in.u8() % (allow_bad ? 7 : 6)];
    const std::uint8_t fields = in.u8();
    if (fields & 1) o.pinned = (fields & 2) != 0;
    if (fields & 4) o.base = (fields & 8) && allow_bad ? -1.0 : 0.05;
    if (fields & 16) o.rate = 0.2;
    if (fields & 32) o.half_life = (fields & 64) && allow_bad ? 0.0 : 7.0;
    c.overrides.push_back(o);
  }
  return c;
}

/// What the fuzzer's host store throws when a fault is injected into one of its copies (not a memdecay error: the
/// library must undo and let it through).
struct injected_fault {};

// ------------------------------------------------------------------------------------------------------------------
// One run: a sequence type, its model, a pool that mirrors it (sequence id 0) and a few pool-only sequences.
constexpr std::size_t k_max_tokens = 3000;  // keeps one input fast
constexpr std::size_t k_max_ops = 400;

template <class Float, std::size_t PageSize>
class harness {
 public:
  using seq_type = memdecay::basic_sequence<memdecay::policies::memdecay, Float, PageSize>;
  using plan_type = typename seq_type::plan_type;
  using pool_type = memdecay::block_pool<>;

  harness(seq_type& seq, model_sequence<Float>& model, std::size_t pool_blocks)
      : seq_(seq), m_(model), pool_(pool_blocks, seq.page_size()), device_kv_(pool_blocks, k_no_kv) {
    pm_.init(pool_blocks, seq.page_size());
    pool_.open(0);
    FUZZ_CHECK(pm_.open(0) == outcome::ok, "pool model open");
  }

  void run(reader& in) {
    compare_all("after construction");
    for (std::size_t op = 0; op < k_max_ops && !in.done(); ++op) {
      const snapshot before = snap();
      const std::uint64_t digest = before.digest, generation = before.generation;
      const std::uint8_t code = in.u8();
      switch (code % 16) {
        case 0:
        case 1: op_append_spans(in); break;
        case 2: op_append_labels(in); break;
        case 3:
        case 4: op_advance(in); break;
        case 5:
        case 6: op_observe_tokens(in); break;
        case 7: op_observe_pages(in); break;
        case 8:
          if (in.flip(2))
            op_observe_rows(in);
          else
            op_observe_heads(in);
          break;
        case 9:
        case 10: op_select_for_budget(in); break;
        case 11: op_select(in); break;
        case 12:
        case 13: op_commit(in); break;
        case 14: op_pool(in); break;
        default:
          if (code == 0xDF || code == 0xEF)  // the host tier: opcode values of their own (tests/fuzz/README.md)
            op_tier(in);
          else if (in.flip(3))
            op_snapshot(in);
          else if (in.flip(3))
            op_digests(in);
          else
            op_queries(in);
          break;
      }
      // The full comparison after every call that changed something; a call that left the digest, the generation
      // and the pool alone left a state that was already compared (the digest covers every field).
      if (!(snap() == before) || code % 16 == 14 || op % 16 == 0) compare_all("after op " + std::to_string(op));
      if (seq_.digest() != digest)
        FUZZ_CHECK(seq_.state().generation() != generation, "the state changed but the generation did not");
    }
  }

 private:
  // --- comparisons ------------------------------------------------------------------------------------------------
  static Float tolerance(Float ref) { return score_tolerance(ref); }
  static bool close(Float got, Float ref) { return scores_close(got, ref); }
  void compare_all(const std::string& where) {
    const auto& st = seq_.state();
    FUZZ_CHECK(st.kv_len() == m_.kv_len(), where);
    FUZZ_CHECK(st.num_pages() == m_.num_pages(), where);
    FUZZ_CHECK(st.logical_len() == m_.logical_len, where);
    FUZZ_CHECK(st.evicted_tokens() == m_.logical_len - m_.kv_len(), where);
    FUZZ_CHECK(st.evicted_tokens() % seq_.page_size() == 0, where);
    FUZZ_CHECK(st.now() == m_.now, where);
    FUZZ_CHECK(st.generation() == m_.generation, where + ": generation " + std::to_string(st.generation()) +
                                                     " vs model " + std::to_string(m_.generation));
    if (seq_.has_digests())
      FUZZ_CHECK(seq_.digests().num_pages() == seq_.num_pages(), where + ": digests and pages disagree");
    for (std::size_t i = 0; i < m_.kv_len(); ++i) {
      const auto& t = m_.tokens[i];
      FUZZ_CHECK(st.regions()[i] == t.region, where + ": region of token " + std::to_string(i));
      FUZZ_CHECK(seq_.policy().last_refresh()[i] == t.refreshed,
                 where + ": refresh step of token " + std::to_string(i));
      FUZZ_CHECK(std::memcmp(&seq_.policy().ewma()[i], &t.ewma, sizeof(Float)) == 0,
                 where + ": EWMA of token " + std::to_string(i));
      FUZZ_CHECK(st.position_of(i) == t.position, where + ": position of token " + std::to_string(i));
    }
    // The prefix-cache boundary: the first original page that is gone.
    // The prefix-cache boundary: the first original page that is not on the device (gone, or on the host).
    std::optional<std::uint64_t> boundary;
    if (m_.logical_len != m_.kv_len() || m_.hosting()) {
      std::uint64_t p = 0;
      while (p < m_.num_pages() && m_.tokens[p * m_.P].position == p * m_.P && !m_.on_host(p)) ++p;
      boundary = p;
    }
    FUZZ_CHECK(seq_.prefix_cache_boundary() == boundary, where + ": prefix_cache_boundary");
    // Scores within the documented tolerance of the scalar formula (simd/score_kernel.hpp), never NaN.
    const auto scores = seq_.page_scores();
    const auto model_scores = m_.page_scores();
    FUZZ_CHECK(scores.size() == model_scores.size(), where);
    for (std::size_t p = 0; p < scores.size(); ++p) {
      FUZZ_CHECK(!std::isnan(scores[p]), where + ": page " + std::to_string(p) + " scores NaN");
      FUZZ_CHECK(!std::isnan(model_scores[p]), where + ": the model scores page " + std::to_string(p) + " NaN");
      FUZZ_CHECK(close(scores[p], model_scores[p]), where + ": score of page " + std::to_string(p) + ": " +
                                                        std::to_string(scores[p]) + " vs model " +
                                                        std::to_string(model_scores[p]));
    }
    compare_statuses(where, {});
    // The pool's mirror of sequence 0 and the pool-only sequences.
    FUZZ_CHECK(pool_.consistent(), where + ": block pool inconsistent");
    FUZZ_CHECK(pool_.free_blocks() == pm_.free.size(), where + ": free blocks");
    FUZZ_CHECK(pool_.num_sequences() == pm_.seqs.size(), where + ": pool sequences");
    for (const auto& s : pm_.seqs) {
      FUZZ_CHECK(pool_.contains(s.id), where);
      FUZZ_CHECK(pool_.num_tokens(s.id) == s.tokens, where + ": pool tokens of sequence " + std::to_string(s.id));
      const auto table = pool_.block_table(s.id);
      FUZZ_CHECK(table.size() == s.blocks.size() && std::equal(table.begin(), table.end(), s.blocks.begin()),
                 where + ": block table of sequence " + std::to_string(s.id));
    }
    FUZZ_CHECK(pool_.num_pages(0) == seq_.device_pages(),
               where + ": the device table holds other than the device pages");
    compare_tier(where);
  }
  /// The residency model (tier_conformance_test's): every held page's origin, tier and last recall, the device and
  /// host counts, device_index, the K/V tag in each device page's block (its origin: a recall put the right page
  /// back at the right place), and the host store's slots.
  void compare_tier(const std::string& where) {
    FUZZ_CHECK(seq_.has_host_tier() == m_.tier.has_value(), where + ": has_host_tier");
    FUZZ_CHECK(seq_.host_pages() == m_.host_pages(), where + ": host pages");
    FUZZ_CHECK(seq_.device_len() == m_.device_len(), where + ": device_len");
    FUZZ_CHECK(seq_.device_pages() == m_.device_pages(), where + ": device_pages");
    const auto origins = seq_.state().page_origins();
    FUZZ_CHECK(origins.size() == m_.num_pages(), where);
    const auto table = pool_.block_table(0);
    for (std::size_t p = 0, d = 0; p < m_.num_pages(); ++p) {
      FUZZ_CHECK(origins[p] == m_.origin(p), where + ": origin of page " + std::to_string(p));
      if (m_.tier) {
        FUZZ_CHECK(seq_.host_tier().host_flags()[p] == m_.tier->on_host[p],
                   where + ": residency of page " + std::to_string(p));
        FUZZ_CHECK(seq_.host_tier().recalled_at()[p] == m_.tier->recalled_at[p],
                   where + ": last recall of page " + std::to_string(p));
      }
      if (m_.on_host(p)) continue;
      FUZZ_CHECK(d < table.size(), where);
      FUZZ_CHECK(device_kv_[static_cast<std::size_t>(table[d])] == m_.origin(p),
                 where + ": the block of device page " + std::to_string(p) + " holds the K/V of page " +
                     std::to_string(device_kv_[static_cast<std::size_t>(table[d])]) + ", not of its origin " +
                     std::to_string(m_.origin(p)));
      ++d;
    }
    if (m_.tier) {
      FUZZ_CHECK(seq_.host_tier().config().digest() == tier_to_library(m_.tier->cfg).digest(), where + ": tier rules");
      for (std::size_t p = 0; p < m_.num_pages() && p < 64; ++p)
        if (!m_.on_host(p)) FUZZ_CHECK(seq_.device_index(p) == m_.device_index(p), where + ": device_index");
    }
    if (store_) {
      std::vector<std::pair<std::uint64_t, std::size_t>> want(ms_.slots.begin(), ms_.slots.end()), got;
      for (const auto& [key, slot] : store_->entries()) got.emplace_back(key.second, slot);
      FUZZ_CHECK(got == want, where + ": host store entries");
      FUZZ_CHECK(std::equal(store_->free_list().begin(), store_->free_list().end(), ms_.free.begin(), ms_.free.end()),
                 where + ": host store free list");
    }
  }
  void compare_statuses(const std::string& where, const std::vector<std::size_t>& prot) {
    const auto got = seq_.page_statuses(prot);
    const auto want = m_.statuses(prot);
    FUZZ_CHECK(got.size() == want.size(), where);
    for (std::size_t p = 0; p < got.size(); ++p)
      FUZZ_CHECK(static_cast<int>(got[p]) == static_cast<int>(want[p]),
                 where + ": status of page " + std::to_string(p) + ": " + memdecay::to_string(got[p]));
  }
  /// The fingerprint of everything a rejected call must leave alone.
  struct snapshot {
    std::uint64_t digest, generation;
    std::size_t pool_free;
    std::vector<std::int32_t> table0;
    std::vector<std::pair<std::uint64_t, std::size_t>> store_slots;  // the host store's (origin, slot) entries
    std::vector<std::size_t> store_free;
    bool operator==(const snapshot&) const = default;
  };
  snapshot snap() const {
    const auto t = pool_.block_table(0);
    snapshot s{seq_.digest(), seq_.state().generation(), pool_.free_blocks(), {t.begin(), t.end()}, {}, {}};
    if (store_) {
      for (const auto& [key, slot] : store_->entries()) s.store_slots.emplace_back(key.second, slot);
      s.store_free.assign(store_->free_list().begin(), store_->free_list().end());
    }
    return s;
  }
  void check_unchanged_if_rejected(outcome o, const snapshot& before, const std::string& call) {
    if (o != outcome::ok) FUZZ_CHECK(snap() == before, call + " was rejected but changed the state");
  }

  // --- value generators -------------------------------------------------------------------------------------------
  std::uint8_t region(reader& in) {
    const std::uint8_t b = in.u8();
    const std::size_t n = m_.regions.size();
    if (b >= 0xF0) return static_cast<std::uint8_t>(std::min<std::size_t>(255, n + (b & 0x0F)));  // unknown id
    return static_cast<std::uint8_t>(b % n);
  }
  Float mass_value(reader& in, std::size_t n) {
    const std::uint8_t b = in.u8();
    const Float lim = std::numeric_limits<Float>::max();
    switch (b % 40) {
      case 0: return Float{0};
      case 1: return -Float{0};
      case 2: return std::numeric_limits<Float>::quiet_NaN();
      case 3: return std::numeric_limits<Float>::infinity();
      case 4: return -std::numeric_limits<Float>::infinity();
      case 5: return Float{-1};
      case 6: return -std::numeric_limits<Float>::denorm_min();
      case 7: return std::numeric_limits<Float>::denorm_min();
      case 8: return lim;
      case 9: return lim / Float{2};
      case 10: return Float{1e30};
      case 11: return Float{1e6};
      case 12: return static_cast<Float>(lim / static_cast<Float>(n ? n : 1));  // overflows once normalised?
      case 13: return Float{1};
      case 14: return Float{2};
      case 15: return Float{0.5};
      default: {  // a plausible share of one attention row: up to ~8x uniform
        const Float u = static_cast<Float>(in.u8()) / Float{32};
        return n ? u / static_cast<Float>(n) : u;
      }
    }
  }
  std::vector<Float> mass_vector(reader& in, std::size_t expected) {
    std::size_t len = expected;
    const std::uint8_t shape = in.u8();
    if (shape % 16 == 0)
      len = expected + 1;
    else if (shape % 16 == 1)
      len = expected ? expected - 1 : 0;
    else if (shape % 16 == 2)
      len = 0;
    const std::uint8_t mode = in.u8();  // 0..3: one value everywhere; otherwise per-entry values with a default
    std::vector<Float> mass(len);
    if (mode % 4 == 0) {
      const Float v = mass_value(in, expected);
      std::fill(mass.begin(), mass.end(), v);
    } else {
      const Float base = mass_value(in, expected);
      std::fill(mass.begin(), mass.end(), base);
      const std::size_t edits = in.u8() % 8;
      for (std::size_t e = 0; e < edits && len; ++e) mass[in.u16() % len] = mass_value(in, expected);
    }
    return mass;
  }
  std::vector<std::size_t> protected_pages(reader& in) {
    std::vector<std::size_t> out;
    const std::size_t n = in.u8() % 4 == 0 ? in.u8() % 5 : 0;
    for (std::size_t k = 0; k < n; ++k) {
      const std::uint8_t b = in.u8();
      out.push_back(b == 0xFF ? std::numeric_limits<std::size_t>::max()
                              : (m_.num_pages() ? b % (m_.num_pages() + 2) : b));
    }
    return out;
  }

  // --- operations -------------------------------------------------------------------------------------------------
  /// Appends to the pool first (an engine allocates KV blocks before it labels them), then to the sequence.
  void append_both(std::vector<std::pair<std::uint8_t, std::size_t>> spans, bool as_labels) {
    // Per-token labels carry no zero-count spans: a span that clamp() emptied (the sequence at its size cap) names
    // no token, so neither the library nor the model may see its region.
    if (as_labels) std::erase_if(spans, [](const auto& s) { return s.second == 0; });
    std::size_t total = 0;
    for (const auto& s : spans) total += s.second;
    const auto before = snap();
    bool known = true;
    for (const auto& s : spans) known = known && s.first < m_.regions.size();
    if (known) {
      const outcome want_pool = pm_.append(0, total);
      const outcome got_pool = run_call([&] { pool_.append_tokens(0, total); });
      expect(got_pool, want_pool, "pool.append_tokens(0, " + std::to_string(total) + ")");
      check_unchanged_if_rejected(got_pool, before, "pool.append_tokens");
      if (got_pool != outcome::ok) return;
    }
    const std::size_t device_pages_before = m_.device_pages();
    const outcome want = m_.append(spans);
    std::string call = as_labels ? "append_tokens(" : "append(";
    for (const auto& s : spans) call += "{" + std::to_string(int{s.first}) + "," + std::to_string(s.second) + "}";
    call += ")";
    outcome got;
    if (as_labels) {
      std::vector<memdecay::region_id> labels;
      for (const auto& s : spans) labels.insert(labels.end(), s.second, s.first);
      got = run_call([&] { seq_.append_tokens(labels); });
    } else if (spans.size() == 1 && spans[0].second == 1) {
      got = run_call([&] { seq_.append(spans[0].first); });
    } else {
      std::vector<memdecay::region_span> rs;
      for (const auto& s : spans) rs.push_back({s.first, s.second});
      got = run_call([&] { seq_.append(rs); });
    }
    expect(got, want, call);
    check_unchanged_if_rejected(got, before, call);
    if (got == outcome::ok) retag_device_blocks(device_pages_before);
  }
  /// The engine writes the K/V of new pages into their blocks: each device block's tag is its page's origin.
  void retag_device_blocks(std::size_t from_device_page) {
    const auto table = pool_.block_table(0);
    for (std::size_t p = 0, d = 0; p < m_.num_pages(); ++p) {
      if (m_.on_host(p)) continue;
      if (d >= from_device_page && d < table.size()) device_kv_[static_cast<std::size_t>(table[d])] = m_.origin(p);
      ++d;
    }
  }
  void op_append_spans(reader& in) {
    std::vector<std::pair<std::uint8_t, std::size_t>> spans;
    const std::size_t n = 1 + in.u8() % 4;
    for (std::size_t k = 0; k < n; ++k) {
      const std::uint8_t r = region(in);
      std::size_t count = in.u8() % 4 == 0 ? in.u16() % 300 : in.u8() % 40;
      if (in.flip(32)) count = 0;
      spans.emplace_back(r, count);
    }
    clamp(spans);
    append_both(spans, false);
  }
  void op_append_labels(reader& in) {
    std::vector<std::pair<std::uint8_t, std::size_t>> spans;
    const std::size_t n = in.u8() % 24;
    for (std::size_t k = 0; k < n; ++k) spans.emplace_back(region(in), 1);
    clamp(spans);
    append_both(spans, true);
  }
  void clamp(std::vector<std::pair<std::uint8_t, std::size_t>>& spans) {
    std::size_t room = k_max_tokens > m_.kv_len() ? k_max_tokens - m_.kv_len() : 0;
    for (auto& s : spans) {
      s.second = std::min(s.second, room);
      room -= s.second;
    }
  }
  void op_advance(reader& in) {
    std::uint32_t step = m_.now;
    const std::uint8_t kind = in.u8();
    switch (kind % 8) {
      case 0: step = m_.now - 1 - in.u8() % 8; break;  // backwards (wraps up when now is 0: then it is forwards)
      case 1: step = m_.now; break;
      case 2: step = in.u32(); break;
      case 3: step = std::numeric_limits<std::uint32_t>::max() - in.u8(); break;
      default:
        step = m_.now + 1 + in.u8() % 64;
        if (step < m_.now) step = m_.now;
        break;
    }
    const auto before = snap();
    const outcome want = m_.advance_to(step);
    const outcome got = run_call([&] { seq_.advance_to(step); });
    expect(got, want, "advance_to(" + std::to_string(step) + ")");
    check_unchanged_if_rejected(got, before, "advance_to");
  }
  void op_observe_tokens(reader& in) {
    const auto mass = mass_vector(in, m_.device_len());  // observations cover the device tokens (docs/tiers.md)
    const auto before = snap();
    std::size_t want_refreshed = 0;  // x = scale * m > tau, with the scale of the state before the call
    for (Float m : mass) want_refreshed += m_.scale() * m > m_.tau ? 1 : 0;
    const outcome want = m_.observe_tokens(mass);
    std::size_t refreshed = 0;
    const outcome got = run_call([&] { refreshed = seq_.observe_tokens(mass); });
    expect(got, want,
           "observe_tokens(" + std::to_string(mass.size()) + " values, first " +
               (mass.empty() ? std::string("-") : std::to_string(mass[0])) + ")");
    check_unchanged_if_rejected(got, before, "observe_tokens");
    if (got == outcome::ok) FUZZ_CHECK(refreshed == want_refreshed, "observe_tokens: refreshed count");
  }
  void op_observe_pages(reader& in) {
    const auto mass = mass_vector(in, m_.device_pages());
    const auto before = snap();
    const outcome want = m_.observe_pages(mass);
    const outcome got = run_call([&] { (void)seq_.observe_pages(mass); });
    expect(got, want,
           "observe_pages(" + std::to_string(mass.size()) + " values, first " +
               (mass.empty() ? std::string("-") : std::to_string(mass[0])) + ")");
    check_unchanged_if_rejected(got, before, "observe_pages");
  }
  void op_observe_heads(reader& in) {
    // One or two heads, so that the reduction's summation order is unambiguous (a, or a + b).
    const Eigen::Index heads = 1 + in.u8() % 2;
    std::size_t cols = m_.device_len();
    if (in.flip(8)) cols = cols + 1;
    const bool mean = in.flip(2);
    Eigen::Matrix<Float, Eigen::Dynamic, Eigen::Dynamic> mat(heads, static_cast<Eigen::Index>(cols));
    for (Eigen::Index h = 0; h < heads; ++h) {
      const auto row = mass_vector(in, cols);
      for (std::size_t c = 0; c < cols; ++c) mat(h, static_cast<Eigen::Index>(c)) = c < row.size() ? row[c] : Float{0};
    }
    std::vector<Float> reduced(cols);
    for (std::size_t c = 0; c < cols; ++c) {
      Float s = mat(0, static_cast<Eigen::Index>(c));
      if (heads == 2) s = s + mat(1, static_cast<Eigen::Index>(c));
      reduced[c] = mean ? s / static_cast<Float>(heads) : s;
    }
    const auto before = snap();
    const outcome want = m_.observe_tokens(reduced);
    const outcome got = run_call(
        [&] { (void)seq_.observe_heads(mat, mean ? memdecay::head_reduction::mean : memdecay::head_reduction::sum); });
    expect(got, want, "observe_heads(" + std::to_string(heads) + "x" + std::to_string(cols) + ")");
    check_unchanged_if_rejected(got, before, "observe_heads");
  }

  /// observe_rows on 1-3 rows of f32, f16 or bf16 with 0-3 elements of padding per row (a leading dimension):
  /// exactly the model's observe_tokens of the widened rows summed in row order (times 1 / rows for a mean), or an
  /// input_error, changing nothing, for a buffer shorter than the shape, a token count other than kv_len, or an
  /// element that is not finite and >= 0 (also one the sum would hide).
  void op_observe_rows(reader& in) {
    const std::size_t rows = 1 + in.u8() % 3;
    const auto format = static_cast<memdecay::mass_format>(in.u8() % 3);
    const auto hf = format == memdecay::mass_format::f16 ? memdecay::half_format::f16 : memdecay::half_format::bf16;
    const std::size_t pad = in.u8() % 4;
    const bool mean = in.flip(2);
    const std::size_t tokens = m_.device_len() + (in.flip(16) ? 1 : 0);
    const bool short_buffer = in.flip(16) && tokens > 0;  // rows of no tokens read nothing: any buffer holds them
    const std::size_t stride = tokens + pad;
    std::vector<float> f32(rows * stride, 0.0f);
    std::vector<std::uint16_t> half(rows * stride, 0);
    std::vector<Float> reduced(tokens, Float{0});
    bool elements_ok = true;
    for (std::size_t r = 0; r < rows; ++r) {
      const auto row = mass_vector(in, tokens);
      for (std::size_t c = 0; c < tokens; ++c) {
        const float v = static_cast<float>(c < row.size() ? row[c] : Float{0});
        float w = v;  // the element as the library reads it back
        if (format == memdecay::mass_format::f32) {
          f32[r * stride + c] = v;
        } else {
          half[r * stride + c] = memdecay::simd::float_to_half(v, hf);
          w = memdecay::simd::half_to_float(half[r * stride + c], hf);
        }
        elements_ok = elements_ok && std::isfinite(w) && w >= 0.0f;
        reduced[c] = r == 0 ? static_cast<Float>(w) : reduced[c] + static_cast<Float>(w);
      }
    }
    if (mean)
      for (auto& x : reduced) x = x * (Float{1} / static_cast<Float>(rows));
    const std::size_t elements = rows * stride - (short_buffer ? pad + 1 : 0);
    const auto how = mean ? memdecay::head_reduction::mean : memdecay::head_reduction::sum;
    const auto before = snap();
    std::size_t want_refreshed = 0;
    for (Float m : reduced) want_refreshed += m_.scale() * m > m_.tau ? 1 : 0;
    const outcome want =
        short_buffer || tokens != m_.device_len() || !elements_ok ? outcome::input_error : m_.observe_tokens(reduced);
    std::size_t refreshed = 0;
    const outcome got = run_call([&] {
      const auto view =
          format == memdecay::mass_format::f32
              ? memdecay::attention_rows(std::span<const float>(f32.data(), elements), rows, tokens, stride, how)
              : memdecay::attention_rows(std::span<const std::uint16_t>(half.data(), elements), hf, rows, tokens,
                                         stride, how);
      refreshed = seq_.observe_rows(view);
    });
    expect(got, want,
           "observe_rows(" + std::to_string(rows) + "x" + std::to_string(tokens) + " " + memdecay::to_string(format) +
               ", stride " + std::to_string(stride) + ", " + std::to_string(elements) + " elements)");
    check_unchanged_if_rejected(got, before, "observe_rows");
    if (got == outcome::ok) FUZZ_CHECK(refreshed == want_refreshed, "observe_rows: refreshed count");
  }

  /// Checks a plan: exactly the model's selection rule applied to the library's page scores, and consistent with
  /// the model's own scores up to the scorer's tolerance (no victim clearly above a spared eligible page).
  void compare_plan(const plan_type& plan, std::size_t k, const std::vector<std::size_t>& prot,
                    const std::string& call) {
    trace(call + " -> " + std::to_string(plan.pages.size()) + " victims");
    const auto lib_scores = seq_.page_scores();
    const auto want = m_.select_with(lib_scores, k, prot);
    FUZZ_CHECK(plan.pages == want.pages, call + ": victims differ from the model's selection on the same scores");
    FUZZ_CHECK(plan.scores.size() == want.scores.size(), call + ": victim score count");
    for (std::size_t j = 0; j < want.scores.size(); ++j)
      FUZZ_CHECK(std::memcmp(&plan.scores[j], &want.scores[j], sizeof(Float)) == 0, call + ": victim scores");
    FUZZ_CHECK(plan.requested == want.requested, call + ": requested");
    FUZZ_CHECK(plan.pages_over_budget == want.over_budget, call + ": pages_over_budget");
    FUZZ_CHECK(plan.page_size == seq_.page_size(), call);
    FUZZ_CHECK(plan.generation == seq_.state().generation(), call);
    // The host tier's split of the victims (tier_model.hpp, on the same scores); select(0) chooses nothing.
    const auto split = k == 0 ? model_demotion{} : model_split(m_, want.pages, lib_scores);
    FUZZ_CHECK(plan.demoted == split.demoted, call + ": demoted victims differ from the model's");
    FUZZ_CHECK(plan.host_dropped == split.host_dropped, call + ": host-dropped pages differ from the model's");
    if (!plan.demoted.empty() || !plan.host_dropped.empty())
      trace("  demoted " + std::to_string(plan.demoted.size()) + ", host_dropped " +
            std::to_string(plan.host_dropped.size()));
    const auto status = seq_.page_statuses(prot);
    for (std::size_t p : plan.pages)
      FUZZ_CHECK(status[p] == memdecay::page_status::evictable,
                 call + ": victim " + std::to_string(p) + " is " + memdecay::to_string(status[p]));
    compare_statuses(call, prot);
    // Against the model's own scores: same count, and no spared eligible page clearly below a victim. s - tol(s)
    // and s + tol(s) both grow with s, so comparing the highest victim with the lowest spared page is enough.
    const auto model_scores = m_.page_scores();
    const auto own = m_.select_with(model_scores, k, prot);
    FUZZ_CHECK(own.pages.size() == plan.pages.size(), call + ": victim count differs from the model's");
    const auto mstatus = m_.statuses(prot);
    std::optional<std::size_t> highest_victim, lowest_spared;
    for (std::size_t p = 0; p < model_scores.size(); ++p) {
      if (mstatus[p] != model_status::evictable) continue;
      auto& slot = std::binary_search(plan.pages.begin(), plan.pages.end(), p) ? highest_victim : lowest_spared;
      const bool victim = &slot == &highest_victim;
      if (!slot || (victim ? model_scores[p] > model_scores[*slot] : model_scores[p] < model_scores[*slot])) slot = p;
    }
    if (highest_victim && lowest_spared) {
      const Float v = model_scores[*highest_victim], u = model_scores[*lowest_spared];
      FUZZ_CHECK(!(u + tolerance(u) < v - tolerance(v)),
                 call + ": page " + std::to_string(*lowest_spared) + " (model score " + std::to_string(u) +
                     ") was spared, victim " + std::to_string(*highest_victim) + " scores " + std::to_string(v));
    }
  }

  void op_select(reader& in) {
    static const std::size_t ks[] = {0, 1, 2, 3, 5, 8, 1000, std::numeric_limits<std::size_t>::max()};
    const std::size_t k = in.pick(ks);
    const auto prot = protected_pages(in);
    const auto before = snap();
    plan_type plan;
    const outcome got = run_call([&] { plan = seq_.select(k, prot); });
    expect(got, outcome::ok, "select(" + std::to_string(k) + ")");
    FUZZ_CHECK(snap() == before, "select changed the state");
    compare_plan(plan, k, prot, "select");
    remember(plan);
  }
  /// select_for_budget(prot): never fails, changes nothing, and gives the model's plan.
  plan_type budget_plan(const std::vector<std::size_t>& prot) {
    const auto before = snap();
    plan_type plan;
    const outcome got = run_call([&] { plan = seq_.select_for_budget(prot); });
    expect(got, outcome::ok, "select_for_budget()");
    FUZZ_CHECK(snap() == before, "select_for_budget changed the state");
    compare_plan(plan, m_.budget_request(), prot, "select_for_budget");
    return plan;
  }
  void op_select_for_budget(reader& in) {
    const auto prot = protected_pages(in);
    const auto plan = budget_plan(prot);
    const std::size_t k = m_.budget_request();
    // Budget held when feasible: with enough evictable pages the plan reaches the low watermark.
    const auto want = m_.select_with(m_.page_scores(), k, prot);
    const auto [high, low] = m_.watermarks();
    if (want.eligible >= want.requested) {
      const std::uint64_t after = m_.device_len() - plan.pages.size() * m_.P;
      FUZZ_CHECK(m_.device_len() <= high || after <= low, "a feasible budget plan leaves the device above low");
      FUZZ_CHECK(plan.pages_over_budget == 0, "a feasible budget plan reports pages over budget");
    }
    remember(plan);
    // Usually commit it right away, as an engine does.
    if (in.u8() % 4 != 0) commit(plan, in.u8() % 3 == 0 ? commit_path::no_table : commit_path::pool, "commit(budget)");
  }
  void remember(const plan_type& plan) {
    older_ = last_;
    last_ = plan;
  }

  enum class commit_path { pool, no_table, wrong_page_size, extra_tokens, fewer_tokens, not_open, pool_store };
  /// Commits an eviction plan through one of the paths and checks it against the model: with a host tier the
  /// device table loses every page leaving the device (demoted or dropped), at its device index, and a host store
  /// (commit_path::pool_store) receives the demoted pages' K/V first and releases the host-dropped pages' copies.
  /// `fault`: the store's copy that throws (tests the undo), only on a commit the model accepts.
  void commit(const plan_type& plan, commit_path path, const std::string& call, int fault = -1) {
    const auto before = snap();
    outcome want = m_.check_plan(plan.generation, plan.page_size, plan.pages, plan.demoted, plan.host_dropped);
    // The host budget holds at every commit: a plan may not leave more pages on the host than it holds.
    if (want == outcome::ok && m_.tier &&
        m_.host_pages() - plan.host_dropped.size() + plan.demoted.size() >
            model_host_capacity(m_.tier->cfg, m_.P, m_.logical_len))
      want = outcome::usage_error;
    std::vector<std::size_t> device;  // the plan's pages in the device table (a checked plan names device pages)
    std::vector<std::uint64_t> demoted_origins, dropped_origins;
    if (want == outcome::ok) {
      for (std::size_t p : plan.pages) device.push_back(m_.device_index(p));
      for (std::size_t p : plan.demoted) demoted_origins.push_back(m_.origin(p));
      for (std::size_t p : plan.host_dropped) dropped_origins.push_back(m_.origin(p));
    }
    const bool uses_store = path == commit_path::pool_store && m_.tier.has_value();  // without a tier: unused
    outcome got = outcome::ok;
    bool faulted = false;
    switch (path) {
      case commit_path::pool: got = run_call([&] { seq_.commit(plan, pool_, 0); }); break;
      case commit_path::pool_store:
        if (want == outcome::ok && uses_store) want = ms_.check_to_host(demoted_origins);
        arm_fault(want == outcome::ok && uses_store ? fault : -1);
        got = run_call([&] {
          try {
            seq_.commit(plan, pool_, 0, *store_);
          } catch (const injected_fault&) {
            faulted = true;
          }
        });
        arm_fault(-1);
        break;
      case commit_path::no_table:
        got = run_call([&] { seq_.commit(plan); });
        if (got == outcome::ok) pool_.remove_pages(0, device);  // the engine removes the same pages from its table
        break;
      default: {
        // A second table that disagrees with the sequence in one way. The sequence must reject or apply the
        // plan exactly as the documentation says; the main pool then follows an accepted plan.
        const std::size_t P = m_.P;
        const std::size_t ps = path == commit_path::wrong_page_size ? P * 2 : P;
        std::size_t tokens = m_.device_len();
        if (path == commit_path::extra_tokens) tokens += 1 + (P > 1 ? (P - 1) / 2 : 0);
        if (path == commit_path::fewer_tokens) tokens = tokens ? tokens - 1 : 0;
        pool_type other((tokens + ps - 1) / ps + 1, ps);
        if (path != commit_path::not_open) {
          other.open(0);
          other.append_tokens(0, tokens);
        }
        if (want == outcome::ok) {
          const std::size_t other_pages = (tokens + ps - 1) / ps;
          if (path == commit_path::not_open || ps != P || other_pages != m_.device_pages()) {
            want = outcome::usage_error;
          } else {
            for (std::size_t d : device)
              if ((d + 1) * P > tokens) want = outcome::usage_error;
          }
        }
        got = run_call([&] { seq_.commit(plan, other, 0); });
        if (got == outcome::ok) {
          FUZZ_CHECK(other.num_pages(0) == m_.device_pages() - plan.pages.size(), call + ": other table not updated");
          pool_.remove_pages(0, device);
        }
        break;
      }
    }
    expect(got, want,
           call + " path " + std::to_string(static_cast<int>(path)) + " of " + std::to_string(plan.pages.size()) +
               " pages" +
               (m_.tier ? " (" + std::to_string(plan.demoted.size()) + " demoted, " +
                              std::to_string(plan.host_dropped.size()) + " host-dropped)"
                        : std::string()) +
               " at generation " + std::to_string(plan.generation) + (faulted ? ", the store's copy failed" : ""));
    check_unchanged_if_rejected(got, before, call);
    if (faulted) {
      FUZZ_CHECK(snap() == before, call + ": a failed copy to the host changed the state");
      return;
    }
    if (got != outcome::ok) return;
    FUZZ_CHECK(pm_.remove(0, device) == outcome::ok, "pool model remove");
    if (uses_store) {
      ms_.to_host(demoted_origins);
      ms_.release(dropped_origins);
    }
    m_.commit_plan(plan.pages, plan.demoted, plan.host_dropped);
  }
  void op_commit(reader& in) {
    if (!last_) {
      plan_type empty;
      empty.page_size = m_.P;
      empty.generation = in.flip(2) ? m_.generation : m_.generation + 1;
      commit(empty, commit_path::pool, "commit(empty forged)");
      return;
    }
    plan_type plan = in.flip(4) && older_ ? *older_ : *last_;
    const std::uint8_t forge = in.u8();
    switch (forge % 12) {
      case 0:
      case 1:
      case 2: break;                                   // as selected (maybe stale)
      case 3: plan.generation = m_.generation; break;  // refreshed generation: content decides
      case 4: plan.generation += 1; break;
      case 5: plan.page_size *= 2; break;
      case 6:
        if (!plan.pages.empty()) plan.pages.push_back(plan.pages.back());
        break;  // duplicate
      case 7: std::reverse(plan.pages.begin(), plan.pages.end()); break;
      case 8: plan.pages.push_back(m_.num_pages()); break;                           // out of range
      case 9: plan.pages.push_back(m_.num_pages() ? m_.num_pages() - 1 : 0); break;  // maybe partial / recent
      default: {  // forged content at the current generation: random ascending pages, pinned and protected ones too
        plan.generation = m_.generation;
        plan.pages.clear();
        const std::size_t n = in.u8() % 4;
        for (std::size_t k = 0; k < n && m_.num_pages(); ++k) plan.pages.push_back(in.u8() % m_.num_pages());
        std::sort(plan.pages.begin(), plan.pages.end());
        if (in.flip(2)) plan.pages.erase(std::unique(plan.pages.begin(), plan.pages.end()), plan.pages.end());
        break;
      }
    }
    static const commit_path paths[] = {
        commit_path::pool,         commit_path::pool,         commit_path::no_table, commit_path::wrong_page_size,
        commit_path::extra_tokens, commit_path::fewer_tokens, commit_path::not_open};
    commit(plan, in.pick(paths), "commit(forge " + std::to_string(forge % 12) + ")");
  }

  /// Pool-only sequences 1..3: opens, closes, appends (including impossible sizes) and bad removals.
  void op_pool(reader& in) {
    const std::uint64_t id = 1 + in.u8() % 3;
    const auto before = snap();
    const std::uint8_t what = in.u8() % 6;
    outcome want = outcome::ok, got = outcome::ok;
    std::string call;
    switch (what) {
      case 0:
        want = pm_.open(id);
        got = run_call([&] { pool_.open(id); });
        call = "pool.open(" + std::to_string(id) + ")";
        break;
      case 1:
        want = pm_.close(id);
        got = run_call([&] { pool_.close(id); });
        call = "pool.close(" + std::to_string(id) + ")";
        break;
      case 2:
      case 3: {
        static const std::size_t sizes[] = {0,
                                            1,
                                            5,
                                            16,
                                            17,
                                            64,
                                            200,
                                            100000,
                                            std::numeric_limits<std::size_t>::max(),
                                            std::numeric_limits<std::size_t>::max() - 3};
        const std::size_t n = in.pick(sizes);
        want = pm_.append(id, n);
        got = run_call([&] { pool_.append_tokens(id, n); });
        call = "pool.append_tokens(" + std::to_string(id) + ", " + std::to_string(n) + ")";
        break;
      }
      case 4: {
        std::vector<std::size_t> pages;
        const std::size_t n = in.u8() % 4;
        for (std::size_t k = 0; k < n; ++k) pages.push_back(in.u8() % 8);
        want = pm_.remove(id, pages);
        got = run_call([&] { (void)pool_.remove_pages(id, pages); });
        call = "pool.remove_pages(" + std::to_string(id) + ", " + std::to_string(n) + " pages)";
        break;
      }
      default: {
        const std::size_t index = in.u8() % 8;
        const auto* s = pm_.find(id);
        want = !s || index >= s->blocks.size() ? outcome::usage_error : outcome::ok;
        std::int32_t block = -1;
        got = run_call([&] { block = pool_.page_at(id, index); });
        if (got == outcome::ok && want == outcome::ok) FUZZ_CHECK(block == s->blocks[index], "page_at");
        call = "pool.page_at(" + std::to_string(id) + ", " + std::to_string(index) + ")";
        break;
      }
    }
    expect(got, want, call);
    if (got != outcome::ok) {
      FUZZ_CHECK(snap() == before, call + " was rejected but changed the pool");
    } else {
      FUZZ_CHECK(seq_.digest() == before.digest, call + " changed the sequence");
    }
  }

  /// Read-only calls with bad arguments.
  void op_queries(reader& in) {
    const auto before = snap();
    const std::size_t page = in.u8() % (m_.num_pages() + 2);
    const outcome want = page < m_.num_pages() ? outcome::ok : outcome::input_error;
    memdecay::page_explanation<Float> e{};
    const outcome got = run_call([&] { e = seq_.explain_page(page); });
    expect(got, want, "explain_page(" + std::to_string(page) + ")");
    if (got == outcome::ok) {
      const auto statuses = m_.statuses({});
      FUZZ_CHECK(static_cast<int>(e.status) == static_cast<int>(statuses[page]), "explain_page status");
      FUZZ_CHECK(e.tokens == m_.page_count(page), "explain_page tokens");
      FUZZ_CHECK(e.first_position == m_.tokens[page * m_.P].position, "explain_page position");
    }
    std::vector<Float> out(m_.num_pages() + (in.flip(2) ? 1 : 0));
    const outcome got2 = run_call([&] { seq_.page_scores(std::span<Float>(out)); });
    expect(got2, out.size() == m_.num_pages() ? outcome::ok : outcome::input_error, "page_scores(out)");
    FUZZ_CHECK(snap() == before, "a const call changed the state");
  }

  /// Page digests and the attention-free signal: enable a random layout (or keep the one enabled, or disable it),
  /// digest some pages from keys (good, non-finite or beyond the storage's range), then observe a query (right or
  /// wrong length, or non-finite), which must be exactly observe_pages of estimate_query_attention for the model.
  /// The digests stay across calls: commits must take them with their pages (compare_all) and snapshots must
  /// carry them (op_snapshot's digest comparison). Every digest change is a new generation, in the model too.
  void op_digests(reader& in) {
    if (seq_.has_digests() && in.flip(4)) {
      seq_.disable_digests();
      ++m_.generation;
      return;
    }
    if (!seq_.has_digests() || in.flip(8)) {
      const std::size_t kv = 1 + in.u8() % 2, dim = 1 + in.u8() % 5, group = 1 + in.u8() % 2;
      const auto storage = static_cast<memdecay::digest_storage>(in.u8() % 3);
      const auto kind = in.flip(4) ? memdecay::digest_kind::mean_key : memdecay::digest_kind::min_max;
      seq_.enable_digests(
          {.kv_heads = kv, .head_dim = dim, .query_heads = kv * group, .kind = kind, .storage = storage});
      ++m_.generation;
    }
    const auto& layout = seq_.digests().layout();
    const std::size_t kv = layout.kv_heads, dim = layout.head_dim, group = layout.effective_query_heads() / kv;
    const auto storage = layout.storage;
    const auto kind = layout.kind;
    const float values[] = {0.0f,
                            1.0f,
                            -2.5f,
                            0.125f,
                            1e5f,
                            -1e5f,
                            65504.0f,
                            3.4e38f,
                            -3.4e38f,
                            1e-8f,
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity()};
    const std::size_t row = kv * dim;
    for (std::size_t p = 0; p < seq_.num_pages() && p < 8; ++p) {
      if (!in.flip(2)) continue;
      std::vector<float> keys(row * (1 + in.u8() % 3));
      for (auto& k : keys)
        k = in.flip(3) ? in.pick(values) : static_cast<float>(static_cast<std::int8_t>(in.u8())) / 16;
      if (in.flip(16)) keys.pop_back();  // a length that is not whole tokens
      // Rejected: a wrong length, a non-finite key, or a stored value beyond the storage's range.
      bool ok = !keys.empty() && keys.size() % row == 0;
      const double limit = storage == memdecay::digest_storage::f16    ? 65504.0
                           : storage == memdecay::digest_storage::bf16 ? 3.3895313892515355e38
                                                                       : std::numeric_limits<double>::infinity();
      // A min/max digest stores keys' extremes, so every key must fit the storage; a mean-key digest only the mean
      // (checked below: a key of -1e5 among small ones has an f16 mean).
      for (float k : keys)
        ok = ok && std::isfinite(k) && (kind == memdecay::digest_kind::mean_key || std::abs(double{k}) <= limit);
      if (ok && kind == memdecay::digest_kind::mean_key && storage != memdecay::digest_storage::f32) {
        const std::size_t tokens = keys.size() / row;
        for (std::size_t i = 0; i < row && ok; ++i) {
          double sum = 0;
          for (std::size_t t = 0; t < tokens; ++t) sum += keys[t * row + i];
          const float mean = static_cast<float>(sum / static_cast<double>(tokens));
          const auto fmt =
              storage == memdecay::digest_storage::f16 ? memdecay::half_format::f16 : memdecay::half_format::bf16;
          ok = std::isfinite(memdecay::simd::half_to_float(memdecay::simd::float_to_half(mean, fmt), fmt));
        }
      }
      const std::uint64_t before = seq_.digest();
      const outcome got = run_call([&] { seq_.set_page_keys(p, keys); });
      expect(got, ok ? outcome::ok : outcome::input_error, "set_page_keys(" + std::to_string(keys.size()) + ")");
      if (got != outcome::ok) FUZZ_CHECK(seq_.digest() == before, "a rejected digest changed the sequence");
      if (got == outcome::ok) {
        FUZZ_CHECK(seq_.digests().has_digest(p), "a digest that was set is missing");
        ++m_.generation;
      }
    }
    std::vector<float> query(kv * group * dim);
    for (auto& q : query) q = static_cast<float>(static_cast<std::int8_t>(in.u8())) / 32;
    if (in.flip(8)) query.push_back(1.0f);
    if (!query.empty() && in.flip(8)) query[in.u8() % query.size()] = std::numeric_limits<float>::quiet_NaN();
    bool query_ok = query.size() == kv * group * dim;
    for (float q : query) query_ok = query_ok && std::isfinite(q);
    const auto before = snap();
    std::vector<Float> estimate;
    const outcome estimated = run_call([&] { estimate = seq_.estimate_query_attention(query); });
    expect(estimated, query_ok ? outcome::ok : outcome::input_error, "estimate_query_attention");
    if (estimated == outcome::ok) {
      double sum = 0;
      for (Float m : estimate) {
        FUZZ_CHECK(std::isfinite(m) && m >= 0, "an estimated page mass is negative or not finite");
        sum += static_cast<double>(m);
      }
      if (!estimate.empty()) FUZZ_CHECK(std::abs(sum - 1.0) < 1e-3, "the estimate does not sum to 1");
      const outcome want = m_.observe_pages(estimate);
      const outcome got = run_call([&] { (void)seq_.observe_query(query); });
      expect(got, want, "observe_query");
      check_unchanged_if_rejected(got, before, "observe_query");
    } else {
      const outcome got = run_call([&] { (void)seq_.observe_query(query); });
      expect(got, outcome::input_error, "observe_query of a bad query");
      check_unchanged_if_rejected(got, before, "observe_query");
    }
  }

  /// save, then load: intact into a new sequence that replaces the fuzzed one (every later call is compared with
  /// the model, so the load must be bit-identical), or with a flipped bit or truncated into the fuzzed sequence
  /// itself (rejected with an input_error, nothing changed).
  void op_snapshot(reader& in) {
    const auto before = snap();
    std::vector<std::byte> bytes;
    const outcome saved = run_call([&] { bytes = memdecay::snapshot::save(seq_); });
    FUZZ_CHECK(saved == outcome::ok, "snapshot::save failed");
    const std::uint8_t how = in.u8() % 3;
    if (how == 0) {
      std::optional<seq_type> twin;
      const outcome got = run_call([&] {
        twin.emplace(seq_.get_config());
        memdecay::snapshot::load(*twin, bytes);
      });
      FUZZ_CHECK(got == outcome::ok, "snapshot::load of an intact snapshot failed");
      FUZZ_CHECK(twin->digest() == seq_.digest(), "a loaded sequence has another digest");
      FUZZ_CHECK(memdecay::snapshot::save(*twin) == bytes, "a loaded sequence saves other bytes");
      seq_ = std::move(*twin);
      FUZZ_CHECK(snap() == before, "the loaded sequence differs from the saved one");
      return;
    }
    if (how == 1) {
      const std::size_t bit = in.u32() % (8 * bytes.size());
      bytes[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
    } else {
      bytes.resize(in.u32() % bytes.size());
    }
    const outcome got = run_call([&] { memdecay::snapshot::load(seq_, bytes); });
    expect(got, outcome::input_error, how == 1 ? "snapshot::load(a flipped bit)" : "snapshot::load(truncated)");
    FUZZ_CHECK(snap() == before, "a rejected snapshot changed the sequence");
  }

  // --- the host tier (tier_model.hpp, docs/tiers.md) ------------------------------------------------------------
  /// The tag of a block or host slot that holds no page's K/V.
  static constexpr std::uint64_t k_no_kv = std::numeric_limits<std::uint64_t>::max();
  /// The engine's copy engine for the host store: moves one page's K/V tag, and throws at the armed copy.
  void copy_page(memdecay::copy_direction dir, std::int32_t block, std::size_t slot) {
    if (fault_countdown_ == 0) {
      fault_countdown_ = -1;
      throw injected_fault{};
    }
    if (fault_countdown_ > 0) --fault_countdown_;
    auto& d = device_kv_[static_cast<std::size_t>(block)];
    if (dir == memdecay::copy_direction::to_host)
      host_kv_[slot] = d;
    else
      d = host_kv_[slot];
  }
  struct copier {
    harness* h;
    void operator()(memdecay::copy_direction dir, const std::int32_t& block, std::size_t slot) const {
      h->copy_page(dir, block, slot);
    }
  };
  using store_type = memdecay::host_block_store<std::uint64_t, std::int32_t, copier>;
  void arm_fault(int n) { fault_countdown_ = n; }
  /// The host store is made at its first use, with 0-64 slots (a small one runs out: a short count).
  void ensure_store(reader& in) {
    if (store_) return;
    static const std::size_t capacities[] = {64, 4, 2, 8, 0, 16};
    const std::size_t capacity = in.pick(capacities);
    store_.emplace(capacity, copier{this});
    ms_.init(capacity);
    host_kv_.assign(capacity, k_no_kv);
    trace("host_block_store(" + std::to_string(capacity) + " slots)");
  }

  /// Tier operations (opcode 0xDF or 0xEF, then a byte): enable / disable the tier, select and commit a recall,
  /// digest every full page, demote through the host store (or a forged plan), bad calls, forged recall plans.
  void op_tier(reader& in) {
    switch (in.u8() % 8) {
      case 0: op_enable_tier(in); break;
      case 1: op_disable_tier(); break;
      case 2:
      case 3: op_recall(in); break;
      case 4: op_digest_pages(in); break;
      case 5: op_demote(in); break;
      case 6: op_tier_bad_calls(in); break;
      default: op_recall_forged(in); break;
    }
  }

  void op_enable_tier(reader& in) {
    static const double token_highs[] = {0, 16, 48, 64, 256, 1e300};
    static const double priorities[] = {0.0, 0.35, 0.45, 0.5, 0.7, 1.0, 2.0, -1.0};
    const drawn_tier d =
        draw_tier(in, {.token_highs = token_highs, .priorities = priorities, .displace_from_own_byte = false});
    const model_tier_config& c = d.model;
    const auto before = snap();
    // Enabling again may not shrink the host budget below the pages on the host (no plan could keep it within).
    const bool shrinks_below = m_.tier && d.valid() && model_host_capacity(c, m_.P, m_.logical_len) < m_.host_pages();
    const outcome want = d.valid() && !shrinks_below ? outcome::ok : outcome::config_error;
    const outcome got = run_call([&] { seq_.enable_host_tier(d.library); });
    expect(got, want, "enable_host_tier(" + d.describe() + ")");
    check_unchanged_if_rejected(got, before, "enable_host_tier");
    if (got != outcome::ok) return;
    if (m_.tier) {
      m_.tier->cfg = c;  // new rules, every page where it is
    } else {
      model_tier t;
      t.cfg = c;
      t.on_host.assign(m_.num_pages(), 0);
      t.recalled_at.assign(m_.num_pages(), model_tier::never);
      m_.tier = std::move(t);
    }
    ++m_.generation;
  }

  void op_disable_tier() {
    const auto before = snap();
    const outcome want = m_.hosting() ? outcome::usage_error : outcome::ok;
    const outcome got = run_call([&] { seq_.disable_host_tier(); });
    expect(got, want, "disable_host_tier() with " + std::to_string(m_.host_pages()) + " host pages");
    check_unchanged_if_rejected(got, before, "disable_host_tier");
    if (got == outcome::ok && m_.tier) {
      m_.tier.reset();
      ++m_.generation;
    }
  }

  /// Digests every full page that has none (keys, or a min/max digest given directly, sometimes with a channel
  /// whose minimum exceeds its maximum or a NaN: an input_error that changes nothing), enabling f32/f16 digests
  /// first when there are none; then maybe observes a query (the attention-free signal over the device pages).
  void op_digest_pages(reader& in) {
    if (!seq_.has_digests() || in.flip(16)) {
      const std::size_t kv = 1 + in.u8() % 2, dim = 1 + in.u8() % 4, group = 1 + in.u8() % 2;
      const auto kind = in.flip(3) ? memdecay::digest_kind::mean_key : memdecay::digest_kind::min_max;
      const auto storage = in.flip(2) ? memdecay::digest_storage::f32 : memdecay::digest_storage::f16;
      seq_.enable_digests(
          {.kv_heads = kv, .head_dim = dim, .query_heads = kv * group, .kind = kind, .storage = storage});
      ++m_.generation;
      trace("enable_digests(" + std::to_string(kv) + "x" + std::to_string(dim) + ", group " + std::to_string(group) +
            ")");
    }
    const auto& layout = seq_.digests().layout();
    const std::size_t row = layout.kv_heads * layout.head_dim;
    const bool min_max = layout.kind == memdecay::digest_kind::min_max;
    auto value = [&] { return static_cast<float>(static_cast<std::int8_t>(in.u8())) / 8; };
    for (std::size_t p = 0; p < m_.num_pages() && p < 256; ++p) {
      if (m_.page_count(p) != m_.P || seq_.digests().has_digest(p)) continue;
      const auto before = snap();
      outcome want = outcome::ok, got;
      std::string call;
      if (min_max && in.flip(2)) {
        std::vector<float> lo(row), hi(row);
        for (std::size_t c = 0; c < row; ++c) {
          const float a = value(), b = value();
          lo[c] = std::min(a, b), hi[c] = std::max(a, b);
        }
        const std::uint8_t bad = in.u8() % 16;
        if (bad == 0 && lo[0] != hi[0]) std::swap(lo[0], hi[0]), want = outcome::input_error;
        if (bad == 1) hi[row - 1] = std::numeric_limits<float>::quiet_NaN(), want = outcome::input_error;
        got = run_call([&] { seq_.set_page_digest(p, lo, hi); });
        call = "set_page_digest(" + std::to_string(p) + ")";
      } else {
        std::vector<float> keys(row * (1 + in.u8() % 4));
        for (auto& k : keys) k = value();
        got = run_call([&] { seq_.set_page_keys(p, keys); });
        call = "set_page_keys(" + std::to_string(p) + ")";
      }
      expect(got, want, call);
      check_unchanged_if_rejected(got, before, call);
      if (got == outcome::ok) ++m_.generation;
    }
    if (in.flip(2)) observe_query_checked(make_query(in));
  }
  /// A query for the digests' layout (query_heads x head_dim), sometimes one value too long or short, or with a NaN.
  std::vector<float> make_query(reader& in) {
    std::size_t len = 4;
    if (seq_.has_digests()) len = seq_.digests().layout().effective_query_heads() * seq_.digests().layout().head_dim;
    const std::uint8_t shape = in.u8() % 16;
    if (shape == 0) len += 1;
    if (shape == 1 && len > 0) len -= 1;
    std::vector<float> q(len);
    for (auto& x : q) x = static_cast<float>(static_cast<std::int8_t>(in.u8())) / 16;
    if (!q.empty() && in.flip(16)) q[in.u8() % q.size()] = std::numeric_limits<float>::quiet_NaN();
    return q;
  }
  bool query_fits(const std::vector<float>& q) const {
    if (!seq_.has_digests()) return false;
    const auto& l = seq_.digests().layout();
    if (q.size() != l.effective_query_heads() * l.head_dim) return false;
    return std::all_of(q.begin(), q.end(), [](float x) { return std::isfinite(x); });
  }
  /// observe_query: exactly the model's observe_pages of estimate_query_attention (one entry per device page).
  void observe_query_checked(const std::vector<float>& query) {
    const auto before = snap();
    std::vector<Float> estimate;
    const outcome estimated = run_call([&] { estimate = seq_.estimate_query_attention(query); });
    expect(estimated, query_fits(query) ? outcome::ok : outcome::input_error, "estimate_query_attention");
    FUZZ_CHECK(snap() == before, "estimate_query_attention changed the state");
    if (estimated == outcome::ok)
      FUZZ_CHECK(estimate.size() == m_.device_pages(), "the estimate does not cover the device pages");
    const outcome want = estimated == outcome::ok ? m_.observe_pages(estimate) : outcome::input_error;
    const outcome got = run_call([&] { (void)seq_.observe_query(query); });
    expect(got, want,
           "observe_query(" + std::to_string(query.size()) + ") over " + std::to_string(m_.device_pages()) +
               " device pages");
    check_unchanged_if_rejected(got, before, "observe_query");
  }

  /// select_recall(query, protected, head rule) checked against the model, then committed (or not) by one of the
  /// paths. Bit 3 of `how` picks a head rule other than the best head's (bit 4 then: the estimated attention mass,
  /// else the mean); the model ranks pages by the same combination of the per-head bounds, specified below.
  void op_recall(reader& in) {
    const std::uint8_t how = in.u8();
    const memdecay::head_bounds rule = (how & 0x08) == 0   ? memdecay::head_bounds::max
                                       : (how & 0x10) != 0 ? memdecay::head_bounds::attention
                                                           : memdecay::head_bounds::mean;
    const auto query = make_query(in);
    const auto prot = protected_pages(in);
    const auto before = snap();
    const outcome want = !m_.tier              ? outcome::usage_error
                         : !seq_.has_digests() ? outcome::usage_error
                         : !query_fits(query)  ? outcome::input_error
                                               : outcome::ok;
    memdecay::recall_plan plan;
    const outcome got = run_call([&] { plan = seq_.select_recall(query, prot, rule); });
    expect(got, want, "select_recall(" + std::to_string(query.size()) + ")");
    FUZZ_CHECK(snap() == before, "select_recall changed the state");
    if (got != outcome::ok) return;
    const std::size_t heads = seq_.digests().layout().effective_query_heads(), n = m_.num_pages();
    std::vector<float> bounds(heads * n);
    seq_.query_page_bounds(query, bounds);
    const std::vector<float> best = combined_bounds(bounds, heads, n, rule);
    std::vector<bool> has_digest(n);
    for (std::size_t p = 0; p < n; ++p) has_digest[p] = seq_.digests().has_digest(p);
    compare_recall(plan, best, has_digest, prot, "select_recall");
    remember_recall(plan);
    static const recall_path paths[] = {recall_path::none, recall_path::pool,       recall_path::pool,
                                        recall_path::pool, recall_path::pool_store, recall_path::pool_store,
                                        recall_path::bare, recall_path::check_only};
    const recall_path path = paths[how % 8];
    if (path == recall_path::pool_store) ensure_store(in);
    const int fault = (how & 0x30) == 0 ? (how >> 6) : -1;
    if (path != recall_path::none) commit_recall(plan, path, "commit_recall(fresh)", fault);
  }
  void remember_recall(const memdecay::recall_plan& plan) {
    older_recall_ = last_recall_;
    last_recall_ = plan;
  }
  /// A recall plan against the model's decision on the same bounds, and the conformance suite's properties.
  void compare_recall(const memdecay::recall_plan& plan, const std::vector<float>& best,
                      const std::vector<bool>& has_digest, const std::vector<std::size_t>& prot,
                      const std::string& call) {
    trace(call + " -> promote " + std::to_string(plan.promote.size()) + ", demote " +
          std::to_string(plan.demote.size()) + ", drop " + std::to_string(plan.drop.size()));
    const auto want = model_select_recall(m_, best, has_digest, prot, seq_.page_scores());
    FUZZ_CHECK(plan.promote == want.promote, call + ": promotions differ from the model's");
    FUZZ_CHECK(plan.demote == want.demote, call + ": demotions differ from the model's");
    FUZZ_CHECK(plan.drop == want.drop, call + ": drops differ from the model's");
    FUZZ_CHECK(plan.promote_bounds.size() == want.promote_bounds.size(), call + ": promote_bounds");
    for (std::size_t k = 0; k < want.promote_bounds.size(); ++k)
      FUZZ_CHECK(std::memcmp(&plan.promote_bounds[k], &want.promote_bounds[k], sizeof(float)) == 0,
                 call + ": promote_bounds");
    FUZZ_CHECK(plan.page_size == m_.P && plan.generation == m_.generation, call + ": page size or generation");
    // tier_conformance_test's properties, independent of the decision rule's details.
    const auto& rules = m_.tier->cfg;
    const auto status = m_.statuses(prot);
    FUZZ_CHECK(plan.promote.size() <= rules.max_recall_pages, call + ": more promotions than max_recall_pages");
    FUZZ_CHECK(plan.demote.size() + plan.drop.size() <= plan.promote.size(),
               call + ": displaces more than it promotes");
    for (std::size_t p : plan.promote) FUZZ_CHECK(m_.on_host(p) && has_digest[p], call + ": promotes a device page");
    std::vector<std::size_t> displaced;
    std::merge(plan.demote.begin(), plan.demote.end(), plan.drop.begin(), plan.drop.end(),
               std::back_inserter(displaced));
    for (std::size_t p : plan.demote)
      FUZZ_CHECK(status[p] == model_status::evictable && model_worthy(m_, p),
                 call + ": demotes page " + std::to_string(p));
    for (std::size_t p : plan.drop)
      FUZZ_CHECK(status[p] == model_status::evictable && !model_worthy(m_, p),
                 call + ": drops page " + std::to_string(p));
    for (float b : plan.promote_bounds)
      for (std::size_t d : displaced)
        FUZZ_CHECK(static_cast<double>(b) > static_cast<double>(best[d]) + rules.hysteresis,
                   call + ": a promotion does not beat a page it displaces by the hysteresis");
    if (plan.promote.size() > displaced.size())
      FUZZ_CHECK(m_.device_len() + (plan.promote.size() - displaced.size()) * m_.P <= m_.watermarks().first,
                 call + ": recall beyond the device budget");
    // The host tier never holds more than its budget, so a fresh plan always commits.
    FUZZ_CHECK(m_.host_pages() <= model_host_capacity(rules, m_.P, m_.logical_len),
               call + ": the host tier holds more than its budget");
    FUZZ_CHECK(model_check_recall(m_, plan.generation, plan.page_size, want) == outcome::ok,
               call + ": the model rejects a fresh recall plan");
  }

  enum class recall_path { none, pool, pool_store, bare, check_only };
  /// commit_recall through the device table (block_pool::insert_pages), the table and a host store (maybe with an
  /// injected fault), no table (the fuzzer then changes its table as the engine would), or check_recall alone.
  void commit_recall(const memdecay::recall_plan& plan, recall_path path, const std::string& call, int fault = -1) {
    const auto before = snap();
    const model_recall mp{plan.promote, plan.demote, plan.drop, plan.promote_bounds};
    outcome want = model_check_recall(m_, plan.generation, plan.page_size, mp);
    std::vector<std::size_t> displaced;
    std::vector<std::uint64_t> promoted_o, demoted_o, dropped_o, displaced_o;
    const std::size_t n = plan.promote.size();
    const bool insert_first = pm_.free.size() >= n;
    if (want == outcome::ok) {
      std::merge(plan.demote.begin(), plan.demote.end(), plan.drop.begin(), plan.drop.end(),
                 std::back_inserter(displaced));
      for (std::size_t p : plan.promote) promoted_o.push_back(m_.origin(p));
      for (std::size_t p : plan.demote) demoted_o.push_back(m_.origin(p));
      for (std::size_t p : plan.drop) dropped_o.push_back(m_.origin(p));
      for (std::size_t p : displaced) displaced_o.push_back(m_.origin(p));
      const bool fits = insert_first || pm_.free.size() + displaced.size() >= n;
      if (path == recall_path::bare && !fits) path = recall_path::pool;  // the engine's table could not follow
      if ((path == recall_path::pool || path == recall_path::pool_store) && !fits) want = outcome::input_error;
      if (want == outcome::ok && path == recall_path::pool_store) {
        want = ms_.check_to_host(insert_first ? demoted_o : displaced_o);
        if (want == outcome::ok) want = ms_.check_to_device(promoted_o);
      }
    }
    memdecay::recall_commit<std::int32_t> done;
    outcome got = outcome::ok;
    bool faulted = false;
    switch (path) {
      case recall_path::pool: got = run_call([&] { done = seq_.commit_recall(plan, pool_, 0); }); break;
      case recall_path::pool_store:
        arm_fault(want == outcome::ok ? fault : -1);
        got = run_call([&] {
          try {
            done = seq_.commit_recall(plan, pool_, 0, *store_);
          } catch (const injected_fault&) {
            faulted = true;
          }
        });
        arm_fault(-1);
        break;
      case recall_path::bare: got = run_call([&] { seq_.commit_recall(plan); }); break;
      default: got = run_call([&] { seq_.check_recall(plan); }); break;
    }
    expect(got, want,
           call + " path " + std::to_string(static_cast<int>(path)) + ": promote " + std::to_string(n) + ", demote " +
               std::to_string(plan.demote.size()) + ", drop " + std::to_string(plan.drop.size()) + " at generation " +
               std::to_string(plan.generation) + (faulted ? ", the store's copy failed" : ""));
    check_unchanged_if_rejected(got, before, call);
    if (faulted) {
      FUZZ_CHECK(snap() == before, call + ": a failed copy changed the state");
      compare_all(call + " after a failed copy");  // and every device block still holds its page's K/V
      return;
    }
    if (got != outcome::ok || path == recall_path::check_only) {
      FUZZ_CHECK(snap() == before, call + " changed the state");
      return;
    }
    std::vector<bool> device(m_.num_pages());
    for (std::size_t p = 0; p < device.size(); ++p) device[p] = !m_.on_host(p);
    std::vector<std::int32_t> inserted = done.inserted;
    if (path == recall_path::bare) inserted = mirror_recall(device, plan.promote, displaced);
    const auto fresh = pm_.recall(0, device, plan.promote, displaced);
    FUZZ_CHECK(inserted == fresh, call + ": the promoted pages' fresh blocks differ from the model's");
    if (path == recall_path::pool_store) {
      if (insert_first) {
        ms_.to_host(demoted_o);
      } else {
        ms_.to_host(displaced_o);
        ms_.release(dropped_o);
      }
      ms_.release(promoted_o);
    } else {
      for (std::size_t k = 0; k < n; ++k) device_kv_[static_cast<std::size_t>(inserted[k])] = promoted_o[k];
    }
    model_apply_recall(m_, mp);
    // Each promoted page is back at its place: its held index (less the dropped pages before it) maps through
    // device_index to the fresh block the table returned for it.
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t shift = static_cast<std::size_t>(
          std::lower_bound(plan.drop.begin(), plan.drop.end(), plan.promote[k]) - plan.drop.begin());
      const std::size_t at = seq_.device_index(plan.promote[k] - shift);
      FUZZ_CHECK(at < pool_.num_pages(0) && pool_.block_table(0)[at] == inserted[k],
                 call + ": promoted page " + std::to_string(plan.promote[k]) + " is not at its device index");
    }
  }
  /// The engine's own table after commit_recall(plan): the same insertion and removal through block_pool.
  std::vector<std::int32_t> mirror_recall(const std::vector<bool>& device, const std::vector<std::size_t>& promote,
                                          const std::vector<std::size_t>& displaced) {
    const bool insert_first = pool_.free_blocks() >= promote.size();
    std::vector<std::size_t> insert_at, remove_at;
    // merged: the table with the promoted pages in and the displaced ones still there (insertion first); device: the
    // table now; kept: the table once the displaced pages are out (the insertion's positions after a removal).
    for (std::size_t p = 0, merged = 0, dev = 0, kept = 0; p < device.size(); ++p) {
      if (std::binary_search(promote.begin(), promote.end(), p)) {
        insert_at.push_back(insert_first ? merged : kept);
        ++merged, ++kept;
        continue;
      }
      if (!device[p]) continue;
      if (std::binary_search(displaced.begin(), displaced.end(), p))
        remove_at.push_back(insert_first ? merged : dev);
      else
        ++kept;
      ++merged, ++dev;
    }
    std::vector<std::int32_t> inserted;
    if (insert_first) {
      inserted = pool_.insert_pages(0, insert_at);
      (void)pool_.remove_pages(0, remove_at);
    } else {
      (void)pool_.remove_pages(0, remove_at);
      inserted = pool_.insert_pages(0, insert_at);
    }
    return inserted;
  }

  /// select_for_budget with the tier's split checked (compare_plan), then committed through the device table and
  /// the host store (maybe with a fault), as selected or forged: a demotion of a page the plan does not take off
  /// the device, a host drop of a device page (usage_error), no host drops at all or every victim demoted whatever
  /// the region rule (accepted while the host stays within its budget, a usage_error beyond it: commit checks that
  /// the lists name the right tiers and that the host budget holds).
  void op_demote(reader& in) {
    ensure_store(in);
    const auto prot = protected_pages(in);
    auto plan = budget_plan(prot);
    remember(plan);
    const std::uint8_t forge = in.u8() % 8;
    switch (forge) {
      case 4:
        plan.demoted.push_back(in.u8() % (m_.num_pages() + 1));
        std::sort(plan.demoted.begin(), plan.demoted.end());
        break;
      case 5:
        plan.host_dropped.push_back(in.u8() % (m_.num_pages() + 1));
        std::sort(plan.host_dropped.begin(), plan.host_dropped.end());
        break;
      case 6: plan.host_dropped.clear(); break;
      case 7: plan.demoted = plan.pages; break;
      default: break;
    }
    const int fault = in.u8() % 4 == 0 ? in.u8() % 4 : -1;
    commit(plan, in.flip(4) ? commit_path::pool : commit_path::pool_store,
           "commit(tier forge " + std::to_string(forge) + ")", fault);
  }

  /// Calls the tier makes wrong: a held-length observation (tokens or pages) while pages are on the host,
  /// residency / device_index of a page that does not exist or is on the host, host_tier() without a tier,
  /// select_recall_for_bounds with bounds of the wrong length or a NaN.
  void op_tier_bad_calls(reader& in) {
    const auto before = snap();
    switch (in.u8() % 4) {
      case 0: {
        std::vector<Float> mass(m_.kv_len(), m_.kv_len() ? Float{1} / static_cast<Float>(m_.kv_len()) : Float{0});
        const outcome want = m_.observe_tokens(mass);
        const outcome got = run_call([&] { (void)seq_.observe_tokens(mass); });
        expect(got, want,
               "observe_tokens(held length " + std::to_string(mass.size()) + ", device " +
                   std::to_string(m_.device_len()) + ")");
        check_unchanged_if_rejected(got, before, "observe_tokens(held length)");
        return;
      }
      case 1: {
        std::vector<Float> mass(m_.num_pages(), Float{0.125});
        const outcome want = m_.observe_pages(mass);
        const outcome got = run_call([&] { (void)seq_.observe_pages(mass); });
        expect(got, want, "observe_pages(held pages " + std::to_string(mass.size()) + ")");
        check_unchanged_if_rejected(got, before, "observe_pages(held pages)");
        return;
      }
      case 2: {
        const std::size_t p = in.u8() % (m_.num_pages() + 2);
        memdecay::page_residency r{};
        const outcome got = run_call([&] { r = seq_.residency(p); });
        expect(got, p < m_.num_pages() ? outcome::ok : outcome::input_error, "residency(" + std::to_string(p) + ")");
        if (got == outcome::ok) FUZZ_CHECK((r == memdecay::page_residency::host) == m_.on_host(p), "residency");
        std::size_t d = 0;
        const outcome got2 = run_call([&] { d = seq_.device_index(p); });
        expect(got2, p < m_.num_pages() && !m_.on_host(p) ? outcome::ok : outcome::input_error,
               "device_index(" + std::to_string(p) + ")");
        if (got2 == outcome::ok) FUZZ_CHECK(d == m_.device_index(p), "device_index");
        break;
      }
      default: {
        const outcome got = run_call([&] { (void)seq_.host_tier(); });
        expect(got, m_.tier ? outcome::ok : outcome::usage_error, "host_tier()");
        std::vector<float> bounds(m_.num_pages() + (in.flip(8) ? 1 : 0));
        for (auto& b : bounds) b = static_cast<float>(static_cast<std::int8_t>(in.u8())) / 8;
        if (!bounds.empty() && in.flip(8)) bounds[in.u8() % bounds.size()] = std::numeric_limits<float>::quiet_NaN();
        const auto prot = protected_pages(in);
        bool ok = bounds.size() == m_.num_pages();
        for (float b : bounds) ok = ok && !std::isnan(b);
        memdecay::recall_plan plan;
        const outcome got2 = run_call([&] { plan = seq_.select_recall_for_bounds(bounds, prot); });
        expect(got2,
               !m_.tier ? outcome::usage_error
               : ok     ? outcome::ok
                        : outcome::input_error,
               "select_recall_for_bounds(" + std::to_string(bounds.size()) + ")");
        if (got2 == outcome::ok) {
          std::vector<bool> has_digest(m_.num_pages(), true);
          if (seq_.has_digests())
            for (std::size_t p = 0; p < has_digest.size(); ++p) has_digest[p] = seq_.digests().has_digest(p);
          compare_recall(plan, bounds, has_digest, prot, "select_recall_for_bounds");
          remember_recall(plan);
        }
        break;
      }
    }
    FUZZ_CHECK(snap() == before, "a const call changed the state");
  }

  /// A remembered recall plan (maybe stale), or one forged at the current generation: a promotion of a device page
  /// or of a page that does not exist, a displaced page that may not leave the device (pinned, partial, protected,
  /// host, recalled), bounds not aligned, a page both demoted and dropped, more demotions than the host tier holds,
  /// lists out of order, another page size. Committed by one of the paths; the model says which are rejected.
  void op_recall_forged(reader& in) {
    memdecay::recall_plan plan;
    if (last_recall_ && !in.flip(8))
      plan = in.flip(4) && older_recall_ ? *older_recall_ : *last_recall_;
    else
      plan.page_size = m_.P, plan.generation = m_.generation;
    const std::uint8_t forge = in.u8() % 10;
    const std::size_t n = m_.num_pages();
    auto add = [](std::vector<std::size_t>& v, std::size_t p) {
      v.push_back(p);
      std::sort(v.begin(), v.end());
    };
    switch (forge) {
      case 0: break;                                   // as selected (maybe stale)
      case 1: plan.generation = m_.generation; break;  // refreshed: the content decides
      case 2:
        if (n) add(plan.promote, in.u8() % n), plan.promote_bounds.push_back(1.0f);
        break;
      case 3:
        if (n) add(in.flip(2) ? plan.demote : plan.drop, in.u8() % n);
        break;
      case 4: add(plan.promote, n + in.u8() % 3), plan.promote_bounds.push_back(1.0f); break;
      case 5:
        if (plan.promote_bounds.empty())
          plan.promote_bounds.push_back(0.0f);
        else
          plan.promote_bounds.pop_back();
        break;
      case 6:
        if (n) {
          const std::size_t p = in.u8() % n;
          add(plan.demote, p), add(plan.drop, p);
        }
        break;
      case 7: {  // demote every evictable device page: beyond a bounded host tier's budget
        const auto status = m_.statuses({});
        for (std::size_t p = 0; p < n && m_.tier; ++p)
          if (status[p] == model_status::evictable && !std::binary_search(plan.drop.begin(), plan.drop.end(), p) &&
              !std::binary_search(plan.demote.begin(), plan.demote.end(), p))
            add(plan.demote, p);
        break;
      }
      case 8:
        std::reverse(plan.promote.begin(), plan.promote.end());
        std::reverse(plan.drop.begin(), plan.drop.end());
        break;
      default: plan.page_size *= 2; break;
    }
    if (forge >= 2 && !in.flip(4)) plan.generation = m_.generation;
    static const recall_path paths[] = {recall_path::pool, recall_path::pool_store, recall_path::bare,
                                        recall_path::check_only};
    const recall_path path = in.pick(paths);
    if (path == recall_path::pool_store) ensure_store(in);
    commit_recall(plan, path, "commit_recall(forge " + std::to_string(forge) + ")");
  }

  seq_type& seq_;
  model_sequence<Float>& m_;
  pool_type pool_;
  model_pool pm_;
  std::optional<plan_type> last_, older_;
  std::optional<memdecay::recall_plan> last_recall_, older_recall_;
  std::vector<std::uint64_t> device_kv_;  // per pool block: the origin of the page whose K/V it holds
  std::vector<std::uint64_t> host_kv_;    // per host store slot: the same
  std::optional<store_type> store_;
  model_store ms_;
  int fault_countdown_ = -1;  // the store's copy that throws (0: the next one), -1: none
};

template <class Float, std::size_t PageSize>
void run_sequence(reader& in) {
  const model_config mc = read_config(in, PageSize, std::is_same_v<Float, float>);
  trace(describe(mc));
  std::vector<model_region> effective;
  const bool valid = model_config_valid(mc, effective);
  std::optional<memdecay::basic_sequence<memdecay::policies::memdecay, Float, PageSize>> seq;
  const outcome got = run_call([&] { seq.emplace(to_library(mc)); });
  expect(got, valid ? outcome::ok : outcome::config_error, "construct sequence");
  if (!seq) return;
  model_sequence<Float> model;
  model.init(mc, effective);
  static const std::size_t pool_sizes[] = {4, 16, 64, 1024};  // small pools run out: exhaustion is a path too
  const std::size_t pool_blocks = pool_sizes[in.u8() % 4];
  harness<Float, PageSize> h(*seq, model, pool_blocks);
  h.run(in);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  g_trace.clear();
  reader in(data, size);
  // Bad block_pool geometry first: always config_error.
  const std::uint8_t selector = in.u8();
  if (selector == 0xFF) {
    const std::size_t ps = in.u8();
    const bool valid = ps != 0 && (ps & (ps - 1)) == 0;
    const outcome got = run_call([&] { memdecay::block_pool<> p(8, ps); });
    expect(got, valid ? outcome::ok : outcome::config_error, "block_pool(8, " + std::to_string(ps) + ")");
    return 0;
  }
  if (selector % 4 == 3)
    run_sequence<double, 16>(in);
  else
    run_sequence<float, memdecay::dynamic_page_size>(in);
  static const bool print_trace = std::getenv("MEMDECAY_FUZZ_TRACE") != nullptr;  // to see what an input does
  if (print_trace) std::fprintf(stderr, "%s", g_trace.c_str());
  return 0;
}
