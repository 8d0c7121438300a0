# SPDX-License-Identifier: Apache-2.0
"""Sequence.observe_rows: attention as the engine wrote it (float32, float16, bf16 bits; rows x tokens with any row
stride) is read in place and observed exactly as observe_tokens of the row-order float32 sum; bad rows name the
row and token and change nothing."""
import numpy as np
import pytest

import memdecay as md


def sequence(tokens=700):
    seq = md.Sequence(md.Config(page_size=16, normalization="uniform"))
    seq.append("system", 16)
    rng = np.random.default_rng(0)
    while seq.kv_len < tokens:
        seq.append(int(rng.integers(1, 7)), int(min(rng.integers(1, 90), tokens - seq.kv_len)))
    seq.advance_to(3)
    return seq


def row_order_sum(rows_f32, how):
    acc = rows_f32[0].astype(np.float32).copy()
    for r in rows_f32[1:]:
        acc = (acc + r.astype(np.float32)).astype(np.float32)
    if how == "mean":
        acc = (acc * np.float32(1.0 / len(rows_f32))).astype(np.float32)
    return acc


def bf16_bits(x):
    """float32 -> bf16 bits, round to nearest even (what torch.bfloat16 stores)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.parametrize("fmt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("how", ["sum", "mean"])
def test_rows_in_place_equal_observe_tokens_of_the_row_order_sum(fmt, how):
    a, b = sequence(), sequence()
    rng = np.random.default_rng(1)
    n = a.kv_len
    padded = rng.random((8, n + 24), dtype=np.float32) / n  # a leading dimension of n + 24
    rows = padded[:, :n]
    if fmt == "f32":
        given, widened = rows, rows
    elif fmt == "f16":
        given = rows.astype(np.float16)
        widened = given.astype(np.float32)
    else:
        bits = bf16_bits(padded)[:, :n]
        given = bits.view(np.int16)
        widened = (bits.astype(np.uint32) << 16).view(np.float32)
    assert a.observe_rows(given, how=how, format="" if fmt != "bf16" else "bf16") == \
        b.observe_tokens(row_order_sum(widened, how))
    assert a.digest() == b.digest()
    np.testing.assert_array_equal(a.page_scores(), b.page_scores())


def test_one_row_and_torch_tensors():
    a, b = sequence(), sequence()
    mass = (np.random.default_rng(2).random(a.kv_len, dtype=np.float32) / a.kv_len).astype(np.float16)
    assert a.observe_rows(mass) == b.observe_tokens(mass.astype(np.float32))
    assert a.digest() == b.digest()
    torch = pytest.importorskip("torch")
    c, d = sequence(), sequence()
    t = torch.rand(4, c.kv_len, dtype=torch.bfloat16) / c.kv_len
    c.observe_rows(t.view(torch.int16), format="bf16")
    d.observe_tokens(row_order_sum(t.float().numpy(), "sum"))
    assert c.digest() == d.digest()


def test_bad_rows_are_named_and_change_nothing():
    seq = sequence()
    before = seq.digest()
    rows = np.full((4, seq.kv_len), 1e-3, np.float16)
    rows[2, 99] = np.nan
    with pytest.raises(md.InputError, match="row 2, token 99"):
        seq.observe_rows(rows)
    rows[2, 99] = -1e-3
    rows[3, 99] = 1.0
    with pytest.raises(md.InputError, match="row 2, token 99"):
        seq.observe_rows(rows)
    with pytest.raises(md.InputError, match="tokens, expected"):
        seq.observe_rows(np.zeros((2, seq.kv_len - 1), np.float32))
    with pytest.raises(ValueError, match="format"):
        seq.observe_rows(np.zeros(seq.kv_len, np.int16))  # 16-bit integers need format='f16' or 'bf16'
    with pytest.raises(ValueError, match="not contiguous"):
        seq.observe_rows(np.zeros((seq.kv_len, 2), np.float32).T)
    assert seq.digest() == before
