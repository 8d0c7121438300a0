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

// The tolerances of docs/llama-cpp.md: float32 cells differ from PyTorch by summation order only; llama.cpp's
// default f16 cells round every cached key and value.
TEST(LlamaCppSession, LogitsEqualPyTorchsWithinTolerance) {
  const auto [f32, f32_same] = against_pytorch(true);
  EXPECT_LT(f32, 1e-3);
  EXPECT_TRUE(f32_same);
  const auto [f16, f16_same] = against_pytorch(false);
  EXPECT_LT(f16, 5e-2);
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

// Layer 0 of the model is a previous-token head (python/llama_model.py's circuit): a single decoded token puts
// most of its layer-0 mass on the token before it. After a removal frees cells that the next tokens reuse, the
// mass must still land on the previous token's logical position, wherever its cell is.
TEST(LlamaCppSession, AttentionFollowsTheTokenWhenCellsAreReused) {
  for (auto mode : {lc::position_mode::absolute, lc::position_mode::compact}) {
    lc::session s(the_model(), small_context(mode));
    const auto t = episode_tokens(200);
    s.decode(std::span<const llama_token>(t.data(), 120));
    const memdecay::llama_position_range gone[] = {{10, 40}, {41, 44}, {100, 101}};
    s.remove(gone);
    ASSERT_EQ(s.resident(), 120u - 34u);
    if (mode == lc::position_mode::compact) {
      EXPECT_EQ(s.next_llama_pos(), 86);
      EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(s.context()), 0), 85);
    }
    for (std::size_t i = 120; i < 150; ++i) {
      const auto r = s.decode(std::span<const llama_token>(&t[i], 1));
      const auto& l0 = r.layer_mass[0];
      const std::size_t top = static_cast<std::size_t>(std::max_element(l0.begin(), l0.end()) - l0.begin());
      EXPECT_EQ(s.resident_positions()[top], i - 1) << to_string(mode) << ": token " << i;
    }
    EXPECT_EQ(s.mirror().held(), s.resident());
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

TEST(LlamaCppSession, AFileThatIsNotAModelIsAConfigError) {
  EXPECT_THROW(lc::model::load("/no/such/model.gguf"), memdecay::config_error);
  EXPECT_THROW(the_model()->chat_template(), memdecay::config_error);  // the synthetic model has none
}

}  // namespace
