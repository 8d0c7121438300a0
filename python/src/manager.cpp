// SPDX-License-Identifier: Apache-2.0
// Manager: many sequences of one policy under per-sequence and global budgets, fork, per-step protections and the
// deterministic global selection; GlobalPlan. A table indexed by batch row takes an explicit id map (a dict or a
// callable from the manager's id to the row), or "identity" when the ids are the table's (the block pool).
#include <algorithm>
#include <map>

#include "common/manager_handle.hpp"

#include "sequence.hpp"

namespace memdecay_python {

namespace {

// The explicit id map: "identity", a dict {manager id: row} or a callable(manager id) -> row.
id_map id_map_of(const py::object& map) {
  if (py::isinstance<py::str>(map)) {
    if (map.cast<std::string>() != "identity")
      raise_argument("id_map", "'" + map.cast<std::string>() + "' (a dict, a callable or 'identity')");
    return [](std::uint64_t id) { return static_cast<std::size_t>(id); };
  }
  if (py::isinstance<py::dict>(map)) {
    std::map<std::uint64_t, std::size_t> rows = map.cast<std::map<std::uint64_t, std::size_t>>();
    return [rows](std::uint64_t id) {
      auto it = rows.find(id);
      if (it == rows.end()) throw md::usage_error("id_map has no row for sequence " + std::to_string(id));
      return it->second;
    };
  }
  if (PyCallable_Check(map.ptr())) {
    return [map](std::uint64_t id) { return map(id).cast<std::size_t>(); };
  }
  raise_argument("id_map", "expected a dict, a callable or 'identity' (the map is always named)");
}

}  // namespace

void bind_manager(py::module_& m) {
  py::class_<md::global_victim<float, std::uint64_t>>(m, "GlobalVictim")
      .def_readonly("sequence", &md::global_victim<float, std::uint64_t>::sequence)
      .def_readonly("page", &md::global_victim<float, std::uint64_t>::page)
      .def_readonly("score", &md::global_victim<float, std::uint64_t>::score)
      .def_readonly("shared", &md::global_victim<float, std::uint64_t>::shared)
      .def_property_readonly("reason",
                             [](const md::global_victim<float, std::uint64_t>& v) { return md::to_string(v.reason); });

  py::class_<global_plan>(m, "GlobalPlan",
                          "A global selection: the victims in the total order (score, tie hash, id, page) and one "
                          "Plan per sequence that loses pages.")
      .def_readonly("victims", &global_plan::victims)
      .def_readonly("plans", &global_plan::plans)
      .def_readonly("pages_freed", &global_plan::pages_freed)
      .def_readonly("pages_short", &global_plan::pages_short)
      .def("digest", &global_plan::digest)
      .def("__len__", [](const global_plan& p) { return p.victims.size(); })
      .def("__bool__", [](const global_plan& p) { return !p.victims.empty(); });

  using handle = std::shared_ptr<manager_handle>;
  py::class_<manager_handle, handle>(m, "Manager",
                                     "Many sequences of one policy under one memory pool: per-sequence budgets (each "
                                     "sequence's Config), a global budget in physical pages, fork, per-step "
                                     "protections, and a deterministic global selection.")
      .def(py::init([](const std::string& policy, std::size_t page_size, std::optional<std::size_t> global_high,
                       std::optional<std::size_t> global_low, std::optional<std::size_t> host_pool,
                       std::uint64_t polynomial_above_tokens, double scorer_back_below) {
             md::manager_config cfg{.page_size = page_size};
             if (global_high) cfg.global = md::global_budget::pages(*global_high, global_low);
             if (host_pool) cfg.host_pool = *host_pool;
             cfg.scorer = {.polynomial_above_tokens = polynomial_above_tokens, .back_below = scorer_back_below};
             cfg.global.validate();
             cfg.scorer.validate();
             return with_policy(
                 policy, [&]<template <class> class P>() -> handle { return std::make_shared<manager_impl<P>>(cfg); });
           }),
           py::arg("policy") = "memdecay", py::kw_only(), py::arg("page_size") = 16,
           py::arg("global_high") = py::none(), py::arg("global_low") = py::none(), py::arg("host_pool") = py::none(),
           py::arg("polynomial_above_tokens") = 0, py::arg("scorer_back_below") = 0.75)
      .def_property_readonly("policy", &manager_handle::policy)
      .def_property_readonly("now", &manager_handle::now)
      .def(
          "open",
          [](manager_handle& mh, std::uint64_t id, const std::optional<md::config>& cfg, const py::kwargs& params) {
            kwargs_source source(params);
            return mh.open(id, cfg.value_or(md::config{}), source);
          },
          py::arg("id"), py::arg("config") = py::none(),
          "Opens sequence `id` at the manager's clock; returns it (its own commit refuses: commit through the "
          "manager).")
      .def(
          "fork",
          [](manager_handle& mh, std::uint64_t parent, std::uint64_t child, const py::object& pool) {
            return mh.fork(parent, child, pool.is_none() ? nullptr : &pool.cast<pool_type&>());
          },
          py::arg("parent"), py::arg("child"), py::arg("pool") = py::none(),
          "A child sharing the parent's full pages, with a copy of its policy state (and the pool's fork).")
      .def("close", &manager_handle::close, py::arg("id"))
      .def("at", &manager_handle::at, py::arg("id"))
      .def("__getitem__", &manager_handle::at)
      .def("__contains__", &manager_handle::contains)
      .def("ids", &manager_handle::ids)
      .def(
          "advance_to",
          [](manager_handle& mh, md::step_t step, std::size_t threads) {
            py::gil_scoped_release release;
            mh.advance_to(step, threads);
          },
          py::arg("step"), py::arg("threads") = 1,
          "Every clock to `step` (UsageError/InputError if one goes back); `threads` > 1 moves them on a pool.")
      .def(
          "observe_batch",
          [](manager_handle& mh, const py::object& batch, std::size_t threads, const std::string& how,
             const std::string& format) {
            // {id: mass} or [(id, mass), ...]. Every mass a 1-D float32 array (and how, format left alone): the
            // masses, viewed in place; otherwise attention rows (Sequence.observe_rows's arrays), viewed in place.
            std::vector<std::uint64_t> ids;
            std::vector<py::array> arrays;
            const py::object items = py::isinstance<py::dict>(batch) ? batch.attr("items")() : batch;
            for (const py::handle item : items) {
              const py::tuple pair(py::reinterpret_borrow<py::object>(item));
              if (pair.size() != 2) raise_argument("batch", "entries are (id, mass) pairs");
              ids.push_back(pair[0].cast<std::uint64_t>());
              arrays.push_back(any_array(pair[1]));
            }
            const bool masses = how == "sum" && format.empty() &&
                                std::all_of(arrays.begin(), arrays.end(), [](const py::array& a) {
                                  return a.ndim() == 1 && a.dtype().is(py::dtype::of<float>());
                                });
            if (masses) {
              std::vector<py::array_t<float>> kept;
              std::vector<std::span<const float>> spans;
              for (const auto& a : arrays) {
                kept.push_back(mass_array(a, "mass", 1));
                spans.emplace_back(kept.back().data(), static_cast<std::size_t>(kept.back().size()));
              }
              py::gil_scoped_release release;
              return mh.observe_batch(ids, spans, threads);
            }
            const auto r = reduction_of(how);
            std::vector<md::attention_rows> rows;
            for (const auto& a : arrays) rows.push_back(rows_of(a, r, format, "rows"));
            py::gil_scoped_release release;
            return mh.observe_batch_rows(ids, rows, threads);
          },
          py::arg("batch"), py::arg("threads") = 1, py::arg("how") = "sum", py::arg("format") = "",
          "observe_tokens for every (id, mass) of the batch ({id: mass} or pairs), a task per sequence on `threads` "
          "threads (a pool the manager keeps); every mass is checked first (InputError naming the sequence, and "
          "nothing changes). Returns the tokens refreshed per entry, in batch order; the same for any thread count. "
          "Entries that are not all 1-D float32 (2-D rows, float16, bf16 bits with format='bf16') are read as "
          "observe_rows reads them, reduced by `how`.")
      .def(
          "protect_pages",
          [](manager_handle& mh, std::uint64_t id, const py::object& pages) { mh.protect_pages(id, page_list(pages)); },
          py::arg("id"), py::arg("pages"))
      .def("protect_tail_tokens", &manager_handle::protect_tail_tokens, py::arg("id"), py::arg("tokens"))
      .def("clear_protections", &manager_handle::clear_protections)
      .def("protected_pages", &manager_handle::protected_pages, py::arg("id"))
      .def(
          "set_shared",
          [](manager_handle& mh, std::uint64_t id, const py::object& pages, bool shared) {
            mh.set_shared(id, page_list(pages), shared);
          },
          py::arg("id"), py::arg("pages"), py::arg("shared") = true)
      .def("shared_pages", &manager_handle::shared_pages, py::arg("id"))
      .def(
          "mark_shared_from",
          [](manager_handle& mh, const py::object& table, const py::object& map) {
            if (py::isinstance<pool_type>(table)) return mh.mark_shared_from(table.cast<const pool_type&>());
            if (py::isinstance<vllm_view>(table))
              return mh.mark_shared_from(table.cast<vllm_view&>().table, id_map_of(map));
            if (py::isinstance<flashinfer_view>(table))
              return mh.mark_shared_from(table.cast<flashinfer_view&>().table, id_map_of(map));
            raise_argument("table", "expected a BlockPool, VllmBlockTable or FlashInferCsr");
          },
          py::arg("table"), py::arg("id_map") = "identity")
      .def_property_readonly("resident_pages", &manager_handle::resident_pages)
      .def_property_readonly("reclaimable_pages", &manager_handle::reclaimable_pages)
      .def_property_readonly("physical_pages", &manager_handle::physical_pages)
      .def_property_readonly("host_pages", &manager_handle::host_pages,
                             "Pages on the host tiers of all sequences (at most host_pool).")
      .def(
          "select_recall",
          [](const manager_handle& mh, std::uint64_t id, const py::object& query, const std::string& heads,
             std::size_t threads) {
            const auto q = float_values(query, "query");
            const auto over_heads = head_bounds_of(heads);
            py::gil_scoped_release release;
            return mh.select_recall(id, values_of(q), over_heads, threads);
          },
          py::arg("id"), py::arg("query"), py::arg("heads") = "max", py::arg("threads") = 1,
          "Sequence `id`'s recall plan for the query (needs its host tier and page digests); never displaces a page "
          "protected for this step or shared.")
      .def(
          "select_recall_for_bounds",
          [](const manager_handle& mh, std::uint64_t id, const py::object& bounds) {
            const auto b = float_values(bounds, "bounds");
            py::gil_scoped_release release;
            return mh.select_recall_for_bounds(id, values_of(b));
          },
          py::arg("id"), py::arg("bounds"), "select_recall from per-page bounds the engine computed.")
      .def("check_recall", &manager_handle::check_recall, py::arg("id"), py::arg("plan"))
      .def(
          "commit_recall",
          [](manager_handle& mh, std::uint64_t id, const md::recall_plan& plan, const py::object& table) -> py::object {
            if (table.is_none()) {
              mh.commit_recall(id, plan);
              return py::none();
            }
            if (!py::isinstance<pool_type>(table))
              raise_argument("table", "a BlockPool (the table that can insert the promoted pages)");
            auto done = mh.commit_recall(id, plan, table.cast<pool_type&>());
            py::dict out;
            out["inserted"] = to_numpy(done.inserted);
            out["removed"] = py::cast(std::move(done.removed));
            return out;
          },
          py::arg("id"), py::arg("plan"), py::arg("table") = py::none(),
          "Applies sequence `id`'s recall plan, with the manager's checks (a protected page displaced, the host pool "
          "overfilled: UsageError, nothing changes); with a BlockPool keyed by the manager's ids, as "
          "Sequence.commit_recall.")
      .def("prefix_cache_boundary", &manager_handle::prefix_cache_boundary, py::arg("id"))
      .def("prefix_cacheable_tokens", &manager_handle::prefix_cacheable_tokens, py::arg("id"))
      .def(
          "select_global",
          [](manager_handle& mh, std::size_t pages_to_free, std::size_t threads) {
            py::gil_scoped_release release;
            return threads <= 1 ? static_cast<const manager_handle&>(mh).select_global(pages_to_free)
                                : mh.select_global(pages_to_free, threads);
          },
          py::arg("pages_to_free") = 0, py::arg("threads") = 1,
          "Phase 1: sequence budgets, then the global one (changes nothing); `threads` > 1 runs the per-sequence "
          "work on a pool, with the same plan.")
      .def(
          "commit",
          [](manager_handle& mh, const global_plan& plan, const py::object& table,
             const py::object& map) -> py::object {
            if (table.is_none()) {
              mh.commit(plan);
              return py::none();
            }
            return with_table(table, "table", [&](auto& t) -> py::object {
              if constexpr (std::is_same_v<std::decay_t<decltype(t)>, pool_type>) {
                if (!py::isinstance<py::str>(map) || map.cast<std::string>() != "identity")
                  raise_argument("id_map", "a BlockPool is keyed by the manager's ids: pass id_map='identity'");
                return py::cast(mh.commit(plan, t));
              } else {
                if (map.is_none()) raise_argument("id_map", "required with a table (a dict, a callable or 'identity')");
                return py::cast(mh.commit(plan, t, id_map_of(map)));
              }
            });
          },
          py::arg("plan"), py::arg("table") = py::none(), py::arg("id_map") = py::none(),
          "Phase 2, all or nothing: every plan checked against its sequence and the table first. Returns "
          "{id: PageRemoval} with a table; None for a state-only commit.")
      .def("digest", &manager_handle::digest)
      .def(
          "save",
          [](const manager_handle& mh, md::snapshot::checkpoint* since) {
            std::vector<std::byte> b;
            mh.save(since, b);
            return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
          },
          py::arg("checkpoint") = py::none(),
          "A snapshot of every sequence, the shared pages, the protections and the clock (docs/snapshot-format.md): "
          "full without a checkpoint or with an empty one, else only what changed since the last save with it (the "
          "checkpoint is updated).")
      .def(
          "load",
          [](manager_handle& mh, const py::sequence& chain, const py::object& config, const py::kwargs& params) {
            std::vector<std::string> held;  // the bytes of each element, alive for the call
            held.reserve(chain.size());
            std::vector<std::span<const std::byte>> spans;
            for (const auto& element : chain) {
              if (!py::isinstance<py::bytes>(element) && !py::isinstance<py::bytearray>(element) &&
                  !py::isinstance<py::memoryview>(element))
                raise_argument("chain", "expected a list of bytes (a full snapshot, then the incremental ones)");
              held.push_back(py::isinstance<py::bytes>(element)
                                 ? element.cast<std::string>()
                                 : py::module_::import("builtins").attr("bytes")(element).cast<std::string>());
            }
            for (const auto& h : held) spans.push_back(std::as_bytes(std::span<const char>(h.data(), h.size())));
            const bool per_sequence = !py::isinstance<md::config>(config) && PyCallable_Check(config.ptr());
            if (!per_sequence && !py::isinstance<md::config>(config))
              raise_argument("config", "expected a Config, or a callable(id) -> Config or (Config, dict)");
            mh.load(spans, [&](std::uint64_t id, const std::function<void(param_source&)>& read_params) {
              if (!per_sequence) {
                kwargs_source source(params);
                read_params(source);
                return config.cast<md::config>();
              }
              const py::object made = config(id);
              if (py::isinstance<md::config>(made)) {
                kwargs_source none{py::dict()};
                read_params(none);
                return made.cast<md::config>();
              }
              const auto pair = made.cast<std::pair<md::config, py::dict>>();
              kwargs_source source(pair.second);
              read_params(source);
              return pair.first;
            });
          },
          py::arg("chain"), py::arg("config"),
          "Replaces the contents with a chain of snapshots: a full one, then the incremental ones after it, in "
          "order. `config` is every sequence's Config (with **parameters), or a callable(id) returning a Config or "
          "(Config, {parameters}). InputError naming the element, the field and the offset for a corrupted, "
          "reordered or mismatched chain; nothing changes then.");

  py::class_<md::snapshot::checkpoint>(m, "Checkpoint",
                                       "What an incremental Manager.save compares with: the sequences as the last "
                                       "save with this checkpoint saw them. Empty: the next save is full.")
      .def(py::init<>())
      .def_property_readonly("empty", &md::snapshot::checkpoint::empty)
      .def_property_readonly("last_snapshot", &md::snapshot::checkpoint::last_snapshot)
      .def("reset", &md::snapshot::checkpoint::reset, "Makes the next save full.");
}

}  // namespace memdecay_python
