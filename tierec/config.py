"""Typed configuration: dataclasses loaded from TOML, with ``a.b=c`` overrides.

Unknown keys are errors that name the key and list the valid ones.

>>> from tierec.config import load_config
>>> cfg = load_config(None, ["model.name=deepfm", "train.batch_size=512"])
>>> cfg.model.name, cfg.train.batch_size
('deepfm', 512)
"""

from __future__ import annotations

import dataclasses
import enum
import math
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_FORMAT = 2  # see Config.format

from tierec.data_config import DataConfig, SchemaConfig, SyntheticConfig  # the [data] section, re-exported
from tierec.errors import ConfigError  # re-exported: tierec.config.ConfigError


def _positive_rate(value: float, key: str) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{key} must be positive and finite, got {value}")


class StrEnum(str, enum.Enum):
    @classmethod
    def parse(cls, value: str | StrEnum) -> Any:
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise ConfigError(f"{value!r} is not a valid {cls.__name__}; choose one of {[m.value for m in cls]}") from None


class OptimizerKind(StrEnum):
    SGD = "sgd"
    ADAGRAD = "adagrad"
    ROWWISE_ADAGRAD = "rowwise_adagrad"
    ADAM = "adam"


class ColdPrecision(StrEnum):
    """How rows are stored in the cold tiers (host DRAM, disk); the fast tier is always fp32."""

    FP32 = "fp32"
    BF16 = "bf16"
    INT8 = "int8"


class Pooling(StrEnum):
    SUM = "sum"
    MEAN = "mean"




# ------------------------------------------------------------------------ embedding


@dataclass(kw_only=True)
class OptimizerConfig:
    kind: OptimizerKind = OptimizerKind.ROWWISE_ADAGRAD  # sgd | adagrad | rowwise_adagrad | adam: the sparse optimizer, fused into the backward
    lr: float = 0.05  # learning rate of the embedding rows
    eps: float = 1e-8  # added to the Adagrad / Adam denominator
    beta1: float = 0.9  # adam
    beta2: float = 0.999  # adam
    initial_accumulator: float = 0.0  # adagrad variants
    weight_decay: float = 0.0  # L2 penalty added to each updated row's gradient

    def __post_init__(self) -> None:
        self.kind = OptimizerKind.parse(self.kind)
        _positive_rate(self.lr, "embedding.optimizer.lr")
        if not (math.isfinite(self.eps) and self.eps >= 0):
            raise ConfigError(f"embedding.optimizer.eps must be a finite number >= 0, got {self.eps}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError(f"embedding.optimizer.weight_decay must be a finite number >= 0, got {self.weight_decay}")


@dataclass(kw_only=True)
class TableOverride:
    """Per-table settings; tables not listed use the embedding defaults."""

    name: str  # the table (a feature's table is named after the feature)
    features: list[str] = field(default_factory=list)  # default: the feature of the same name
    dim: int = 0  # 0 = embedding.dim
    init_scale: float = 0.0  # 0 = embedding.init_scale


@dataclass(kw_only=True)
class EmbeddingConfig:
    dim: int = 16  # embedding width of every table (tables may override it)
    pooling: Pooling = Pooling.SUM  # sum | mean: how a multi-valued feature's ids are pooled
    # New rows are drawn uniformly from [-init_scale, init_scale]; 0 picks 1/sqrt(dim).
    init_scale: float = 0.0
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    tables: list[TableOverride] = field(default_factory=list)  # per-table overrides ([[embedding.tables]] name = ..., dim, init_scale, ...)

    def __post_init__(self) -> None:
        self.pooling = Pooling.parse(self.pooling)
        if self.dim <= 0:
            raise ConfigError("embedding.dim must be positive")


# ---------------------------------------------------------------------------- model


MODEL_NAMES = ("dlrm", "deepfm", "dcnv2", "widedeep")  # model.name's values


@dataclass(kw_only=True)
class ModelConfig:
    name: str = "dlrm"  # dlrm | deepfm | dcnv2 | widedeep
    bottom_mlp: list[int] = field(default_factory=lambda: [64, 32])  # dlrm; last layer is projected to embedding.dim
    top_mlp: list[int] = field(default_factory=lambda: [64, 32])  # dlrm: the MLP over the interactions
    # deepfm, widedeep, dcnv2: the deep tower over [dense, flattened embeddings]. Wider than
    # DLRM's top MLP: it must learn feature interactions from a flat input by itself.
    deep_mlp: list[int] = field(default_factory=lambda: [256, 128])
    cross_layers: int = 2  # dcnv2
    cross_rank: int = 0  # dcnv2 low-rank cross; 0 = full rank
    dropout: float = 0.0  # dropout rate of the MLPs
    # First-order terms: a per-id bias (dim-1 table per feature, summed into the logit). deepfm and widedeep
    # have them by design; dlrm and dcnv2 get them with "on" (with dense features, also a linear term on them, from
    # 0), or with "auto" when the data has no dense features (id-only data). Never pruned.
    first_order: str = "auto"  # auto | on | off
    # The first-order tables learn at the embedding optimizer's lr times this (a bias is one number in logit
    # units, an embedding value one of dim small ones; `tierec train` picks 5 below 65,536 training rows (10 on id
    # columns only), for logs with sampled negatives of 204,800-2,047,999, and from 65,536 rows for the tables dlrm
    # and dcnv2 get on id columns).
    first_order_lr_scale: float = 1.0
    # Where the first-order weights start: "rates" = each id's positive rate in the head of the training split
    # (the rows data.dense_stats_rows reads), smoothed by 10 rows at the rate of the ids seen about as often (its
    # frequency class, floor(log2 rows); tierec/train/first_order_rates.py), as log-odds over
    # the base rate divided by the number of first-order features (a model starts where item popularity ends;
    # `tierec train` picks it below 65,536 training rows and for logs with sampled negatives of 204,800-2,047,999);
    # "zeros" = at 0. A resumed run takes them from its checkpoint.
    first_order_init: str = "zeros"  # zeros | rates

    def __post_init__(self) -> None:
        if self.name not in MODEL_NAMES:
            raise ConfigError(f"model.name {self.name!r} is not one of {sorted(MODEL_NAMES)}")
        for key in ("bottom_mlp", "top_mlp", "deep_mlp"):
            sizes = getattr(self, key)
            if any(s <= 0 for s in sizes):
                raise ConfigError(f"model.{key} layer sizes must be positive, got {sizes}")
        if self.cross_layers < 0 or self.cross_rank < 0:
            raise ConfigError("model.cross_layers and model.cross_rank must be >= 0")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.first_order not in {"auto", "on", "off"}:
            raise ConfigError(f"model.first_order {self.first_order!r} is not one of auto, on, off")
        if self.first_order == "off" and self.name in {"deepfm", "widedeep"}:
            raise ConfigError(f"model.first_order = \"off\" does not apply to {self.name}: its first-order terms are part of it")
        _positive_rate(self.first_order_lr_scale, "model.first_order_lr_scale")
        if self.first_order_init not in {"rates", "zeros"}:
            raise ConfigError(f"model.first_order_init {self.first_order_init!r} is not one of zeros, rates")


# ---------------------------------------------------------------------------- train


@dataclass(kw_only=True)
class TrainConfig:
    batch_size: int = 2048  # samples per training step (size-chosen for small files when unset: tierec train --help)
    epochs: int = 1  # passes over the training split
    max_steps: int = 0  # 0 = run the epochs
    dense_optimizer: str = "adam"  # adam | adagrad | sgd
    dense_lr: float = 5e-3  # learning rate of the dense model's optimizer
    # Evaluations every eval_every steps (0 = only at the end) use the validation split when there is one
    # (see data.validation_*); the model with the best validation AUC is kept in checkpoints/best, which
    # `eval` and `predict` use, and the test split is evaluated at the end on it.
    eval_every: int = 0
    early_stop_patience: int = 0  # stop after this many evaluations without a better validation AUC; 0 = never
    eval_batches: int = 0  # 0 = the whole split
    checkpoint_every: int = 0  # steps; 0 = only at the end
    # Every delta_every steps between full checkpoints, publish a delta checkpoint (checkpoints/delta_<step>_of_<base>):
    # only the rows changed and the ids deleted since the last publication, plus the small dense state;
    # --resume restores the newest full checkpoint plus its deltas (tierec/train/delta.py). 0 = off.
    # Any storage (plain, tiered, pruned), on 1 or several processes; not with a lossy store.cold_precision
    # nor on a mesh of groups (dist.group_size).
    delta_every: int = 0
    seed: int = 0  # seed of the initialisation, the data order and dropout
    # torch intra-op threads; 0 = torch's default (every core), less one while tiers with compact cold rows look
    # the next batch up ahead (store.lookup_ahead on one process): that lookup and the read-ahead stage get a core
    # (store.leave_core)
    threads: int = 0
    progress: bool = True  # a progress bar (a line every 30 s when stderr is not a terminal)
    device: str = "cpu"  # cpu | cuda | cuda:N: where the dense model runs (and the rows that can: docs/gpu.md)
    # A NaN or infinite training loss: "stop" ends the run with an error (its last checkpoint
    # stays, so it can be resumed, e.g. with a lower rate); "continue" trains on.
    nan_policy: str = "stop"
    # The dense model's arithmetic (tierec/train/precision.py): auto = bf16 autocast where the
    # device computes bf16 natively, fp32 elsewhere; tables and all optimizer state stay fp32.
    precision: str = "auto"  # auto | fp32 | bf16
    compile: str = "auto"  # torch.compile the dense model: auto | on | off
    # One process: the next batch's dedupe and index probe run on a background thread while
    # this step trains (tierec/embedding/ahead.py); the same numbers either way. Off by default:
    # on 2 cores the extra thread slowed the step (docs/performance.md, "The whole training step").
    look_ahead: bool = False
    # At the end of `tierec train`, PNG plots of loss, AUC, samples/s, embedding rows and bytes (and the store's
    # hit rate) in the run directory (`tierec report RUN_DIR` draws them again).
    plots: bool = True
    # TensorBoard event files of the metrics in <run_dir>/tensorboard; needs the tensorboard package
    # (pip install 'tierec[tensorboard]').
    tensorboard: bool = False

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise ConfigError("train.batch_size must be positive")
        if self.eval_every < 0 or self.early_stop_patience < 0:
            raise ConfigError("train.eval_every and train.early_stop_patience must be >= 0")
        if self.early_stop_patience and not self.eval_every:
            raise ConfigError("train.early_stop_patience counts evaluations: set train.eval_every too")
        if self.epochs <= 0:
            raise ConfigError(f"train.epochs must be >= 1, got {self.epochs}")
        for key in ("max_steps", "eval_every", "eval_batches", "checkpoint_every", "delta_every", "threads"):
            if getattr(self, key) < 0:
                raise ConfigError(f"train.{key} must be >= 0, got {getattr(self, key)}")
        _positive_rate(self.dense_lr, "train.dense_lr")
        if self.nan_policy not in {"stop", "continue"}:
            raise ConfigError(f"train.nan_policy {self.nan_policy!r} is not one of stop, continue")
        if self.precision not in {"auto", "fp32", "bf16"}:
            raise ConfigError(f"train.precision {self.precision!r} is not one of auto, fp32, bf16")
        if self.compile not in {"auto", "on", "off"}:
            raise ConfigError(f"train.compile {self.compile!r} is not one of auto, on, off")
        if self.dense_optimizer not in {"adam", "adagrad", "sgd"}:
            raise ConfigError(f"train.dense_optimizer {self.dense_optimizer!r} is not one of adam, adagrad, sgd")


# ------------------------------------------------- tiers, pruning, distribution


@dataclass(kw_only=True)
class StoreTableConfig:
    """Tier settings of one table (by name): it gets a store of its own. Empty / -1 = as in [store]."""

    name: str  # the table
    enabled: bool = True  # false: this table stays all in memory
    memory_budget: str | int = ""  # "" = store.memory_budget
    cache_size: str | int = ""  # "" = store.cache_size
    host_size: str | int = ""  # "" = store.host_size
    disk_path: str = ""  # "" = store.disk_path
    max_rows: int = -1  # -1 = store.max_rows
    ttl_steps: int = -1  # -1 = store.ttl_steps
    admit_after: int = -1  # -1 = store.admit_after


@dataclass(kw_only=True)
class StoreConfig:
    """Tiered storage of embedding rows (fast cache / host DRAM / disk); off by default.

    Sizes are bytes or human sizes ("2GiB", "512MB"). ``memory_budget`` bounds the
    rows held in RAM (fast tier + host tier) of all tables without their own
    entry in ``tables``, split between the table groups by row size; the
    directory of ids (about 21 bytes per id, docs/scale.md) comes on top. A table that outgrows
    its budget spills to ``disk_path``. See tierec/store/ and docs/performance.md.

    ``cold_precision`` stores rows in the host and disk tiers compactly (tierec/store/codec.py):
    "bf16" (about 2x the rows per byte), "int8" (row-wise int8 weights: about 2.4x at dim 16,
    3.4x at dim 64; below about 12 dims it saves nothing over bf16 and is bf16), with stochastic
    rounding when a row leaves the fast tier; the fast tier
    and all arithmetic stay fp32, and the host tier's bytes count the compact records. Numbers
    then depend on which rows were in the fast tier when (always the same for one config, with or
    without ``prefetch``), so ``prune.enabled`` is refused with it; resume from a checkpoint is
    exact (same store sizes).

    ``prefetch`` reads the disk rows (pruned tables: the rows' chunks) of the next window of up to
    ``prefetch_depth`` batches on the disk tier's read-ahead threads while the current window computes (tierec/store/pipeline.py;
    windows get shorter while their rows do not fit in their share of the budget); it changes no
    number.

    ``lookup_ahead`` (one process): the next batch's lookup in the tiers (rows brought up from host and
    disk, evictions and write-backs) runs on a pipeline thread while the current step computes
    (tierec/train/pipeline.py, stage 3); it changes no number.

    ``horizon`` (with a disk tier): the pipeline holds the next ``horizon`` batches and shows each store
    their ids; rows they use leave memory last, the farthest next use first (tierec/store/horizon.py).
    The batches held come on top of ``memory_budget`` (as the loader's do), the bookkeeping is 8 bytes
    per row. With fp32 cold rows it changes no number; with compact ones the numbers depend on it (the
    same with or without ``prefetch``). Pruned tables' chunk stores do not use it.
    """

    enabled: bool = False  # tier the tables (fast cache / host DRAM / disk)
    memory_budget: str | int = ""  # "" = unbounded (no spilling)
    cache_size: str | int = ""  # fast tier; "" = a quarter of memory_budget (a half with fp32 cold_precision and a disk_path), or 256MiB without a budget
    host_size: str | int = ""  # host DRAM tier; "" = the rest of memory_budget (unbounded without one); "0" = none
    disk_path: str = ""  # directory of the disk tier's (unlinked) files; "" = no disk tier
    cache_policy: str = "lfu"  # lfu (decayed access counts) | lru
    interval: int = 100  # training steps between hotness passes (decay, deletion, placement)
    decay: float = 0.9  # access counts are multiplied by this at every pass
    promote_max: int = 0  # rows moved up per pass by hotness (0 = only on demand)
    admit_after: int = 0  # admission: an id gets its own row at its K-th sighting (0 = at once)
    admit_probability: float = 1.0  # ... or with this probability per sighting
    max_rows: int = 0  # eviction: least-used rows are deleted beyond this many per store (0 = off)
    ttl_steps: int = 0  # eviction: rows unseen for this many steps are deleted (0 = off)
    sketch_width: int = 1 << 20  # count-min sketch of ids not admitted yet (counters per row)
    sketch_depth: int = 4  # rows of the count-min sketch
    io_threads: int = 8  # concurrent disk reads (io_engine "threads")
    # how the disk tier's reads reach the device: "aio", Linux native AIO (a batch of reads in one system call, 64
    # in flight; a third of the CPU a read of blocking calls); "threads", blocking reads on io_threads threads;
    # "auto": aio where the kernel offers it and the file system takes O_DIRECT reads
    io_engine: str = "auto"
    drop_page_cache: bool = True  # drop the table file's pages after each I/O (bounded RAM, honest timings)
    # the disk file's segments in use hold at most this many slots per live record (above 1): compaction moves the
    # live records of the emptiest ones, a share at every lookup. 2 took 3-4 ms of CPU off a lookup at 4x with fp32
    # rows (0.51x / 0.65x of in memory against 0.44x / 0.58x) and cost at 16x (0.31x against 0.34x: the reads
    # spread over more requests): docs/performance.md
    disk_max_ratio: float = 1.25
    # pipeline: read the next window's disk rows while this window computes (with a disk tier; a quarter of
    # memory_budget holds them with fp32 cold rows, an eighth with compact ones, 3/8 with compact ones and a
    # horizon). On by default: 1.35-1.4x the samples/s of reading on demand at 4x (docs/performance.md)
    prefetch: bool = True
    prefetch_depth: int = 4  # batches per read-ahead window at most (4 measured best at 4x; fewer where they do not fit)
    cold_precision: str = "fp32"  # rows in the host and disk tiers: fp32 | bf16 | int8 (see above)
    # one process: the next batch's lookup in the tiers runs during this step (docs/performance.md)
    lookup_ahead: bool = True
    # with that lookup ahead and train.threads = 0: the step runs on one thread fewer, leaving that lookup and the
    # read-ahead stage a core. auto = with compact cold rows or a horizon (fp32 rows without one then give the numbers
    # of the same run in memory); on = always (fp32 rows at 4x with a horizon 0.36x of in memory against 0.26x:
    # docs/performance.md; the dense step's rounding is then that of a run on one thread fewer); off = never
    leave_core: str = "auto"
    # with a disk tier: the ids of this many upcoming batches rank eviction (tierec/store/horizon.py); 0 = off.
    # 128 on a fixed table 4x and 16x its budget: 1.1-1.6x the samples/s of none, disk reads 1.10x (int8) /
    # 1.22x (fp32) of Belady's minimum against 1.55x / 1.71x; on a stream of new ids (21M) slower in wall time,
    # hence off by default (docs/performance.md)
    horizon: int = 0
    tables: list[StoreTableConfig] = field(default_factory=list)  # per-table stores ([[store.tables]] name = ..., memory_budget, ...)

    def __post_init__(self) -> None:
        from tierec.sizes import parse_size

        for where, value in [(f"store.{k}", getattr(self, k)) for k in ("memory_budget", "cache_size", "host_size")] + [
            (f"store.tables[{t.name}].{k}", getattr(t, k)) for t in self.tables for k in ("memory_budget", "cache_size", "host_size")
        ]:
            parse_size(value, where)
        if self.cache_policy not in {"lfu", "lru"}:
            raise ConfigError(f"store.cache_policy {self.cache_policy!r} is not one of lfu, lru")
        if self.prefetch_depth < 1:
            raise ConfigError("store.prefetch_depth must be >= 1")
        if self.horizon < 0:
            raise ConfigError(f"store.horizon must be >= 0 (batches), got {self.horizon}")
        if self.leave_core not in {"auto", "on", "off"}:
            raise ConfigError(f"store.leave_core {self.leave_core!r} is not one of auto, on, off")
        if self.io_engine not in {"auto", "aio", "threads"}:
            raise ConfigError(f"store.io_engine {self.io_engine!r} is not one of auto, aio, threads")
        if not self.disk_max_ratio > 1.0:
            raise ConfigError(f"store.disk_max_ratio must be above 1 (slots per live record), got {self.disk_max_ratio}")
        if self.cold_precision not in {p.value for p in ColdPrecision}:
            raise ConfigError(f"store.cold_precision {self.cold_precision!r} is not one of {[p.value for p in ColdPrecision]}")
        names = [t.name for t in self.tables]
        if len(set(names)) != len(names):
            raise ConfigError(f"store.tables names a table twice: {names}")


@dataclass(kw_only=True)
class PruneConfig:
    """In-training embedding dimension pruning with chunked rows; off by default.

    Rows are stored as chunks of ``chunk`` dims in one pool per table group; every
    ``every`` steps the trailing chunks of least importance (decayed access
    frequency times gradient magnitude) are freed so the pools fit the budget,
    and pruned chunks of rows that became important grow back (tierec/prune/).
    """

    enabled: bool = False  # prune embedding dims during training
    chunk: int = 4  # dims per chunk; embedding dims must be multiples of it
    every: int = 100  # steps between pruning steps
    start_step: int = 0  # no pruning before this step (importance warms up)
    # Bytes of embedding values: the chunk pools as allocated (weights, per-dim optimizer state and
    # importance of every chunk) plus per-row optimizer state; 0 = use target_ratio instead.
    memory_budget: int = 0
    # Bytes plain tables would hold for the same rows (weights + optimizer state) / value bytes kept.
    target_ratio: float = 4.0
    decay: float = 0.8  # importance kept from one pruning step to the next
    importance: str = "gradient"  # "gradient": frequency x gradient magnitude | "frequency" (baseline)
    # "gradient": a row's mean gradient magnitude is shrunk toward its table's mean at that chunk
    # position, as if the row had this many more accesses at the table's mean (0 = the row's own
    # sum only). Rows seen a few times have mostly label noise in their gradients; see docs/pruning.md.
    shrinkage: float = 8.0
    regrow: bool = True  # a pruned chunk of a row that became important grows back (zeros, fresh state)
    regrow_margin: float = 1.5  # it must reach this multiple of the threshold (hysteresis)
    init_dim: int = 0  # dims of a newly inserted row; 0 = full
    min_dim: int = 0  # never prune a row below this many dims
    compact_free_fraction: float = 0.25  # compact a pool (shrink its tensors) when this much is free
    # Forget rows pruned to no dims (index entry, chunk map, per-row state): they read as zeros like
    # unknown ids, and come back as new rows when seen again.
    evict_empty_rows: bool = True
    final_prune: bool = True  # prune once more after the last step, so the saved model meets the budget

    def __post_init__(self) -> None:
        if self.chunk <= 0:
            raise ConfigError("prune.chunk must be positive")
        if self.every <= 0 or self.start_step < 0:
            raise ConfigError("prune.every must be positive and prune.start_step >= 0")
        if self.memory_budget < 0:
            raise ConfigError("prune.memory_budget must be >= 0 bytes")
        if self.target_ratio < 1.0:
            raise ConfigError(f"prune.target_ratio must be >= 1, got {self.target_ratio}")
        if not 0.0 <= self.decay <= 1.0:
            raise ConfigError("prune.decay must be in [0, 1]")
        if self.importance not in {"gradient", "frequency"}:
            raise ConfigError(f"prune.importance {self.importance!r} is not one of gradient, frequency")
        if self.regrow_margin < 1.0:
            raise ConfigError("prune.regrow_margin must be >= 1")
        if self.shrinkage < 0:
            raise ConfigError("prune.shrinkage must be >= 0")
        if self.init_dim < 0 or self.min_dim < 0 or self.init_dim % self.chunk or self.min_dim % self.chunk:
            raise ConfigError("prune.init_dim and prune.min_dim must be >= 0 and multiples of prune.chunk")
        if not 0.0 < self.compact_free_fraction <= 1.0:
            raise ConfigError("prune.compact_free_fraction must be in (0, 1]")


CROSS_GROUP_MODES = ("gradients", "average")
COMPRESS_CODECS = ("none", "fp16", "bf16", "int8")


@dataclass(kw_only=True)
class DistConfig:
    """Multi-process training on torch.distributed (launched by torchrun); see docs/distributed.md."""

    backend: str = "auto"  # auto = nccl with a GPU per process, gloo on CPU or where processes share a GPU
    # Seconds a collective may wait for a peer; a lost rank is reported within about this.
    timeout_s: float = 300.0
    heartbeat_s: float = 1.0  # liveness beat into the rendezvous store, read when a collective fails
    dedupe: bool = True  # false sends every id occurrence to its owner (the naive baseline)
    overlap: bool = True  # exchange the next batch's ids while the current batch computes
    # Hot-row replication: rows per table group replicated on every rank (0 = off).
    hot_rows: int = 0
    hot_refresh_every: int = 50  # steps between hot-set refreshes from job-wide counts
    hot_candidates: int = 0  # rows each rank may propose at a refresh; 0 = hot_rows
    # A row is replicated only if requested in at least this share of the window's (rank, step)
    # pairs: replicas cost an all-reduce of every hot row every step, so a row that most ranks
    # do not request every step is cheaper through the all-to-all (docs/distributed.md).
    hot_min_share: float = 0.9
    # Hierarchical training (docs/distributed.md): the ranks form a ("replica", "shard") mesh of
    # groups of group_size ranks; tables are row-sharded inside a group, groups sync across.
    # 0 = one group of all ranks (the flat run), on one node or many; a group per machine is
    # group_size = processes per node (torchrun numbers ranks node by node). Must divide the world size.
    group_size: int = 0
    cross_group: str = "gradients"  # gradients (every step, exact) | average (every sync_every steps)
    sync_every: int = 1  # steps between cross-group averages (cross_group = average)
    compress: str = "none"  # what crosses groups: none | fp16 | bf16 | int8 (row-wise, error feedback)

    def __post_init__(self) -> None:
        if self.group_size < 0:
            raise ConfigError(f"dist.group_size must be >= 0 (0 = one group of every rank), got {self.group_size}")
        if self.cross_group not in CROSS_GROUP_MODES:
            raise ConfigError(f"dist.cross_group {self.cross_group!r} is not one of {', '.join(CROSS_GROUP_MODES)}")
        if self.sync_every <= 0:
            raise ConfigError(f"dist.sync_every must be positive, got {self.sync_every}")
        if self.compress not in COMPRESS_CODECS:
            raise ConfigError(f"dist.compress {self.compress!r} is not one of {', '.join(COMPRESS_CODECS)}")
        if self.backend not in {"auto", "gloo", "nccl"}:
            raise ConfigError(f"dist.backend {self.backend!r} is not one of auto, gloo, nccl")
        if self.timeout_s <= 0 or self.heartbeat_s <= 0:
            raise ConfigError("dist.timeout_s and dist.heartbeat_s must be positive")
        if self.hot_rows < 0 or self.hot_candidates < 0:
            raise ConfigError("dist.hot_rows and dist.hot_candidates must be >= 0")
        if not 0 < self.hot_min_share <= 1:
            raise ConfigError("dist.hot_min_share must be in (0, 1]")
        if self.hot_refresh_every <= 0:
            raise ConfigError("dist.hot_refresh_every must be positive")


@dataclass(kw_only=True)
class Config:
    # The meaning of a saved config's keys (a run's config.toml, a checkpoint's meta): 2 since
    # data.schema.label_threshold = nan is "no threshold" (format 1 wrote 0 for it); see upgrade_saved().
    format: int = CONFIG_FORMAT
    data: DataConfig = field(default_factory=DataConfig)
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    prune: PruneConfig = field(default_factory=PruneConfig)
    dist: DistConfig = field(default_factory=DistConfig)

    def __post_init__(self) -> None:
        if self.format != CONFIG_FORMAT:
            raise ConfigError(f"format = {self.format}: this tierec reads configs of format {CONFIG_FORMAT}")
        if self.data.follow and self.train.eval_every and not self.data.test_source:
            raise ConfigError("train.eval_every with data.follow evaluates on data.test_source: set it, or eval_every = 0")
        if self.train.delta_every and self.store.cold_precision != "fp32":
            raise ConfigError(f"train.delta_every needs store.cold_precision = \"fp32\" (a lossy codec changes rows as they "
                              f"move between tiers), got {self.store.cold_precision!r}")
        if self.prune.enabled:
            dims = [self.embedding.dim] + [t.dim for t in self.embedding.tables if t.dim]
            for key in ("min_dim", "init_dim"):
                if getattr(self.prune, key) > min(dims):
                    raise ConfigError(f"prune.{key} = {getattr(self.prune, key)} is larger than the embedding dim {min(dims)}")


# --------------------------------------------------------------------- loading


def has_threshold(value: float) -> bool:
    """Whether ``data.schema.label_threshold`` is a threshold (nan: labels are 0/1)."""
    return not math.isnan(value)


def upgrade_saved(saved: dict[str, Any]) -> dict[str, Any]:
    """A config that tierec wrote (a run's config.toml, a checkpoint's meta) in today's meaning of its keys.

    >>> upgrade_saved({"data": {"schema": {"label_threshold": 0.0}}})["data"]["schema"]["label_threshold"]
    nan
    """
    if int(saved.get("format", 1)) < 2:  # format 1 wrote label_threshold = 0 for "no threshold"
        schema = saved.get("data", {}).get("schema", {})
        if float(schema.get("label_threshold", 0.0)) == 0.0:
            schema["label_threshold"] = math.nan
    saved["format"] = CONFIG_FORMAT
    return saved


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a table, got {value!r}")
        return from_dict(hint, value, where)
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        return value
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint.parse(value) if hasattr(hint, "parse") else hint(value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in {"true", "false", "1", "0"}:
            return value.lower() in {"true", "1"}
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    return value


def from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build dataclass ``cls`` from a dict, rejecting unknown keys by name."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in data if k not in names]
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(f"unknown config key(s) {[prefix + k for k in unknown]}; valid keys here: {names}")
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}" if where else k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field is missing
        raise ConfigError(f"{where or 'config'}: {e}") from None


def with_values(cfg: Config, values: dict[str, Any]) -> Config:
    """``cfg`` with dotted keys set to values (validated like any config).

    >>> with_values(Config(), {"train.epochs": 3}).train.epochs
    3
    """
    data = to_dict(cfg)
    for key, value in values.items():
        *path, last = key.split(".")
        node = data
        for part in path:
            node = node[part]
        node[last] = value
    return from_dict(Config, data)


def to_dict(obj: Any) -> Any:
    """The TOML-able dict of a config (enums as their strings)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, enum.Enum):
        return obj.value
    return obj


def flatten_dict(d: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as ``{dotted.key: value}``."""
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten_dict(v, f"{prefix}.{k}" if prefix else k))
    return out


def first_difference(a: dict[str, Any], b: dict[str, Any], ignore: tuple[str, ...] = ()) -> str | None:
    """The first dotted key (sorted) whose value differs between two nested dicts, or None."""
    fa, fb = flatten_dict(a), flatten_dict(b)
    for key in sorted(set(fa) | set(fb)):
        if key not in ignore and not _same(fa.get(key), fb.get(key)):
            return key
    return None


def _same(x: Any, y: Any) -> bool:
    """Equal values, nan equal to nan (an unset label_threshold)."""
    return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare string


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one ``a.b.c=value`` override to a nested dict (value parsed as TOML)."""
    if "=" not in assignment:
        raise ConfigError(f"override {assignment!r} must look like section.key=value")
    path, text = assignment.split("=", 1)
    keys = path.strip().split(".")
    node = data
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {assignment!r}: {k} is not a section")
    node[keys[-1]] = _parse_value(text.strip())


def merge_dicts(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``: tables merge key by key, any other value of ``over`` wins."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge_dicts(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_config(
    path: str | Path | list[str | Path] | tuple[str | Path, ...] | None, overrides: list[str] | None = None, cls: type = Config
) -> Any:
    """Load ``cls`` from TOML files (merged in order, later ones winning; none = defaults), then overrides.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> _ = open(os.path.join(d, "a.toml"), "w").write("[train]\\nbatch_size = 64\\nepochs = 3\\n")
    >>> _ = open(os.path.join(d, "b.toml"), "w").write("[train]\\nepochs = 5\\n")
    >>> cfg = load_config([os.path.join(d, "a.toml"), os.path.join(d, "b.toml")], ["train.max_steps=7"])
    >>> cfg.train.batch_size, cfg.train.epochs, cfg.train.max_steps
    (64, 5, 7)
    """
    return from_dict(cls, merged_dict(path, overrides))


def _refuse_ambiguous_threshold(one_file: dict[str, Any], path: Path) -> None:
    """A file without ``format`` that says ``label_threshold = 0``: a run's config.toml written before format 2
    meant "no threshold" by it (every label would now become 1), a new file may mean a threshold of 0."""
    threshold = one_file.get("data", {}).get("schema", {}).get("label_threshold")
    if "format" not in one_file and isinstance(threshold, (int, float)) and threshold == 0:
        raise ConfigError(
            f"{path}: data.schema.label_threshold = 0 in a config without `format`: tierec's configs before format 2 "
            "wrote 0 for \"no threshold\" (labels 0/1); delete the key for 0/1 labels, or add `format = 2` to the file "
            "for a threshold of 0"
        )


def given_keys(path: str | Path | list[str | Path] | tuple[str | Path, ...] | None, overrides: list[str] | None = None) -> set[str]:
    """The dotted keys that the config files and overrides set (the rest are defaults)."""
    return set(flatten_dict(merged_dict(path, overrides)))


def merged_dict(path: str | Path | list[str | Path] | tuple[str | Path, ...] | None, overrides: list[str] | None = None) -> dict[str, Any]:
    """The TOML files merged in order, then the overrides, as one nested dict (not validated yet)."""
    paths = [] if path is None else [path] if isinstance(path, (str, Path)) else list(path)
    data: dict[str, Any] = {}
    for one in paths:
        p = Path(one)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            one_file = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: {e}") from None
        _refuse_ambiguous_threshold(one_file, p)
        data = merge_dicts(data, one_file)
    for o in overrides or []:
        apply_override(data, o)
    return data
