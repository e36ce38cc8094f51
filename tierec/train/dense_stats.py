"""One pass over the head of the training split before the first step: the model's dense scaling
(tierec.models.scaling) and the first-order weights' counted rates (tierec.train.first_order_rates).

>>> from tierec.config import load_config
>>> from tierec.data import open_source
>>> from tierec.train.components import Components
>>> from tierec.train.dense_stats import fit_to_training_split
>>> cfg = load_config(None, ["data.synthetic.train_rows=4096", "data.dense_stats_rows=2048"])
>>> source = open_source(cfg.data, "train", 1024)
>>> parts = Components.build(cfg, source.feature_names, source.n_dense)
>>> fit_to_training_split(cfg, parts, source, print)
>>> float(parts.model.dense_scale.inv_std.min()) > 0
True
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from tierec.config import Config
from tierec.data import MalformedRowsWarning
from tierec.models.scaling import DenseStats
from tierec.train.first_order_rates import IdRates


def fit_to_training_split(cfg: Config, parts: Any, source: Any, echo: Callable[[str], None]) -> None:
    """Read the first ``data.dense_stats_rows`` rows of ``source`` (the training split, in the data's order;
    the first-order rates take the whole batches that hold them) once, for what needs them:

    - the mean and standard deviation of each dense column, into ``parts.model.dense_scale``
      (``data.dense_scaling``: "shrink" or "standard"); a constant column is named and dropped;
    - each id's rows and positives, where ``parts.wide`` holds first-order tables and
      ``model.first_order_init = "rates"``: their weights start from them (``parts.wide.set_weights``).
    """
    model = parts.model
    stats = DenseStats(model.n_dense) if cfg.data.dense_scaling != "none" and model.n_dense else None
    wide = parts.wide if cfg.model.first_order_init == "rates" else None
    rates = IdRates({t.name: tuple(t.features) for t in wide.tables}) if wide is not None else None
    if stats is None and rates is None:
        return
    limit = cfg.data.dense_stats_rows
    read = 0
    with warnings.catch_warnings():  # the training pass reports malformed rows; this one would say it twice
        warnings.simplefilter("ignore", MalformedRowsWarning)
        for batch in source:
            if stats is not None:
                stats.add(batch.dense if not limit else batch.dense[: limit - read])
            if rates is not None:
                rates.add(batch.sparse, batch.labels)
            read += batch.labels.shape[0]
            if limit and read >= limit:
                break
    if stats is not None:
        for i in model.dense_scale.fit(stats, mode=cfg.data.dense_scaling):
            echo(f"dense column {source.dense_names[i]!r} is constant in the training split ({float(stats.mean[i]):g}): dropped")
    if rates is not None:
        for table, (ids, weights) in rates.weights(n_features=len(wide.feature_names)).items():
            if ids.size:
                wide.set_weights(table, ids, weights)
