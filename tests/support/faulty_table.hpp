// SPDX-License-Identifier: Apache-2.0
// Fault injection: a page table that fails on command. faulty_table<Table> forwards every call to a real table and
// counts them; armed with fail(k, mode), the k-th call (0-based, over every member the library calls) fails before
// it reaches the real table:
//   engine_error   throws std::runtime_error (the engine's own failure: a CUDA error, a lost worker)
//   out_of_memory  throws std::bad_alloc
//   refusal        throws memdecay::usage_error (a table that rejects the request)
//   short_report   (removals only) answers as if one page fewer had been removed, and removes nothing: a broken
//                  adapter, which the library must catch before its state follows (a faulty_store's copies report
//                  one page fewer copied, having copied that many)
// Calls of other kinds than the armed one's pass through, so a mode that only applies to removals is tried at every
// call and fails only at removals. The wrapped table stays the real table's owner's; the wrapper holds a reference.
#ifndef MEMDECAY_TESTS_SUPPORT_FAULTY_TABLE_HPP
#define MEMDECAY_TESTS_SUPPORT_FAULTY_TABLE_HPP

#include <cstddef>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <memdecay/detail/error.hpp>
#include <memdecay/page_tables/page_table.hpp>

namespace fault_injection {

enum class fault_mode { engine_error, out_of_memory, refusal, short_report };

inline const char* to_string(fault_mode m) {
  switch (m) {
    case fault_mode::engine_error: return "engine_error";
    case fault_mode::out_of_memory: return "out_of_memory";
    case fault_mode::refusal: return "refusal";
    case fault_mode::short_report: return "short_report";
  }
  return "?";
}

inline constexpr fault_mode all_modes[] = {fault_mode::engine_error, fault_mode::out_of_memory, fault_mode::refusal,
                                           fault_mode::short_report};

/// When to fail: the `call`-th call (0-based) since the last fail(), in `mode`. One schedule may be shared by a
/// faulty_table and a faulty_store (faulty_store.hpp), so that a sweep fails each call of a commit in turn, whichever
/// of the two it goes to.
class fault_schedule {
 public:
  void fail(std::optional<std::size_t> call, fault_mode mode) {
    fail_at_ = call;
    mode_ = mode;
    calls_ = 0;
    fired_ = false;
  }
  [[nodiscard]] std::size_t calls() const noexcept { return calls_; }
  [[nodiscard]] bool fired() const noexcept { return fired_; }
  [[nodiscard]] fault_mode mode() const noexcept { return mode_; }

  /// Counts a call; throws when it is the armed one in a throwing mode, returns true when it is the armed one in
  /// short_report mode and the call can report short (`can_report_short`).
  bool hit(const char* call, bool can_report_short) {
    const std::size_t index = calls_++;
    if (!fail_at_ || index != *fail_at_) return false;
    if (mode_ == fault_mode::short_report) {
      if (!can_report_short) return false;
      fired_ = true;
      return true;
    }
    fired_ = true;
    switch (mode_) {
      case fault_mode::engine_error: throw std::runtime_error(std::string("injected engine error in ") + call);
      case fault_mode::out_of_memory: throw std::bad_alloc();
      case fault_mode::refusal: memdecay::detail::raise_usage(std::string("injected refusal in ") + call);
      case fault_mode::short_report: break;
    }
    return false;
  }
  /// Counts a call that may not fail (an undo: release, noexcept).
  void pass(const char*) noexcept { ++calls_; }

 private:
  std::optional<std::size_t> fail_at_;
  fault_mode mode_ = fault_mode::engine_error;
  std::size_t calls_ = 0;
  bool fired_ = false;
};

template <memdecay::page_table Table>
class faulty_table {
 public:
  using sequence_id = typename Table::sequence_id;
  using page_id = typename Table::page_id;

  explicit faulty_table(Table& inner) : inner_(inner), schedule_(&own_) {}
  /// A table that counts its calls on a schedule shared with others (a faulty_store).
  faulty_table(Table& inner, fault_schedule& shared) : inner_(inner), schedule_(&shared) {}
  faulty_table(const faulty_table&) = delete;
  faulty_table& operator=(const faulty_table&) = delete;

  /// Fails the `call`-th call from now on (counting from the last reset), in `mode`; std::nullopt disarms.
  void fail(std::optional<std::size_t> call, fault_mode mode) { schedule_->fail(call, mode); }
  /// Calls since the last fail() (or construction).
  [[nodiscard]] std::size_t calls() const noexcept { return schedule_->calls(); }
  /// Whether the armed fault fired.
  [[nodiscard]] bool fired() const noexcept { return schedule_->fired(); }

  [[nodiscard]] std::size_t page_size() const {
    hit("page_size", false);
    return inner_.page_size();
  }
  [[nodiscard]] std::size_t num_pages(const sequence_id& seq) const {
    hit("num_pages", false);
    return inner_.num_pages(seq);
  }
  [[nodiscard]] page_id page_at(const sequence_id& seq, std::size_t index) const {
    hit("page_at", false);
    return inner_.page_at(seq, index);
  }
  void check_remove_pages(const sequence_id& seq,
                          std::span<const std::size_t> pages) const requires memdecay::checked_page_table<Table> {
    hit("check_remove_pages", false);
    inner_.check_remove_pages(seq, pages);
  }
  memdecay::page_removal<page_id> remove_pages(const sequence_id& seq, std::span<const std::size_t> pages) {
    if (hit("remove_pages", true)) {  // short_report: the answer of a removal that lost a page, nothing removed
      memdecay::page_removal<page_id> lie;
      for (std::size_t k = 1; k < pages.size(); ++k) lie.removed.push_back(inner_.page_at(seq, pages[k]));
      return lie;
    }
    return inner_.remove_pages(seq, pages);
  }
  void check_remove_pages_of(
      std::span<const memdecay::sequence_pages<sequence_id>> batch) const requires memdecay::batch_page_table<Table> {
    hit("check_remove_pages_of", false);
    inner_.check_remove_pages_of(batch);
  }
  std::vector<memdecay::page_removal<page_id>> remove_pages_of(
      std::span<const memdecay::sequence_pages<sequence_id>> batch) requires memdecay::batch_page_table<Table> {
    if (hit("remove_pages_of", true)) {
      std::vector<memdecay::page_removal<page_id>> lie(batch.size());
      for (std::size_t b = 0; b < batch.size(); ++b)
        for (std::size_t k = b == 0 ? 1 : 0; k < batch[b].pages.size(); ++k)
          lie[b].removed.push_back(inner_.page_at(batch[b].seq, batch[b].pages[k]));
      return lie;
    }
    return inner_.remove_pages_of(batch);
  }
  void fork(const sequence_id& from, const sequence_id& to) requires requires(Table& t) { t.fork(from, to); }
  {
    hit("fork", false);
    inner_.fork(from, to);
  }
  [[nodiscard]] std::size_t ref_count(const page_id& id) const requires memdecay::shared_page_table<Table> {
    hit("ref_count", false);
    return inner_.ref_count(id);
  }
  [[nodiscard]] std::size_t free_blocks() const requires memdecay::inserting_page_table<Table> {
    hit("free_blocks", false);
    return inner_.free_blocks();
  }
  void check_insert_pages(const sequence_id& seq,
                          std::span<const std::size_t> at) const requires memdecay::inserting_page_table<Table> {
    hit("check_insert_pages", false);
    inner_.check_insert_pages(seq, at);
  }
  std::vector<page_id> insert_pages(const sequence_id& seq,
                                    std::span<const std::size_t> at) requires memdecay::inserting_page_table<Table> {
    hit("insert_pages", false);
    return inner_.insert_pages(seq, at);
  }

 private:
  bool hit(const char* call, bool removal) const { return schedule_->hit(call, removal); }

  Table& inner_;
  fault_schedule own_;
  fault_schedule* schedule_;
};

/// The same table without its batch removal (a user's table that only has remove_pages): the manager then commits
/// sequence by sequence.
template <memdecay::page_table Table>
class unbatched_table {
 public:
  using sequence_id = typename Table::sequence_id;
  using page_id = typename Table::page_id;
  explicit unbatched_table(Table& inner) : inner_(inner) {}
  [[nodiscard]] std::size_t page_size() const { return inner_.page_size(); }
  [[nodiscard]] std::size_t num_pages(const sequence_id& seq) const { return inner_.num_pages(seq); }
  [[nodiscard]] page_id page_at(const sequence_id& seq, std::size_t index) const { return inner_.page_at(seq, index); }
  void check_remove_pages(const sequence_id& seq, std::span<const std::size_t> pages) const {
    inner_.check_remove_pages(seq, pages);
  }
  memdecay::page_removal<page_id> remove_pages(const sequence_id& seq, std::span<const std::size_t> pages) {
    return inner_.remove_pages(seq, pages);
  }

 private:
  Table& inner_;
};

}  // namespace fault_injection

#endif  // MEMDECAY_TESTS_SUPPORT_FAULTY_TABLE_HPP
