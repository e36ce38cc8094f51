"""Resolved schemas: which columns feed the label, dense and categorical features.

``SchemaConfig`` is what the user writes; :func:`resolve_schema` turns it (and the
file format) into a frozen :class:`Schema` the readers use. The Criteo preset is
one schema: label, I1..I13 dense (``log1p``), C1..C26 categorical (``hex``),
tab-separated without a header for format ``"criteo"``.

>>> s = criteo_schema(header=False)
>>> s.dense[:2], s.categorical[-1], s.delimiter == "\\t", len(s.columns)
(('I1', 'I2'), 'C26', True, 40)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from tierec.config import SchemaConfig
from tierec.data.errors import DataError
from tierec.data.row_filter import RowFilter
from tierec.data.hashing import MAX_FEATURES

CRITEO_DENSE: tuple[str, ...] = tuple(f"I{i}" for i in range(1, 14))
CRITEO_CATEGORICAL: tuple[str, ...] = tuple(f"C{i}" for i in range(1, 27))
CRITEO_COLUMNS: tuple[str, ...] = ("label", *CRITEO_DENSE, *CRITEO_CATEGORICAL)
# Distinct values per categorical feature in the Criteo Kaggle (display advertising) train set.
CRITEO_CARDINALITIES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip

_DELIMITERS = {"csv": ",", "tsv": "\t", "criteo": "\t"}
_DELIMITER_NAMES = {",": "comma", "\t": "tab", ";": "semicolon", "|": "pipe", " ": "space"}


@dataclass(frozen=True)
class Schema:
    """A validated, format-specific schema (see :func:`resolve_schema`)."""

    label: str
    dense: tuple[str, ...]
    categorical: tuple[str, ...]
    multi_valued: tuple[str, ...]
    separator: str
    header: bool
    columns: tuple[str, ...]  # names in file order when there is no header; else empty
    dense_transform: str  # "none" | "log1p"
    encoding: str  # "hash" | "hex"
    delimiter: str  # CSV/TSV field delimiter ("" for Parquet)
    quoting: bool  # CSV fields may be quoted
    label_threshold: float = math.nan  # nan: labels are 0/1 (or in between); else label >= threshold is 1
    order_column: str = ""  # a column split's column, read into each block's ``order`` (data.split_column)
    row_filter: RowFilter | None = None  # data.schema.filter: rows that fail it are dropped

    @property
    def labeled(self) -> bool:
        """False for a file without its label column (new data to score); its labels read as 0."""
        return bool(self.label)

    @property
    def needed(self) -> tuple[str, ...]:
        """Every column the reader must find (each once)."""
        names = (self.label, *self.dense, *self.categorical) if self.label else (*self.dense, *self.categorical)
        extra = [c for c in (self.order_column, self.row_filter.column if self.row_filter else "") if c and c not in names]
        return (*names, *dict.fromkeys(extra))

    def without_label(self) -> Schema:
        """The schema of the same file without its label column (Criteo's test layout: 39 columns)."""
        keep = self.row_filter if self.row_filter is None or self.row_filter.column != self.label else None
        return dataclasses.replace(self, label="", columns=tuple(c for c in self.columns if c != self.label), row_filter=keep)

    @property
    def delimiter_name(self) -> str:
        return _DELIMITER_NAMES.get(self.delimiter, repr(self.delimiter))


def require_unique_columns(names: list[str] | tuple[str, ...], display: str, where: str) -> None:
    """A DataError naming the first column name that ``where`` (the header, data.schema.columns) repeats.

    Readers pick columns by name, so a repeated name would silently feed one of them.

    >>> require_unique_columns(["label", "user", "user", "item"], "f.csv", "its header")
    Traceback (most recent call last):
    ...
    tierec.data.errors.DataError: f.csv: its header names column 'user' twice (fields 2 and 3); column names must be unique
    """
    first: dict[str, int] = {}
    for i, name in enumerate(names, 1):
        if name in first:
            raise DataError(f"{display}: {where} names column {name!r} twice (fields {first[name]} and {i}); column names must be unique")
        first[name] = i


def criteo_schema(header: bool = False, delimiter: str = "\t") -> Schema:
    """The Criteo preset (hex ids folded with the feature index, log1p dense)."""
    return Schema(
        label="label",
        dense=CRITEO_DENSE,
        categorical=CRITEO_CATEGORICAL,
        multi_valued=(),
        separator="|",
        header=header,
        columns=() if header else CRITEO_COLUMNS,
        dense_transform="log1p",
        encoding="hex",
        delimiter=delimiter,
        quoting=delimiter != "\t",
    )


def resolve_schema(cfg: SchemaConfig, fmt: str, label_optional: bool = False) -> Schema:
    """The schema for a file of format ``fmt`` (criteo | csv | tsv | parquet); ``label_optional``: ``columns`` (a file
    without a header) need not name the label (then the schema has none: a log without labels, new data to score)."""
    row_filter = RowFilter.parse(cfg.filter) if cfg.filter else None
    if fmt == "criteo":
        return dataclasses.replace(criteo_schema(header=False), label_threshold=cfg.label_threshold, row_filter=row_filter)
    delimiter = cfg.delimiter or _DELIMITERS.get(fmt, "")
    if cfg.preset == "criteo":
        base = criteo_schema(header=cfg.header, delimiter=delimiter)
        dense, categorical, label = base.dense, base.categorical, base.label
        columns = tuple(cfg.columns) or (() if cfg.header else CRITEO_COLUMNS)
        transform, encoding = cfg.dense_transform or "log1p", cfg.categorical_encoding or "hex"
    else:
        dense, categorical, label = tuple(cfg.dense), tuple(cfg.categorical), cfg.label
        columns = tuple(cfg.columns)
        transform, encoding = cfg.dense_transform or "none", cfg.categorical_encoding or "hash"
    if fmt == "parquet" or cfg.header:
        columns = ()
    if fmt == "parquet":
        delimiter = ""
    elif not cfg.header and not columns:
        raise DataError("data.schema.header is false but data.schema.columns does not name the file's columns")
    if label_optional and columns and label not in columns:
        label = ""
    if not dense and not categorical:
        raise DataError("schema names no dense and no categorical columns (set data.schema.dense / data.schema.categorical)")
    not_categorical = [c for c in cfg.multi_valued if c not in categorical]
    if not_categorical:
        raise DataError(f"data.schema.multi_valued names columns that are not categorical: {not_categorical}")
    names = (label, *dense, *categorical) if label else (*dense, *categorical)
    dup = sorted({c for c in names if names.count(c) > 1})
    if dup:
        raise DataError(f"schema uses column(s) {dup} more than once")
    if encoding == "hex" and len(categorical) > MAX_FEATURES:
        raise DataError(f"hex encoding supports at most {MAX_FEATURES} categorical features")
    if columns and row_filter is not None and row_filter.column not in columns:
        raise DataError(f"data.schema.filter names column {row_filter.column!r}, which is not in data.schema.columns {list(columns)}")
    if columns:
        absent = [c for c in names if c not in columns]
        if absent:
            raise DataError(f"schema names column(s) {absent} that are not in data.schema.columns {list(columns)}")
    return Schema(
        label=label,
        dense=dense,
        categorical=categorical,
        multi_valued=tuple(cfg.multi_valued),
        separator=cfg.separator,
        header=cfg.header if fmt != "parquet" else True,
        columns=columns,
        dense_transform=transform,
        encoding=encoding,
        delimiter=delimiter,
        quoting=delimiter not in ("\t", ""),
        label_threshold=cfg.label_threshold,
        row_filter=row_filter,
    )
