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
import pyarrow.compute as pc

from tierec.config import DataConfig
from tierec.data.errors import DataError
from tierec.data.reader import open_reader
from tierec.data.source import infer_format


def read_key_columns(cfg: DataConfig, names: list[str], rows: np.ndarray) -> dict[str, pa.Array]:
    """``{name: values at rows}`` for each key column of the file ``cfg.source``."""
    fmt = infer_format(cfg.source, cfg.format)
    if fmt in ("synthetic", "shards"):
        raise DataError(f"--key needs a raw data file; {cfg.source} is {fmt} data (scores carry the row number)")
    reader = open_reader(cfg.source, fmt, cfg.schema, label_optional=True)
    absent = [n for n in names if n not in reader.names]
    if absent:
        raise DataError(f"{cfg.source}: key column(s) {absent} are not in the file; it has {list(reader.names)}")
    out = {}
    for name in names:
        at, values = zip(*reader.column(name)) if reader.num_rows else ((), ())
        kept = np.concatenate(at) if at else np.zeros(0, np.int64)  # data row of each value
        column = pa.concat_arrays([_text(v) for v in values]) if values else pa.array([], pa.string())
        out[name] = column.take(pa.array(np.searchsorted(kept, rows)))
    return out


def _text(values: pa.Array) -> pa.Array:
    """Text files hand over bytes: as strings (bytes that are not UTF-8 with replacement characters)."""
    if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
        return values
    try:
        return pc.cast(values, pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if v is None else v.decode("utf-8", "replace") for v in values.to_pylist()], pa.string())
