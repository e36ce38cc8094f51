"""Tiered storage benchmarks: fast-tier hit rates, disk-tier training throughput, the prefetch pipeline.

    python -m benchmarks.tiers --which hitrate   # hit rate vs fast-tier size: tierec LFU / LRU, simulated LRU, Belady
    python -m benchmarks.tiers --which disk      # a table 4x its budget on disk vs all in memory; pipeline on / off
    python -m benchmarks.tiers --which memory    # resident memory of a table 4x its budget (fresh process)
    python -m benchmarks.tiers --which all --out runs/bench/tiers.json

Every figure of docs/performance.md "Tables beyond memory" comes from these commands.

>>> from benchmarks.tiers import main
>>> main(["--which", "hitrate", "--batches", "4", "--batch", "64", "--scale", "0.0005", "--fractions", "0.5", "--quiet"])
0
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from itertools import islice
from pathlib import Path

import numpy as np
import torch

from benchmarks.run import machine
from benchmarks.thread_cpu import cpu_between, thread_cpu
from benchmarks.tiers_sim import belady, lru, next_uses, windowed
from tierec.batch import with_next

WHICH = ("hitrate", "disk", "oracle", "memory", "all")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks.tiers", description=__doc__.split("\n\n")[0])
    p.add_argument("--which", choices=WHICH, default="all")
    # hit rate: the Criteo-shaped synthetic data
    p.add_argument("--batch", type=int, default=1024, help="hitrate: samples per batch")
    p.add_argument("--batches", type=int, default=200, help="hitrate: batches in the trace")
    p.add_argument("--scale", type=float, default=0.01, help="hitrate: synthetic cardinality_scale")
    p.add_argument("--skew", type=float, default=1.3, help="hitrate: synthetic zipf exponent")
    p.add_argument("--fractions", default="0.02,0.05,0.1,0.2,0.4", help="hitrate: fast-tier sizes, fractions of distinct ids")
    # disk: fixed-size tables, Zipf ids (benchmarks.workload)
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--rows", type=int, default=100_000, help="disk: rows per table, all present from the start")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--train-batch", type=int, default=4096, help="disk: samples per training batch")
    p.add_argument("--zipf", type=float, default=1.1, help="disk: Zipf exponent of the ids")
    p.add_argument("--budget-x", type=float, default=4.0, help="disk: table bytes / memory budget")
    p.add_argument("--cache-frac", type=float, default=0.5, help="disk: share of the budget for the fast tier")
    p.add_argument("--steps", type=int, default=30, help="disk: timed steps")
    p.add_argument("--warmup", type=int, default=20, help="disk: untimed steps first (the cache warms up)")
    p.add_argument("--rounds", type=int, default=5, help="disk: the setups take turns on this many chunks of the timed steps")
    p.add_argument("--modes", default="memory,disk,disk+prefetch4+ahead,disk+prefetch4+ahead+horizon128",
                   help="disk: runs to compare (disk+prefetchN: disk rows read N batches ahead; +ahead: store.lookup_ahead; "
                        "+horizonN: store.horizon, else 0; +core / +nocore: store.leave_core = on / off, else auto; +ioE: store.io_engine = E (aio, threads); +ratioR: store.disk_max_ratio = R; +cacheF: the fast tier F of the budget, else --cache-frac; +stageF: the "
                        "read-ahead windows F of it, the host tier the rest)")
    p.add_argument("--disk-dir", default="", help="directory of the disk tier (default: the temp dir)")
    p.add_argument("--io-threads", type=int, default=8)
    p.add_argument("--cold-precision", default="fp32", choices=["fp32", "bf16", "int8"],
                   help="disk: store.cold_precision of the tiered modes (with +prefetch the thread's moves make runs vary: timing only)")
    p.add_argument("--store-set", action="append", default=[], metavar="KEY=VALUE",
                   help="disk: another store.* setting of the tiered modes (repeatable), e.g. store.promote_max=20000")
    p.add_argument("--oracle-steps", type=int, default=400, help="oracle: batches in the trace (the first --warmup not counted)")
    p.add_argument("--oracle-windows", default="4,16,64", help="oracle: also simulate eviction that knows the ids of "
                                                               "the next K batches, for each K of this list")
    p.add_argument("--horizon", type=int, default=0, help="oracle: store.horizon of tierec's lookups (batches whose ids rank eviction)")
    p.add_argument("--threads", type=int, default=0, help="torch and numba threads (0 = all cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="", help="write the results as JSON here")
    p.add_argument("--quiet", action="store_true")
    return p


# ----------------------------------------------------------------- hit rate


def hit_trace(a: argparse.Namespace) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray, int]:
    """Per batch the unique (key, table) pairs of the synthetic data; the same as dense ids (ptr, ids)."""
    from tierec.config import DataConfig, SyntheticConfig
    from tierec.data import open_source

    cfg = DataConfig(synthetic=SyntheticConfig(train_rows=a.batch * a.batches, test_rows=16, cardinality_scale=a.scale, zipf=a.skew, seed=a.seed))
    batches = []
    for b in open_source(cfg, "train", a.batch):
        sp = b.sparse
        keys = sp.values.numpy()
        per = np.diff(sp.offsets.numpy()[:: b.size])  # ids per feature
        tabs = np.repeat(np.arange(len(sp.keys), dtype=np.int32), per)
        packed = np.unique(keys.astype(np.int64) * 32 + tabs)  # features are folded in the keys already
        batches.append((packed // 32, (packed % 32).astype(np.int32)))
    allk = np.concatenate([k * 32 + t for k, t in batches])
    uniq, ids = np.unique(allk, return_inverse=True)
    ptr = np.concatenate([[0], np.cumsum([k.size for k, _ in batches])]).astype(np.int64)
    return batches, ptr, ids.astype(np.int64), int(uniq.size)


def tierec_hits(batches, capacity: int, policy: str) -> int:
    from tierec.embedding import TableConfig
    from tierec.store import TieredGroup, TierSpec

    tables = [TableConfig(name=f"C{i + 1}", dim=4, features=[f"C{i + 1}"]) for i in range(26)]
    g = TieredGroup(tables, TierSpec(cache_bytes=capacity * 20, host_bytes=None, cache_policy=policy))
    for keys, tabs in batches:
        g.lookup(keys, tabs, insert=True)
    return int(g.counters[:, 0].sum())


def run_hitrate(a: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    batches, ptr, ids, n_ids = hit_trace(a)
    accesses = int(ids.size)
    biggest = int(np.diff(ptr).max())
    nxt = next_uses(ptr, ids, n_ids)
    rows = []
    for f in (float(x) for x in a.fractions.split(",")):
        cap = max(int(f * n_ids), biggest)
        row = {"fraction": f, "capacity": cap, "capacity_share": cap / n_ids}
        row["tierec_lfu"] = tierec_hits(batches, cap, "lfu") / accesses
        row["tierec_lru"] = tierec_hits(batches, cap, "lru") / accesses
        row["lru"] = lru(ptr, ids, cap, n_ids) / accesses
        row["belady"] = belady(ptr, ids, nxt, cap, n_ids) / accesses
        rows.append(row)
    # With an unbounded cache every id misses once: the ceiling of any policy.
    ceiling = 1.0 - n_ids / accesses
    return {
        "trace": {"batches": len(batches), "batch": a.batch, "scale": a.scale, "zipf": a.skew, "distinct_ids": n_ids, "accesses": accesses, "max_batch_unique": biggest, "ceiling": ceiling},
        "rows": rows,
        "seconds": time.perf_counter() - t0,
    }


# --------------------------------------------------------------------- disk


def training_batches(a: argparse.Namespace, n: int):
    from benchmarks.workload import Workload, make_batches
    from tierec.batch import Batch, SparseFeatures

    w = Workload(tables=a.tables, rows=a.rows, dim=a.dim, batch=a.train_batch, zipf=a.zipf, steps=n, seed=a.seed)
    g = torch.Generator().manual_seed(a.seed)
    out = []
    for eb in make_batches(w, n):
        sp = SparseFeatures(tuple(w.feature_names()), eb.keys, eb.offsets, a.train_batch)
        out.append(Batch(torch.randn(a.train_batch, 13, generator=g), sp, (torch.rand(a.train_batch, generator=g) < 0.25).float()))
    return w, out


def _full_tables(w, dim: int, seed: int) -> dict[str, torch.Tensor]:
    """Every row of every table present from the start (row-wise Adagrad state zero)."""
    rng = np.random.default_rng(seed)
    sd: dict[str, torch.Tensor] = {"group0.step": torch.tensor(0)}
    for f, name in enumerate(w.feature_names()):
        idx = np.arange(w.rows, dtype=np.int64)
        sd[f"{name}.ids"] = torch.from_numpy((np.int64(f) << 32) | idx)
        sd[f"{name}.weights"] = torch.from_numpy((rng.standard_normal((w.rows, dim), dtype=np.float32) * 0.05))
        sd[f"{name}.opt.sum"] = torch.zeros(w.rows)
    return sd


def _option(mode: str, name: str) -> str | None:
    """The value a mode gives an option: ``_option("disk+prefetch4+horizon64", "horizon")`` -> "64"; None where
    the mode does not name it ("" where it names it without a value: "disk+prefetch")."""
    if f"+{name}" not in mode:
        return None
    return mode.split(f"+{name}")[1].split("+")[0]


def _horizon(mode: str) -> int:
    """store.horizon of a mode: "disk+prefetch4+horizon64" -> 64, none -> 0."""
    return int(_option(mode, "horizon") or 0)


def _leave_core(mode: str) -> str:
    """store.leave_core of a mode: "+core" on, "+nocore" off, else auto.

    >>> _leave_core("disk+prefetch4+ahead+core"), _leave_core("disk+ahead+nocore"), _leave_core("disk+ahead")
    ('on', 'off', 'auto')
    """
    return "on" if _option(mode, "core") is not None else "off" if _option(mode, "nocore") is not None else "auto"


def _threads(mode: str) -> int:
    """train.threads of a mode: "disk+prefetch4+ahead+threads2" -> 2 (the dense step on all of them); none -> 0
    (auto: with a lookup ahead the dense step leaves it a core).

    >>> _threads("disk+prefetch4+ahead+threads2"), _threads("disk+prefetch4+ahead")
    (2, 0)
    """
    return int(_option(mode, "threads") or 0)


def _cache_frac(mode: str, default: float) -> float:
    """The fast tier's share of the budget in a mode: "disk+prefetch4+cache0.75" -> 0.75, none -> ``default``.

    >>> _cache_frac("disk+prefetch4+ahead+horizon128+cache0.75", 0.5), _cache_frac("disk+prefetch4", 0.5)
    (0.75, 0.5)
    >>> _horizon("disk+prefetch4+ahead+horizon128+cache0.75"), _depth("disk+prefetch4+ahead+horizon128+cache0.75")
    (128, 4)
    """
    value = _option(mode, "cache")
    return default if value is None else float(value)


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _stage_frac(mode: str) -> float | None:
    """The read-ahead windows' share of the budget in a mode ("+stage0.375"; the host tier gets the rest), or
    None: the store's own default.

    >>> _stage_frac("disk+prefetch4+ahead+horizon128+stage0.375"), _stage_frac("disk+prefetch4")
    (0.375, None)
    """
    value = _option(mode, "stage")
    return None if value is None else float(value)


def _depth(mode: str) -> int:
    """Batches per read-ahead window of a mode: "disk+prefetch4+ahead" -> 4, "disk+prefetch" -> 1."""
    return int(_option(mode, "prefetch") or 1)


class Runner:
    """One training setup (all in memory, or tiered with the disk tier) stepping through the batches."""

    def __init__(self, a: argparse.Namespace, mode: str, w, disk_dir: str, batches: list | None = None) -> None:
        from tierec.config import load_config
        from tierec.distributed.job import Job
        from tierec.store.monitor import StoreMonitor
        from tierec.store.pipeline import StorePipeline
        from tierec.train.components import Components
        from tierec.train.pipeline import TrainPipeline

        self.mode = mode
        record = 4 * (a.dim + 1)
        self.table_bytes = a.tables * a.rows * record
        self.budget = int(self.table_bytes / a.budget_x)
        over = [f"embedding.dim={a.dim}", "model.name=dlrm", f"train.seed={a.seed}", f"train.threads={_threads(mode)}"]
        if mode != "memory":
            cache, stage = int(self.budget * _cache_frac(mode, a.cache_frac)), _stage_frac(mode)
            over += [
                "store.enabled=true",
                f"store.memory_budget={self.budget}",
                f"store.cache_size={cache}",  # "+cacheF": F of the budget
                f"store.disk_path={disk_dir}",
                f"store.io_threads={a.io_threads}",
                f"store.cold_precision={a.cold_precision}",
                f"store.prefetch={str('+prefetch' in mode).lower()}",  # the windows' memory comes out of the budget
                f"store.prefetch_depth={_depth(mode)}",
                f"store.lookup_ahead={str('+ahead' in mode).lower()}",  # the next batch's lookup during the step
                f"store.horizon={_horizon(mode)}",  # the ids of this many batches ahead rank eviction
                f"store.leave_core={_leave_core(mode)}",
                f"store.io_engine={_option(mode, 'io') or 'auto'}",  # "+iothreads": blocking reads on threads, "+ioaio"
                *([] if _option(mode, "ratio") is None else [f"store.disk_max_ratio={_option(mode, 'ratio')}"]),  # "+ratio2"
                # "+stageF": the windows F of the budget, the host tier what the fast tier and they leave
                *([] if stage is None else [f"store.host_size={self.budget - cache - int(self.budget * stage)}"]),
                *a.store_set,
            ]
        cfg = load_config(None, over)
        self.parts = Components.build(cfg, w.feature_names(), 13)
        self.parts.embeddings.load_state_dict(_full_tables(w, a.dim, a.seed))
        self.monitor = StoreMonitor.for_components(self.parts, cfg.store)
        for g in self.monitor.groups:
            if g.disk is not None:
                g.disk.drop_page_cache(sync=True)  # the table file starts outside the page cache
        # "disk+prefetch" reads windows of one batch ahead, "disk+prefetch4" of four, ...; "+ahead" looks each
        # next batch up during the step (the trainer's TrainPipeline.step, as in tierec train)
        # "+horizonN": the pipeline also shows the stores the ids of the next N batches
        depth, horizon = (_depth(mode) if "+prefetch" in mode else 0), _horizon(mode)
        self.pipe = StorePipeline([self.parts.embeddings], depth=depth, horizon=horizon) if depth or horizon else None
        self.train = TrainPipeline(self.parts, Job(cfg), cfg, store=self.monitor)
        # one stream over all the batches, taken a chunk at a time: the pipeline looks ahead across chunks
        self._stream = None if batches is None else self._through_pipe(batches)
        self.steps = None if batches is None else with_next(self._stream)
        self.times: list[float] = []
        self.marks: list[tuple] = []
        self.rounds: list[tuple[float, float, float]] = []  # per timed chunk: wall s, process CPU s, load
        self.thread_cpu: Counter = Counter()  # CPU s of the timed steps per thread name (benchmarks.thread_cpu)

    def _through_pipe(self, batches: list):
        """The batches through the store's stage, on its own thread where the training step leaves it a core
        (as in TrainPipeline.run)."""
        if self.pipe is None:
            return iter(batches)
        return self.pipe.run(iter(batches), thread=self.train.step_threads is not None)

    def _mark(self) -> tuple:
        tot = self.monitor.totals() if self.monitor.active else {}
        if self.monitor.active:
            tot["disk_requests"] = sum(g.disk.requests for g in self.monitor.groups if g.disk is not None)
            tot["device_bytes"] = sum(g.disk.device_bytes for g in self.monitor.groups if g.disk is not None)
            st = [g.staging.stats for g in self.monitor.groups]
            tot["read_ahead_s"] = sum(x.read_s for x in st)
            tot["staged_rows"] = sum(x.staged_rows for x in st)
            tot["stage_s"] = self.pipe.stage_s if self.pipe else 0.0
        wait = self.pipe.stats()["wait_s"] if self.pipe else 0.0
        return tot, wait, time.perf_counter()

    def run(self, batches, timed: bool) -> None:
        """Train on ``batches`` (a list; or a count: the next ones of the runner's own stream); when ``timed``,
        record the wall time of every step (pipeline waits included)."""
        start = self._mark()
        threads0 = thread_cpu()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        if isinstance(batches, int):
            steps = islice(self.steps, batches)
        else:
            steps = with_next(self._through_pipe(batches))
        t_prev = time.perf_counter()
        with self.train.threads():  # the loop's threads (the stage's, between steps, too), as in TrainPipeline.run
            for batch, nxt in steps:
                self.train.step(batch, nxt)
                now = time.perf_counter()
                if timed:
                    self.times.append(now - t_prev)
                t_prev = now
        if timed:
            self.marks.append((start, self._mark(), batches if isinstance(batches, int) else len(batches)))
            self.rounds.append((time.perf_counter() - wall0, time.process_time() - cpu0, os.getloadavg()[0]))
            self.thread_cpu.update(cpu_between(threads0, thread_cpu()))

    def result(self, batch_size: int) -> dict:
        steps = len(self.times)
        cores = usable_cores()
        res = {
            "mode": self.mode,
            "median_step_s": float(np.median(self.times)),
            "mean_step_s": float(np.mean(self.times)),
            "step_s": [round(t, 4) for t in self.times],
            "samples_per_s": batch_size * steps / float(np.sum(self.times)),
            "cpu_s_per_step": sum(r[1] for r in self.rounds) / steps,
            # the step can be no shorter than its CPU spread over the cores it may use: how near it runs to that
            "cores": cores,
            "cpu_busy_share": sum(r[1] for r in self.rounds) / (cores * sum(r[0] for r in self.rounds)),
            "cpu_ms_per_step_by_thread": {k: round(1e3 * v / steps, 2) for k, v in self.thread_cpu.most_common()},
            "round_wall_s": [r[0] for r in self.rounds],
            "round_load": [r[2] for r in self.rounds],
            "ram_bytes": self.parts.embedding_bytes(),
            "table_bytes": self.table_bytes,
            "budget_bytes": self.budget if self.mode != "memory" else None,
        }
        if self.monitor.active:
            n = sum(m[2] for m in self.marks)

            def delta(key: str) -> float:
                return sum(m[1][0][key] - m[0][0][key] for m in self.marks)

            looked = delta("hits") + delta("misses") + delta("new")
            res.update(
                {
                    "hit_rate": delta("hits") / max(looked, 1),
                    "disk_read_rows_per_step": delta("disk_read_rows") / n,
                    "disk_rows_read_ahead_per_step": delta("prefetched") / n,
                    "disk_requests_per_step": delta("disk_requests") / n,
                    "rows_per_request": delta("disk_read_rows") / max(delta("disk_requests"), 1),
                    "device_mib_per_step": delta("device_bytes") / n / 2**20,
                    "read_ahead_s_per_step": delta("read_ahead_s") / n,
                    "hidden_share": 1.0 - sum(m[1][1] - m[0][1] for m in self.marks) / max(delta("read_ahead_s"), 1e-12) if self.pipe else 0.0,
                    "disk_read_mib_per_step": delta("disk_read_bytes") / n / 2**20,
                    "disk_write_mib_per_step": delta("disk_write_bytes") / n / 2**20,
                    "lookup_s_per_step": delta("lookup_s") / n,
                    "stage_s_per_step": delta("stage_s") / n,  # the windows' dedupe and probe (waits for the lock too)
                    "wait_s_per_step": sum(m[1][1] - m[0][1] for m in self.marks) / n,
                    "rows_cache": self.monitor.totals()["rows_cache"],
                    "rows_host": self.monitor.totals()["rows_host"],
                    "rows_disk": self.monitor.totals()["rows_disk"],
                }
            )
            if self.pipe is not None:  # how long the read-ahead windows were, and the rows they had no room for
                st = self.pipe.stats()
                res.update(window=st["window"], smallest_window=st["smallest_window"],
                           dropped_rows=sum(g.read_ahead_fill()[0] for g in self.monitor.groups))
        return res

    def close(self) -> None:
        if self.steps is not None:
            self.steps.close()
            if hasattr(self._stream, "close"):
                self._stream.close()  # the pipeline's stream: its windows and horizon go
        self.train.stop()
        for g in self.monitor.groups:
            g.close()


def run_disk(a: argparse.Namespace) -> dict:
    """Each setup warms up, then they take turns on chunks of the same batches (fair under a changing load)."""
    disk_dir = a.disk_dir or tempfile.gettempdir()
    chunk = max(a.steps // a.rounds, 1)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    # the stream goes on a horizon past the last step trained: every timed step foresees a batch, as in a long run
    # (with the stream ending there, the last ``horizon`` steps had no batch to foresee and ran without that cost)
    past = max((_horizon(m) for m in modes), default=0)
    w, batches = training_batches(a, a.warmup + chunk * a.rounds + past)
    runners = [Runner(a, m, w, disk_dir, batches) for m in modes]
    for r in runners:
        r.run(a.warmup, timed=False)
    for k in range(a.rounds):
        for j in range(len(runners)):  # rotate the order every round
            runners[(j + k) % len(runners)].run(chunk, timed=True)
    runs = [r.result(a.train_batch) for r in runners]
    for r in runners:
        r.close()
    del runners
    gc.collect()
    by = {r["mode"]: r for r in runs}

    def paired(num: str, den: str) -> float:  # median over rounds of den's chunk time / num's: a throughput ratio
        return float(np.median(np.array(by[den]["round_wall_s"]) / np.array(by[num]["round_wall_s"])))

    ratios = {}
    if "memory" in by:
        for m, r in by.items():
            if m != "memory":
                ratios[f"{m}/memory throughput"] = r["samples_per_s"] / by["memory"]["samples_per_s"]
                ratios[f"{m}/memory throughput (paired)"] = paired(m, "memory")
    for m in by:
        if m.startswith("disk+prefetch") and "disk" in by:
            ratios[f"step time {m}/disk"] = by[m]["median_step_s"] / by["disk"]["median_step_s"]
            ratios[f"step time {m}/disk (paired)"] = 1.0 / paired(m, "disk")
    keys = ("tables", "rows", "dim", "train_batch", "zipf", "budget_x", "cache_frac", "steps", "warmup", "rounds", "io_threads")
    return {"workload": {k: getattr(a, k) for k in keys}, "runs": runs, "ratios": ratios}


def _pairs(b) -> tuple[np.ndarray, np.ndarray]:
    """A batch's unique (key, table) pairs, as the embedding collection hands them to a tiered group."""
    sp = b.sparse
    lens = np.diff(sp.offsets.numpy()[:: b.size])  # ids per feature
    packed = np.unique(sp.values.numpy().astype(np.int64) * 64 + np.repeat(np.arange(len(sp.keys), dtype=np.int64), lens))
    return packed // 64, (packed % 64).astype(np.int32)


def run_oracle(a: argparse.Namespace) -> dict:
    """Disk rows per step of tierec's tiers against Belady's minimum with the same rows in memory, on one long
    trace of the disk workload (lookups only: which rows move does not depend on the values)."""
    disk_dir = a.disk_dir or tempfile.gettempdir()
    w, batches = training_batches(a, a.oracle_steps)
    runner = Runner(a, f"disk+horizon{a.horizon}" if a.horizon else "disk", w, disk_dir)
    g = runner.monitor.groups[0]
    pairs = [_pairs(b) for b in batches]
    from tierec.store.spec import Counter

    for k, t in pairs[: a.horizon]:
        g.foresee(k, t)
    cpu = []  # the lookups' own CPU seconds (this thread; disk reads on demand wait, off the CPU)
    for i, (k, t) in enumerate(pairs):
        if i == a.warmup:
            start = int(g.counters[:, Counter.DISK_READ_ROWS].sum())
        if a.horizon and i + a.horizon < len(pairs):
            g.foresee(*pairs[i + a.horizon])
        c0 = time.thread_time()
        g.lookup(k, t, insert=True)
        cpu.append(time.thread_time() - c0)
    steps = len(pairs) - a.warmup
    ours = (int(g.counters[:, Counter.DISK_READ_ROWS].sum()) - start) / steps
    rows = g.capacity + ((g.host.max_rows or 0) if g.host is not None else 0)
    runner.close()
    keyed = [k * 64 + t for k, t in pairs]
    uniq, ids = np.unique(np.concatenate(keyed), return_inverse=True)
    ids = ids.astype(np.int64)
    ptr = np.concatenate([[0], np.cumsum([x.size for x in keyed])]).astype(np.int64)
    timed = int(ptr[-1] - ptr[a.warmup])
    nxt = next_uses(ptr, ids, uniq.size)
    hits = belady(ptr, ids, nxt, rows, uniq.size, a.warmup, prefilled=True)
    best = (timed - hits) / steps
    # what the history alone allows: the rows used most in the warm-up kept in memory for good, the rest read
    # from disk at each use (no cache of them at all)
    seen = np.bincount(ids[: ptr[a.warmup]], minlength=uniq.size)
    kept = np.zeros(uniq.size, dtype=bool)
    kept[np.argsort(-seen, kind="stable")[:rows]] = True
    static = float(np.count_nonzero(~kept[ids[ptr[a.warmup] :]])) / steps
    # what knowing the next K batches' ids allows (eviction by next use inside them, by access count outside)
    windows = {int(k): (timed - windowed(ptr, ids, nxt, rows, uniq.size, int(k), a.warmup, prefilled=True)) / steps
               for k in a.oracle_windows.split(",") if k}
    return {"steps": steps, "warmup": a.warmup, "rows_in_memory": rows, "cold_precision": a.cold_precision,
            "tierec_disk_rows_per_step": ours, "belady_disk_rows_per_step": best, "over_belady": ours / max(best, 1e-9),
            # the tiers' CPU per step without the dense step beside it: what bounds the step on few cores
            "lookup_cpu_ms_median": 1e3 * float(np.median(cpu[a.warmup :])),
            "static_by_warmup_counts_disk_rows_per_step": static, "window_disk_rows_per_step": windows}


def run_memory(a: argparse.Namespace) -> dict:
    env = {**os.environ}
    args = ["--budget", "64MiB", "--table-x", "4", "--dim", "32", "--batch-rows", "20000", "--json"]
    if a.disk_dir:
        args += ["--disk", a.disk_dir]
    proc = subprocess.run([sys.executable, "-m", "benchmarks.tiers_memory", *args], capture_output=True, text=True, env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ report


def _print(res: dict) -> None:
    if "hitrate" in res:
        h = res["hitrate"]
        t = h["trace"]
        print(f"\n### Fast-tier hit rate (unique rows per batch), {t['batches']} batches of {t['batch']}, {t['distinct_ids']:,} distinct ids, ceiling {t['ceiling']:.3f}\n")
        print("| fast tier (rows) | share of ids | tierec LFU | tierec LRU | LRU (sim) | Belady (offline optimum) |")
        print("|---:|---:|---:|---:|---:|---:|")
        for r in h["rows"]:
            print(f"| {r['capacity']:,} | {r['capacity_share']:.1%} | {r['tierec_lfu']:.3f} | {r['tierec_lru']:.3f} | {r['lru']:.3f} | {r['belady']:.3f} |")
    if "disk" in res:
        d = res["disk"]
        print(f"\n### Disk tier: {d['workload']}\n")
        print("| run | median step (s) | samples/s | CPU s/step | hit rate | disk rows/step | read ahead/step | requests/step | rows/request | device MiB/step | in lookup/step (s) | wait/step (s) | I/O hidden |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in d["runs"]:
            print(
                f"| {r['mode']} | {r['median_step_s']:.3f} | {r['samples_per_s']:,.0f} | {r['cpu_s_per_step']:.3f} | {r.get('hit_rate', float('nan')):.3f} "
                f"| {r.get('disk_read_rows_per_step', 0):,.0f} | {r.get('disk_rows_read_ahead_per_step', 0):,.0f} | {r.get('disk_requests_per_step', 0):,.0f} "
                f"| {r.get('rows_per_request', 0):.2f} | {r.get('device_mib_per_step', 0):.1f} | {r.get('lookup_s_per_step', 0):.3f} | {r.get('wait_s_per_step', 0):.3f} | {r.get('hidden_share', 0):.0%} |"
            )
        for k, v in d["ratios"].items():
            print(f"- {k}: {v:.2f}")
        for r in d["runs"]:  # who takes the CPU: on few cores the tiers' threads share it with the dense step's
            by = ", ".join(f"{k} {v:.1f}" for k, v in r["cpu_ms_per_step_by_thread"].items() if v >= 0.05)
            print(f"- CPU ms a step by thread, {r['mode']}: {by}")
        for r in d["runs"]:
            cpu, cores = 1e3 * r["cpu_s_per_step"], r["cores"]
            print(f"- CPU, {r['mode']}: {cpu:.1f} ms a step over all threads, so at least {cpu / cores:.1f} ms on {cores} "
                  f"cores; the step {1e3 * r['mean_step_s']:.1f} ms, the cores {r['cpu_busy_share']:.0%} busy")
    if "oracle" in res:
        o = res["oracle"]
        print(f"\n### Disk rows per step against the offline optimum ({o['steps']} steps after {o['warmup']}, "
              f"{o['rows_in_memory']:,} rows in memory, {o['cold_precision']} cold rows)\n")
        best = o["belady_disk_rows_per_step"]
        print(f"tierec {o['tierec_disk_rows_per_step']:,.0f}, Belady {best:,.0f}: {o['over_belady']:.2f}x; "
              f"a lookup's CPU (one thread, median) {o['lookup_cpu_ms_median']:.1f} ms")
        for k, r in o.get("window_disk_rows_per_step", {}).items():
            print(f"eviction knowing the next {k} batches' ids (simulated): {r:,.0f}, {r / max(best, 1e-9):.2f}x Belady")
    if "memory" in res:
        m = res["memory"]
        print(f"\n### Resident memory: {json.dumps(m)}")


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.threads:
        from tierec.threads import use_threads

        use_threads(a.threads)
    res: dict = {"argv": argv if argv is not None else sys.argv[1:], "loadavg_start": os.getloadavg(), "cpus": os.cpu_count(),
                 "machine": machine()}  # the CPU, its bf16 flags and the OpenMP wait policy in force
    if a.which in ("hitrate", "all"):
        res["hitrate"] = run_hitrate(a)
    if a.which in ("disk", "all"):
        res["disk"] = run_disk(a)
    if a.which in ("oracle", "all"):
        res["oracle"] = run_oracle(a)
    if a.which in ("memory", "all"):
        res["memory"] = run_memory(a)
    res["loadavg_end"] = os.getloadavg()
    if not a.quiet:
        _print(res)
        print(f"\nload average: {res['loadavg_start']} at the start, {res['loadavg_end']} at the end ({res['cpus']} cpus)")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
