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

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from tierec.config import Config
from tierec.data import BackgroundLoader, BatchSource, open_source
from tierec.train.components import Components
from tierec.train.metrics import EvalAccumulator, auc


def _scores(cfg: Config, parts: Components, source: BatchSource, max_batches: int = 0):
    """Yield (logits [B], labels [B]) for every batch of ``source``, in order."""
    was_training = parts.model.training
    parts.train(False)
    try:
        with torch.no_grad(), BackgroundLoader(source, depth=cfg.data.prefetch_batches) as loader:
            for i, batch in enumerate(loader):
                if max_batches and i >= max_batches:
                    break
                batch = batch.to(cfg.train.device)
                yield parts.forward(batch).cpu(), batch.labels.cpu()
    finally:
        parts.train(was_training)


def evaluate(cfg: Config, parts: Components, split: str = "test") -> dict[str, float]:
    """AUC, logloss, row count and positive rate on a split of the configured data."""
    source = open_source(cfg.data, split, cfg.train.batch_size)
    acc = EvalAccumulator()
    for logits, labels in _scores(cfg, parts, source, cfg.train.eval_batches):
        acc.update(logits, labels)
    return acc.compute()


def predict(cfg: Config, parts: Components, split: str, out_path: str | Path) -> int:
    """Write one score (click probability) per row of ``split`` to ``out_path``; returns rows written.

    ``.parquet`` gets columns ``score`` and ``label``; anything else gets one
    probability per line.
    """
    source = open_source(cfg.data, split, cfg.train.batch_size)
    chunks, labels = [], []
    for logits, y in _scores(cfg, parts, source):
        chunks.append(torch.sigmoid(logits).numpy())
        labels.append(y.numpy())
    scores = np.concatenate(chunks) if chunks else np.empty(0, dtype=np.float32)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".parquet":
        table = pa.table({"score": scores, "label": np.concatenate(labels) if labels else scores})
        pq.write_table(table, out)
    else:
        np.savetxt(out, scores, fmt="%.6f")
    return int(scores.shape[0])


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
