"""``tierec export``: a checkpoint as a self-contained directory a scorer loads without the run.

::

    OUT/
      manifest.json             # tierec version, step, input schema, features, tables (tierec/serving/manifest.py)
      model.pt2                 # the dense model, torch.export (tierec/serving/program.py)
      tables/000-C1.safetensors # each table: ids ascending, rows (tierec/serving/table_file.py)
      tables/026-C1.wide.safetensors  # first-order (dim-1) tables, where the model has them

Rows are streamed out of the checkpoint a chunk file at a time, sorted per
chunk into run files, and merged into each table's file in id order
(tierec/serving/sorted_runs.py): RAM holds one chunk, then the merge's blocks
(``ExportConfig.merge_budget``), never a whole table. Pruned tables keep each
row at its own dims (the "ragged" layout). ``precision`` sets the rows' type:
fp32, fp16, or int8 row-wise (uint8 codes with a scale and bias per row,
tierec/serving/rows.py). The directory is written aside and renamed into place
(tierec/serving/publish.py). The embedding optimizer's state is not exported.

>>> import tempfile, pathlib
>>> from tierec.config import load_config
>>> from tierec.train.trainer import Trainer
>>> run = pathlib.Path(tempfile.mkdtemp())
>>> over = ["data.synthetic.train_rows=512", "data.synthetic.test_rows=256", "train.batch_size=256", "embedding.dim=4",
...         "train.progress=false", "train.plots=false"]
>>> _ = Trainer(load_config(None, over), run).fit()  # doctest: +ELLIPSIS
step 2: test auc ...
>>> m = export_checkpoint(run, run / "export")
>>> m.step, m.model, len(m.tables), m.tables[0].layout
(2, 'dlrm', 26, 'whole')
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch import Tensor

from tierec.config import Config, Pooling, from_dict, upgrade_saved
from tierec.embedding import tables_from_config
from tierec.embedding.table import TableConfig
from tierec.models import build_model, has_first_order
from tierec.paths import check_no_alias
from tierec.serving.inputs import input_schema
from tierec.serving.manifest import (
    MANIFEST_FILE,
    PRECISIONS,
    PROGRAM_FILE,
    TABLES_DIR,
    ExportError,
    ExportManifest,
    FeatureEntry,
    TableEntry,
)
from tierec.serving.program import save_program
from tierec.serving.publish import begin_export, publish_export
from tierec.serving.rows import VALUE_DTYPES, RowChunk, encode
from tierec.serving.sorted_runs import MERGE_BUDGET, RunWriter, merge_runs
from tierec.serving.table_file import TableFileWriter, TableShape
from tierec.train.checkpoint import Checkpoint, unflatten_state
from tierec.train.evaluate import run_checkpoint
from tierec.version import tierec_version


@dataclass(frozen=True, kw_only=True)
class ExportConfig:
    precision: str = "fp32"  # of the table rows: fp32 | fp16 | int8 (row-wise)
    merge_budget: int = MERGE_BUDGET  # bytes of sorted-run blocks the merge of one table holds at once

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ExportError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.merge_budget < 1 << 16:
            raise ExportError(f"the merge budget must be at least 64 KiB, got {self.merge_budget} bytes")


@dataclass(frozen=True)
class _Table:
    label: str  # the checkpoint's label of its rows: emb/<name> or wide/<name>
    config: TableConfig
    file: str


def export_checkpoint(checkpoint: str | os.PathLike, out: str | os.PathLike, cfg: ExportConfig = ExportConfig()) -> ExportManifest:
    """Export a checkpoint to the directory ``out``: a step directory, a checkpoints/ directory (its latest),
    or a run directory (its checkpoints/best when kept, else its latest)."""
    with Checkpoint(run_checkpoint(checkpoint)) as ckpt:  # checksums verified; held against pruning until done
        return _export(ckpt, Path(out), cfg)


def _export(ckpt: Checkpoint, out: Path, cfg: ExportConfig) -> ExportManifest:
    if ckpt.format < 2:
        raise ExportError(f"checkpoint {ckpt.path} has the old one-file format; resume and save it with this tierec first")
    check_no_alias(out, [ckpt.path.parent], "export --out", "checkpoints")  # never among the checkpoints
    run: Config = from_dict(Config, upgrade_saved(ckpt.meta["config"]))
    schema = input_schema(run.data)
    features, n_dense = schema.categorical, len(schema.dense)
    tables = [_Table(f"emb/{t.name}", t, "") for t in tables_from_config(run.embedding, features)]
    if has_first_order(run.model, n_dense):
        tables += [_Table(f"wide/{t.name}", t, "") for t in tables_from_config(run.embedding, features, dim=1, suffix=".wide")]
    tables = [_Table(t.label, t.config, f"{TABLES_DIR}/{i:03d}-{_slug(t.config.name)}.safetensors") for i, t in enumerate(tables)]
    dims = {t.config.dim for t in tables if t.label.startswith("emb/")}
    if len(dims) != 1:
        raise ExportError(f"the models need one embedding dim for all features, the run has {sorted(dims)}")
    dim = dims.pop()
    model = build_model(run.model, n_dense=n_dense, n_sparse=len(features), dim=dim)
    model.load_state_dict(model_state(ckpt.state(0), ckpt.meta))

    tmp = begin_export(Path(out))
    try:
        save_program(model, tmp / PROGRAM_FILE, n_dense=n_dense, n_sparse=len(features), dim=dim)
        entries = _write_tables(ckpt, tmp, tables, cfg)
        manifest = ExportManifest(
            tierec_version=tierec_version(),
            step=int(ckpt.meta.get("step", 0)),
            model=run.model.name,
            dense_precision=run.train.precision,
            precision=cfg.precision,
            program=PROGRAM_FILE,
            uses_wide=model.uses_wide,
            schema=schema,
            features=tuple(_feature(f, tables) for f in features),
            tables=tuple(entries),
            source_checkpoint=str(ckpt.path.resolve()),
        )
        _write_new(tmp / MANIFEST_FILE, manifest.to_json())
        publish_export(tmp, Path(out))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def model_state(tensors: dict[str, Tensor], meta: dict) -> dict[str, Tensor]:
    """The dense model's ``state_dict`` in a checkpoint (full or delta) whose rank-0 tensors and meta are given."""
    dense = {k: v for k, v in tensors.items() if "/" not in k}
    return unflatten_state(dense, meta["state"]["model"])


def _feature(name: str, tables: list[_Table]) -> FeatureEntry:
    emb = next(t.config for t in tables if t.label.startswith("emb/") and name in t.config.features)
    wide = next((t.config.name for t in tables if t.label.startswith("wide/") and name in t.config.features), None)
    return FeatureEntry(name=name, table=emb.name, wide_table=wide, mean=emb.pooling is Pooling.MEAN)


def _write_tables(ckpt: Checkpoint, tmp: Path, tables: list[_Table], cfg: ExportConfig) -> list[TableEntry]:
    """Each table's rows, sorted by id through run files, into its table file; returns their entries."""
    (tmp / TABLES_DIR).mkdir()
    runs_dir = tmp / "runs"
    runs_dir.mkdir()
    writers: dict[str, RunWriter] = {}
    ragged: set[str] = set()
    for i, t in enumerate(tables):
        (runs_dir / f"{i:03d}").mkdir()
        writers[t.label] = RunWriter(runs_dir / f"{i:03d}")
    by_label = {t.label: t for t in tables}
    for label, records in ckpt.rows():  # one chunk file in RAM at a time
        if label not in by_label:
            raise ExportError(f"checkpoint {ckpt.path} holds rows of {label!r}, a table its config does not have")
        chunk = records_chunk(records, by_label[label].config.dim)
        if "dims" in records:
            ragged.add(label)
        writers[label].add(encode(chunk, cfg.precision))
    entries = []
    for t in tables:
        w = writers[t.label]
        layout = "ragged" if t.label in ragged else "whole"
        shape = TableShape(table=t.config.name, dim=t.config.dim, layout=layout, precision=cfg.precision, rows=w.rows,
                           values=w.values)  # fmt: skip
        out = TableFileWriter(tmp / t.file, shape)
        try:
            for block in merge_runs(w.runs, VALUE_DTYPES[cfg.precision], cfg.merge_budget, t.config.dim):
                out.append(block)
        finally:
            out.close()
        for r in w.runs:
            r.path.unlink()
        entries.append(TableEntry(name=t.config.name, file=t.file, dim=t.config.dim, layout=layout, rows=w.rows))
    shutil.rmtree(runs_dir)
    return entries


def records_chunk(records: dict[str, Tensor], dim: int) -> RowChunk:
    """float32 rows of one checkpoint chunk: whole rows (``weights``) or pruned ones at their own dims."""
    ids = records["ids"].numpy().astype(np.int64, copy=False)
    if "weights" in records:
        w = records["weights"].numpy().astype(np.float32, copy=False).reshape(ids.shape[0], dim)
        return RowChunk(ids, np.full(ids.shape[0], dim, np.int64), w.reshape(-1))
    lens = records["dims"].numpy().astype(np.int64)
    return RowChunk(ids, lens, records["chunked.weights"].numpy().astype(np.float32, copy=False))


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64] or "table"


def _write_new(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
