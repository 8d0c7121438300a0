# SPDX-License-Identifier: Apache-2.0
"""Page tables: the adapters edit the caller's NumPy arrays in place; every removal returns a PageRemoval."""
import numpy as np
import pytest

import memdecay as md

P = 16


def full_sequence(pages, region="user"):
    seq = md.Sequence(md.Config(page_size=P))
    seq.append(region, pages * P)
    seq.advance_to(10)
    return seq


def test_block_pool_commit_frees_blocks():
    pool = md.BlockPool(16, P)
    pool.open(7)
    pool.append_tokens(7, 4 * P)
    seq = full_sequence(4)
    plan = seq.select(2)
    before = pool.block_table(7).tolist()
    removal = seq.commit(plan, pool, 7)
    assert removal.removed == [before[p] for p in plan.pages]
    assert removal.freed == removal.removed
    assert removal.slots == [(b * P, (b + 1) * P) for b in sorted(removal.removed)] or len(removal.slots) == 1
    assert pool.num_pages(7) == seq.num_pages and pool.consistent()


def test_vllm_row_is_edited_in_place():
    block_ids = np.array([[3, 4, 5, 6, 0, 0], [9, 10, 0, 0, 0, 0]], dtype=np.int32)
    counts = np.array([4, 2], dtype=np.int32)
    view = md.VllmBlockTable(block_ids, counts, P, 64)
    seq = full_sequence(4)
    plan = seq.select(2)
    removal = seq.commit(plan, view, 0)
    assert removal.freed is None, "the scheduler's block pool owns the reference counts"
    assert counts[0] == 2, "the caller's count array changed"
    kept = [b for i, b in enumerate([3, 4, 5, 6]) if i not in plan.pages.tolist()]
    assert block_ids[0, :2].tolist() == kept, "the caller's block table changed"
    assert block_ids[1, :2].tolist() == [9, 10]


def test_flashinfer_csr_is_edited_in_place():
    indptr = np.array([0, 4, 6], dtype=np.int32)
    indices = np.array([40, 41, 42, 43, 50, 51, -1], dtype=np.int32)
    last = np.array([16, 5], dtype=np.int32)
    csr = md.FlashInferCsr(indptr, indices, last, P, 64)
    seq = full_sequence(4)
    removal = seq.commit(seq.select(1), csr, 0)
    assert len(removal.removed) == 1
    assert indptr.tolist() == [0, 3, 5]
    assert indices[6] == -1


def test_sglang_rows_are_edited_in_place():
    req_to_token = np.arange(2 * 64, dtype=np.int32).reshape(2, 64)
    lens = np.array([64, 32], dtype=np.int64)
    view = md.SglangReqToToken(req_to_token, lens, P, 1024)
    seq = full_sequence(4)
    removal = seq.commit(seq.select(1), view, 0)
    assert lens[0] == 48
    assert sum(e - b for b, e in removal.slots) == P


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: md.VllmBlockTable(np.zeros((2, 4), dtype=np.int64), np.zeros(2, dtype=np.int32), P, 8), "block_ids: dtype int64"),
        (lambda: md.VllmBlockTable(np.zeros((2, 4), dtype=np.int32)[:, ::2], np.zeros(2, dtype=np.int32), P, 8), "block_ids: not C-contiguous"),
        (lambda: md.VllmBlockTable([[0, 1]], np.zeros(1, dtype=np.int32), P, 8), "block_ids: expected a numpy.ndarray"),
        (lambda: md.VllmBlockTable(np.zeros((2, 4), dtype=np.int32), np.zeros(3, dtype=np.int32), P, 8), "num_blocks_per_row: 3 rows"),
        (lambda: md.FlashInferCsr(np.zeros(2, dtype=np.int32), np.zeros(3, dtype=np.int32), np.ones(1, dtype=np.int32), P, 8), None),
    ],
)
def test_wrong_arrays_are_value_errors_naming_the_argument(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_read_only_arrays_are_refused():
    ids = np.zeros((1, 4), dtype=np.int32)
    ids.setflags(write=False)
    with pytest.raises(ValueError, match="block_ids: read-only"):
        md.VllmBlockTable(ids, np.zeros(1, dtype=np.int32), P, 8)


def test_a_rejected_removal_writes_nothing():
    indptr = np.array([0, 2], dtype=np.int32)
    indices = np.array([1, 2], dtype=np.int32)
    last = np.array([3], dtype=np.int32)
    csr = md.FlashInferCsr(indptr, indices, last, P, 8)
    with pytest.raises(md.UsageError, match="partial last page"):
        csr.remove_pages(0, [1])
    with pytest.raises(md.UsageError):
        csr.remove_pages(0, [0, 1])
    assert indptr.tolist() == [0, 2] and indices.tolist() == [1, 2]
    indices[1] = 99  # the engine broke its arrays
    with pytest.raises(md.InputError, match="not a page of the pool"):
        csr.remove_pages(0, [0])
    assert indices.tolist() == [1, 99]
