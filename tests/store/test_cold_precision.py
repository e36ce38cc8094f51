"""Compact cold rows (store.cold_precision): codec bounds, unbiased reproducible rounding, rows per byte,
exact resume, and the configurations that are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from store_helpers import assert_same, batches, by_id, collection, train

from tierec.config import ColdPrecision, ConfigError, OptimizerKind, StoreConfig, load_config
from tierec.embedding import TableConfig
from tierec.store import TieredGroup, TierSpec
from tierec.store.codec import row_codec
from tierec.store.disk import DiskTier
from tierec.store.host import HostTier

LOSSY = [ColdPrecision.BF16, ColdPrecision.INT8]
DIM = 16  # int8 pays from about 12 dims (below, it is bf16: test_record_sizes)
REC = 4 * (DIM + 1)  # bytes of one fp32 row: weights and row-wise Adagrad state


def _rows(n: int, width: int, seed: int = 0) -> np.ndarray:
    g = np.random.default_rng(seed)
    rec = (g.standard_normal((n, width)) * g.uniform(1e-3, 10, size=(n, 1))).astype(np.float32)
    rec[0] = 0.0  # a row of zeros
    rec[1] = 0.25  # a constant row
    rec[2, :] = 1000.0 + np.arange(width, dtype=np.float32) * 1e-4  # a tiny range far from zero
    rec[3, 0] = 1e-30  # values near the bottom of the float range
    return rec


def _keys(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(n, dtype=np.int64) * 7 + 3, np.zeros(n, dtype=np.int32)


@pytest.mark.parametrize("kind", [OptimizerKind.ROWWISE_ADAGRAD, OptimizerKind.ADAM, OptimizerKind.SGD])
def test_round_trip_error_bounds(kind: OptimizerKind) -> None:
    dim = 16
    widths = {OptimizerKind.ROWWISE_ADAGRAD: [1], OptimizerKind.ADAM: [dim, dim], OptimizerKind.SGD: []}[kind]
    width = dim + sum(widths)
    rec = _rows(500, width)
    keys, tabs = _keys(500)
    fp32 = row_codec("fp32", dim, widths, seed=0)
    assert fp32.encode(rec, keys, tabs, 1) is rec and fp32.decode(rec) is rec and fp32.words == width
    for p in LOSSY:
        c = row_codec(p, dim, widths, seed=0)
        back = c.decode(c.encode(rec, keys, tabs, step=5))
        assert back.dtype == np.float32 and back.shape == rec.shape
        w, bw = rec[:, :dim].astype(np.float64), back[:, :dim].astype(np.float64)
        if p is ColdPrecision.BF16:  # within one bf16 step of the value (8 bits of mantissa)
            assert (np.abs(bw - w) <= np.abs(w) * 2.0**-7).all()
        else:  # within one grid step of the row: at most its range / 126
            span = w.max(1) - w.min(1)
            assert (np.abs(bw - w).max(1) <= span / 126 + 1e-30).all()
            assert (back[:3, :dim] == rec[:3, :dim]).all()  # zeros, constants, tiny ranges: exact
        state, bstate = rec[:, dim:].astype(np.float64), back[:, dim:].astype(np.float64)
        if kind is OptimizerKind.ROWWISE_ADAGRAD:
            assert (bstate == state).all()  # row-wise state stays float32
        else:
            assert (np.abs(bstate - state) <= np.abs(state) * 2.0**-7).all()  # per-dim state: bf16
        again = c.decode(c.encode(back, keys, tabs, step=6))  # idempotent, whatever the random bits
        assert np.array_equal(again.view(np.uint32), back.view(np.uint32)), p


def test_record_sizes() -> None:
    """Words per record: the host tier holds fp32 bytes / (4 * words) times the rows."""
    sizes = {(p, dim): row_codec(p, dim, [1], seed=0).words for p in ColdPrecision for dim in (8, 16, 64)}
    assert sizes[ColdPrecision.FP32, 16] == 17
    assert sizes[ColdPrecision.BF16, 16] == 9 and sizes[ColdPrecision.INT8, 16] == 7  # 1.9x, 2.4x
    assert sizes[ColdPrecision.BF16, 64] == 33 and sizes[ColdPrecision.INT8, 64] == 19  # 2.0x, 3.4x
    assert row_codec("int8", 16, [16, 16], seed=0).words == 2 + 4 + 16  # Adam: moments bf16
    # a layout that saves no word gives way to the finer one
    assert sizes[ColdPrecision.INT8, 8] == sizes[ColdPrecision.BF16, 8] == 5
    assert row_codec("int8", 8, [1], seed=0).precision is ColdPrecision.BF16
    assert row_codec("int8", 1, [], seed=0).precision is ColdPrecision.FP32  # a wide (dim-1) SGD row


@pytest.mark.parametrize("precision", LOSSY)
def test_stochastic_rounding_is_unbiased_and_reproducible(precision: ColdPrecision) -> None:
    dim, n = 16, 4000
    c = row_codec(precision, dim, [1], seed=11)
    row = np.random.default_rng(1).standard_normal((1, dim + 1)).astype(np.float32)
    rows = np.repeat(row, n, axis=0)
    key, tab = np.full(n, 42, dtype=np.int64), np.zeros(n, dtype=np.int32)
    # n writes of the same row at n steps: one row at a time, as write-backs happen
    back = np.concatenate([c.decode(c.encode(rows[:1], key[:1], tab[:1], step=s)) for s in range(n)])
    err = back[:, :dim].astype(np.float64) - row[:, :dim]
    spread = err.std(0)
    assert (spread > 0).all()  # really rounded both ways
    assert (np.abs(err.mean(0)) < 5 * spread / np.sqrt(n)).all()  # mean error ~ 0
    # the same (seed, id, step) gives the same bits; another step, seed or id other bits
    a = c.encode(rows[:8], key[:8], tab[:8], step=3)
    assert np.array_equal(a.view(np.uint32), c.encode(rows[:8], key[:8], tab[:8], step=3).view(np.uint32))
    other = [c.encode(rows[:8], key[:8], tab[:8], step=4), row_codec(precision, dim, [1], seed=12).encode(rows[:8], key[:8], tab[:8], 3),
             c.encode(rows[:8], key[:8] + 1, tab[:8], step=3)]
    assert all(not np.array_equal(a.view(np.uint32), o.view(np.uint32)) for o in other)


def test_encoded_words_keep_their_bits_through_host_and_disk(tmp_path) -> None:
    c = row_codec("int8", 16, [1], seed=0)
    rec = _rows(300, 17)
    words = c.encode(rec, *_keys(300), step=9)
    weird = np.array([0x7F800001, 0xFFC00000, 0x7FBFFFFF, 0x00000001], dtype=np.uint32)  # signalling nan, ...
    words[:4, :4] = weird.view(np.float32)
    h = HostTier(c.words, max_rows=300)
    hs = h.alloc(300)
    h.write(hs, words)
    d = DiskTier(str(tmp_path), c.words, segment_rows=64)
    ds = d.append(np.arange(300), words)
    for got in (h.read(hs), d.read(ds)):
        assert np.array_equal(np.ascontiguousarray(got).view(np.uint32), words.view(np.uint32))
    d.close()


@pytest.mark.parametrize("dim", [16, 64])
def test_the_host_tier_holds_more_rows_for_the_same_budget(tmp_path, dim: int) -> None:
    row = 4 * (dim + 1)
    held = {}
    for p in ColdPrecision:
        spec = TierSpec(cache_bytes=64 * row, host_bytes=1000 * row, disk_dir=str(tmp_path), cold_precision=p)
        g = TieredGroup([TableConfig(name="t", dim=dim, features=["f"])], spec)
        for step in range(60):  # 3,840 distinct rows: far more than the host tier holds
            keys = np.arange(step * 64, (step + 1) * 64, dtype=np.int64)
            g.lookup(keys, np.zeros(64, dtype=np.int32), insert=True)
        st = g.stats()["t"]
        assert st["rows_disk"] > 0  # the host tier is full
        held[p] = st["rows_host"]
        assert 990 * row < g.host.nbytes() <= 1000 * row  # the host tier's budget, used
        g.close()
    assert held[ColdPrecision.FP32] == 1000
    ratio = {p: held[p] / held[ColdPrecision.FP32] for p in LOSSY}
    assert ratio[ColdPrecision.BF16] == pytest.approx(2.0 * (dim + 1) / (dim + 2), rel=0.02)  # ~1.9x at 16, ~2x at 64
    assert ratio[ColdPrecision.INT8] == pytest.approx(4.0 * (dim + 1) / (dim + 12), rel=0.02)  # 2.4x at 16, 3.4x at 64


def _spec(tmp_path, p: ColdPrecision, ttl: int = 0) -> TierSpec:
    return TierSpec(cache_bytes=150 * REC, host_bytes=10 * REC, disk_dir=str(tmp_path), cold_precision=p, ttl_steps=ttl, interval=4)


@pytest.mark.parametrize("precision", LOSSY)
def test_lossy_training_is_close_to_plain_and_reproducible(tmp_path, precision: ColdPrecision) -> None:
    data = batches(16, batch=32)
    plain = collection(None, dim=DIM)
    ref = train(plain, data)
    runs = []
    for _ in range(2):
        coll = collection(_spec(tmp_path, precision), dim=DIM)
        assert coll.groups[0].codec.precision is precision
        runs.append((train(coll, data), by_id(coll)))
        st = coll.groups[0].stats()["ab"]
        assert st["disk_read_rows"] > 0 and st["evicted"] > 0
        coll.groups[0].close()
    assert all(torch.equal(a, b) for a, b in zip(runs[0][0], runs[1][0]))  # reproducible
    assert_same(runs[0][1], runs[1][1])
    tol = 0.01 if precision is ColdPrecision.BF16 else 0.03  # outputs up to ~1.7
    assert not all(torch.equal(a, b) for a, b in zip(runs[0][0], ref))  # rows really were rounded
    assert max(float((a - b).abs().max()) for a, b in zip(runs[0][0], ref)) < tol


@pytest.mark.parametrize("precision", LOSSY)
def test_lossy_state_round_trip_resumes_exactly(tmp_path, precision: ColdPrecision) -> None:
    """Tiered for 8 steps, its state loaded into a fresh store of the same sizes, 8 more: the uninterrupted run."""
    data = batches(16, batch=32)
    full = collection(_spec(tmp_path, precision, ttl=9), dim=DIM)  # deletions too: slots freed outside evictions
    out_full = train(full, data)
    first = collection(_spec(tmp_path, precision, ttl=9), dim=DIM)
    train(first, data[:8])
    sd = first.state_dict()
    assert (sd["ab.store.slot"] >= 0).any() and (sd["ab.store.slot"] < 0).any()
    second = collection(_spec(tmp_path, precision, ttl=9), dim=DIM)
    second.load_state_dict(sd)
    assert second.groups[0].stats()["ab"]["rows_cache"] == first.groups[0].stats()["ab"]["rows_cache"]
    out_second = train(second, data[8:], start=8)
    assert all(torch.equal(a, b) for a, b in zip(out_second, out_full[8:]))
    assert_same(by_id(full), by_id(second))
    # another size: loads (rows go to host and disk), just not exactly the uninterrupted run
    other = collection(TierSpec(**{**_spec(tmp_path, precision, ttl=9).__dict__, "cache_bytes": 140 * REC}), dim=DIM)
    other.load_state_dict(sd)
    assert other.groups[0].stats()["ab"]["rows_cache"] == 0 and other.num_rows() == first.num_rows()
    for c in (full, first, second, other):
        c.groups[0].close()


def test_config_errors_name_the_keys() -> None:
    with pytest.raises(ConfigError, match="store.cold_precision 'fp16' is not one of"):
        StoreConfig(cold_precision="fp16")
    StoreConfig(cold_precision="int8", prefetch=True)  # reading ahead changes no number: allowed (tests/store/test_staging.py)
    from tierec.train.components import Components

    over = ["store.enabled=true", "store.cold_precision=bf16", "prune.enabled=true", "embedding.dim=8"]
    with pytest.raises(ConfigError, match="store.cold_precision.*prune.enabled"):
        Components.build(load_config(None, over), ["C1"], 1)
    spec = load_config(None, ["store.enabled=true", "store.cold_precision=int8"]).store
    assert spec.cold_precision == ColdPrecision.INT8


def test_a_training_run_with_int8_cold_rows_resumes_exactly(tmp_path) -> None:
    """A run resumed from its periodic checkpoint equals the uninterrupted run (rows, AUC, counters)."""
    import shutil

    from test_tiered_training import _mostly_on_disk, _rows_by_id, _same

    from tierec.train.trainer import Trainer

    over = _mostly_on_disk(tmp_path / "rows", prefetch=False) + [
        "embedding.dim=16", "store.cold_precision=int8", "store.host_size=8KiB", "store.memory_budget=64KiB", "store.cache_size=56KiB",
        "store.ttl_steps=6", "store.admit_after=2", "train.checkpoint_every=7",
    ]
    full = Trainer(load_config(None, over), tmp_path / "full").fit()
    assert full["steps"] == 16 and full["store"]["disk_read_rows"] > 0 and full["store"]["rows_host"] > 0
    shutil.copytree(tmp_path / "full", tmp_path / "part")
    ckpts = tmp_path / "part" / "checkpoints"
    shutil.rmtree(ckpts / "step_00000016")
    (ckpts / "latest").unlink()
    resumed = Trainer(load_config(None, over), tmp_path / "part", resume=True).fit()
    assert resumed["steps"] == 16
    _same(_rows_by_id(tmp_path / "full"), _rows_by_id(tmp_path / "part"))
    assert resumed["test_auc"] == full["test_auc"] and resumed["final_train_loss"] == full["final_train_loss"]
    assert resumed["store"]["new"] == full["store"]["new"]
    # and the int8 run is not the fp32 one (its rows were rounded), though close
    fp32 = Trainer(load_config(None, [o for o in over if "cold_precision" not in o]), tmp_path / "fp32").fit()
    rounded, exact = _rows_by_id(tmp_path / "full"), _rows_by_id(tmp_path / "fp32")
    assert any(not torch.equal(rounded[k], exact[k]) for k in rounded if k.endswith(".weights"))
    assert abs(fp32["test_auc"] - full["test_auc"]) < 0.01
