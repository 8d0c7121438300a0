// SPDX-License-Identifier: Apache-2.0
// memdecay-llama's engine: the evaluation harness (tools/eval/harness.hpp) over llama.cpp itself.
//
// llama_harness_session is the harness's Session on memdecay::llama_cpp::session: the policy commits into a
// memdecay::block_pool mirror of the sequence (page size 1 = llama.cpp's cells, or 16), and before the next
// llama.cpp call the session removes from llama.cpp exactly the tokens the policy's commit took out of the pool,
// through llama_memory_seq_rm per merged range. Attention is llama.cpp's own kq_soft_max (flash attention off),
// probes are forks of the live sequence (llama_memory_seq_cp), every layer's row sums to 1 as the harness expects.
// Each session is a llama_context of its own, so episodes run on several threads like memdecay-eval's.
// With the session's capture_queries on, it also keeps every resident token's keys after RoPE (llama.cpp's
// Kcur), so that policies on the attention-free signal digest them (page_keys: tokens x (layers x query heads x
// head_dim), each query head slot holding its KV head's key, the layout of memdecay-eval's engine) and observe
// the step's queries (layer_queries); that needs absolute positions (compaction would move the keys).
//
// context_shift_kind() is what llama.cpp users get today when the context fills (llama-server --context-shift,
// llama-cli's infinite generation): keep the first n_keep tokens (the BOS token: n_keep 0 + add_bos), discard
// half of the rest, oldest first, and shift the later positions down (tools/server/server-context.cpp).
#ifndef MEMDECAY_TOOLS_LLAMA_LLAMA_ENGINE_HPP
#define MEMDECAY_TOOLS_LLAMA_LLAMA_ENGINE_HPP

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <memdecay/llama_cpp/session.hpp>
#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/policies/streaming_llm.hpp>

#include "../eval/engine/model_config.hpp"
#include "../eval/harness.hpp"
#include "../eval/policy_kinds.hpp"

namespace memdecay_llama {

namespace md = memdecay;
namespace lc = memdecay::llama_cpp;
namespace ev = memdecay_eval;

/// Where the time goes, summed over every session and run (threads add up).
struct timings {
  std::mutex m;
  double decode_s = 0, capture_s = 0, probe_s = 0, seq_rm_s = 0, memdecay_s = 0;
  std::uint64_t decoded_tokens = 0, steps = 0, seq_rm_calls = 0;
  void add(const lc::session& s, double seq_rm) {
    std::lock_guard lock(m);
    decode_s += s.decode_seconds();
    capture_s += s.capture_seconds();
    probe_s += s.probe_seconds();
    seq_rm_s += seq_rm;
    decoded_tokens += s.appended();
    seq_rm_calls += s.seq_rm_calls();
  }
};

/// The harness's Session over one llama.cpp sequence (see the file comment).
class llama_harness_session {
 public:
  using pool_type = md::block_pool<std::int32_t, std::uint64_t>;
  static constexpr std::uint64_t sequence_id = 0;

  struct step_result {
    std::vector<std::vector<float>> layer_mass;     ///< [layer][resident token, block-table order]
    std::vector<float> last_logits;
    std::vector<std::vector<float>> layer_queries;  ///< [layer][chunk token][heads x head_dim] (capture_queries)
  };

  llama_harness_session(std::shared_ptr<const lc::model> model, lc::session_options o, std::size_t page_size,
                        std::size_t max_tokens, timings* t)
      : P_(page_size), pool_((max_tokens + page_size - 1) / page_size + 1, page_size), timings_(t) {
    o.n_ctx = static_cast<std::uint32_t>(max_tokens + 16);
    if (o.capture_queries && o.positions == lc::position_mode::compact)
      throw std::runtime_error("policies on the query signal need --positions absolute: their digests hold keys "
                               "rotated at their positions, which compaction moves");
    s_ = std::make_unique<lc::session>(std::move(model), o);
    first_pos_.assign(pool_.capacity(), 0);
    pool_.open(sequence_id);
  }
  llama_harness_session(llama_harness_session&&) noexcept = default;
  llama_harness_session& operator=(llama_harness_session&&) noexcept = default;
  ~llama_harness_session() {
    if (s_ && timings_ != nullptr) timings_->add(*s_, seq_rm_s_);
  }

  step_result append(std::span<const std::int32_t> tokens) {
    sync();
    const std::size_t r0 = s_->resident();
    const auto first = s_->appended();
    auto r = s_->decode(tokens);
    pool_.append_tokens(sequence_id, tokens.size());
    const auto table = pool_.block_table(sequence_id);
    for (std::size_t i = r0; i < r0 + tokens.size(); ++i)
      if (i % P_ == 0) first_pos_[static_cast<std::size_t>(table[i / P_])] = first + (i - r0);
    if (s_->options().capture_queries) keep_keys(r, tokens.size());
    return {std::move(r.layer_mass), std::move(r.last_logits), std::move(r.layer_queries)};
  }

  [[nodiscard]] std::size_t layers() const noexcept { return s_->get_model().layers(); }
  [[nodiscard]] std::size_t heads() const noexcept { return s_->get_model().heads(); }
  [[nodiscard]] std::size_t head_dim() const noexcept { return s_->get_model().head_dim(); }
  /// The keys of resident page `page` (block-table order): one row per token, layers x heads x head_dim.
  void page_keys(std::size_t page, std::vector<float>& out) const {
    if (!s_->options().capture_queries)
      throw std::runtime_error("llama_harness_session::page_keys: the session does not capture keys");
    sync();
    const std::size_t r = s_->resident(), w = row_width();
    if (page * P_ >= r) throw std::runtime_error("page_keys: page " + std::to_string(page) + " is not resident");
    const std::size_t n = std::min(P_, r - page * P_);
    out.assign(keys_.begin() + static_cast<std::ptrdiff_t>(page * P_ * w),
               keys_.begin() + static_cast<std::ptrdiff_t>((page * P_ + n) * w));
  }

  [[nodiscard]] std::vector<std::int32_t> answer(std::span<const std::int32_t> prompt, std::size_t max_new) const {
    sync();
    return s_->probe(prompt, max_new);
  }

  pool_type& table() { return pool_; }
  [[nodiscard]] std::uint64_t sequence() const noexcept { return sequence_id; }
  [[nodiscard]] std::size_t resident_tokens() const {
    sync();
    return s_->resident();
  }
  [[nodiscard]] const lc::session& llama() const noexcept { return *s_; }

 private:
  // Removes from llama.cpp the tokens the policy's commit took out of the pool (merged position ranges).
  void sync() const {
    const std::size_t held = pool_.num_tokens(sequence_id);
    if (held == s_->resident()) return;
    const auto t0 = std::chrono::steady_clock::now();
    const auto table = pool_.block_table(sequence_id);
    std::vector<std::uint8_t> keep(s_->appended(), 0);
    for (std::size_t k = 0; k < table.size(); ++k) {
      const std::size_t n = std::min(P_, held - k * P_);
      const std::uint64_t p0 = first_pos_[static_cast<std::size_t>(table[k])];
      for (std::size_t j = 0; j < n; ++j) keep[p0 + j] = 1;
    }
    std::vector<md::llama_position_range> ranges;
    for (std::uint64_t p : s_->resident_positions())
      if (keep[p] == 0) md::detail::push_position_range(ranges, p, p + 1);
    if (s_->options().capture_queries) {  // the removed tokens' key rows go too
      const std::size_t w = row_width();
      std::size_t out = 0, i = 0;
      for (std::uint64_t p : s_->resident_positions()) {
        if (keep[p] != 0)
          std::copy_n(keys_.begin() + static_cast<std::ptrdiff_t>(i * w), w,
                      keys_.begin() + static_cast<std::ptrdiff_t>(out++ * w));
        ++i;
      }
      keys_.resize(out * w);
    }
    s_->remove(ranges);
    if (s_->resident() != held)
      throw std::runtime_error("llama_harness_session: llama.cpp holds " + std::to_string(s_->resident()) +
                               " tokens after the sync, the pool " + std::to_string(held));
    seq_rm_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  [[nodiscard]] std::size_t row_width() const noexcept { return layers() * heads() * head_dim(); }
  // Appends the chunk's key rows: each query head's slot holds its KV head's key (grouped-query attention).
  void keep_keys(const lc::decode_result& r, std::size_t n) {
    const auto& m = s_->get_model();
    const std::size_t L = m.layers(), H = m.heads(), KV = m.kv_heads(), hd = m.head_dim(), w = row_width();
    const std::size_t before = keys_.size() / w;
    keys_.resize((before + n) * w);
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t l = 0; l < L; ++l)
        for (std::size_t h = 0; h < H; ++h)
          std::copy_n(r.layer_keys[l].begin() + static_cast<std::ptrdiff_t>((t * KV + h / (H / KV)) * hd), hd,
                      keys_.begin() + static_cast<std::ptrdiff_t>((before + t) * w + (l * H + h) * hd));
  }

  std::size_t P_;
  pool_type pool_;
  std::vector<std::uint64_t> first_pos_;  ///< per block id: the logical position of its first token
  std::unique_ptr<lc::session> s_;
  timings* timings_ = nullptr;
  mutable double seq_rm_s_ = 0;
  mutable std::vector<float> keys_;  ///< capture_queries: every resident token's key row, position order
};

/// A GGUF model for the harness: llama.cpp's model and the vocabulary layout the file states.
class gguf_model {
 public:
  static gguf_model load(const std::filesystem::path& path) {
    gguf_model g;
    g.path_ = path.string();
    g.m_ = lc::model::load(g.path_);
    const std::string layout = g.m_->meta("memdecay.vocab_layout");
    if (layout.empty())
      throw std::runtime_error("'" + g.path_ + "' has no memdecay.vocab_layout: the episode files' token ids "
                               "mean nothing to it (python/export_gguf.py writes one)");
    g.vocab_ = ev::parse_vocab_layout(nlohmann::json::parse(layout));
    g.name_ = path.stem().string() == "model" ? path.parent_path().filename().string() : path.stem().string();
    return g;
  }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] const ev::vocab_layout& vocab() const noexcept { return vocab_; }
  [[nodiscard]] const std::shared_ptr<lc::model>& model() const noexcept { return m_; }

 private:
  std::string path_, name_;
  std::shared_ptr<lc::model> m_;
  ev::vocab_layout vocab_;
};

/// llama.cpp's context shift (see the file comment) at page size 1: StreamingLLM's order (oldest first, the
/// first n_keep tokens kept), no region pinned, no recent window, and a low watermark so that crossing the budget
/// discards half of what is not kept.
inline ev::policy_kind context_shift_kind(std::size_t n_keep = 1) {
  ev::policy_kind k;
  k.name = "context-shift";
  k.description = "llama.cpp's context shift: keep the first n_keep = " + std::to_string(n_keep) +
                  " tokens (BOS), discard half of the rest when full, oldest first (llama-server --context-shift)";
  k.make = [n_keep](const md::config& base) {
    md::config cfg = base;
    cfg.protection = {};
    const md::region_table table = cfg.effective_regions();
    for (const auto& r : table.params())
      if (r.pinned) cfg.region_overrides.push_back({.region = r.name, .pinned = false});
    const double high = cfg.budget.high;
    const double left = high - static_cast<double>(n_keep);
    cfg.budget.low = static_cast<double>(n_keep) + (left - std::floor(left / 2));
    using seq = md::policy_sequence<md::policies::streaming_llm>;
    return memdecay_tools::erase(seq(cfg, {.sink_tokens = n_keep}));
  };
  return k;
}

}  // namespace memdecay_llama

#endif  // MEMDECAY_TOOLS_LLAMA_LLAMA_ENGINE_HPP
