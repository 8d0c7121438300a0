# SPDX-License-Identifier: Apache-2.0
"""Page digests and the attention-free signal from Python: the same decisions as the C++ API, errors that change
nothing, digests that leave with their pages."""
import numpy as np
import pytest

import memdecay as md


def sequence(tokens=64, page_size=16, **digests):
    seq = md.Sequence(md.Config(page_size=page_size, protection=md.Protection(recent_tokens=0, sink_pages=0)))
    seq.enable_digests(**({"kv_heads": 2, "head_dim": 8, "query_heads": 4} | digests))
    seq.append("tool_out", tokens)
    return seq


def test_bounds_are_quests_upper_bound_of_every_logit(rng):
    seq = sequence()
    keys = rng.normal(size=(seq.num_pages, 16, 2, 8)).astype(np.float32)
    for p in range(seq.num_pages):
        seq.set_page_keys(p, keys[p])
    query = rng.normal(size=(4, 8)).astype(np.float32)
    bounds = seq.page_bounds(query)
    assert bounds.shape == (4, seq.num_pages)
    # query head j reads KV head j // 2 (grouped-query attention); the scale is 1/sqrt(head_dim)
    logits = np.einsum("jc,ptjc->jpt", query, np.repeat(keys, 2, axis=2)) / np.sqrt(8)
    assert np.all(logits.max(axis=2) <= bounds + 1e-5)
    lo, hi = keys.min(axis=1), keys.max(axis=1)  # pages x heads x dim
    want = np.maximum(query[None, :, :] * np.repeat(lo, 2, axis=1), query[None, :, :] * np.repeat(hi, 2, axis=1))
    np.testing.assert_allclose(bounds, want.sum(axis=2).T / np.sqrt(8), rtol=1e-5, atol=1e-5)


def test_observe_query_is_observe_pages_of_its_estimate(rng):
    a, b = sequence(storage="f16"), md.Sequence(md.Config(page_size=16, protection=md.Protection(recent_tokens=0, sink_pages=0)))
    b.append("tool_out", 64)
    for p in range(a.num_pages):
        a.set_page_digest(p, *np.sort(rng.normal(size=(2, 16)).astype(np.float32), axis=0))
    query = rng.normal(size=32).astype(np.float32)
    estimate = a.estimate_query_attention(query, signal="bound_softmax_tokens", total=2.0)
    assert estimate.sum() == pytest.approx(2.0, rel=1e-5)
    a.observe_query(query, signal="bound_softmax_tokens", total=2.0)
    b.observe_pages(estimate)
    np.testing.assert_array_equal(a.page_scores(), b.page_scores())


def test_bad_digests_and_queries_change_nothing(rng):
    seq = sequence()
    seq.set_page_keys(0, rng.normal(size=(16, 16)).astype(np.float32))
    before = seq.digest()
    with pytest.raises(md.InputError, match="digest lo has 15 values"):
        seq.set_page_digest(1, np.zeros(15), np.ones(16))
    with pytest.raises(md.InputError, match="exceeds hi"):
        seq.set_page_digest(1, np.ones(16), np.zeros(16))
    with pytest.raises(md.InputError, match=r"query\[3\]"):
        seq.observe_query(np.array([0, 0, 0, np.nan] + [0] * 28, dtype=np.float32))
    with pytest.raises(md.InputError, match="page 9 does not exist"):
        seq.set_page_keys(9, np.zeros(16))
    with pytest.raises(ValueError, match="signal"):
        seq.observe_query(np.zeros(32), signal="softmax")
    with pytest.raises(md.ConfigError, match="query_heads"):
        seq.enable_digests(kv_heads=2, head_dim=8, query_heads=3)
    assert seq.digest() == before and seq.has_digests
    with pytest.raises(md.UsageError, match="enable_digests"):
        md.Sequence().observe_query(np.zeros(4))


def test_digests_leave_with_their_pages_and_grow_with_the_sequence(rng):
    seq = sequence(tokens=40)  # pages 0, 1 full, page 2 holds 8 tokens
    for p in range(3):
        seq.set_page_keys(p, rng.normal(size=(16 if p < 2 else 8, 16)).astype(np.float32))
    assert seq.pages_with_digest() == 3
    seq.append("tool_out", 1)  # page 2 grew: its digest is forgotten
    assert seq.pages_with_digest() == 2
    assert seq.digest_bytes_per_page == 2 * 2 * 8 * 4 + 1
    seq.commit(seq.select(1))
    assert seq.num_pages == 2 and seq.pages_with_digest() == 1


def test_snapshots_carry_the_digests(rng):
    seq = sequence(storage="bf16")
    for p in range(seq.num_pages):
        seq.set_page_keys(p, rng.normal(size=(16, 16)).astype(np.float32))
    query = rng.normal(size=32).astype(np.float32)
    copy = md.Sequence(md.Config(page_size=16, protection=md.Protection(recent_tokens=0, sink_pages=0)))
    copy.load(seq.save())
    assert copy.has_digests and copy.pages_with_digest() == seq.num_pages
    assert copy.digest() == seq.digest()
    np.testing.assert_array_equal(copy.page_bounds(query), seq.page_bounds(query))


def test_threads_split_the_pages_and_change_no_bound_and_no_decision(rng):
    # 1,300 pages: more than two tasks of 512 pages, so threads=2 and 3 really split them.
    config = md.Config(page_size=4, protection=md.Protection(recent_tokens=4, sink_pages=0),
                       budget=md.Budget.pages(1000))

    def long_tiered(seq=None):
        seq = seq if seq is not None else md.Sequence(config)
        seq.append("system", 4)
        for step in range(1, 1300):
            seq.advance_to(step)
            seq.append("user" if step % 3 else "tool_out", 4)
        seq.enable_digests(kv_heads=2, head_dim=8, query_heads=4, storage="bf16")
        keys = np.random.default_rng(7).normal(size=(seq.num_pages, 4, 2, 8)).astype(np.float32)
        for p in range(seq.num_pages):
            seq.set_page_keys(p, keys[p])
        seq.enable_host_tier(hysteresis=0.01)
        return seq

    def committed(seq):
        seq.commit(seq.select_for_budget())
        return seq

    one, pooled = committed(long_tiered()), committed(long_tiered())
    assert one.host_pages > 0
    query = rng.normal(size=(4, 8)).astype(np.float32)
    bounds = one.page_bounds(query)
    for threads in (2, 3):
        np.testing.assert_array_equal(pooled.page_bounds(query, threads=threads), bounds)
    np.testing.assert_array_equal(pooled.estimate_query_attention(query, threads=2),
                                  one.estimate_query_attention(query))
    assert pooled.observe_query(query, threads=2) == one.observe_query(query)
    want, got = one.select_recall(query), pooled.select_recall(query, threads=2)
    for field in ("promote", "promote_bounds", "demote", "drop"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
    assert pooled.digest() == one.digest()
    # The manager's recall (its protections around the sequence's plan) on a pool too.
    mgr = md.Manager(page_size=4)
    long_tiered(mgr.open(1, config))
    mgr.commit(mgr.select_global())
    want, got = mgr.select_recall(1, query), mgr.select_recall(1, query, threads=2)
    for field in ("promote", "promote_bounds", "demote", "drop"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
