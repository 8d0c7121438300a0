// SPDX-License-Identifier: Apache-2.0
// io/manager_snapshot.hpp: which record each sequence gets (full, clock, unchanged) and what that costs; a chain
// rejected for every single flipped bit of every element, every truncation, a missing, reordered or foreign delta,
// another policy, page size, global budget or config, always naming the element, the field and the offset, with
// the target manager unchanged. (That a loaded chain is bit-identical and decides as the original, for every
// policy, is in the conformance suite.)
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <memdecay/core/manager.hpp>
#include <memdecay/io/manager_snapshot.hpp>
#include <memdecay/io/snapshot.hpp>
#include <memdecay/policies/all.hpp>

namespace md = memdecay;

namespace {

using bytes = std::vector<std::byte>;

md::config small_config() {
  return md::config{.page_size = 4, .protection = {.recent_tokens = 4}, .budget = md::budget_config::tokens(40, 32)};
}
md::manager_config small_manager() { return {.page_size = 4, .global = md::global_budget::pages(30, 24)}; }

// Three sequences with history: evictions, a fork (shared pages), an external share, a protection.
void with_history(md::manager& mgr, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (std::uint64_t id : {2u, 5u, 11u}) mgr.open(id, small_config()).append(md::regions::system, 3);
  for (md::step_t step = 1; step <= 10; ++step) {
    mgr.advance_to(step);
    for (std::uint64_t id : mgr.ids()) {
      auto& s = mgr.at(id);
      s.append(static_cast<md::region_id>(1 + rng() % 6), 1 + rng() % 5);
      std::vector<float> mass(s.kv_len());
      for (auto& m : mass) m = static_cast<float>(rng() % 100) / (100.0f * static_cast<float>(mass.size()));
      s.observe_tokens(mass);
    }
    mgr.commit(mgr.select_global());
  }
  mgr.fork(5, 6);
  const std::size_t first = 0;
  mgr.set_shared(2, std::span<const std::size_t>(&first, 1));
  mgr.protect_tail_tokens(11, 3);
}

// Runs `load`, expects an input_error naming `needle` and an offset, and checks that `target` did not change.
template <class Load>
void expect_rejected(md::manager& target, Load&& load, const std::string& needle) {
  const auto digest = target.digest();
  const auto ids = target.ids();
  try {
    load();
    ADD_FAILURE() << "accepted; expected an input_error containing '" << needle << "'";
  } catch (const md::input_error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("offset"), std::string::npos) << "no offset named: " << e.what();
  }
  EXPECT_EQ(target.digest(), digest);
  EXPECT_EQ(target.ids(), ids);
}

// The record kinds of a snapshot, by walking its sequence list (the layout of docs/snapshot-format.md).
std::vector<md::snapshot::record_kind> record_kinds(const bytes& b) {
  auto u64 = [&](std::size_t at) {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(b[at + static_cast<std::size_t>(i)]) << (8 * i);
    return v;
  };
  std::size_t at = md::snapshot::manager_header_bytes + static_cast<std::size_t>(b[17]);
  at += 8 + 8 + 4 + 8;  // global high, low, now, next key
  const std::uint64_t count = u64(at);
  at += 8;
  std::vector<md::snapshot::record_kind> kinds;
  for (std::uint64_t s = 0; s < count; ++s) {
    at += 8;  // id
    const auto kind = static_cast<md::snapshot::record_kind>(b[at++]);
    kinds.push_back(kind);
    at += 8 + 8 * u64(at);   // protected
    at += 8 + 16 * u64(at);  // shared
    if (kind == md::snapshot::record_kind::full) {
      at += 8 + u64(at);
    } else if (kind == md::snapshot::record_kind::clock || kind == md::snapshot::record_kind::rebased) {
      at += 4 + 8;
      const std::uint64_t fields = u64(at) & 0xFFFFFFFFu;
      at += 4;
      for (std::uint64_t f = 0; f < fields; ++f) {
        at += 1 + static_cast<std::size_t>(b[at]);  // name
        const std::size_t size = static_cast<std::size_t>(b[at + 1]);
        at += 3;
        at += 8 + size * u64(at);
      }
    }
  }
  return kinds;
}

}  // namespace

TEST(ManagerSnapshot, ALoadedManagerHasTheSavedDigestProtectionsAndSharedPages) {
  md::manager mgr(small_manager());
  with_history(mgr, 1);
  const bytes saved = md::snapshot::save(mgr);
  md::manager back(small_manager());
  back.open(99, small_config());  // replaced by the load
  md::snapshot::load(back, saved, small_config());
  EXPECT_EQ(back.digest(), mgr.digest());
  EXPECT_EQ(back.ids(), mgr.ids());
  EXPECT_EQ(back.now(), mgr.now());
  EXPECT_EQ(back.physical_pages(), mgr.physical_pages());
  for (std::uint64_t id : mgr.ids()) {
    EXPECT_EQ(back.shared_pages(id), mgr.shared_pages(id)) << id;
    EXPECT_EQ(back.protected_pages(id), mgr.protected_pages(id)) << id;
    EXPECT_TRUE(back.at(id).managed());
  }
  EXPECT_FALSE(back.shared_pages(5).empty()) << "the fork's pages are shared";
  EXPECT_FALSE(back.protected_pages(11).empty());
  EXPECT_EQ(back.select_global().digest(), mgr.select_global().digest());
  EXPECT_EQ(md::snapshot::save(back), saved);
  EXPECT_EQ(record_kinds(saved), std::vector<md::snapshot::record_kind>(4, md::snapshot::record_kind::full));
}

TEST(ManagerSnapshot, AnIncrementalSnapshotHoldsOnlyWhatChanged) {
  md::manager mgr(small_manager());
  with_history(mgr, 2);
  md::snapshot::checkpoint cp;
  EXPECT_TRUE(cp.empty());
  const bytes full = md::snapshot::save(mgr, cp);
  EXPECT_FALSE(cp.empty());
  using K = md::snapshot::record_kind;

  const bytes same = md::snapshot::save(mgr, cp);  // nothing happened
  EXPECT_EQ(record_kinds(same), std::vector<K>(4, K::unchanged));

  mgr.advance_to(mgr.now() + 3);  // every clock moves, nothing else
  const bytes clock = md::snapshot::save(mgr, cp);
  EXPECT_EQ(record_kinds(clock), std::vector<K>(4, K::clock));
  // A clock record is the policy's scalars with their field heads, whatever the sequence's length.
  EXPECT_LT(clock.size() - same.size(), 4u * 400u);

  mgr.at(5).append(md::regions::user, 2);  // one sequence changes; 11 is closed, 12 opened
  mgr.close(11);
  mgr.open(12, small_config()).append(md::regions::user, 5);
  const bytes changed = md::snapshot::save(mgr, cp);
  EXPECT_EQ(record_kinds(changed), (std::vector<K>{K::unchanged, K::full, K::unchanged, K::full}));

  mgr.close(12);  // the same id reopened is a new sequence: a full record even if its generation matches
  mgr.open(12, small_config()).append(md::regions::user, 5);
  const bytes reopened = md::snapshot::save(mgr, cp);
  EXPECT_EQ(record_kinds(reopened), (std::vector<K>{K::unchanged, K::unchanged, K::unchanged, K::full}));

  md::manager back(small_manager());
  md::snapshot::load(back, std::vector<bytes>{full, same, clock, changed, reopened}, small_config());
  EXPECT_EQ(back.digest(), mgr.digest());
  // Every prefix of the chain is a manager that existed.
  md::manager at_clock(small_manager());
  md::snapshot::load(at_clock, std::vector<bytes>{full, same, clock}, small_config());
  EXPECT_EQ(at_clock.now(), back.now());
  EXPECT_TRUE(at_clock.contains(11));
}

TEST(ManagerSnapshot, APolicyWhoseAdvanceChangesNoColumnGetsClockRecordsToo) {
  // H2O has no on_advance hook: a clock move changes its layout's clock only.
  using seq_t = md::policy_sequence<md::policies::h2o>;
  md::basic_manager<seq_t> mgr({.page_size = 4});
  mgr.open(1, small_config()).append(md::regions::user, 9);
  md::snapshot::checkpoint cp;
  const bytes full = md::snapshot::save(mgr, cp);
  mgr.advance_to(4);
  const bytes clock = md::snapshot::save(mgr, cp);
  EXPECT_EQ(record_kinds(clock), std::vector<md::snapshot::record_kind>{md::snapshot::record_kind::clock});
  md::basic_manager<seq_t> back({.page_size = 4});
  md::snapshot::load(back, std::vector<bytes>{full, clock}, small_config());
  EXPECT_EQ(back.digest(), mgr.digest());
}

TEST(ManagerSnapshot, ACheckpointBelongsToOneManager) {
  md::manager a(small_manager()), b(small_manager());
  with_history(a, 3);
  with_history(b, 3);
  md::snapshot::checkpoint cp;
  (void)md::snapshot::save(a, cp);
  EXPECT_THROW((void)md::snapshot::save(b, cp), md::usage_error);
  cp.reset();
  EXPECT_NO_THROW((void)md::snapshot::save(b, cp));
}

TEST(ManagerSnapshot, ACheckpointOfTheTargetBeforeALoadNeverMatchesTheLoadedSequences) {
  md::manager mgr(small_manager());
  with_history(mgr, 4);
  md::snapshot::checkpoint cp;
  const bytes first = md::snapshot::save(mgr, cp);
  md::manager other(small_manager());
  with_history(other, 5);
  md::snapshot::load(mgr, md::snapshot::save(other), small_config());
  const bytes after = md::snapshot::save(mgr, cp);  // mgr is other's state now: every record must be full
  EXPECT_EQ(record_kinds(after), std::vector<md::snapshot::record_kind>(4, md::snapshot::record_kind::full));
  md::manager back(small_manager());
  md::snapshot::load(back, std::vector<bytes>{first, after}, small_config());
  EXPECT_EQ(back.digest(), other.digest());
}

TEST(ManagerSnapshot, EveryFlippedBitOfEveryElementIsRejected) {
  md::manager mgr(small_manager());
  with_history(mgr, 6);
  md::snapshot::checkpoint cp;
  const bytes full = md::snapshot::save(mgr, cp);
  mgr.advance_to(mgr.now() + 1);
  mgr.at(2).append(md::regions::tool_out, 3);
  const bytes delta = md::snapshot::save(mgr, cp);
  md::manager target(small_manager());
  with_history(target, 7);
  for (std::size_t element = 0; element < 2; ++element) {
    const bytes& original = element == 0 ? full : delta;
    // Every bit of the header and the policy name, then a stride through the payload (a CRC-32C catches every
    // single-bit error, so the stride only keeps the run short).
    const std::size_t header_bits = 8 * (md::snapshot::manager_header_bytes + static_cast<std::size_t>(original[17]));
    for (std::size_t bit = 0; bit < 8 * original.size(); bit += bit < header_bits ? 1 : 11) {
      bytes bad = original;
      bad[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
      SCOPED_TRACE(testing::Message() << "element " << element << ", bit " << bit);
      std::vector<bytes> chain{full, delta};
      chain[element] = bad;
      expect_rejected(
          target, [&] { md::snapshot::load(target, chain, small_config()); }, "manager snapshot");
    }
  }
  md::snapshot::load(target, std::vector<bytes>{full, delta}, small_config());
  EXPECT_EQ(target.digest(), mgr.digest()) << "the target still loads once the chain is intact";
}

TEST(ManagerSnapshot, EveryTruncationIsRejected) {
  md::manager mgr(small_manager());
  with_history(mgr, 8);
  const bytes full = md::snapshot::save(mgr);
  md::manager target(small_manager());
  for (std::size_t n = 0; n < full.size(); ++n) {
    const bytes cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    expect_rejected(
        target, [&] { md::snapshot::load(target, cut, small_config()); }, "manager snapshot");
  }
}

TEST(ManagerSnapshot, AMissingReorderedOrForeignDeltaIsRejectedByName) {
  md::manager mgr(small_manager());
  with_history(mgr, 9);
  md::snapshot::checkpoint cp;
  const bytes full = md::snapshot::save(mgr, cp);
  mgr.advance_to(mgr.now() + 1);
  const bytes d1 = md::snapshot::save(mgr, cp);
  mgr.at(2).append(md::regions::user, 1);
  const bytes d2 = md::snapshot::save(mgr, cp);
  md::manager target(small_manager());
  expect_rejected(
      target,
      [&] {
        md::snapshot::load(target, std::vector<bytes>{full, d2}, small_config());
      },
      "snapshot 2 of 2 base id at offset 32");
  expect_rejected(
      target,
      [&] {
        md::snapshot::load(target, std::vector<bytes>{full, d2, d1}, small_config());
      },
      "base id");
  expect_rejected(
      target, [&] { md::snapshot::load(target, std::vector<bytes>{d1}, small_config()); }, "kind at offset 18");
  expect_rejected(
      target,
      [&] {
        md::snapshot::load(target, std::vector<bytes>{full, full}, small_config());
      },
      "a full snapshot after the first");
  EXPECT_THROW(md::snapshot::load(target, std::vector<bytes>{}, small_config()), md::input_error);
  // A delta of another manager's chain that happens to follow the same base id cannot: ids are content-derived.
  md::manager other(small_manager());
  with_history(other, 10);
  md::snapshot::checkpoint other_cp;
  (void)md::snapshot::save(other, other_cp);
  other.advance_to(other.now() + 1);
  const bytes foreign = md::snapshot::save(other, other_cp);
  expect_rejected(
      target,
      [&] {
        md::snapshot::load(target, std::vector<bytes>{full, foreign}, small_config());
      },
      "base id");
}

TEST(ManagerSnapshot, AnotherPolicyPageSizeBudgetOrConfigIsRejected) {
  md::manager mgr(small_manager());
  with_history(mgr, 11);
  const bytes full = md::snapshot::save(mgr);
  md::manager target(small_manager());
  md::config other = small_config();
  other.alpha = 0.25;
  expect_rejected(
      target, [&] { md::snapshot::load(target, full, other); }, "sequence 2 (its record at offset");
  expect_rejected(
      target, [&] { md::snapshot::load(target, full, other); }, "config digest");
  md::manager wider({.page_size = 4, .global = md::global_budget::pages(31, 24)});
  expect_rejected(
      wider, [&] { md::snapshot::load(wider, full, small_config()); }, "global budget");
  md::config eight = small_config();
  eight.page_size = 8;
  md::manager pages8({.page_size = 8, .global = md::global_budget::pages(30, 24)});
  expect_rejected(
      pages8, [&] { md::snapshot::load(pages8, full, eight); }, "page size at offset 20");
  md::basic_manager<md::policy_sequence<md::policies::h2o>> h2o(small_manager());
  try {
    md::snapshot::load(h2o, full, small_config());
    ADD_FAILURE() << "an h2o manager loaded a memdecay snapshot";
  } catch (const md::input_error& e) {
    EXPECT_NE(std::string(e.what()).find("policy at offset 56: 'memdecay'"), std::string::npos) << e.what();
  }
  // A sequence snapshot is not a manager snapshot, and the error says so.
  const bytes one = md::snapshot::save(mgr.at(2));
  expect_rejected(
      target, [&] { md::snapshot::load(target, one, small_config()); }, "a sequence snapshot");
  // A config of another page size from configure is a config error, before anything changes.
  EXPECT_THROW(md::snapshot::load(target, full, eight), md::config_error);
  EXPECT_EQ(target.size(), 0u);
}

TEST(ManagerSnapshot, EachSequenceGetsItsOwnConfigFromConfigure) {
  md::manager mgr(small_manager());
  md::config wide = small_config();
  wide.budget = md::budget_config::tokens(80, 64);
  mgr.open(1, small_config()).append(md::regions::user, 10);
  mgr.open(2, wide).append(md::regions::user, 10);
  const bytes full = md::snapshot::save(mgr);
  md::manager back(small_manager());
  md::snapshot::load(back, full, [&](std::uint64_t id) { return id == 2 ? wide : small_config(); });
  EXPECT_EQ(back.digest(), mgr.digest());
  EXPECT_EQ(back.at(2).get_config().budget.high, 80.0);
  md::manager wrong(small_manager());
  expect_rejected(
      wrong, [&] { md::snapshot::load(wrong, full, small_config()); }, "sequence 2");
}

TEST(ManagerSnapshot, AChainBuildsOnlyTheSequencesOfItsLastElement) {
  // Request 7 is closed and its id reused with another config between two checkpoints: configure(7) can only
  // answer for the request the engine has now, and the chain never builds the one that was closed.
  md::manager mgr(small_manager());
  mgr.open(7, small_config()).append(md::regions::user, 12);
  mgr.open(8, small_config()).append(md::regions::user, 12);
  md::snapshot::checkpoint cp;
  const bytes full = md::snapshot::save(mgr, cp);
  mgr.close(7);
  md::config wide = small_config();
  wide.budget = md::budget_config::tokens(80, 64);
  mgr.open(7, wide).append(md::regions::tool_out, 9);
  const bytes delta = md::snapshot::save(mgr, cp);
  md::manager back(small_manager());
  std::vector<std::uint64_t> asked;
  md::snapshot::load(back, std::vector<bytes>{full, delta}, [&](std::uint64_t id) {
    asked.push_back(id);
    return id == 7 ? wide : small_config();
  });
  EXPECT_EQ(back.digest(), mgr.digest());
  EXPECT_EQ(asked, (std::vector<std::uint64_t>{7, 8})) << "each surviving sequence is configured once";
}

TEST(ManagerSnapshot, ARebaseSavesTheWeightsWithTheScalarsNotTheSequence) {
  // MemDecay's exp-free weights rebase once every floor(40 / max lambda_r) steps (865 with the default regions):
  // a waiting sequence that rebased gets a rebased record (its scalars and the 4-byte weights) instead of a full
  // one (17.5 bytes per token).
  md::manager mgr({.page_size = 16});
  md::config cfg{.page_size = 16};
  auto& s = mgr.open(1, cfg);
  s.append(md::regions::user, 4096);
  std::vector<float> mass(4096, 1.0f / 4096.0f);
  mgr.advance_to(1);
  s.observe_tokens(mass);
  ASSERT_TRUE(s.expfree_scores());
  md::snapshot::checkpoint cp;
  const bytes full = md::snapshot::save(mgr, cp);
  mgr.advance_to(2000);  // past the clock's span: a rebase
  const bytes rebased = md::snapshot::save(mgr, cp);
  using K = md::snapshot::record_kind;
  EXPECT_EQ(record_kinds(rebased), std::vector<K>{K::rebased});
  EXPECT_LT(rebased.size(), 4096u * 4u + 1024u);
  EXPECT_GT(rebased.size(), 4096u * 4u);
  mgr.advance_to(2001);  // no rebase: scalars only
  const bytes clock = md::snapshot::save(mgr, cp);
  EXPECT_EQ(record_kinds(clock), std::vector<K>{K::clock});
  md::manager back({.page_size = 16});
  md::snapshot::load(back, std::vector<bytes>{full, rebased, clock}, cfg);
  EXPECT_EQ(back.digest(), mgr.digest());
  EXPECT_EQ(md::snapshot::save(back), md::snapshot::save(mgr));
  md::manager mid({.page_size = 16});
  md::snapshot::load(mid, std::vector<bytes>{full, rebased}, cfg);
  mid.advance_to(2001);
  EXPECT_EQ(mid.digest(), mgr.digest()) << "the rebased state continues like the original";
}
