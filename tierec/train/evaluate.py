"""Evaluation and prediction with trained components.

Evaluation never changes training state: tables are in eval mode (unknown ids
read as zeros and are not inserted) and no gradient is taken.

>>> from tierec.config import load_config
>>> from tierec.train.components import Components
>>> from tierec.train.evaluate import evaluate
>>> cfg = load_config(None, ["data.synthetic.test_rows=512", "train.batch_size=256"])
>>> parts = Components.build(cfg, [f"C{i}" for i in range(1, 27)], n_dense=13)
>>> sorted(evaluate(cfg, parts))
['auc', 'logloss', 'positive_rate', 'rows']
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import torch

from tierec.config import Config, DataConfig
from tierec.data import BackgroundLoader, BatchSource, DataError, Dataset, open_dataset, open_source, prefetch
from tierec.device import is_host
from tierec.data.blocks import to_batch
from tierec.data.keys import read_key_columns
from tierec.train.components import Components
from tierec.train.metrics import EvalAccumulator, auc


def _scores(cfg: Config, parts: Components, source: BatchSource, max_batches: int = 0):
    """Yield (logits [B], labels [B]) for every batch of ``source``, in order."""
    was_training = parts.model.training
    parts.train(False)
    try:
        with torch.no_grad(), BackgroundLoader(source, depth=cfg.data.prefetch_batches, pin=not is_host(cfg.train.device)) as loader:
            for i, batch in enumerate(loader):
                if max_batches and i >= max_batches:
                    break
                batch = batch.to(cfg.train.device)
                yield parts.forward(batch).cpu(), batch.labels.cpu()
    finally:
        parts.train(was_training)


BEST_DIR = "best"  # checkpoints/best: the checkpoint with the best validation AUC


def run_checkpoint(path: str | Path, last: bool = False) -> str:
    """A run directory means its checkpoints/; there, checkpoints/best unless ``last`` (or there is none).
    A checkpoints/ directory or one checkpoint is taken as it is."""
    p = Path(path)
    if (p / "checkpoints").is_dir():
        p = p / "checkpoints"
    if not last and (p / BEST_DIR).is_dir():
        p = p / BEST_DIR
    return str(p)


def has_validation(cfg: DataConfig) -> bool:
    """Whether the data has a validation split (by the config alone; shards: their manifest; a followed directory:
    none, every row of its files trains)."""
    if cfg.follow:
        return False
    if cfg.source == "synthetic" or cfg.format == "synthetic":
        return cfg.synthetic.validation_rows > 0
    if cfg.format == "shards" or Path(cfg.source).is_dir():
        from tierec.data import ShardSet

        return "validation" in ShardSet.open(cfg.source).manifest.splits
    return cfg.validation_rows > 0 or cfg.validation_fraction > 0


def with_validation(cfg: Config) -> Config:
    """``cfg`` with a validation split when periodic evaluations need one and none is configured:
    10% of a file, or as many synthetic rows as the test split (the run's config.toml records it)."""
    if not cfg.train.eval_every or cfg.data.follow or has_validation(cfg.data):
        return cfg  # (a followed directory is evaluated on data.test_source)
    if cfg.data.source == "synthetic" or cfg.data.format == "synthetic":
        synthetic = dataclasses.replace(cfg.data.synthetic, validation_rows=cfg.data.synthetic.test_rows)
        return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, synthetic=synthetic))
    if cfg.data.format == "shards" or Path(cfg.data.source).is_dir():
        return cfg  # shards keep the splits they were written with
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, validation_fraction=0.1))


class UndefinedMetricError(DataError):
    """An evaluation with no rows or one class only: its AUC is undefined (a user error, exit status 2)."""


def require_defined(result: dict[str, float], what: str) -> None:
    """Raise UndefinedMetricError (one line) when ``result`` has no rows or an undefined AUC."""
    if not result["rows"]:
        raise UndefinedMetricError(f"{what} has no well-formed rows, so it has no AUC (see the warning above; check data.test_rows / data.test_fraction)")
    if math.isnan(result["auc"]):
        rate = result["positive_rate"]
        raise UndefinedMetricError(
            f"{what} has {result['rows']} rows with positive rate {rate:.3f}: one class only, so its AUC is undefined "
            "(a larger test split, or data.schema.label_threshold for labels that are not 0/1)"
        )


def evaluate(cfg: Config, parts: Components, split: str = "test", data: Dataset | None = None) -> dict[str, float]:
    """AUC, logloss, row count and positive rate on a split of the configured data (``data``: that data, already open)."""
    source = (data or open_dataset(cfg.data)).source(split, cfg.train.batch_size)
    acc = EvalAccumulator()
    for logits, labels in _scores(cfg, parts, source, cfg.train.eval_batches):
        acc.update(logits, labels)
    return acc.compute()


def predict(cfg: Config, parts: Components, split: str, out_path: str | Path, keys: list[str] | tuple[str, ...] = ()) -> int:
    """Score every well-formed row of ``split``; write the scores beside each row's key; returns rows written.

    The file may lack its label column (new data). Columns written: the ``keys``
    columns of the file as it has them, or else ``row`` (the 0-based data row,
    header excluded; for shards and synthetic data the row's position in the
    split), then ``score`` (click probability), then ``label`` when the file has
    labels. ``.parquet`` writes Parquet, ``.tsv`` tab-separated text, anything
    else CSV with a header line.
    """
    source = open_source(cfg.data, split, cfg.train.batch_size, label_optional=True)
    scores, labels, rows = [], [], []
    seen = 0
    was_training = parts.model.training
    parts.train(False)
    try:
        with torch.no_grad():
            for block in prefetch(source.row_blocks, depth=cfg.data.prefetch_batches, name="tierec-predict"):
                batch = to_batch(block, source.feature_names).to(cfg.train.device)
                scores.append(torch.sigmoid(parts.forward(batch)).cpu().numpy())
                labels.append(block.labels)
                rows.append(block.rows if block.rows is not None else np.arange(seen, seen + block.size, dtype=np.int64))
                seen += block.size
    finally:
        parts.train(was_training)
    score = np.concatenate(scores) if scores else np.empty(0, np.float32)
    row = np.concatenate(rows) if rows else np.empty(0, np.int64)
    columns: dict[str, pa.Array] = dict(read_key_columns(cfg.data, list(keys), row)) if keys else {"row": pa.array(row)}
    columns["score"] = pa.array(score)
    if source.labeled:
        columns["label"] = pa.array(np.concatenate(labels) if labels else score)
    write_table(pa.table(columns), out_path)
    return int(score.shape[0])


def write_table(table: pa.Table, out_path: str | Path) -> None:
    """Parquet for ``.parquet``, tab-separated for ``.tsv``, else CSV with a header."""
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() in (".parquet", ".pq"):
        pq.write_table(table, out)
    else:
        delimiter = "\t" if out.suffix.lower() == ".tsv" else ","
        pacsv.write_csv(table, out, write_options=pacsv.WriteOptions(delimiter=delimiter, quoting_style="needed"))


def planted_auc(cfg: Config, rows: int) -> float:
    """AUC of the synthetic data's own planted model on the same test rows."""
    from tierec.data import PlantedModel, planted_logits

    model = PlantedModel.from_config(cfg.data.synthetic)
    source = open_source(cfg.data, "test", cfg.train.batch_size)
    scores, labels, seen = [], [], 0
    for batch in source:
        if seen >= rows:
            break
        scores.append(planted_logits(model, batch))
        labels.append(batch.labels)
        seen += batch.size
    return auc(torch.cat(scores)[:rows], torch.cat(labels)[:rows])
