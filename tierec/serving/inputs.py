"""Raw values to model input, exactly as the training reader made them.

:func:`input_schema` records, at export time, how the run's data turned raw
values into ids and dense features (its resolved schema, tierec/data/schema.py);
:class:`RowEncoder` applies it to rows given as a dict of columns or a list of
records, through the training reader's own parser (tierec/data/columns.py), so
an id is the id training gave the same value. Text-trained models (CSV, TSV,
Criteo) take each value as the text the file would hold (numbers become their
decimal text, None and absent columns are empty); Parquet- and synthetic-trained
ones take typed values, as Parquet held them. A multi-valued column takes a
list or the separator-joined text. A label column, when present, is ignored.

>>> from tierec.config import DataConfig, SchemaConfig
>>> s = input_schema(DataConfig(source="x.csv", schema=SchemaConfig(dense=["p"], categorical=["u"])))
>>> enc = RowEncoder(s)
>>> block = enc.encode([{"p": 2.5, "u": "ann"}, {"p": "1", "u": None}])
>>> block.dense.ravel().tolist(), int(block.values[0]) == int(enc.encode({"u": ["ann"]}).values[0])
([2.5, 1.0], True)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tierec.config import DataConfig, from_dict
from tierec.data import CRITEO_CATEGORICAL, DataError, ShardSet, infer_format, resolve_schema
from tierec.data.blocks import RowBlock
from tierec.data.columns import BlockParser
from tierec.data.schema import Schema
from tierec.serving.manifest import ExportError, InputSchema

Rows = Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]]  # a dict of columns, or a list of records


class BadRowsError(ValueError):
    """Rows to score that cannot be read (a value that is not a number, a bad hex id); one line."""


def input_schema(cfg: DataConfig) -> InputSchema:
    """How the run of data config ``cfg`` read raw values (shards: the config that wrote them)."""
    fmt = infer_format(cfg.source, cfg.format)
    if fmt == "shards":
        try:
            written_by = ShardSet.open(cfg.source).manifest.data_config
        except Exception as e:  # noqa: BLE001 - any failure to read the shards' manifest is one line
            raise ExportError(f"the run trained on shards {cfg.source}, whose manifest.json says how raw values became ids, "
                              f"and it cannot be read ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        return input_schema(from_dict(DataConfig, written_by))
    if fmt == "synthetic":
        dense = tuple(f"I{i}" for i in range(1, cfg.synthetic.n_dense + 1))
        multi = CRITEO_CATEGORICAL if cfg.synthetic.ids_per_feature > 1 else ()
        return InputSchema(dense=dense, categorical=CRITEO_CATEGORICAL, multi_valued=multi, separator="|",
                           dense_transform="none", encoding="hex", values="typed", label="label")  # fmt: skip
    s = resolve_schema(cfg.schema, fmt)
    return InputSchema(dense=s.dense, categorical=s.categorical, multi_valued=s.multi_valued, separator=s.separator,
                       dense_transform=s.dense_transform, encoding=s.encoding,
                       values="typed" if fmt == "parquet" else "text", label=s.label)  # fmt: skip


class RowEncoder:
    """Rows of raw values -> a :class:`RowBlock` (dense features, ids per feature), as training read them."""

    def __init__(self, schema: InputSchema) -> None:
        self.schema = schema
        self.multi = set(schema.multi_valued)
        self.parser = BlockParser(
            Schema(label="", dense=schema.dense, categorical=schema.categorical, multi_valued=schema.multi_valued,
                   separator=schema.separator, header=True, columns=(), dense_transform=schema.dense_transform,
                   encoding=schema.encoding, delimiter="", quoting=False)  # fmt: skip
        )

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self.schema.dense, *self.schema.categorical)

    def encode(self, rows: Rows) -> RowBlock:
        """The block of ``rows``; a value training would have rejected is a BadRowsError naming row and column."""
        columns, n = self._columns(rows)
        try:
            arrays = self._strings(rows, columns, n) if self.schema.values == "text" else None
            if arrays is None:
                arrays = self._arrays(self._gathered(rows) if columns is None else columns, n)
            batch = pa.RecordBatch.from_arrays(arrays, names=list(self.columns))
            block, err = self.parser.parse(batch)
        except (DataError, pa.ArrowException) as e:  # a typed column the reader cannot use (e.g. a dense column of lists)
            raise BadRowsError(" ".join(str(e).split())[:300]) from None
        bad = np.flatnonzero(err)
        if bad.size:
            i = int(bad[0])
            raise BadRowsError(f"row {i}: {self.parser.problem(batch, i, int(err[i]))}")
        return block

    def _columns(self, rows: Rows) -> tuple[dict[str, list[Any]] | None, int]:
        """The model's columns of a dict of columns (others, such as a label or a key, are ignored), or None
        for records (checked to be mappings here, gathered later only when needed), and the row count."""
        if isinstance(rows, Mapping):
            if any(isinstance(v, (str, bytes)) or not isinstance(v, Sequence) for v in rows.values()):
                raise BadRowsError("a dict of columns needs a list of values for each column")
            cols = {c: list(v) for c, v in rows.items() if c in self.columns}
            lengths = {len(v) for v in rows.values()}
            if len(lengths) > 1:
                raise BadRowsError(f"the columns have different lengths: {sorted(lengths)}")
            return cols, lengths.pop() if lengths else 0
        if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
            raise BadRowsError("rows must be a list of records (objects) or a dict of columns")
        for i, r in enumerate(rows):
            if not isinstance(r, Mapping):
                raise BadRowsError(f"row {i}: a record must be an object of column: value, got {type(r).__name__}")
        return None, len(rows)

    def _gathered(self, records: Rows) -> dict[str, list[Any]]:
        return {c: [r.get(c) for r in records] for c in self.columns}  # type: ignore[union-attr]

    def _strings(self, rows: Rows, columns: dict[str, list[Any]] | None, n: int) -> list[pa.Array] | None:
        """Text schema, every value text or None (JSON's usual case): one Arrow string array per model column,
        converted in C++ (records through one struct array), None and absent read as empty; else None."""
        try:
            if columns is None:
                records = pa.array(rows, pa.struct([(c, pa.string()) for c in self.columns]))
                arrays = [records.field(k) for k in range(len(self.columns))]
            else:
                arrays = [pa.array(columns[c], pa.string()) if c in columns else pa.nulls(n, pa.string()) for c in self.columns]
        except pa.ArrowException:  # numbers, booleans, lists: value by value (_arrays)
            return None
        return [pc.fill_null(a, "") if a.null_count else a for a in arrays]

    def _arrays(self, columns: dict[str, list[Any]], n: int) -> list[pa.Array]:
        """One Arrow array per model column: as text (one array for all columns, sliced: one conversion
        per request), or typed."""
        if self.schema.values == "text":
            sep = self.schema.separator
            texts = []
            for c in self.columns:
                values = columns.get(c)
                if values is None:
                    texts += [""] * n
                elif c in self.multi:  # a list: its values joined as the file would hold them
                    texts += [sep.join(_text(x) for x in v) if isinstance(v, (list, tuple)) else _text(v) for v in values]
                else:
                    texts += [_text(v) for v in values]
            flat = pa.array(texts, pa.string())
            return [flat.slice(k * n, n) for k in range(len(self.columns))]
        return [self._typed(c, columns.get(c), n) for c in self.columns]

    def _typed(self, name: str, values: list[Any] | None, n: int) -> pa.Array:
        if values is None or all(v is None for v in values):  # absent: empty, typed as the reader expects
            return pa.nulls(n, pa.float64() if name in self.schema.dense else pa.string())
        try:
            return pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types: as text
            return pa.array([None if v is None else _text(v) for v in values], pa.string())


def _text(v: Any) -> str:
    """A value as a text file would hold it (None: empty; True / False: 1 / 0; bytes: their UTF-8 text)."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, bytes):  # its UTF-8 text, as the struct conversion above takes it
        return v.decode("utf-8", "replace")
    return str(v)
