"""One entry point for every data source: :func:`open_source`.

``data.source`` is ``"synthetic"``, a file (``.txt`` Criteo TSV, ``.tsv``,
``.csv``, ``.parquet``) or a directory of shards written by ``tierec preprocess``;
``data.format = "auto"`` infers which from that. A file's test split is its last
``data.test_rows`` rows (else its last ``data.test_fraction``), unless
``data.test_source`` names a separate test file; split ``"all"`` is every row
(synthetic data and shards: the train rows, then the test rows). Batches are exactly
``batch_size`` rows except perhaps the last; ``start_batch`` resumes a pass
exactly where batch ``start_batch`` begins (cheap for synthetic data and shards;
raw files are parsed up to that point because malformed rows shift batches).

>>> from tierec.config import DataConfig, SyntheticConfig
>>> src = open_source(DataConfig(synthetic=SyntheticConfig(test_rows=1000)), "test", batch_size=256)
>>> src.feature_names[:2], src.n_dense, src.num_rows, src.num_batches
(('C1', 'C2'), 13, 1000, 4)
>>> [b.size for b in src]
[256, 256, 256, 232]
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tierec.batch import Batch
from tierec.config import DataConfig
from tierec.data.blocks import RowBlock, rebatch, skip_rows, to_batch
from tierec.data.errors import DataError, NoSplitError, ProblemReport
from tierec.data.parquet import ParquetFile
from tierec.data.schema import Schema, resolve_schema
from tierec.data.shards import ShardSet
from tierec.data.synthetic import SyntheticData
from tierec.data.text import TextFile

SPLITS = ("train", "test", "all")  # all: every row (a file unsplit; synthetic and shards: train then test)
_SUFFIX_FORMATS = {".txt": "criteo", ".tsv": "tsv", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip", ".lz4")


class _Rows(Protocol):
    """Where a source's rows come from: blocks from an exact row onwards."""

    def blocks(self, start_row: int, block_rows: int, report: ProblemReport | None) -> Iterator[RowBlock]:
        """Blocks from row ``start_row`` on; ``block_rows`` is a size hint (the batch size)."""
        ...

    def new_report(self) -> ProblemReport | None:
        """A fresh report for a pass (None: nothing is parsed, keep the recorded one)."""
        ...


class BatchSource:
    """The batches of one split of a source; each ``iter()`` is a new pass.

    ``num_rows`` counts the split's rows; for raw text files it counts lines, so
    it is an upper bound when some rows turn out malformed. ``num_batches`` is
    the batches of a full pass (from batch 0); iteration yields batches
    ``start_batch .. num_batches - 1``. ``problems`` is the malformed-row report of
    the latest pass (for shards, the one recorded when they were written).
    """

    def __init__(self, rows: _Rows, meta: SourceMeta, batch_size: int, start_batch: int, drop_last: bool) -> None:
        self._rows = rows
        self._meta = meta
        self.batch_size = batch_size
        self.start_batch = start_batch
        self.drop_last = drop_last
        self.problems: ProblemReport = meta.problems

    @property
    def feature_names(self) -> tuple[str, ...]:
        return self._meta.feature_names

    @property
    def dense_names(self) -> tuple[str, ...]:
        return self._meta.dense_names

    @property
    def n_dense(self) -> int:
        return len(self._meta.dense_names)

    @property
    def multi_hot(self) -> tuple[str, ...]:
        """Features whose bags may hold zero or several ids (the others hold exactly one)."""
        return self._meta.multi_hot

    @property
    def num_rows(self) -> int | None:
        return self._meta.num_rows

    @property
    def labeled(self) -> bool:
        return self._meta.labeled

    @property
    def num_batches(self) -> int | None:
        if self._meta.num_rows is None:
            return None
        full, rest = divmod(self._meta.num_rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def __iter__(self) -> Iterator[Batch]:
        for block in self.row_blocks():
            yield to_batch(block, self.feature_names)

    def row_blocks(self) -> Iterator[RowBlock]:
        """The batches as numpy :class:`RowBlock` s (what the shard writer consumes)."""
        report = self._rows.new_report()
        if report is not None:
            self.problems = report
        start = self.start_batch * self.batch_size
        rows_seen = 0
        finished = False
        try:
            for block in rebatch(self._rows.blocks(start, self.batch_size, report), self.batch_size, drop_last=self.drop_last):
                rows_seen += block.size
                yield block
            finished = True
        finally:
            if report is not None:
                if finished and rows_seen == 0 and report.malformed and start == 0:
                    raise DataError(f"{report.summary()}; no well-formed rows at all (wrong format or delimiter?)")
                if finished:
                    report.check_columns()
                report.warn()


@dataclass(frozen=True)
class SourceMeta:
    feature_names: tuple[str, ...]
    dense_names: tuple[str, ...]
    multi_hot: tuple[str, ...]
    num_rows: int | None
    problems: ProblemReport  # before any pass: empty, or what the shards recorded
    labeled: bool = True  # False: a file without its label column (labels read as 0)


def open_source(
    cfg: DataConfig, split: str, batch_size: int, *, start_batch: int = 0, drop_last: bool = False, label_optional: bool = False
) -> BatchSource:
    """The ``split`` ("train", "test" or "all") of ``cfg.source`` as batches of ``batch_size``.

    ``label_optional`` (scoring new data): a file whose header lacks the label column, or
    whose lines have one field fewer than the schema's columns, is read without labels
    (``labeled`` is False and the labels read as 0).
    """
    if split not in SPLITS:
        raise DataError(f"split must be one of {list(SPLITS)}, got {split!r}")
    if batch_size <= 0:
        raise DataError(f"batch_size must be positive, got {batch_size}")
    if start_batch < 0:
        raise DataError(f"start_batch must be >= 0, got {start_batch}")
    if split == "test" and cfg.test_source:
        rows, meta = _whole_file_or_source(cfg, cfg.test_source)
    else:
        rows, meta = _split_of(cfg, split, label_optional)
    return BatchSource(rows, meta, batch_size, start_batch, drop_last)


def infer_format(source: str, fmt: str = "auto") -> str:
    """The format of a source: synthetic | criteo | csv | tsv | parquet | shards."""
    if fmt != "auto":
        return fmt
    if source == "synthetic":
        return "synthetic"
    p = Path(source)
    if p.is_dir():
        return "shards"
    suffix = p.suffix.lower()
    if suffix in _COMPRESSED:
        raise DataError(f"{source}: compressed files are not supported; decompress it first")
    if suffix in _SUFFIX_FORMATS:
        return _SUFFIX_FORMATS[suffix]
    if not p.exists():
        raise DataError(f"{source}: no such file or directory")
    raise DataError(f"{source}: cannot infer the format from the name; set data.format (criteo, csv, tsv, parquet)")


def _split_of(cfg: DataConfig, split: str, label_optional: bool = False) -> tuple[_Rows, SourceMeta]:
    fmt = infer_format(cfg.source, cfg.format)
    if fmt == "synthetic":
        data = SyntheticData(cfg.synthetic)
        multi = data.feature_names if cfg.synthetic.ids_per_feature > 1 else ()
        parts = ("train", "test") if split == "all" else (split,)
        rows = _ChainRows([(_SyntheticRows(data, p), data.num_rows(p)) for p in parts])
        return rows, SourceMeta(data.feature_names, data.dense_names, multi, rows.num_rows, ProblemReport("synthetic"))
    if fmt == "shards":
        shards = ShardSet.open(cfg.source)
        parts = tuple(p for p in ("train", "test") if p in shards.manifest.splits) if split == "all" else (split,)
        rows = _ChainRows([(_ShardRows(shards, p), shards.num_rows(p)) for p in parts])
        problems = ProblemReport.merged(str(cfg.source), [shards.problems(p) for p in parts])
        return rows, SourceMeta(shards.feature_names, shards.dense_names, shards.multi_hot, rows.num_rows, problems)
    file = _open_file(cfg.source, fmt, cfg, label_optional)
    n = file.data_lines
    if split == "all":
        first, stop = 0, n
    elif cfg.test_source:
        first, stop = (0, n) if split == "train" else (n, n)
    else:
        n_test = cfg.test_rows if cfg.test_rows > 0 else int(round(cfg.test_fraction * n))
        if n_test >= n:
            raise DataError(f"{cfg.source}: the test split ({n_test} rows) leaves no training rows out of {n}")
        first, stop = (0, n - n_test) if split == "train" else (n - n_test, n)
        if split == "test" and n_test == 0:
            raise NoSplitError(f"{cfg.source}: no test split (data.test_rows and data.test_fraction are 0; or set data.test_source)")
    return _FileRows(file, first, stop, cfg.strict), _file_meta(file, stop - first)


def _whole_file_or_source(cfg: DataConfig, path: str) -> tuple[_Rows, SourceMeta]:
    fmt = infer_format(path, cfg.format)
    if fmt == "synthetic":
        raise DataError("data.test_source cannot be 'synthetic'; synthetic data has its own test split")
    if fmt == "shards":
        shards = ShardSet.open(path)
        rows = _ShardRows(shards, "test")
        return rows, SourceMeta(
            shards.feature_names, shards.dense_names, shards.multi_hot, shards.num_rows("test"), shards.problems("test")
        )
    file = _open_file(path, fmt, cfg)
    return _FileRows(file, 0, file.data_lines, cfg.strict), _file_meta(file, file.data_lines)


def _open_file(path: str, fmt: str, cfg: DataConfig, label_optional: bool = False) -> TextFile | ParquetFile:
    if not Path(path).exists():  # before any schema complaint
        raise DataError(f"{path}: no such file")
    schema = resolve_schema(cfg.schema, fmt)
    if fmt == "parquet":
        return ParquetFile.open(path, schema, label_optional)
    return TextFile.open(path, schema, label_optional)


def _file_meta(file: TextFile | ParquetFile, num_rows: int) -> SourceMeta:
    s = file.schema
    return SourceMeta(s.categorical, s.dense, s.multi_valued, num_rows, _new_report(file), s.labeled)


def _new_report(file: TextFile | ParquetFile) -> ProblemReport:
    return ProblemReport(file.display, "row" if isinstance(file, ParquetFile) else "line")


class _SyntheticRows:
    def __init__(self, data: SyntheticData, split: str) -> None:
        self.data, self.split = data, split

    def new_report(self) -> ProblemReport | None:
        return None

    def blocks(self, start_row: int, block_rows: int, report: ProblemReport | None) -> Iterator[RowBlock]:
        return self.data.blocks(self.split, start_row, block_rows)  # generated at the batch size: no re-cutting


class _FileRows:
    def __init__(self, file: TextFile | ParquetFile, first: int, stop: int, strict: bool) -> None:
        self.file, self.first, self.stop, self.strict = file, first, stop, strict

    def new_report(self) -> ProblemReport | None:
        return _new_report(self.file)

    def blocks(self, start_row: int, block_rows: int, report: ProblemReport | None) -> Iterator[RowBlock]:
        assert report is not None
        blocks = self.file.blocks(self.first, self.stop, report, self.strict)
        return skip_rows(blocks, start_row) if start_row else blocks


class _ChainRows:
    """Several row sources one after the other (the "all" split)."""

    def __init__(self, parts: list[tuple[_Rows, int]]) -> None:
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


class _ShardRows:
    def __init__(self, shards: ShardSet, split: str) -> None:
        self.shards, self.split = shards, split

    def new_report(self) -> ProblemReport | None:
        return None

    def blocks(self, start_row: int, block_rows: int, report: ProblemReport | None) -> Iterator[RowBlock]:
        return self.shards.blocks(self.split, start_row)
