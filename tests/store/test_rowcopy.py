"""The tiers' row copies (tierec/store/rowcopy.py) against numpy's fancy indexing."""

import numpy as np
import pytest

from tierec.store.rowcopy import gather_rows, put_rows, scatter_rows, take_rows


@pytest.mark.parametrize("width", [1, 7, 18])
def test_gather_and_scatter_are_numpys(width):
    rng = np.random.default_rng(width)
    src = rng.standard_normal((5_000, width)).astype(np.float32)
    rows = rng.integers(0, 5_000, 3_000)  # repeats included: a gather may read a row twice
    assert np.array_equal(gather_rows(src, rows), src[rows])
    assert np.array_equal(gather_rows(src, rows.astype(np.int32)), src[rows])
    assert gather_rows(src, rows[:0]).shape == (0, width)

    dst, ref = src.copy(), src.copy()
    distinct = rng.permutation(5_000)[:2_000]
    rec = rng.standard_normal((2_000, 2 * width)).astype(np.float32)[:, ::2]  # not contiguous
    scatter_rows(dst, distinct, rec)
    ref[distinct] = rec
    assert np.array_equal(dst, ref)


def test_column_offsets_fill_a_record():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((100, 3)).astype(np.float32), rng.standard_normal((100, 2)).astype(np.float32)
    rows = np.array([5, 99, 0, 5], dtype=np.int64)
    out = np.zeros((4, 5), dtype=np.float32)
    take_rows(a, rows, out, 0)
    take_rows(b, rows, out, 3)
    assert np.array_equal(out, np.concatenate([a[rows], b[rows]], axis=1))
    a2, b2 = np.zeros_like(a), np.zeros_like(b)
    put_rows(a2, rows[:3], out, 0)
    put_rows(b2, rows[:3], out, 3)
    assert np.array_equal(a2[rows[:3]], a[rows[:3]]) and np.array_equal(b2[rows[:3]], b[rows[:3]])
    assert not a2[1:5].any()  # rows not named stay as they were


def test_host_slots_come_sorted_whatever_was_freed():
    from tierec.store.host import HostTier

    rng = np.random.default_rng(1)
    h = HostTier(width=2, max_rows=1_000)
    held = list(h.alloc(600))
    for _ in range(50):
        rng.shuffle(held)
        k = int(rng.integers(1, 200))
        h.free(np.array(held[:k]))
        if rng.random() < 0.5:  # a second batch freed on top: the stack's top is no longer one run
            h.free(np.array(held[k : 2 * k]))
            k *= 2
        held = held[k:]
        got = h.alloc(int(rng.integers(1, 300)))
        assert np.array_equal(got, np.sort(got)) and len(set(got) & set(held)) == 0
        held += list(got)
