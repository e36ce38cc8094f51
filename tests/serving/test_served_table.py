"""ServedTable.lookup against a plain reference: a dict from id to its decoded row, zeros for any other id.

Tables of 0 to 100 rows (the compiled fp32 search's edge cases: empty, one row, sizes that are not powers
of two), ids held, below the first, above the last and between, at every precision, memory-mapped and in RAM.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tierec.serving.manifest import TableEntry
from tierec.serving.rows import RowChunk, decode, encode
from tierec.serving.table_file import TableFileWriter, TableShape
from tierec.serving.tables import ServedTable


def _table(tmp_path: Path, n: int, dim: int, precision: str, mmap: bool, rng) -> tuple[ServedTable, np.ndarray, dict]:
    ids = np.sort(rng.choice(np.arange(-50, 10_000, 3), n, replace=False)).astype(np.int64)  # ascending, gaps between
    chunk = encode(RowChunk(ids, np.full(n, dim, np.int64), rng.standard_normal(n * dim).astype(np.float32)), precision)
    shape = TableShape(table="t", dim=dim, layout="whole", precision=precision, rows=n, values=n * dim)
    writer = TableFileWriter(tmp_path / "t.safetensors", shape)
    writer.append(chunk)
    writer.close()
    rows = decode(chunk.values, chunk.scale, chunk.bias, chunk.lens).reshape(n, dim)  # what each id reads
    table = ServedTable.open(tmp_path, TableEntry(name="t", file="t.safetensors", dim=dim, layout="whole", rows=n), mmap=mmap)
    return table, ids, {int(i): r for i, r in zip(ids, rows)}


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
@pytest.mark.parametrize("mmap", [True, False])
def test_lookup_is_the_row_of_each_id_and_zeros_for_others(tmp_path: Path, precision: str, mmap: bool) -> None:
    rng = np.random.default_rng(7)
    for n in (0, 1, 2, 3, 5, 8, 100):
        for dim in (1, 4):
            d = tmp_path / f"{n}-{dim}"
            d.mkdir()
            table, ids, rows = _table(d, n, dim, precision, mmap, rng)
            assert table.compiled == (precision == "fp32")
            unknown = np.array([-100, 10_500, *(ids[:3] + 1)], np.int64)  # below, above, between (ids step by 3)
            query = rng.permutation(np.concatenate([ids, ids[: n // 2], unknown]))
            expected = np.stack([rows.get(int(i), np.zeros(dim, np.float32)) for i in query])
            got = table.lookup(query)
            assert got.dtype == np.float32 and got.shape == (query.size, dim)
            assert np.array_equal(got, expected), (n, dim)
            assert table.lookup(np.empty(0, np.int64)).shape == (0, dim)
