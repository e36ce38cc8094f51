"""The reader protocol: what every file format gives the data layer, and the table of formats.

A :class:`Reader` is one opened, validated file: its resolved schema, its rows as
:class:`~tierec.data.blocks.RowBlock` s from any data row on, one column's raw values
(keys, split columns), and its row count (for text, its lines: an upper bound when
some rows turn out malformed). Splits, shuffling, batching and resume are built on
top of it (:mod:`tierec.data.splits`, :mod:`tierec.data.source`), so a new format is
one module with an ``open`` function, named in :data:`FORMAT_READERS`.

>>> import tempfile, os
>>> from tierec.config import SchemaConfig
>>> from tierec.data.errors import ProblemReport
>>> path = os.path.join(tempfile.mkdtemp(), "r.dat")
>>> _ = open(path, "w").write("1::10::5::978300760\\n2::11::3::978300761\\n")
>>> cfg = SchemaConfig(label="r", label_threshold=4, categorical=["u", "i"], header=False, columns=["u", "i", "r", "t"], delimiter="::")
>>> r = open_reader(path, "csv", cfg)
>>> r.num_rows, [b.labels.tolist() for b in r.blocks(0, r.num_rows, r.new_report(), strict=False)]
(2, [[1.0, 0.0]])
>>> [a.to_pylist() for _, a in r.column("t")]
[[b'978300760', b'978300761']]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

import numpy as np
import pyarrow as pa

from tierec.config import SchemaConfig
from tierec.data.blocks import RowBlock
from tierec.data.errors import DataError, ProblemReport
from tierec.data.parquet import ParquetFile
from tierec.data.schema import Schema, resolve_schema
from tierec.data.text import TextFile


class Reader(Protocol):
    """One opened file of any format."""

    @property
    def display(self) -> str:
        """The path as the user wrote it, for messages."""
        ...

    @property
    def schema(self) -> Schema:
        """The resolved schema (without its label when the file has none and that was allowed)."""
        ...

    @property
    def names(self) -> tuple[str, ...]:
        """Every column of the file, in file order."""
        ...

    @property
    def num_rows(self) -> int:
        """Data rows (text files: lines, an upper bound when some rows are malformed)."""
        ...

    def new_report(self) -> ProblemReport:
        """An empty malformed-row report for one pass (text files count lines, Parquet rows)."""
        ...

    def blocks(self, first: int, stop: int, report: ProblemReport, strict: bool) -> Iterator[RowBlock]:
        """Well-formed rows of data rows ``first..stop-1`` (0-based), tagged with their data rows."""
        ...

    def column(self, name: str) -> Iterator[tuple[np.ndarray, pa.Array]]:
        """Every row's value of one column, in blocks: ``(data rows [m] int64, values [m])``; text gives bytes."""
        ...


Opener = Callable[[str | Path, Schema, bool], Reader]  # (path, schema, label_optional)

FORMAT_READERS: Mapping[str, Opener] = MappingProxyType(
    {"criteo": TextFile.open, "csv": TextFile.open, "tsv": TextFile.open, "parquet": ParquetFile.open}
)


def open_reader(path: str | Path, fmt: str, cfg: SchemaConfig, label_optional: bool = False, order_column: str = "") -> Reader:
    """Open ``path`` as format ``fmt`` with the schema ``cfg``; ``label_optional``: a file without the label reads
    unlabeled; ``order_column``: a column whose numbers each block carries as its ``order`` (a column split)."""
    if not Path(path).exists():  # before any schema complaint
        raise DataError(f"{path}: no such file")
    opener = FORMAT_READERS.get(fmt)
    if opener is None:
        raise DataError(f"{path}: format {fmt!r} is not a file format ({', '.join(FORMAT_READERS)})")
    schema = resolve_schema(cfg, fmt, label_optional)
    if order_column:
        schema = dataclasses.replace(schema, order_column=order_column)
    return opener(path, schema, label_optional)
