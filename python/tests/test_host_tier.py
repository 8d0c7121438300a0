# SPDX-License-Identifier: Apache-2.0
"""The host tier from Python: demotion plans that keep pages on the host, observations over the device, recall plans
from a query or from the engine's own bounds, the device BlockPool following, and errors that change nothing."""
import numpy as np
import pytest

import memdecay as md

P = 4


def tiered(pages=8, budget=4, **tier):
    seq = md.Sequence(md.Config(page_size=P, protection=md.Protection(recent_tokens=P, sink_pages=0),
                                budget=md.Budget.pages(budget)))
    seq.append("system", P)
    for step in range(1, pages + 1):
        seq.advance_to(step)
        seq.append("user", P)
    seq.enable_digests(kv_heads=1, head_dim=2)
    for p in range(seq.num_pages):
        seq.set_page_keys(p, np.tile(np.array([0.1 * p, 0.0], np.float32), (P, 1)))
    seq.enable_host_tier(**tier)
    return seq


def test_victims_go_to_host_and_observations_cover_the_device():
    seq = tiered()
    positions = seq.positions()
    plan = seq.select_for_budget()
    assert list(plan.demoted) == list(plan.pages) and len(plan.host_dropped) == 0
    seq.commit(plan)
    assert seq.host_pages == len(plan.pages) and seq.device_len == seq.kv_len - seq.host_pages * P
    assert np.array_equal(seq.positions(), positions)
    assert list(np.flatnonzero(seq.on_host())) == list(plan.pages)
    assert all(seq.page_statuses()[p] == "host" for p in plan.pages)
    with pytest.raises(md.InputError):
        seq.observe_tokens(np.full(seq.kv_len, 0.01, np.float32))
    seq.observe_tokens(np.full(seq.device_len, 0.01, np.float32))


def test_recall_with_a_block_pool_inserts_the_promoted_page_at_its_place():
    seq = tiered()
    pool = md.BlockPool(seq.num_pages, P)
    pool.open(0)
    pool.append_tokens(0, seq.kv_len)
    seq.commit(seq.select_for_budget(), pool, 0)
    host = list(np.flatnonzero(seq.on_host()))
    seq.set_page_keys(host[1], np.tile(np.array([0.0, 10.0], np.float32), (P, 1)))
    query = np.array([0.0, 1.0], np.float32)
    recall = seq.select_recall(query)
    assert list(recall.promote) == [host[1]] and recall.pages_moved >= 1
    bounds = seq.page_bounds(query).max(axis=0)
    assert list(seq.select_recall_for_bounds(bounds).promote) == [host[1]]
    done = seq.commit_recall(recall, pool, 0)
    assert pool.num_pages(0) == seq.device_pages and pool.consistent()
    assert pool.block_table(0)[seq.device_index(host[1])] == done["inserted"][0]
    assert seq.page_statuses()[host[1]] == "recalled"


def test_recall_by_the_mean_over_query_heads_follows_the_mean_bounds():
    seq = md.Sequence(md.Config(page_size=P, protection=md.Protection(recent_tokens=P, sink_pages=0),
                                budget=md.Budget.pages(4)))
    seq.append("system", P)
    for step in range(1, 9):
        seq.advance_to(step)
        seq.append("user", P)
    seq.enable_digests(kv_heads=1, head_dim=2, query_heads=2)
    for p in range(seq.num_pages):
        seq.set_page_keys(p, np.tile(np.array([np.sin(3.0 * p), np.cos(5.0 * p)], np.float32), (P, 1)))
    seq.enable_host_tier()
    seq.commit(seq.select_for_budget())
    query = np.array([1.0, 0.2, -0.3, 0.9], np.float32)  # two query heads
    per_head = seq.page_bounds(query)
    by_mean = seq.select_recall(query, heads="mean")
    assert list(by_mean.promote) == list(seq.select_recall_for_bounds(per_head.mean(axis=0)).promote)
    assert list(seq.select_recall(query, heads="max").promote) == list(seq.select_recall(query).promote)
    # heads="attention": the log of each page's mean over heads of the head's softmax over the (scaled) bounds.
    weights = np.exp(per_head.astype(np.float64) - per_head.max(axis=1, keepdims=True))
    mass = (weights / weights.sum(axis=1, keepdims=True)).mean(axis=0)
    by_attention = seq.select_recall(query, heads="attention")
    from_mass = seq.select_recall_for_bounds(np.log(mass).astype(np.float32))
    assert list(by_attention.promote) == list(from_mass.promote)
    assert list(by_attention.demote) + list(by_attention.drop) == list(from_mass.demote) + list(from_mass.drop)
    with pytest.raises(ValueError, match="heads"):
        seq.select_recall(query, heads="median")


def test_errors_change_nothing():
    seq = tiered()
    with pytest.raises(md.ConfigError, match="hysteresis"):
        seq.enable_host_tier(hysteresis=-1.0)
    seq.commit(seq.select_for_budget())
    recall = seq.select_recall(np.array([0.0, 1.0], np.float32))
    digest = seq.digest()
    seq.advance_to(seq.now + 1)
    with pytest.raises(md.UsageError, match="stale"):
        seq.commit_recall(recall)
    with pytest.raises(md.UsageError, match="on the host"):
        seq.disable_host_tier()
    with pytest.raises(md.InputError):
        seq.select_recall(np.array([1.0], np.float32))
    assert seq.host_pages > 0 and seq.digest() != digest  # only the clock moved


def test_a_manager_shares_one_host_pool_and_recalls_around_its_protections():
    mgr = md.Manager(page_size=P, host_pool=3)
    pool = md.BlockPool(64, P)
    for sid in (1, 2):
        seq = mgr.open(sid, md.Config(page_size=P, protection=md.Protection(recent_tokens=P, sink_pages=0),
                                      budget=md.Budget.pages(5)))
        pool.open(sid)
        seq.append("system", P)
        seq.append("retrieval", 6 * P)
        pool.append_tokens(sid, 7 * P)
        seq.enable_host_tier()
    plan = mgr.select_global()
    assert sum(len(p.demoted) for p in plan.plans.values()) == 3 and plan.pages_freed == 4, "the pool holds 3"
    mgr.commit(plan, pool, "identity")
    assert mgr.host_pages == 3 and mgr.resident_pages == 10
    for sid in (1, 2):
        assert pool.num_pages(sid) == mgr[sid].device_pages
    # The sequence with host pages wants them back; it is at its budget, so each promotion displaces a device
    # page. Its lowest-bound device page is protected for this step: the manager's plan spares it.
    sid = 1 if mgr[1].host_pages else 2
    seq = mgr[sid]
    bounds = np.where(seq.on_host(), 9.0, np.arange(seq.num_pages)).astype(np.float32)
    device = [p for p in range(seq.num_pages) if not seq.on_host()[p] and seq.page_statuses()[p] == "evictable"]
    mgr.protect_pages(sid, [device[0]])
    recall = mgr.select_recall_for_bounds(sid, bounds)
    assert len(recall.promote) > 0 and len(recall.demote) + len(recall.drop) == len(recall.promote)
    assert device[0] not in list(recall.demote) + list(recall.drop)
    own = seq.select_recall_for_bounds(bounds)  # the sequence's own plan knows nothing of the protection
    assert device[0] in list(own.demote) + list(own.drop)
    digest = mgr.digest()
    with pytest.raises(md.UsageError, match="protected for this step"):
        mgr.commit_recall(sid, own, pool)
    assert mgr.digest() == digest
    with pytest.raises(md.UsageError, match="owned by a manager"):
        seq.commit_recall(recall)
    done = mgr.commit_recall(sid, recall, pool)
    assert len(done["inserted"]) == len(recall.promote)
    assert pool.num_pages(sid) == seq.device_pages and pool.consistent()


def test_displace_lowest_lets_only_the_lowest_scoring_pages_make_room():
    seq = tiered(pages=8, budget=4, min_device_steps=0, displace_lowest=1)
    seq.commit(seq.select_for_budget())
    bounds = np.where(seq.on_host(), 9.0, np.arange(seq.num_pages)[::-1]).astype(np.float32)
    scores, status = seq.page_scores(), seq.page_statuses()
    evictable = sorted((p for p in range(seq.num_pages) if status[p] == "evictable"), key=lambda p: (scores[p], p))
    plan = seq.select_recall_for_bounds(bounds)
    assert list(plan.demote) + list(plan.drop) == [evictable[0]]


def test_keep_largest_query_channels_keeps_each_heads_largest_and_leaves_the_input_alone():
    query = np.array([[0.5, -3.0, 0.5, 2.0], [-1.0, 1.0, 1.0, -1.0]], np.float32)
    kept = md.keep_largest_query_channels(query, head_dim=4, channels=2)
    assert kept.shape == query.shape and kept.dtype == np.float32
    assert np.array_equal(kept, [[0.0, -3.0, 0.0, 2.0], [-1.0, 1.0, 0.0, 0.0]])  # ties to the lower channel
    assert query[0, 0] == 0.5  # a copy: the caller's query is unchanged
    flat = md.keep_largest_query_channels([1.0, -2.0, 3.0], 3, 5)  # channels >= head_dim: as it was
    assert np.array_equal(flat, [1.0, -2.0, 3.0])
    for args, field in [((query, 0, 1), "head_dim"), ((query, 4, 0), "channels"), ((query, 3, 1), "whole number"),
                        ((np.array([1.0, np.nan], np.float32), 2, 1), r"query\[1\]")]:
        with pytest.raises(md.InputError, match=field):
            md.keep_largest_query_channels(*args)


def test_a_recall_from_the_largest_channels_follows_the_bound_over_those_channels():
    # The query looks along channel 0 and barely along channel 1, where the device pages' keys spread widely: the
    # full bound prefers the device pages for that spread, the bound over channel 0 alone the host pages' match.
    seq = tiered()
    seq.commit(seq.select_for_budget())
    on_host = seq.on_host()
    for p in range(seq.num_pages):
        if on_host[p]:
            seq.set_page_keys(p, np.tile(np.array([1.0, 0.0], np.float32), (P, 1)))
        else:
            seq.set_page_keys(p, np.array([[0.9, 10.0], [0.9, -10.0]] * (P // 2), np.float32))
    query = np.array([1.0, 0.05], np.float32)
    assert len(seq.select_recall(query).promote) == 0  # 0.9 + 0.05 x 10 beats 1.0
    kept = md.keep_largest_query_channels(query, head_dim=2, channels=1)
    assert np.array_equal(kept, [1.0, 0.0])
    plan = seq.select_recall(kept)
    assert len(plan.promote) > 0 and all(on_host[p] for p in plan.promote)
    assert np.allclose(plan.promote_bounds, 1.0 / np.sqrt(2), atol=1e-6)
