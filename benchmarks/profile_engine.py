"""Where tierec's engine time goes: each stage of one training step, timed on its own.

Replays ``EmbeddingCollection``'s forward and backward stage by stage on the
engine workload (warm tables, so no inserts), with the engine's own functions:
input packing, dedupe, hash lookup, gather + pool forward, pool backward onto
unique rows, and the fused row-wise Adagrad update. The sum is compared with
the time of the real ``coll(sp).backward(g)`` step; the difference is
autograd and Python glue. Times are the process's CPU time (all threads), which
other processes on a shared machine disturb far less than wall time; with one
thread it is the time the step needs. A cProfile of the real step lists the top functions.
Reaches into the engine's internals, so it says so when they have changed.

>>> from benchmarks.profile_engine import run_profile
>>> from benchmarks.workload import Workload
>>> res = run_profile(Workload(tables=2, rows=50, dim=4, batch=8, steps=2), repeats=1)
>>> "stages_ms" in res or "error" in res
True
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from collections import defaultdict

import numpy as np
import torch

from benchmarks.report import markdown_table
from benchmarks.systems import TierecEngine
from benchmarks.timing import median
from benchmarks.workload import Workload, make_batches, upstream_grad

STAGES = ("inputs", "dedupe", "lookup", "pool_forward", "pool_backward", "optimizer")


def _staged_step(coll, sp, grad, clock: dict[str, float]) -> None:
    from tierec.embedding.plan import group_inputs
    from tierec.embedding.pooling import backward_chunks, bag_scale, pool_backward, pool_forward

    b = sp.batch_size
    (plan,) = coll.plans
    group = plan.group
    t = time.process_time  # CPU time of the process: robust to other processes on a shared machine

    t0 = t()
    values, offsets, lengths = group_inputs(sp, plan.features)
    keys = values.numpy()
    tabs = np.repeat(plan.feature_table, lengths)
    off = offsets.numpy()
    scale = bag_scale(off, plan.mean, b)
    t1 = t()
    ukeys, utabs, inverse = coll._dedupe(keys, tabs)
    t2 = t()
    rows = group.lookup(ukeys, utabs, insert=True).numpy()
    t3 = t()
    out = torch.empty(b, len(plan.features), group.dim)
    pool_forward(group.weights.numpy(), rows, inverse, off, scale, b, out.numpy())
    t4 = t()
    grad_rows = torch.zeros(rows.shape[0], group.dim)
    pool_backward(grad.numpy(), inverse, off, scale, b, backward_chunks(group.dim), grad_rows.numpy())
    t5 = t()
    group.update(torch.from_numpy(rows), grad_rows)
    t6 = t()
    for name, dt in zip(STAGES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
        clock[name] += dt


def run_profile(w: Workload, repeats: int) -> dict:
    batches = make_batches(w)
    grad = upstream_grad(w)
    eng = TierecEngine(w, batches, grad)
    res: dict = {"workload": w.as_dict(), "repeats": repeats, "resident_rows": eng.resident_rows()}
    res["unique_per_batch"] = float(np.mean([b.unique_rows.numel() for b in batches]))
    if len(eng.coll.plans) != 1:
        return {**res, "error": "expected one table group"}
    staged: dict[str, list[float]] = defaultdict(list)
    whole: list[float] = []
    try:
        for _ in range(max(repeats, 1)):
            clock = defaultdict(float)
            for i in range(w.steps):
                _staged_step(eng.coll, eng.inputs[i], grad, clock)
            for k in STAGES:
                staged[k].append(clock[k] * 1000 / w.steps)
            t0 = time.process_time()
            for i in range(w.steps):
                eng.step(i)
            whole.append((time.process_time() - t0) * 1000 / w.steps)
    except (AttributeError, ImportError, ValueError, TypeError) as e:  # engine internals moved
        return {**res, "error": f"{type(e).__name__}: {e}"}
    res["stages_ms"] = {k: median(v) for k, v in staged.items()}
    res["stages_best_ms"] = {k: min(v) for k, v in staged.items()}  # least disturbed by other processes
    res["step_ms"] = median(whole)
    res["step_best_ms"] = min(whole)
    res["stages_sum_ms"] = sum(res["stages_ms"].values())
    res["stages_best_sum_ms"] = sum(res["stages_best_ms"].values())
    prof = cProfile.Profile()
    prof.enable()
    for i in range(w.steps):
        eng.step(i)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(12)
    res["cprofile_top"] = s.getvalue()
    return res


def profile_markdown(res: dict) -> str:
    w = res["workload"]
    title = (
        f"PROFILE tierec engine step, {w['tables']} tables, dim {w['dim']}, batch {w['batch']}, zipf {w['zipf']}, "
        f"{w['hot']}-hot ({res['unique_per_batch']:,.0f} unique ids per batch, {res['resident_rows']:,} resident rows)"
    )
    if "error" in res:
        return f"**{title}**\n\nunavailable: {res['error']}"
    med, best = res["stages_ms"], res["stages_best_ms"]
    sum_best = res["stages_best_sum_ms"]
    rows = [[k, med[k], best[k], 100 * best[k] / sum_best] for k in STAGES]
    rows.append(["sum of stages", res["stages_sum_ms"], sum_best, 100.0])
    rows.append(["whole step, coll(sp).backward(g)", res["step_ms"], res["step_best_ms"], 100 * res["step_best_ms"] / sum_best])
    hdr = ["stage", "CPU ms/step (median)", "CPU ms/step (best repeat)", "% of stage sum (best)"]
    return f"**{title}**\n\n" + markdown_table(hdr, rows)
