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

import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tierec.batch import Batch
from tierec.config import DataConfig
from tierec.data.blocks import RowBlock, rebatch, skip_rows, to_batch
from tierec.data.column_split import column_cutoffs
from tierec.data.errors import DataError, NoSplitError, ProblemReport
from tierec.data.implicit import ImplicitFeedback, check_label
from tierec.data.order import Shuffle, shuffle_buffer
from tierec.data.reader import Reader, open_reader
from tierec.data.shards import ShardSet
from tierec.data.splits import ChainRows, FileRows, Rows, ShardRows, SourceMeta, SyntheticRows, file_meta, file_split, split_sizes
from tierec.data.synthetic import SyntheticData

SPLITS = ("train", "validation", "test", "all")  # all: every row (a file unsplit; synthetic and shards: train then test)
_SUFFIX_FORMATS = {".txt": "criteo", ".tsv": "tsv", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip", ".lz4")
GROUPED_MIN_VALUES = 20  # a tail split warns when a column's first rows hold at least this many values, each in one run
_GROUPED_SAMPLE_ROWS = 65536


class SplitWarning(UserWarning):
    """A split that is likely to mislead (a tail split of a file sorted by a key column)."""


class BatchSource:
    """The batches of one split of a source; each ``iter()`` is a new pass.

    ``num_rows`` counts the split's rows; for raw text files it counts lines, so
    it is an upper bound when some rows turn out malformed. ``num_batches`` is
    the batches of a full pass (from batch 0); iteration yields batches
    ``start_batch .. num_batches - 1``. ``problems`` is the malformed-row report of
    the latest pass (for shards, the one recorded when they were written).
    """

    def __init__(
        self, rows: Rows, meta: SourceMeta, batch_size: int, start_batch: int, drop_last: bool, shuffle: Shuffle | None = None
    ) -> None:
        self._rows = rows
        self._meta = meta
        self.shuffle = shuffle
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
            if self.shuffle is None:
                stream = self._rows.blocks(start, self.batch_size, report)
            else:  # the epoch's whole order is regenerated, then the rows already seen are skipped
                rng = self.shuffle.rng()
                mixed = shuffle_buffer(self._rows.chunks(rng, self.shuffle.chunk_rows, report), self.shuffle.buffer_rows, rng)
                stream = skip_rows(mixed, start) if start else mixed
            for block in rebatch(stream, self.batch_size, drop_last=self.drop_last):
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


class Dataset:
    """One source, opened once (its file scanned, a column split's cutoffs found): every split's batches.

    >>> from tierec.config import DataConfig, SyntheticConfig
    >>> data = open_dataset(DataConfig(synthetic=SyntheticConfig(train_rows=1000, test_rows=100)))
    >>> data.source("train", 256).num_batches, data.source("test", 64).num_rows
    (4, 100)
    """

    def __init__(self, cfg: DataConfig, label_optional: bool = False) -> None:
        self.cfg = cfg
        self.label_optional = label_optional
        self.format = infer_format(cfg.source, cfg.format)
        self._reader: Reader | None = None  # opened on first use, then kept
        self._test_reader: Reader | None = None
        self._cutoffs: tuple[float, float, dict[str, int]] | None = None
        self._checked_order = False
        self._sampling = cfg.negatives > 0 and not label_optional  # scoring reads a file's rows as they are
        self._implicit: ImplicitFeedback | None = None

    def source(
        self, split: str, batch_size: int, *, start_batch: int = 0, drop_last: bool = False, shuffle: Shuffle | None = None,
        epoch: int = 0,
    ) -> BatchSource:
        """The ``split`` ("train", "validation", "test" or "all") as batches of ``batch_size``.

        ``shuffle`` (training) reads the rows in that epoch's order (:mod:`tierec.data.order`); with
        ``data.negatives``, ``epoch`` picks the training negatives (:mod:`tierec.data.negatives`).
        """
        if split not in SPLITS:
            raise DataError(f"split must be one of {list(SPLITS)}, got {split!r}")
        if batch_size <= 0:
            raise DataError(f"batch_size must be positive, got {batch_size}")
        if start_batch < 0:
            raise DataError(f"start_batch must be >= 0, got {start_batch}")
        if self._sampling and self.format in ("synthetic", "shards"):
            raise DataError(f"data.negatives samples negatives from a file's rows; {self.cfg.source} is {self.format} data")
        rows, meta = self._test_file() if split == "test" and self.cfg.test_source else self._split(split)
        if self._sampling and split != "all":
            rows, meta = self._negatives().rows(split, rows, meta, epoch, lambda: self._split("train")[0])
        if self.format == "synthetic":
            shuffle = None  # synthetic rows are independent draws already
        return BatchSource(rows, meta, batch_size, start_batch, drop_last, shuffle)

    def reader(self) -> Reader:
        """The opened file (a DataError for synthetic data and shards)."""
        if self.format in ("synthetic", "shards"):
            raise DataError(f"{self.cfg.source} is {self.format} data, not a file")
        if self._reader is None:
            order = self.cfg.split_column if self.cfg.split == "column" else ""
            reader = open_reader(self.cfg.source, self.format, self.cfg.schema, self.label_optional or self._sampling, order_column=order)
            if self._sampling:
                check_label(self.cfg, reader)
            self._reader = reader
        return self._reader

    def _negatives(self) -> ImplicitFeedback:
        if self._implicit is None:
            self._implicit = ImplicitFeedback(self.cfg, self.reader().schema)
        return self._implicit

    def _split(self, split: str) -> tuple[Rows, SourceMeta]:
        cfg = self.cfg
        if self.format == "synthetic":
            data = SyntheticData(cfg.synthetic)
            multi = data.feature_names if cfg.synthetic.ids_per_feature > 1 else ()
            parts = ("train", "test") if split == "all" else (split,)
            if split == "validation" and not data.num_rows("validation"):
                raise NoSplitError("synthetic data has no validation split (data.synthetic.validation_rows is 0)")
            chain = ChainRows([(SyntheticRows(data, p), data.num_rows(p)) for p in parts])
            return chain, SourceMeta(data.feature_names, data.dense_names, multi, chain.num_rows, ProblemReport("synthetic"))
        if self.format == "shards":
            shards = ShardSet.open(cfg.source)
            parts = tuple(p for p in ("train", "validation", "test") if p in shards.manifest.splits) if split == "all" else (split,)
            chain = ChainRows([(ShardRows(shards, p), shards.num_rows(p)) for p in parts])
            problems = ProblemReport.merged(str(cfg.source), [shards.problems(p) for p in parts])
            return chain, SourceMeta(shards.feature_names, shards.dense_names, shards.multi_hot, chain.num_rows, problems)
        reader = self.reader()
        if split != "all" and cfg.split == "column" and self._cutoffs is None:
            n_test, n_val = split_sizes(cfg, reader.num_rows, reader.display)
            self._cutoffs = column_cutoffs(reader, cfg.split_column, n_test / reader.num_rows, n_val / reader.num_rows)
        out = file_split(reader, cfg, split, self._cutoffs)
        if split != "all" and cfg.split == "tail" and not self._checked_order:
            self._checked_order = True
            warn_if_grouped(reader)
        return out

    def _test_file(self) -> tuple[Rows, SourceMeta]:
        path = self.cfg.test_source
        fmt = infer_format(path, self.cfg.format)
        if fmt == "synthetic":
            raise DataError("data.test_source cannot be 'synthetic'; synthetic data has its own test split")
        if fmt == "shards":
            shards = ShardSet.open(path)
            meta = SourceMeta(shards.feature_names, shards.dense_names, shards.multi_hot, shards.num_rows("test"), shards.problems("test"))
            return ShardRows(shards, "test"), meta
        if self._test_reader is None:
            reader = open_reader(path, fmt, self.cfg.schema, label_optional=self._sampling)
            if self._sampling:
                check_label(self.cfg, reader)
            self._test_reader = reader
        reader = self._test_reader
        return FileRows(reader, 0, reader.num_rows, self.cfg.strict), file_meta(reader, reader.num_rows)


def open_dataset(cfg: DataConfig, *, label_optional: bool = False) -> Dataset:
    """``cfg``'s source, ready to give any split; ``label_optional`` (scoring new data): a file whose header lacks
    the label column, or whose lines have one field fewer than the schema's columns, is read without labels
    (``labeled`` is False and the labels read as 0)."""
    return Dataset(cfg, label_optional)


def open_source(
    cfg: DataConfig,
    split: str,
    batch_size: int,
    *,
    start_batch: int = 0,
    drop_last: bool = False,
    label_optional: bool = False,
    shuffle: Shuffle | None = None,
) -> BatchSource:
    """The ``split`` of ``cfg.source`` as batches: ``open_dataset(cfg).source(split, ...)`` (see :class:`Dataset`)."""
    if split not in SPLITS:  # before the source is looked at
        raise DataError(f"split must be one of {list(SPLITS)}, got {split!r}")
    data = open_dataset(cfg, label_optional=label_optional)
    return data.source(split, batch_size, start_batch=start_batch, drop_last=drop_last, shuffle=shuffle)


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


def warn_if_grouped(reader: Reader) -> None:
    """One :class:`SplitWarning` when the file's first rows hold a key column's values each in one run (sorted by it)."""
    schema, n = reader.schema, min(reader.num_rows, _GROUPED_SAMPLE_ROWS)
    single = [f for f, name in enumerate(schema.categorical) if name not in schema.multi_valued]
    if not single or n < 4 * GROUPED_MIN_VALUES:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # malformed rows: the pass itself reports them
        blocks = list(reader.blocks(0, n, reader.new_report(), strict=False))
    if not blocks:
        return
    for f in single:
        ids = np.concatenate([b.feature(f)[0] for b in blocks])
        distinct = np.unique(ids).size
        runs = 1 + int(np.count_nonzero(ids[1:] != ids[:-1]))
        if GROUPED_MIN_VALUES <= distinct == runs and distinct * 2 <= ids.size:
            name = schema.categorical[f]
            warnings.warn(
                f"{reader.display}: the rows are sorted by {name} (each of its {distinct} values in the first {ids.size:,} rows"
                f" comes in one run), so a tail split tests on {name} values that training never saw; set data.split ="
                f' "column" with data.split_column = a time column, or "hash"',
                SplitWarning,
                stacklevel=4,
            )
            return
