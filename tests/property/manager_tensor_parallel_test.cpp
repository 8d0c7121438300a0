// Determinism for tensor-parallel serving. Each simulated rank holds a shard of the attention heads, computes the
// per-token mass of its heads, and an all-reduce (a fixed-order sum, as NCCL's ring gives every rank the same
// bytes) hands every rank the same total. Every rank then runs its own manager and block pool on identical
// calls: the test shows identical victims, plan digests, state digests and block tables on 2 and 4 ranks, and that
// the digests do catch a rank that skipped the all-reduce.
#include <gtest/gtest.h>

#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/core/manager.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <vector>

namespace md = memdecay;

namespace {

constexpr std::size_t P = 16;
constexpr int heads = 8;
const std::vector<std::uint64_t> request_ids = {31, 7, 19};

struct splitmix64 {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) / static_cast<float>(1u << 24); }
};

// The full attention of one step (heads x resident tokens, each row a softmax-like distribution). Only the
// simulation sees it whole; each rank reads its own rows.
Eigen::MatrixXf attention(std::uint64_t step, std::uint64_t id, std::size_t tokens) {
  splitmix64 rng{step * 1000003 + id};
  Eigen::MatrixXf a(heads, static_cast<Eigen::Index>(tokens));
  for (int h = 0; h < heads; ++h) {
    for (Eigen::Index t = 0; t < a.cols(); ++t) {
      const float u = rng.uniform();
      a(h, t) = u * u * u * u;  // heavy-tailed: a few tokens get most of the mass
    }
    a.row(h) /= a.row(h).sum();
  }
  return a;
}

// One rank: its manager, its block pool, and what it observed.
struct rank {
  md::manager mgr{{.page_size = P, .global = md::global_budget::pages(40, 34)}};
  md::block_pool<> pool{256, P};
  std::vector<std::uint64_t> plan_digests, state_digests;
  std::vector<std::vector<md::global_victim<float, std::uint64_t>>> victims;
};

// Runs an episode on `num_ranks` ranks. `all_reduce` false: every rank uses only its own heads (the bug).
std::vector<rank> run(int num_ranks, bool all_reduce = true) {
  std::vector<rank> ranks(static_cast<std::size_t>(num_ranks));
  const md::config cfg{.alpha = 2.0,
                       .tau = 2.0,
                       .page_size = P,
                       .normalization = md::attention_normalization::uniform,
                       .protection = {.sink_pages = 1, .recent_tokens = 16},
                       .budget = md::budget_config::tokens(320, 256)};
  for (auto& r : ranks)
    for (auto id : request_ids) {
      r.mgr.open(id, cfg);
      r.pool.open(id);
    }
  static constexpr md::region_id script[] = {md::regions::system,     md::regions::user,     md::regions::scratchpad,
                                             md::regions::tool_in,    md::regions::tool_out, md::regions::retrieval,
                                             md::regions::scratchpad, md::regions::tool_out, md::regions::user};
  const int shard = heads / num_ranks;
  for (md::step_t step = 1; step <= 36; ++step) {
    for (auto& r : ranks) r.mgr.advance_to(step);
    for (auto id : request_ids) {
      const md::region_id region = script[(step + id) % std::size(script)];
      const std::size_t tokens = 5 + (step * id) % 13;
      for (auto& r : ranks) {
        r.mgr.at(id).append(region, tokens);
        r.pool.append_tokens(id, tokens);
      }
      // Each rank reduces its own heads of the step's attention (mean over all heads: divide by the head count).
      std::vector<std::vector<float>> partial(ranks.size());
      for (int k = 0; k < num_ranks; ++k) {
        const auto full = attention(step, id, ranks[static_cast<std::size_t>(k)].mgr.at(id).kv_len());
        const Eigen::MatrixXf mine = full.middleRows(k * shard, shard);
        partial[static_cast<std::size_t>(k)] = md::reduce_heads(mine, md::head_reduction::sum);
      }
      std::vector<float> total(partial[0].size(), 0.0f);
      if (all_reduce)  // the all-reduce: a sum in rank order, the same bytes on every rank
        for (int k = 0; k < num_ranks; ++k)
          for (std::size_t t = 0; t < total.size(); ++t) total[t] += partial[static_cast<std::size_t>(k)].at(t);
      for (int k = 0; k < num_ranks; ++k) {
        auto& mass = all_reduce ? total : partial[static_cast<std::size_t>(k)];
        std::vector<float> mean(mass.size());
        for (std::size_t t = 0; t < mass.size(); ++t) mean[t] = mass[t] / heads;
        ranks[static_cast<std::size_t>(k)].mgr.at(id).observe_tokens(mean);
      }
    }
    for (auto& r : ranks) {
      r.mgr.protect_tail_tokens(31, 3);  // a speculative draft of request 31 is in flight
      const auto plan = r.mgr.select_global();
      r.plan_digests.push_back(plan.digest());
      r.victims.push_back(plan.victims);
      r.mgr.commit(plan, r.pool, md::identity_id{});
      r.state_digests.push_back(r.mgr.digest());
    }
  }
  return ranks;
}

void expect_identical(const std::vector<rank>& ranks) {
  std::size_t evicted = 0;
  for (const auto& v : ranks[0].victims) evicted += v.size();
  ASSERT_GT(evicted, 20u) << "the episode must evict, or agreement proves nothing";
  for (std::size_t k = 1; k < ranks.size(); ++k) {
    EXPECT_EQ(ranks[k].victims, ranks[0].victims) << "rank " << k;
    EXPECT_EQ(ranks[k].plan_digests, ranks[0].plan_digests) << "rank " << k;
    EXPECT_EQ(ranks[k].state_digests, ranks[0].state_digests) << "rank " << k;
    for (auto id : request_ids) {
      const auto a = ranks[k].pool.block_table(id), b = ranks[0].pool.block_table(id);
      EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << "rank " << k << " request " << id;
      EXPECT_EQ(ranks[k].mgr.prefix_cache_boundary(id), ranks[0].mgr.prefix_cache_boundary(id));
    }
  }
}

TEST(TensorParallel, TwoRanksEvictTheSamePages) { expect_identical(run(2)); }

TEST(TensorParallel, FourRanksEvictTheSamePages) { expect_identical(run(4)); }

TEST(TensorParallel, BothDeploymentsKeepEveryRanksPoolConsistent) {
  for (const auto& r : run(4)) {
    EXPECT_TRUE(r.pool.consistent());
    for (auto id : request_ids) EXPECT_EQ(r.pool.num_pages(id), r.mgr.at(id).num_pages());
  }
}

TEST(TensorParallel, DigestsExposeARankThatSkippedTheAllReduce) {
  const auto ranks = run(2, /*all_reduce=*/false);
  EXPECT_NE(ranks[0].state_digests.front(), ranks[1].state_digests.front())
      << "the first step's observations already differ";
}

}  // namespace
