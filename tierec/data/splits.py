"""The splits of a file, and where a split's rows come from.

A split of a file (train, validation, test, all) is a :class:`FileRows` over a
:class:`~tierec.data.reader.Reader`: a tail split takes a range of data rows, a
hash split filters every row by :class:`~tierec.data.order.HashSplit`, a column
split by :class:`~tierec.data.column_split.ColumnSplit` (the largest values of a
column, e.g. a timestamp, are the test rows). Synthetic data and shards have
their splits built in (:class:`SyntheticRows`, :class:`ShardRows`).

>>> import tempfile, os
>>> from tierec.config import DataConfig, SchemaConfig
>>> from tierec.data.reader import open_reader
>>> path = os.path.join(tempfile.mkdtemp(), "t.csv")
>>> _ = open(path, "w").write("y,u\\n" + "".join(f"{i % 2},u{i}\\n" for i in range(10)))
>>> cfg = DataConfig(source=path, schema=SchemaConfig(label="y", categorical=["u"]), test_rows=3)
>>> rows, meta = file_split(open_reader(path, "csv", cfg.schema), cfg, "test")
>>> meta.num_rows, [b.rows.tolist() for b in rows.blocks(0, 100, rows.new_report())]
(3, [[7, 8, 9]])
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tierec.config import DataConfig
from tierec.data.blocks import RowBlock, skip_rows
from tierec.data.column_split import ColumnSplit, column_cutoffs
from tierec.data.errors import DataError, NoSplitError, ProblemReport
from tierec.data.order import HashSplit, chunk_ranges
from tierec.data.reader import Reader
from tierec.data.shards import ShardSet
from tierec.data.synthetic import SyntheticData


@dataclass(frozen=True)
class SourceMeta:
    feature_names: tuple[str, ...]
    dense_names: tuple[str, ...]
    multi_hot: tuple[str, ...]
    num_rows: int | None  # a column split of a large file: an estimate
    problems: ProblemReport  # before any pass: empty, or what the shards recorded
    labeled: bool = True  # False: a file without its label column (labels read as 0)


class Rows(Protocol):
    """Where a split's rows come from: blocks from an exact row onwards."""

    def blocks(self, start_row: int, block_rows: int, report: ProblemReport | None) -> Iterator[RowBlock]:
        """Blocks from row ``start_row`` on; ``block_rows`` is a size hint (the batch size)."""
        ...

    def new_report(self) -> ProblemReport | None:
        """A fresh report for a pass (None: nothing is parsed, keep the recorded one)."""
        ...

    def chunks(self, rng: np.random.Generator, chunk_rows: int, report: ProblemReport | None) -> Iterator[RowBlock]:
        """All rows, chunk by chunk (file ranges, shard record batches) in the order ``rng`` draws."""
        ...


Keep = HashSplit | ColumnSplit  # which of a block's rows a filtered split keeps


class FileRows:
    """Data rows ``first..stop-1`` of a file, optionally filtered by ``keep``."""

    def __init__(self, reader: Reader, first: int, stop: int, strict: bool, keep: Keep | None = None) -> None:
        self.reader, self.first, self.stop, self.strict, self.keep = reader, first, stop, strict, keep

    def new_report(self) -> ProblemReport | None:
        return self.reader.new_report()

    def blocks(self, start_row: int, block_rows: int, report: ProblemReport | None) -> Iterator[RowBlock]:
        assert report is not None
        blocks = self._kept(self.reader.blocks(self.first, self.stop, report, self.strict))
        return skip_rows(blocks, start_row) if start_row else blocks

    def chunks(self, rng: np.random.Generator, chunk_rows: int, report: ProblemReport | None) -> Iterator[RowBlock]:
        assert report is not None
        for a, b in chunk_ranges(self.first, self.stop, chunk_rows, rng):
            yield from self._kept(self.reader.blocks(a, b, report, self.strict))

    def _kept(self, blocks: Iterator[RowBlock]) -> Iterator[RowBlock]:
        if self.keep is None:
            yield from blocks
            return
        for blk in blocks:
            yield blk.select(self.keep.keep(blk))


class ChainRows:
    """Several row sources one after the other (the "all" split)."""

    def __init__(self, parts: list[tuple[Rows, int]]) -> None:
        self.parts = parts
        self.num_rows = sum(n for _, n in parts)

    def new_report(self) -> ProblemReport | None:
        return None

    def blocks(self, start_row: int, block_rows: int, report: ProblemReport | None) -> Iterator[RowBlock]:
        for rows, n in self.parts:
            if start_row >= n:
                start_row -= n
                continue
            yield from rows.blocks(start_row, block_rows, report)
            start_row = 0

    def chunks(self, rng: np.random.Generator, chunk_rows: int, report: ProblemReport | None) -> Iterator[RowBlock]:
        for rows, _ in self.parts:
            yield from rows.chunks(rng, chunk_rows, report)


class SyntheticRows:
    def __init__(self, data: SyntheticData, split: str) -> None:
        self.data, self.split = data, split

    def new_report(self) -> ProblemReport | None:
        return None

    def blocks(self, start_row: int, block_rows: int, report: ProblemReport | None) -> Iterator[RowBlock]:
        return self.data.blocks(self.split, start_row, block_rows)  # generated at the batch size: no re-cutting

    def chunks(self, rng: np.random.Generator, chunk_rows: int, report: ProblemReport | None) -> Iterator[RowBlock]:
        return self.data.ranges(self.split, chunk_ranges(0, self.data.num_rows(self.split), chunk_rows, rng))


class ShardRows:
    def __init__(self, shards: ShardSet, split: str) -> None:
        self.shards, self.split = shards, split

    def new_report(self) -> ProblemReport | None:
        return None

    def blocks(self, start_row: int, block_rows: int, report: ProblemReport | None) -> Iterator[RowBlock]:
        return self.shards.blocks(self.split, start_row)

    def chunks(self, rng: np.random.Generator, chunk_rows: int, report: ProblemReport | None) -> Iterator[RowBlock]:
        return self.shards.batches_in_order(self.split, rng)


def file_meta(reader: Reader, num_rows: int) -> SourceMeta:
    s = reader.schema
    return SourceMeta(s.categorical, s.dense, s.multi_valued, num_rows, reader.new_report(), s.labeled)


def split_sizes(cfg: DataConfig, n: int, display: str) -> tuple[int, int]:
    """(test rows, validation rows) of a file of ``n`` rows; a DataError when they leave no training rows."""
    n_test = 0 if cfg.test_source else cfg.test_rows if cfg.test_rows > 0 else int(round(cfg.test_fraction * n))
    n_val = cfg.validation_rows if cfg.validation_rows > 0 else int(round(cfg.validation_fraction * n))
    if n_test + n_val >= n:
        raise DataError(f"{display}: the test and validation splits ({n_test} + {n_val} rows) leave no training rows out of {n}")
    return n_test, n_val


def file_split(reader: Reader, cfg: DataConfig, split: str, cutoffs: tuple[float, float, dict[str, int]] | None = None) -> tuple[Rows, SourceMeta]:
    """Split ``split`` of an opened file; ``cutoffs`` (a column split): :func:`column_cutoffs`, computed once by the caller."""
    n = reader.num_rows
    if split == "all":
        return FileRows(reader, 0, n, cfg.strict), file_meta(reader, n)
    n_test, n_val = split_sizes(cfg, n, reader.display)
    if split == "test" and n_test == 0 and not cfg.test_source:
        raise NoSplitError(f"{reader.display}: no test split (data.test_rows and data.test_fraction are 0; or set data.test_source)")
    if split == "validation" and n_val == 0:
        raise NoSplitError(f"{reader.display}: no validation split (data.validation_rows and data.validation_fraction are 0)")
    if cfg.split == "hash":
        bounds = {"test": (0.0, n_test / n), "validation": (n_test / n, (n_test + n_val) / n), "train": ((n_test + n_val) / n, 1.0)}
        hashed = HashSplit(*bounds[split], feature=split_feature(cfg, reader))
        return FileRows(reader, 0, n, cfg.strict, hashed), file_meta(reader, hashed.count_rows(n))
    if cfg.split == "column":
        t_val, t_test, counts = cutoffs if cutoffs is not None else column_cutoffs(reader, cfg.split_column, n_test / n, n_val / n)
        lo, hi = {"train": (-np.inf, t_val), "validation": (t_val, t_test), "test": (t_test, np.inf)}[split]
        return FileRows(reader, 0, n, cfg.strict, ColumnSplit(lo, hi)), file_meta(reader, counts[split])
    first, stop = {"train": (0, n - n_test - n_val), "validation": (n - n_test - n_val, n - n_test), "test": (n - n_test, n)}[split]
    return FileRows(reader, first, stop, cfg.strict), file_meta(reader, stop - first)


def split_feature(cfg: DataConfig, reader: Reader) -> int:
    """The categorical feature a hash split keys on (-1: the row number)."""
    schema = reader.schema
    if not cfg.split_key:
        return -1
    if cfg.split_key not in schema.categorical or cfg.split_key in schema.multi_valued:
        raise DataError(f"data.split_key {cfg.split_key!r} must be a single-valued categorical column of the schema: {list(schema.categorical)}")
    return schema.categorical.index(cfg.split_key)
