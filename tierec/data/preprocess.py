"""``tierec preprocess``: any source written as binary shards (``data/shards.py``) that stream fast.

The writer reads a source through ``data/source.py`` (which reads shard sets
too), so it lives apart from the shard format, and neither imports the other's
user.

>>> import tempfile
>>> from tierec.config import DataConfig, SyntheticConfig
>>> cfg = DataConfig(synthetic=SyntheticConfig(train_rows=3000, test_rows=500))
>>> m = preprocess(cfg, tempfile.mkdtemp(), rows_per_shard=1000, progress=False)
>>> m.splits["train"].rows, [s.rows for s in m.splits["train"].shards]
(3000, [1000, 1000, 1000])
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pyarrow.ipc as ipc

from tierec.config import DataConfig, to_dict
from tierec.data.blocks import concat_slices
from tierec.data.errors import DataError, NoSplitError
from tierec.data.shards import MANIFEST, RECORD_ROWS, SHARD_NAME, Manifest, ShardInfo, SplitInfo, arrow_schema, to_record_batch
from tierec.data.source import infer_format, open_source
from tierec.paths import check_no_alias


def preprocess(cfg: DataConfig, out_dir: str | Path, rows_per_shard: int = 1 << 20, progress: bool = True) -> Manifest:
    """Write the train and test splits of ``cfg``'s source as shards in ``out_dir``.

    The shards are written into a hidden sibling directory and swapped in only
    once every shard and the manifest are written: until then an older shard set
    in ``out_dir`` stays whole, and a failed run (a ``--strict`` error, a full
    disk) leaves it as it was. ``out_dir`` must be new, empty, or a shard
    directory holding only files its manifest lists; a file tierec did not
    write is never deleted.
    """
    if rows_per_shard <= 0:
        raise DataError(f"rows_per_shard must be positive, got {rows_per_shard}")
    out = Path(out_dir)
    check_no_alias(out, [cfg.source, cfg.test_source], "preprocess --out", "data.source")
    old = _replaceable(out)  # before the long write: a directory we may not replace fails now
    record_rows = min(RECORD_ROWS, rows_per_shard)
    manifest: Manifest | None = None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(out, "tmp")
    tmp.mkdir()
    try:
        for split in ("train", "validation", "test"):
            try:
                src = open_source(cfg, split, batch_size=record_rows)
            except NoSplitError:
                continue
            if manifest is None:
                manifest = Manifest(
                    src.feature_names, src.dense_names, src.multi_hot, rows_per_shard,
                    {"source": cfg.source, "format": infer_format(cfg.source, cfg.format), "test_source": cfg.test_source},
                    to_dict(cfg),
                )  # fmt: skip
            info = _write_split(src, tmp, split, rows_per_shard, progress)
            manifest.splits[split] = info
        assert manifest is not None  # the train split always exists
        (tmp / MANIFEST).write_text(manifest.to_json())
        _swap_in(tmp, out, old)
    except BaseException:
        _remove_listed(tmp, manifest, also_partial=True)
        raise
    return manifest


def _sibling(out: Path, kind: str) -> Path:
    return out.parent / f".{out.name}.{kind}-{uuid.uuid4().hex[:8]}"


def _replaceable(out: Path) -> Manifest | None:
    """The manifest of the shard set ``out`` holds (None if ``out`` is new or empty); raises if tierec may not replace it."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise DataError(f"{out}: exists and is not a directory")
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return None
    mpath = out / MANIFEST
    if not mpath.is_file():
        raise DataError(f"{out}: directory is not empty ({entries[:3]}) and holds no shards; give an empty or new directory")
    m = Manifest.from_json(mpath.read_text(), str(mpath))
    ours = {MANIFEST, *(x.file for s in m.splits.values() for x in s.shards)}
    foreign = [e for e in entries if e not in ours]
    if foreign:
        raise DataError(
            f"{out}: holds files its manifest does not list ({foreign[:3]}); tierec replaces only its own shards: "
            "move them or give another directory"
        )
    return m


def _swap_in(tmp: Path, out: Path, old: Manifest | None) -> None:
    """Put the finished shard directory ``tmp`` at ``out``; then delete the old shard set's listed files."""
    if old is None:
        if out.exists():
            out.rmdir()  # empty (checked); rmdir refuses anything else
        os.replace(tmp, out)
        return
    aside = _sibling(out, "old")
    os.replace(out, aside)
    os.replace(tmp, out)
    _remove_listed(aside, old, also_partial=False)


def _remove_listed(d: Path, manifest: Manifest | None, also_partial: bool) -> None:
    """Delete the manifest and the shards it lists from ``d`` (and, for our own temporary directory, partial
    shards named like ours), then ``d`` itself if that left it empty. Nothing else is touched."""
    if not d.is_dir():
        return
    names = {MANIFEST} | ({x.file for s in manifest.splits.values() for x in s.shards} if manifest else set())
    for p in d.iterdir():
        if p.name in names or (also_partial and SHARD_NAME.fullmatch(p.name)):
            p.unlink(missing_ok=True)
    try:
        d.rmdir()
    except OSError:
        pass  # something not ours is in it: leave it


def _write_split(src: Any, out: Path, split: str, rows_per_shard: int, progress: bool) -> SplitInfo:
    from tqdm import tqdm

    info = SplitInfo()
    schema = arrow_schema(src.feature_names, src.n_dense, src.multi_hot)
    writer: ipc.RecordBatchFileWriter | None = None
    in_shard = 0
    bar = tqdm(total=src.num_rows, unit="rows", desc=f"preprocess {split}", disable=not progress, unit_scale=True)
    try:
        for block in src.row_blocks():
            a = 0
            while a < block.size:
                if writer is None:
                    name = f"{split}-{len(info.shards):05d}.arrow"
                    writer = ipc.new_file(str(out / name), schema)
                    info.shards.append(ShardInfo(name, 0))
                b = min(block.size, a + rows_per_shard - in_shard)
                writer.write_batch(to_record_batch(concat_slices([(block, a, b)]), schema))
                in_shard += b - a
                a = b
                if in_shard == rows_per_shard:
                    writer.close()
                    writer = None
                    info.shards[-1] = ShardInfo(info.shards[-1].file, in_shard)
                    in_shard = 0
            info.rows += block.size
            bar.update(block.size)
    finally:
        bar.close()
        if writer is not None:
            writer.close()
            info.shards[-1] = ShardInfo(info.shards[-1].file, in_shard)
    info.problems = src.problems
    return info
