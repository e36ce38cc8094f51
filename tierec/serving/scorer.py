"""Score rows of raw values with an export: ids as in training, pooled rows, the dense program.

``Scorer.load(DIR)`` reads an export (``tierec export``); ``score(rows)`` takes
rows as a list of records or a dict of columns, with the training file's
column names and raw values (a label column may be present or not), and
returns click probabilities in the rows' order. Per row: the raw values become
ids and dense features through the training reader (tierec/serving/inputs.py);
each feature's ids are looked up in its table (tierec/serving/tables.py: an id
the table does not hold reads as zeros, as in evaluation) and pooled as in
training (sum, or mean over the bag's ids); the first-order tables, where the
model has them, the same way; then the dense program (tierec/serving/program.py).
Tables are memory-mapped unless ``mmap=False``. A scorer never changes:
``tierec serve --follow`` (tierec/serving/follow.py) builds a new one, with
other tables and weights and its :class:`Origin`, for every publication of
the run it follows.

>>> import tempfile, pathlib
>>> from tierec.config import load_config
>>> from tierec.serving.export import export_checkpoint
>>> from tierec.train.trainer import Trainer
>>> run = pathlib.Path(tempfile.mkdtemp())
>>> over = ["data.synthetic.train_rows=512", "data.synthetic.test_rows=256", "train.batch_size=256", "embedding.dim=4",
...         "train.progress=false", "train.plots=false"]
>>> _ = Trainer(load_config(None, over), run).fit()  # doctest: +ELLIPSIS
step 2: test auc ...
>>> _ = export_checkpoint(run, run / "export")
>>> scorer = Scorer.load(run / "export")
>>> p = scorer.score([{"I1": 0.5, "C1": 17, "C2": 3}, {}])
>>> p.shape, bool(((p > 0) & (p < 1)).all())
((2,), True)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from tierec.data.blocks import RowBlock
from tierec.paths import safe_member
from tierec.serving.inputs import RowEncoder, Rows
from tierec.serving.manifest import MANIFEST_FILE, ExportError, ExportManifest
from tierec.serving.program import DenseProgram
from tierec.serving.tables import ServedTable


class Table(Protocol):
    """What scoring needs of a table: its dim, and rows by raw id (a ServedTable, or one with an overlay)."""

    dim: int

    def lookup(self, ids: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True, kw_only=True)
class Origin:
    """Where the served state comes from: an export, then what ``--follow`` took up of the run since."""

    export: str  # the export directory served
    export_step: int
    step: int  # the training step of the state served now
    checkpoint: str | None = None  # the run's full checkpoint taken up since the export (its directory name)
    delta: str | None = None  # the last delta checkpoint applied (its directory name)
    saved_at: float | None = None  # when training saved that publication (Unix time)
    applied_at: float | None = None  # when the server started serving it


class Scorer:
    def __init__(self, manifest: ExportManifest, program: DenseProgram, tables: dict[str, Table], path: Path,
                 origin: Origin | None = None) -> None:  # fmt: skip
        self.manifest = manifest
        self.program = program
        self.tables = tables
        self.path = path
        self.origin = origin or Origin(export=str(path), export_step=manifest.step, step=manifest.step)
        self.encoder = RowEncoder(manifest.schema)
        self.dim = tables[manifest.features[0].table].dim

    @staticmethod
    def load(path: str | os.PathLike, mmap: bool = True) -> Scorer:
        """The export in directory ``path``; ``mmap=False`` reads the tables into RAM."""
        path = Path(path)
        try:
            text = (path / MANIFEST_FILE).read_text()
        except OSError as e:
            raise ExportError(f"{path} is not a tierec export: cannot read its {MANIFEST_FILE} ({e.strerror or e})") from None
        manifest = ExportManifest.from_json(text, str(path / MANIFEST_FILE))
        program = DenseProgram.load(path / safe_member(manifest.program, str(path / MANIFEST_FILE)), manifest.dense_precision)
        tables: dict[str, Table] = {t.name: ServedTable.open(path, t, mmap=mmap) for t in manifest.tables}
        for f in manifest.features:
            manifest.table(f.table)
            if f.wide_table is not None:
                manifest.table(f.wide_table)
        return Scorer(manifest, program, tables, path)

    def score(self, rows: Rows) -> np.ndarray:
        """Click probabilities [n] float32 of ``rows`` (records or a dict of columns of raw values)."""
        return self.score_block(self.encoder.encode(rows))

    def score_block(self, block: RowBlock) -> np.ndarray:
        """Click probabilities [n] float32 of rows already turned into ids (a RowBlock in feature order)."""
        n = block.size
        if n == 0:
            return np.empty(0, np.float32)
        feats = self.manifest.features
        emb = np.empty((n, len(feats), self.dim), np.float32)  # [B, F, D]
        wide = np.zeros((n, len(feats)), np.float32)  # [B, F]
        one_hot = block.values.reshape(len(feats), n) if block.one_hot else None  # [F, B]: one id per bag
        for f, feat in enumerate(feats):
            ids, lens = (one_hot[f], None) if one_hot is not None else block.feature(f)
            emb[:, f] = _pool(self.tables[feat.table], ids, lens, n, feat.mean)
            if feat.wide_table is not None:
                wide[:, f] = _pool(self.tables[feat.wide_table], ids, lens, n, feat.mean)[:, 0]
        dense = torch.from_numpy(np.ascontiguousarray(block.dense, dtype=np.float32))
        logits = self.program(dense, torch.from_numpy(emb), torch.from_numpy(wide))
        return torch.sigmoid(logits).numpy()

    def updated(self, program: DenseProgram, tables: dict[str, Table], origin: Origin) -> Scorer:
        """A new scorer of the same export with other weights and tables (this one is left as it is)."""
        return Scorer(self.manifest, program, tables, self.path, origin)

    def describe(self) -> dict[str, object]:
        """What ``GET /version`` says: the export (path, step, tierec version, model, precision), the step served
        now, and the run's full checkpoint and last delta taken up since (``None``: none)."""
        m, o = self.manifest, self.origin
        delta = None if o.delta is None else {"name": o.delta, "step": o.step, "saved_at": o.saved_at, "applied_at": o.applied_at}
        return {"export": o.export, "tierec_version": m.tierec_version, "step": o.step, "export_step": o.export_step,
                "model": m.model, "precision": m.precision, "tables": len(m.tables), "checkpoint": o.checkpoint,
                "delta": delta}  # fmt: skip



def _pool(table: Table, ids: np.ndarray, lens: np.ndarray | None, n: int, mean: bool) -> np.ndarray:  # -> [B, D]
    """Each bag's rows pooled as training pools them: summed, then times 1 / len for mean (an empty bag is 0).
    ``lens`` None: one id per bag."""
    rows = table.lookup(np.ascontiguousarray(ids, dtype=np.int64))  # [N, D]
    if lens is None or (ids.shape[0] == n and bool((lens == 1).all())):
        return rows  # one id per row: its row, by sum or by mean alike
    bag = torch.from_numpy(np.repeat(np.arange(n), lens))
    out = torch.zeros(n, table.dim).index_add_(0, bag, torch.from_numpy(rows)).numpy()
    if mean:
        out *= (1.0 / np.maximum(lens, 1)).astype(np.float32)[:, None]
    return out
