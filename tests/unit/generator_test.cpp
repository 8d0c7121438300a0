// Tests for trace_generator.hpp: determinism (same seed, same bytes), the episode shape (exact tier lengths,
// valid traces), clustered facts with a spread of ages, and the documented attention model, recomputed
// independently from its formula.
#include <gtest/gtest.h>

#include <memdecay/io/trace_generator.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>
#include <set>
#include <vector>

namespace md = memdecay;
namespace tr = memdecay::trace;

namespace {

tr::generator_config small(std::uint64_t seed = 3) { return tr::tier_config(450, seed); }

}  // namespace

TEST(Generator, SameSeedSameBytesOtherSeedOtherBytes) {
  const auto a = tr::encode(tr::generate_tier(small(), 60));
  const auto b = tr::encode(tr::generate_tier(small(), 60));
  const auto c = tr::encode(tr::generate_tier(small(4), 60));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Any episode can be regenerated alone from its seed.
  const auto tier = tr::generate_tier(small(), 60);
  ASSERT_GE(tier.episodes.size(), 2u);
  const auto again = tr::generate_episode(small(), tr::episode_seed(small(), 1), tier.episodes[1].name);
  EXPECT_EQ(again, tier.episodes[1]);
  EXPECT_EQ(tier.episodes[1].seed, tr::episode_seed(small(), 1));
}

TEST(Generator, TiersHaveExactLengthsAndValidTraces) {
  for (std::uint32_t tokens : {450u, 1700u}) {
    const auto f = tr::generate_tier(tr::tier_config(tokens, 9), 100);
    EXPECT_EQ(f.label, "tier-" + std::to_string(tokens));
    EXPECT_GE(f.count_probes(), 100u);
    EXPECT_FALSE(tr::check(f).has_value()) << tr::check(f)->message;
    EXPECT_EQ(f.region_names, tr::default_region_names());
    for (const auto& ep : f.episodes) {
      EXPECT_EQ(ep.total_tokens(), tokens);
      // Opens with the system prompt, the user's task and the plan.
      const auto labels = ep.labels();
      EXPECT_EQ(labels.front(), md::regions::system);
      std::set<md::region_id> present(labels.begin(), labels.end());
      EXPECT_GE(present.size(), 4u);
    }
  }
}

TEST(Generator, RowsSumToOneOverEveryAppendedPosition) {
  auto c = small();
  c.layers = 3;
  const auto ep = tr::generate_episode(c, 77, "e");
  std::size_t observations = 0;
  for (const auto& ev : ep.events) {
    const auto* a = std::get_if<tr::attention>(&ev);
    if (!a) continue;
    ++observations;
    ASSERT_EQ(a->layers.size(), 3u);
    for (const auto& row : a->layers) {
      ASSERT_FALSE(row.sparse);
      ASSERT_EQ(row.mass.size(), a->context);
      double sum = 0;
      for (float m : row.mass) {
        ASSERT_TRUE(std::isfinite(m));
        ASSERT_GE(m, 0.0f);
        sum += m;
      }
      EXPECT_NEAR(sum, 1.0, 1e-4);
    }
    EXPECT_NE(a->layers[0].mass, a->layers[2].mass);  // layers differ
  }
  EXPECT_GT(observations, 40u);
}

TEST(Generator, FactsClusterInBodiesWithASpreadOfAges) {
  const auto c = tr::tier_config(1700, 5);
  std::map<md::region_id, std::size_t> per_region;
  std::size_t facts = 0, fact_tokens = 0, pages_with_facts = 0, pages = 0, clustered = 0, young = 0, old = 0;
  for (std::uint64_t k = 0; k < 20; ++k) {
    std::vector<tr::planted_fact> planted;
    const auto ep = tr::generate_episode(c, tr::episode_seed(c, k), "e", &planted);
    ASSERT_EQ(planted.size(), ep.count_probes());
    const auto last = ep.last_step();
    std::set<std::uint32_t> fact_pages;
    for (const auto& f : planted) {
      ++facts;
      ++per_region[f.query.region];
      fact_tokens += f.query.length;
      EXPECT_GT(f.query.step, f.planted);
      EXPECT_LE(f.query.step, last);
      const auto age = f.query.step - f.planted;
      young += age <= 10;
      old += age >= last / 2;
      for (std::uint32_t p = f.query.first / 16; p <= (f.query.first + f.query.length - 1) / 16; ++p)
        fact_pages.insert(p);
      // A fact in a body has a neighbour within a few tokens (a dense cluster), unless it is the only survivor
      // of its cluster (the others were planted too late to be asked).
      if (f.query.region == md::regions::tool_out || f.query.region == md::regions::retrieval) {
        for (const auto& g : planted)
          if (&g != &f && g.query.region == f.query.region &&
              ((g.query.first >= f.query.first + f.query.length &&
                g.query.first <= f.query.first + f.query.length + 3) ||
               (f.query.first >= g.query.first + g.query.length &&
                f.query.first <= g.query.first + g.query.length + 3))) {
            ++clustered;
            break;
          }
      }
    }
    pages += 1700 / 16;
    pages_with_facts += fact_pages.size();
  }
  // Facts in every region but the pinned-by-default system prompt is planted too.
  for (md::region_id r = 0; r < md::regions::default_count; ++r) EXPECT_GT(per_region[r], 0u) << int{r};
  const std::size_t body_facts = per_region[md::regions::tool_out] + per_region[md::regions::retrieval];
  EXPECT_GT(clustered, body_facts * 3 / 4);
  // Dense spans inside long filler: few tokens hold facts and most pages hold none.
  EXPECT_LT(static_cast<double>(fact_tokens) / (20.0 * 1700), 0.15);
  EXPECT_LT(static_cast<double>(pages_with_facts) / static_cast<double>(pages), 0.35);
  // A spread of ages, from a few steps to half the episode and more.
  EXPECT_GT(young, facts / 50);
  EXPECT_GT(old, facts / 20);
}

TEST(Generator, AttentionFollowsTheDocumentedModel) {
  // Without noise, bursts or facts, every row is the formula of the header comment, normalised.
  auto c = small(11);
  c.noise = 0;
  c.rereference_rate = 0;
  c.fact_probability_short = 0;
  c.cluster_probability = 0;
  c.layers = 2;
  const auto ep = tr::generate_episode(c, 123, "model");
  EXPECT_EQ(ep.count_probes(), 0u);
  std::vector<md::step_t> arrival;
  std::vector<md::region_id> label;
  std::size_t checked = 0;
  for (const auto& ev : ep.events) {
    if (const auto* s = std::get_if<tr::segment>(&ev)) {
      arrival.insert(arrival.end(), s->tokens, s->step);
      label.insert(label.end(), s->tokens, s->region);
      continue;
    }
    const auto* a = std::get_if<tr::attention>(&ev);
    if (!a) continue;
    EXPECT_EQ(a->step % c.observe_every == 0 || a->step == ep.last_step(), true);
    for (std::uint32_t l = 0; l < 2; ++l) {
      const double g = 0.5 + l, s = 1.5 - l;
      std::vector<double> w(a->context);
      double sum = 0;
      for (std::uint32_t j = 0; j < a->context; ++j) {
        const auto& p = c.attention[label[j]];
        w[j] = p.floor + g * p.amplitude * std::exp(-std::numbers::ln2 * (a->step - arrival[j]) / p.half_life) +
               (j < c.sink_tokens ? s * c.sink : 0.0) +
               c.recent * std::exp(-static_cast<double>(a->context - 1 - j) / c.recent_scale);
        sum += w[j];
      }
      for (std::uint32_t j = 0; j < a->context; ++j) {
        ASSERT_NEAR(a->layers[l].mass[j], w[j] / sum, 1e-6)
            << "step " << a->step << " layer " << l << " position " << j;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 1000u);
}

TEST(Generator, RereferencesAndQueriesPutTheirShareOnTheSpan) {
  auto c = small(21);
  c.noise = 0;
  c.rereference_rate = 0;
  std::vector<tr::planted_fact> planted;
  const auto ep = tr::generate_episode(c, 5, "q", &planted);
  ASSERT_FALSE(planted.empty());
  // At each query step, the fact's tokens get at least query_share / (queries at that step) in total.
  std::map<md::step_t, std::vector<tr::probe>> by_step;
  for (const auto& f : planted) by_step[f.query.step].push_back(f.query);
  std::size_t seen = 0;
  for (const auto& ev : ep.events) {
    const auto* a = std::get_if<tr::attention>(&ev);
    if (!a || !by_step.count(a->step)) continue;
    for (const auto& p : by_step[a->step]) {
      double on_fact = 0;
      for (std::uint32_t j = p.first; j < p.first + p.length; ++j) on_fact += a->layers[0].mass[j];
      EXPECT_GE(on_fact, c.query_share / by_step[a->step].size() - 1e-5);
      ++seen;
    }
  }
  EXPECT_EQ(seen, planted.size());
}

TEST(Generator, RejectsInvalidConfigs) {
  auto c = small();
  c.tokens = 10;
  EXPECT_THROW(c.validate(), md::config_error);
  c = small();
  c.noise = 1.0;
  EXPECT_THROW(c.validate(), md::config_error);
  c = small();
  c.attention[2].half_life = 0;
  EXPECT_THROW((void)tr::generate_episode(c, 1, "x"), md::config_error);
  c = small();
  c.query_share = 0.8;
  c.rereference_share = 0.3;
  EXPECT_THROW(c.validate(), md::config_error);
}
