"""Parsing and hashing kernels against plain-Python references."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tierec.data import kernels
from tierec.data.blocks import RowBlock, concat_slices, rebatch
from tierec.data.columns import string_buffers
from tierec.data.hashing import feature_hash_state, hash_text_id, missing_hash_id


@pytest.mark.parametrize(
    ("text", "value", "status"),
    [
        ("0", 0.0, kernels.OK), ("-17", -17.0, kernels.OK), ("+3", 3.0, kernels.OK), ("1.25", 1.25, kernels.OK),
        (".5", 0.5, kernels.OK), ("5.", 5.0, kernels.OK), ("1e3", 1000.0, kernels.OK), ("-2.5E-2", -0.025, kernels.OK),
        (" 7 ", 7.0, kernels.OK), ("123456789012345678901", 1.2345678901234568e20, kernels.OK),
        ("", 0.0, kernels.MISSING), ("NaN", 0.0, kernels.MISSING), ("abc", 0.0, kernels.BAD), ("1.2.3", 0.0, kernels.BAD),
        ("-", 0.0, kernels.BAD), ("1e", 0.0, kernels.BAD), ("0x10", 0.0, kernels.BAD), ("1e999", 0.0, kernels.BAD),
    ],
)  # fmt: skip
def test_parse_number(text: str, value: float, status: int) -> None:
    data = np.frombuffer(text.encode() or b"\0", np.uint8)
    v, st = kernels.parse_number(data, 0, len(text))
    assert st == status and v == pytest.approx(value, rel=1e-15)


@pytest.mark.parametrize(("text", "status"), [("0", 0), ("aBcD1234", 0), ("", 1), ("123456789", 2), ("12g4", 2)])
def test_parse_hex(text: str, status: int) -> None:
    data = np.frombuffer(text.encode() or b"\0", np.uint8)
    v, st = kernels.parse_hex(data, 0, len(text))
    assert st == status
    if status == 0:
        assert v == int(text, 16)


def test_hash_kernels_match_reference() -> None:
    words = ["", "a", "hello world", "ünïcode", "42", "-0"]
    offsets, data = string_buffers(pa.array(words))
    out = np.empty(len(words), np.int64)
    kernels.hash_column(offsets, data, feature_hash_state("col"), missing_hash_id("col"), out)
    assert out.tolist() == [hash_text_id("col", w) for w in words]
    assert (out >= 0).all()
    ints = np.array([0, 7, -7, 1234567890123, np.iinfo(np.int64).min, np.iinfo(np.int64).max])
    out = np.empty(len(ints), np.int64)
    kernels.hash_int_column(ints, np.ones(len(ints), bool), feature_hash_state("col"), missing_hash_id("col"), out)
    assert out.tolist() == [hash_text_id("col", str(int(i))) for i in ints]


def test_hash_ids_are_stable_across_runs() -> None:
    """Pinned values: changing them silently would invalidate every saved model and shard."""
    assert hash_text_id("C1", "abc") == 4993612250514019745  # mix64(fnv1a64(b"C1\0abc")) & (2**63 - 1)
    assert missing_hash_id("C1") == 37953501029317833  # mix64(fnv1a64(b"C1\xff")) & (2**63 - 1)


def test_synthetic_rows_are_stable_across_runs() -> None:
    from tierec.config import SyntheticConfig
    from tierec.data import SyntheticData

    block, logits = SyntheticData(SyntheticConfig()).block("train", 0, 2)
    assert block.values[:2].tolist() == [2349494817, 1976030050]  # C1 of rows 0 and 1
    assert block.values[-2:].tolist() == [218203729738, 217043336181]  # C26
    assert block.dense[0, :2].tolist() == pytest.approx([4.9871745109558105, 0.024738503620028496], rel=1e-6)
    assert logits.tolist() == pytest.approx([0.4142511785030365, -1.6347994804382324], abs=1e-4)


def test_rebatch_and_select_on_jagged_blocks() -> None:
    def block(start: int, n: int) -> RowBlock:
        lengths = [(start + i) % 3 for i in range(n)]
        vals = [[start + i] * k for i, k in enumerate(lengths)]
        values = np.array([v for row in vals for v in row], np.int64)
        return RowBlock.from_features(
            np.arange(start, start + n, dtype=np.float32), np.zeros((n, 1), np.float32),
            [(values, np.array(lengths)), (np.arange(start, start + n), None)],
        )  # fmt: skip

    whole = block(0, 10)
    parts = list(rebatch([block(0, 4), block(4, 6)], batch_size=3, skip_rows=1))
    assert [p.size for p in parts] == [3, 3, 3]
    joined = concat_slices([(p, 0, p.size) for p in parts])
    ref = concat_slices([(whole, 1, 10)])
    for name in ("labels", "values", "offsets"):
        assert np.array_equal(getattr(joined, name), getattr(ref, name))
    kept = whole.select(np.arange(10) % 2 == 0)
    values, lengths = kept.feature(0)
    assert lengths.tolist() == [0, 2, 1, 0, 2] and values.tolist() == [2, 2, 4, 8, 8]
    assert kept.feature(1)[0].tolist() == [0, 2, 4, 6, 8]
