// SPDX-License-Identifier: Apache-2.0
// memdecay + llama.cpp: a llama.cpp sequence whose KV cache a memdecay policy manages, as one object.
//
//   auto model = memdecay::llama_cpp::model::load("model.gguf");
//   memdecay::llama_cpp::managed_sequence<> seq(model, {.n_ctx = 4096}, cfg);  // cfg.budget below n_ctx
//   seq.append(memdecay::regions::system, system_tokens);    // decoded in batches; attention observed
//   seq.append(memdecay::regions::tool_out, tool_tokens);
//   auto answer = seq.probe(question, 8);                      // on a fork; the live cache unchanged
//
// append() labels the span, decodes it in batches of the session's n_batch and, after each batch: observes
// llama.cpp's attention summed over layers (each layer's row sums to 1), advances the clock by one engine step
// (one llama_decode), and enforces the budget: select_for_budget, the plan's positions removed from llama.cpp
// (llama_memory_seq_rm per merged range, then the gaps closed when positions are compacted) and committed to the
// policy. The check comes before either side changes (check_commit), so a refused plan changes neither.
//
// Attention-free (session_options::capture_queries without capture_attention; flash attention on or off): the
// policy keeps page digests of llama.cpp's keys after RoPE (every layer's KV heads stacked as heads, so query
// head l x H + h reads KV head l x KV + h / (H / KV), grouped-query attention per layer), each page's digest set
// again as it fills, and observes each batch's last query through them (observe_query: the attention-free
// signal, docs/tiers.md). The keys keep the positions they were rotated at, so this needs absolute positions
// (compaction would re-rotate llama.cpp's keys but not the digests). Without either capture the policy sees no
// observation (a policy that needs attention must not be used then).
#ifndef MEMDECAY_LLAMA_CPP_MANAGED_SEQUENCE_HPP
#define MEMDECAY_LLAMA_CPP_MANAGED_SEQUENCE_HPP

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "memdecay/core/sequence.hpp"
#include "memdecay/exports/llama_cpp.hpp"
#include "memdecay/llama_cpp/session.hpp"

namespace memdecay::llama_cpp {

template <class Sequence = memdecay::sequence>
class managed_sequence {
 public:
  managed_sequence(std::shared_ptr<const model> m, session_options o, Sequence policy)
      : session_(check_options(m, o), o), policy_(std::move(policy)) {
    if (policy_.kv_len() != 0) detail::raise_usage("managed_sequence: the policy's sequence must start empty");
    if (attention_free()) {
      const model& md = session_.get_model();
      L_ = md.layers();
      policy_.enable_digests({.kv_heads = L_ * md.kv_heads(), .head_dim = md.head_dim(),
                              .query_heads = L_ * md.heads()});
    }
  }
  managed_sequence(std::shared_ptr<const model> m, session_options o, const config& cfg)
      : managed_sequence(std::move(m), o, Sequence(cfg)) {}

  /// Appends and decodes a span of region `r` (see the file comment). Returns the pages evicted.
  std::size_t append(region_id r, std::span<const llama_token> tokens) {
    if (tokens.empty()) detail::raise_input("managed_sequence::append: no tokens");
    std::size_t evicted = 0;
    const std::size_t B = session_.options().n_batch;
    for (std::size_t first = 0; first < tokens.size(); first += B) {
      const auto chunk = tokens.subspan(first, std::min(B, tokens.size() - first));
      if (session_.resident() + chunk.size() > session_.n_ctx())
        detail::raise_input("managed_sequence::append: " + std::to_string(session_.resident()) + " resident + " +
                            std::to_string(chunk.size()) + " tokens exceed the context's " +
                            std::to_string(session_.n_ctx()) + " cells: the budget must leave room for a batch");
      auto r_ = session_.decode(chunk);
      const std::size_t before = policy_.kv_len();
      policy_.append(r, chunk.size());
      if (attention_free()) {
        observe_queries(r_, before, chunk.size());
      } else if (!r_.layer_mass.empty()) {
        mass_.assign(policy_.kv_len(), 0.0f);
        for (const auto& layer : r_.layer_mass)
          for (std::size_t i = 0; i < mass_.size(); ++i) mass_[i] += layer[i];
        policy_.observe_tokens(std::span<const float>(mass_));
      }
      policy_.advance_to(policy_.now() + 1);
      evicted += enforce_budget();
    }
    return evicted;
  }

  /// Evicts what the budget asks for now. Returns the pages evicted.
  std::size_t enforce_budget() {
    const auto plan = policy_.select_for_budget();
    if (plan.pages.empty()) return 0;
    const auto ranges = llama_position_ranges(policy_, plan);  // checks the plan; changes nothing
    session_.remove(ranges);
    if (attention_free()) {  // the evicted pages' key rows go too
      const std::size_t P = policy_.page_size(), w = row_width();
      std::vector<std::uint8_t> gone(policy_.kv_len(), 0);
      for (std::size_t p : plan.pages)
        for (std::size_t i = p * P; i < std::min((p + 1) * P, gone.size()); ++i) gone[i] = 1;
      std::size_t out = 0;
      for (std::size_t i = 0; i < gone.size(); ++i)
        if (gone[i] == 0) std::copy_n(keys_.begin() + static_cast<std::ptrdiff_t>(i * w), w,
                                      keys_.begin() + static_cast<std::ptrdiff_t>(out++ * w));
      keys_.resize(out * w);
    }
    policy_.commit(plan);
    return plan.pages.size();
  }

  /// Greedy answer on a fork of the live cache.
  std::vector<llama_token> probe(std::span<const llama_token> prompt, std::size_t max_new) {
    return session_.probe(prompt, max_new);
  }

  [[nodiscard]] const Sequence& policy() const noexcept { return policy_; }
  [[nodiscard]] const session& llama() const noexcept { return session_; }
  /// Whether the policy observes the attention-free signal (see the file comment).
  [[nodiscard]] bool attention_free() const noexcept {
    return session_.options().capture_queries && !session_.options().capture_attention;
  }

 private:
  static std::shared_ptr<const model> check_options(const std::shared_ptr<const model>& m, const session_options& o) {
    if (o.capture_queries && !o.capture_attention && o.positions == position_mode::compact)
      detail::raise_config("the attention-free signal needs position_mode::absolute: its digests hold keys rotated "
                           "at their positions, which compaction would move");
    return m;
  }
  [[nodiscard]] std::size_t row_width() const noexcept {
    const model& md = session_.get_model();
    return L_ * md.kv_heads() * md.head_dim();
  }
  // Stacks the new tokens' keys (layer after layer), sets the digest of every page they touched, and observes the
  // batch's last query.
  void observe_queries(const decode_result& r, std::size_t before, std::size_t n) {
    const model& md = session_.get_model();
    const std::size_t kvw = md.kv_heads() * md.head_dim(), qw = md.heads() * md.head_dim(), w = row_width();
    keys_.resize((before + n) * w);
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t l = 0; l < L_; ++l)
        std::copy_n(r.layer_keys[l].begin() + static_cast<std::ptrdiff_t>(t * kvw), kvw,
                    keys_.begin() + static_cast<std::ptrdiff_t>((before + t) * w + l * kvw));
    const std::size_t P = policy_.page_size();
    for (std::size_t p = before / P; p * P < before + n; ++p) {
      const std::size_t first = p * P, count = std::min(P, policy_.kv_len() - first);
      policy_.set_page_keys(p, std::span<const float>(keys_.data() + first * w, count * w));
    }
    query_.resize(L_ * qw);
    for (std::size_t l = 0; l < L_; ++l)
      std::copy_n(r.layer_queries[l].begin() + static_cast<std::ptrdiff_t>((n - 1) * qw), qw,
                  query_.begin() + static_cast<std::ptrdiff_t>(l * qw));
    policy_.observe_query(std::span<const float>(query_));
  }

  session session_;
  Sequence policy_;
  std::vector<float> mass_;
  std::size_t L_ = 0;
  std::vector<float> keys_;   ///< attention-free: every resident token's keys, layers stacked, in page order
  std::vector<float> query_;
};

}  // namespace memdecay::llama_cpp

#endif  // MEMDECAY_LLAMA_CPP_MANAGED_SEQUENCE_HPP
