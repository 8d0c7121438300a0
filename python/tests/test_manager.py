# SPDX-License-Identifier: Apache-2.0
"""The manager through Python: global budget in physical pages, fork, protections, explicit id maps."""
import numpy as np
import pytest

import memdecay as md

P = 16


def test_global_budget_and_commit_through_the_pool():
    mgr = md.Manager("memdecay", page_size=P, global_high=8, global_low=6)
    pool = md.BlockPool(32, P)
    for rid in (3, 4):
        s = mgr.open(rid, md.Config(page_size=P))
        s.append("user", 5 * P)
        pool.open(rid)
        pool.append_tokens(rid, 5 * P)
    mgr.advance_to(40)
    mgr.protect_tail_tokens(3, 20)
    plan = mgr.select_global()
    assert plan.pages_freed == 4 and len(plan) == 4
    with pytest.raises(ValueError, match="id_map"):
        mgr.commit(plan, pool)
    removals = mgr.commit(plan, pool, "identity")
    assert sum(len(r.freed) for r in removals.values()) == 4
    assert mgr.reclaimable_pages == 6 and pool.consistent()
    assert mgr.at(3).positions()[-1] == 5 * P - 1, "a drafted page was evicted"


def test_a_managed_sequence_commits_only_through_the_manager():
    mgr = md.Manager(page_size=P)
    s = mgr.open(1, md.Config(page_size=P, budget=md.Budget.tokens(32)))
    s.append("user", 4 * P)
    mgr.advance_to(3)
    with pytest.raises(md.UsageError, match="owned by a manager"):
        s.commit(s.select(1))
    mgr.close(1)
    with pytest.raises(md.UsageError):
        _ = s.kv_len  # the handle outlives its sequence without dangling


def test_rows_need_an_explicit_map():
    mgr = md.Manager(page_size=P, global_high=3)
    indptr = np.array([0, 2, 4], dtype=np.int32)
    indices = np.array([0, 1, 2, 3], dtype=np.int32)
    last = np.array([P, P], dtype=np.int32)
    for rid in (500, 700):
        mgr.open(rid, md.Config(page_size=P)).append("user", 2 * P)
    mgr.advance_to(5)
    csr = md.FlashInferCsr(indptr, indices, last, P, 8)
    plan = mgr.select_global()
    removals = mgr.commit(plan, csr, {500: 0, 700: 1})
    assert sum(len(r.removed) for r in removals.values()) == 1
    assert indptr[-1] == 3


def test_fork_shares_the_parents_pages():
    mgr = md.Manager(page_size=P)
    pool = md.BlockPool(16, P)
    parent = mgr.open(1, md.Config(page_size=P))
    parent.append("user", 3 * P + 4)
    pool.open(1)
    pool.append_tokens(1, 3 * P + 4)
    child = mgr.fork(1, 2, pool)
    assert child.kv_len == parent.kv_len and child.digest() != 0
    assert mgr.shared_pages(2) == [0, 1, 2]
    assert pool.ref_count(pool.page_at(1, 0)) == 2


@pytest.mark.parametrize("policy", md.POLICIES)
def test_every_policy_under_a_manager(policy):
    mgr = md.Manager(policy, page_size=P, global_high=6)
    for rid in range(3):
        mgr.open(rid, md.Config(page_size=P)).append("tool_out", 4 * P)
    mgr.advance_to(2)
    plan = mgr.select_global()
    mgr.commit(plan)
    assert mgr.resident_pages <= 6
