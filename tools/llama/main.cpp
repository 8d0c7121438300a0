// SPDX-License-Identifier: Apache-2.0
// memdecay-llama: eviction policies inside llama.cpp, on llama.cpp's own attention. Every episode runs through a
// GGUF model in llama.cpp while a policy evicts online under a budget (llama_memory_seq_rm); recall probes are
// forked from the live cache (llama_memory_seq_cp). The same protocol, policies, oracle, intervals and tables as
// memdecay-eval (tools/eval/eval_cli.hpp), plus llama.cpp's own context shift as its users get it today, and
// where the time goes. docs/llama-cpp.md.
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "../eval/eval_cli.hpp"
#include "llama_engine.hpp"

#ifndef MEMDECAY_LLAMA_DATA_DIR
#define MEMDECAY_LLAMA_DATA_DIR "models"
#endif

namespace md = memdecay;
namespace ev = memdecay_eval;
namespace lc = memdecay::llama_cpp;
namespace ml = memdecay_llama;
using json = nlohmann::ordered_json;

namespace {

struct llama_options {
  std::string positions = "compact";
  std::int32_t threads_per_context = 1;
  std::size_t n_keep = 1;
  bool f32_cache = false;
};

// The harness's engine over llama.cpp (llama_engine.hpp), with the time every part of a policy run takes.
struct llama_engine {
  using model_type = ml::gguf_model;
  using session_type = ml::llama_harness_session;
  const char* tool = "memdecay-llama";
  lc::session_options session;
  std::size_t n_keep = 1;
  ml::timings time;
  // Policy runs only (the call hooks): llama.cpp's decode of the step (sync included), memdecay's observe,
  // advance, select and commit, and the tokens appended.
  struct run_time {
    std::mutex m;
    double decode_s = 0, memdecay_s = 0;
    std::uint64_t tokens = 0, steps = 0;
  } runs;

  static std::filesystem::path model_path(const std::string& m, const std::string& data_dir) {
    const bool is_path = m.find('/') != std::string::npos || m.ends_with(".gguf");
    return is_path ? std::filesystem::path(m) : std::filesystem::path(data_dir) / m / "model.gguf";
  }
  static model_type load(const std::filesystem::path& p) { return ml::gguf_model::load(p); }
  static std::size_t max_positions(const model_type& m) {
    // Positions are compacted or not; the context is what limits an episode (the harness sizes it per episode).
    (void)m;
    return std::numeric_limits<std::int32_t>::max();
  }
  static std::size_t layers(const model_type& m) { return m.model()->layers(); }
  json describe(const model_type& m) const {
    return {{"engine", "llama.cpp"},
            {"arch", m.model()->meta("general.architecture")},
            {"n_layers", m.model()->layers()},
            {"vocab", m.model()->vocab()},
            {"n_ctx_train", m.model()->n_ctx_train()},
            {"positions", lc::to_string(session.positions)},
            {"captures_queries", session.capture_queries},
            {"kv_cells", session.f32_cache ? "f32" : "f16"}};
  }
  ev::session_factory<session_type> factory(const model_type& m) {
    auto model = m.model();
    return [this, model](std::size_t page, std::size_t max_tokens) {
      return session_type(model, session, page, max_tokens, &time);
    };
  }
  void add_kinds(std::vector<ev::policy_kind>& kinds) const {
    if (session.positions == lc::position_mode::compact) kinds.push_back(ml::context_shift_kind(n_keep));
  }
  void configure(ev::eval_settings& s) {
    s.on_call = [this](const std::string& config, double budget, const ev::call_event& e) {
      using clock = std::chrono::steady_clock;
      thread_local clock::time_point last;
      thread_local std::string last_run;
      const auto now = clock::now();
      const std::string run = config + "@" + std::to_string(budget);
      const double d = std::chrono::duration<double>(now - last).count();
      if (run == last_run) {
        std::lock_guard lock(runs.m);
        switch (e.what) {
          case ev::call_kind::session_append:
            runs.decode_s += d;
            runs.tokens += e.value;
            ++runs.steps;
            break;
          case ev::call_kind::policy_observe:
          case ev::call_kind::advance:
          case ev::call_kind::select:
          case ev::call_kind::commit:
            runs.memdecay_s += d;
            break;
          default:
            break;
        }
      }
      last_run = run;
      last = now;
    };
  }
  void report(std::ostream& out) {
    char line[512];
    out << "\nTime (llama.cpp " << tool << ", " << session.threads << " thread" << (session.threads == 1 ? "" : "s")
        << " per context; sums over every session)\n\n| what | seconds | per token | share of the step's decode |\n"
           "|---|---:|---:|---:|\n";
    const double tok = static_cast<double>(std::max<std::uint64_t>(1, time.decoded_tokens));
    const double run_tok = static_cast<double>(std::max<std::uint64_t>(1, runs.tokens));
    // share < 0: no share column for the row.
    auto row = [&](const char* what, double s, double tokens, double share) {
      char pct[32] = "-";
      if (share >= 0) std::snprintf(pct, sizeof pct, "%.2f%%", 100.0 * share);
      std::snprintf(line, sizeof line, "| %s | %.3f | %.2f us | %s |\n", what, s, 1e6 * s / tokens, pct);
      out << line;
    };
    row("llama_decode, every run (attention capture included)", time.decode_s, tok, -1);
    row("  of it: attention capture (eval callback)", time.capture_s, tok,
        time.decode_s > 0 ? time.capture_s / time.decode_s : -1);
    row("policy runs: llama_decode of the steps", runs.decode_s, run_tok, -1);
    row("policy runs: memdecay (observe, advance, select, commit)", runs.memdecay_s, run_tok,
        runs.decode_s > 0 ? runs.memdecay_s / runs.decode_s : -1);
    row("llama_memory_seq_rm (+ seq_add when compacting)", time.seq_rm_s, tok, -1);
    row("probes (fork, 2-token prompt, greedy answer, drop the fork)", time.probe_s, tok, -1);
    std::snprintf(line, sizeof line,
                  "\n%llu tokens decoded, %llu in policy runs (%llu steps); %llu llama_memory_seq_rm calls. Throughput "
                  "of the policy runs: %.0f tokens/s with memdecay's own time, %.0f tokens/s llama.cpp alone.\n",
                  static_cast<unsigned long long>(time.decoded_tokens), static_cast<unsigned long long>(runs.tokens),
                  static_cast<unsigned long long>(runs.steps), static_cast<unsigned long long>(time.seq_rm_calls),
                  run_tok / std::max(1e-9, runs.decode_s + runs.memdecay_s), run_tok / std::max(1e-9, runs.decode_s));
    out << line;
  }
  void report_json(json& j) {
    j["time"] = {{"decode_s", time.decode_s},     {"capture_s", time.capture_s},   {"probe_s", time.probe_s},
                 {"seq_rm_s", time.seq_rm_s},     {"decoded_tokens", time.decoded_tokens},
                 {"seq_rm_calls", time.seq_rm_calls},
                 {"policy_runs", {{"decode_s", runs.decode_s}, {"memdecay_s", runs.memdecay_s},
                                  {"tokens", runs.tokens}, {"steps", runs.steps}}}};
  }
};

}  // namespace

int main(int argc, char** argv) {
  ev::cli::options o;
  o.data_dir = MEMDECAY_LLAMA_DATA_DIR;
  o.models = {"llama-small"};
  o.families = {"need-aligned"};
  llama_options lo;
  CLI::App app{
      "memdecay-llama: KV-cache eviction policies inside llama.cpp, on llama.cpp's own attention. Every episode "
      "runs through a GGUF model in llama.cpp while a policy evicts online under a budget through "
      "llama_memory_seq_rm (eviction compounds); recall probes are forked from the live cache "
      "(llama_memory_seq_cp). The tables of memdecay-eval, llama.cpp's context shift among the baselines, and "
      "where the time goes. docs/llama-cpp.md.",
      "memdecay-llama"};
  ev::cli::add_options(app, o);
  app.add_option("--positions", lo.positions,
                 "RoPE positions after an eviction: compact (llama_memory_seq_add closes the gaps, as llama.cpp's "
                 "context shift does) or absolute (gaps stay; positions grow with every token)")
      ->capture_default_str()
      ->check(CLI::IsMember({"compact", "absolute"}));
  app.add_option("--threads-per-context", lo.threads_per_context, "llama.cpp threads per context")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--n-keep", lo.n_keep,
                 "context-shift: tokens kept at the start (llama.cpp's n_keep 0 + the BOS token it adds)")
      ->capture_default_str();
  app.add_flag("--f32-cache", lo.f32_cache, "K/V cells in float32 (llama.cpp's default: f16)");
  app.set_version_flag("--version", std::string(md::version_string));
  app.footer(
      "Exit status: 0 on success, 1 on bad input, 3 if a budget was exceeded without a pinned/protected reason, "
      "100+ on command-line errors.\nExample: memdecay-llama --quick");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    llama_engine engine;
    engine.session.positions = lo.positions == "compact" ? lc::position_mode::compact : lc::position_mode::absolute;
    engine.session.threads = lo.threads_per_context;
    engine.session.f32_cache = lo.f32_cache;
    engine.n_keep = lo.n_keep;
    if (o.list_policies) {
      ev::cli::list_policies(o);
      const auto k = ml::context_shift_kind(lo.n_keep);
      std::printf("%-20s %s\n", k.name.c_str(), k.description.c_str());
      return 0;
    }
    if (o.quick) {
      const bool models_given = app.count("--models") > 0, policies_given = app.count("--policies") > 0;
      ev::cli::apply_quick(o, app);
      if (!models_given) o.models = {"llama-small"};
      if (!policies_given) o.policies.insert(o.policies.end() - 1, "context-shift");
    }
    // Policies on the attention-free signal read llama.cpp's queries and keys (Qcur / Kcur after RoPE).
    for (const auto& p : o.policies)
      if (p.find("+query") != std::string::npos || p.find("+knorm") != std::string::npos)
        engine.session.capture_queries = true;
    if (engine.session.capture_queries && engine.session.positions == lc::position_mode::compact)
      throw std::runtime_error("policies on the query signal need --positions absolute (their digests hold keys "
                               "rotated at their positions, which compaction moves)");
    if (engine.session.positions == lc::position_mode::absolute)
      for (const auto& p : o.policies)
        if (p == "context-shift")
          throw std::runtime_error("context-shift runs as llama.cpp runs it, with compacted positions (--positions "
                                   "compact)");
    return ev::cli::run(o, engine);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memdecay-llama: error: %s\n", e.what());
    return 1;
  }
}
