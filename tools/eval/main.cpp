// SPDX-License-Identifier: Apache-2.0
// memdecay-eval: eviction policies on the attention of real (bundled, tiny) transformers. Each evaluation episode
// runs through the model with a paged KV cache while a policy evicts online under a budget; recall probes are
// answered by greedy decoding over what survives. Recall per region, pinned and unpinned, per model x tier x
// budget x policy x page size, with the full cache as the ceiling. docs/eval.md.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <memdecay/version.hpp>

#include "engine/kv_session.hpp"
#include "eval_cli.hpp"

namespace md = memdecay;
namespace ev = memdecay_eval;

namespace {

// The project's own engine over the bundled safetensors models (engine/tiny_lm.hpp).
struct tiny_lm_engine {
  using model_type = ev::tiny_lm;
  using session_type = ev::kv_session;
  const char* tool = "memdecay-eval";

  static std::filesystem::path model_path(const std::string& m, const std::string& data_dir) {
    const bool is_path = m.find('/') != std::string::npos || m.ends_with(".safetensors");
    return is_path ? std::filesystem::path(m) : std::filesystem::path(data_dir) / m / "model.safetensors";
  }
  static model_type load(const std::filesystem::path& p) { return ev::tiny_lm::load(p); }
  static std::size_t max_positions(const model_type& m) { return static_cast<std::size_t>(m.config().max_positions); }
  static std::size_t layers(const model_type& m) { return static_cast<std::size_t>(m.config().n_layers); }
  static nlohmann::ordered_json describe(const model_type& m) {
    const auto& c = m.config();
    return {{"arch", ev::to_string(c.arch)}, {"vocab", c.vocab},          {"d_model", c.d_model},
            {"n_layers", c.n_layers},        {"n_heads", c.n_heads},      {"n_kv_heads", c.n_kv_heads},
            {"conv_kernel", c.conv_kernel},  {"mlp_hidden", c.mlp_hidden}};
  }
  static ev::session_factory<session_type> factory(const model_type& m) {
    const model_type* model = &m;
    return [model](std::size_t page, std::size_t max_tokens) { return ev::kv_session(*model, page, max_tokens); };
  }
};

}  // namespace

int main(int argc, char** argv) {
  ev::cli::options o;
  CLI::App app{
      "memdecay-eval: KV-cache eviction policies on the attention of the bundled tiny transformers. Every episode "
      "runs through the model with a paged KV cache while a policy evicts online under a budget (eviction "
      "compounds); recall probes are answered by greedy decoding over the survivors, without polluting the "
      "episode. Prints recall per model x tier x budget x policy x page size (per region, pinned and unpinned) "
      "with the full cache as the ceiling. docs/eval.md.",
      "memdecay-eval"};
  ev::cli::add_options(app, o);
  app.set_version_flag("--version", std::string(md::version_string));
  app.footer(
      "Exit status: 0 on success, 1 on bad input (missing or malformed model or episode file, unknown policy, bad "
      "budget), 3 if a budget was exceeded without a pinned/protected reason (a bug), 100+ on command-line errors.\n"
      "Example: memdecay-eval --quick");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (o.list_policies) {
      ev::cli::list_policies(o);
      return 0;
    }
    if (o.quick) ev::cli::apply_quick(o, app);
    tiny_lm_engine engine;
    return ev::cli::run(o, engine);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memdecay-eval: error: %s\n", e.what());
    return 1;
  }
}
