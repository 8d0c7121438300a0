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
