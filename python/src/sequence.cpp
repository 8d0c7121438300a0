// SPDX-License-Identifier: Apache-2.0
// Sequence (the one evictor, any policy by name) and Plan. The GIL is released while the library observes,
// scores and selects; the arrays it reads are held by the call.
#include "sequence.hpp"

#include <algorithm>

namespace memdecay_python {

std::vector<std::string> kwargs_source::unused() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : kwargs_) {
    auto key = py::str(k).cast<std::string>();
    if (std::find(taken_.begin(), taken_.end(), key) == taken_.end()) out.push_back(std::move(key));
  }
  return out;
}

std::shared_ptr<sequence_handle> make_sequence(const std::string& policy, const md::config& cfg,
                                               const py::dict& params) {
  kwargs_source source(params);
  return memdecay_bindings::make_sequence(policy, cfg, source);
}

namespace {
md::query_signal signal_of(const std::string& name) {
  if (name == "bound_softmax") return md::query_signal::bound_softmax;
  if (name == "bound_softmax_tokens") return md::query_signal::bound_softmax_tokens;
  raise_argument("signal", "'" + name + "' (bound_softmax or bound_softmax_tokens)");
}
}  // namespace

// Any float array (any shape) as contiguous float32 values: the caller's memory when it already is, one copy
// otherwise; ValueError naming `name` for what NumPy cannot make floats of.
py::array_t<float> float_values(const py::handle& obj, const char* name) {
  py::object np = py::module_::import("numpy");
  py::array a;
  try {
    a = np.attr("ascontiguousarray")(obj, py::arg("dtype") = "float32").cast<py::array>();
  } catch (const py::error_already_set& e) {
    raise_argument(name, std::string("not an array of floats (") + e.what() + ")");
  }
  return py::reinterpret_borrow<py::array_t<float>>(a);
}
std::span<const float> values_of(const py::array_t<float>& a) { return {a.data(), static_cast<std::size_t>(a.size())}; }
md::head_bounds head_bounds_of(const std::string& heads) {
  if (heads == "max") return md::head_bounds::max;
  if (heads == "mean") return md::head_bounds::mean;
  if (heads == "attention") return md::head_bounds::attention;
  raise_argument("heads", "'" + heads + "' (expected 'max', 'mean' or 'attention')");
}

void bind_sequence(py::module_& m) {
  m.attr("POLICIES") = policy_names();
  m.def(
      "keep_largest_query_channels",
      [](const py::object& query, std::size_t head_dim, std::size_t channels) {
        const auto q = float_values(query, "query");
        std::vector<py::ssize_t> shape(q.shape(), q.shape() + q.ndim());
        py::array_t<float> out(shape);
        std::copy_n(q.data(), q.size(), out.mutable_data());
        md::keep_largest_query_channels(std::span<float>(out.mutable_data(), static_cast<std::size_t>(out.size())),
                                        head_dim, channels);
        return out;
      },
      py::arg("query"), py::arg("head_dim"), py::arg("channels"),
      "A copy of the query (heads x head_dim, any shape with that many floats) keeping each head's `channels` "
      "largest-magnitude channels and zeroing the rest (ties to the lower channel): pass it to select_recall for "
      "a digest bound over those channels (docs/tiers.md). InputError naming the field for head_dim or channels "
      "of 0, a length that is not a whole number of heads, or a non-finite element.");

  py::class_<plan_type>(m, "Plan",
                        "An eviction plan (phase 1 of two): the victims' logical pages and scores, and the state "
                        "generation it was made at; commit rejects a stale plan (UsageError).")
      .def_property_readonly("pages", [](const plan_type& p) { return to_numpy(p.pages); })
      .def_property_readonly("scores", [](const plan_type& p) { return to_numpy(p.scores); })
      .def_property_readonly("demoted", [](const plan_type& p) { return to_numpy(p.demoted); })
      .def_property_readonly("host_dropped", [](const plan_type& p) { return to_numpy(p.host_dropped); })
      .def_readonly("requested", &plan_type::requested)
      .def_readonly("pages_over_budget", &plan_type::pages_over_budget)
      .def_readonly("page_size", &plan_type::page_size)
      .def_readonly("generation", &plan_type::generation)
      .def_property_readonly("tokens", &plan_type::tokens)
      .def("__len__", [](const plan_type& p) { return p.pages.size(); })
      .def("__bool__", [](const plan_type& p) { return !p.pages.empty(); })
      .def("__repr__", [](const plan_type& p) {
        return "Plan(pages=" + py::repr(py::cast(p.pages)).cast<std::string>() +
               ", generation=" + std::to_string(p.generation) + ")";
      });

  py::class_<md::recall_plan>(m, "RecallPlan",
                              "A host tier's recall plan (phase 1 of two): host pages to promote (best bound first, "
                              "listed ascending), device pages to demote or drop to make room; commit_recall rejects "
                              "a stale one (UsageError).")
      .def_property_readonly("promote", [](const md::recall_plan& r) { return to_numpy(r.promote); })
      .def_property_readonly("promote_bounds", [](const md::recall_plan& r) { return to_numpy(r.promote_bounds); })
      .def_property_readonly("demote", [](const md::recall_plan& r) { return to_numpy(r.demote); })
      .def_property_readonly("drop", [](const md::recall_plan& r) { return to_numpy(r.drop); })
      .def_readonly("page_size", &md::recall_plan::page_size)
      .def_readonly("generation", &md::recall_plan::generation)
      .def_property_readonly("pages_moved", &md::recall_plan::pages_moved)
      .def("__bool__", [](const md::recall_plan& r) { return !r.empty(); })
      .def("__repr__", [](const md::recall_plan& r) {
        return "RecallPlan(promote=" + py::repr(py::cast(r.promote)).cast<std::string>() +
               ", demote=" + py::repr(py::cast(r.demote)).cast<std::string>() +
               ", drop=" + py::repr(py::cast(r.drop)).cast<std::string>() + ")";
      });

  py::class_<page_breakdown>(m, "PageExplanation", "A page's score by term (MemDecay).")
      .def_readonly("page", &page_breakdown::page)
      .def_readonly("first_position", &page_breakdown::first_position)
      .def_readonly("tokens", &page_breakdown::tokens)
      .def_readonly("status", &page_breakdown::status)
      .def_readonly("decay", &page_breakdown::decay)
      .def_readonly("attention", &page_breakdown::attention)
      .def_readonly("score", &page_breakdown::score);

  using H = sequence_handle;
  using handle = std::shared_ptr<H>;
  py::class_<H, handle>(m, "Sequence",
                        "One sequence's eviction state under a policy (the one evictor). Label tokens with "
                        "append, move the clock with advance_to, observe attention, select victims, commit them "
                        "to a page table. Every call validates its input and either applies fully or raises and "
                        "changes nothing.")
      .def(py::init([](const std::optional<md::config>& config, const std::string& policy, const py::kwargs& params) {
             return make_sequence(policy, config.value_or(md::config{}), params);
           }),
           py::arg("config") = py::none(), py::arg("policy") = "memdecay",
           "Sequence(config=Config(), policy='memdecay', **policy_parameters)")
      .def_property_readonly("policy", &H::policy)
      .def_property_readonly("config", &H::config)
      .def_property_readonly("regions", &H::regions)
      .def_property_readonly("kv_len", &H::kv_len, "Resident tokens.")
      .def_property_readonly("num_pages", &H::num_pages)
      .def_property_readonly("page_size", &H::page_size)
      .def_property_readonly("logical_len", &H::logical_len, "Every token ever appended (the next position).")
      .def_property_readonly("evicted_tokens", &H::evicted_tokens)
      .def_property_readonly("now", &H::now)
      .def_property_readonly("generation", &H::generation)
      .def_property_readonly("protection", &H::protection)
      .def_property_readonly("prefix_cache_boundary", &H::prefix_cache_boundary)
      .def("digest", &H::digest, "Everything selection depends on; equal digests mean equal decisions.")
      .def(
          "save",
          [](const H& s) {
            const auto b = s.save();
            return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
          },
          "The state snapshot as bytes (docs/snapshot-format.md): labels, clocks, the policy's columns, origins.")
      .def(
          "load",
          [](H& s, const py::buffer& data) {
            const py::buffer_info info = data.request();
            if (info.ndim != 1 || info.itemsize != 1)
              raise_argument("snapshot", "expected bytes (a 1-D buffer of bytes)");
            s.load({static_cast<const std::byte*>(info.ptr), static_cast<std::size_t>(info.size)});
          },
          py::arg("snapshot"),
          "Restores the state from save()'s bytes; the sequence must have the config and policy parameters they "
          "were saved with. InputError naming the field and offset otherwise; nothing changes then.")
      .def(
          "append",
          [](H& s, const py::object& region, std::size_t count) { s.append(region_of(region, s.regions()), count); },
          py::arg("region"), py::arg("count") = 1, "Appends `count` tokens of `region` (an id or a name).")
      .def(
          "append_tokens",
          [](H& s, const py::object& labels) {
            auto a = py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>::ensure(labels);
            if (!a || a.ndim() != 1) raise_argument("labels", "expected a 1-D sequence of region ids");
            s.append_tokens({a.data(), static_cast<std::size_t>(a.size())});
          },
          py::arg("labels"), "Appends one token per label (region ids).")
      .def("advance_to", &H::advance_to, py::arg("step"), "Moves the logical clock (UsageError if it goes back).")
      .def(
          "observe_tokens",
          [](H& s, const py::object& mass) {
            auto a = mass_array(mass, "mass", 1);
            py::gil_scoped_release release;
            return s.observe_tokens({a.data(), static_cast<std::size_t>(a.size())});
          },
          py::arg("mass"), "Attention per resident token (length kv_len); returns the tokens refreshed.")
      .def(
          "observe_pages",
          [](H& s, const py::object& mass) {
            auto a = mass_array(mass, "page_mass", 1);
            py::gil_scoped_release release;
            return s.observe_pages({a.data(), static_cast<std::size_t>(a.size())});
          },
          py::arg("page_mass"), "Attention per page (length num_pages), shared among the page's tokens.")
      .def(
          "observe_heads",
          [](H& s, const py::object& mass, const std::string& how) {
            auto a = mass_array(mass, "heads_by_tokens", 2);
            if (how != "sum" && how != "mean") raise_argument("how", "'" + how + "' (sum or mean)");
            const auto r = how == "sum" ? md::head_reduction::sum : md::head_reduction::mean;
            py::gil_scoped_release release;
            return s.observe_heads(a.data(), static_cast<std::size_t>(a.shape(0)), static_cast<std::size_t>(a.shape(1)),
                                   r);
          },
          py::arg("heads_by_tokens"), py::arg("how") = "sum", "A heads x tokens matrix, reduced by sum or mean.")
      .def(
          "observe_key_norms",
          [](H& s, const py::object& norms, double total) {
            auto a = mass_array(norms, "norms", 1);
            py::gil_scoped_release release;
            return s.observe_key_norms({a.data(), static_cast<std::size_t>(a.size())}, total);
          },
          py::arg("norms"), py::arg("total") = 1.0,
          "Observes the attention estimated from the device tokens' key norms (KnormPress: a low norm, a high "
          "share), summing to `total`, for engines that see neither attention nor keep digests.")
      .def(
          "observe_rows",
          [](H& s, const py::object& mass, const std::string& how, const std::string& format) {
            const py::array a = any_array(mass);
            const auto view = rows_of(a, reduction_of(how), format, "rows");
            py::gil_scoped_release release;
            return s.observe_rows(view);
          },
          py::arg("rows"), py::arg("how") = "sum", py::arg("format") = "",
          "Attention as the engine wrote it, read in place: tokens (1-D) or rows x tokens (2-D, any row stride) of "
          "float32, float16, or int16/uint16 holding fp16 or bf16 bits (format='f16' or 'bf16'; a torch.bfloat16 "
          "tensor's .view(torch.int16)), reduced over the rows by sum or mean. Returns the tokens refreshed.")
      .def(
          "enable_digests",
          [](H& s, std::size_t kv_heads, std::size_t head_dim, std::size_t query_heads, const std::string& kind,
             const std::string& storage, double scale) {
            md::digest_layout l{.kv_heads = kv_heads, .head_dim = head_dim, .query_heads = query_heads, .scale = scale};
            if (kind == "min_max")
              l.kind = md::digest_kind::min_max;
            else if (kind == "mean_key")
              l.kind = md::digest_kind::mean_key;
            else
              raise_argument("kind", "'" + kind + "' (min_max or mean_key)");
            if (storage == "f32")
              l.storage = md::digest_storage::f32;
            else if (storage == "f16")
              l.storage = md::digest_storage::f16;
            else if (storage == "bf16")
              l.storage = md::digest_storage::bf16;
            else
              raise_argument("storage", "'" + storage + "' (f32, f16 or bf16)");
            s.enable_digests(l);
          },
          py::arg("kv_heads"), py::arg("head_dim"), py::arg("query_heads") = 0, py::arg("kind") = "min_max",
          py::arg("storage") = "f32", py::arg("scale") = 0.0,
          "Keeps a key digest per page (Quest's per-channel min/max, or the mean key) so that observe_query can "
          "stand in for attention. query_heads 0 = kv_heads; scale 0 = 1/sqrt(head_dim). ConfigError naming the "
          "field for an invalid layout.")
      .def("disable_digests", &H::disable_digests, "Stops keeping page digests (and forgets them).")
      .def_property_readonly("has_digests", [](const H& s) { return s.digests() != nullptr; })
      .def_property_readonly(
          "digest_bytes_per_page",
          [](const H& s) -> py::object {
            const auto* d = s.digests();
            return d ? py::cast(d->layout().bytes_per_page()) : py::none();
          },
          "Bytes one page's digest takes (None without digests).")
      .def(
          "pages_with_digest", [](const H& s) { return s.digests() ? s.digests()->pages_with_digest() : 0; },
          "Pages that have a digest now.")
      .def(
          "set_page_digest",
          [](H& s, std::size_t page, const py::object& lo, const py::object& hi) {
            const auto a = float_values(lo, "lo"), b = float_values(hi, "hi");
            s.set_page_digest(page, values_of(a), values_of(b));
          },
          py::arg("page"), py::arg("lo"), py::arg("hi"),
          "Page `page`'s min/max digest: per-channel minimum and maximum of its keys, kv_heads x head_dim each.")
      .def(
          "set_page_mean_key",
          [](H& s, std::size_t page, const py::object& mean) {
            const auto a = float_values(mean, "mean");
            s.set_page_mean_key(page, values_of(a));
          },
          py::arg("page"), py::arg("mean"), "Page `page`'s mean-key digest (kv_heads x head_dim).")
      .def(
          "set_page_keys",
          [](H& s, std::size_t page, const py::object& keys) {
            const auto a = float_values(keys, "keys");
            s.set_page_keys(page, values_of(a));
          },
          py::arg("page"), py::arg("keys"),
          "Computes page `page`'s digest from its keys (tokens x kv_heads x head_dim, any shape of that size).")
      .def(
          "page_bounds",
          [](const H& s, const py::object& query, std::size_t threads) {
            const auto q = float_values(query, "query");
            const auto* d = s.digests();
            const std::size_t heads = d ? d->layout().effective_query_heads() : 0, pages = s.num_pages();
            py::array_t<float> out({static_cast<py::ssize_t>(heads), static_cast<py::ssize_t>(pages)});
            float* data = out.mutable_data();
            {
              py::gil_scoped_release release;
              s.query_page_bounds(values_of(q), {data, heads * pages}, threads);
            }
            return out;
          },
          py::arg("query"), py::arg("threads") = 1,
          "Each query head's logit bound on each page (query_heads x num_pages; inf for a page without a digest). "
          "threads > 1 splits the pages over a pool of that many threads: the same bounds bit for bit.")
      .def(
          "observe_query",
          [](H& s, const py::object& query, const std::string& signal, double total, std::size_t threads) {
            const auto q = float_values(query, "query");
            const auto how = signal_of(signal);
            py::gil_scoped_release release;
            return s.observe_query(values_of(q), how, total, threads);
          },
          py::arg("query"), py::arg("signal") = "bound_softmax", py::arg("total") = 1.0, py::arg("threads") = 1,
          "Observes the attention estimated from the query (query_heads x head_dim) and the page digests, for "
          "engines that never materialise attention; returns the tokens refreshed.")
      .def(
          "estimate_query_attention",
          [](const H& s, const py::object& query, const std::string& signal, double total, std::size_t threads) {
            const auto q = float_values(query, "query");
            return to_numpy(s.estimate_query_attention(values_of(q), signal_of(signal), total, threads));
          },
          py::arg("query"), py::arg("signal") = "bound_softmax", py::arg("total") = 1.0, py::arg("threads") = 1,
          "The per-page attention observe_query would observe (one entry per device page, in page order, summing "
          "to total).")
      .def(
          "enable_host_tier",
          [](H& s, const py::object& host_budget, double min_host_priority, double hysteresis,
             md::step_t min_device_steps, const py::object& max_recall_pages, std::size_t displace_lowest) {
            md::host_tier_config c{.min_host_priority = min_host_priority,
                                   .hysteresis = hysteresis,
                                   .min_device_steps = min_device_steps,
                                   .displace_lowest = displace_lowest};
            if (!host_budget.is_none()) c.host_budget = host_budget.cast<md::budget_config>();
            if (!max_recall_pages.is_none()) c.max_recall_pages = max_recall_pages.cast<std::size_t>();
            s.enable_host_tier(c);
          },
          py::arg("host_budget") = py::none(), py::arg("min_host_priority") = 0.0, py::arg("hysteresis") = 0.0,
          py::arg("min_device_steps") = 4, py::arg("max_recall_pages") = py::none(), py::arg("displace_lowest") = 0,
          "Demotes the budget's victims to a host tier instead of dropping them (tiers/host_tier.hpp): host_budget "
          "a Budget (None: unlimited), a page goes to host only if one of its regions has base priority >= "
          "min_host_priority; displace_lowest > 0 lets a recall displace only that many of the lowest-scoring "
          "evictable device pages. ConfigError naming the field. A managed sequence's host pages count toward its "
          "manager's host_pool.")
      .def("disable_host_tier", &H::disable_host_tier,
           "Stops demoting; UsageError while pages are on the host (they would be lost).")
      .def_property_readonly("has_host_tier", [](const H& s) { return s.host_tier() != nullptr; })
      .def_property_readonly("device_len", &H::device_len, "Tokens on the device: what observations cover.")
      .def_property_readonly("device_pages", &H::device_pages)
      .def_property_readonly("host_pages",
                             [](const H& s) { return s.host_tier() ? s.host_tier()->host_pages() : std::size_t{0}; })
      .def(
          "on_host",
          [](const H& s) {
            std::vector<bool> out(s.num_pages(), false);
            if (const auto* t = s.host_tier())
              for (std::size_t p = 0; p < out.size(); ++p) out[p] = t->on_host(p);
            py::array_t<bool> a(static_cast<py::ssize_t>(out.size()));
            for (std::size_t p = 0; p < out.size(); ++p) a.mutable_data()[p] = out[p];
            return a;
          },
          "Per held page: True on the host tier, False on the device.")
      .def("device_index", &H::device_index, py::arg("page"),
           "A device page's index in the device page table (InputError for a host page).")
      .def(
          "select_recall",
          [](const H& s, const py::object& query, const py::object& protect, const std::string& heads,
             std::size_t threads) {
            const auto q = float_values(query, "query");
            const auto prot = page_list(protect);
            const auto over_heads = head_bounds_of(heads);
            py::gil_scoped_release release;
            return s.select_recall(values_of(q), prot, over_heads, threads);
          },
          py::arg("query"), py::arg("protect") = py::none(), py::arg("heads") = "max", py::arg("threads") = 1,
          "The recall plan for the step's query (query_heads x head_dim): needs a host tier and page digests. "
          "heads: 'max' ranks a page by its best query head's bound, 'mean' by the mean over the heads.")
      .def(
          "select_recall_for_bounds",
          [](const H& s, const py::object& bounds, const py::object& protect) {
            const auto b = float_values(bounds, "bounds");
            const auto prot = page_list(protect);
            py::gil_scoped_release release;
            return s.select_recall_for_bounds(values_of(b), prot);
          },
          py::arg("bounds"), py::arg("protect") = py::none(),
          "The recall plan from per-page bounds the engine computed (one per held page).")
      .def("check_recall", &H::check_recall, py::arg("plan"))
      .def(
          "commit_recall",
          [](H& s, const md::recall_plan& plan, const py::object& table, const py::object& seq) -> py::object {
            if (table.is_none()) {
              s.commit_recall(plan);
              return py::none();
            }
            if (seq.is_none()) raise_argument("seq", "the table's id of this sequence is required with a table");
            if (!py::isinstance<pool_type>(table))
              raise_argument("table", "a BlockPool (the table that can insert the promoted pages)");
            auto done = s.commit_recall(plan, table.cast<pool_type&>(), seq.cast<std::uint64_t>());
            py::dict out;
            out["inserted"] = to_numpy(done.inserted);
            out["removed"] = py::cast(std::move(done.removed));
            return out;
          },
          py::arg("plan"), py::arg("table") = py::none(), py::arg("seq") = py::none(),
          "Applies a recall plan (phase 2): with a BlockPool, removes the displaced pages and inserts the promoted "
          "ones in fresh blocks (returns {'inserted': blocks in page order, 'removed': PageRemoval}).")
      .def(
          "select",
          [](const H& s, std::size_t k, const py::object& protect) {
            const auto prot = page_list(protect);
            py::gil_scoped_release release;
            return s.select(k, prot);
          },
          py::arg("k"), py::arg("protect") = py::none(), "The k lowest-scoring evictable pages (changes nothing).")
      .def(
          "select_for_budget",
          [](const H& s, const py::object& protect) {
            const auto prot = page_list(protect);
            py::gil_scoped_release release;
            return s.select_for_budget(prot);
          },
          py::arg("protect") = py::none(), "The pages the budget asks for (changes nothing).")
      .def_property_readonly("pages_wanted_by_budget", &H::pages_wanted_by_budget)
      .def(
          "commit",
          [](H& s, const plan_type& plan, const py::object& table, const py::object& seq) -> py::object {
            if (table.is_none()) {
              s.commit(plan);
              return py::none();
            }
            if (seq.is_none()) raise_argument("seq", "the table's id of this sequence is required with a table");
            return with_table(table, "table", [&](auto& t) -> py::object {
              using id = typename std::decay_t<decltype(t)>::sequence_id;
              return py::cast(s.commit(plan, t, seq.cast<id>()));
            });
          },
          py::arg("plan"), py::arg("table") = py::none(), py::arg("seq") = py::none(),
          "Applies a plan (phase 2): to the table and the state together (returns the table's PageRemoval), or "
          "to the state only when no table is given.")
      .def(
          "page_scores",
          [](const H& s) {
            std::vector<float> v;
            {
              py::gil_scoped_release release;
              v = s.page_scores();
            }
            return to_numpy(v);
          },
          "Each resident page's score (a copy).")
      .def(
          "page_statuses", [](const H& s, const py::object& protect) { return s.page_statuses(page_list(protect)); },
          py::arg("protect") = py::none())
      .def(
          "explain_page",
          [](const H& s, std::size_t page) {
            auto e = s.explain_page(page);
            if (!e) throw md::usage_error("explain_page: policy " + s.policy() + " does not explain its scores");
            return *e;
          },
          py::arg("page"))
      .def(
          "positions", [](const H& s) { return to_numpy(s.positions()); }, "Each resident token's position.")
      .def(
          "labels", [](const H& s) { return to_numpy(s.labels()); }, "Each resident token's region id.")
      .def(
          "copy", [](const H& s) { return handle(s.copy()); }, "An unmanaged copy (state and layout).")
      .def("__copy__", [](const H& s) { return handle(s.copy()); })
      .def("__repr__", [](const H& s) {
        return "Sequence(policy='" + s.policy() + "', kv_len=" + std::to_string(s.kv_len()) +
               ", num_pages=" + std::to_string(s.num_pages()) + ", now=" + std::to_string(s.now()) + ")";
      });
}

}  // namespace memdecay_python
