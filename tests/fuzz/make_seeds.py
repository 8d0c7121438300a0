#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the hand-made seeds of tests/fuzz/corpus/api (the input format is decoded by api_fuzzer.cpp).

Each seed is a plausible engine session, so that libFuzzer starts from inputs that reach deep states (budgets
that bind, evictions committed through the pool, stale plans) instead of discovering the format byte by byte.
Usage: tests/fuzz/make_seeds.py [DIR]   (default: tests/fuzz/corpus/api next to this script)
"""
import os
import sys

FLOAT_DYNAMIC, DOUBLE_16 = 0, 3


def header(kind=FLOAT_DYNAMIC, alpha=2, beta=2, tau=4, page=6, uniform=1, unit=1, high=6, sink=None, recent=None,
           pool=3, pin_plan=False):
    """A valid config (the fuzzer's 'no invalid values' path): indices into api_fuzzer.cpp's tables."""
    b = [kind, 1, alpha, beta, 1, tau]
    if kind == FLOAT_DYNAMIC:
        b.append(page)
    b.append(uniform)
    b += [0, sink] if sink is not None else [1]
    b += [1, recent] if recent is not None else [0]
    b += [unit, high, 1] if unit else [0]  # budget unit, high index, no explicit low (unlimited: the unit only)
    b.append(1)               # the default region table
    b += [0, 0, 0, 1 | 2] if pin_plan else [1]  # one override: pin "plan" (targets[0])
    b.append(pool)            # pool size index: 3 = 4096 blocks
    return b


def span(region, count):
    return [region, 0, count & 0xFF, count >> 8, 1] if count >= 40 else [region, 1, count, 1]


def append(*spans):
    out = [0, len(spans) - 1]
    for r, c in spans:
        out += span(r, c)
    return out


def advance(delta):
    return [3, 4, delta - 1]


def backwards():
    return [3, 0, 2]


def observe_uniformish(scale_byte=32):
    return [5, 3, 0, 16, scale_byte]  # every token: scale_byte/32 / n


def observe_bad(value_case):
    return [5, 3, 0, value_case]  # 2 NaN, 3 inf, 5 -1, 8 max


def observe_pages(value_byte=64):
    return [7, 3, 0, 16, value_byte]


def budget_commit(path=1):
    return [9, 1, 1, path]  # no caller protection; commit (through the pool when path % 3 != 0)


def select(k_index, protect=None):
    if protect is None:
        return [11, k_index, 1]
    return [11, k_index, 0, len(protect)] + protect


def commit(forge, path_index):
    return [12, 1, forge, path_index]  # latest plan, forgery kind, commit path


def pool_op(seq_id, what, *args):
    return [14, seq_id - 1, what] + list(args)


def queries():
    return [15, 0, 0]


# The host tier (opcode 0xEF, then a sub-op byte; api_fuzzer.cpp's op_tier, tests/fuzz/README.md).
TIER = 0xEF


def enable_tier(unit=2, high=4, priority=3, hysteresis=0, steps=1, recall=3):
    """enable_host_tier with valid rules: unit 2 = pages (high index 4: 4 pages), min_host_priority index 3 (0.5:
    tool_out and scratchpad pages are dropped), hysteresis index 0 (0), min_device_steps index 1 (1 step),
    max_recall_pages index 3 (unlimited)."""
    return [TIER, 0, 1, unit] + ([high] if unit else []) + [priority, hysteresis, steps, recall]


def enable_tier_bad_hysteresis():
    return [TIER, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 3, 1, 1]  # allow_bad; hysteresis -0.5: a config_error


def disable_tier():
    return [TIER, 1]


def digest_pages(values, enable=True, observe=None):
    """Digests each full page without a digest from one token of keys (1 KV head x head size 2, f32 min/max
    digests: enabled first when `enable`); `values` holds one byte pair per page (a key is int8 / 8). Then observes
    the query `observe` (two int8 / 16 values) if given."""
    out = [TIER, 4] + ([0, 1, 0, 1, 0] if enable else [1])  # enabled already: 1 keeps the layout
    for a, b in values:
        out += [1, 0, a, b]
    out += [0, 2] + list(observe) + [1] if observe else [1]
    return out


def demote(store_slots=None, forge=0, fault=None, through_store=True, page=1):
    """select_for_budget + commit through the device table and (`through_store`) the host store, `forge`d
    (4: demotes a page it keeps, 5: drops a device page from the host, 6: no host drops, 7: demotes every victim)."""
    out = [TIER, 5] + ([store_slots] if store_slots is not None else []) + [1, forge] + ([page] if forge in (4, 5) else [])
    out += [0, fault] if fault is not None else [1]
    return out + [1 if through_store else 0]


def recall(query, path=1, fault=None, store_slots=None):
    """select_recall(query) then commit_recall: path 1 through the device table, 4 also through the host store (with
    the store's copy `fault` failing), 6 without a table, 7 check_recall alone, 0 not at all. Without digests a query
    has 4 values."""
    how = path | (0x10 if fault is None else fault << 6)
    return [TIER, 2, how, 2] + list(query) + [1, 1] + ([store_slots] if store_slots is not None else [])


def forged_recall(forge, path=0, page=0, keep_stale=False):
    """A remembered recall plan, forged (2 promotes held page `page`, 3 displaces it, 4 promotes a page that does not
    exist, 5 misaligns the bounds, 6 demotes and drops it, 7 demotes every evictable page, 8 reverses, 9 doubles the
    page size; 0 as it was), committed by path 0 table, 1 table + store, 2 no table, 3 check_recall."""
    out = [TIER, 7, 1, 1, forge]
    if forge in (2, 4):
        out.append(page)
    if forge in (3, 6):
        out += [0, page] if forge == 3 else [page]
    if forge >= 2:
        out.append(0 if keep_stale else 1)
    return out + [path]


def tier_bad_call(which, *args):
    """0 held-length observe_tokens, 1 held-page observe_pages, 2 residency / device_index(page), 3 host_tier() and
    select_recall_for_bounds."""
    return [TIER, 6, which] + list(args)


SEEDS = {
    "episode_tokens_budget": header() + append((0, 16), (2, 32), (4, 60), (6, 16)) + advance(40) +
    observe_uniformish() + budget_commit() + append((4, 70)) + advance(10) + budget_commit() + queries(),
    "episode_pages_budget_double": header(kind=DOUBLE_16, unit=2, high=3) + append((0, 16), (5, 64)) +
    advance(30) + observe_pages() + budget_commit() + append((6, 33)) + budget_commit(0),
    "ratio_budget_with_protection": header(unit=3, high=2, sink=1, recent=2) + append((1, 20), (3, 50), (4, 50)) +
    advance(5) + budget_commit() + advance(5) + budget_commit(),
    "impossible_budget_all_pinned": header(unit=1, high=0, pin_plan=True) + append((0, 40), (1, 40)) +
    budget_commit() + select(7),
    "stale_and_forged_plans": header(unit=0) + append((2, 64), (4, 64)) + select(3) + advance(3) +
    commit(0, 0) + select(2) + commit(6, 0) + commit(7, 0) + commit(8, 0) + commit(3, 3) + commit(3, 5),
    "bad_inputs": header() + append((2, 20)) + [0, 0, 0xF3, 1, 3, 1] + observe_bad(2) + observe_bad(3) +
    observe_bad(5) + observe_bad(8) + advance(9) + backwards() + [5, 0, 0, 13] + queries(),
    "pool_only_sequences": header() + pool_op(1, 0) + pool_op(1, 2, 3) + pool_op(1, 2, 9) + pool_op(1, 2, 8) +
    pool_op(1, 4, 2, 3, 1) + pool_op(2, 1) + pool_op(1, 5, 7) + pool_op(1, 1),
    "small_pages": header(page=0, unit=1, high=4) + append((2, 9), (6, 9)) + advance(20) + budget_commit() +
    append((4, 5)) + budget_commit(),
    "block_pool_bad_page_size": [0xFF, 3],
    # A host tier of 4 pages under a device budget of 4 pages: the budget demotes the retrieval pages (worth the
    # host), drops the scratchpad pages (not worth it), then a query whose bounds favour the host pages swaps them
    # with the device's user pages through the device table; observations cover the device only.
    "tier_demote_and_recall": header(unit=2, high=4) + append((2, 64), (5, 64), (6, 32)) + enable_tier() +
    digest_pages([(8, 8)] * 4 + [(80, 80)] * 4 + [(4, 4)] * 2) + advance(5) + budget_commit() +
    advance(2) + observe_uniformish() + observe_pages() + recall((16, 16)) + advance(3) + recall((16, 16), path=6) +
    tier_bad_call(0) + tier_bad_call(1) + tier_bad_call(2, 3) + digest_pages([], enable=False, observe=(16, 16)) +
    budget_commit(),
    # The same through a 64-slot host store, with the pool nearly full (a swap: the removal makes the room), a
    # recall whose store copy fails (undone: every block keeps its page's K/V) and one that succeeds.
    "tier_store_swap_and_faults": header(unit=2, high=4, pool=1) + append((2, 64), (5, 64), (6, 32)) +
    enable_tier() + digest_pages([(8, 8)] * 4 + [(80, 80)] * 4 + [(4, 4)] * 2) + advance(5) +
    demote(store_slots=0, fault=1) + demote() + pool_op(1, 0) + pool_op(1, 2, 5) + pool_op(1, 2, 5) + pool_op(1, 2, 5) + advance(2) +
    recall((16, 16), path=4, fault=1) + recall((16, 16), path=4) + advance(2) + pool_op(1, 1) +
    append((5, 64)) + digest_pages([(80, 80)] * 4, enable=False) + demote() + recall((16, 16), path=4),
    # Errors, each changing nothing: recall without a tier, a bad tier config, recall without digests, a bad query,
    # disable_host_tier with pages on the host, held-length observations, device_index of a host page, forged
    # eviction plans (a demotion of a kept page, a host drop of a device page) and forged or stale recall plans.
    "tier_errors": header(unit=2, high=4) + append((0, 16), (2, 48), (5, 64), (6, 32)) + recall((16, 16, 0, 0)) +
    enable_tier_bad_hysteresis() + enable_tier() + recall((16, 16, 0, 0)) + digest_pages([(8, 8)] * 4 + [(80, 80)] * 4 +
    [(4, 4)] * 2) + advance(5) + demote(store_slots=2, forge=4) + demote(forge=5) + demote(through_store=False) +
    disable_tier() + tier_bad_call(0) + tier_bad_call(2, 5) + tier_bad_call(3, 1, 1) + [TIER, 2, 1, 0, 1, 2, 3, 1, 1] +
    recall((16, 16), path=0) + forged_recall(2, page=1) + forged_recall(3, page=0) + forged_recall(4) +
    forged_recall(5) + forged_recall(6, page=2) + forged_recall(7) + forged_recall(9) + forged_recall(8) +
    forged_recall(0, path=3) + advance(1) + forged_recall(0, path=2) + forged_recall(0, path=1),
}

# Inputs that found bugs (docs/reliability.md, "Found by fuzzing"), written as regression_<what>.
REGRESSIONS = {
    # alpha = 1e39 (alphas[7]) with float scores: accepted, every page scored NaN. Now a config_error.
    "float_overflow_alpha": header(alpha=7) + append((2, 64)) + advance(10) + budget_commit() + select(7),
    # tokens(1e300) (highs[12]): the watermark cast gave 0, so the budget evicted everything. Now it never binds.
    "huge_budget": header(unit=1, high=12) + append((2, 64), (4, 64)) + advance(10) + budget_commit(),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "api")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, "seed_" + name), "wb") as f:
            f.write(bytes(b & 0xFF for b in data))
    for name, data in REGRESSIONS.items():
        with open(os.path.join(out, "regression_" + name), "wb") as f:
            f.write(bytes(b & 0xFF for b in data))
    print(f"wrote {len(SEEDS)} seeds and {len(REGRESSIONS)} regression inputs to {out}")


if __name__ == "__main__":
    main()
