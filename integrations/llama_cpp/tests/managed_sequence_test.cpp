// SPDX-License-Identifier: Apache-2.0
// managed_sequence: memdecay's sequence driving llama.cpp's cache end to end, on the committed LLaMA model.
#include <memdecay/llama_cpp/managed_sequence.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

namespace {

namespace md = memdecay;
namespace lc = memdecay::llama_cpp;
using json = nlohmann::json;

std::shared_ptr<const lc::model> the_model() {
  const char* p = std::getenv("MEMDECAY_LLAMA_TEST_MODEL");
  static auto m = lc::model::load(p != nullptr ? p : MEMDECAY_LLAMA_TEST_MODEL);
  return m;
}

md::config lifetime_config(std::size_t budget) {
  md::config cfg;
  cfg.page_size = 16;
  cfg.normalization = md::attention_normalization::lifetime;
  cfg.alpha = 1.0;
  cfg.tau = 2.0;
  cfg.protection = {.sink_pages = 0, .recent_tokens = 16};
  cfg.budget = md::budget_config::tokens(static_cast<double>(budget));
  return cfg;
}

struct fact {
  llama_token key, answer;
};

// The system prompt of episode 0 with its facts, then the other segments of every episode of both need-aligned
// files, again and again, until `total` tokens were appended (keys of the system facts replaced by filler in the
// later segments, so that no later fact redefines them). Returns the facts' recall at the end.
double long_session_system_recall(lc::position_mode mode, std::size_t total, std::size_t* appended) {
  json files[2];
  for (int f = 0; f < 2; ++f) {
    std::ifstream in(f == 0 ? MEMDECAY_LLAMA_TEST_EPISODES : MEMDECAY_LLAMA_TEST_EPISODES_LONG);
    files[f] = json::parse(in);
  }
  const auto& ep0 = files[0]["episodes"][0];
  const auto& sys = ep0["segments"][0];
  EXPECT_EQ(sys["region"], "system");
  const std::size_t sys_len = sys["length"].get<std::size_t>();
  std::vector<fact> facts;
  std::set<llama_token> keys;
  // The grammar's facts (docs/models.md): a key token followed by a value token.
  const auto& v = files[0]["vocab_layout"];
  const auto k0 = v["key_first"].get<llama_token>(), k1 = k0 + v["key_count"].get<llama_token>();
  const auto v0 = v["value_first"].get<llama_token>(), v1 = v0 + v["value_count"].get<llama_token>();
  const auto tokens0 = ep0["tokens"].get<std::vector<llama_token>>();
  for (std::size_t i = 0; i + 1 < sys_len; ++i)
    if (tokens0[i] >= k0 && tokens0[i] < k1 && tokens0[i + 1] >= v0 && tokens0[i + 1] < v1 &&
        keys.insert(tokens0[i]).second)
      facts.push_back({tokens0[i], tokens0[i + 1]});
  EXPECT_GE(facts.size(), 3u);
  lc::session_options o;
  o.n_ctx = 1024;
  o.n_batch = 32;
  o.positions = mode;
  lc::managed_sequence<> seq(the_model(), o, lifetime_config(512));
  seq.append(md::regions::system, std::span<const llama_token>(tokens0.data(), sys_len));
  const md::region_table table = md::default_region_table();
  std::size_t n = sys_len;
  while (n < total)
    for (int f = 0; f < 2 && n < total; ++f)
      for (const auto& ep : files[f]["episodes"]) {
        const auto t = ep["tokens"].get<std::vector<llama_token>>();
        for (const auto& s : ep["segments"]) {
          if (s["region"] == "system" || n >= total) continue;
          const std::size_t first = s["first"].get<std::size_t>(), len = s["length"].get<std::size_t>();
          std::vector<llama_token> body(t.begin() + first, t.begin() + first + len);
          for (auto& tok : body)
            if (keys.contains(tok)) tok = 300;
          seq.append(*table.find(s["region"].get<std::string>()), body);
          n += len;
        }
      }
  *appended = n;
  std::size_t ok = 0;
  for (const auto& f : facts) {
    const llama_token prompt[] = {2, f.key};
    ok += seq.probe(prompt, 1).front() == f.answer ? 1 : 0;
  }
  EXPECT_LE(seq.llama().resident(), 512u + 32u);
  EXPECT_EQ(seq.llama().resident(), seq.policy().kv_len());
  return static_cast<double>(ok) / static_cast<double>(facts.size());
}

// The requirement: a session ten times longer than the model's training context still answers its pinned
// system prompt's facts. With compacted positions the distances stay those the model was trained on; with
// absolute ones they grow past anything it saw (docs/llama-cpp.md reports both).
TEST(LlamaCppManagedSequence, ASessionTenTimesTheTrainingContextStillAnswersItsPinnedSystemFacts) {
  const std::size_t total = 10 * the_model()->n_ctx_train();
  std::size_t appended = 0;
  const double compact = long_session_system_recall(lc::position_mode::compact, total, &appended);
  EXPECT_GE(appended, total);
  EXPECT_EQ(compact, 1.0);
  const double absolute = long_session_system_recall(lc::position_mode::absolute, total, &appended);
  std::printf("system facts after %zu tokens (budget 512): compact positions %.0f%%, absolute %.0f%%\n", appended,
              100 * compact, 100 * absolute);
}

// Flash attention on: no probabilities exist, and the policy observes the attention-free signal from llama.cpp's
// queries and keys (page digests). Episode 0 of the 1,700-token need-aligned file under a 25% budget keeps its
// pinned system facts; compaction is refused for this signal.
TEST(LlamaCppManagedSequence, WithFlashAttentionTheAttentionFreeSignalDrivesEviction) {
  std::ifstream in(MEMDECAY_LLAMA_TEST_EPISODES_LONG);
  const json file = json::parse(in);
  const auto& ep = file["episodes"][0];
  const auto tokens = ep["tokens"].get<std::vector<llama_token>>();
  lc::session_options o;
  o.n_ctx = 1024;
  o.n_batch = 32;
  o.flash_attention = true;
  o.capture_attention = false;
  o.capture_queries = true;
  lc::managed_sequence<> seq(the_model(), o, lifetime_config(425));
  ASSERT_TRUE(seq.attention_free());
  const md::region_table table = md::default_region_table();
  std::size_t evicted = 0;
  for (const auto& s : ep["segments"]) {
    const std::size_t first = s["first"].get<std::size_t>(), len = s["length"].get<std::size_t>();
    evicted += seq.append(*table.find(s["region"].get<std::string>()),
                          std::span<const llama_token>(tokens.data() + first, len));
  }
  EXPECT_GT(evicted, 50u);
  EXPECT_TRUE(seq.policy().has_digests());
  EXPECT_EQ(seq.llama().resident(), seq.policy().kv_len());
  const auto& sys = ep["segments"][0];
  ASSERT_EQ(sys["region"], "system");
  const auto& v = file["vocab_layout"];
  const auto k0 = v["key_first"].get<llama_token>(), k1 = k0 + v["key_count"].get<llama_token>();
  std::size_t facts = 0, ok = 0;
  for (std::size_t i = 0; i + 1 < sys["length"].get<std::size_t>(); ++i)
    if (tokens[i] >= k0 && tokens[i] < k1) {
      const llama_token prompt[] = {2, tokens[i]};
      ++facts;
      ok += seq.probe(prompt, 1).front() == tokens[i + 1] ? 1 : 0;
    }
  EXPECT_GE(facts, 3u);
  EXPECT_EQ(ok, facts);
  lc::session_options compact = o;
  compact.positions = lc::position_mode::compact;
  EXPECT_THROW(lc::managed_sequence<>(the_model(), compact, lifetime_config(425)), md::config_error);
}

TEST(LlamaCppManagedSequence, ThePolicyAndLlamaCppHoldTheSameTokens) {
  lc::session_options o;
  o.n_ctx = 512;
  o.n_batch = 32;
  lc::managed_sequence<> seq(the_model(), o, lifetime_config(256));
  std::vector<llama_token> t(700);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<llama_token>(256 + (i * 7) % 256);
  t[0] = 1;
  const std::size_t evicted = seq.append(md::regions::tool_out, t);
  EXPECT_GT(evicted, 0u);
  const auto pos = seq.llama().resident_positions();
  ASSERT_EQ(pos.size(), seq.policy().kv_len());
  for (std::size_t i = 0; i < pos.size(); ++i) ASSERT_EQ(pos[i], seq.policy().position_of(i)) << i;
  EXPECT_EQ(seq.policy().now(), (700 + 31) / 32);
}

}  // namespace
