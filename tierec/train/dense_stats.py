"""Fitting the model's dense scaling (tierec.models.scaling) to the training split, before the first step.

>>> from tierec.config import load_config
>>> from tierec.data import open_source
>>> from tierec.train.components import Components
>>> from tierec.train.dense_stats import fit_dense_scaling
>>> cfg = load_config(None, ["data.synthetic.train_rows=4096", "data.dense_stats_rows=2048"])
>>> source = open_source(cfg.data, "train", 1024)
>>> parts = Components.build(cfg, source.feature_names, source.n_dense)
>>> fit_dense_scaling(cfg, parts.model, source, print)
>>> float(parts.model.dense_scale.inv_std.min()) > 0
True
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from tierec.config import Config
from tierec.data import MalformedRowsWarning
from tierec.models.base import CTRModel
from tierec.models.scaling import DenseStats


def fit_dense_scaling(cfg: Config, model: CTRModel, source: Any, echo: Callable[[str], None]) -> None:
    """Mean and standard deviation of each dense column over the first ``data.dense_stats_rows`` rows of
    ``source`` (the training split, in the data's order), into ``model.dense_scale`` (``data.dense_scaling``:
    "shrink" or "standard"); a constant column is named and dropped."""
    if cfg.data.dense_scaling == "none" or model.n_dense == 0:
        return
    stats = DenseStats(model.n_dense)
    limit = cfg.data.dense_stats_rows
    with warnings.catch_warnings():  # the training pass reports malformed rows; this one would say it twice
        warnings.simplefilter("ignore", MalformedRowsWarning)
        for batch in source:
            stats.add(batch.dense if not limit else batch.dense[: limit - stats.count])
            if limit and stats.count >= limit:
                break
    for i in model.dense_scale.fit(stats, mode=cfg.data.dense_scaling):
        echo(f"dense column {source.dense_names[i]!r} is constant in the training split ({float(stats.mean[i]):g}): dropped")
