// SPDX-License-Identifier: Apache-2.0
// memdecay-eval engine: one sequence's paged KV cache for the tiny decoder (tiny_lm.hpp), whose blocks belong to
// memdecay's owning block_pool.
//
// kv_session keeps K (RoPE applied when written, at the token's absolute position) and V of every layer in the
// blocks of its own memdecay::block_pool: one storage slab per block id x layer x {K, V} x page slot. It reads
// them through the pool's block table on every step, so after `policy.commit(plan, table(), sequence())` has
// removed pages it attends over exactly the surviving tokens, at their original positions, in block-table order.
// The convolution state (the last k-1 normed inputs per layer) lives outside the cache: the convolution always
// sees the true previous tokens, evicted or not (the llama architecture has none).
//
// Grouped-query attention (n_kv_heads < n_heads, the llama architecture): the pool stores the n_kv_heads key/value
// heads only (a K or V row is n_kv_heads x head_dim wide; without GQA that is d_model, the layout the bundled models
// always had), and query head j reads kv head j / (n_heads / n_kv_heads). Everything the session reports is per
// query head: heads() is n_heads, layer_mass averages over the n_heads query heads, layer_queries and
// prompt_queries hold n_heads x head_dim per layer, and page_keys expands each kv head's key to the query heads
// that read it (see page_keys), so the harness' layers() x heads() x head_dim() rows of keys line up with the
// queries head for head and the attention-free signal, the digests and the exact host-tier recall compute the
// logits the attention computes. save_block / load_block copy the stored (kv-head) rows, unexpanded.
//
// A kv_session is not thread-safe (not even its const answer(), which uses the session's scratch buffers); one
// tiny_lm may serve any number of sessions on any threads.
#ifndef MEMDECAY_EVAL_ENGINE_KV_SESSION_HPP
#define MEMDECAY_EVAL_ENGINE_KV_SESSION_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <memdecay/page_tables/block_pool.hpp>

#include "tiny_lm.hpp"

namespace memdecay_eval {

// One sequence's paged KV cache over an owning memdecay::block_pool (see the file comment).
class kv_session {
 public:
  using pool_type = memdecay::block_pool<std::int32_t, std::uint64_t>;

  // A session for at most `max_tokens` resident tokens in pages of `page_size` (a power of two) tokens.
  kv_session(const tiny_lm& model, std::size_t page_size, std::size_t max_tokens)
      : model_(&model), P_(page_size), max_tokens_(max_tokens), pool_(blocks_for(page_size, max_tokens), page_size) {
    const auto& c = model.config();
    d_ = static_cast<std::size_t>(c.d_model);
    L_ = static_cast<std::size_t>(c.n_layers);
    H_ = static_cast<std::size_t>(c.n_heads);
    hd_ = d_ / H_;
    KV_ = static_cast<std::size_t>(c.n_kv_heads);
    group_ = H_ / KV_;
    kvd_ = KV_ * hd_;
    qkvw_ = H_ * hd_ + 2 * kvd_;
    conv_ = c.has_conv();
    k_ = conv_ ? static_cast<std::size_t>(c.conv_kernel) : 0;
    const std::size_t blocks = pool_.capacity();
    kv_.assign(blocks * L_ * 2 * P_ * kvd_, 0.0f);
    block_first_pos_.assign(blocks, 0);
    if (conv_) conv_state_.assign(L_ * (k_ - 1) * d_, 0.0f);
    pool_.open(sequence_id);
  }

  struct step_result {
    std::vector<float> last_logits;                 // vocab entries, for the chunk's last token
    std::vector<std::vector<float>> layer_mass;     // [layer][resident token incl. the chunk, block-table order]:
                                                    // attention probability summed over the (query) heads and the
                                                    // chunk's queries, divided by heads * queries (each row sums
                                                    // to 1)
    std::vector<std::vector<float>> layer_queries;  // [layer][query t of the chunk][n_heads x head_dim = d_model]:
                                                    // the queries as the attention saw them (RoPE applied), query
                                                    // head after query head
  };

  // Runs the chunk at the next absolute positions, writes its K/V into the pool and returns the last token's
  // logits and each layer's attention mass over the resident tokens (those before the chunk and the chunk,
  // causal within it). Throws std::runtime_error for an empty chunk, a token outside the vocabulary, or a
  // chunk that does not fit max_tokens resident tokens (the session is then unchanged).
  step_result append(std::span<const std::int32_t> tokens) {
    if (tokens.empty()) throw std::runtime_error("kv_session::append: empty chunk");
    model_->check_tokens(tokens, "kv_session::append");
    const std::size_t n = tokens.size(), r0 = resident_tokens();
    if (r0 + n > max_tokens_)
      throw std::runtime_error("kv_session::append: " + std::to_string(r0) + " resident + " + std::to_string(n) +
                               " new tokens exceed max_tokens " + std::to_string(max_tokens_));
    if (appended_ + n > std::numeric_limits<std::uint32_t>::max())
      throw std::runtime_error("kv_session::append: positions overflow");
    pool_.append_tokens(sequence_id, n);
    const auto table = pool_.block_table(sequence_id);
    for (std::size_t i = r0; i < r0 + n; ++i)
      if (i % P_ == 0)
        block_first_pos_[static_cast<std::size_t>(table[i / P_])] = static_cast<std::uint32_t>(appended_ + (i - r0));
    step_result out;
    out.last_logits.resize(static_cast<std::size_t>(model_->config().vocab));
    out.layer_mass.assign(L_, std::vector<float>(r0 + n, 0.0f));
    out.layer_queries.assign(L_, std::vector<float>(n * d_, 0.0f));
    forward(tokens, static_cast<std::uint32_t>(appended_), conv_state_.data(), kv_.data(), 0, &out.layer_mass,
            out.last_logits.data(), &out.layer_queries);
    appended_ += n;
    return out;
  }

  // Greedy decoding of `max_new` tokens after `prompt` over the resident cache (the prompt at the next absolute
  // positions). The session is unchanged afterwards: the prompt's and the answer's K/V live in a side buffer.
  [[nodiscard]] std::vector<std::int32_t> answer(std::span<const std::int32_t> prompt, std::size_t max_new) const {
    if (prompt.empty()) throw std::runtime_error("kv_session::answer: empty prompt");
    model_->check_tokens(prompt, "kv_session::answer");
    std::vector<std::int32_t> out;
    if (max_new == 0) return out;
    out.reserve(max_new);
    conv_probe_ = conv_state_;
    const std::size_t V = static_cast<std::size_t>(model_->config().vocab);
    probe_logits_.resize(V);
    std::size_t side = 0;
    std::uint32_t pos = static_cast<std::uint32_t>(appended_);
    std::span<const std::int32_t> chunk = prompt;
    std::int32_t next = 0;
    for (std::size_t i = 0; i < max_new; ++i) {
      forward(chunk, pos, conv_probe_.data(), nullptr, side, nullptr, probe_logits_.data());
      side += chunk.size();
      pos += static_cast<std::uint32_t>(chunk.size());
      next = static_cast<std::int32_t>(std::max_element(probe_logits_.begin(), probe_logits_.end()) -
                                       probe_logits_.begin());
      out.push_back(next);
      chunk = std::span<const std::int32_t>(&next, 1);
    }
    return out;
  }

  // The keys of resident page `page` (block-table order) into `out`: one row per resident token of the page, each
  // row every layer's keys (RoPE applied), layer after layer, head after head: tokens x (layers x heads x head_dim),
  // the layout memdecay's page digests take with kv_heads = layers x heads.
  //
  // With grouped-query attention the heads are the heads() = n_heads *query* heads: slot j of a layer holds the key
  // of kv head j / (n_heads / n_kv_heads), the key query head j attends with, so each kv head's key appears
  // n_heads / n_kv_heads times in a row. Of the two options for the harness (which multiplies layers() x heads()
  // x head_dim() for keys and pairs them with the queries of layer_queries / prompt_queries, n_heads wide) this is
  // the simpler correct one: every query-key consumer (the attention-free signal, the digests, held_keys' exact
  // recall) works unchanged and computes the true attention logits, where kv-head-wide rows would have needed each
  // of them to learn the grouping (or to throw for n_kv_heads != n_heads). The cost is digests n_heads / n_kv_heads
  // times larger than the pool's keys. Without GQA the rows are the stored keys, as they always were.
  void page_keys(std::size_t page, std::vector<float>& out) const {
    const std::size_t r = resident_tokens();
    if (page * P_ >= r)
      throw std::runtime_error("kv_session::page_keys: page " + std::to_string(page) + " is not resident");
    const std::size_t tokens = std::min(P_, r - page * P_);
    const auto block = static_cast<std::size_t>(pool_.block_table(sequence_id)[page]);
    out.resize(tokens * L_ * d_);
    for (std::size_t t = 0; t < tokens; ++t)
      for (std::size_t l = 0; l < L_; ++l) {
        const float* k = kv_.data() + slab(block, l, 0) + t * kvd_;
        if (group_ == 1) {
          std::copy(k, k + d_, out.data() + (t * L_ + l) * d_);
        } else {
          for (std::size_t h = 0; h < H_; ++h)
            std::copy_n(k + (h / group_) * hd_, hd_, out.data() + (t * L_ + l) * d_ + h * hd_);
        }
      }
  }
  // The queries of the last token of `prompt`, as answer(prompt, ...) would compute them over the resident cache:
  // every layer's (RoPE applied), layer after layer, query head after query head (layers x heads x head_dim), the
  // layout of page_keys' rows. The session is unchanged. What an engine with a host tier has when a question arrives: the
  // query that decides which offloaded pages to bring back before it attends.
  void prompt_queries(std::span<const std::int32_t> prompt, std::vector<float>& out) const {
    if (prompt.empty()) throw std::runtime_error("kv_session::prompt_queries: empty prompt");
    model_->check_tokens(prompt, "kv_session::prompt_queries");
    conv_probe_ = conv_state_;
    probe_logits_.resize(static_cast<std::size_t>(model_->config().vocab));
    std::vector<std::vector<float>> queries(L_, std::vector<float>(prompt.size() * d_, 0.0f));
    forward(prompt, static_cast<std::uint32_t>(appended_), conv_probe_.data(), nullptr, 0, nullptr,
            probe_logits_.data(), &queries);
    out.resize(L_ * d_);
    for (std::size_t l = 0; l < L_; ++l)
      std::copy_n(queries[l].data() + (prompt.size() - 1) * d_, d_, out.data() + l * d_);
  }

  // One block's K/V and the position of its first slot, for a host tier: save_block copies them out of the pool,
  // load_block into a block (the block the pool gave a recalled page: the page returns at its original positions,
  // RoPE already applied to its keys). block_floats() floats per block: layers x {K, V} x page_size x
  // (n_kv_heads x head_dim): the stored rows, d_model wide without grouped-query attention.
  [[nodiscard]] std::size_t block_floats() const noexcept { return L_ * 2 * P_ * kvd_; }
  void save_block(std::int32_t block, std::span<float> kv, std::uint32_t& first_pos) const {
    const auto b = checked_block(block, kv.size(), "save_block");
    std::copy_n(kv_.data() + slab(b, 0, 0), block_floats(), kv.data());
    first_pos = block_first_pos_[b];
  }
  void load_block(std::int32_t block, std::span<const float> kv, std::uint32_t first_pos) {
    const auto b = checked_block(block, kv.size(), "load_block");
    std::copy_n(kv.data(), block_floats(), kv_.data() + slab(b, 0, 0));
    block_first_pos_[b] = first_pos;
  }

  [[nodiscard]] std::size_t layers() const noexcept { return L_; }
  // The query heads (n_heads): the heads of layer_queries, prompt_queries, layer_mass and page_keys' rows.
  [[nodiscard]] std::size_t heads() const noexcept { return H_; }
  // The key/value heads the pool stores (n_kv_heads; heads() without grouped-query attention).
  [[nodiscard]] std::size_t kv_heads() const noexcept { return KV_; }
  [[nodiscard]] std::size_t head_dim() const noexcept { return hd_; }

  [[nodiscard]] pool_type& table() noexcept { return pool_; }
  [[nodiscard]] const pool_type& table() const noexcept { return pool_; }
  [[nodiscard]] std::uint64_t sequence() const noexcept { return sequence_id; }
  [[nodiscard]] std::size_t resident_tokens() const { return pool_.num_tokens(sequence_id); }
  [[nodiscard]] std::size_t appended_tokens() const noexcept { return appended_; }
  [[nodiscard]] std::size_t page_size() const noexcept { return P_; }
  [[nodiscard]] std::size_t max_tokens() const noexcept { return max_tokens_; }
  [[nodiscard]] const tiny_lm& model() const noexcept { return *model_; }
  // Absolute positions of the resident tokens, in block-table order.
  [[nodiscard]] std::vector<std::uint32_t> resident_positions() const {
    const std::size_t r = resident_tokens();
    const auto table = pool_.block_table(sequence_id);
    std::vector<std::uint32_t> out(r);
    for (std::size_t i = 0; i < r; ++i)
      out[i] = block_first_pos_[static_cast<std::size_t>(table[i / P_])] + static_cast<std::uint32_t>(i % P_);
    return out;
  }

 private:
  static constexpr std::uint64_t sequence_id = 0;
  using matrix = tiny_lm::matrix;

  // Offset of the K (kv = 0) or V (kv = 1) row of `slot` in block `block`, layer `layer`.
  [[nodiscard]] std::size_t slab(std::size_t block, std::size_t layer, std::size_t kv) const noexcept {
    return ((block * L_ + layer) * 2 + kv) * P_ * kvd_;
  }
  std::size_t checked_block(std::int32_t block, std::size_t floats, const char* call) const {
    if (block < 0 || static_cast<std::size_t>(block) >= pool_.capacity())
      throw std::runtime_error(std::string("kv_session::") + call + ": block " + std::to_string(block) +
                               " is not one of the pool's " + std::to_string(pool_.capacity()));
    if (floats != block_floats())
      throw std::runtime_error(std::string("kv_session::") + call + ": " + std::to_string(floats) +
                               " floats, a block holds " + std::to_string(block_floats()));
    return static_cast<std::size_t>(block);
  }
  static std::size_t blocks_for(std::size_t page_size, std::size_t max_tokens) {
    if (page_size == 0 || (page_size & (page_size - 1)) != 0)
      throw std::runtime_error("kv_session: page_size " + std::to_string(page_size) + " is not a power of two");
    if (max_tokens == 0) throw std::runtime_error("kv_session: max_tokens must be > 0");
    return (max_tokens + page_size - 1) / page_size;
  }
  static void grow(std::vector<float>& v, std::size_t size) {
    if (v.size() < size) v.resize(std::max(size, v.size() * 2));
  }

  // Runs `tokens` at positions first_pos.. through every layer. With `pool_kv` (append), the chunk is already in
  // the pool as its last tokens: its K/V are written there and query t sees resident tokens [0, r - n + t].
  // Without (answer), query t sees every resident token and the side buffer's [0, side_before + t]; the chunk's
  // K/V are appended to the side buffer. `mass` (append only) accumulates each layer's attention row.
  void forward(std::span<const std::int32_t> tokens, std::uint32_t first_pos, float* conv, float* pool_kv,
               std::size_t side_before, std::vector<std::vector<float>>* mass, float* logits,
               std::vector<std::vector<float>>* queries = nullptr) const {
    const auto& w = model_->weights();
    const std::size_t n = tokens.size(), d = d_, hd = hd_, k = k_;
    const std::size_t qd = H_ * hd_, kvd = kvd_, qw = qkvw_;  // a qkv_ row: H query heads, KV key, KV value heads
    const std::size_t resident = resident_tokens();
    const std::size_t r_before = pool_kv ? resident - n : resident;
    const std::size_t side_total = pool_kv ? 0 : side_before + n;
    const auto table = pool_.block_table(sequence_id);
    const auto rows = static_cast<Eigen::Index>(n);

    grow(x_, n * d);
    grow(h_, n * d);
    if (conv_) {
      grow(e_, (n + k - 1) * d);
      grow(c_, n * d);
    }
    grow(qkv_, n * qw);
    grow(att_, n * d);
    grow(u_, n * model_->mlp_scratch_per_row());
    grow(scores_, n * (resident + side_total));
    grow(acc_, n * hd);
    if (!pool_kv) {
      if (side_kv_.size() < 2 * L_) side_kv_.resize(2 * L_);
      for (auto& buffer : side_kv_) grow(buffer, side_total * kvd);  // keeps the rows already written
    }

    for (std::size_t t = 0; t < n; ++t) {
      const float* src = w.embed.data() + static_cast<std::size_t>(tokens[t]) * d;
      std::copy(src, src + d, x_.data() + t * d);
    }
    for (std::size_t l = 0; l < L_; ++l) {
      const auto& lw = w.layers[l];
      const float* in = h_.data();  // the projections' input: the convolution's output, or the normed rows
      if (conv_) {
        float* state = conv + l * (k - 1) * d;
        // Normed inputs, preceded by the k-1 previous ones; then the state keeps the last k-1 of them.
        model_->rmsnorm_rows(x_.data(), n, lw.norm1.data(), e_.data() + (k - 1) * d);
        std::copy(state, state + (k - 1) * d, e_.data());
        model_->conv_rows(lw, e_.data(), n, c_.data());
        std::copy(e_.data() + n * d, e_.data() + (n + k - 1) * d, state);
        in = c_.data();
      } else {
        model_->rmsnorm_rows(x_.data(), n, lw.norm1.data(), h_.data());
      }
      Eigen::Map<matrix>(qkv_.data(), rows, static_cast<Eigen::Index>(qw)).noalias() =
          Eigen::Map<const matrix>(in, rows, static_cast<Eigen::Index>(d)) * lw.wqkv.transpose();
      // RoPE on q and k, then the chunk's K/V go to their slots.
      for (std::size_t t = 0; t < n; ++t) {
        float* row = qkv_.data() + t * qw;
        model_->apply_rope(row, first_pos + static_cast<std::uint32_t>(t), H_);
        model_->apply_rope(row + qd, first_pos + static_cast<std::uint32_t>(t), KV_);
        if (queries) std::copy(row, row + qd, (*queries)[l].data() + t * qd);
        float *kdst, *vdst;
        if (pool_kv) {
          const std::size_t i = r_before + t;
          const std::size_t block = static_cast<std::size_t>(table[i / P_]), slot = i % P_;
          kdst = pool_kv + slab(block, l, 0) + slot * kvd;
          vdst = pool_kv + slab(block, l, 1) + slot * kvd;
        } else {
          kdst = side_kv_[2 * l].data() + (side_before + t) * kvd;
          vdst = side_kv_[2 * l + 1].data() + (side_before + t) * kvd;
        }
        std::copy(row + qd, row + qd + kvd, kdst);
        std::copy(row + qd + kvd, row + qd + 2 * kvd, vdst);
      }
      const attention_args args{l,
                                n,
                                table,
                                pool_kv ? pool_kv : kv_.data(),
                                pool_kv ? nullptr : side_kv_[2 * l].data(),
                                pool_kv ? nullptr : side_kv_[2 * l + 1].data(),
                                pool_kv != nullptr,
                                r_before,
                                resident,
                                side_before,
                                mass ? (*mass)[l].data() : nullptr};
      switch (hd) {  // fixed head sizes keep a head's query and output in registers
        case 16: n == 1 ? attention<16>(args) : attention_chunk<16>(args); break;
        case 32: n == 1 ? attention<32>(args) : attention_chunk<32>(args); break;
        case 48: n == 1 ? attention<48>(args) : attention_chunk<48>(args); break;
        case 64: n == 1 ? attention<64>(args) : attention_chunk<64>(args); break;
        default: n == 1 ? attention<Eigen::Dynamic>(args) : attention_chunk<Eigen::Dynamic>(args); break;
      }
      Eigen::Map<matrix>(x_.data(), rows, static_cast<Eigen::Index>(d)).noalias() +=
          Eigen::Map<const matrix>(att_.data(), rows, static_cast<Eigen::Index>(d)) * lw.wo.transpose();
      model_->mlp_rows(lw, x_.data(), n, h_.data(), u_.data());
    }
    model_->final_logits(x_.data() + (n - 1) * d, h_.data(), logits);
  }

  struct attention_args {
    std::size_t layer, n;
    std::span<const std::int32_t> table;
    const float *kv, *side_k, *side_v;
    bool pooled;  // append: the chunk is the pool's last n tokens; answer: it is the side buffer's last n
    std::size_t r_before, resident, side_before;
    float* mass;  // the layer's mass row (append) or null
  };

  // Attention of the chunk's n queries (rows of qkv_, RoPE applied) over the resident tokens, read through the
  // block table, and the side buffer; writes the merged heads to att_ and adds each query's probabilities,
  // divided by heads * n, to the mass row. Scores, probabilities and the weighted sum run one (query) head at a
  // time; query head h reads the K/V of kv head h / group_ (kvo below: its offset in a kvd_-wide K or V row).
  // The same for a chunk of n > 1 queries, key-major: each K and V row is read once per head and used by every
  // query of the chunk that sees it (scores [query][column] in scores_, outputs accumulated in acc_).
  template <int HD>
  void attention_chunk(const attention_args& a) const {
    using vec = Eigen::Matrix<float, HD, 1>;
    using cmap = Eigen::Map<const vec>;
    using map = Eigen::Map<vec>;
    const std::size_t d = d_, H = H_, hd = hd_, n = a.n, l = a.layer, kvd = kvd_, qw = qkvw_;
    const auto hdi = static_cast<Eigen::Index>(hd);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const float share = 1.0f / static_cast<float>(H * n);
    // Query t sees resident columns [0, rq(t)) and side columns [0, sq(t)); C is the last query's total.
    const std::size_t r_last = a.pooled ? a.r_before + n : a.resident;
    const std::size_t C = r_last + (a.pooled ? 0 : a.side_before + n);
    auto first_query = [&](std::size_t column) -> std::size_t {  // the first query that sees `column`
      if (column < r_last) return a.pooled && column > a.r_before ? column - a.r_before : 0;
      const std::size_t s = column - r_last;
      return s > a.side_before ? s - a.side_before : 0;
    };
    auto cols_of = [&](std::size_t t) { return a.pooled ? a.r_before + t + 1 : a.resident + a.side_before + t + 1; };
    auto rq_of = [&](std::size_t t) { return a.pooled ? a.r_before + t + 1 : a.resident; };
    float* S = scores_.data();
    float* acc = acc_.data();
    for (std::size_t h = 0; h < H; ++h) {
      const std::size_t off = h * hd, kvo = (h / group_) * hd;
      // Scores.
      auto score_column = [&](std::size_t j, const float* krow) {
        const cmap k(krow, hdi);
        for (std::size_t t = first_query(j); t < n; ++t)
          S[t * C + j] = cmap(qkv_.data() + t * qw + off, hdi).dot(k) * scale;
      };
      for (std::size_t b = 0, j = 0; j < r_last; ++b) {
        const std::size_t slots = std::min(P_, r_last - j);
        const float* kb = a.kv + slab(static_cast<std::size_t>(a.table[b]), l, 0) + kvo;
        for (std::size_t s = 0; s < slots; ++s, ++j) score_column(j, kb + s * kvd);
      }
      for (std::size_t j = r_last; j < C; ++j) score_column(j, a.side_k + (j - r_last) * kvd + kvo);
      // Softmax per query (over the columns it sees), and the mass.
      for (std::size_t t = 0; t < n; ++t) {
        float* st = S + t * C;
        const std::size_t cols = cols_of(t), rq = rq_of(t);
        // Columns a query sees: resident [0, rq), then side [r_last, r_last + cols - rq).
        float mx = -std::numeric_limits<float>::infinity();
        for (std::size_t i = 0; i < rq; ++i) mx = std::max(mx, st[i]);
        for (std::size_t i = r_last; i < r_last + cols - rq; ++i) mx = std::max(mx, st[i]);
        float sum = 0;
        for (std::size_t i = 0; i < rq; ++i) sum += (st[i] = std::exp(st[i] - mx));
        for (std::size_t i = r_last; i < r_last + cols - rq; ++i) sum += (st[i] = std::exp(st[i] - mx));
        for (std::size_t i = 0; i < rq; ++i) st[i] /= sum;
        for (std::size_t i = r_last; i < r_last + cols - rq; ++i) st[i] /= sum;
        if (a.mass)
          for (std::size_t i = 0; i < rq; ++i) a.mass[i] += st[i] * share;
      }
      // Outputs.
      std::fill(acc, acc + n * hd, 0.0f);
      auto value_column = [&](std::size_t j, const float* vrow) {
        const std::conditional_t<HD == Eigen::Dynamic, cmap, vec> v = cmap(vrow, hdi);  // fixed: in registers
        for (std::size_t t = first_query(j); t < n; ++t) map(acc + t * hd, hdi).noalias() += S[t * C + j] * v;
      };
      for (std::size_t b = 0, j = 0; j < r_last; ++b) {
        const std::size_t slots = std::min(P_, r_last - j);
        const float* vb = a.kv + slab(static_cast<std::size_t>(a.table[b]), l, 1) + kvo;
        for (std::size_t s = 0; s < slots; ++s, ++j) value_column(j, vb + s * kvd);
      }
      for (std::size_t j = r_last; j < C; ++j) value_column(j, a.side_v + (j - r_last) * kvd + kvo);
      for (std::size_t t = 0; t < n; ++t) std::copy(acc + t * hd, acc + (t + 1) * hd, att_.data() + t * d + off);
    }
  }

  template <int HD>
  void attention(const attention_args& a) const {
    using vec = Eigen::Matrix<float, HD, 1>;
    using cmap = Eigen::Map<const vec>;
    const std::size_t d = d_, H = H_, hd = hd_, n = a.n, l = a.layer, kvd = kvd_, qw = qkvw_;
    const auto hdi = static_cast<Eigen::Index>(hd);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const float share = 1.0f / static_cast<float>(H * n);
    for (std::size_t t = 0; t < n; ++t) {
      const float* q = qkv_.data() + t * qw;
      float* o = att_.data() + t * d;
      const std::size_t rq = a.pooled ? a.r_before + t + 1 : a.resident;  // resident tokens this query sees
      const std::size_t sq = a.pooled ? 0 : a.side_before + t + 1;        // side tokens this query sees
      float* sc = scores_.data();
      for (std::size_t h = 0; h < H; ++h) {
        const std::size_t off = h * hd, kvo = (h / group_) * hd;  // query head h reads kv head h / group_
        auto run = [&](const auto& qh, auto acc) {                // acc by value: kept in registers
          float mx = -std::numeric_limits<float>::infinity();
          for (std::size_t b = 0, i = 0; i < rq; ++b) {
            const std::size_t slots = std::min(P_, rq - i);
            const float* kb = a.kv + slab(static_cast<std::size_t>(a.table[b]), l, 0) + kvo;
            for (std::size_t s = 0; s < slots; ++s, ++i)
              mx = std::max(mx, sc[i] = qh.dot(cmap(kb + s * kvd, hdi)) * scale);
          }
          for (std::size_t s = 0; s < sq; ++s)
            mx = std::max(mx, sc[rq + s] = qh.dot(cmap(a.side_k + s * kvd + kvo, hdi)) * scale);
          const std::size_t cols = rq + sq;
          float sum = 0;
          for (std::size_t i = 0; i < cols; ++i) sum += (sc[i] = std::exp(sc[i] - mx));
          for (std::size_t i = 0; i < cols; ++i) sc[i] /= sum;
          if (a.mass)
            for (std::size_t i = 0; i < rq; ++i) a.mass[i] += sc[i] * share;
          for (std::size_t b = 0, i = 0; i < rq; ++b) {
            const std::size_t slots = std::min(P_, rq - i);
            const float* vb = a.kv + slab(static_cast<std::size_t>(a.table[b]), l, 1) + kvo;
            for (std::size_t s = 0; s < slots; ++s, ++i) acc.noalias() += sc[i] * cmap(vb + s * kvd, hdi);
          }
          for (std::size_t s = 0; s < sq; ++s) acc.noalias() += sc[rq + s] * cmap(a.side_v + s * kvd + kvo, hdi);
          return acc;
        };
        if constexpr (HD == Eigen::Dynamic) {
          const Eigen::Map<const Eigen::VectorXf> qh(q + off, hdi);
          Eigen::Map<Eigen::VectorXf> acc(o + off, hdi);
          acc.setZero();
          run(qh, acc);
        } else {
          const vec qh = cmap(q + off);
          Eigen::Map<vec>(o + off) = run(qh, vec::Zero().eval());
        }
      }
    }
  }

  const tiny_lm* model_;
  std::size_t P_, max_tokens_;
  std::size_t d_ = 0, L_ = 0, H_ = 0, hd_ = 0, k_ = 0;
  std::size_t KV_ = 0, group_ = 1, kvd_ = 0, qkvw_ = 0;  // kv heads, query heads per kv head, K/V row, qkv_ row
  bool conv_ = true;                                     // the conv architecture (k_ > 0 taps)
  pool_type pool_;
  std::vector<float> kv_;                       // [block][layer][K|V][slot][n_kv_heads x head_dim]
  std::vector<std::uint32_t> block_first_pos_;  // absolute position of each block's slot 0
  std::vector<float> conv_state_;               // [layer][k-1][d_model] (empty without a convolution)
  std::size_t appended_ = 0;
  // Scratch (reused across calls; grows only).
  mutable std::vector<float> x_, h_, e_, c_, qkv_, att_, u_, scores_, acc_, conv_probe_, probe_logits_;
  mutable std::vector<std::vector<float>> side_kv_;  // answer(): [layer][K|V] rows (kvd_ wide) of the probe's tokens
};

}  // namespace memdecay_eval

#endif  // MEMDECAY_EVAL_ENGINE_KV_SESSION_HPP
