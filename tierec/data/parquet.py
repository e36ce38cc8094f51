"""Streaming reader for Parquet files described by a schema.

Columns are typed: numeric dense columns are cast by Arrow (null = 0), string,
integer and dictionary categorical columns are hashed (or parsed as hex), and
list columns are multi-valued. Only the needed columns are read, one record batch
at a time, starting at the row group that holds the first wanted row. Problems
are reported by 1-based row number.

>>> import tempfile, os, pyarrow as pa, pyarrow.parquet as pq
>>> from tierec.config import SchemaConfig
>>> from tierec.data.schema import resolve_schema
>>> from tierec.data.errors import ProblemReport
>>> path = os.path.join(tempfile.mkdtemp(), "t.parquet")
>>> pq.write_table(pa.table({"y": [0, 1, 1], "x": [0.5, 1.5, None], "c": ["a", "b", None]}), path)
>>> f = ParquetFile.open(path, resolve_schema(SchemaConfig(label="y", dense=["x"], categorical=["c"]), "parquet"))
>>> [b.dense[:, 0].tolist() for b in f.blocks(1, 3, ProblemReport(path, "row"), strict=False)]
[[1.5, 0.0]]
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tierec.data.blocks import RowBlock
from tierec.data.columns import BlockParser
from tierec.data.errors import DataError, ProblemReport, strict_error
from tierec.data.schema import Schema, require_unique_columns

BATCH_ROWS = 65536  # rows per Arrow record batch read


@dataclass(frozen=True)
class ParquetFile:
    """An opened, validated Parquet file."""

    path: Path
    display: str
    schema: Schema
    row_group_rows: tuple[int, ...]
    names: tuple[str, ...]  # all columns, in file order

    @property
    def num_rows(self) -> int:
        """Rows in the file."""
        return sum(self.row_group_rows)

    def new_report(self) -> ProblemReport:
        return ProblemReport(self.display, "row")

    def column(self, name: str) -> Iterator[tuple[np.ndarray, pa.Array]]:
        """One column, typed, with the 0-based row of each value."""
        meta = pq.ParquetFile(self.path)
        try:
            pos = 0
            for batch in meta.iter_batches(batch_size=BATCH_ROWS, columns=[name]):
                yield np.arange(pos, pos + batch.num_rows, dtype=np.int64), batch.column(0)
                pos += batch.num_rows
        finally:
            meta.close()

    @staticmethod
    def open(path: str | Path, schema: Schema, label_optional: bool = False) -> ParquetFile:
        """Open and validate; with ``label_optional`` a file without the label column is read unlabeled."""
        p = Path(path)
        display = str(path)
        if not p.is_file():
            raise DataError(f"{display}: no such file")
        if p.stat().st_size == 0:
            raise DataError(f"{display}: file is empty")
        try:
            meta = pq.ParquetFile(p)
        except (pa.ArrowInvalid, OSError) as e:
            raise DataError(f"{display}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
        names = meta.schema_arrow.names
        require_unique_columns(names, display, "its schema")
        if label_optional and schema.label not in names:
            schema = schema.without_label()
        absent = [c for c in schema.needed if c not in names]
        if absent:
            raise DataError(f"{display}: schema names column(s) {absent} that the file does not have; it has {names}")
        _check_types(meta.schema_arrow, schema, display)
        rows = tuple(meta.metadata.row_group(i).num_rows for i in range(meta.num_row_groups))
        if sum(rows) == 0:
            raise DataError(f"{display}: file has no rows")
        return ParquetFile(p, display, schema, rows, tuple(names))

    def blocks(self, first: int, stop: int, report: ProblemReport, strict: bool, batch_rows: int = BATCH_ROWS) -> Iterator[RowBlock]:
        """Well-formed rows ``first..stop-1`` (0-based)."""
        if stop <= first:
            return
        starts = np.concatenate([[0], np.cumsum(self.row_group_rows)])  # [n_groups + 1]
        g0 = int(np.searchsorted(starts, first, side="right")) - 1
        g1 = int(np.searchsorted(starts, stop, side="left"))
        parser = BlockParser(self.schema)
        pos = int(starts[g0])  # file row of the next batch's first row
        meta = pq.ParquetFile(self.path)
        try:
            for batch in meta.iter_batches(batch_size=batch_rows, row_groups=list(range(g0, g1)), columns=list(self.schema.needed)):
                batch_start = pos  # file row (0-based) of the record batch's first row
                pos += batch.num_rows
                a, b = max(first - batch_start, 0), min(stop - batch_start, batch.num_rows)
                if b <= a:
                    continue
                batch = batch.slice(a, b - a)
                block, err = parser.parse(batch)
                bad_rows = np.flatnonzero(err > 0)  # (err < 0: filtered out, not malformed)
                for r in bad_rows.tolist():
                    column = parser.codes[int(err[r]) - 1]
                    fatal = parser.is_fatal(batch, r, int(err[r]))
                    if not (strict or fatal or report.wants_examples):
                        report.count_more(1, column)
                        continue
                    message = parser.problem(batch, r, int(err[r]))
                    if strict or fatal:
                        raise strict_error(self.display, "row", batch_start + a + r + 1, message)
                    report.add(batch_start + a + r + 1, message, column)
                report.count_rows(batch.num_rows)
                block = block.with_rows(np.arange(batch_start + a, batch_start + b, dtype=np.int64))
                yield block.select(err == 0) if err.any() else block
        finally:
            meta.close()


def _scalar_kind(t: pa.DataType) -> str:
    """"number", "text", "other" for a column type (dictionaries by their values)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_decimal(t):
        return "number"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "text"
    if pa.types.is_temporal(t):
        return "time"
    return "other"


def _check_types(arrow: pa.Schema, schema: Schema, display: str) -> None:
    """A one-line error naming the first column whose Parquet type tierec cannot read in its role."""
    multi = set(schema.multi_valued)
    roles = [(schema.label, "label")] if schema.labeled else []
    roles += [(c, "dense") for c in schema.dense] + [(c, "categorical") for c in schema.categorical]
    for name, role in roles:
        t = arrow.field(name).type
        listy = pa.types.is_list(t) or pa.types.is_large_list(t)
        if role == "categorical" and name in multi and listy:
            ok = _scalar_kind(t.value_type) in {"number", "text"}
        elif role == "categorical":
            ok = _scalar_kind(t) in {"number", "text", "time"}
        else:
            ok = _scalar_kind(t) in {"number", "text"}
        if not ok:
            hint = "; name it in data.schema.multi_valued" if listy and role == "categorical" else ""
            raise DataError(f"{display}: column {name} has type {t}, which tierec cannot read as a {role} column{hint}")
