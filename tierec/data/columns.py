"""Turn an Arrow record batch into a :class:`RowBlock`, flagging malformed rows.

Text readers hand over every column as strings (so a bad value costs one row,
not the file); Parquet hands over typed columns. Strings go through the numba
kernels over the Arrow buffers; numeric columns are cast by Arrow. Dictionary
columns are hashed once per dictionary entry, and list columns are multi-valued.

>>> import pyarrow as pa
>>> from tierec.data.schema import criteo_schema
>>> p = BlockParser(criteo_schema(header=True))
>>> cols = {"label": ["1", "0"], **{c: ["3", "x"] for c in p.schema.dense},
...         **{c: ["a1", ""] for c in p.schema.categorical}}
>>> block, err = p.parse(pa.RecordBatch.from_pydict(cols))
>>> err.tolist(), p.problem(pa.RecordBatch.from_pydict(cols), 1, int(err[1]))
([0, 2], "column I1: 'x' is not a number")
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tierec.config import has_threshold
from tierec.data import kernels
from tierec.data.blocks import RowBlock
from tierec.data.errors import DataError
from tierec.data.hashing import feature_hash_state, hex_id, missing_hash_id
from tierec.data.schema import Schema
from tierec.paths import quote

_STRINGS = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)


def _is_string(t: pa.DataType) -> bool:
    return any(check(t) for check in _STRINGS)


def string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``offsets`` [n + 1] (int32 or int64) and ``data`` uint8 of a string array; nulls read as empty."""
    if arr.null_count:
        arr = pc.fill_null(arr, pa.scalar("", arr.type))
    wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], np.int64 if wide else np.int32)[arr.offset : arr.offset + len(arr) + 1]
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(1, np.uint8)
    return offsets, data


def _valid(arr: pa.Array) -> np.ndarray:
    if not arr.null_count:
        return np.ones(len(arr), np.bool_)
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), np.bool_)


def _flag_invalid_utf8(arr: pa.Array, err: np.ndarray, code: int) -> None:
    """Mark rows whose binary value is not UTF-8 (one C++ check per column; per row only if that fails)."""
    if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
        return
    try:
        arr.cast(pa.large_string() if pa.types.is_large_binary(arr.type) else pa.string())
        return
    except pa.ArrowInvalid:
        pass
    for i, v in enumerate(arr.to_pylist()):
        if v is not None and err[i] == 0:
            try:
                v.decode("utf-8")
            except UnicodeDecodeError:
                err[i] = code


def number_values(arr: pa.Array) -> np.ndarray:
    """[n] float64 of a column: text parsed as numbers, times as their integer count; NaN where missing or not a number."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_dictionary(t):
        arr, t = arr.cast(t.value_type), t.value_type
    if pa.types.is_temporal(t):
        arr = pc.cast(arr, pa.int64())
    elif _is_string(t):
        try:
            text = pc.cast(arr, pa.string()) if not pa.types.is_string(t) else arr
            text = pc.if_else(pc.equal(pc.utf8_trim_whitespace(text), ""), pa.scalar(None, pa.string()), text)
            arr = pc.cast(text, pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # a value that is not a number (or not UTF-8): one by one
            return np.array([_number_or_nan(v) for v in arr.to_pylist()], np.float64)
    out = pc.cast(arr, pa.float64()).fill_null(float("nan")).to_numpy(zero_copy_only=False)
    return np.asarray(out, np.float64)


def _number_or_nan(v: object) -> float:
    try:
        return float(v.decode("utf-8", "replace") if isinstance(v, bytes) else v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return float("nan")


FILTERED = -1  # ``err`` of a row that data.schema.filter drops (not a malformed row)


class BlockParser:
    """Parses record batches of one schema. Error code k > 0 names column ``codes[k - 1]``; rows with code
    :data:`FILTERED` fail the schema's row filter."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.codes: tuple[str, ...] = (schema.label, *schema.dense, *schema.categorical)
        self._states = [feature_hash_state(c) for c in schema.categorical]
        self._missing = [missing_hash_id(c) for c in schema.categorical]
        self._sep = np.frombuffer(schema.separator.encode("utf-8"), np.uint8).copy()
        self._multi = set(schema.multi_valued)

    def parse(self, batch: pa.RecordBatch) -> tuple[RowBlock, np.ndarray]:
        """All rows of ``batch`` as a block, and ``err`` [n] int32 (0 = row is fine, > 0 malformed, FILTERED dropped)."""
        s = self.schema
        n = batch.num_rows
        err = np.zeros(n, np.int32)
        for k, name in enumerate(self.codes):
            if name in batch.schema.names:  # binary text columns: bytes that are not UTF-8 make a bad row
                _flag_invalid_utf8(self._column(batch, name), err, k + 1)
        labels = self._labels(self._column(batch, s.label), err) if s.labeled else np.zeros(n, np.float32)  # [n]
        dense = np.zeros((n, len(s.dense)), np.float32)  # [n, n_dense]
        for j, name in enumerate(s.dense):
            self._dense(self._column(batch, name), dense, j, err, 2 + j)
        features = []
        for f, name in enumerate(s.categorical):
            code = 2 + len(s.dense) + f
            arr = self._column(batch, name)
            if name in self._multi:
                features.append(self._bags(arr, f, err, code))
            else:
                features.append((self._ids(arr, f, err, code), None))
        block = RowBlock.from_features(labels, dense, features)
        if s.row_filter is not None:  # rows that fail data.schema.filter: dropped, not malformed
            keep = s.row_filter.keep(number_values(self._column(batch, s.row_filter.column)))
            err[(err == 0) & ~keep] = FILTERED
        if s.order_column:
            block = block.with_order(number_values(self._column(batch, s.order_column)))
        return block, err

    def problem(self, batch: pa.RecordBatch, row: int, code: int) -> str:
        """A one-line description of why ``row`` got error ``code``."""
        name = self.codes[code - 1]
        value = self._column(batch, name)[row].as_py()
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                return f"column {name}: invalid UTF-8 in {quote(value)}"
        if code == 1:
            if value in (None, ""):
                return "label is empty"
            if has_threshold(self.schema.label_threshold):
                return f"label {quote(value)} is not a number"
            return f"label {quote(value)} is not 0 or 1 (set data.schema.label_threshold to turn values >= it into 1)"
        if code < 2 + len(self.schema.dense):
            return f"column {name}: {quote(value)} is not a number"
        if isinstance(value, int):
            return f"column {name}: {value} does not fit in 32 bits"
        return f"column {name}: {quote(value)} is not a hex id of 1-8 digits"

    @staticmethod
    def _column(batch: pa.RecordBatch, name: str) -> pa.Array:
        arr = batch.column(name)
        return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr

    def is_fatal(self, batch: pa.RecordBatch, row: int, code: int) -> bool:
        """A label value that is present but not usable stops the run (skipping it would hide a wrong schema)."""
        if code != 1:
            return False
        value = self._column(batch, self.schema.label)[row].as_py()
        if isinstance(value, bytes):  # text files hand over bytes; undecodable bytes are a damaged row, not a schema
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                return False
        return value not in (None, "")

    def _labels(self, arr: pa.Array, err: np.ndarray) -> np.ndarray:
        out = np.zeros(len(arr), np.float32)
        threshold = float(self.schema.label_threshold)
        if _is_string(arr.type):
            offsets, data = string_buffers(arr)
            kernels.label_column(offsets, data, out, err, 1, threshold)
            return out
        try:
            vals = pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False)
        except pa.ArrowInvalid as e:
            raise DataError(f"label column {self.schema.label!r} is not numeric: {e}") from None
        if has_threshold(threshold):
            bad = ~_valid(arr) | np.isnan(vals)
            vals = (vals >= threshold).astype(np.float64)
        else:
            bad = ~_valid(arr) | ~(vals >= 0.0) | ~(vals <= 1.0)
        err[(err == 0) & bad] = 1
        out[:] = np.where(bad, 0.0, vals)
        return out

    def _dense(self, arr: pa.Array, out: np.ndarray, j: int, err: np.ndarray, code: int) -> None:
        log1p = self.schema.dense_transform == "log1p"
        if _is_string(arr.type):
            offsets, data = string_buffers(arr)
            kernels.dense_column(offsets, data, out, j, log1p, err, code)
            return
        try:
            vals = pc.cast(pc.fill_null(arr, 0), pa.float64()).to_numpy(zero_copy_only=False)  # [n]
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise DataError(f"dense column {self.codes[j + 1]!r} is not numeric: {e}") from None
        finite = np.isfinite(vals)  # nulls were filled with 0; inf and NaN are rejected, as in text files
        err[(err == 0) & ~finite] = code
        vals = np.where(finite, vals, 0.0)
        out[:, j] = np.log1p(np.maximum(vals, 0.0)) if log1p else vals

    def _ids(self, arr: pa.Array, f: int, err: np.ndarray, code: int) -> np.ndarray:
        """One id per row [n] int64."""
        n = len(arr)
        out = np.empty(n, np.int64)
        hex_mode = self.schema.encoding == "hex"
        t = arr.type
        if pa.types.is_dictionary(t):  # hash each dictionary entry once
            dict_err = np.zeros(len(arr.dictionary), np.int32)
            table = np.append(self._ids(arr.dictionary, f, dict_err, code), self._missing_for(f))  # [n_dict + 1]
            dict_err = np.append(dict_err, 0)
            valid = _valid(arr)
            idx = np.where(valid, pc.fill_null(arr.indices, 0).to_numpy(zero_copy_only=False), len(table) - 1)
            out = table[idx]
            err[(err == 0) & (dict_err[idx] != 0)] = code
            return out
        if _is_string(t):
            offsets, data = string_buffers(arr)
            if hex_mode:
                kernels.hex_column(offsets, data, f, out, err, code)
            else:
                kernels.hash_column(offsets, data, self._states[f], self._missing[f], out)
            return out
        if pa.types.is_integer(t):
            vals = pc.fill_null(arr, 0).to_numpy(zero_copy_only=False).astype(np.int64)
            if hex_mode:
                kernels.hex_int_column(vals, _valid(arr), f, out, err, code)
            else:
                kernels.hash_int_column(vals, _valid(arr), self._states[f], self._missing[f], out)
            return out
        return self._ids(pc.cast(arr, pa.string()), f, err, code)  # floats, bools, dates: by their text

    def _bags(self, arr: pa.Array, f: int, err: np.ndarray, code: int) -> tuple[np.ndarray, np.ndarray]:
        """Ids [N] and lengths [n] of a multi-valued column."""
        n = len(arr)
        if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
            offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)  # [n + 1]
            base = offsets[0]
            flat = arr.values.slice(base, offsets[-1] - base)
            keep = np.repeat(_valid(arr), np.diff(offsets)) & _valid(flat)  # null lists and null values drop out
            kept = np.concatenate([[0], np.cumsum(keep)])
            lengths = kept[offsets[1:] - base] - kept[offsets[:-1] - base]  # [n]
            value_err = np.zeros(len(flat), np.int32)
            ids = self._ids(flat, f, value_err, code)[keep]
            bad_rows = np.repeat(np.arange(n), np.diff(offsets))[(value_err != 0) & keep]
            err[bad_rows[err[bad_rows] == 0]] = code
            return ids, lengths
        if not _is_string(arr.type):
            arr = pc.cast(arr, pa.string())
        offsets, data = string_buffers(arr)
        lengths = np.empty(n, np.int64)
        ids = kernels.multi_column(
            offsets, data, self._sep, self.schema.encoding == "hex", f, self._states[f], lengths, err, code
        )
        return ids, lengths

    def _missing_for(self, f: int) -> int:
        return hex_id(f, None) if self.schema.encoding == "hex" else self._missing[f]
