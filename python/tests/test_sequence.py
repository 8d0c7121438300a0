# SPDX-License-Identifier: Apache-2.0
"""The one evictor through Python: every policy, attention in without copies, errors that change nothing."""
import sys
import threading
import time

import numpy as np
import pytest

import memdecay as md
from conftest import attention, episode


@pytest.mark.parametrize("policy", md.POLICIES)
def test_every_policy_evicts_to_its_budget(policy, rng):
    cfg = md.Config(normalization="uniform", tau=2.0, budget=md.Budget.tokens(256), protection=md.Protection(recent_tokens=16))
    seq = md.Sequence(cfg, policy=policy)
    assert seq.policy == policy
    episode(seq, rng)
    assert seq.kv_len <= 256 + 16
    assert seq.evicted_tokens > 0
    assert seq.kv_len + seq.evicted_tokens == seq.logical_len
    statuses = seq.page_statuses()
    assert statuses[0] == "pinned", "the system prompt is pinned"


def test_policy_parameters_are_checked_by_name():
    md.Sequence(policy="h2o", recent_fraction=0.25, recent_tokens=8)
    md.Sequence(policy="snapkv", window=16, kernel_size=7, pooling="max")
    with pytest.raises(md.ConfigError, match="policy h2o has no parameter window"):
        md.Sequence(policy="h2o", window=3)
    with pytest.raises(md.ConfigError, match="policy = 'belady'"):
        md.Sequence(policy="belady")


def test_same_calls_same_victims_and_digest(rng):
    a, b = md.Sequence(md.Config(budget=md.Budget.tokens(200))), md.Sequence(md.Config(budget=md.Budget.tokens(200)))
    va = episode(a, np.random.default_rng(3))
    vb = episode(b, np.random.default_rng(3))
    assert va == vb and a.digest() == b.digest()


def test_attention_is_read_without_a_copy_and_float64_is_converted(rng):
    seq = md.Sequence(md.Config(normalization="uniform", tau=1.5))
    seq.append("user", 64)
    seq.advance_to(1)
    m32 = attention(rng, 64)
    seq.observe_tokens(m32)
    twin = md.Sequence(md.Config(normalization="uniform", tau=1.5))
    twin.append("user", 64)
    twin.advance_to(1)
    twin.observe_tokens(m32.astype(np.float64))
    assert np.allclose(seq.page_scores(), twin.page_scores())
    seq.advance_to(2)
    seq.observe_pages(np.full(4, 0.25, dtype=np.float32))
    seq.observe_heads(np.tile(m32, (4, 1)), how="mean")


class ArrayLike:
    """An object with __array__ (the protocol PyTorch tensors implement)."""

    def __init__(self, a):
        self.a = a

    def __array__(self, dtype=None):
        return self.a


class DLPackOnly:
    """A DLPack producer and nothing else (no __array__, no buffer): what numpy.from_dlpack reads."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_dlpack_producers_are_read_in_place(rng):
    m = attention(rng, 32)
    a, b = md.Sequence(), md.Sequence()
    for s in (a, b):
        s.append("user", 32)
        s.advance_to(1)
    assert a.observe_tokens(DLPackOnly(m)) == b.observe_tokens(m)
    assert a.digest() == b.digest()
    with pytest.raises(ValueError, match="mass: dtype int32"):
        a.observe_tokens(DLPackOnly(np.zeros(32, dtype=np.int32)))
    assert a.digest() == b.digest()


def test_array_protocol_objects_are_accepted(rng):
    seq = md.Sequence()
    seq.append("user", 32)
    seq.advance_to(1)
    seq.observe_tokens(ArrayLike(attention(rng, 32)))


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.zeros(63, dtype=np.float32), "63"),
        (np.full(64, np.nan, dtype=np.float32), "NaN|nan|finite"),
        (-np.ones(64, dtype=np.float32), "negative|-1"),
        (np.zeros((64, 2), dtype=np.float32)[:, 0], "C-contiguous"),
        (np.zeros(64, dtype=np.int32), "dtype int32"),
        (np.zeros((2, 32), dtype=np.float32), "dimensions"),
    ],
)
def test_bad_attention_is_an_error_that_changes_nothing(bad, message, rng):
    seq = md.Sequence(md.Config(normalization="uniform", tau=2.0))
    seq.append("user", 64)
    seq.advance_to(1)
    seq.observe_tokens(attention(rng, 64))
    before = seq.digest()
    with pytest.raises(ValueError, match=message):
        seq.observe_tokens(bad)
    assert seq.digest() == before


def test_usage_errors(rng):
    seq = md.Sequence(md.Config(budget=md.Budget.tokens(64)))
    seq.append("user", 200)
    seq.advance_to(5)
    with pytest.raises(md.InputError, match="clock goes backwards"):
        seq.advance_to(4)
    plan = seq.select(2)
    seq.commit(plan)
    before = seq.digest()
    with pytest.raises(md.UsageError, match="stale"):
        seq.commit(plan)
    assert seq.digest() == before
    with pytest.raises(md.InputError):
        seq.append(42, 1)
    with pytest.raises(md.InputError):
        seq.append("nonexistent", 1)


def test_explain_page_is_memdecays():
    seq = md.Sequence(md.Config(region_overrides=[md.RegionOverride("user", half_life=4.0)]))
    seq.append("user", 32)
    seq.advance_to(4)
    e = seq.explain_page(0)
    b = seq.regions["user"].base_priority
    assert e.decay == pytest.approx(b * 0.5, rel=1e-3), "one half-life after the tokens were written"
    assert e.score == pytest.approx(e.decay + e.attention) and e.status == "evictable"
    with pytest.raises(md.UsageError, match="does not explain"):
        md.Sequence(policy="tova").explain_page(0)


def test_copy_is_independent(rng):
    seq = md.Sequence()
    seq.append("user", 48)
    twin = seq.copy()
    seq.append("user", 16)
    assert twin.kv_len == 48 and seq.kv_len == 64


def strictly_inside(ticks, start, end):
    """Ticks in the middle 60% of [start, end]: before the call enters the library and after it returns, the other
    thread may take the GIL for one switch interval (0.1 ms here), never for the call's middle."""
    q = 0.2 * (end - start)
    assert end - start > 1e-3, "the call must take long enough to tell"
    return sum(1 for x in list(ticks) if start + q < x < end - q)


def test_the_gil_is_released_while_observing_and_selecting():
    """Another Python thread runs while one observe / select call is inside the library: some of its timestamps
    fall strictly inside the call. With the GIL held during the call, none can."""
    n = 1 << 23
    seq = md.Sequence(md.Config(normalization="uniform", tau=2.0))
    seq.append("user", n)
    mass = np.full(n, 1.0 / n, dtype=np.float32)
    ticks = []
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks.append(time.perf_counter())

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    t = threading.Thread(target=count)
    t.start()
    inside = {"observe": 0, "select": 0}
    try:
        for step in range(1, 4):
            seq.advance_to(step)
            start = time.perf_counter()
            seq.observe_tokens(mass)
            end = time.perf_counter()
            inside["observe"] += strictly_inside(ticks, start, end)
            start = time.perf_counter()
            seq.select(32)
            end = time.perf_counter()
            inside["select"] += strictly_inside(ticks, start, end)
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    assert inside["observe"] > 0 and inside["select"] > 0, inside


def test_no_python_memory_grows_over_many_calls(rng):
    """10^5 calls (observe, select, the page-score copy) leave Python's traced memory where it was."""
    import tracemalloc

    seq = md.Sequence(md.Config(normalization="uniform", tau=2.0))
    seq.append("user", 256)
    mass = attention(rng, 256)
    seq.advance_to(1)
    for _ in range(100):  # warm up caches and free lists
        seq.observe_tokens(mass)
        seq.select(4)
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    for i in range(2, 33335):
        seq.advance_to(i)
        seq.observe_tokens(mass)
        seq.select(4)
        seq.page_scores()
    after, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert after - before < 64 * 1024, f"{after - before} bytes still allocated after 10^5 calls"


@pytest.mark.parametrize("policy", md.POLICIES)
def test_a_snapshot_restores_the_state_and_the_decisions(policy, rng):
    cfg = md.Config(budget=md.Budget.tokens(96, 64), page_size=8)
    seq = md.Sequence(cfg, policy=policy)
    for step in range(1, 10):
        seq.append("tool_out" if step % 2 else "user", 24)
        seq.advance_to(step)
        seq.observe_tokens(attention(rng, seq.kv_len))
        seq.commit(seq.select_for_budget())
    snapshot = seq.save()
    assert isinstance(snapshot, bytes) and snapshot[:8] == b"MDSNAP\r\n"
    restored = md.Sequence(cfg, policy=policy)
    restored.load(snapshot)
    assert restored.digest() == seq.digest()
    for step in range(10, 14):
        mass = attention(rng, seq.kv_len + 16)
        for s in (seq, restored):
            s.append("scratchpad", 16)
            s.advance_to(step)
            s.observe_tokens(mass)
        a, b = seq.select_for_budget(), restored.select_for_budget()
        assert list(a.pages) == list(b.pages)
        seq.commit(a)
        restored.commit(b)
    assert restored.digest() == seq.digest()


def test_a_bad_snapshot_is_an_input_error_that_changes_nothing():
    seq = md.Sequence()
    seq.append("user", 40)
    snapshot = bytearray(seq.save())
    other = md.Sequence()
    other.append("plan", 3)
    digest = other.digest()
    snapshot[60] ^= 0x01
    with pytest.raises(md.InputError, match="checksum"):
        other.load(bytes(snapshot))
    with pytest.raises(md.InputError, match="policy"):
        md.Sequence(policy="h2o").load(seq.save())
    with pytest.raises(md.InputError, match="truncated"):
        other.load(seq.save()[:20])
    assert other.digest() == digest
