// SPDX-License-Identifier: Apache-2.0
// llama_cpp::session on the real llama.cpp with the committed LLaMA-architecture model: llama.cpp's logits equal
// PyTorch's, attention is attributed to the right tokens after cells are freed and reused, eviction and forks
// leave llama.cpp as memdecay believes it is, and bad input is refused with nothing changed.
#include <memdecay/llama_cpp/session.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

namespace {

namespace lc = memdecay::llama_cpp;
using json = nlohmann::json;

std::string path_from(const char* env, const char* fallback) {
  const char* p = std::getenv(env);
  return p != nullptr ? p : fallback;
}

std::shared_ptr<const lc::model> the_model() {
  static auto m = lc::model::load(path_from("MEMDECAY_LLAMA_TEST_MODEL", MEMDECAY_LLAMA_TEST_MODEL));
  return m;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

std::vector<llama_token> episode_tokens(std::size_t n) {
  const auto f = read_json(MEMDECAY_LLAMA_TEST_EPISODES);
  std::vector<llama_token> t;
  for (const auto& v : f["episodes"][0]["tokens"]) {
    if (t.size() == n) break;
    t.push_back(v.get<llama_token>());
  }
  return t;
}

lc::session_options small_context(lc::position_mode m = lc::position_mode::absolute) {
  lc::session_options o;
  o.n_ctx = 512;
  o.positions = m;
  return o;
}

// The largest |logit difference| between llama.cpp and the PyTorch fixture over every position, and whether the
// last position's greedy answer is the fixture's.
std::pair<double, bool> against_pytorch(bool f32_cache) {
  const auto fx = read_json(path_from("MEMDECAY_LLAMA_TEST_FIXTURE", MEMDECAY_LLAMA_TEST_FIXTURE));
  const auto tokens = fx["tokens"].get<std::vector<llama_token>>();
  lc::session_options o = small_context();
  o.capture_attention = false;
  o.f32_cache = f32_cache;
  lc::session s(the_model(), o);
  double worst = 0.0;
  std::vector<float> last;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    last = s.decode(std::span<const llama_token>(&tokens[i], 1)).last_logits;
    const auto& want = fx["logits"][i];
    for (std::size_t v = 0; v < last.size(); ++v)
      worst = std::max(worst, std::abs(static_cast<double>(last[v]) - want[v].get<double>()));
  }
  const auto top = std::max_element(last.begin(), last.end()) - last.begin();
  return {worst, top == fx["predicted"].get<long>()};
}

// The tolerances of docs/llama-cpp.md: float32 cells differ from PyTorch by summation order only (measured
// 7.6e-5); llama.cpp's default f16 cells round every cached key and value (measured 0.067, the greedy answer the
// same).
TEST(LlamaCppSession, LogitsEqualPyTorchsWithinTolerance) {
  const auto [f32, f32_same] = against_pytorch(true);
  EXPECT_LT(f32, 1e-3);
  EXPECT_TRUE(f32_same);
  const auto [f16, f16_same] = against_pytorch(false);
  EXPECT_LT(f16, 0.15);
  EXPECT_TRUE(f16_same);
  std::printf("max |logit difference| against PyTorch: f32 cells %.2e, f16 cells %.2e\n", f32, f16);
}

TEST(LlamaCppSession, CapturedRowsSumToOneOverTheResidentTokens) {
  lc::session s(the_model(), small_context());
  const auto t = episode_tokens(96);
  for (std::size_t first = 0; first < t.size(); first += 32) {
    const auto r = s.decode(std::span<const llama_token>(t.data() + first, 32));
    ASSERT_EQ(r.layer_mass.size(), the_model()->layers());
    for (const auto& row : r.layer_mass) {
      ASSERT_EQ(row.size(), first + 32);
      EXPECT_NEAR(std::accumulate(row.begin(), row.end(), 0.0), 1.0, 1e-4);
    }
  }
  EXPECT_EQ(s.mirror().held(), 96u);
}

// Cells are not positions: after a removal frees cells in the middle, the next tokens reuse them. Two sessions
// decode the same tokens and remove the same ranges; in the second, another sequence takes the freed cells first
// (raw llama_decode on sequence 1, which the mask hides from sequence 0), so the same live tokens sit in other
// cells. The attention per logical position must be the same in both (up to the summation order over a
// differently padded cell range), in both position modes.
TEST(LlamaCppSession, AttentionIsAttributedByPositionWhicheverCellsHoldIt) {
  for (auto mode : {lc::position_mode::absolute, lc::position_mode::compact}) {
    lc::session a(the_model(), small_context(mode)), b(the_model(), small_context(mode));
    const auto t = episode_tokens(200);
    const memdecay::llama_position_range gone[] = {{10, 40}, {41, 44}, {100, 101}};
    for (auto* s : {&a, &b}) {
      s->decode(std::span<const llama_token>(t.data(), 120));
      s->remove(gone);
      ASSERT_EQ(s->resident(), 120u - 34u);
    }
    if (mode == lc::position_mode::compact) {
      EXPECT_EQ(a.next_llama_pos(), 86);
      EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(a.context()), 0), 85);
    }
    llama_batch other = llama_batch_init(40, 0, 1);
    other.n_tokens = 40;
    for (int i = 0; i < 40; ++i) {
      other.token[i] = 300;
      other.pos[i] = i;
      other.n_seq_id[i] = 1;
      other.seq_id[i][0] = 1;
      other.logits[i] = i == 39;
    }
    ASSERT_EQ(llama_decode(b.context(), other), 0);
    llama_batch_free(other);
    double worst = 0.0;
    for (std::size_t i = 120; i < 150; ++i) {
      const auto ra = a.decode(std::span<const llama_token>(&t[i], 1));
      const auto rb = b.decode(std::span<const llama_token>(&t[i], 1));
      ASSERT_EQ(ra.layer_mass.size(), rb.layer_mass.size());
      for (std::size_t l = 0; l < ra.layer_mass.size(); ++l) {
        ASSERT_EQ(ra.layer_mass[l].size(), rb.layer_mass[l].size());
        for (std::size_t k = 0; k < ra.layer_mass[l].size(); ++k)
          worst = std::max(worst, static_cast<double>(std::abs(ra.layer_mass[l][k] - rb.layer_mass[l][k])));
      }
    }
    EXPECT_LT(worst, 1e-5) << to_string(mode);
    // The two sessions really hold the live tokens in different cells.
    std::size_t moved = 0;
    for (std::size_t c = 0; c < std::max(a.mirror().cells(), b.mirror().cells()); ++c)
      moved += a.mirror().position(c) != b.mirror().position(c) ? 1 : 0;
    EXPECT_GE(moved, 30u) << to_string(mode);
    EXPECT_EQ(a.mirror().held(), a.resident());
    EXPECT_EQ(b.mirror().held(), b.resident());
  }
}

TEST(LlamaCppSession, AProbeOnAForkLeavesTheLiveSequenceBitIdentical) {
  const auto t = episode_tokens(140);
  lc::session a(the_model(), small_context()), b(the_model(), small_context());
  a.decode(std::span<const llama_token>(t.data(), 128));
  b.decode(std::span<const llama_token>(t.data(), 128));
  const llama_token prompt[] = {2, t[5]};
  const auto answer = a.probe(prompt, 2);
  EXPECT_EQ(answer.size(), 2u);
  const auto ra = a.decode(std::span<const llama_token>(t.data() + 128, 12));
  const auto rb = b.decode(std::span<const llama_token>(t.data() + 128, 12));
  EXPECT_EQ(ra.last_logits, rb.last_logits);
  EXPECT_EQ(ra.layer_mass, rb.layer_mass);
}

TEST(LlamaCppSession, BadInputIsRefusedAndChangesNothing) {
  lc::session s(the_model(), small_context());
  const auto t = episode_tokens(64);
  s.decode(std::span<const llama_token>(t.data(), 64));
  const llama_token bad[] = {1, 5000};
  try {
    s.decode(bad);
    FAIL();
  } catch (const memdecay::input_error& e) {
    EXPECT_NE(std::string(e.what()).find("tokens[1] = 5000"), std::string::npos) << e.what();
  }
  const memdecay::llama_position_range twice[] = {{3, 8}, {6, 9}};
  EXPECT_THROW(s.remove(twice), memdecay::input_error);
  const memdecay::llama_position_range beyond[] = {{60, 70}};
  EXPECT_THROW(s.remove(beyond), memdecay::input_error);
  EXPECT_EQ(s.resident(), 64u);
  EXPECT_EQ(llama_memory_seq_pos_min(llama_get_memory(s.context()), 0), 0);
  EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(s.context()), 0), 63);
  std::vector<llama_token> many(600, 300);
  EXPECT_THROW(s.decode(many), memdecay::input_error);
  EXPECT_EQ(s.resident(), 64u);

  lc::session_options fa = small_context();
  fa.flash_attention = true;
  try {
    lc::session x(the_model(), fa);
    FAIL();
  } catch (const memdecay::config_error& e) {
    EXPECT_NE(std::string(e.what()).find("flash_attention"), std::string::npos) << e.what();
  }
  fa.capture_attention = false;  // flash attention without capture is fine
  lc::session y(the_model(), fa);
  EXPECT_TRUE(y.decode(std::span<const llama_token>(t.data(), 8)).layer_mass.empty());
}

// Cells freed behind the session's back (a raw llama_memory_seq_rm the mirror never saw): the next mask hides
// cells the mirror holds, which is refused, and the batch is rolled back, the session as before the call.
TEST(LlamaCppSession, AMaskThatDisagreesWithTheMirrorIsRefusedAndRolledBack) {
  lc::session s(the_model(), small_context());
  const auto t = episode_tokens(80);
  s.decode(std::span<const llama_token>(t.data(), 64));
  ASSERT_TRUE(llama_memory_seq_rm(llama_get_memory(s.context()), lc::session::seq_live, 10, 20));
  try {
    s.decode(std::span<const llama_token>(t.data() + 64, 8));
    FAIL() << "a mask that disagrees with the mirror was accepted";
  } catch (const memdecay::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("disagrees with memdecay's cell mirror"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("in the mirror, but the mask hides it"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.resident(), 64u);
  EXPECT_EQ(s.appended(), 64u);
  EXPECT_EQ(s.mirror().held(), 64u);
  EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(s.context()), lc::session::seq_live), 63);
}

// The queries and keys after RoPE (what the attention-free signal reads, with flash attention on or off) are the
// ones llama.cpp's attention used: softmax(q . k / sqrt(head_dim)) over the resident tokens, averaged over the
// query heads (GQA: head h reads KV head h / (H / KV)), is the captured kq_soft_max row, in either position mode.
TEST(LlamaCppSession, CapturedQueriesAndKeysReproduceLlamaCppsAttention) {
  for (auto mode : {lc::position_mode::absolute, lc::position_mode::compact}) {
    lc::session_options o = small_context(mode);
    o.capture_queries = true;
    o.f32_cache = true;
    lc::session s(the_model(), o);
    const auto& m = *the_model();
    const std::size_t L = m.layers(), H = m.heads(), KV = m.kv_heads(), hd = m.head_dim();
    const auto t = episode_tokens(100);
    std::vector<std::vector<float>> keys(L);  // [layer][resident token][KV x hd]
    auto keep = [&](const lc::decode_result& r) {
      for (std::size_t l = 0; l < L; ++l) keys[l].insert(keys[l].end(), r.layer_keys[l].begin(), r.layer_keys[l].end());
    };
    keep(s.decode(std::span<const llama_token>(t.data(), 96)));
    if (mode == lc::position_mode::absolute) {  // compaction re-rotates the cached keys: only absolute removes here
      const memdecay::llama_position_range gone[] = {{20, 36}};
      s.remove(gone);
      for (auto& k : keys) k.erase(k.begin() + 20 * KV * hd, k.begin() + 36 * KV * hd);
    }
    const auto r = s.decode(std::span<const llama_token>(&t[96], 1));
    keep(r);
    ASSERT_EQ(r.layer_queries.size(), L);
    ASSERT_EQ(r.layer_queries[0].size(), H * hd);
    const std::size_t n = s.resident();
    double worst = 0.0;
    for (std::size_t l = 0; l < L; ++l) {
      ASSERT_EQ(keys[l].size(), n * KV * hd);
      std::vector<double> want(n, 0.0);
      for (std::size_t h = 0; h < H; ++h) {
        const float* q = r.layer_queries[l].data() + h * hd;
        std::vector<double> logit(n);
        double top = -1e300;
        for (std::size_t j = 0; j < n; ++j) {
          const float* k = keys[l].data() + (j * KV + h / (H / KV)) * hd;
          double dot = 0;
          for (std::size_t c = 0; c < hd; ++c) dot += static_cast<double>(q[c]) * k[c];
          logit[j] = dot / std::sqrt(static_cast<double>(hd));
          top = std::max(top, logit[j]);
        }
        double z = 0;
        for (auto& v : logit) z += (v = std::exp(v - top));
        for (std::size_t j = 0; j < n; ++j) want[j] += logit[j] / z / static_cast<double>(H);
      }
      for (std::size_t j = 0; j < n; ++j) worst = std::max(worst, std::abs(want[j] - r.layer_mass[l][j]));
    }
    EXPECT_LT(worst, 1e-5) << to_string(mode);
  }
}

TEST(LlamaCppSession, AFileThatIsNotAModelIsAConfigError) {
  EXPECT_THROW(lc::model::load("/no/such/model.gguf"), memdecay::config_error);
  EXPECT_THROW((void)the_model()->chat_template(), memdecay::config_error);  // the synthetic model has none
}

}  // namespace
