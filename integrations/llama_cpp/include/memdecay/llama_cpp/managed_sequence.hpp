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
// policy. The check comes before either side changes (check_commit), so a refused plan changes neither. Without
// attention capture the policy sees no observation (a policy that needs attention must not be used then).
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
      : session_(std::move(m), o), policy_(std::move(policy)) {
    if (policy_.kv_len() != 0) detail::raise_usage("managed_sequence: the policy's sequence must start empty");
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
      policy_.append(r, chunk.size());
      if (!r_.layer_mass.empty()) {
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
    policy_.commit(plan);
    return plan.pages.size();
  }

  /// Greedy answer on a fork of the live cache.
  std::vector<llama_token> probe(std::span<const llama_token> prompt, std::size_t max_new) {
    return session_.probe(prompt, max_new);
  }

  [[nodiscard]] const Sequence& policy() const noexcept { return policy_; }
  [[nodiscard]] const session& llama() const noexcept { return session_; }

 private:
  session session_;
  Sequence policy_;
  std::vector<float> mass_;
};

}  // namespace memdecay::llama_cpp

#endif  // MEMDECAY_LLAMA_CPP_MANAGED_SEQUENCE_HPP
