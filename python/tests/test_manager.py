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


def _fleet(policy="memdecay", **params):
    mgr = md.Manager(policy, page_size=P)
    rng = np.random.default_rng(3)
    for rid in (2, 5, 8):
        s = mgr.open(rid, md.Config(page_size=P, budget=md.Budget.tokens(6 * P)), **params)
        s.append("system", P)
        s.append("tool_out", 7 * P)
    mgr.advance_to(4)
    for rid in mgr.ids():
        s = mgr.at(rid)
        s.observe_tokens(rng.random(s.kv_len, dtype=np.float32) / s.kv_len)
    mgr.commit(mgr.select_global())
    mgr.fork(5, 9)
    mgr.protect_tail_tokens(2, 3)
    return mgr


@pytest.mark.parametrize("policy,params", [("memdecay", {}), ("h2o", {"recent_fraction": 0.5})])
def test_a_manager_chain_of_snapshots_loads_bit_identical(policy, params):
    mgr = _fleet(policy, **params)
    cp = md.Checkpoint()
    assert cp.empty
    full = mgr.save(cp)
    assert full[:8] == b"MDMGRS\r\n" and not cp.empty
    mgr.advance_to(9)  # only the clocks move: clock records
    clock = mgr.save(cp)
    assert len(clock) < len(full) // 2
    mgr.at(8).append("user", 5)
    delta = mgr.save(cp)
    back = md.Manager(policy, page_size=P)
    cfg = md.Config(page_size=P, budget=md.Budget.tokens(6 * P))
    back.load([full, clock, delta], cfg, **params)
    assert back.digest() == mgr.digest() and back.ids() == mgr.ids()
    assert back.shared_pages(9) == mgr.shared_pages(9) and back.save() == mgr.save()
    # Per-sequence configs from a callable: a Config, or (Config, parameters).
    again = md.Manager(policy, page_size=P)
    again.load([full, clock, delta], lambda rid: (cfg, params))
    assert again.digest() == mgr.digest()
    assert back.select_global().digest() == mgr.select_global().digest()


def test_a_bad_chain_is_named_and_changes_nothing():
    mgr = _fleet()
    cp = md.Checkpoint()
    full = mgr.save(cp)
    mgr.advance_to(7)
    delta = mgr.save(cp)
    cfg = md.Config(page_size=P, budget=md.Budget.tokens(6 * P))
    target = md.Manager(page_size=P)
    target.open(1, cfg).append("user", 20)
    before = target.digest()
    broken = bytearray(delta)
    broken[-1] ^= 1
    with pytest.raises(md.InputError, match="snapshot 2 of 2 payload checksum at offset 48"):
        target.load([full, bytes(broken)], cfg)
    with pytest.raises(md.InputError, match="kind at offset 18"):
        target.load([delta], cfg)
    with pytest.raises(md.InputError, match="config digest"):
        target.load([full], md.Config(page_size=P))
    with pytest.raises(md.ConfigError, match="nope"):
        target.load([full], cfg, nope=1)
    with pytest.raises(ValueError, match="config"):
        target.load([full], 42)
    assert target.digest() == before and target.ids() == [1]
    with pytest.raises(md.UsageError, match="another manager"):
        target.save(cp)


def batch_manager():
    mgr = md.Manager("memdecay", page_size=P, global_high=40, global_low=30)
    rng = np.random.default_rng(5)
    for sid in range(6):
        seq = mgr.open(10 + 3 * sid, md.Config(page_size=P))
        seq.append("system", P)
        for _ in range(4):
            seq.append(int(rng.integers(1, 7)), int(rng.integers(1, 3 * P)))
    return mgr


def test_the_batch_step_is_the_same_on_any_number_of_threads():
    base = batch_manager()
    base.advance_to(3)
    masses = {sid: np.random.default_rng(sid).random(base[sid].kv_len, dtype=np.float32) for sid in base.ids()}
    for sid, m in masses.items():
        base[sid].observe_tokens(m)
    want = base.select_global()
    assert len(want.victims) > 0
    for threads in (1, 2, 4):
        mgr = batch_manager()
        mgr.advance_to(3, threads=threads)
        refreshed = mgr.observe_batch(list(masses.items()) if threads == 2 else masses, threads=threads)
        assert len(refreshed) == len(masses)
        assert mgr.digest() == base.digest()
        plan = mgr.select_global(threads=threads)
        assert [(v.sequence, v.page) for v in plan.victims] == [(v.sequence, v.page) for v in want.victims]


def test_a_bad_mass_in_a_batch_changes_nothing():
    mgr = batch_manager()
    mgr.advance_to(2)
    before = mgr.digest()
    ids = mgr.ids()
    batch = [(sid, np.full(mgr[sid].kv_len, 0.01, np.float32)) for sid in ids]
    batch[3][1][5] = np.nan
    with pytest.raises(md.InputError, match=f"sequence {ids[3]}"):
        mgr.observe_batch(batch, threads=2)
    with pytest.raises(md.UsageError, match="named twice"):
        mgr.observe_batch([batch[0], batch[0]])
    assert mgr.digest() == before


def test_a_batch_of_attention_rows_is_observe_rows_per_sequence():
    a, b = batch_manager(), batch_manager()
    a.advance_to(2)
    b.advance_to(2)
    rng = np.random.default_rng(8)
    batch = {}
    for k, sid in enumerate(a.ids()):
        n = a[sid].kv_len
        padded = (rng.random((1 + k % 3, n + 5), dtype=np.float32) / n).astype(np.float16)
        batch[sid] = padded[:, :n]  # rows with a leading dimension, viewed in place
    refreshed = a.observe_batch(batch, threads=2, how="mean")
    assert refreshed == [b[sid].observe_rows(rows, how="mean") for sid, rows in batch.items()]
    assert a.digest() == b.digest()
    before = a.digest()
    bad = dict(batch)
    sid = list(bad)[2]
    bad[sid] = bad[sid].copy()
    bad[sid][0, 3] = np.float16(-1.0)
    with pytest.raises(md.InputError, match=f"sequence {sid}: attention rows"):
        a.observe_batch(bad, threads=2)
    assert a.digest() == before


def test_the_scorer_rule_is_checked_and_switches_the_batch():
    with pytest.raises(md.ConfigError, match="scorer.back_below"):
        md.Manager(polynomial_above_tokens=100, scorer_back_below=0.0)
    ruled, plain = md.Manager(polynomial_above_tokens=100, scorer_back_below=0.5), md.Manager()
    mass = np.full(300, 1.0 / 300, np.float32)
    for mgr in (ruled, plain):
        s = mgr.open(1, md.Config(page_size=P))
        s.append("user", 300)
        mgr.advance_to(1)  # past 100 tokens: the rule puts the batch on the polynomial kernel
        s.observe_tokens(mass)
    assert ruled.digest() != plain.digest()
    scores, reference = ruled.at(1).page_scores(), plain.at(1).page_scores()
    assert np.allclose(scores, reference, rtol=1e-5, atol=1e-6), "the two kernels agree within the tolerance"
