"""Key columns of a file, by data row: what ``tierec predict`` writes beside each score.

The readers hand over rows as ids and floats; a key (a user id, an impression id)
must come out as the file wrote it. :func:`read_key_columns` reads only the named
columns, as strings (typed for Parquet), and picks the values of the given 0-based
data rows (header excluded), the ``rows`` of the blocks the model scored.

>>> import tempfile, os, numpy as np
>>> from tierec.config import DataConfig, SchemaConfig
>>> path = os.path.join(tempfile.mkdtemp(), "t.csv")
>>> _ = open(path, "w").write("id,y,x\\na7,1,2\\nbad\\nb8,0,3\\n")
>>> cfg = DataConfig(source=path, schema=SchemaConfig(label="y", dense=["x"]))
>>> read_key_columns(cfg, ["id"], np.array([0, 2]))["id"].to_pylist()
['a7', 'b8']
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from tierec.config import DataConfig
from tierec.data.errors import DataError
from tierec.data.schema import resolve_schema
from tierec.data.source import infer_format
from tierec.data.text import TextFile


def read_key_columns(cfg: DataConfig, names: list[str], rows: np.ndarray) -> dict[str, pa.Array]:
    """``{name: values at rows}`` for each key column of the file ``cfg.source``."""
    fmt = infer_format(cfg.source, cfg.format)
    if fmt in ("synthetic", "shards"):
        raise DataError(f"--key needs a raw data file; {cfg.source} is {fmt} data (scores carry the row number)")
    schema = resolve_schema(cfg.schema, fmt)
    if fmt == "parquet":
        file_names = pq.ParquetFile(cfg.source).schema_arrow.names
        _check(cfg.source, names, file_names)
        table = pq.read_table(cfg.source, columns=names)
        return {n: table.column(n).take(pa.array(rows)).combine_chunks() for n in names}
    file = TextFile.open(cfg.source, schema, label_optional=True)
    _check(cfg.source, names, list(file.names))
    head = 1 if file.schema.header else 0
    skipped: list[int] = []  # 0-based data rows pyarrow rejected (wrong field count)

    def on_invalid(row: pacsv.InvalidRow) -> str:
        skipped.append(row.number - 1 - head)
        return "skip"

    table = pacsv.read_csv(
        cfg.source,
        read_options=pacsv.ReadOptions(use_threads=False, column_names=list(file.names), skip_rows=head),
        parse_options=pacsv.ParseOptions(
            delimiter=file.schema.delimiter,
            quote_char='"' if file.schema.quoting else False,
            ignore_empty_lines=False,
            invalid_row_handler=on_invalid,
        ),
        convert_options=pacsv.ConvertOptions(include_columns=names, column_types={n: pa.string() for n in names}),
    )
    kept = np.setdiff1d(np.arange(file.data_lines, dtype=np.int64), np.asarray(skipped, np.int64))  # data row of each table row
    at = pa.array(np.searchsorted(kept, rows))
    return {n: table.column(n).take(at).combine_chunks() for n in names}


def _check(source: str, names: list[str], file_names: list[str]) -> None:
    absent = [n for n in names if n not in file_names]
    if absent:
        raise DataError(f"{source}: key column(s) {absent} are not in the file; it has {file_names}")
