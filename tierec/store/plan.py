"""StorePlan: which tables are tiered, in which store, with what sizes (``tierec.storage`` builds them).

Stores: every table without an entry in ``store.tables`` belongs to the
default store, whose ``memory_budget`` (and ``cache_size``, ``host_size``) is
split between its table groups (the main tables, the dim-1 wide tables, ...)
in proportion to their row sizes, so the whole run stays within the budget. A
table listed in ``store.tables`` gets a store of its own with its own sizes
(unset ones are taken from ``[store]``), or stays all in memory with
``enabled = false``.

Per store: ``cache_size`` defaults to a quarter of the budget, half of it with
fp32 cold rows and a disk tier (``cache_share``; 256 MiB without a budget);
``host_size`` to the rest of the budget (unbounded without one); the disk tier
exists when ``disk_path`` is set.

>>> from tierec.config import StoreConfig, EmbeddingConfig
>>> from tierec.embedding import tables_from_config
>>> from tierec.store.plan import StorePlan
>>> tables = tables_from_config(EmbeddingConfig(dim=15), ["a", "b"])  # 64-byte rows
>>> plan = StorePlan(StoreConfig(enabled=True, memory_budget="1MiB"), [tables])
>>> spec = plan.spec_for(plan.tables(tables))
>>> spec.cache_bytes, spec.host_bytes, spec.disk_dir
(262144, 786432, '')
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from tierec.config import Config, ConfigError, StoreConfig
from tierec.embedding.optimizers import state_shapes
from tierec.embedding.table import TableConfig, tables_from_config
from tierec.sizes import format_size, parse_size
from tierec.store.spec import TierSpec

DEFAULT_CACHE = 256 << 20  # bytes of fast tier when there is no budget to take a share of
DEFAULT_STORE = "default"
IN_MEMORY = "memory"
# store.prefetch: stage_share() of the budget holds the disk records read ahead (two windows), or what
# cache_size + host_size leave of it when both are given. fp32 records are 2.4x int8 ones at dim 16: an eighth
# held a whole window of int8 rows at 4x (8,233 of 8,388 disk rows per step read ahead) but not of fp32 ones,
# and a quarter gave fp32 1.14x the samples/s at 4x (0.223x -> 0.255x of memory) and 1.07x at 16x (0.112x ->
# 0.120x, on demand 0.118x): docs/performance.md, 2026-11-27. With a horizon, compact rows' windows at 3/8
# instead of 1/8 of the budget (the host tier gives it up) ran 1.27x as fast at 16x (37.0k -> 46.9k samples/s)
# and the same at 4x (79.8k -> 75.9k, 1/4: 77.3k, 7/16: 78.0k); fp32 rows' gained nothing past a quarter, nor
# did compact rows' without a horizon (4x: 69.8k -> 61.5k): docs/performance.md, 2026-12-06.
def stage_share(cold_precision: str, horizon: int = 0) -> tuple[float, float]:
    """(the windows' share of the budget, the most they take of what the fast tier leaves): (1/4, 1/2) with fp32
    cold rows; with bf16 or int8 ones (1/8, 1/2), or (3/8, 3/4) with a horizon."""
    if cold_precision == "fp32":
        return 0.25, 0.5
    return (0.375, 0.75) if horizon else (0.125, 0.5)


# The fast tier's default share: with fp32 cold rows a host row costs what a fast-tier row does, and the fast
# tier ranks rows better (a horizon's next uses, exact counts); half the budget gave 1.05x (4x) and 1.13x (16x) the
# samples/s of a quarter with a disk tier, three quarters 0.96x / 0.93x of a half (fewer disk reads, a longer
# eviction pass) with a horizon. Compact rows fit 2-4x more per byte in the host tier: a quarter was the fastest
# split at 4x int8 (57.7k against 55.5k at a half): docs/performance.md, 2026-12-06.
def cache_share(cold_precision: str, disk: bool) -> float:
    """The fast tier's share of ``memory_budget`` when ``cache_size`` is not given: 1/2 with fp32 cold rows and a
    disk tier, else 1/4."""
    return 0.5 if cold_precision == "fp32" and disk else 0.25


@dataclass(kw_only=True)
class StoredTable(TableConfig):
    """A TableConfig that names its store: tables of different stores never share a group."""

    store: str = DEFAULT_STORE

    def group_key(self) -> tuple:
        return (*super().group_key(), self.store)


def record_bytes(t: TableConfig) -> int:
    """Bytes of one row: weights and optimizer state."""
    shapes = state_shapes(t.optimizer.kind, t.dim)
    return 4 * (t.dim + sum(int(np.prod(s, dtype=np.int64)) for s in shapes.values()))


class StorePlan:
    def __init__(self, cfg: StoreConfig, collections: list[list[TableConfig]]) -> None:
        """``collections``: the tables of every collection the run builds (for the budget split)."""
        self.cfg = cfg
        self.read_ahead = cfg.prefetch  # the windows read ahead get their share of the budget (whole rows or chunks)
        self.enabled = cfg.enabled
        self._override = {o.name: o for o in cfg.tables}
        known = {t.name for ts in collections for t in ts}
        unknown = sorted(set(self._override) - known)
        if self.enabled and unknown:
            raise ConfigError(f"store.tables names unknown tables {unknown}; tables: {sorted(known)}")
        # Share of the default store per table: its row bytes over all default tables' row bytes.
        default = [t for ts in collections for t in ts if t.name not in self._override]
        self._default_weight = float(sum(record_bytes(t) for t in default)) or 1.0

    @classmethod
    def for_run(cls, cfg: Config, feature_names: list[str] | tuple[str, ...], n_dense: int) -> StorePlan:
        """The plan of a training run: its main tables, and the dim-1 wide tables when the model has them."""
        from tierec.models import has_first_order

        if cfg.store.enabled and cfg.prune.enabled:
            _check_with_pruning(cfg.store)
        collections = [tables_from_config(cfg.embedding, feature_names)]
        if has_first_order(cfg.model, n_dense):
            collections.append(tables_from_config(cfg.embedding, feature_names, dim=1, suffix=".wide"))
        return cls(cfg.store, collections)

    def tables(self, tables: list[TableConfig]) -> list[TableConfig]:
        """The tables tagged with their store (unchanged when tiering is off)."""
        if not self.enabled:
            return tables
        out = []
        for t in tables:
            o = self._override.get(t.name)
            store = DEFAULT_STORE if o is None else (t.name if o.enabled else IN_MEMORY)
            out.append(StoredTable(**{f.name: getattr(t, f.name) for f in dataclasses.fields(t)}, store=store))
        return out

    def tiered(self, tables: list[TableConfig]) -> bool:
        """Whether the group holding ``tables`` (as tagged by :meth:`tables`) lives in the tiers."""
        return self.enabled and getattr(tables[0], "store", DEFAULT_STORE) != IN_MEMORY

    def spec_for(self, tables: list[TableConfig]) -> TierSpec:
        """The resolved TierSpec of the group holding ``tables``."""
        cfg = self.cfg
        store = getattr(tables[0], "store", DEFAULT_STORE)
        o = self._override.get(store) if store != DEFAULT_STORE else None
        share = 1.0 if o is not None else sum(record_bytes(t) for t in tables) / self._default_weight
        where = "store" if o is None else f"store.tables[{store}]"

        def pick(key: str) -> int | None:
            text = getattr(o, key) if o is not None and getattr(o, key) != "" else getattr(cfg, key)
            return parse_size(text, f"{where}.{key}")

        budget, cache, host = pick("memory_budget"), pick("cache_size"), pick("host_size")
        if budget == 0:
            raise ConfigError(f"{where}.memory_budget is 0: the tiers need room for some rows; give a size "
                              "(e.g. '256MiB'), or \"\" for no bound")
        row = max(record_bytes(t) for t in tables)
        disk = (o.disk_path if o is not None and o.disk_path else cfg.disk_path) or ""
        part = cache_share(cfg.cold_precision, bool(disk))
        part_text = "a half" if part == 0.5 else "a quarter"
        if cache is None and budget is not None and int(int(budget * part) * share) < row:
            raise ConfigError(f"{where}.memory_budget {format_size(budget)} is too small: its fast tier ({part_text}, "
                              f"{format_size(int(int(budget * part) * share))} for these tables) holds no row of {row} bytes")
        given_cache = cache is not None or budget is None
        if cache is None:
            cache = int(budget * part) if budget is not None else DEFAULT_CACHE
        stage = None  # bytes of disk records read ahead (store.prefetch): part of the budget
        if budget is not None:
            if cache > budget:
                raise ConfigError(f"{where}: cache_size ({cache} B) exceeds memory_budget ({budget} B)")
            if self.read_ahead and disk:
                if host is None:  # its share, but never more than a part of what the fast tier leaves
                    part, most = stage_share(cfg.cold_precision, cfg.horizon)
                    stage = min(int(budget * part), int(max(budget - cache, 0) * most))
                else:
                    stage = budget - cache - host
            if host is None:
                host = budget - cache - (stage or 0)
            elif cache + host > budget:
                raise ConfigError(f"{where}: cache_size + host_size ({cache + host} B) exceed memory_budget ({budget} B)")
            if stage is not None:
                stage = max(stage, 0)  # cache_size + host_size given: the rest (none: no reading ahead)
        if host == 0 and not disk:
            raise ConfigError(f"{where}: host_size is 0 and there is no disk_path: rows would have nowhere to go")

        def policy(key: str) -> int:
            v = getattr(o, key) if o is not None else -1
            return v if v >= 0 else getattr(cfg, key)

        return TierSpec(
            cache_bytes=max(int(cache * share), 1),
            host_bytes=None if host is None else int(host * share),
            disk_dir=disk,
            cache_policy=cfg.cache_policy,
            interval=cfg.interval,
            decay=cfg.decay,
            promote_max=cfg.promote_max,
            admit_after=policy("admit_after"),
            admit_probability=cfg.admit_probability,
            max_rows=policy("max_rows"),
            ttl_steps=policy("ttl_steps"),
            sketch_width=cfg.sketch_width,
            sketch_depth=cfg.sketch_depth,
            io_threads=cfg.io_threads,
            io_engine=cfg.io_engine,
            drop_page_cache=cfg.drop_page_cache,
            disk_max_ratio=cfg.disk_max_ratio,
            cache_key=f"{where}.cache_size" + ("" if given_cache else f" ({part_text} of {where}.memory_budget unless set)"),
            cold_precision=cfg.cold_precision,
            stage_bytes=None if stage is None else int(stage * share),
            in_flight=2 if cfg.lookup_ahead else 1,
            horizon=cfg.horizon if disk else 0,  # ranks what leaves memory for disk: nothing to rank without one
        )


def _check_with_pruning(cfg: StoreConfig) -> None:
    """With pruning the tiers hold chunks, not rows: the row-level policies do not apply."""
    per_table = [(f"store.tables[{t.name}].{k}", getattr(t, k)) for t in cfg.tables for k in ("admit_after", "max_rows", "ttl_steps")]
    row_policies = [("store.admit_after", cfg.admit_after), ("store.max_rows", cfg.max_rows), ("store.ttl_steps", cfg.ttl_steps)]
    used = [k for k, v in row_policies + per_table if v > 0] + (["store.admit_probability"] if cfg.admit_probability < 1.0 else [])
    if used:
        raise ConfigError(
            f"{used} act on whole rows, but with prune.enabled the tiers hold chunks of rows: "
            "turn them off (pruning itself forgets rows pruned to no dims: prune.evict_empty_rows)"
        )
    if cfg.cold_precision != "fp32":
        raise ConfigError("store.cold_precision other than fp32 does not cover pruned tables: set it to fp32 or prune.enabled = false")
