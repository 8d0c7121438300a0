// SPDX-License-Identifier: Apache-2.0
// memdecay + llama.cpp: one llama.cpp sequence whose KV cache memdecay manages.
//
// A session owns a llama_context made for it (CPU or whatever the model was loaded on; a unified KV cache; two
// sequences: the live one and a fork for probes) and keeps, beside llama.cpp, the logical positions of the tokens
// still resident. Tokens are decoded in batches at the next positions; with attention capture on (flash
// attention off) each decode returns every layer's attention over the resident tokens in position order, from
// llama.cpp's own kq_soft_max, attributed to tokens through a cell_mirror that the mask checks on every ubatch.
// remove() evicts logical positions through llama_memory_seq_rm, one call per merged range; with
// position_mode::compact it then closes the gaps with llama_memory_seq_add (llama.cpp re-rotates the cached keys),
// so the RoPE positions stay those of a contiguous sequence of the resident length, as llama.cpp's context shift
// keeps them; position_mode::absolute leaves the gaps (positions keep growing with the tokens appended).
// probe() asks a question of the live cache on a fork (llama_memory_seq_cp) and removes the fork afterwards, so
// the live sequence is untouched.
//
// Logical positions are what memdecay sees (memdecay::sequence::position_of): the token's index in everything
// appended. Errors: config_error for a model or options that cannot work (a recurrent memory, flash attention
// with capture), input_error for bad tokens or ranges, usage_error when llama.cpp disagrees with the mirror; the
// session is unchanged by a rejected call.
#ifndef MEMDECAY_LLAMA_CPP_SESSION_HPP
#define MEMDECAY_LLAMA_CPP_SESSION_HPP

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <llama.h>

#include "memdecay/detail/error.hpp"
#include "memdecay/exports/llama_cpp.hpp"
#include "memdecay/llama_cpp/attention_capture.hpp"
#include "memdecay/llama_cpp/cell_mirror.hpp"

namespace memdecay::llama_cpp {

/// How RoPE positions follow evictions (see the file comment).
enum class position_mode { absolute, compact };

[[nodiscard]] inline const char* to_string(position_mode m) noexcept {
  return m == position_mode::absolute ? "absolute" : "compact";
}

struct session_options {
  bool capture_attention = true;  ///< read kq_soft_max (needs flash attention off)
  bool flash_attention = false;   ///< llama.cpp's flash attention (no attention to capture then)
  bool capture_queries = false;   ///< read Qcur / Kcur after RoPE (the attention-free signal; any flash setting)
  position_mode positions = position_mode::absolute;
  std::uint32_t n_ctx = 0;    ///< KV cells; 0: the model's training context
  std::uint32_t n_batch = 64; ///< tokens per llama_decode (also the ubatch)
  std::int32_t threads = 1;
  bool f32_cache = false;     ///< K/V cells in float32 (llama.cpp's default, false, stores them in f16)
};

/// What one decode() saw.
struct decode_result {
  /// [layer][resident token, position order]: attention probability summed over heads and the decoded tokens,
  /// divided by heads x tokens (each row sums to 1). Empty without capture.
  std::vector<std::vector<float>> layer_mass;
  std::vector<float> last_logits;  ///< the last decoded token's logits
  /// With capture_queries: [layer][decoded token][heads x head_dim] queries and [layer][decoded token][kv_heads x
  /// head_dim] keys after RoPE, at their llama.cpp positions, in llama.cpp's rotary pair layout.
  std::vector<std::vector<float>> layer_queries, layer_keys;
};

/// The loaded model, shared by sessions (llama.cpp's model is safe to share between contexts).
class model {
 public:
  /// Loads a GGUF file on the CPU. config_error when llama.cpp cannot load it.
  static std::shared_ptr<model> load(const std::string& path, bool quiet = true) {
    static const bool init = [] {
      llama_backend_init();
      return true;
    }();
    (void)init;
    if (quiet) llama_log_set([](ggml_log_level level, const char* text, void*) {
      if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
    }, nullptr);
    llama_model_params p = llama_model_default_params();
    p.n_gpu_layers = 0;
    llama_model* m = llama_model_load_from_file(path.c_str(), p);
    if (m == nullptr) detail::raise_config("llama.cpp could not load the GGUF model '" + path + "'");
    return std::shared_ptr<model>(new model(m));
  }
  model(const model&) = delete;
  model& operator=(const model&) = delete;
  ~model() { llama_model_free(m_); }

  [[nodiscard]] llama_model* get() const noexcept { return m_; }
  [[nodiscard]] std::size_t layers() const noexcept { return static_cast<std::size_t>(llama_model_n_layer(m_)); }
  [[nodiscard]] std::size_t heads() const noexcept { return static_cast<std::size_t>(llama_model_n_head(m_)); }
  [[nodiscard]] std::size_t kv_heads() const noexcept { return static_cast<std::size_t>(llama_model_n_head_kv(m_)); }
  [[nodiscard]] std::size_t head_dim() const noexcept {
    return static_cast<std::size_t>(llama_model_n_embd(m_)) / heads();
  }
  [[nodiscard]] std::size_t vocab() const noexcept {
    return static_cast<std::size_t>(llama_vocab_n_tokens(llama_model_get_vocab(m_)));
  }
  [[nodiscard]] std::uint32_t n_ctx_train() const noexcept {
    return static_cast<std::uint32_t>(llama_model_n_ctx_train(m_));
  }
  /// A GGUF metadata string, or "" when absent.
  [[nodiscard]] std::string meta(const char* key) const {
    char buf[512];
    const int n = llama_model_meta_val_str(m_, key, buf, sizeof buf);
    return n < 0 ? std::string() : std::string(buf);
  }
  /// The model's chat template; config_error naming the file's lack of one.
  [[nodiscard]] std::string chat_template() const {
    const char* t = llama_model_chat_template(m_, nullptr);
    if (t == nullptr) detail::raise_config("the GGUF model has no chat template (tokenizer.chat_template)");
    return t;
  }

 private:
  explicit model(llama_model* m) : m_(m) {}
  llama_model* m_;
};

class session {
 public:
  session(std::shared_ptr<const model> m, session_options o) : model_(std::move(m)), o_(o) {
    if (!model_) detail::raise_usage("llama_cpp::session: no model");
    llama_model* lm = model_->get();
    if (llama_model_is_recurrent(lm) || llama_model_is_hybrid(lm))
      detail::raise_config("the model's memory is recurrent: llama_memory_seq_rm cannot remove position ranges, "
                           "so memdecay cannot evict from it");
    if (o_.capture_attention && o_.flash_attention)
      detail::raise_config("flash_attention = true while capture_attention is asked for: flash attention never "
                           "materialises the probabilities (use the attention-free signal instead)");
    if (o_.n_batch == 0) detail::raise_config("n_batch = 0 (must be at least 1)");
    if (o_.threads <= 0) detail::raise_config("threads = " + std::to_string(o_.threads) + " (must be at least 1)");
    vocab_ = model_->vocab();
    capture_ = std::make_unique<attention_capture>(model_->layers(), o_.capture_attention, o_.capture_queries);
    llama_context_params p = llama_context_default_params();
    p.n_ctx = o_.n_ctx != 0 ? o_.n_ctx : model_->n_ctx_train();
    p.n_batch = p.n_ubatch = o_.n_batch;
    p.n_seq_max = 2;
    p.kv_unified = true;
    p.n_threads = p.n_threads_batch = o_.threads;
    p.flash_attn_type = o_.flash_attention ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    p.no_perf = true;
    if (o_.f32_cache) p.type_k = p.type_v = GGML_TYPE_F32;
    if (o_.capture_attention || o_.capture_queries) capture_->install(p);
    ctx_ = llama_init_from_model(lm, p);
    if (ctx_ == nullptr) detail::raise_config("llama.cpp could not create a context (n_ctx " + std::to_string(p.n_ctx) + ")");
    n_ctx_ = llama_n_ctx(ctx_);
    if (o_.positions == position_mode::compact && !llama_memory_can_shift(llama_get_memory(ctx_))) {
      llama_free(ctx_);
      detail::raise_config("position_mode::compact needs a memory that can shift positions (llama_memory_can_shift)");
    }
    batch_ = llama_batch_init(static_cast<std::int32_t>(o_.n_batch), 0, 1);
  }
  session(const session&) = delete;
  session& operator=(const session&) = delete;
  ~session() {
    llama_batch_free(batch_);
    llama_free(ctx_);
  }

  /// Decodes `tokens` at the next positions (see the file comment). input_error for an empty span, a token
  /// outside the vocabulary or a cache that cannot hold them; the session is then unchanged.
  decode_result decode(std::span<const llama_token> tokens) {
    check_tokens(tokens, "decode");
    if (resident_.size() + tokens.size() > n_ctx_)
      detail::raise_input("decode: " + std::to_string(resident_.size()) + " resident + " +
                          std::to_string(tokens.size()) + " tokens exceed the context's " + std::to_string(n_ctx_) +
                          " cells (evict first)");
    const auto t0 = std::chrono::steady_clock::now();
    decode_result out;
    const std::size_t L = model_->layers();
    std::vector<std::vector<double>> acc;
    if (o_.capture_attention) acc.assign(L, std::vector<double>(resident_.size() + tokens.size(), 0.0));
    for (std::size_t first = 0; first < tokens.size(); first += o_.n_batch) {
      const std::size_t n = std::min<std::size_t>(o_.n_batch, tokens.size() - first);
      std::vector<std::int32_t> pos(n);
      for (std::size_t i = 0; i < n; ++i) pos[i] = next_llama_pos() + static_cast<std::int32_t>(i);
      fill_batch(tokens.subspan(first, n), pos, seq_live, true);
      capture_->enabled = capturing();
      capture_->reset();
      const int rc = llama_decode(ctx_, batch_);
      if (rc != 0) failed_decode(rc, first);
      for (std::size_t i = 0; i < n; ++i) resident_.push_back(appended_ + i);
      appended_ += n;
      if (capturing()) {
        if (const auto why = capture_->complete(); !why.empty()) {
          rollback(n, first);
          detail::raise_usage("attention capture: " + why);
        }
      }
      if (o_.capture_attention) attribute(pos, acc, n, first);
      if (o_.capture_queries) {
        out.layer_queries.resize(L);
        out.layer_keys.resize(L);
        for (std::size_t l = 0; l < L; ++l) {
          const auto& q = capture_->layer_queries(l);
          const auto& k = capture_->layer_keys(l);
          out.layer_queries[l].insert(out.layer_queries[l].end(), q.begin(), q.end());
          out.layer_keys[l].insert(out.layer_keys[l].end(), k.begin(), k.end());
        }
      }
    }
    const float* logits = llama_get_logits_ith(ctx_, -1);
    out.last_logits.assign(logits, logits + vocab_);
    if (o_.capture_attention) {
      out.layer_mass.resize(L);
      const double inv = 1.0 / static_cast<double>(tokens.size());
      for (std::size_t l = 0; l < L; ++l) {
        out.layer_mass[l].resize(acc[l].size());
        for (std::size_t i = 0; i < acc[l].size(); ++i) out.layer_mass[l][i] = static_cast<float>(acc[l][i] * inv);
      }
    }
    decode_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }

  /// Evicts the resident tokens at logical positions [p0, p1) of each range (ascending, disjoint, every position
  /// resident): llama_memory_seq_rm per merged llama.cpp range, then (compact) llama_memory_seq_add. input_error
  /// naming the range otherwise, with nothing removed.
  void remove(std::span<const llama_position_range> ranges) {
    std::vector<std::uint8_t> drop(resident_.size(), 0);
    std::int64_t last_end = -1;
    for (std::size_t r = 0; r < ranges.size(); ++r) {
      const auto [p0, p1] = ranges[r];
      const std::string where = "remove: ranges[" + std::to_string(r) + "] = [" + std::to_string(p0) + ", " +
                                std::to_string(p1) + ")";
      if (p0 < 0 || p1 <= p0) detail::raise_input(where + " is empty or negative");
      if (p0 < last_end) detail::raise_input(where + " is not after the previous range");
      last_end = p1;
      auto it = std::lower_bound(resident_.begin(), resident_.end(), static_cast<std::uint64_t>(p0));
      for (std::int64_t p = p0; p < p1; ++p, ++it) {
        if (it == resident_.end() || *it != static_cast<std::uint64_t>(p))
          detail::raise_input(where + ": position " + std::to_string(p) + " is not resident");
        drop[static_cast<std::size_t>(it - resident_.begin())] = 1;
      }
    }
    // The llama.cpp ranges of the dropped tokens (merged where their llama positions touch).
    std::vector<llama_position_range> rm;
    for (std::size_t i = 0; i < resident_.size(); ++i)
      if (drop[i] != 0) {
        const auto p = static_cast<std::uint64_t>(llama_pos_of(i));
        detail::push_position_range(rm, p, p + 1);
      }
    llama_memory_t mem = llama_get_memory(ctx_);
    for (const auto& r : rm) {
      if (!llama_memory_seq_rm(mem, seq_live, r.p0, r.p1))
        detail::raise_usage("llama_memory_seq_rm refused [" + std::to_string(r.p0) + ", " + std::to_string(r.p1) + ")");
      mirror_.remove(r.p0, r.p1);
      ++seq_rm_calls_;
    }
    if (o_.positions == position_mode::compact) {
      // Each kept run between removed ranges moves down by the tokens removed before it.
      std::int32_t removed = 0;
      for (std::size_t k = 0; k < rm.size(); ++k) {
        removed += rm[k].p1 - rm[k].p0;
        const std::int32_t from = rm[k].p1, to = k + 1 < rm.size() ? rm[k + 1].p0 : -1;
        if (to != -1 && to <= from) continue;
        llama_memory_seq_add(mem, seq_live, from, to, -removed);
        mirror_.shift(from, to, -removed);
      }
    }
    std::size_t w = 0;
    for (std::size_t i = 0; i < resident_.size(); ++i)
      if (drop[i] == 0) resident_[w++] = resident_[i];
    resident_.resize(w);
  }

  /// Greedy answer of `max_new` tokens to `prompt` on a fork of the live cache (the live sequence unchanged).
  std::vector<llama_token> probe(std::span<const llama_token> prompt, std::size_t max_new) {
    check_tokens(prompt, "probe");
    if (resident_.size() + prompt.size() + max_new > n_ctx_)
      detail::raise_input("probe: the context's " + std::to_string(n_ctx_) + " cells cannot hold the fork");
    if (prompt.size() > o_.n_batch) detail::raise_input("probe: the prompt is longer than n_batch");
    const auto t0 = std::chrono::steady_clock::now();
    llama_memory_t mem = llama_get_memory(ctx_);
    llama_memory_seq_cp(mem, seq_live, seq_probe, -1, -1);
    std::vector<llama_token> out;
    capture_->enabled = false;
    std::int32_t pos = next_llama_pos();
    std::vector<llama_token> chunk(prompt.begin(), prompt.end());
    int rc = 0;
    for (std::size_t i = 0; i < max_new; ++i) {
      std::vector<std::int32_t> p(chunk.size());
      for (std::size_t j = 0; j < chunk.size(); ++j) p[j] = pos + static_cast<std::int32_t>(j);
      fill_batch(chunk, p, seq_probe, true);
      rc = llama_decode(ctx_, batch_);
      if (rc != 0) break;
      pos += static_cast<std::int32_t>(chunk.size());
      const float* logits = llama_get_logits_ith(ctx_, -1);
      const auto next = static_cast<llama_token>(std::max_element(logits, logits + vocab_) - logits);
      out.push_back(next);
      chunk.assign(1, next);
    }
    llama_memory_seq_rm(mem, seq_probe, -1, -1);
    capture_->enabled = capturing();
    probe_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rc != 0) detail::raise_usage("probe: llama_decode returned " + std::to_string(rc));
    return out;
  }

  [[nodiscard]] std::size_t resident() const noexcept { return resident_.size(); }
  /// The resident tokens' logical positions, ascending.
  [[nodiscard]] std::span<const std::uint64_t> resident_positions() const noexcept { return resident_; }
  [[nodiscard]] std::uint64_t appended() const noexcept { return appended_; }
  /// The RoPE position the next token gets.
  [[nodiscard]] std::int32_t next_llama_pos() const noexcept {
    return o_.positions == position_mode::absolute ? static_cast<std::int32_t>(appended_)
                                                   : static_cast<std::int32_t>(resident_.size());
  }
  [[nodiscard]] const session_options& options() const noexcept { return o_; }
  [[nodiscard]] const model& get_model() const noexcept { return *model_; }
  [[nodiscard]] llama_context* context() const noexcept { return ctx_; }
  [[nodiscard]] std::size_t n_ctx() const noexcept { return n_ctx_; }
  [[nodiscard]] const cell_mirror& mirror() const noexcept { return mirror_; }
  /// Seconds in llama_decode of the live sequence (capture included), in the capture callback, in probes.
  [[nodiscard]] double decode_seconds() const noexcept { return decode_seconds_; }
  [[nodiscard]] double capture_seconds() const noexcept { return capture_->seconds(); }
  [[nodiscard]] double probe_seconds() const noexcept { return probe_seconds_; }
  [[nodiscard]] std::uint64_t seq_rm_calls() const noexcept { return seq_rm_calls_; }

  static constexpr llama_seq_id seq_live = 0;
  static constexpr llama_seq_id seq_probe = 1;

 private:
  void check_tokens(std::span<const llama_token> tokens, const char* what) const {
    if (tokens.empty()) detail::raise_input(std::string(what) + ": no tokens");
    for (std::size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] < 0 || static_cast<std::size_t>(tokens[i]) >= vocab_)
        detail::raise_input(std::string(what) + ": tokens[" + std::to_string(i) + "] = " + std::to_string(tokens[i]) +
                            " is outside the model's vocabulary of " + std::to_string(vocab_));
  }

  [[nodiscard]] std::int32_t llama_pos_of(std::size_t resident_index) const noexcept {
    return o_.positions == position_mode::absolute ? static_cast<std::int32_t>(resident_[resident_index])
                                                   : static_cast<std::int32_t>(resident_index);
  }

  void fill_batch(std::span<const llama_token> tokens, std::span<const std::int32_t> pos, llama_seq_id seq,
                  bool last_logits) {
    batch_.n_tokens = static_cast<std::int32_t>(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      batch_.token[i] = tokens[i];
      batch_.pos[i] = pos[i];
      batch_.n_seq_id[i] = 1;
      batch_.seq_id[i][0] = seq;
      batch_.logits[i] = last_logits && i + 1 == tokens.size() ? 1 : 0;
    }
  }

  [[noreturn]] void failed_decode(int rc, std::size_t first) {
    // A rejected ubatch leaves llama.cpp's memory as it was; the earlier ones of this call stay decoded, so the
    // caller's view is re-synchronised by removing them again.
    if (first > 0) rollback(0, first);
    detail::raise_input("llama_decode returned " + std::to_string(rc) +
                        (rc == 1 ? " (no KV slot for the batch: evict first)" : ""));
  }

  [[nodiscard]] bool capturing() const noexcept { return o_.capture_attention || o_.capture_queries; }

  // Adds the ubatch's per-cell mass to the resident tokens' sums (weighted by its tokens).
  void attribute(std::span<const std::int32_t> pos, std::vector<std::vector<double>>& acc, std::size_t n,
                 std::size_t first) {
    try {
      mirror_.observe(capture_->mask(), pos);
    } catch (...) {
      rollback(n, first);
      throw;
    }
    const std::size_t cells = capture_->mask().cells;
    for (std::size_t l = 0; l < capture_->layers(); ++l) {
      const auto& m = capture_->layer_mass(l);
      for (std::size_t c = 0; c < cells; ++c) {
        const std::int32_t p = mirror_.position(c);
        if (p == cell_mirror::free_cell) continue;
        std::size_t idx;
        if (o_.positions == position_mode::compact) {
          idx = static_cast<std::size_t>(p);
        } else {
          idx = static_cast<std::size_t>(
              std::lower_bound(resident_.begin(), resident_.end(), static_cast<std::uint64_t>(p)) - resident_.begin());
        }
        acc[l][idx] += static_cast<double>(m[c]) * static_cast<double>(n);
      }
    }
  }

  void rollback(std::size_t n, std::size_t first) {
    const std::size_t undo = n + first;
    const std::int32_t from = next_llama_pos() - static_cast<std::int32_t>(undo);
    llama_memory_seq_rm(llama_get_memory(ctx_), seq_live, from, -1);
    mirror_.remove(from, -1);
    resident_.resize(resident_.size() - undo);
    appended_ -= undo;
  }

  std::shared_ptr<const model> model_;
  session_options o_;
  std::size_t vocab_ = 0;
  std::unique_ptr<attention_capture> capture_;
  llama_context* ctx_ = nullptr;
  std::size_t n_ctx_ = 0;
  llama_batch batch_{};
  cell_mirror mirror_;
  std::vector<std::uint64_t> resident_;
  std::uint64_t appended_ = 0;
  double decode_seconds_ = 0.0, probe_seconds_ = 0.0;
  std::uint64_t seq_rm_calls_ = 0;
};

}  // namespace memdecay::llama_cpp

#endif  // MEMDECAY_LLAMA_CPP_SESSION_HPP
