"""TableConfig: one logical embedding table, and building them from the config.

>>> from tierec.config import EmbeddingConfig
>>> from tierec.embedding.table import tables_from_config
>>> [t.name for t in tables_from_config(EmbeddingConfig(dim=8), ["C1", "C2"])]
['C1', 'C2']
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tierec.config import ConfigError, EmbeddingConfig, OptimizerConfig, Pooling


@dataclass(kw_only=True)
class TableConfig:
    name: str
    dim: int
    features: list[str]  # sparse features that look up this table
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    init_scale: float = 0.0  # new rows ~ U(-init_scale, init_scale); 0 = 1/sqrt(dim)
    pooling: Pooling = Pooling.SUM

    def __post_init__(self) -> None:
        if self.dim <= 0:
            raise ConfigError(f"table {self.name}: dim must be positive")
        if not self.features:
            raise ConfigError(f"table {self.name}: no features use it")
        if self.init_scale <= 0:
            self.init_scale = 1.0 / math.sqrt(self.dim)
        self.pooling = Pooling.parse(self.pooling)

    def group_key(self) -> tuple:
        """Tables with equal keys share one physical store (like a table-batched kernel)."""
        o = self.optimizer
        return (self.dim, o.kind, o.lr, o.eps, o.beta1, o.beta2, o.initial_accumulator, o.weight_decay)


def group_layout(tables: list[TableConfig]) -> tuple[int, OptimizerConfig]:
    """(dim, optimizer) of the tables of one group's storage; a ValueError unless they share both."""
    keys = {t.group_key() for t in tables}
    if len(keys) != 1:
        raise ValueError(f"tables of one group must share dim and optimizer, got {keys}")
    return tables[0].dim, tables[0].optimizer


def init_scales(tables: list[TableConfig]) -> np.ndarray:
    """[n_tables] float32: each table's init scale (its new rows ~ U(-scale, scale))."""
    return np.array([t.init_scale for t in tables], dtype=np.float32)


def tables_from_config(
    cfg: EmbeddingConfig, feature_names: list[str] | tuple[str, ...], *, dim: int | None = None, suffix: str = ""
) -> list[TableConfig]:
    """Tables named in ``cfg.tables`` first, then one table per remaining feature.

    ``dim`` overrides every table's dim (the dim-1 "wide" tables); ``suffix`` is
    appended to every table name.
    """
    claimed: dict[str, str] = {}
    tables = []
    for o in cfg.tables:
        feats = o.features or [o.name]
        for f in feats:
            if f not in feature_names:
                raise ConfigError(f"embedding table {o.name!r} names unknown feature {f!r}; features: {list(feature_names)}")
            if f in claimed:
                raise ConfigError(f"feature {f!r} is used by two tables: {claimed[f]!r} and {o.name!r}")
            claimed[f] = o.name
        tables.append(
            TableConfig(
                name=o.name + suffix,
                dim=dim or o.dim or cfg.dim,
                features=list(feats),
                optimizer=cfg.optimizer,
                init_scale=o.init_scale or cfg.init_scale,
                pooling=cfg.pooling,
            )
        )
    for f in feature_names:
        if f not in claimed:
            tables.append(
                TableConfig(
                    name=f + suffix,
                    dim=dim or cfg.dim,
                    features=[f],
                    optimizer=cfg.optimizer,
                    init_scale=cfg.init_scale,
                    pooling=cfg.pooling,
                )
            )
    return tables
