// SPDX-License-Identifier: Apache-2.0
// The C++ side of python/tests/test_crosscheck.py: replays a recorded episode (JSON: the policy, the config and
// each step's appends and the attention of every logical position, looked up for the resident ones) through the C++ API and prints, as JSON, each step's victims and the final
// digest, so the test can check that Python makes the same calls produce the same decisions.
//   crosscheck_driver EPISODE.json > DECISIONS.json
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/policy_dispatch.hpp"

namespace md = memdecay;
using json = nlohmann::json;

namespace {

md::config config_of(const json& j) {
  md::config c;
  c.page_size = j.at("page_size").get<std::size_t>();
  c.alpha = j.at("alpha").get<double>();
  c.tau = j.at("tau").get<double>();
  const auto mode = j.at("normalization").get<std::string>();
  c.normalization = mode == "uniform"    ? md::attention_normalization::uniform
                    : mode == "zscore"   ? md::attention_normalization::zscore
                    : mode == "lifetime" ? md::attention_normalization::lifetime
                                         : md::attention_normalization::none;
  c.budget = md::budget_config::tokens(j.at("budget_tokens").get<double>());
  c.protection.recent_tokens = j.at("recent_tokens").get<std::size_t>();
  return c;
}

template <class Seq>
json replay(Seq seq, const json& steps) {
  json out = json::object();
  json victims = json::array();
  std::uint64_t step = 0;
  for (const auto& s : steps) {
    for (const auto& a : s.at("append")) seq.append(a.at(0).get<md::region_id>(), a.at(1).get<std::size_t>());
    seq.advance_to(++step);
    const auto& by_position = s.at("mass_by_position");
    std::vector<float> mass;
    for (std::uint64_t position : seq.positions())
      mass.push_back(static_cast<float>(by_position.at(position).get<double>()));
    seq.observe_tokens(mass);
    const auto plan = seq.select_for_budget();
    victims.push_back(plan.pages);
    if (!plan.pages.empty()) seq.commit(plan);
  }
  out["victims"] = victims;
  out["digest"] = seq.digest();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: crosscheck_driver EPISODE.json\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  const json ep = json::parse(in);
  const auto cfg = config_of(ep.at("config"));
  const auto policy = ep.at("policy").get<std::string>();
  const auto& steps = ep.at("steps");
  json out;
  try {
    out = memdecay_bindings::with_policy(
        policy, [&]<template <class> class P>() { return replay(memdecay_bindings::seq_of<P>(cfg), steps); });
  } catch (const md::config_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  std::cout << out.dump() << "\n";
  return 0;
}
