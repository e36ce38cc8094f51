"""Binary shards: the files ``tierec preprocess`` (``data/preprocess.py``) writes, and reading them back.

Format: a directory with ``manifest.json`` and Arrow IPC files
``train-00000.arrow``, ``test-00000.arrow``, ... Each shard holds record batches
of up to 65,536 rows with columns ``label`` (float32), ``dense``
(fixed_size_list<float32>[n_dense], absent when n_dense is 0) and one column per
sparse feature: int64 when
every row has exactly one id, list<int64> for multi-hot features.

Why Arrow IPC rather than safetensors: the files are self-describing (readable by
pyarrow, pandas, DuckDB and Polars for inspection), jagged features are a native
type, record batches give cheap random access for resume, and a memory-mapped
read is zero-copy. The manifest records feature names, n_dense, rows per shard
and per split, the source and the malformed-row counts of the pass that wrote
the shards. Reading the shards back yields exactly the batches of the source.

>>> import tempfile
>>> from tierec.config import DataConfig, SyntheticConfig
>>> from tierec.data.preprocess import preprocess
>>> out = tempfile.mkdtemp()
>>> _ = preprocess(DataConfig(synthetic=SyntheticConfig(train_rows=3000, test_rows=500)), out, 1000, progress=False)
>>> shards = ShardSet.open(out)
>>> shards.num_rows("train"), shards.num_rows("test")
(3000, 500)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from tierec.config import ConfigError
from tierec.data.blocks import RowBlock, concat_slices
from tierec.data.errors import DataError, NoSplitError, ProblemReport
from tierec.paths import safe_member

MANIFEST = "manifest.json"
FORMAT_NAME = "tierec-shards"
FORMAT_VERSION = 1
RECORD_ROWS = 65536  # rows per record batch inside a shard
SHARD_NAME = re.compile(r"[a-z]+-\d{5}\.arrow")  # what preprocess names shards


@dataclass(frozen=True)
class ShardInfo:
    file: str  # relative to the shard directory
    rows: int


@dataclass
class SplitInfo:
    rows: int = 0
    shards: list[ShardInfo] = field(default_factory=list)
    problems: ProblemReport | None = None


@dataclass
class Manifest:
    """What ``manifest.json`` holds."""

    feature_names: tuple[str, ...]
    dense_names: tuple[str, ...]
    multi_hot: tuple[str, ...]
    rows_per_shard: int
    source: dict[str, Any]
    data_config: dict[str, Any]
    splits: dict[str, SplitInfo] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def items(self) -> Any:
        """The manifest's JSON fields, like ``dict.items()``."""
        return self.to_dict().items()

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "feature_names": list(self.feature_names),
            "dense_names": list(self.dense_names),
            "n_dense": len(self.dense_names),
            "multi_hot": list(self.multi_hot),
            "rows_per_shard": self.rows_per_shard,
            "total_rows": sum(s.rows for s in self.splits.values()),
            "source": self.source,
            "splits": {
                name: {
                    "rows": s.rows,
                    "shards": [{"file": x.file, "rows": x.rows} for x in s.shards],
                    "problems": s.problems.to_dict() if s.problems else None,
                }
                for name, s in self.splits.items()
            },
            "data_config": self.data_config,
        }

    @staticmethod
    def from_json(text: str, where: str) -> Manifest:
        try:
            d = json.loads(text)
            if d.get("format") != FORMAT_NAME or d.get("version") != FORMAT_VERSION:
                raise DataError(f"{where}: not a {FORMAT_NAME} v{FORMAT_VERSION} manifest")
            splits = {
                name: SplitInfo(
                    int(s["rows"]),
                    [ShardInfo(safe_member(x["file"], where), int(x["rows"])) for x in s["shards"]],
                    ProblemReport.from_dict(s["problems"]) if s.get("problems") else None,
                )
                for name, s in d["splits"].items()
            }
            return Manifest(
                tuple(d["feature_names"]), tuple(d["dense_names"]), tuple(d["multi_hot"]), int(d["rows_per_shard"]),
                dict(d["source"]), dict(d["data_config"]), splits,
            )  # fmt: skip
        except DataError:
            raise
        except ConfigError as e:  # a file name outside the directory
            raise DataError(str(e)) from None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            what = f"missing key {e}" if isinstance(e, KeyError) else str(e)
            raise DataError(f"{where}: malformed manifest ({what})") from None


def arrow_schema(features: tuple[str, ...], n_dense: int, multi_hot: tuple[str, ...]) -> pa.Schema:
    fields = [pa.field("label", pa.float32())]
    if n_dense:  # Arrow has no fixed-size lists of size 0
        fields.append(pa.field("dense", pa.list_(pa.float32(), n_dense)))
    fields += [pa.field(f, pa.list_(pa.int64()) if f in multi_hot else pa.int64()) for f in features]
    return pa.schema(fields)


def to_record_batch(block: RowBlock, schema: pa.Schema) -> pa.RecordBatch:
    """A block as an Arrow record batch of the shard schema."""
    n, nf = block.size, block.n_features
    n_dense = block.dense.shape[1]
    cols: list[pa.Array] = [pa.array(block.labels, pa.float32())]
    if n_dense:
        cols.append(pa.FixedSizeListArray.from_arrays(pa.array(block.dense.reshape(-1), pa.float32()), n_dense))
    first = len(cols)  # column of the first sparse feature
    for f in range(nf):
        values, lengths = block.feature(f)
        if pa.types.is_list(schema.field(first + f).type):
            offsets = np.zeros(n + 1, np.int32)
            np.cumsum(lengths, out=offsets[1:])
            cols.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int64())))
        else:
            if len(values) != n:
                raise DataError(f"feature {schema.field(first + f).name} has {len(values)} ids for {n} rows")
            cols.append(pa.array(values, pa.int64()))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def from_record_batch(rb: pa.RecordBatch) -> RowBlock:
    """The block of a shard record batch (zero-copy where Arrow allows)."""
    n = rb.num_rows
    labels = rb.column(0).to_numpy()  # [n]
    has_dense = rb.num_columns > 1 and pa.types.is_fixed_size_list(rb.schema.field(1).type)
    if has_dense:
        dense_col = rb.column(1)
        dense = dense_col.flatten().to_numpy().reshape(n, dense_col.type.list_size)  # [n, n_dense]
    else:
        dense = np.zeros((n, 0), np.float32)
    feats = [rb.column(i) for i in range(2 if has_dense else 1, rb.num_columns)]
    if all(pa.types.is_int64(c.type) for c in feats):
        ids = np.stack([c.to_numpy() for c in feats]) if feats else np.empty((0, n), np.int64)  # [F, n]
        return RowBlock.from_ids(labels, dense, ids)
    parts: list[tuple[np.ndarray, np.ndarray | None]] = []
    for c in feats:
        if pa.types.is_int64(c.type):
            parts.append((c.to_numpy(), None))
        else:
            off = c.offsets.to_numpy()
            parts.append((c.flatten().to_numpy(), np.diff(off).astype(np.int64)))
    return RowBlock.from_features(labels, dense, parts)


@dataclass(frozen=True)
class ShardSet:
    """A shard directory opened for reading."""

    root: Path
    manifest: Manifest

    @staticmethod
    def open(path: str | Path) -> ShardSet:
        root = Path(path)
        mpath = root / MANIFEST
        if not mpath.is_file():
            raise DataError(f"{path}: a directory without {MANIFEST}; write shards with `tierec preprocess`")
        manifest = Manifest.from_json(mpath.read_text(), str(mpath))
        missing = [x.file for s in manifest.splits.values() for x in s.shards if not (root / x.file).is_file()]
        if missing:
            raise DataError(f"{path}: shard file(s) listed in the manifest are missing: {missing[:3]}")
        return ShardSet(root, manifest)

    @property
    def feature_names(self) -> tuple[str, ...]:
        return self.manifest.feature_names

    @property
    def dense_names(self) -> tuple[str, ...]:
        return self.manifest.dense_names

    @property
    def multi_hot(self) -> tuple[str, ...]:
        return self.manifest.multi_hot

    def split(self, split: str) -> SplitInfo:
        if split not in self.manifest.splits:
            raise NoSplitError(f"{self.root}: the shards have no {split} split")
        return self.manifest.splits[split]

    def num_rows(self, split: str) -> int:
        return self.split(split).rows

    def problems(self, split: str) -> ProblemReport:
        return self.split(split).problems or ProblemReport(str(self.root))

    def batches_in_order(self, split: str, rng: np.random.Generator) -> Iterator[RowBlock]:
        """Every record batch of ``split``, shard and batch order drawn from ``rng`` (shuffled training)."""
        shards = self.split(split).shards
        counts = []
        for shard in shards:
            with pa.memory_map(str(self.root / shard.file)) as mm:
                counts.append(ipc.open_file(mm).num_record_batches)
        pairs = [(s, i) for s, c in enumerate(counts) for i in range(c)]
        for k in rng.permutation(len(pairs)):
            s, i = pairs[k]
            with pa.memory_map(str(self.root / shards[s].file)) as mm:
                yield from_record_batch(ipc.open_file(mm).get_batch(i))

    def blocks(self, split: str, start_row: int) -> Iterator[RowBlock]:
        """Record batches of ``split`` from row ``start_row`` on (whole shards and batches are skipped unread)."""
        for shard in self.split(split).shards:
            if start_row >= shard.rows:
                start_row -= shard.rows
                continue
            with pa.memory_map(str(self.root / shard.file)) as mm:
                reader = ipc.open_file(mm)
                for i in range(reader.num_record_batches):
                    rb = reader.get_batch(i)
                    if start_row >= rb.num_rows:
                        start_row -= rb.num_rows
                        continue
                    block = from_record_batch(rb)
                    yield concat_slices([(block, start_row, block.size)]) if start_row else block
                    start_row = 0
