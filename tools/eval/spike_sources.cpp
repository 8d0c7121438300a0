// SPDX-License-Identifier: Apache-2.0
// memdecay-spike-sources: what the refresh events of a recorded need-aligned trace are (docs/findings.md, claim 1).
//
// The refresh-interval estimator (calibration/intervals.hpp) counts a token as refreshed when a layer-mean row puts
// at least `threshold` uniform units on it, outside the first 4 and the newest 32 positions. The episode file
// (python/episodes.py, need-aligned family) knows what each token is, so each such event can be sorted by what
// caused it:
//   re-read        the row is one of a re-read span (`query key value`) and the token is a copy of that fact (its
//                  key or value, where it was planted or re-read before): the events calibration should count
//   induction      the token follows an earlier occurrence of the row's query token (the copy mechanism of
//                  attention firing on a repeated token, a fact's or filler)
//   value / key    a fact's value or key token, outside its re-reads
//   filler, other  the rest
// Traces are those memdecay-eval --record-traces writes for the same episode file (episode i of the trace is
// episode i of the file).
//
//   memdecay-spike-sources TRACE EPISODES.json [--threshold 32]
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <memdecay/io/trace.hpp>

namespace {

// python/episodes.py's VOCAB_LAYOUT, read from the file.
struct vocabulary {
  int key_first = 0, key_end = 0, value_first = 0, value_end = 0, filler_first = 0;
  explicit vocabulary(const nlohmann::json& v)
      : key_first(v.at("key_first").get<int>()),
        key_end(key_first + v.at("key_count").get<int>()),
        value_first(v.at("value_first").get<int>()),
        value_end(value_first + v.at("value_count").get<int>()),
        filler_first(v.at("filler_first").get<int>()) {}
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Sort the refresh events of a recorded need-aligned trace by their cause"};
  std::string trace_path, episodes_path;
  double threshold = 32.0;
  app.add_option("trace", trace_path, "A trace memdecay-eval --record-traces wrote")->required();
  app.add_option("episodes", episodes_path, "The need-aligned episode file it was recorded from")->required();
  app.add_option("--threshold", threshold, "Refresh threshold in uniform units")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    const auto trace = memdecay::trace::read_file(trace_path);
    std::ifstream in(episodes_path);
    const auto doc = nlohmann::json::parse(in);
    if (doc.value("family", "") != "need-aligned") {
      std::cerr << episodes_path << ": not a need-aligned episode file\n";
      return 2;
    }
    const vocabulary vocab(doc.at("vocab_layout"));
    std::map<std::string, long> count;
    std::size_t episodes = 0;
    for (std::size_t e = 0; e < trace.episodes.size() && e < doc.at("episodes").size(); ++e, ++episodes) {
      const auto& ep = doc["episodes"][e];
      const auto tokens = ep.at("tokens").get<std::vector<int>>();
      if (trace.episodes[e].total_tokens() != tokens.size()) {
        std::cerr << "memdecay-spike-sources: episode " << e << " of the trace holds "
                  << trace.episodes[e].total_tokens() << " tokens, of the file " << tokens.size()
                  << ": not the episodes it was recorded from\n";
        return 2;
      }
      std::map<std::size_t, std::set<std::size_t>> copies;  // a re-read span's positions -> its fact's earlier tokens
      for (const auto& r : ep.at("rereads")) {
        const auto at = r.at("at").get<std::size_t>();
        if (at + 2 >= tokens.size()) continue;
        for (std::size_t f = 0; f + 1 < at; ++f)
          if (tokens[f] == tokens[at + 1])
            for (std::size_t q = at; q < at + 3; ++q) copies[q].insert({f, f + 1});
      }
      for (const auto& event : trace.episodes[e].events) {
        const auto* a = std::get_if<memdecay::trace::attention>(&event);
        if (!a || a->context == 0 || a->context > tokens.size()) continue;
        const auto row = a->layer_mean();
        const std::size_t context = a->context, q = context - 1;
        for (std::size_t j = 4; j + 32 < context; ++j) {
          if (row[j] * static_cast<double>(context) < threshold) continue;
          const int t = tokens[j];
          const auto copy = copies.find(q);
          std::string cause;
          if (copy != copies.end() && copy->second.count(j) != 0)
            cause = "re-read";
          else if (tokens[j - 1] == tokens[q])
            cause = "induction";
          else if (t >= vocab.value_first && t < vocab.value_end)
            cause = "value";
          else if (t >= vocab.key_first && t < vocab.key_end)
            cause = "key";
          else if (t >= vocab.filler_first)
            cause = "filler";
          else
            cause = "other";
          ++count[cause];
        }
      }
    }
    long total = 0;
    for (const auto& [cause, n] : count) total += n;
    std::cout << episodes << " episodes, " << total << " events at or above " << threshold << " uniform units\n\n"
              << "| cause | events | share |\n|---|---:|---:|\n";
    for (const char* cause : {"re-read", "induction", "value", "key", "filler", "other"}) {
      const long n = count.count(cause) ? count.at(cause) : 0;
      std::cout << "| " << cause << " | " << n << " | " << std::fixed << std::setprecision(1)
                << (total ? static_cast<double>(n) * 100.0 / static_cast<double>(total) : 0.0) << "% |\n";
    }
  } catch (const std::exception& ex) {
    std::cerr << "memdecay-spike-sources: " << ex.what() << "\n";
    return 1;
  }
  return 0;
}
