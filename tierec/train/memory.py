"""The memory preflight: what a config will allocate, against what this machine has, before any work.

:func:`estimate_memory` adds up, in bytes (docs/reliability.md, "Memory
preflight"):

- **embedding tables**: for every table, its rows times a row's bytes (the
  weights and the optimizer's state, ``4 * (dim + state floats)``) plus the
  id index (17 bytes a row). The rows are a lower bound: the distinct ids of
  the table's features in the first training rows (:func:`seen_ids`, up to
  16,384 rows), none when they are not known (the library's builders). The
  first-order (dim-1) tables count the same rows.
- **tiered tables** (``store.enabled``): their store's ``memory_budget`` whole
  (the fast tier is allocated up front; the host tier may fill the rest),
  without a budget the fast tier (``cache_size``) and the rows in host memory,
  plus the store's directory (21 bytes an id).
- **the dense model**: its parameters, their gradients and the dense
  optimizer's state (built on PyTorch's ``meta`` device: nothing allocated).
- **batch buffers**: a batch's looked-up embeddings ``[B, F, D]`` about four
  times over (lookup, gradient, the model's inputs and their gradient), and
  the decoded batches the loader and the store pipeline hold ahead.

:func:`check_memory` compares the total with :func:`available_memory` (the
least of ``MemAvailable``, the cgroup's limit less its usage, and ``ulimit
-v`` less the address space in use) and raises a one-line ConfigError naming
the keys of the largest parts. Runs on a GPU are not checked (yet).

>>> from tierec.config import load_config
>>> est = estimate_memory(load_config(None, ["embedding.dim=4"]), ["C1", "C2"], 1, {"C1": 10, "C2": 5})
>>> [(p.what, p.nbytes) for p in est.parts if p.what.startswith("embedding")]  # 15 x (4 x (4 + 1) + 17)
[('embedding tables (15 rows seen in the first training rows)', 555)]
>>> check_memory(est, available=(100, "MemAvailable"))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
tierec.errors.ConfigError: not enough memory: this config needs at least ... but 100 B are available (MemAvailable): ...
"""

from __future__ import annotations

import dataclasses
import resource
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tierec.config import Config, ConfigError
from tierec.embedding.table import TableConfig, tables_from_config
from tierec.models import build_model, has_first_order
from tierec.sizes import format_size
from tierec.store.plan import StorePlan, record_bytes

INDEX_BYTES_PER_ROW = 17  # hash index: 8 of id, 1 of table, 5-8 of slots (tierec/embedding/hash_index.py)
DIRECTORY_BYTES_PER_ID = 21  # a tiered store's directory (docs/scale.md)
SAMPLE_ROWS = 16_384  # training rows read to count distinct ids
BATCH_COPIES = 4  # [B, F, D]: the lookup, its gradient, the model's inputs and their gradient
_DENSE_STATES = {"adam": 2, "adagrad": 1, "sgd": 0}  # float32 per parameter beside the weight and its gradient


@dataclass(frozen=True)
class MemoryPart:
    what: str
    keys: tuple[str, ...]  # the settings that size it
    nbytes: int


@dataclass(frozen=True)
class MemoryEstimate:
    parts: tuple[MemoryPart, ...]

    @property
    def total(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def plus(self, part: MemoryPart) -> MemoryEstimate:
        return MemoryEstimate((*self.parts, part))


def seen_ids(cfg: Config, max_rows: int = SAMPLE_ROWS) -> tuple[list[str], int, dict[str, np.ndarray]]:
    """Feature names, dense count and the distinct ids of each feature in the first training rows (up to ``max_rows``)."""
    from tierec.data import open_source

    limit = max_rows if not cfg.train.max_steps else min(max_rows, cfg.train.max_steps * cfg.train.batch_size)
    ids: dict[str, list[np.ndarray]] = {}
    with warnings.catch_warnings():  # malformed rows: training reports them
        warnings.simplefilter("ignore")
        # without sampled negatives (their items are training items; sampling first needs a pass over the whole split)
        plain = dataclasses.replace(cfg.data, negatives=0)
        source = open_source(plain, "train", min(cfg.train.batch_size, limit), label_optional=cfg.data.negatives > 0)
        names, n_dense, rows = list(source.feature_names), source.n_dense, 0
        for batch in source:
            sp = batch.sparse
            for f, name in enumerate(sp.keys):
                lo, hi = sp.feature_span(f)
                ids.setdefault(name, []).append(np.unique(sp.values[lo:hi].numpy()))
            rows += batch.size
            if rows >= limit:
                break
    return names, n_dense, {k: np.unique(np.concatenate(v)) for k, v in ids.items()}


def training_estimate(cfg: Config, processes: int = 1) -> MemoryEstimate:
    """The estimate of a training run, its tables' rows counted in its first training rows."""
    names, n_dense, ids = seen_ids(cfg)
    return estimate_memory(cfg, names, n_dense, table_rows(tables_from_config(cfg.embedding, names), ids), processes)


def table_rows(tables: list[TableConfig], ids: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Rows each table will hold at least: the distinct ids of its features."""
    out = {}
    for t in tables:
        parts = [ids[f] for f in t.features if f in ids]
        out[t.name] = int(np.unique(np.concatenate(parts)).size) if parts else 0
    return out


def estimate_memory(cfg: Config, feature_names: list[str], n_dense: int, rows: Mapping[str, int] | None = None,
                    processes: int = 1) -> MemoryEstimate:
    """What ``cfg`` will allocate at least; ``rows``: rows of each main table (by name), none known if None.

    ``processes``: the dense model and batch buffers are per process, the tables are split between them.
    """
    rows = rows or {}
    plan = StorePlan.for_run(cfg, feature_names, n_dense)
    main = plan.tables(tables_from_config(cfg.embedding, feature_names))
    groups = [(main, "")]
    if has_first_order(cfg.model, n_dense):
        groups.append((plan.tables(tables_from_config(cfg.embedding, feature_names, dim=1, suffix=".wide")), ".wide"))
    in_memory, tiered, n_rows = 0, 0, 0
    for tables, suffix in groups:
        for t in tables:
            n = rows.get(t.name.removesuffix(suffix), 0)
            n_rows += n
            if not plan.tiered([t]):
                in_memory += n * (record_bytes(t) + INDEX_BYTES_PER_ROW)
                continue
            spec = plan.spec_for([t])  # this table's share of its store
            host = n * record_bytes(t) if spec.host_bytes is None else spec.host_bytes  # a set size counts whole
            tiered += spec.cache_bytes + host + n * DIRECTORY_BYTES_PER_ID
    seen = f"{n_rows:,} rows seen in the first training rows" if rows else "rows not counted"
    emb_keys = ("embedding.dim", "embedding.optimizer.kind")
    parts = [MemoryPart(f"embedding tables ({seen})", emb_keys, in_memory)]
    if plan.enabled:
        parts.append(MemoryPart("tiered tables (the store's budget)", ("store.memory_budget", "store.cache_size", "store.host_size"), tiered))
    parts.append(MemoryPart("dense model", ("model.*", "embedding.dim", "train.dense_optimizer"), processes * _dense_bytes(cfg, feature_names, n_dense)))
    parts.append(MemoryPart("batch buffers", ("train.batch_size", "embedding.dim"), processes * _batch_bytes(cfg, feature_names, n_dense)))
    return MemoryEstimate(tuple(parts))


def _dense_bytes(cfg: Config, feature_names: list[str], n_dense: int) -> int:
    dims = {t.dim for t in tables_from_config(cfg.embedding, feature_names)}
    with torch.device("meta"):
        model = build_model(cfg.model, n_dense=n_dense, n_sparse=len(feature_names), dim=max(dims))
    params = sum(p.numel() for p in model.parameters())
    return 4 * params * (2 + _DENSE_STATES.get(str(cfg.train.dense_optimizer), 2))


def _batch_bytes(cfg: Config, feature_names: list[str], n_dense: int) -> int:
    b, f = cfg.train.batch_size, len(feature_names)
    dim = max(t.dim for t in tables_from_config(cfg.embedding, feature_names))
    ahead = cfg.data.prefetch_batches + (2 * cfg.store.prefetch_depth if cfg.store.prefetch else 0) + 1  # two windows
    return BATCH_COPIES * b * f * dim * 4 + ahead * b * (f + n_dense + 1) * 8


def available_memory() -> tuple[int, str] | None:
    """Bytes this process may still allocate, and where the bound comes from; None where nothing is known."""
    found = []
    meminfo = _read_kib("/proc/meminfo", "MemAvailable:")
    if meminfo is not None:
        found.append((meminfo, "MemAvailable in /proc/meminfo"))
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        cap, used = _read_int(limit), _read_int(usage)
        if cap is not None and used is not None and cap < 1 << 60:
            found.append((max(cap - used, 0), f"the cgroup's limit {limit}"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    in_use = _read_kib("/proc/self/status", "VmSize:")
    if soft != resource.RLIM_INFINITY and in_use is not None:
        found.append((max(soft - in_use, 0), "ulimit -v"))
    return min(found) if found else None


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_kib(path: str, field: str) -> int | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_memory(estimate: MemoryEstimate, available: tuple[int, str] | None = None, device: str = "cpu") -> None:
    """A one-line ConfigError when ``estimate`` exceeds the memory available (default: :func:`available_memory`).

    Only for runs on the CPU: a GPU's memory is not estimated yet.
    """
    if torch.device(device).type != "cpu":
        return
    available = available or available_memory()
    if available is None or estimate.total <= available[0]:
        return
    free, source = available
    big = sorted((p for p in estimate.parts if p.nbytes), key=lambda p: -p.nbytes)
    listed = "; ".join(f"{p.what} {format_size(p.nbytes)} ({', '.join(p.keys)})" for p in big[:3])
    raise ConfigError(f"not enough memory: this config needs at least {format_size(estimate.total)} but "
                      f"{format_size(free)} are available ({source}): {listed}; lower {' or '.join(big[0].keys)}")
